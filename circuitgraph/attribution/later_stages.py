"""What the stages after the edge sweep cost (queries and checks on the full graph, pruning,
exports), as the engine's memory plan counts them: a plain record the pipeline fills from the
spec (:func:`circuitgraph.pipeline.stage_memory.later_stages`) and the plan
(:mod:`circuitgraph.attribution.plan`) adds to the sweep's peak."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LaterStages"]


@dataclass(frozen=True)
class LaterStages:
    """Bytes the later stages need on top of the full graph's stored edges.

    ``full_edge_bytes``: per edge of the full graph, at the heaviest stage that runs on it (the
    sweep's own working copies included): the plan's bytes per edge when it is larger than the
    sweep's.  ``resident_edge_bytes``: per edge of the full graph while the exports run (its
    stored edges and what the stages before left cached on it).  ``kept_edge_bytes``: per edge
    of the pruned graph while it is held and exported (on top of the full graph's resident
    bytes).  ``kept_cap``: the pruned graph keeps at most this many edges
    (``prune.top_k_edges``, or what the JSON export writes at most); ``None``: as many as the
    full graph.  ``export_limit``: an unpruned graph is exported only up to this many edges
    (``prune: none`` with a JSON or Neuronpedia export), else ``None``.  ``fixed``: bytes that
    do not grow with the edges (a diagram's rendering).  ``heaviest``: the stage that sets
    ``full_edge_bytes`` (for the dry run's report).  ``check_bytes``: the working set of the
    heaviest check whose cost is per forward pass of the model (measured by the dry run's probe,
    :mod:`circuitgraph.pipeline.check_estimate`; 0 where none is probed), held next to the full
    graph at ``check_edge_bytes`` an edge: that stage's peak is ``edges x check_edge_bytes +
    check_bytes`` when it is more than the per-edge cost; ``check``: which check that is."""

    full_edge_bytes: int = 0
    resident_edge_bytes: int = 0
    kept_edge_bytes: int = 0
    kept_cap: int | None = None
    export_limit: int | None = None
    fixed: int = 0
    heaviest: str = ""
    check_bytes: int = 0
    check_edge_bytes: int = 0
    check: str = ""
