"""The pipeline: spec -> inputs -> graph -> queries and validation -> exports.

* :mod:`~circuitgraph.pipeline.inputs`: from a validated spec to live inputs (model adapter,
  transcoders, prompt tokens, resolved targets), with every check that needs the model;
* :mod:`~circuitgraph.pipeline.estimate`: memory estimates before a run and before the edge sweep;
* :mod:`~circuitgraph.pipeline.runner`: ``run`` / ``dry_run`` / ``build``, the glue that calls the
  engine, the queries, the validation checks and the exporters in order.

``circuitgraph.run`` and the CLI are thin layers over :mod:`~circuitgraph.pipeline.runner`.
Importing this package imports nothing heavy (no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RunResult", "run", "dry_run", "build"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("circuitgraph.pipeline.runner"), name)
    raise AttributeError(f"module 'circuitgraph.pipeline' has no attribute {name!r}")
