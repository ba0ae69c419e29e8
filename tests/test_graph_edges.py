"""The edge toolkit (circuitgraph/graph/edges.py) against plain-Python reference implementations
on random edge lists, and the modules that used to carry their own copies calling it."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from circuitgraph.graph.edges import (
    cumulative_share,
    grouped,
    incoming_sums,
    merge_edges,
    reachable,
    topological_levels,
)

PACKAGE = Path(__file__).resolve().parents[1] / "circuitgraph"


def _random_edges(seed: int, n: int = 30, m: int = 120, acyclic: bool = True):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, n, m)
    t = rng.integers(0, n, m)
    if acyclic:  # edges from lower to higher rows only
        s, t = np.minimum(s, t), np.maximum(s, t)
        keep = s != t
        s, t = s[keep], t[keep]
    w = rng.normal(size=s.size)
    w[rng.random(s.size) < 0.1] = 0.0
    return n, t, s, w


@pytest.mark.parametrize("seed", range(4))
def test_merge_edges_sums_each_pair_once(seed):
    n, t, s, w = _random_edges(seed)
    t, s, w = np.concatenate([t, t[:20]]), np.concatenate([s, s[:20]]), np.concatenate([w, -w[:10], w[10:20]])
    ref: dict[tuple[int, int], float] = {}
    for a, b, x in zip(t.tolist(), s.tolist(), w.tolist(), strict=False):
        ref[(a, b)] = ref.get((a, b), 0.0) + x
    mt, ms, mw, inv = merge_edges(t, s, w, n)
    assert list(zip(mt.tolist(), ms.tolist(), strict=False)) == sorted(ref)
    np.testing.assert_allclose(mw, [ref[k] for k in sorted(ref)], rtol=1e-14, atol=1e-15)
    assert (mt[inv] == t).all() and (ms[inv] == s).all()
    zt, zs, zw, zinv = merge_edges(t, s, w, n, drop_zeros=True)
    assert zinv is None and (zw != 0).all()
    assert set(zip(zt.tolist(), zs.tolist(), strict=False)) == {k for k, v in ref.items() if v != 0}


def test_incoming_sums_and_grouping():
    n, t, s, w = _random_edges(7)
    sums, abs_sums = incoming_sums(t, w, n)
    for r in range(n):
        assert sums[r] == pytest.approx(w[t == r].sum(), abs=1e-12)
        assert abs_sums[r] == pytest.approx(np.abs(w[t == r]).sum(), abs=1e-12)
    order, indptr = grouped(t, n)
    for r in range(n):
        assert sorted(order[indptr[r]:indptr[r + 1]].tolist()) == np.flatnonzero(t == r).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_topological_levels_order_every_edge_and_find_cycles(seed):
    n, t, s, _ = _random_edges(seed)
    level = topological_levels(n, s, t)
    assert (level >= 0).all() and (level[s] < level[t]).all()
    # longest path from a node without inputs, by dynamic programming in row order (edges go up)
    ref = np.zeros(n, dtype=np.int64)
    for v in range(n):
        preds = s[t == v]
        ref[v] = 0 if preds.size == 0 else ref[preds].max() + 1
    np.testing.assert_array_equal(level, ref)
    s2, t2 = np.append(s, t[0]), np.append(t, s[0])  # one edge back: a cycle
    assert (topological_levels(n, s2, t2) < 0).any()


@pytest.mark.parametrize("seed", range(4))
def test_reachable_equals_breadth_first_search(seed):
    n, t, s, _ = _random_edges(seed, acyclic=seed % 2 == 0)
    start = np.zeros(n, dtype=bool)
    start[[0, 3]] = True
    seen = set(np.flatnonzero(start).tolist())
    queue = deque(seen)
    while queue:
        u = queue.popleft()
        for v in t[s == u].tolist():
            if v not in seen:
                seen.add(v)
                queue.append(v)
    assert set(np.flatnonzero(reachable(n, s, t, start)).tolist()) == seen


def test_cumulative_share_by_hand():
    v = np.array([0.1, 0.5, 0.0, 0.4])
    np.testing.assert_allclose(cumulative_share(v), [1.0, 0.5, 1.0, 0.9])
    assert (cumulative_share(np.zeros(3)) == 0).all()


def test_the_old_copies_call_the_toolkit():
    """No module outside the toolkit merges edges with np.unique over (target, source) keys, walks
    edges to a fixed point or ranks influence by its own cumulative sum."""
    allowed = {"circuitgraph/graph/edges.py"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in (
                    "_coalesce_edges", "_reachable", "_cumulative_scores", "_kahn_order"):
                offenders.append(f"{rel}: {node.name}")
        text = path.read_text()
        if "np.cumsum(influence[order])" in text or "return_inverse=True)\n    summed = np.bincount" in text:
            offenders.append(rel)
    assert not offenders, offenders
