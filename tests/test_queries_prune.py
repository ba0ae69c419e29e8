"""Pruning: circuit-tracer's kept node and edge sets on the same adjacency, exact completeness
on the pruned graph through remainder nodes, top-k caps, target share, bad thresholds."""

from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np
import pytest

from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import REMAINDER_INDEX, Node, NodeId
from circuitgraph.queries import compute_scores, find_threshold, node_influence, prune_graph
from tests.helpers.graphs import ARCHS, attributed, load_ct_graph, random_dag
from tests.helpers.peers import CT_CASES, circuit_tracer_or_skip


def test_find_threshold_by_hand():
    s = np.array([1.0, 4.0, 2.0, 3.0, 0.0])
    # sorted 4 3 2 1 0, cumulative .4 .7 .9 1 1
    assert find_threshold(s, 0.5) == 3.0
    assert find_threshold(s, 0.7) == 3.0
    assert find_threshold(s, 0.71) == 2.0
    assert find_threshold(s, 1.0) == 1.0
    assert find_threshold(np.zeros(3), 0.5) == float("inf")


# ------------------------------------------------------------------ circuit-tracer's own outputs
@pytest.mark.parametrize("name", CT_CASES)
def test_same_kept_sets_as_circuit_tracer_on_its_graphs(circuit_tracer_graphs, name):
    g, ct = load_ct_graph(circuit_tracer_graphs, name)
    ref = ct.prune
    res = prune_graph(g)  # defaults 0.8 / 0.98, as run_ct.py used
    np.testing.assert_array_equal(res.node_mask, ref["node_mask"])
    ref_edges = {tuple(x) for x in ref["edge_mask_indices"].tolist()}
    ours = {(int(t), int(s)) for t, s in zip(g.edge_target[res.edge_mask], g.edge_source[res.edge_mask], strict=False)}
    assert ours == ref_edges
    np.testing.assert_allclose(res.cumulative_scores, ref["cumulative_scores"], atol=1e-5)


# ------------------------------------------------------------------ circuit-tracer's code, random graphs
def ct_layout_graph(seed: int, n_layers: int = 3, n_pos: int = 5, n_features: int = 30, n_logits: int = 3
                    ) -> AttributionGraph:
    """A random graph in circuit-tracer's node order (features, errors, tokens, logits), float32,
    with pre-activations that satisfy completeness."""
    rng = np.random.default_rng(seed)
    feats = sorted((int(rng.integers(n_layers)), int(rng.integers(n_pos)), i) for i in range(n_features))
    nodes = [Node(NodeId("feature", lyr, p, i), 1.0) for lyr, p, i in feats]
    nodes += [Node(NodeId("error", lyr, p, 0), 1.0) for lyr in range(n_layers) for p in range(n_pos)]
    nodes += [Node(NodeId("embedding", -1, p, 100 + p), 1.0) for p in range(n_pos)]
    nodes += [Node(NodeId("logit", n_layers, n_pos - 1, 200 + j), 0.0) for j in range(n_logits)]
    t_list, s_list = [], []
    for r, node in enumerate(nodes):
        if node.kind not in ("feature", "logit"):
            continue
        for s, src in enumerate(nodes):
            earlier = src.kind == "embedding" or (src.kind in ("feature", "error") and src.layer < node.layer)
            if earlier and src.position <= node.position and rng.random() < 0.35:
                t_list.append(r)
                s_list.append(s)
    w = (rng.standard_normal(len(t_list)) * rng.exponential(1.0, len(t_list))).astype(np.float32)
    sums = np.zeros(len(nodes))
    np.add.at(sums, t_list, w.astype(np.float64))
    for r, node in enumerate(nodes):
        if node.kind in ("feature", "logit"):
            node.pre_activation, node.constant = float(sums[r]) + 0.1, 0.1
            node.activation = node.pre_activation
    probs = rng.dirichlet(np.ones(n_logits)).astype(np.float32)
    return AttributionGraph(nodes, t_list, s_list, w, targets=[(nodes[-n_logits + j].id, float(p))
                                                               for j, p in enumerate(probs)])


