"""The pipeline: spec -> inputs -> graph -> queries and validation -> exports.

* :mod:`~circuitgraph.pipeline.inputs`: from a validated spec to live inputs (model adapter,
  transcoders, prompt tokens, resolved targets), with every check that needs the model;
* :mod:`~circuitgraph.pipeline.runner`: the single-prompt pipeline (``run``, ``build``,
  ``prepare``), the glue that calls the engine, the queries, the validation checks and the
  exporters in order;
* :mod:`~circuitgraph.pipeline.estimate`: the dry run's memory estimate (the engine's own edge
  plan and memory guard live beside it, in :mod:`circuitgraph.attribution.plan`);
* :mod:`~circuitgraph.pipeline.entry`: ``run`` and ``dry_run`` for any spec: a dataset spec goes
  to :mod:`circuitgraph.datasets`, which calls the single-prompt pipeline once per row.

``circuitgraph.run`` and the CLI are thin layers over :mod:`~circuitgraph.pipeline.entry`.
Importing this package imports nothing heavy (no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RunResult", "run", "dry_run", "build"]


#: where each lazily imported name lives (full module names: the import test reads them as arrows)
_HOMES = {"RunResult": "circuitgraph.pipeline.runner", "build": "circuitgraph.pipeline.runner",
          "run": "circuitgraph.pipeline.entry", "dry_run": "circuitgraph.pipeline.entry"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'circuitgraph.pipeline' has no attribute {name!r}")
