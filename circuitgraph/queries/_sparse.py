"""Sparse views of a graph's edges (scipy.sparse; never a dense N x N matrix).

All matrices follow the graph's convention: rows = targets, columns = sources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph

__all__ = [
    "Edges",
    "coalesced_edges",
    "row_normalised_abs",
    "csr",
    "power_series",
    "target_weight_vector",
    "pass_through_divisors",
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
    cached = getattr(graph, "_coalesced_cache", None)
    if cached is not None and cached[0] is graph.edge_target and cached[1] is graph.edge_weight:
        return cached[2]
    edges = _coalesce(graph)
    graph._coalesced_cache = (graph.edge_target, graph.edge_weight, edges)
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
    key = t * np.int64(n) + s
    uniq, inverse = np.unique(key, return_inverse=True)
    if uniq.size == key.size:  # nothing to merge: keep the graph's order
        return Edges(t.copy(), s.copy(), w, np.arange(t.size), n)
    summed = np.bincount(inverse, weights=w, minlength=uniq.size)
    return Edges(uniq // n, uniq % n, summed, inverse.astype(np.int64), n)


def row_normalised_abs(target: np.ndarray, weight: np.ndarray, n: int) -> np.ndarray:
    """Per edge ``|w| / sum of |w| over the edges into its target`` (circuit-tracer's
    ``normalize_matrix``; rows summing to zero stay zero, the divisor is clamped at 1e-10)."""
    a = np.abs(weight)
    rows = np.bincount(target, weights=a, minlength=n)
    return a / np.maximum(rows, 1e-10)[target]


def csr(target: np.ndarray, source: np.ndarray, values: np.ndarray, n: int) -> sp.csr_matrix:
    """``(n, n)`` CSR matrix with ``M[target, source] = value`` for unique ``(target, source)``
    pairs (as :func:`coalesced_edges` gives them).  The row order is computed once per pair of
    index arrays and reused for every set of values."""
    key = (id(target), id(source), target.size, n)
    cached = _CSR_STRUCTURE.get("key")
    if cached != key:
        order = np.argsort(target, kind="stable")
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(target, minlength=n), out=indptr[1:])
        _CSR_STRUCTURE.update(key=key, order=order, indptr=indptr, indices=source[order],
                              arrays=(target, source))
    order = _CSR_STRUCTURE["order"]
    return sp.csr_matrix((values[order], _CSR_STRUCTURE["indices"], _CSR_STRUCTURE["indptr"]), shape=(n, n))


#: the last CSR structure built (keeps its index arrays alive so the id() key stays valid)
_CSR_STRUCTURE: dict = {}


def power_series(matrix: sp.spmatrix, start: np.ndarray, *, include_start: bool = False) -> np.ndarray:
    """``start @ (M + M^2 + ...)`` (plus ``start`` itself if asked), for a row vector or for
    the columns of ``start (n, m)`` read as row vectors.

    On a DAG the terms become exactly zero after at most (longest path) steps; a graph with
    a cycle whose terms do not vanish raises :class:`QueryError`.
    """
    mt = matrix.T  # a CSC view of the transpose: no conversion, and its matvec is as fast
    current = mt @ start
    total = current + start if include_start else current.copy()
    for _ in range(matrix.shape[0] + 1):
        if not np.any(current):
            return total
        current = mt @ current
        total += current
    raise QueryError(
        "the power series over the graph's adjacency does not terminate: the graph has a cycle "
        "(attribution graphs are acyclic; check a hand-built graph's edges)"
    )


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


def weighted_influence(graph: AttributionGraph) -> tuple[Edges, sp.csr_matrix, np.ndarray]:
    """``(edges, A, influence)``: circuit-tracer's row-normalised absolute adjacency ``A`` and
    the target-weighted influence ``w (A + A^2 + ...)``, computed once per graph and cached on
    it (scores and pruning both need them).  The normalisation works on the CSR layout (one
    segment sum per row), which is much faster than scattering by target on large graphs."""
    cached = getattr(graph, "_influence_cache", None)
    if cached is not None and cached[0] is graph.edge_target and cached[1] is graph.edge_weight:
        return cached[2]
    e = coalesced_edges(graph)
    n = graph.n_nodes
    A = csr(e.target, e.source, np.abs(e.weight), n)
    counts = np.diff(A.indptr)
    starts = A.indptr[:-1][counts > 0]
    sums = np.zeros(n)
    if A.data.size:
        sums[counts > 0] = np.add.reduceat(A.data, starts)
    A.data /= np.repeat(np.maximum(sums, 1e-10), counts)
    result = (e, A, power_series(A, target_weight_vector(graph)))
    graph._influence_cache = (graph.edge_target, graph.edge_weight, result)
    return result