CT_SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys, types
    from types import SimpleNamespace
    import numpy as np, torch
    data, out = sys.argv[1:3]
    site = importlib.util.find_spec("circuit_tracer").submodule_search_locations[0]
    # circuit_tracer/graph.py imports three helpers its pruning and scores do not use; stub
    # them so that only its own maths (torch only) is loaded, not the whole package
    stubs = {
        "circuit_tracer": {}, "circuit_tracer.attribution": {},
        "circuit_tracer.attribution.targets": {"LogitTarget": object},
        "circuit_tracer.utils": {"get_default_device": lambda: "cpu"},
        "circuit_tracer.utils.tl_nnsight_mapping": {
            "UnifiedConfig": object, "convert_nnsight_config_to_transformerlens": lambda c: c},
    }
    for name, attrs in stubs.items():
        mod = types.ModuleType(name); mod.__dict__.update(attrs); sys.modules[name] = mod
    spec = importlib.util.spec_from_file_location("ct_graph", site + "/graph.py")
    ct = importlib.util.module_from_spec(spec); spec.loader.exec_module(ct)
    z = np.load(data)
    res = {}
    for i in range(int(z["n"])):
        g = SimpleNamespace(
            adjacency_matrix=torch.from_numpy(z[f"adj{i}"]), input_tokens=torch.zeros(int(z[f"n_pos{i}"])),
            logit_targets=[None] * int(z[f"n_logits{i}"]), selected_features=torch.zeros(int(z[f"n_features{i}"])),
            logit_probabilities=torch.from_numpy(z[f"probs{i}"]), cfg=SimpleNamespace(n_layers=int(z[f"n_layers{i}"])))
        nt, et = (float(x) for x in z[f"thresholds{i}"])
        p = ct.prune_graph(g, nt, et)
        rep, comp = ct.compute_graph_scores(g)
        res[f"node{i}"] = p.node_mask.numpy(); res[f"edge{i}"] = p.edge_mask.numpy()
        res[f"scores{i}"] = np.array([rep, comp])
    np.savez(out, **res)
    """
)


def test_same_kept_sets_as_circuit_tracers_code_on_random_graphs(tmp_path):
    """circuit-tracer's prune_graph and compute_graph_scores (its file, run in its virtualenv)
    on random graphs in its layout, at several thresholds."""
    from circuitgraph.testing.circuit_tracer import circuit_tracer_python

    circuit_tracer_or_skip()
    cases = [(seed, nt, et) for seed, (nt, et) in enumerate([(0.8, 0.98), (0.5, 0.9), (0.95, 0.7), (0.3, 0.99)])]
    graphs, data = [], {"n": np.array(len(cases))}
    for i, (seed, nt, et) in enumerate(cases):
        g = ct_layout_graph(seed)
        graphs.append(g)
        data.update({f"adj{i}": g.dense_adjacency(dtype=np.float32), f"n_pos{i}": np.array(5),
                     f"n_logits{i}": np.array(3), f"n_features{i}": np.array(30), f"n_layers{i}": np.array(3),
                     f"probs{i}": np.array([w for _, w in g.targets], dtype=np.float32),
                     f"thresholds{i}": np.array([nt, et])})
    np.savez(tmp_path / "in.npz", **data)
    python = str(circuit_tracer_python())
    script = tmp_path / "ct_prune.py"
    script.write_text(CT_SCRIPT)
    subprocess.run([python, str(script), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                   check=True, capture_output=True, timeout=120)
    ref = np.load(tmp_path / "out.npz")
    for i, (g, (_, nt, et)) in enumerate(zip(graphs, cases, strict=False)):
        res = prune_graph(g, nt, et)
        np.testing.assert_array_equal(res.node_mask, ref[f"node{i}"], err_msg=f"case {i}")
        em = np.zeros_like(ref[f"edge{i}"])
        em[g.edge_target[res.edge_mask], g.edge_source[res.edge_mask]] = True
        np.testing.assert_array_equal(em, ref[f"edge{i}"], err_msg=f"case {i}")
        s = compute_scores(g)
        np.testing.assert_allclose([s.replacement_score, s.completeness_score], ref[f"scores{i}"], atol=1e-6)
        assert res.graph.check_completeness().max_violation < 1e-6


# ------------------------------------------------------------------ remainders keep completeness
def _check_remainders(g: AttributionGraph, res) -> None:
    pruned = res.graph
    assert pruned.check_completeness().max_violation < 1e-12
    for node in pruned.nodes:
        if node.kind == "remainder" and node.index == REMAINDER_INDEX["pruned"]:
            assert node.id in res.remainder_nodes
            assert not pruned.in_edges(node.id)
    # every kept reader: kept edges + remainders == all original incoming edges
    orig, new = g.incoming_sums(), pruned.incoming_sums()
    for row, node in enumerate(pruned.nodes):
        if node.pre_activation is not None:
            assert new[row] == pytest.approx(orig[g.index_of(node.id)], rel=1e-12, abs=1e-12)
    assert res.graph.metadata["pruning"]["n_remainder_nodes"] == len(res.remainder_nodes)


@pytest.mark.parametrize("seed", range(3))
def test_pruned_hand_built_graph_is_complete(seed):
    g = random_dag(seed, n_layers=4, n_pos=4, feats_per_site=3)
    for kwargs in ({}, {"node_threshold": 0.5, "edge_threshold": 0.6}, {"top_k_nodes": 5, "top_k_edges": 10}):
        res = prune_graph(g, **kwargs)
        _check_remainders(g, res)
        assert res.graph.n_nodes < g.n_nodes


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("granularity", ["neurons", "transcoders", "heads"])
def test_pruned_attributed_graph_is_complete(arch, granularity):
    g = attributed(arch, granularity)
    res = prune_graph(g, 0.6, 0.9)
    _check_remainders(g, res)
    kept = set(res.kept_nodes)
    assert set(g.target_ids) <= kept and all(n.id in kept for n in g.nodes if n.kind == "embedding")
    # pruning a pruned graph keeps its remainders and stays complete
    again = prune_graph(res.graph, 0.6, 0.9)
    assert again.graph.check_completeness().max_violation < 1e-12


def test_remainder_per_source_layer_and_position():
    g = random_dag(2, n_layers=3, n_pos=3)
    res = prune_graph(g, 0.3, 0.5)
    dropped = {(n.layer, n.position) for n, keep in zip(g.nodes, res.node_mask, strict=False) if not keep}
    assert {(r.layer, r.position) for r in res.remainder_nodes} >= {
        (g.nodes[s].layer, g.nodes[s].position) for s, t, k in
        zip(g.edge_source, g.edge_target, res.edge_mask, strict=False) if not k and res.node_mask[t]}
    assert dropped  # something was pruned


def test_top_k_caps():
    g = random_dag(0, n_layers=4, n_pos=4, feats_per_site=3)
    always = sum(1 for n in g.nodes if n.kind == "embedding") + len(g.targets)
    res = prune_graph(g, 1.0, 1.0, top_k_nodes=4, top_k_edges=7)
    assert res.node_mask.sum() <= always + 4
    assert res.edge_mask.sum() <= 7
    # the kept non-forced nodes are among the 4 most influential
    infl = node_influence(g)
    forced = np.array([n.kind == "embedding" or n.id in g.target_ids for n in g.nodes])
    top4 = set(np.argsort(-np.where(forced, -np.inf, infl))[:4].tolist())
    assert set(np.flatnonzero(res.node_mask & ~forced).tolist()) <= top4


def test_target_share_keeps_smallest_set_per_target():
    g = random_dag(3, n_layers=3, n_pos=3, n_targets=2)
    res = prune_graph(g, edge_threshold=1.0, target_share=0.5)
    forced = np.array([n.kind == "embedding" or n.id in g.target_ids for n in g.nodes])
    # by hand: for each target alone, the largest-influence prefix reaching half of its total
    expected = np.zeros(g.n_nodes, dtype=bool)
    for t in g.target_ids:
        w = np.zeros(g.n_nodes)
        w[g.index_of(t)] = 1.0
        infl = node_influence(g, w)
        order = np.argsort(-infl)
        cum = np.cumsum(infl[order]) / infl.sum()
        expected[order[: int(np.searchsorted(cum, 0.5)) + 1]] = True
    # connectivity may drop some of them afterwards, never add any
    kept = res.node_mask & ~forced
    assert not (kept & ~expected).any()
    assert kept.any()


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, True, "0.8"])
@pytest.mark.parametrize("name", ["node_threshold", "edge_threshold", "target_share"])
def test_thresholds_outside_unit_interval(name, bad):
    with pytest.raises(QueryError, match=f"{name} must be in \\(0, 1\\], got {bad!r}"):
        prune_graph(random_dag(0), **{name: bad})


@pytest.mark.parametrize("name", ["top_k_nodes", "top_k_edges"])
def test_top_k_must_be_positive(name):
    with pytest.raises(QueryError, match=f"{name} must be a positive integer, got 0"):
        prune_graph(random_dag(0), **{name: 0})


def test_prune_result_serialises():
    res = prune_graph(random_dag(1))
    d = res.to_dict()
    json.dumps(d)
    assert d["n_nodes_kept"] == int(res.node_mask.sum())
    assert d["completeness"]["max_relative_violation"] < 1e-12
    assert "n_remainder_nodes" in res.table()


@pytest.mark.parametrize("seed", [0, 3])
def test_cumulative_scores_are_the_shares_of_the_nodes_ranked_at_or_above(seed):
    """circuit-tracer's cumulative_scores, recomputed by sorting by hand: the share of the total
    influence held by the nodes at least as influential as each node (the most influential
    node has the smallest score; the kept nodes are the ones with a score within node_threshold)."""
    g = random_dag(seed)
    res = prune_graph(g, node_threshold=0.8, edge_threshold=0.98)
    infl = np.asarray(res.node_influence, dtype=np.float64)
    total = infl.sum()
    assert total > 0
    expected = np.array([infl[infl >= v].sum() / total for v in infl])  # no ties in random weights
    np.testing.assert_allclose(res.cumulative_scores, expected, rtol=1e-12, atol=1e-15)
    best = int(np.argmax(infl))
    assert res.cumulative_scores[best] == pytest.approx(infl[best] / total)
    kept_scores = res.cumulative_scores[res.node_mask & (infl > 0)]
    assert kept_scores.min() < 0.8
