"""``max_feature_nodes`` / ``max_neuron_nodes``: compute the rows of only the most influential
features and neurons.

The selection follows circuit-tracer's rule, so that the same features are chosen on the same
inputs: the target rows are computed first; then, repeatedly, every feature not yet expanded
is ranked by its *partial influence* on the targets (a power series over the rows computed
so far, each row normalised by its sum of absolute weights, started from the target
weights), the best ``update_interval * batch_size`` are expanded (their incoming edges
computed), and the ranking is refreshed, until ``max_feature_nodes`` features are expanded.

The features that are not expanded stop being nodes; their outgoing edges into the kept
readers are summed into one ``remainder`` node per (layer, position)
(``index = REMAINDER_INDEX["features"]``), so completeness still holds exactly for every
kept reader.

``max_neuron_nodes`` selects neurons by the same rule (every neuron of a SiLU/GELU model is
active, so every neuron at every position is a candidate): the same rounds and the same
influence, the unexpanded neurons folded into ``remainder`` nodes with ``index =
REMAINDER_INDEX["neurons"]``.  With transcoders on some layers and neurons on others both
limits apply: each round expands the best readers of each kind that has not reached its limit.

What a run costs is set by *which* features are selected, not by the rounds: a selected row at
``resid_mid(l)``, position ``t`` crosses the frozen attention of layers ``l, ..., 0``: layer
``l`` at its single position (cheap), each of the ``l`` others at every position up to ``t``,
about ``t (2 d_model^2 + n_heads d_head t / 2)`` multiply-adds, plus one per writer the row can
see. When the selection concentrates on the last positions (random decoders do: the targets'
direct edges favour the last position's features) every row is about as costly as the widest
one, e.g. ~8 GFLOP per layer crossed at 2,048 tokens and GPT-2-small size; ranking and folding
are a few percent of the run.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from circuitgraph.attribution.dense_rows import DenseRows, dense_influence, fold_dense, writer_slot_rows
from circuitgraph.attribution.engine import (
    EdgeResult,
    compute_dense_rows,
    compute_edges,
    dense_rows_supported,
    split_by_location,
)
from circuitgraph.attribution.node_table import find_row, node_kinds, node_sites
from circuitgraph.attribution.nodes_builder import Collected
from circuitgraph.errors import ResourceError
from circuitgraph.graph.dag import add_segment
from circuitgraph.graph.edges import merge_edges
from circuitgraph.graph.nodes import REMAINDER_INDEX, Node, NodeAttrs, NodeId
from circuitgraph.residual import ResidualLocation

__all__ = ["select_and_compute", "partial_influence", "parts_influence", "fold_unselected", "RowParts", "SELECTED_KINDS",
           "ROWS_IN_MEMORY_BYTES", "PART_EDGES", "reader_edge_bounds"]


#: bytes of computed rows held in memory with max_feature_nodes; the parts beyond are written to
#: anonymous temporary files and read back one at a time (ranking rounds and folding)
ROWS_IN_MEMORY_BYTES = 2 * 1024**3
#: free space the temporary folder must keep when a part is written there
DISK_RESERVE_BYTES = 1024**3


def _nbytes(part: EdgeResult | DenseRows) -> int:
    if isinstance(part, DenseRows):
        return part.nbytes
    return part.target.nbytes + part.source.nbytes + part.weight.nbytes


class _SpilledPart:
    """One part's arrays (squeezed edges or dense blocks) in an anonymous temporary file."""

    def __init__(self, edges: EdgeResult | DenseRows):
        need = _nbytes(edges)
        free = shutil.disk_usage(tempfile.gettempdir()).free
        if free - need < DISK_RESERVE_BYTES:
            raise ResourceError(
                f"max_feature_nodes / max_neuron_nodes: the computed rows pass {ROWS_IN_MEMORY_BYTES / 1024**3:.1f} GB "
                f"of memory and the temporary folder {tempfile.gettempdir()} has {free / 1024**3:.1f} GB free for the "
                "rest; set a smaller graph.max_feature_nodes or graph.max_neuron_nodes, shorten the prompt or free "
                "disk space")
        self.constants = edges.constants
        self._file = tempfile.TemporaryFile(prefix="circuitgraph-rows-")
        if isinstance(edges, DenseRows):
            self.dense = ([(loc, lo, hi, j) for loc, lo, hi, j, _ in edges.blocks], len(edges.reader_rows),
                          edges.abs_sums, edges.sums)
            arrays = list(edges.reader_rows) + [v for *_, v in edges.blocks]
        else:
            self.dense = None
            arrays = [edges.target, edges.source, edges.weight]
        for a in arrays:
            np.save(self._file, a, allow_pickle=False)
        self._file.flush()

    def load(self) -> EdgeResult | DenseRows:
        self._file.seek(0)
        if self.dense is not None:
            keys, n_batches, abs_sums, sums = self.dense
            readers = [np.load(self._file, allow_pickle=False) for _ in range(n_batches)]
            blocks = [(*k, np.load(self._file, allow_pickle=False)) for k in keys]
            return DenseRows(readers, blocks, self.constants, abs_sums, sums)
        t, s, w = (np.load(self._file, allow_pickle=False) for _ in range(3))
        return EdgeResult(t, s, w, self.constants)

    def close(self) -> None:
        self._file.close()


