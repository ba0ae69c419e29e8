"""Top-k paths against brute-force enumeration, constraints, beam search, and the exact
split of edges over attention heads (per head and per source position)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import circuitgraph.queries.paths as paths_mod
from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.queries import head_split, path_contribution, top_paths, total_effects
from circuitgraph.queries.filters import filter_mask
from circuitgraph.queries.head_split import parts_sum_check
from tests.helpers.graphs import ARCHS, all_paths, attributed, brute_value, chain_graph, random_dag, rows_of


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rank", ["exact", "normalized"])
def test_exact_kbest_equals_brute_force(seed, rank):
    g = random_dag(seed, n_layers=3, n_pos=3)
    sources = [i for i, n in enumerate(g.nodes) if n.kind in ("embedding", "error")]
    targets = {g.index_of(t) for t in g.target_ids}
    brute = all_paths(g, sources, targets)
    scored = sorted(brute, key=lambda r: -abs(brute_value(g, r, rank)))
    res = top_paths(g, {"kind": ["embedding", "error"]}, k=8, rank=rank, method="exact")
    assert res.method == "exact"
    assert rows_of(g, res) == scored[:8]
    for p, rows in zip(res.paths, scored, strict=False):
        assert p.contribution == pytest.approx(brute_value(g, rows, "exact"), rel=1e-12)
        assert p.normalized_weight == pytest.approx(brute_value(g, rows, "normalized"), rel=1e-12)
        assert p.share == pytest.approx(p.contribution / g.node(p.nodes[-1]).pre_activation)
        assert p.contribution == pytest.approx(path_contribution(g, p.nodes), rel=1e-12)


def test_chain_paths_by_hand():
    g = chain_graph()
    res = top_paths(g, {"kind": "embedding"}, k=5)
    # e -> f -> T: 2 * 3 / 4 = 1.5; e -> T: 1
    assert [len(p.nodes) for p in res.paths] == [3, 2]
    assert [p.contribution for p in res.paths] == [1.5, 1.0]
    assert res.paths[0].share == pytest.approx(1.5 / 4.5)
    assert res.paths[0].normalized_weight == pytest.approx(1.0 * 0.75)


@pytest.mark.parametrize("seed", range(2))
def test_all_paths_sum_to_total_effect(seed):
    g = random_dag(seed, n_layers=3, n_pos=2, n_targets=1)
    te = total_effects(g)[0]
    t = g.index_of(g.target_ids[0])
    for s, node in enumerate(g.nodes):
        if node.kind != "embedding":
            continue
        found = all_paths(g, [s], {t})
        res = top_paths(g, {"id": str(node.id)}, k=max(1, len(found)), method="exact")
        assert len(res.paths) == len(found)
        assert sum(p.contribution for p in res.paths) == pytest.approx(te[s], rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_constraints_equal_brute_force(seed):
    g = random_dag(seed, n_layers=4, n_pos=3)
    through = [{"kind": "feature", "layer": 1}, {"position": 2}]
    avoid = [{"kind": "feature", "layer": 2, "index": 0}]
    tmasks = [filter_mask(g, f) for f in through]
    amask = filter_mask(g, avoid[0])
    sources = [i for i, n in enumerate(g.nodes) if n.kind == "embedding"]
    targets = {g.index_of(t) for t in g.target_ids}
    for max_length in (None, 3):
        brute = all_paths(g, sources, targets, through=tmasks, avoid=amask, max_length=max_length)
        scored = sorted(brute, key=lambda r: -abs(brute_value(g, r, "exact")))
        res = top_paths(g, {"kind": "embedding"}, k=6, through=through, avoid=avoid, max_length=max_length,
                        method="exact")
        assert rows_of(g, res) == scored[:6]
        assert all(p.length <= (max_length or 99) for p in res.paths)


def test_beam_with_a_wide_beam_is_exact_and_says_so(monkeypatch):
    g = random_dag(1, n_layers=3, n_pos=3)
    exact = top_paths(g, {"kind": "embedding"}, k=5, method="exact")
    beam = top_paths(g, {"kind": "embedding"}, k=5, method="beam", beam_width=10_000)
    assert beam.method == "beam" and beam.beam_width == 10_000
    assert [p.nodes for p in beam.paths] == [p.nodes for p in exact.paths]
    monkeypatch.setattr(paths_mod, "EXACT_BUDGET", 0)
    assert top_paths(g, {"kind": "embedding"}, k=5).method == "beam"
    monkeypatch.setattr(paths_mod, "EXACT_BUDGET", 10**9)
    assert top_paths(g, {"kind": "embedding"}, k=5).method == "exact"
    # a narrow beam still returns valid paths with exact contributions
    narrow = top_paths(g, {"kind": "embedding"}, k=3, method="beam", beam_width=2)
    for p in narrow.paths:
        assert p.contribution == pytest.approx(path_contribution(g, p.nodes))


def test_paths_between_filters_on_attributed_graph():
    g = attributed("ln-gelu", "transcoders")
    res = top_paths(g, {"kind": "embedding"}, {"kind": "feature", "layer": 1}, k=5)
    assert res.paths and all(p.nodes[-1].kind == "feature" and p.nodes[-1].layer == 1 for p in res.paths)
    beam = top_paths(g, {"kind": "embedding"}, {"kind": "feature", "layer": 1}, k=5, method="beam",
                     beam_width=10_000)
    assert [p.nodes for p in beam.paths] == [p.nodes for p in res.paths]
    json.dumps(res.to_dict())
    assert "method exact" in res.table()


@pytest.mark.parametrize("bad,match", [
    (dict(k=0), "k must be a positive integer, got 0"),
    (dict(k=-2), "k must be a positive integer, got -2"),
    (dict(beam_width=0), "beam_width must be a positive integer, got 0"),
    (dict(max_length=0), "max_length must be a positive integer, got 0"),
    (dict(rank="best"), "rank must be one of 'exact', 'normalized', 'flow', got 'best'"),
    (dict(through=[{"kind": "neuron"}]), r"top_paths through\[0\] \{kind: neuron\} matches no node"),
    (dict(avoid=[{"layer": 7}]), r"top_paths avoid\[0\] \{layer: 7\} matches no node"),
    (dict(target={"id": "feature/0/0/99"}), "feature/0/0/99 is not in the graph"),
])
def test_paths_bad_input(bad, match):
    with pytest.raises(QueryError, match=match):
        top_paths(random_dag(0), bad.pop("source", {"kind": "embedding"}), **bad)


def test_paths_source_matching_nothing():
    with pytest.raises(QueryError, match=r"top_paths source \{kind: attention_head\} matches no node"):
        top_paths(random_dag(0), {"kind": "attention_head"})


# ------------------------------------------------------------------ head split
def _strongest_edges(g: AttributionGraph, n: int):
    order = np.argsort(-np.abs(g.edge_weight))
    return [(g.nodes[g.edge_source[i]].id, g.nodes[g.edge_target[i]].id) for i in order[:n]]


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("granularity", ["neurons", "transcoders", "heads"])
def test_head_split_sums_to_edge(arch, granularity):
    g = attributed(arch, granularity)
    edges = _strongest_edges(g, 8)
    # and edges that must cross positions (through attention only)
    edges += [(g.nodes[s].id, g.nodes[t].id) for s, t in zip(g.edge_source, g.edge_target, strict=False)
              if g.nodes[s].position < g.nodes[t].position][:4]
    for s, t in edges:
        by_head = head_split(g, s, t)
        by_pos = head_split(g, s, t, by_position=True)
        assert parts_sum_check(by_head) < 1e-12, by_head.table()
        assert parts_sum_check(by_pos) < 1e-12, by_pos.table()
        for key, value in by_head.by_head().items():
            assert by_pos.by_head().get(key, 0.0) == pytest.approx(value, rel=1e-9, abs=1e-12)
        if s.position != t.position:
            assert by_head.by_head()["residual"] == 0.0
        if granularity == "heads":  # layer 1's heads are nodes: nothing passes through them
            assert all(p.layer != 1 for p in by_pos.parts)
        assert all(p.source_position is None or s.position <= p.source_position <= t.position
                   for p in by_pos.parts)


def test_head_split_result_and_errors():
    g = attributed("ln-gelu", "neurons")
    s, t = _strongest_edges(g, 1)[0]
    res = head_split(g, str(s), str(t))
    json.dumps(res.to_dict())
    assert res.to_dict()["sum_of_parts"] == pytest.approx(res.edge_weight)
    assert "split by last head" in res.table()
    with pytest.raises(QueryError, match="is not a writer"):
        head_split(g, g.target_ids[0], t)
    late = max((n for n in g.nodes if n.kind == "embedding"), key=lambda n: n.position).id
    early_reader = next(n.id for n in g.nodes if n.kind == "neuron" and n.position < late.position)
    with pytest.raises(QueryError, match="cannot reach"):
        head_split(g, late, early_reader)
    with pytest.raises(QueryError, match="not in the graph"):
        head_split(g, "feature/0/1/999", t)
    g2 = AttributionGraph(g.nodes, g.edge_target, g.edge_source, g.edge_weight, targets=g.targets)
    with pytest.raises(QueryError, match="needs the live model: run the spec, not a loaded JSON"):
        head_split(g2, s, t)


def test_expand_heads_is_exact():
    g = attributed("rms-gated", "neurons")
    res = top_paths(g, {"kind": "embedding"}, k=4, expand_heads=True)
    for p in res.paths:
        assert p.edge_parts is not None and len(p.edge_parts) == len(p.nodes) - 1
        for parts, w in zip(p.edge_parts, p.edge_weights, strict=False):
            assert sum(x.value for x in parts) == pytest.approx(w, rel=1e-10, abs=1e-13)
        # each head-resolved version = contribution * prod(part / edge)
        labels = [{x.label: x.value for x in parts} for parts in p.edge_parts]
        for h in p.head_resolved:
            frac = np.prod([lab[v] / w for lab, v, w in zip(labels, h.via, p.edge_weights, strict=False)])
            assert h.contribution == pytest.approx(p.contribution * frac, rel=1e-10)
        assert abs(p.head_resolved[0].contribution) >= abs(p.head_resolved[-1].contribution)
    json.dumps(res.to_dict())


def test_head_split_and_expansion_on_a_pruned_graph():
    g = attributed("ln-gelu", "transcoders")
    from circuitgraph.queries import prune_graph

    pruned = prune_graph(g, 0.7, 0.9).graph
    s, t = _strongest_edges(pruned, 1)[0]
    if s.kind == "remainder":
        s, t = next((a, b) for a, b in _strongest_edges(pruned, 50) if a.kind != "remainder")
    assert head_split(pruned, s, t).by_head() == pytest.approx(head_split(g, s, t).by_head())
    res = top_paths(pruned, {"kind": ["embedding", "remainder"]}, k=6, expand_heads=True)
    for p in res.paths:
        for parts, w in zip(p.edge_parts, p.edge_weights, strict=False):
            assert sum(x.value for x in parts) == pytest.approx(w, rel=1e-10, abs=1e-13)
    assert any(x.label == "unsplit" for p in res.paths for parts in p.edge_parts for x in parts)
