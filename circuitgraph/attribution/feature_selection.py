"""``max_feature_nodes``: compute the rows of only the most influential features.

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
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from circuitgraph.attribution.engine import EdgeResult, compute_edges
from circuitgraph.attribution.nodes_builder import Collected
from circuitgraph.graph.dag import dag_order, incoming_sums, sweep
from circuitgraph.graph.nodes import REMAINDER_INDEX, Node, NodeId

__all__ = ["select_and_compute", "partial_influence"]


def partial_influence(t: np.ndarray, s: np.ndarray, w: np.ndarray, level: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Influence on the targets of every node from the rows computed so far.

    ``t, s, w``: the edges computed so far (unique ``(target, source)`` pairs); each target row
    is normalised by its sum of absolute weights (clamped at 1e-8, as circuit-tracer does
    here); ``level``: the residual location each reader reads; ``start``: the target weights.
    Returns ``sum_k x_k`` with ``x_0 = start`` and ``x_{k+1} = A^T x_k``, by one
    back-substitution over the levels (:mod:`circuitgraph.graph.dag`).
    """
    n = start.shape[0]
    dag = dag_order(n, t, s, w, level)
    abs_sums = incoming_sums(t, w, n)[1]
    return sweep(dag, abs_start=start, row_divisor=np.maximum(abs_sums, 1e-8))["abs"][:, 0]


def select_and_compute(
    col: Collected,
    max_feature_nodes: int,
    *,
    batch_size: int,
    update_interval: int = 4,
    progress: Callable[[int, int], None] | None = None,
    watch: Callable[[int, int, int], None] | None = None,
) -> tuple[EdgeResult, list[int]]:
    """Edges of the targets and of the selected features; returns (edges, selected reader indices).

    ``watch(rows_done, edges_done, rows_total)`` is called after each batch of rows (the memory
    guard: it raises to stop a run that would not fit)."""
    rd = col.readers
    nodes = col.nodes
    n_nodes = len(nodes)
    feature_readers = [i for i, r in enumerate(rd.rows) if nodes[r].kind == "feature"]
    other_readers = [i for i, r in enumerate(rd.rows) if nodes[r].kind != "feature"]
    if max_feature_nodes >= len(feature_readers):
        return compute_edges(col, batch_size=batch_size, progress=progress), list(range(len(rd.rows)))
    target_rows = {nid: w for nid, w in col.targets}
    start = np.zeros(n_nodes)
    index = {n.id: i for i, n in enumerate(nodes)}
    for nid, w in target_rows.items():
        start[index[nid]] = w
    parts = [compute_edges(col, batch_size=batch_size, reader_subset=other_readers)]
    done = list(other_readers)
    visited = np.zeros(len(feature_readers), dtype=bool)
    feature_node_rows = np.array([rd.rows[i] for i in feature_readers])
    n_visited = 0
    level = np.full(n_nodes, -1, dtype=np.int64)
    level[np.asarray(rd.rows, dtype=np.int64)] = rd.locs
    while n_visited < max_feature_nodes:
        t = np.concatenate([p.target for p in parts])
        s = np.concatenate([p.source for p in parts])
        w = np.concatenate([p.weight for p in parts])
        infl = partial_influence(t, s, w, level, start)
        rank = np.argsort(-infl[feature_node_rows], kind="stable")
        queue = rank[~visited[rank]][: min(update_interval * batch_size, max_feature_nodes - n_visited)]
        for k in range(0, len(queue), batch_size):
            chunk = queue[k : k + batch_size]
            subset = [feature_readers[j] for j in chunk]
            parts.append(compute_edges(col, batch_size=batch_size, reader_subset=subset))
            done += subset
            visited[chunk] = True
            n_visited += len(chunk)
            if progress is not None:
                progress(n_visited, max_feature_nodes)
            if watch is not None:
                watch(len(done), sum(p.target.size for p in parts), len(other_readers) + max_feature_nodes)
    constants: dict[int, float] = {}
    for p in parts:
        constants.update(p.constants)
    edges = EdgeResult(
        np.concatenate([p.target for p in parts]),
        np.concatenate([p.source for p in parts]),
        np.concatenate([p.weight for p in parts]),
        constants,
    )
    return edges, sorted(done)


def fold_unselected(col: Collected, edges: EdgeResult, selected: list[int]) -> tuple[list[Node], EdgeResult, dict[int, int]]:
    """Replace unselected features by per-(layer, position) remainder nodes; renumber rows.

    Returns the new node list, the renumbered edges (duplicates summed) and the map old row ->
    new row for kept nodes."""
    rd = col.readers
    nodes = col.nodes
    keep_reader = {rd.rows[i] for i in selected}
    dropped = {r for r in rd.rows if nodes[r].kind == "feature" and r not in keep_reader}
    new_nodes: list[Node] = []
    old_to_new: dict[int, int] = {}
    remainder_row: dict[tuple[int, int], int] = {}
    counts: dict[tuple[int, int], int] = {}
    for r in dropped:
        key = (nodes[r].layer, nodes[r].position)
        counts[key] = counts.get(key, 0) + 1
    for r, node in enumerate(nodes):
        if r not in dropped:
            old_to_new[r] = len(new_nodes)
            new_nodes.append(node)
    for key in sorted(counts):
        remainder_row[key] = len(new_nodes)
        new_nodes.append(Node(NodeId("remainder", key[0], key[1], REMAINDER_INDEX["features"]), 1.0,
                              label=f"other features L{key[0]}@{key[1]}", attrs={"n_features": counts[key]}))
    src_map = np.full(len(nodes), -1, dtype=np.int64)
    for old, new in old_to_new.items():
        src_map[old] = new
    for r in dropped:
        src_map[r] = remainder_row[(nodes[r].layer, nodes[r].position)]
    tgt_map = np.full(len(nodes), -1, dtype=np.int64)
    for old, new in old_to_new.items():
        tgt_map[old] = new
    # one int64 key per edge (target, new source), built in chunks: no full-size remapped copies
    n_new, E, chunk = len(new_nodes), edges.target.size, 1 << 22
    key = np.empty(E, dtype=np.int64)
    for c in range(0, E, chunk):
        t = tgt_map[edges.target[c : c + chunk]]
        assert (t >= 0).all(), "an edge into an unselected feature was computed"
        np.multiply(t, n_new, out=t)
        t += src_map[edges.source[c : c + chunk]]
        key[c : c + chunk] = t
    # sum the edges that now share (target, remainder source)
    uniq, inv = np.unique(key, return_inverse=True)
    del key
    w = np.bincount(inv.reshape(-1), weights=edges.weight, minlength=uniq.size).astype(edges.weight.dtype)
    nz = w != 0
    constants = {int(tgt_map[r]): c for r, c in edges.constants.items()}
    return new_nodes, EdgeResult(uniq[nz] // len(new_nodes), uniq[nz] % len(new_nodes), w[nz], constants), old_to_new
