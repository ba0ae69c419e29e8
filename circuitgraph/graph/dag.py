"""Exact back-substitution over an attribution graph: one pass over the edges per target set.

An attribution graph is a DAG whose readers are ordered by the residual location they read
(a feature of layer ``l`` reads ``resid_mid(l)`` and writes ``resid_post(l)``, which only
readers of later locations read).  Every quantity that the queries propagate from the targets
down to the inputs is a sum over paths of products of per-edge factors,

    acc_s = sum_r z_r * v(r, s),        z_r = start_r + gain_r * acc_r,

and it is computed exactly by visiting the readers by *level* (their residual location),
top down: when the edges into the readers of one level are visited, every ``z_r`` of that
level is already final (all of ``r``'s out-edges lead to higher levels, visited before).  So
each edge is read once, in chunks, with no iteration to convergence and no dense matrix.

* circuit-tracer's influence ``w (A + A^2 + ...)``: ``v = |E[r, s]| / sum_s' |E[r, s']|``,
  ``gain = 1``, ``start = w``; the influence is ``acc``.
* the signed total effect (:mod:`circuitgraph.queries.influence`): ``v = E[r, s]``,
  ``gain = 1 / pre_r``, ``start = e_T``; ``acc_s`` is the total effect of ``s`` on ``T`` and
  ``z_r = d pre_T / d pre_r``.

**Levels.**  Each reader's level is its residual read location, taken from its identity
(``kind``, ``layer``; a direction target's ``site``); nodes without incoming edges get level
-1.  The levels are checked against every edge (``level[source] < level[target]``, one
vectorised comparison); a graph on which they do not hold (hand-built graphs) gets its
levels from a topological sort instead (Kahn's algorithm by rounds, each edge visited once),
which also reports a cycle.  The edges are visited in decreasing level of their target:
the engine already stores them in that order (and pruned graphs in increasing order), so
usually no permutation is needed; otherwise one stable radix sort of the small level keys.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from circuitgraph.errors import QueryError
from circuitgraph.graph.edges import incoming_sums, merge_edges, topological_levels
from circuitgraph.residual import ResidualLocation
from circuitgraph.spec.kinds import ACTIVATION_KINDS

__all__ = ["DagOrder", "GraphDag", "dag_order", "graph_dag", "graph_levels", "sweep", "incoming_sums", "CHUNK",
           "adopt_engine_order", "add_segment"]

#: edges per chunk: bounds the float64 working copies (a few times 8 bytes x CHUNK)
CHUNK = 1 << 22


@dataclass(frozen=True, eq=False)
class DagOrder:
    """The edge arrays of a DAG and the order in which to visit them.

    ``target, source, weight``: the edges (any float dtype; duplicates allowed, they add).
    ``order``: a permutation of the edges into visiting order, or None when the stored order
    already is one (``reverse``: visit the stored edges back to front).  ``segments``: the
    ``(level, start, end)`` ranges of the visiting order, highest level first.
    ``level_rows``: per level of ``segments``, the node rows at that level.
    """

    n: int
    target: np.ndarray
    source: np.ndarray
    weight: np.ndarray
    level: np.ndarray
    order: np.ndarray | None
    reverse: bool
    segments: tuple[tuple[int, int, int], ...]

    def chunks(self):
        """``(level, target, source, weight)`` per chunk of edges, in visiting order; each chunk
        lies within one level.  Slices of the stored arrays when no permutation is needed."""
        E = self.target.shape[0]
        for lvl, a, b in self.segments:
            for c in range(a, b, CHUNK):
                d = min(b, c + CHUNK)
                if self.order is not None:
                    idx = self.order[c:d]
                    yield lvl, self.target[idx], self.source[idx], self.weight[idx]
                elif self.reverse:
                    sl = slice(E - d, E - c)
                    yield lvl, self.target[sl], self.source[sl], self.weight[sl]
                else:
                    yield lvl, self.target[c:d], self.source[c:d], self.weight[c:d]


def _kahn_levels(n: int, target: np.ndarray, source: np.ndarray) -> np.ndarray:
    """Levels such that ``level[source] < level[target]`` on every edge (longest path from the
    node to a sink, counted downwards); raises :class:`QueryError` on a cycle."""
    depth = topological_levels(n, target, source)  # from the sinks, against the edges
    if (depth < 0).any():
        raise QueryError(
            "the graph's edges have a cycle, so influence and total effects are not defined "
            "(attribution graphs are acyclic; check a hand-built graph's edges)"
        )
    return (int(depth.max(initial=-1)) + 1 - depth).astype(np.int64)


def dag_order(n: int, target: np.ndarray, source: np.ndarray, weight: np.ndarray,
              level: np.ndarray | None = None, *, trusted: bool = False) -> DagOrder:
    """Visiting order of the edges of a DAG on ``n`` nodes (see the module docstring).

    ``level``: candidate levels per node (e.g. residual read locations); nodes without
    incoming edges are set to -1.  When they are not consistent with the edges (or not
    given), the levels come from a topological sort.  ``trusted``: the levels are known to
    hold on these edges (a subset of edges they were checked on); skip the check."""
    target = np.asarray(target)
    source = np.asarray(source)
    E = target.shape[0]
    has_in = np.zeros(n, dtype=bool)
    has_in[target] = True
    lv = kt = None
    if level is not None:
        lv = np.where(has_in, np.asarray(level, dtype=np.int64), -1)
        small = _compact(lv)
        if E and not trusted:
            kt = _gather_chunked(small, target)  # the targets' levels, also the visiting key below
            if not _levels_hold(small, kt, source):
                lv = kt = None
    if lv is None:
        lv = np.where(has_in, _kahn_levels(n, target, source), -1) if E else np.full(n, -1, dtype=np.int64)
        small = _compact(lv)
    order, reverse = None, False
    segments: list[tuple[int, int, int]] = []
    if E:
        if kt is None:
            kt = _gather_chunked(small, target)
        step = kt[1:] - kt[:-1] if E > 1 else np.zeros(0, dtype=kt.dtype)
        if not (step > 0).any():
            pass  # already non-increasing: visit as stored
        elif not (step < 0).any():
            reverse = True
            kt = kt[::-1]
        else:
            order = np.argsort(-kt, kind="stable")  # a radix sort for int16 keys
            kt = kt[order]
        cut = np.flatnonzero(kt[1:] != kt[:-1]) + 1
        bounds = np.concatenate([[0], cut, [E]])
        segments = [(int(kt[a]), int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    return DagOrder(n, target, source, np.asarray(weight), lv, order, reverse, tuple(segments))


def _gather_chunked(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    out = np.empty(index.shape[0], dtype=values.dtype)
    for c in range(0, index.shape[0], CHUNK):
        out[c : c + CHUNK] = values[index[c : c + CHUNK]]
    return out


def _compact(level: np.ndarray) -> np.ndarray:
    """``level`` as int16 when it fits (cheaper gathers over every edge)."""
    lo, hi = int(level.min(initial=-1)), int(level.max(initial=-1))
    return level.astype(np.int16) if -32768 < lo and hi < 32767 else level


def _levels_hold(level: np.ndarray, target_level: np.ndarray, source: np.ndarray) -> bool:
    """Every edge goes from a lower level to a higher one (``target_level``: the targets' levels)."""
    for c in range(0, source.shape[0], CHUNK):
        if not (level[source[c : c + CHUNK]] < target_level[c : c + CHUNK]).all():
            return False
    return True


def _scatter(acc: np.ndarray, src: np.ndarray, contrib: np.ndarray) -> None:
    n, m = acc.shape
    if m == 1:
        acc[:, 0] += np.bincount(src, weights=contrib[:, 0], minlength=n)
    else:
        for j in range(m):
            acc[:, j] += np.bincount(src, weights=contrib[:, j], minlength=n)


def sweep(
    dag: DagOrder,
    *,
    abs_start: np.ndarray | None = None,
    row_divisor: np.ndarray | None = None,
    source_mask: np.ndarray | None = None,
    signed_start: np.ndarray | None = None,
    gain: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """One pass over the edges for up to two propagations at once.

    * ``abs_start (n, m)`` with ``row_divisor (n,)``: ``acc_abs[s] = sum_r z[r] |w_rs| / row_divisor[r]``
      (``* source_mask[s]`` when given), ``z = abs_start + acc_abs``;
    * ``signed_start (n, m')`` with ``gain (n,)``: ``acc_signed[s] = sum_r y[r] w_rs``,
      ``y = signed_start + gain * acc_signed``.

    Returns ``{"abs": acc_abs, "signed": acc_signed, "y": y, ...}`` for what was asked.
    """
    n = dag.n
    do_abs, do_sig = abs_start is not None, signed_start is not None
    if do_abs:
        z_abs = np.array(abs_start, dtype=np.float64).reshape(n, -1)
        acc_abs = np.zeros_like(z_abs)
        divisor = np.ones(n) if row_divisor is None else np.asarray(row_divisor, dtype=np.float64)
        mask = None if source_mask is None else np.asarray(source_mask, dtype=np.float64)
    if do_sig:
        y = np.array(signed_start, dtype=np.float64).reshape(n, -1)
        acc_sig = np.zeros_like(y)
        g = np.ones(n) if gain is None else np.asarray(gain, dtype=np.float64)
    # rows per level, to finalise z / y of a level before its edges are read
    lv = dag.level
    order_nodes = np.argsort(lv, kind="stable")
    bounds = np.searchsorted(lv[order_nodes], np.arange(int(lv.min(initial=-1)), int(lv.max(initial=-1)) + 2))
    base = int(lv.min(initial=-1))

    def rows_at(level: int) -> np.ndarray:
        k = level - base
        return order_nodes[bounds[k] : bounds[k + 1]]

    if do_abs and not do_sig and mask is None and z_abs.shape[1] == 1:  # the common case: one influence
        return {"abs": _single_influence(dag, z_abs[:, 0], divisor, rows_at)[:, None]}
    done = np.zeros(n, dtype=bool)
    current = None
    for level, t, s, w in dag.chunks():
        if level != current:
            rows = rows_at(level)
            done[rows] = True
            if abs_start is not None:  # do_abs
                z_abs[rows] = _rows(abs_start, rows, n) + acc_abs[rows]
            if signed_start is not None:  # do_sig
                y[rows] = _rows(signed_start, rows, n) + g[rows, None] * acc_sig[rows]
            current = level
        w64 = w.astype(np.float64)
        if do_sig:
            _scatter(acc_sig, s, y[t] * w64[:, None])
        if do_abs:
            v = np.abs(w64, out=w64)
            v /= divisor[t]
            if mask is not None:
                v *= mask[s]
            _scatter(acc_abs, s, z_abs[t] * v[:, None])
    out: dict[str, np.ndarray] = {}
    if do_abs:
        out["abs"] = acc_abs
    if signed_start is not None:  # do_sig
        rest = np.flatnonzero(~done)  # nodes without incoming edges
        y[rest] = _rows(signed_start, rest, n) + g[rest, None] * acc_sig[rest]
        out["signed"] = acc_sig
        out["y"] = y
    return out


def _workers() -> int:
    """Threads for the chunks of one level (numpy releases the GIL in the gathers and bincounts)."""
    return max(1, min(4, os.cpu_count() or 1))


def _chunk_influence(t: np.ndarray, s: np.ndarray, w: np.ndarray, factor: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(s, weights=factor[t] * np.abs(w), minlength=n)


def _single_influence(dag: DagOrder, start: np.ndarray, divisor: np.ndarray, rows_at) -> np.ndarray:
    """:func:`sweep`'s most common case, one influence ``acc_s = sum_r z_r |w_rs| / divisor_r``
    with ``z = start + acc``: the chunks of one level are independent (they read the final ``z``
    of that level's rows and add to lower levels), so they run on several threads, each into its
    own array, summed before the next level's ``z`` is made."""
    n = dag.n
    acc = np.zeros(n)
    z = np.array(start, dtype=np.float64)
    workers = _workers()
    pool = ThreadPoolExecutor(workers) if workers > 1 else None
    pending: list = []
    current, factor = None, np.empty(0)  # factor: set with the first level
    try:
        for level, t, s, w in dag.chunks():
            if level != current:
                for f in pending:  # the level above is complete
                    acc += f.result()
                pending = []
                rows = rows_at(level)
                z[rows] = start[rows] + acc[rows]
                factor = z / divisor  # z / divisor per row: one gather per edge
                current = level
            if pool is None:
                acc += _chunk_influence(t, s, w, factor, n)
                continue
            if len(pending) >= 2 * workers:  # bounded: each result is one array of n
                acc += pending.pop(0).result()
            pending.append(pool.submit(_chunk_influence, t, s, w, factor, n))
        for f in pending:
            acc += f.result()
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return acc


def _rows(start: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    return np.asarray(start, dtype=np.float64).reshape(n, -1)[rows]


def graph_levels(graph) -> np.ndarray:  # AttributionGraph (no import cycle
    """Candidate level per node: the residual location its reader reads (see
    :mod:`circuitgraph.attribution.frozen_model`: ``resid_pre(l) = 2l``, ``resid_mid(l) = 2l+1``,
    ``resid_post(l) = 2l+2``).  Features and neurons read ``resid_mid``; logits and
    logit-difference targets the final residual; direction targets their ``site``; other
    kinds (hand-built readers) ``resid_pre`` of their layer.  Checked against the edges by
    :func:`dag_order`."""
    site = {"resid_pre": ResidualLocation.resid_pre, "resid_mid": ResidualLocation.resid_mid,
            "resid_post": ResidualLocation.resid_post}
    out = np.empty(graph.n_nodes, dtype=np.int64)
    for i, node in enumerate(graph.nodes):
        kind, layer = node.kind, node.layer
        if kind in ACTIVATION_KINDS:
            out[i] = ResidualLocation.read_by(kind, layer)
        elif kind == "target" and node.attrs.get("site") in site:
            out[i] = site[node.attrs["site"]](layer)
        else:
            out[i] = ResidualLocation.resid_pre(layer)
    return out


@dataclass(frozen=True, eq=False)
class GraphDag:
    """A graph's unique edges in visiting order, with the per-node sums of absolute incoming
    weights that circuit-tracer's row normalisation divides by."""

    dag: DagOrder
    abs_row_sums: np.ndarray
    #: per edge of the graph, its unique edge in ``dag`` (None: the graph's edges are unique)
    inverse: np.ndarray | None = None

    @property
    def row_divisor(self) -> np.ndarray:
        """``max(sum |w|, 1e-10)`` per node (circuit-tracer's ``normalize_matrix``)."""
        return np.maximum(self.abs_row_sums, 1e-10)


def graph_dag(graph) -> GraphDag:  # AttributionGraph
    """The :class:`GraphDag` of a graph, built once and cached on it (the graph's edge arrays
    are not changed in place by anything in circuitgraph).  Duplicate ``(target, source)``
    pairs of a hand-built graph are summed first (an edge's weight is their sum)."""
    cached = graph.derived("dag")
    if cached is not None:
        return cached
    t, s, w = graph.edge_target, graph.edge_source, graph.edge_weight
    inverse = None
    if graph.edges_unique or t.size == 0:
        abs_sums = graph.incoming_abs_sums()
    else:
        mt, ms, mw, inv = merge_edges(t, s, w, graph.n_nodes)
        if mt.size < t.size:  # sum the duplicates
            t, s, w, inverse = mt, ms, mw, inv
            abs_sums = incoming_sums(t, w, graph.n_nodes)[1]
        else:
            abs_sums = graph.incoming_abs_sums()
    result = GraphDag(dag_order(graph.n_nodes, t, s, w, graph_levels(graph)), abs_sums, inverse)
    graph.store_derived("dag", result)
    return result


def add_segment(segments: list[tuple[int, int, int]], level: int, start: int, end: int) -> None:
    """Record that edges ``start..end-1`` have readers of ``level`` (merged with the last range
    when it has the same level): the ``segments`` of :func:`adopt_engine_order`."""
    if segments and segments[-1][0] == level:
        segments[-1] = (level, segments[-1][1], end)
    else:
        segments.append((level, start, end))


def adopt_engine_order(graph, segments: list[tuple[int, int, int]], reader_rows: np.ndarray,
                       reader_locs: np.ndarray) -> bool:
    """Give ``graph`` the :class:`GraphDag` of the engine's edge order without a pass over the edges.

    ``segments``: ``(location, start, end)`` ranges of the edge arrays whose readers read one
    residual location, highest first, as :func:`circuitgraph.attribution.engine.compute_edges`
    writes them; ``reader_rows`` / ``reader_locs``: every reader's node row and location.  Every
    source of the engine is a writer below its reader, so the levels hold by construction; what is
    checked here (per node, not per edge) is that the engine's locations are the levels
    :func:`graph_levels` gives the readers and that the segments tile the edges top down.
    Returns False (nothing stored; :func:`graph_dag` will derive the order) when not."""
    E = graph.n_edges
    lv_all = graph_levels(graph)
    rows = np.asarray(reader_rows, dtype=np.int64)
    locs = np.asarray(reader_locs, dtype=np.int64)
    if rows.size and not (lv_all[rows] == locs).all():
        return False
    ends = [0] + [b for _, _, b in segments]
    if any(a != ends[k] for k, (_, a, _) in enumerate(segments)) or ends[-1] != E:
        return False
    levels = [lvl for lvl, a, b in segments if b > a]
    if any(x <= y for x, y in zip(levels, levels[1:], strict=False)):
        return False
    abs_sums = graph.incoming_abs_sums()  # the engine's (adopted), or one pass
    has_in = abs_sums > 0  # the engine keeps no zero edge
    lv = np.where(has_in, lv_all, -1)
    segs = tuple((int(lvl), int(a), int(b)) for lvl, a, b in segments if b > a)
    order = DagOrder(graph.n_nodes, graph.edge_target, graph.edge_source, np.asarray(graph.edge_weight), lv,
                     None, False, segs)
    graph.store_derived("dag", GraphDag(order, abs_sums))
    return True
