"""top_paths beyond the shortest paths (issue 31, item 4): ``min_length`` and ``rank="flow"`` (the
widest path by the target share each edge carries), against brute-force enumeration of every path of
small DAGs with an independent dense computation of ``d pre_T / d pre``; the vectorised exact search
against brute force on a deeper graph."""

from __future__ import annotations

import numpy as np
import pytest

from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.queries import top_paths
from circuitgraph.queries.filters import filter_mask
from tests.helpers.graphs import all_paths, brute_value, random_dag, rows_of


def dense_gradients(g: AttributionGraph, target: int) -> np.ndarray:
    """``y[v] = d pre_T / d pre_v`` of the linear model, from the dense matrix: ``y = e_T (I - B)^-1``
    with ``B[r, u] = E[r, u] / pre_u`` (a reader passes a change of its input on with that gain)."""
    E = g.dense_adjacency()
    d = np.array([n.pre_activation if n.pre_activation is not None else n.activation for n in g.nodes])
    B = E * np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0)[None, :]
    e = np.zeros(g.n_nodes)
    e[target] = 1.0
    return e @ np.linalg.inv(np.eye(g.n_nodes) - B)


def bottleneck_share(g: AttributionGraph, rows: list[int]) -> float:
    """The smallest ``|E[v, u] y_T[v]|`` over the path's edges, over ``|pre_T|``."""
    E = g.dense_adjacency()
    y = dense_gradients(g, rows[-1])
    flows = [abs(E[v, u] * y[v]) for u, v in zip(rows[:-1], rows[1:], strict=False)]
    return min(flows) / abs(g.nodes[rows[-1]].pre_activation)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("min_length", [2, 3])
def test_min_length_equals_brute_force(seed, min_length):
    g = random_dag(seed, n_layers=4, n_pos=3)
    sources = [i for i, n in enumerate(g.nodes) if n.kind == "embedding"]
    targets = {g.index_of(t) for t in g.target_ids}
    through = [{"kind": "feature", "layer": [1, 2]}]
    tmask = filter_mask(g, through[0])
    for kw, brute in [
        ({}, all_paths(g, sources, targets)),
        ({"through": through}, all_paths(g, sources, targets, through=[tmask])),
        ({"max_length": 4}, all_paths(g, sources, targets, max_length=4)),
    ]:
        brute = [r for r in brute if len(r) - 1 >= min_length]
        scored = sorted(brute, key=lambda r: -abs(brute_value(g, r, "exact")))
        res = top_paths(g, {"kind": "embedding"}, k=7, min_length=min_length, method="exact", **kw)
        assert rows_of(g, res) == scored[:7], kw
        assert all(p.length >= min_length for p in res.paths)
        assert res.min_length == min_length and res.to_dict()["min_length"] == min_length


@pytest.mark.parametrize("seed", range(4))
def test_flow_rank_equals_brute_force(seed):
    g = random_dag(seed, n_layers=3, n_pos=3)
    sources = [i for i, n in enumerate(g.nodes) if n.kind in ("embedding", "error")]
    targets = {g.index_of(t) for t in g.target_ids}
    brute = all_paths(g, sources, targets)
    values = sorted((bottleneck_share(g, r) for r in brute), reverse=True)
    res = top_paths(g, {"kind": ["embedding", "error"]}, k=8, rank="flow")
    assert res.rank == "flow" and res.method == "exact"
    got = [abs(p.flow_share) for p in res.paths]
    # the k largest bottlenecks (paths sharing their weakest edge tie: compared as values)
    assert got == pytest.approx(values[:8], rel=1e-9)
    for p in res.paths:
        rows = [g.index_of(n) for n in p.nodes]
        assert abs(p.flow_share) == pytest.approx(bottleneck_share(g, rows), rel=1e-9)
        assert p.contribution == pytest.approx(brute_value(g, rows, "exact"), rel=1e-12)
    # equal bottlenecks: the larger contribution first
    for a, b in zip(res.paths, res.paths[1:], strict=False):
        if abs(a.flow_share) == pytest.approx(abs(b.flow_share), rel=1e-12):
            assert abs(a.contribution) >= abs(b.contribution)
    assert "weakest edge's share" in res.table() and "flow_share" in res.to_dict()["paths"][0]


def test_a_flow_is_the_share_carried_by_every_path_through_the_edge():
    """The definition: the flow of u -> v is the sum of the exact contributions of all paths
    through it, counting u's whole pre-activation (for a source u: every path that starts with it)."""
    g = random_dag(5, n_layers=3, n_pos=2, n_targets=1)
    t = g.index_of(g.target_ids[0])
    E = g.dense_adjacency()
    y = dense_gradients(g, t)
    for s, node in enumerate(g.nodes):
        if node.kind != "embedding":
            continue
        for v in np.flatnonzero(E[:, s]).tolist():
            through_edge = [r for r in all_paths(g, [s], {t}) if len(r) > 1 and r[1] == v]
            assert sum(brute_value(g, r, "exact") for r in through_edge) == pytest.approx(E[v, s] * y[v], abs=1e-10)


@pytest.mark.parametrize("rank", ["exact", "normalized"])
def test_the_vectorised_search_equals_brute_force_on_a_deeper_graph(rank):
    g = random_dag(7, n_layers=6, n_pos=2, feats_per_site=2, density=0.6)
    sources = [i for i, n in enumerate(g.nodes) if n.kind == "embedding"]
    targets = {g.index_of(t) for t in g.target_ids}
    brute = all_paths(g, sources, targets)
    assert len(brute) > 500
    scored = sorted(brute, key=lambda r: -abs(brute_value(g, r, rank)))
    res = top_paths(g, {"kind": "embedding"}, k=25, rank=rank, method="exact")
    assert rows_of(g, res) == scored[:25]


def test_min_length_above_max_length_is_refused():
    g = random_dag(0)
    with pytest.raises(QueryError, match="min_length 4 is above max_length 2"):
        top_paths(g, {"kind": "embedding"}, min_length=4, max_length=2)
    with pytest.raises(QueryError, match="min_length must be a positive integer"):
        top_paths(g, {"kind": "embedding"}, min_length=0)
