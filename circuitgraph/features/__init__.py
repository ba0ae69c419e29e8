"""Feature dashboards: a dataset streamed once through the model and its dictionaries.

A spec with ``dataset:``, ``features:`` and ``export: {features: DIR}`` writes, in ``DIR``,
``features.parquet`` (one row per feature: density, max and mean activation, quantiles,
output and input tokens) and ``examples.parquet`` (each feature's exact top-k activating
tokens with their context), identical byte for byte however the dataset was split over
workers and shards (see docs/features.md).

    >>> import circuitgraph
    >>> result = circuitgraph.run("examples/demo_features.yaml")       # doctest: +SKIP
    >>> fd = circuitgraph.open_features(result.directory)              # doctest: +SKIP
    >>> fd.dashboard(1, 453)["examples"][0]["text"]                    # doctest: +SKIP
"""

import importlib
from typing import Any

from circuitgraph.features.summary import FeatureDashboards, open_features

__all__ = ["FeatureDashboards", "FeaturesRunResult", "open_features", "run_features"]

#: the driver (it runs the pipeline) is named, not imported: the pipeline reads dashboards
#: through :mod:`circuitgraph.features.summary`, and importing that runs this file
_DRIVER = ("FeaturesRunResult", "run_features")


def __getattr__(name: str) -> Any:
    if name in _DRIVER:
        return getattr(importlib.import_module("circuitgraph.features.driver"), name)
    raise AttributeError(f"module 'circuitgraph.features' has no attribute {name!r}")
