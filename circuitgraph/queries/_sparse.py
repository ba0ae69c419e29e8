"""Sparse views of a graph's edges (never a dense N x N matrix).

Rows = targets, columns = sources, as everywhere in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from circuitgraph.errors import QueryError
from circuitgraph.graph.dag import graph_dag, sweep
from circuitgraph.graph.edges import merge_edges
from circuitgraph.graph.graph import AttributionGraph

__all__ = [
    "Edges",
    "coalesced_edges",
    "row_normalised_abs",
    "target_weight_vector",
    "pass_through_divisors",
    "safe_inverse",
    "weighted_influence",
]


@dataclass(frozen=True, eq=False)
class Edges:
    """Unique edges ``(target, source)`` with summed weights (float64).

    ``inverse[i]`` is the unique edge that edge ``i`` of the graph belongs to.
    """

    target: np.ndarray
    source: np.ndarray
    weight: np.ndarray
    inverse: np.ndarray
    n: int

    def __len__(self) -> int:
        return int(self.weight.shape[0])


def coalesced_edges(graph: AttributionGraph) -> Edges:
    """The graph's edges with duplicate ``(target, source)`` pairs summed.

    Computed once per graph and cached on it (the graph's edge arrays are not changed in
    place by anything in circuitgraph); graphs built by the engine are known to have unique
    edges, which skips the sort.
    """
    edges = graph.derived("coalesced_edges")
    if edges is None:
        edges = _coalesce(graph)
        graph.store_derived("coalesced_edges", edges)
    return edges


def _coalesce(graph: AttributionGraph) -> Edges:
    n = graph.n_nodes
    t = graph.edge_target
    s = graph.edge_source
    w = graph.edge_weight.astype(np.float64)
    if t.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Edges(empty, empty, np.zeros(0), empty, n)
    if graph.edges_unique:
        return Edges(t, s, w, np.arange(t.size), n)
    mt, ms, summed, inverse = merge_edges(t, s, w, n)
    if mt.size == t.size:  # nothing to merge: keep the graph's order
        return Edges(t.copy(), s.copy(), w, np.arange(t.size), n)
    return Edges(mt, ms, summed, inverse.astype(np.int64), n)


def row_normalised_abs(target: np.ndarray, weight: np.ndarray, n: int) -> np.ndarray:
    """Per edge ``|w| / sum of |w| over the edges into its target`` (circuit-tracer's
    ``normalize_matrix``; rows summing to zero stay zero, the divisor is clamped at 1e-10)."""
    a = np.abs(weight)
    rows = np.bincount(target, weights=a, minlength=n)
    return a / np.maximum(rows, 1e-10)[target]


def target_weight_vector(graph: AttributionGraph) -> np.ndarray:
    """Length-N vector: each target's weight at its row, zero elsewhere."""
    if not graph.targets:
        raise QueryError("the graph has no targets; influence-based queries need at least one target node")
    w = np.zeros(graph.n_nodes, dtype=np.float64)
    for node_id, weight in graph.targets:
        w[graph.index_of(node_id)] += float(weight)
    return w


def pass_through_divisors(graph: AttributionGraph) -> np.ndarray:
    """What an intermediate node's outgoing edges are divided by to pass a change through.

    In the linear replacement model a reader ``r`` (feature, neuron) that receives a change
    ``d pre_r`` changes its outgoing edges by ``(edge / pre_r) * d pre_r``: its frozen
    nonlinearity is the gain ``activation / pre_activation`` (1 for an active ReLU/JumpReLU
    feature and for a gated neuron, whose recorded pre-activation *is* its activation).
    Nodes without a pre-activation (hand-built graphs) use their activation.  A zero divisor
    gives a zero gain (such a node writes nothing).
    """
    d = np.empty(graph.n_nodes, dtype=np.float64)
    for i, node in enumerate(graph.nodes):
        d[i] = node.pre_activation if node.pre_activation is not None else node.activation
    return d


def safe_inverse(d: np.ndarray) -> np.ndarray:
    out = np.zeros_like(d)
    nz = d != 0
    out[nz] = 1.0 / d[nz]
    return out


def weighted_influence(graph: AttributionGraph) -> np.ndarray:
    """circuit-tracer's target-weighted node influence ``w (A + A^2 + ...)`` (``A`` = the
    row-normalised absolute adjacency), computed once per graph by back-substitution
    (:mod:`circuitgraph.graph.dag`) and cached on it: scores and pruning both need it."""
    infl = graph.derived("node_influence")
    if infl is None:
        gd = graph_dag(graph)
        infl = sweep(gd.dag, abs_start=target_weight_vector(graph), row_divisor=gd.row_divisor)["abs"][:, 0]
        graph.store_derived("node_influence", infl)
    return infl
