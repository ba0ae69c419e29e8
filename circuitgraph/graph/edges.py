"""The edge toolkit: the operations on a graph's edge arrays, each written once and vectorised.

Edges are parallel arrays ``target``, ``source``, ``weight`` over node rows ``[0, n)`` (rows =
targets, columns = sources).  Every module that merges, groups, orders or walks edges calls
these functions (the engine, ``max_feature_nodes``' fold, the graph's DAG, the queries, the
exports):

* :func:`merge_edges`: one edge per ``(target, source)`` pair, duplicates summed in float64;
* :func:`incoming_sums`: per node, the sum and the sum of ``|w|`` of its incoming edges;
* :func:`grouped`: the edge order that groups edges by a node column, with its ``indptr``
  (CSR by target, CSC by source);
* :func:`topological_levels`: Kahn's algorithm, one frontier at a time (cycles found);
* :func:`reachable`: the nodes reachable from a set of nodes along the edges;
* :func:`cumulative_share`: circuit-tracer's cumulative influence (the share of the total held
  by the values ranked at or above each one).

>>> t, s, w, inv = merge_edges(np.array([1, 1, 2]), np.array([0, 0, 1]), np.array([0.5, 0.25, 1.0]), 3)
>>> t.tolist(), s.tolist(), w.tolist(), inv.tolist()
([1, 2], [0, 1], [0.75, 1.0], [0, 0, 1])
"""

from __future__ import annotations

from typing import Literal, overload

import numpy as np

__all__ = ["merge_edges", "incoming_sums", "grouped", "topological_levels", "reachable", "cumulative_share",
           "CHUNK"]

#: edges per chunk of the chunked passes (bounded temporaries whatever the graph's size)
CHUNK = 1 << 22


@overload
def merge_edges(target: np.ndarray, source: np.ndarray, weight: np.ndarray, n: int, *,
                drop_zeros: Literal[False] = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...


@overload
def merge_edges(target: np.ndarray, source: np.ndarray, weight: np.ndarray, n: int, *,
                drop_zeros: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]: ...


def merge_edges(target: np.ndarray, source: np.ndarray, weight: np.ndarray, n: int, *,
                drop_zeros: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """``(target, source, weight, inverse)``: one edge per ``(target, source)`` pair, ordered by
    ``(target, source)``, its weight the float64 sum of the pair's weights; ``inverse[i]`` is the
    merged edge that edge ``i`` went to.  ``drop_zeros``: merged edges of weight exactly 0 are
    left out (``inverse`` is then None)."""
    key = np.asarray(target).astype(np.int64) * np.int64(n) + np.asarray(source).astype(np.int64)
    uniq, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    summed = np.bincount(inverse, weights=np.asarray(weight, dtype=np.float64), minlength=uniq.size)
    if drop_zeros:
        nz = summed != 0
        uniq, summed = uniq[nz], summed[nz]
        return uniq // n, uniq % n, summed, None
    return uniq // n, uniq % n, summed, inverse


def incoming_sums(target: np.ndarray, weight: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the sum and the sum of absolute values of its incoming edge weights (float64),
    in one chunked pass."""
    s = np.zeros(n)
    a = np.zeros(n)
    for c in range(0, target.shape[0], CHUNK):
        t = target[c : c + CHUNK]
        w = weight[c : c + CHUNK].astype(np.float64)
        s += np.bincount(t, weights=w, minlength=n)
        np.abs(w, out=w)
        a += np.bincount(t, weights=w, minlength=n)
    return s, a


def grouped(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, indptr)``: ``order`` sorts the edges stably by ``keys`` (node indices in
    ``[0, n)``), and the edges of node ``i`` are ``order[indptr[i]:indptr[i + 1]]``.

    >>> order, indptr = grouped(np.array([2, 0, 2]), 3)
    >>> order.tolist(), indptr.tolist()
    ([1, 0, 2], [0, 1, 1, 3])
    """
    keys = np.asarray(keys)
    order = np.argsort(keys, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=indptr[1:])
    return order, indptr


def _out_neighbours(frontier: np.ndarray, order: np.ndarray, indptr: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The ends of every edge leaving ``frontier`` (with repeats), by one gather."""
    starts, ends = indptr[frontier], indptr[frontier + 1]
    lens = ends - starts
    total = int(lens.sum())
    if not total:
        return dst[:0]
    offs = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(total)
    return dst[order[offs]]


def topological_levels(n: int, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Kahn's algorithm along the edges ``source -> target``, a whole frontier at a time: per
    node, the round in which it is reached (0 for nodes without incoming edges, then one more
    than the latest of its predecessors); ``-1`` for the nodes on a cycle or after one.

    >>> topological_levels(4, np.array([0, 1, 0]), np.array([1, 2, 2])).tolist()
    [0, 1, 2, 0]
    """
    source, target = np.asarray(source), np.asarray(target)
    order, indptr = grouped(source, n)
    indeg = np.bincount(target, minlength=n).astype(np.int64)
    level = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    d = 0
    while frontier.size:
        level[frontier] = d
        ends = _out_neighbours(frontier, order, indptr, target)
        if not ends.size:
            break
        indeg -= np.bincount(ends, minlength=n)
        cand = np.unique(ends)
        frontier = cand[(indeg[cand] == 0) & (level[cand] < 0)]
        d += 1
    return level


def reachable(n: int, source: np.ndarray, target: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Boolean per node: reachable from a node of ``start`` (a boolean mask, included) along the
    edges ``source -> target`` (swap the arrays to walk them backwards).

    >>> reachable(4, np.array([0, 1]), np.array([1, 2]), np.array([True, False, False, False])).tolist()
    [True, True, True, False]
    """
    source, target = np.asarray(source), np.asarray(target)
    order, indptr = grouped(source, n)
    seen = np.asarray(start, dtype=bool).copy()
    frontier = np.flatnonzero(seen)
    while frontier.size:
        ends = np.unique(_out_neighbours(frontier, order, indptr, target))
        frontier = ends[~seen[ends]]
        seen[frontier] = True
    return seen


def cumulative_share(values: np.ndarray) -> np.ndarray:
    """Per entry: the share of the total held by the entries ranked at or above it (largest
    first, ties by position): circuit-tracer's ``cumulative_scores`` of node influence.  All
    zeros when the total is not positive.

    >>> cumulative_share(np.array([1.0, 3.0, 0.0])).tolist()
    [1.0, 0.75, 1.0]
    """
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(-values, kind="stable")
    total = values.sum()
    cum = np.cumsum(values[order]) / total if total > 0 else np.zeros(values.size)
    out = np.empty_like(values)
    out[order] = cum
    return out