@dataclass
class RowParts:
    """Rows computed so far, kept as the engine returned them: one part per residual location of
    its readers and engine call (each reader row lies in exactly one part) -- the engine's dense
    blocks (:class:`~circuitgraph.attribution.dense_rows.DenseRows`, 4 bytes per entry) or
    squeezed edge arrays (12 bytes per edge) -- never concatenated; ranking and folding visit them
    part by part.  Past
    :data:`ROWS_IN_MEMORY_BYTES` the parts go to temporary files, so the memory they take is
    bounded whatever the prompt length."""

    n: int
    parts: list[tuple[int, EdgeResult | DenseRows | _SpilledPart]] = field(default_factory=list)  # (reader location, edges)
    #: per writer location, the node row of each slot (needed by dense parts)
    slot_rows: dict[int, np.ndarray] | None = None
    #: per node: the sum of the absolute weights of its computed row
    abs_sums: np.ndarray = field(init=False)
    n_edges: int = 0
    bytes_in_memory: int = 0

    def __post_init__(self) -> None:
        self.abs_sums = np.zeros(self.n)

    def add(self, level: int, edges: EdgeResult | DenseRows) -> None:
        if edges.abs_sums is not None:  # summed by the engine as it made the edges
            for row, v in edges.abs_sums.items():
                self.abs_sums[row] += v
        elif edges.target.size:
            self.abs_sums += np.bincount(edges.target, weights=np.abs(edges.weight.astype(np.float64)),
                                         minlength=self.n)
        if isinstance(edges, DenseRows) and self.slot_rows is None:
            raise ValueError("RowParts.slot_rows must be set before dense parts are added")
        count = edges.n_entries if isinstance(edges, DenseRows) else int(edges.target.size)
        self.n_edges += count
        size = _nbytes(edges)
        if self.bytes_in_memory + size > ROWS_IN_MEMORY_BYTES and count:
            self.parts.append((level, _SpilledPart(edges)))
        else:
            self.bytes_in_memory += size
            self.parts.append((level, edges))

    def top_down(self) -> list[tuple[int, EdgeResult | DenseRows | _SpilledPart]]:
        """The parts by decreasing reader location (stable): a back-substitution order."""
        return sorted(self.parts, key=lambda lp: -lp[0])

    def edges(self) -> Iterator[tuple[int, EdgeResult | DenseRows]]:
        """``(location, edges)`` per part, top down (spilled parts read back one at a time)."""
        for level, p in self.top_down():
            yield level, (p.load() if isinstance(p, _SpilledPart) else p)

    def release(self) -> Iterator[tuple[int, EdgeResult | DenseRows]]:
        """As :meth:`edges`, and each part is dropped (its file closed) once the caller moves on."""
        ordered = self.top_down()
        self.parts = []
        self.bytes_in_memory = 0
        while ordered:
            level, p = ordered.pop(0)
            if isinstance(p, _SpilledPart):
                edges = p.load()
                p.close()
            else:
                edges = p
            del p
            yield level, edges


