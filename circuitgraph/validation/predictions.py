"""Which nodes a check is about, and what the graph predicts for removing them.

Predictions come from the graph alone (no model run):

* the **direct effect** of node ``s`` on the metric ``M = sum_t w_t pre_t`` is
  ``D_s = sum_t w_t A[t, s]``, the weighted edge into the targets.  Removing ``s`` in the
  frozen model changes ``M`` by exactly ``-D_s`` (every other node is frozen);
* the **total effect** lets the downstream readers respond, each with its nonlinearity
  frozen as the ratio ``activation / pre-activation`` (slope 1 for an active ReLU/JumpReLU
  feature and for a gated neuron with its gate frozen, ``gelu(pre)/pre`` for a GELU neuron).
  With ``V_s = sum_r A[r, s] U_r`` and ``U_r = w_r + V_r / pre_r`` for readers (``w_r`` the
  target weight, 0 for non-targets), removing ``s`` changes ``M`` by ``-V_s``: the sum over
  every path of the product of its edges divided by the intermediate pre-activations.

Scaling a node's activation by ``c`` changes ``M`` by ``-(1 - c)`` times either effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from circuitgraph.errors import QueryError, ValidationRunError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries import node_influence
from circuitgraph.queries.filters import as_filter, filter_mask
from circuitgraph.queries.influence import total_effects as per_target_effects
from circuitgraph.validation.interventions import NODE_SITES

if TYPE_CHECKING:
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["INTERVENABLE_KINDS", "direct_effects", "total_effects", "select_nodes", "match_filter"]

#: node kinds that map to a unit of the real model
INTERVENABLE_KINDS = frozenset(NODE_SITES)


def _target_weights(graph: AttributionGraph) -> np.ndarray:
    w = np.zeros(graph.n_nodes, dtype=np.float64)
    if not graph.targets:
        raise ValidationRunError("the graph has no targets; predictions need at least one target node")
    for tid, weight in graph.targets:
        w[graph.index_of(tid)] += float(weight)
    return w


def direct_effects(graph: AttributionGraph) -> np.ndarray:
    """``D`` per node row: the target-weighted edge into the targets (float64)."""
    w = _target_weights(graph)
    return np.bincount(graph.edge_source, weights=graph.edge_weight.astype(np.float64) * w[graph.edge_target],
                       minlength=graph.n_nodes)


def total_effects(graph: AttributionGraph) -> np.ndarray:
    """``V`` per node row (see the module docstring): the target-weighted exact total effect,
    from :func:`circuitgraph.queries.total_effects` (one back-substitution over the graph)."""
    _target_weights(graph)  # the graph has targets
    return np.asarray([float(w_t) for _, w_t in graph.targets]) @ per_target_effects(graph)


def match_filter(graph: AttributionGraph, node_filter: Any, n_positions: int | None = None) -> list[NodeId]:
    """Node ids of ``graph`` that pass a spec ``NodeFilter`` (or a dict of its keys): the queries'
    filter resolution (:func:`circuitgraph.queries.filters.filter_mask`), with validation's errors."""
    try:
        mask = filter_mask(graph, as_filter(node_filter), prompt_length=n_positions)
    except QueryError as exc:
        raise ValidationRunError(str(exc)) from None
    return [graph.nodes[i].id for i in np.flatnonzero(mask)]


def select_nodes(
    graph: AttributionGraph,
    nodes: Any = "top_nodes",
    *,
    k: int = 10,
    positions: Sequence[int] | None = None,
    rank_by: Literal["edge", "total", "influence"] = "edge",
    n_positions: int | None = None,
) -> list[NodeId]:
    """The nodes a check intervenes on, strongest first.

    ``nodes``: ``"top_nodes"`` (the ``k`` intervenable nodes with the largest ``|direct effect|``;
    ``rank_by="total"``: ``|total effect|``; ``rank_by="influence"``: circuit-tracer's node
    influence from :func:`circuitgraph.queries.node_influence`), a node filter (every match,
    strongest first), or explicit node ids.
    ``positions`` keeps only nodes at those positions (negative counts from the end).
    Raises :class:`ValidationRunError` for an empty result or a node that cannot be intervened on.
    """
    if n_positions is None and graph.context is not None:
        n_positions = graph.context.linearisation.n_pos
    top = isinstance(nodes, str) and nodes == "top_nodes"
    if isinstance(nodes, (str, NodeId)) and not top:
        nodes = [nodes]
    if top:
        score = _scores(graph, rank_by)
        if k <= 0:
            raise ValidationRunError(f"k must be a positive number of nodes, got {k}")
        rows = [i for i, n in enumerate(graph.nodes) if n.kind in INTERVENABLE_KINDS]
        rows.sort(key=lambda i: (-score[i], i))
        chosen = [graph.nodes[i].id for i in rows]
        what = f"the top {k} nodes by {_SCORE_NAMES[rank_by]}"
    elif isinstance(nodes, (list, tuple)):
        chosen = [NodeId.parse(n) if isinstance(n, str) else n for n in nodes]
        missing = [str(n) for n in chosen if n not in graph]
        if missing:
            raise ValidationRunError(f"nodes {missing[:5]} are not in the graph ({graph.n_nodes} nodes)")
        what = f"the {len(chosen)} given nodes"
    else:
        chosen = match_filter(graph, nodes, n_positions)
        if graph.targets:
            score = _scores(graph, rank_by)
            chosen.sort(key=lambda n: -score[graph.index_of(n)])
        what = f"the node filter {_describe_filter(nodes)}"
    if positions is not None:
        wanted = {p + n_positions if p < 0 and n_positions is not None else p for p in positions}
        chosen = [n for n in chosen if n.position in wanted]
        what += f" at positions {list(positions)}"
    bad = [str(n) for n in chosen if n.kind not in INTERVENABLE_KINDS]
    if bad and not top:
        raise ValidationRunError(
            f"{what} include nodes that cannot be intervened on: {bad[:5]}; interventions take "
            f"{', '.join(sorted(INTERVENABLE_KINDS))} nodes (add kind: [...] to the filter)"
        )
    if top:
        chosen = chosen[:k]
    if not chosen:
        kinds = sorted({n.kind for n in graph.nodes})
        raise ValidationRunError(
            f"the node set is empty: {what} matched no node of the graph (its node kinds: {', '.join(kinds)}); "
            "widen the filter or the positions"
        )
    return chosen


_SCORE_NAMES = {"edge": "|edge into the target|", "total": "|total effect|", "influence": "influence"}


def _scores(graph: AttributionGraph, rank_by: str) -> np.ndarray:
    if rank_by == "edge":
        return np.abs(direct_effects(graph))
    if rank_by == "total":
        return np.abs(total_effects(graph))
    if rank_by == "influence":
        return np.asarray(node_influence(graph), dtype=np.float64)
    raise ValidationRunError(f"rank_by {rank_by!r}: expected edge, total or influence")


def _describe_filter(f: Any) -> str:
    if hasattr(f, "model_dump"):
        return str({k: v for k, v in f.model_dump().items() if v is not None})
    return str(f)
