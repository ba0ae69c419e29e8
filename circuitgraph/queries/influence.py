"""Influence of every node on the targets: circuit-tracer's and the exact signed total effect.

**Influence (circuit-tracer).**  With ``A = |E|`` row-normalised (each target row divided by
its sum of absolute incoming weights; rows = targets, columns = sources) and ``w`` the
target weights placed at the target rows,

    influence = w (A + A^2 + A^3 + ...)

the share of the targets' (weighted) absolute input that reaches each node, directly or
through any chain of nodes.  On an attribution graph (a DAG) the series is finite.

**Total effect (exact, signed).**  In the linear replacement model every reader passes a
change of its pre-activation through with its frozen gain: an edge ``s -> r`` carries
``E[r, s] = a_s v_rs`` and a change ``d pre_s`` of an intermediate reader ``s`` changes it by
``(E[r, s] / pre_s) d pre_s`` (for an active ReLU/JumpReLU feature ``a_s = pre_s``: its
activation changes by as much as its pre-activation).  So one path
``s -> r_1 -> ... -> r_m -> T`` carries

    E[r_1, s] * (E[r_2, r_1] / pre_{r_1}) * ... * (E[T, r_m] / pre_{r_m})

of the target ``T``, and the *total effect* of ``s`` on ``T`` (how much ``pre_T`` drops when
``s``'s activation is set from ``a_s`` to 0 with everything else frozen) is the sum over
all paths:  with ``B = E diag(1 / pre)``,

    total_effect[T, s] = (sum_k B^k E)[T, s] = y_T^T E[:, s],   y_T = e_T^T (I + B + B^2 + ...).

``y_T[r] = d pre_T / d pre_r`` in the linear model.  Because every reader satisfies
``pre_r = sum of incoming edges + c_r``, the identity

    pre_T = sum over the pure writers s (embeddings, errors, ...: no pre-activation) of
            total_effect[T, s]  +  sum over the readers r of y_T[r] c_r

holds exactly (tested), so the effects of the inputs and of the error nodes, with the
constants carried to the target, are a complete signed decomposition of each target.

**How they are computed.**  Both series are finite on a DAG and are evaluated exactly by one
back-substitution over the graph's levels (residual locations), top down: each edge is read
once per set of targets (:mod:`circuitgraph.graph.dag`), with no iteration to
convergence and no dense matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from circuitgraph.graph.dag import graph_dag, sweep
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries._base import QueryResult, check_k, format_table
from circuitgraph.queries._sparse import pass_through_divisors, safe_inverse, target_weight_vector, weighted_influence

__all__ = ["InfluenceResult", "node_influence", "total_effects", "reader_gradients", "influence", "raw_influence"]


def node_influence(graph: AttributionGraph, target_weights: np.ndarray | None = None) -> np.ndarray:
    """circuit-tracer's node influence ``w (A + A^2 + ...)``, one value per node row.

    ``target_weights`` (length N, or ``(N, m)`` for m weightings at once) defaults to the
    graph's target weights.  Targets themselves get 0 unless they feed another target.
    One back-substitution over the graph's levels (:mod:`circuitgraph.graph.dag`).
    """
    w = target_weight_vector(graph) if target_weights is None else np.asarray(target_weights, dtype=np.float64)
    gd = graph_dag(graph)
    out = sweep(gd.dag, abs_start=w, row_divisor=gd.row_divisor)["abs"]
    return out[:, 0] if w.ndim == 1 else out


def _unit_starts(graph: AttributionGraph, targets: list[NodeId]) -> np.ndarray:
    start = np.zeros((graph.n_nodes, len(targets)), dtype=np.float64)
    for j, t in enumerate(targets):
        start[graph.index_of(t), j] = 1.0
    return start


def _signed(graph: AttributionGraph, targets: list[NodeId] | None) -> dict[str, np.ndarray]:
    targets = list(graph.target_ids) if targets is None else list(targets)
    gain = safe_inverse(pass_through_divisors(graph))
    return sweep(graph_dag(graph).dag, signed_start=_unit_starts(graph, targets), gain=gain)


def reader_gradients(graph: AttributionGraph, targets: list[NodeId] | None = None) -> np.ndarray:
    """``y (N, m)``: ``d pre_T / d pre_r`` in the linear replacement model, one column per
    target (default: the graph's targets, unweighted).  ``y[T, T] = 1``; for a pure writer
    (divisor 1) ``y`` equals its total effect."""
    return _signed(graph, targets)["y"]


def total_effects(graph: AttributionGraph, targets: list[NodeId] | None = None) -> np.ndarray:
    """``(m, N)``: the exact signed total effect of every node on each target's pre-activation
    (see the module docstring), by one back-substitution over the graph's levels.  Default
    targets: the graph's targets, unweighted.  This is the one implementation of total effects
    in circuitgraph (validation's predictions call it)."""
    return _signed(graph, targets)["signed"].T.copy()


@dataclass(frozen=True, eq=False, repr=False)
class InfluenceResult(QueryResult):
    """Influence and total effect of every node on the targets.

    ``influence``: circuit-tracer's (unsigned, weighted by the target weights).
    ``total_effect``: the signed exact total effect on the weighted sum of the targets'
    pre-activations; ``per_target_effect (n_targets, N)`` the same per target, unweighted.
    Ranked by ``|total_effect|`` when ``signed`` else by ``influence``.
    """

    kind = "influence"
    node_ids: tuple[NodeId, ...]
    influence: np.ndarray
    total_effect: np.ndarray
    per_target_effect: np.ndarray
    targets: tuple[tuple[NodeId, float], ...]
    top_k: int = 20
    signed: bool = False

    def ranking(self) -> np.ndarray:
        """Node rows, strongest first (targets excluded)."""
        score = np.abs(self.total_effect) if self.signed else self.influence
        is_target = np.zeros(len(self.node_ids), dtype=bool)
        for t, _ in self.targets:
            is_target[self.node_ids.index(t)] = True
        order = np.argsort(-score, kind="stable")
        return order[~is_target[order]]

    def top(self, k: int | None = None) -> list[tuple[NodeId, float, float]]:
        """``(node, influence, total_effect)`` of the ``k`` strongest nodes."""
        rows = self.ranking()[: (self.top_k if k is None else check_k(k))]
        return [(self.node_ids[i], float(self.influence[i]), float(self.total_effect[i])) for i in rows]

    def of(self, node: NodeId | str) -> tuple[float, float]:
        """``(influence, total_effect)`` of one node."""
        node = NodeId.parse(node) if isinstance(node, str) else node
        i = self.node_ids.index(node)
        return float(self.influence[i]), float(self.total_effect[i])

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranked_by": "abs_total_effect" if self.signed else "influence",
            "targets": [{"node": str(t), "weight": float(w)} for t, w in self.targets],
            "top": [
                {"node": str(n), "influence": i, "total_effect": te} for n, i, te in self.top()
            ],
            "total_influence": float(self.influence.sum()),
        }

    def table(self, max_rows: int = 10) -> str:
        rows = [(str(n), i, te) for n, i, te in self.top()]
        by = "|total effect|" if self.signed else "influence"
        return format_table(["node", "influence", "total_effect"], rows, max_rows=max_rows,
                            title=f"influence on {len(self.targets)} target(s), ranked by {by}")


def influence(graph: AttributionGraph, top_k: int = 20, signed: bool = False) -> InfluenceResult:
    """Every node's influence (circuit-tracer) and signed total effect on the targets.

    Example::

        res = influence(graph, top_k=5)
        res.top()[0]            # (node id, influence, total effect)
    """
    top_k = check_k(top_k, "top_k")
    infl = node_influence(graph)
    per_target = total_effects(graph)
    weights = np.array([wt for _, wt in graph.targets], dtype=np.float64)
    total = weights @ per_target
    return InfluenceResult(
        node_ids=tuple(graph.node_ids()),
        influence=infl,
        total_effect=total,
        per_target_effect=per_target,
        targets=tuple((t, float(wt)) for t, wt in graph.targets),
        top_k=top_k,
        signed=bool(signed),
    )


def raw_influence(graph: AttributionGraph) -> dict[NodeId, float]:
    """circuit-tracer's influence ``w (A + A^2 + ...)`` of every node on the targets."""
    values = weighted_influence(graph)
    return {n.id: float(v) for n, v in zip(graph.nodes, values, strict=False)}