def partial_influence(t: np.ndarray, s: np.ndarray, w: np.ndarray, level: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Influence on the targets of every node from the rows computed so far.

    ``t, s, w``: the edges computed so far (unique ``(target, source)`` pairs); each target row
    is normalised by its sum of absolute weights (clamped at 1e-8, as circuit-tracer does
    here); ``level``: the residual location each reader reads; ``start``: the target weights.
    Returns ``sum_k x_k`` with ``x_0 = start`` and ``x_{k+1} = A^T x_k``, by one
    back-substitution over the levels (see :func:`parts_influence`).
    """
    rows = RowParts(start.shape[0])
    lv = level[t]
    for l in np.unique(lv)[::-1]:
        m = lv == l
        rows.add(int(l), EdgeResult(t[m], s[m], w[m], {}))
    return parts_influence(rows, start)


def parts_influence(rows: RowParts, start: np.ndarray) -> np.ndarray:
    """:func:`partial_influence` over :class:`RowParts`: the parts top down, each edge once.

    When the parts of one reader location are visited, every row they hold has received all of
    its influence (its out-edges lead to readers of higher locations, visited before)."""
    n = rows.n
    acc = np.zeros(n)
    z = np.asarray(start, dtype=np.float64).copy()
    divisor = np.maximum(rows.abs_sums, 1e-8)
    factor = np.zeros(n)
    for _, p in rows.edges():  # top down: a row is final when its part comes (its readers came before)
        if isinstance(p, DenseRows):
            r = p.rows()
            z[r] = start[r] + acc[r]
            factor[r] = z[r] / divisor[r]
            dense_influence(p, rows.slot_rows, factor, acc)
            continue
        r = np.unique(p.target)
        z[r] = start[r] + acc[r]
        v = np.abs(p.weight.astype(np.float64))
        v *= z[p.target] / divisor[p.target]
        acc += np.bincount(p.source, weights=v, minlength=n)
    return acc


#: the most possible edges of one engine call's rows (more rows are split into several calls), so
#: that one part's working copies stay small whatever the rows' width
PART_EDGES = 1 << 26
#: the same for dense parts (4 bytes an entry instead of 12 and no squeeze copies: 1 GB of values);
#: more rows per call means fewer passes over the writers' vectors and the attention patterns
PART_EDGES_DENSE = 1 << 28


def _by_location(col: Collected, subset: list[int], row_bound: np.ndarray | None = None,
                 part_edges: int = PART_EDGES) -> list[tuple[int, list[int]]]:
    """``subset`` (reader indices) split by the residual location each reads, top down, and into
    pieces of at most ``part_edges`` possible edges (``row_bound[i]``: reader ``i``'s)."""
    groups: dict[int, list[int]] = {}
    for i in subset:
        groups.setdefault(col.readers.locs[i], []).append(i)
    out = []
    for loc, idx in sorted(groups.items(), reverse=True):
        if row_bound is None:
            out.append((loc, idx))
            continue
        idx.sort(key=lambda i: col.readers.positions[i])
        piece, total = [], 0
        for i in idx:
            if piece and total + int(row_bound[i]) > part_edges:
                out.append((loc, piece))
                piece, total = [], 0
            piece.append(i)
            total += int(row_bound[i])
        out.append((loc, piece))
    return out


def reader_edge_bounds(col: Collected) -> np.ndarray:
    """Per reader: the writers at or below its location and at or before its position (at any
    position with bidirectional attention): at least its number of edges."""
    rd = col.readers
    n_locs = ResidualLocation.count(col.frozen.n_layers)
    counts = col.count_tables(n_locs, col.frozen.n_pos)[0]
    seen = counts.cumsum(0)
    seen = seen.cumsum(1) if col.frozen.causal else np.broadcast_to(seen.sum(1, keepdims=True), seen.shape)
    return seen[np.asarray(rd.locs, dtype=np.int64), np.asarray(rd.positions, dtype=np.int64)]


#: the node kinds whose rows are selected, and the remainder each folds into: its
#: ``REMAINDER_INDEX`` name, its count's attribute (a key of ``NodeAttrs``) and its label
SELECTED_KINDS: dict[str, tuple[str, Literal["n_features", "n_neurons"], str]] = {"feature": ("features", "n_features", "other features"),
                  "neuron": ("neurons", "n_neurons", "other neurons")}


def select_and_compute(
    col: Collected,
    max_feature_nodes: int | None,
    *,
    batch_size: int,
    update_interval: int = 4,
    progress: Callable[[int, int], None] | None = None,
    watch: Callable[[int, int, int], None] | None = None,
    dense: bool = True,
    max_neuron_nodes: int | None = None,
) -> tuple[RowParts, list[int]]:
    """Rows of the targets and of the selected features and neurons; returns (rows, selected
    reader indices).

    ``max_feature_nodes`` / ``max_neuron_nodes``: how many feature / neuron readers to keep
    (None: all of that kind).  Both kinds are ranked by the same influence in the same rounds;
    each round expands the best ``update_interval * batch_size`` unexpanded readers of each kind
    that has not reached its limit.  A reader that is a target is always kept.

    ``dense``: keep the rows as the engine's dense blocks (:mod:`~circuitgraph.attribution.dense_rows`,
    4 bytes per entry) rather than as squeezed edge arrays (12 bytes per edge); the same graph.

    ``watch(rows_done, edges_done, rows_total)`` is called after each batch of rows (the memory
    guard: it raises to stop a run that would not fit)."""
    limits = {"feature": max_feature_nodes, "neuron": max_neuron_nodes}
    try:
        return _select(col, limits, batch_size, update_interval, progress, watch, dense)
    finally:
        col.writers.release_vectors()  # held across the engine calls below (short prompts)


def _select(col: Collected, limits: dict[str, int | None], batch_size: int, update_interval: int,
            progress: Callable[[int, int], None] | None, watch: Callable[[int, int, int], None] | None,
            dense: bool) -> tuple[RowParts, list[int]]:
    rd = col.readers
    nodes = col.nodes
    n_nodes = len(nodes)
    # every target is a reader (a feature or neuron target too: always kept)
    target_row = {nid: find_row(nodes, nid) for nid, _ in col.targets}
    reader_rows = np.asarray(rd.rows, dtype=np.int64)
    kinds = node_kinds(nodes)[reader_rows]
    is_target = np.isin(reader_rows, np.asarray(list(target_row.values()), dtype=np.int64))
    # the readers of each kind that is selected (fewer kept than there are); the rest are computed whole
    selectable = {kind for kind, k in limits.items() if k is not None}
    pools: dict[str, list[int]] = {kind: np.flatnonzero((kinds == kind) & ~is_target).tolist() for kind in selectable}
    other_readers = np.flatnonzero(~np.isin(kinds, list(selectable)) | is_target).tolist()
    for kind in list(pools):
        if limits[kind] >= len(pools[kind]):
            other_readers += pools.pop(kind)
    rows = RowParts(n_nodes, slot_rows=writer_slot_rows(col))
    if not pools:
        rows.add(-1, compute_edges(col, batch_size=batch_size, progress=progress))
        return rows, list(range(len(rd.rows)))
    other_readers.sort()
    start = np.zeros(n_nodes)
    for nid, w in col.targets:
        start[target_row[nid]] = w
    for loc, subset in _by_location(col, other_readers):
        rows.add(loc, _compute_rows(col, dense, batch_size=batch_size, reader_subset=subset))
    done = list(other_readers)
    bound = reader_edge_bounds(col)
    total = sum(limits[kind] for kind in pools)
    # per pool: its readers (indices into the reader table), their node rows, which are expanded
    readers = {kind: np.asarray(pool, dtype=np.int64) for kind, pool in pools.items()}
    node_rows = {kind: np.asarray(rd.rows, dtype=np.int64)[idx] for kind, idx in readers.items()}
    visited = {kind: np.zeros(len(idx), dtype=bool) for kind, idx in readers.items()}
    n_visited = dict.fromkeys(pools, 0)
    while any(n_visited[kind] < limits[kind] for kind in pools):
        infl = parts_influence(rows, start)
        reader_of: dict[int, tuple[str, int]] = {}
        for kind in pools:
            rank = np.argsort(-infl[node_rows[kind]], kind="stable")
            queue = rank[~visited[kind][rank]][: min(update_interval * batch_size, limits[kind] - n_visited[kind])]
            reader_of.update((int(readers[kind][j]), (kind, int(j))) for j in queue)
        # the ranking is refreshed only after the whole queue, so the order in which its rows are
        # computed does not matter: all of them at once, by location (larger engine calls, fewer
        # passes over the writers and the patterns than batch_size rows at a time)
        pieces = _by_location(col, list(reader_of), bound, PART_EDGES_DENSE if dense else PART_EDGES)
        for part, computed in _round_calls(col, dense, pieces, bound, batch_size):
            for loc, edges in computed:
                rows.add(loc, edges)
            done += part
            for i in part:
                kind, j = reader_of[i]
                visited[kind][j] = True
                n_visited[kind] += 1
            if progress is not None:
                progress(sum(n_visited.values()), total)
            if watch is not None:
                watch(len(done), rows.n_edges, len(other_readers) + total)
    return rows, sorted(done)


def _round_calls(col: Collected, dense: bool, pieces: list[tuple[int, list[int]]], bound: np.ndarray,
                 batch_size: int) -> Iterator[tuple[list[int], list[tuple[int, EdgeResult | DenseRows]]]]:
    """A round's rows computed: ``(readers, [(location, rows), ...])`` per engine call.  Dense rows
    of several locations go in one call while their possible edges stay within
    :data:`PART_EDGES_DENSE` (its waves mix locations, so that the writers of each location meet
    the readers of every location above in one GEMM; the rows come back split by location)."""
    if not (dense and dense_rows_supported(col)):
        for loc, part in pieces:
            yield part, [(loc, _compute_rows(col, dense, batch_size=batch_size, reader_subset=part))]
        return
    group: list[int] = []
    total = 0
    for i, (_, part) in enumerate(pieces):
        group += part
        total += int(bound[part].sum())
        nxt = pieces[i + 1][1] if i + 1 < len(pieces) else None
        if nxt is None or total + int(bound[nxt].sum()) > PART_EDGES_DENSE:
            computed = compute_dense_rows(col, batch_size=batch_size, reader_subset=group, keep_writer_vectors=True)
            yield group, split_by_location(col, computed)
            group, total = [], 0


def _compute_rows(col: Collected, dense: bool, **kwargs: Any) -> EdgeResult | DenseRows:
    """One engine call's rows: dense blocks when asked and possible, else squeezed edges."""
    if dense and dense_rows_supported(col):
        return compute_dense_rows(col, keep_writer_vectors=True, **kwargs)
    return compute_edges(col, keep_writer_vectors=True, **kwargs)


def fold_unselected(col: Collected, rows: RowParts, selected: list[int]) -> tuple[list[Node], EdgeResult, dict[int, int]]:
    """Replace unselected features (neurons) by per-(layer, position) remainder nodes; renumber rows.

    Returns the new node list, the renumbered edges (duplicates summed; top down by reader
    location, as the engine stores them) and the map old row -> new row for kept nodes.  The
    parts of ``rows`` are folded one by one and released (each reader's row lies in one part),
    so the pre-fold edges are never copied whole."""
    rd = col.readers
    nodes = col.nodes
    reader_rows = np.asarray(rd.rows, dtype=np.int64)
    keep_reader = np.zeros(len(nodes), dtype=bool)
    keep_reader[reader_rows[np.asarray(selected, dtype=np.int64)]] = True
    all_kinds = node_kinds(nodes)
    dropped = reader_rows[~keep_reader[reader_rows] & np.isin(all_kinds[reader_rows], list(SELECTED_KINDS))]
    is_dropped = np.zeros(len(nodes), dtype=bool)
    is_dropped[dropped] = True
    kept = np.flatnonzero(~is_dropped)
    new_nodes: list[Node] = [nodes[r] for r in kept.tolist()]
    old_to_new: dict[int, int] = dict(zip(kept.tolist(), range(kept.size), strict=True))
    # one remainder per (kind, layer, position) of the dropped, in that order
    kinds, layers, positions = node_sites(nodes, dropped)
    kind_names, kind_code = np.unique(kinds.astype(str), return_inverse=True)
    sites, site_of, counts = np.unique(np.stack([kind_code, layers, positions], 1).reshape(-1, 3), axis=0,
                                       return_inverse=True, return_counts=True)
    for (code, layer, position), count in zip(sites.tolist(), counts.tolist(), strict=True):
        which, count_attr, label = SELECTED_KINDS[str(kind_names[code])]
        attrs: NodeAttrs = {}
        attrs[count_attr] = count
        new_nodes.append(Node(NodeId("remainder", layer, position, REMAINDER_INDEX[which]), 1.0,
                              label=f"{label} L{layer}@{position}", attrs=attrs))
    src_map = np.full(len(nodes), -1, dtype=np.int64)
    src_map[kept] = np.arange(kept.size)
    src_map[dropped] = kept.size + site_of.reshape(-1)
    tgt_map = np.full(len(nodes), -1, dtype=np.int64)
    tgt_map[kept] = np.arange(kept.size)
    n_new = len(new_nodes)
    constants: dict[int, float] = {}
    folded: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    # per row of the folded graph: the sum and the sum of |w| of its edges, and the location
    # segments (parts come top down): the graph adopts them instead of passing over the edges again
    sums, abs_sums = np.zeros(n_new), np.zeros(n_new)
    segments: list[tuple[int, int, int]] = []
    n_out = 0
    for level, p in rows.release():  # each part dropped once folded
        constants.update({int(tgt_map[r]): c for r, c in p.constants.items()})
        if isinstance(p, DenseRows):
            t, s, w = fold_dense(p, rows.slot_rows, tgt_map, src_map)
            assert (t >= 0).all(), "an edge into an unselected feature was computed"
            part = (t.astype(np.int32), s.astype(np.int32), w)
        elif p.target.size:
            part = _fold_part(p, tgt_map, src_map, n_new)
        else:
            part = None
        del p
        if part is None or not part[0].size:
            continue
        folded.append(part)
        w64 = part[2].astype(np.float64)
        sums += np.bincount(part[0], weights=w64, minlength=n_new)
        abs_sums += np.bincount(part[0], weights=np.abs(w64, out=w64), minlength=n_new)
        add_segment(segments, level, n_out, n_out + part[0].size)
        n_out += part[0].size
    if folded:
        t, s, w = (np.concatenate(x) for x in zip(*folded, strict=False))
    else:
        t = s = np.zeros(0, dtype=np.int32)
        w = np.zeros(0, dtype=np.float32)
    levels = [lvl for lvl, *_ in segments]
    ordered = all(a > b for a, b in zip(levels, levels[1:], strict=False)) and -1 not in levels
    return new_nodes, EdgeResult(t, s, w, constants, abs_sums, sums, segments if ordered else None), old_to_new


def _fold_part(p: EdgeResult, tgt_map: np.ndarray, src_map: np.ndarray, n_new: int):
    """One part's edges renumbered, the edges that now share (target, remainder source) summed."""
    t = tgt_map[p.target]
    assert (t >= 0).all(), "an edge into an unselected feature was computed"
    t, s, w, _ = merge_edges(t, src_map[p.source], p.weight, n_new, drop_zeros=True)
    return t.astype(np.int32), s.astype(np.int32), w.astype(p.weight.dtype)
