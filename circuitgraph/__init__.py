"""circuitgraph: declarative, exact circuit-graph analysis for transformer language models.

    >>> import circuitgraph
    >>> spec = circuitgraph.load_spec("examples/demo.yaml")    # doctest: +SKIP
    >>> result = circuitgraph.run(spec)                         # doctest: +SKIP
    >>> result.graph.check_completeness().ok()                  # doctest: +SKIP
    True

Heavy modules (torch, TransformerLens) are imported on first use, so ``import circuitgraph``
and the spec tools stay fast and side-effect free.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "AttributionGraph",
    "CircuitGraphError",
    "CompletenessReport",
    "Node",
    "NodeId",
    "ResultEntry",
    "RunOutcome",
    "RunResult",
    "Spec",
    "attribute",
    "build",
    "diff",
    "dry_run",
    "errors",
    "load_graph",
    "load_spec",
    "open_dataset",
    "open_features",
    "run",
    "steer",
]

_LAZY = {
    "AttributionGraph": ("circuitgraph.graph.graph", "AttributionGraph"),
    "CompletenessReport": ("circuitgraph.graph.graph", "CompletenessReport"),
    "Node": ("circuitgraph.graph.nodes", "Node"),
    "NodeId": ("circuitgraph.graph.nodes", "NodeId"),
    "CircuitGraphError": ("circuitgraph.errors", "CircuitGraphError"),
    "RunResult": ("circuitgraph.pipeline.runner", "RunResult"),
    "RunOutcome": ("circuitgraph._results", "RunOutcome"),
    "ResultEntry": ("circuitgraph._results", "ResultEntry"),
    "run": ("circuitgraph.pipeline.entry", "run"),
    "build": ("circuitgraph.pipeline.runner", "build"),
    "dry_run": ("circuitgraph.pipeline.entry", "dry_run"),
    "attribute": ("circuitgraph.attribution.build", "attribute"),
    "Spec": ("circuitgraph.spec", "Spec"),
    "load_spec": ("circuitgraph.spec", "load_spec"),
    "errors": ("circuitgraph.errors", None),
    "open_dataset": ("circuitgraph.datasets.store", "open_dataset"),
    "steer": ("circuitgraph.validation.steering", "steer"),
    "diff": ("circuitgraph.pipeline.compare", "diff"),
    "open_features": ("circuitgraph.features.summary", "open_features"),
    "load_graph": ("circuitgraph.export.graph_files", "load_graph"),
}


#: the names that hand out graphs: the graph's file and display methods (``to_json``, ``from_json``,
#: ``to_dot``, ``render``, ``html``, ``svg``, ``_repr_html_``) are ``circuitgraph.export``'s, registered
#: when it is imported, so these import it too (a graph from ``circuitgraph.attribute`` in a fresh
#: interpreter writes its JSON)
_GRAPH_NAMES = frozenset({"AttributionGraph", "attribute", "run", "build", "RunResult", "load_graph", "open_dataset",
                          "open_features", "diff", "steer"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        if name in _GRAPH_NAMES:
            importlib.import_module("circuitgraph.export")
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'circuitgraph' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
