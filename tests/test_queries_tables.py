"""Neighbourhoods, supernodes, logit differences, DLA, logit lens, congruence, virtual weights
and de-embeddings: exact values on hand-built graphs, and weight-only quantities checked
against the prompt's own edges (edge = activation x virtual weight x frozen factors)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.queries import (
    children,
    congruence,
    de_embedding,
    direct_logit_attribution,
    head_split,
    logit_difference,
    logit_lens,
    neighbours,
    parents,
    subgraph,
    supernodes,
    total_effects,
    virtual_weights,
)
from tests.helpers.graphs import attributed, chain_graph, random_dag


# ------------------------------------------------------------------ neighbourhoods
def test_parents_children_by_hand():
    g = chain_graph()
    e, f, t = g.node_ids()
    assert [(n.node, n.weight) for n in parents(g, t)] == [(f, 3.0), (e, 1.0)]
    assert [n.share for n in parents(g, t)] == pytest.approx([3 / 4.5, 1 / 4.5])
    assert [(n.node, n.weight, n.share) for n in children(g, e)] == [(f, 2.0, 0.5), (t, 1.0, pytest.approx(1 / 4.5))]
    res = neighbours(g, "feature/0/0/7", direction="in", top_k=1)
    assert res.outgoing is None and [n.node for n in res.incoming] == [e] and res.n_outgoing == 1
    json.dumps(res.to_dict())
    assert "neighbours of feature/0/0/7" in res.table()


def test_neighbours_bad_input():
    g = chain_graph()
    with pytest.raises(QueryError, match="feature/0/0/8 is not in the graph"):
        neighbours(g, "feature/0/0/8")
    with pytest.raises(QueryError, match="not of the form kind/layer/position/index"):
        neighbours(g, "feature/0/0")
    with pytest.raises(QueryError, match="top_k must be a positive integer, got 0"):
        neighbours(g, "feature/0/0/7", top_k=0)
    with pytest.raises(QueryError, match="direction must be"):
        neighbours(g, "feature/0/0/7", direction="up")


def test_subgraph_by_filter():
    g = random_dag(0, n_layers=3, n_pos=3)
    res = subgraph(g, {"kind": "feature", "layer": [0, 1], "position": -1})
    assert all(n.kind == "feature" and n.layer <= 1 and n.position == 2 for n in res.graph.nodes)
    assert res.graph.n_nodes == 4
    kept = set(res.graph.node_ids())
    expected = sum(1 for s, t in zip(g.edge_source, g.edge_target, strict=False)
                   if g.nodes[s].id in kept and g.nodes[t].id in kept)
    assert res.graph.n_edges == expected
    d = res.to_dict()
    json.dumps(d)
    assert d["filter"] == "{kind: feature, layer: [0, 1], position: -1}"
    with pytest.raises(QueryError, match=r"subgraph filter \{kind: neuron\} matches no node of the graph"):
        subgraph(g, {"kind": "neuron"})
    with pytest.raises(QueryError, match="bad node filter"):
        subgraph(g, {"kind": "neuron", "colour": "red"})


def test_supernodes_by_hand():
    g = chain_graph()
    res = supernodes(g, {"E": {"kind": "embedding"}, "F": {"kind": "feature"}})
    assert res.weight("E", "F") == 2.0
    assert res.weight("F", "(other)") == 3.0
    assert res.weight("E", "(other)") == 1.0
    assert res.weight("F", "E") == 0.0
    assert res.members("F") == (g.node_ids()[1],)
    json.dumps(res.to_dict())
    with pytest.raises(QueryError, match="is in both supernodes 'A' and 'B'"):
        supernodes(g, {"A": {"layer": [-1, 0]}, "B": {"kind": "feature"}})
    with pytest.raises(QueryError, match="supernode 'X' .* matches no node"):
        supernodes(g, {"X": {"kind": "neuron"}})


def test_supernode_sums_equal_edge_sums():
    g = random_dag(1, n_layers=3, n_pos=3)
    res = supernodes(g, {f"L{lyr}": {"kind": "feature", "layer": lyr} for lyr in range(3)})
    assert sum(w for _, _, w, _ in res.edges) == pytest.approx(float(g.edge_weight.sum()))
    l0 = {str(n) for n in res.members("L0")}
    l1 = {str(n) for n in res.members("L1")}
    direct = sum(w for s, t, w in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False)
                 if str(g.nodes[s].id) in l0 and str(g.nodes[t].id) in l1)
    assert res.weight("L0", "L1") == pytest.approx(direct)


def test_logit_difference_node_is_exact():
    g = attributed("ln-gelu", "transcoders")
    a, b = g.target_ids[:2]
    new, nid = logit_difference(g, a, b)
    assert nid.kind == "target" and new.targets == [(nid, 1.0)]
    assert new.check_completeness().max_violation < 1e-12
    node = new.node(nid)
    assert node.pre_activation == pytest.approx(g.node(a).pre_activation - g.node(b).pre_activation)
    te_new = total_effects(new)[0][: g.n_nodes]
    te_ab = total_effects(g, [a, b])
    np.testing.assert_allclose(te_new, te_ab[0] - te_ab[1], atol=1e-12)
    kept_both, nid2 = logit_difference(g, a, b, as_only_target=False)
    assert len(kept_both.targets) == len(g.targets) + 1 and nid2 == nid
    with pytest.raises(QueryError, match="same node"):
        logit_difference(g, a, a)
    with pytest.raises(QueryError, match="not a logit or target"):
        logit_difference(g, a, next(n.id for n in g.nodes if n.kind == "feature"))


# ------------------------------------------------------------------ DLA
def test_dla_by_hand():
    g = chain_graph()
    res = direct_logit_attribution(g, 0)
    assert [(str(n), w) for n, w in res.rows] == [("feature/0/0/7", 3.0), ("embedding/-1/0/1", 1.0)]
    assert dict(res.by_kind) == {"embedding": 1.0, "feature": 3.0}
    assert sum(w for _, w in res.by_kind) + res.constant == res.pre_activation
    only = direct_logit_attribution(g, "logit/1/0/3", kinds=["embedding"])
    assert [str(n) for n, _ in only.rows] == ["embedding/-1/0/1"]
    json.dumps(res.to_dict())
    with pytest.raises(QueryError, match="target index 1 is out of range: the graph has 1 target"):
        direct_logit_attribution(g, 1)
    with pytest.raises(QueryError, match="unknown node kind"):
        direct_logit_attribution(g, 0, kinds=["head"])


def test_dla_adds_up_on_attributed_graph():
    g = attributed("rms-gated", "transcoders")
    for j in range(len(g.targets)):
        res = direct_logit_attribution(g, j, top_k=3)
        total = sum(w for _, w in res.by_kind) + res.constant
        assert total == pytest.approx(res.pre_activation, rel=1e-10)
        assert sum(w for _, _, w in res.by_kind_layer) == pytest.approx(sum(w for _, w in res.by_kind))
        assert len(res.to_dict()["top"]) == 3


# ------------------------------------------------------------------ logit lens
@pytest.mark.parametrize("arch", ["ln-gelu", "rms-gated"])
def test_logit_lens_last_row_is_the_models_logits(arch):
    g = attributed(arch, "neurons")
    lin = g.context.linearisation
    res = logit_lens(g, tokens=[3, 4], position=-1, top_k=3)
    assert res.position == lin.n_pos - 1
    last = res.rows[-1]
    logits = lin.logits[-1].double()
    assert [t[0] for t in last.top] == torch.topk(logits, 3).indices.tolist()
    for tok, _, value, prob, rank in last.tokens:
        assert value == pytest.approx(float(logits[tok]), rel=1e-9)
        assert prob == pytest.approx(float(torch.softmax(logits, -1)[tok]), rel=1e-9)
        assert rank == int((logits > logits[tok]).sum())
    assert [r.site for r in res.rows] == ["resid_pre 0", "resid_pre 1", "resid_post 1"]
    json.dumps(res.to_dict())
    with pytest.raises(QueryError, match="position 9 is out of range for a 7-token prompt"):
        logit_lens(g, position=9)


# ------------------------------------------------------------------ congruence
@pytest.mark.parametrize("mode", ["dot", "cosine", "input_scaled"])
def test_congruence_neurons_direct(mode):
    g = attributed("ln-gelu", "neurons")
    a = g.context.adapter
    res = congruence(g, [3, 4], kind="neuron", layer=1, mode=mode, top_k=5)
    u = a.W_U[:, 3].double() - a.W_U[:, 4].double()
    w = a.mlp_weights(1)
    W_out, W_in = w["W_out"].double(), w["W_in"].double()
    dot = W_out @ u
    expected = {"dot": dot, "cosine": dot / (W_out.norm(dim=-1) * u.norm()),
                "input_scaled": dot * W_in.norm(dim=0)}[mode]
    order = expected.abs().argsort(descending=True)[:5].tolist()
    assert [r[2] for r in res.rows] == order
    for _, layer, idx, score, d, in_graph in res.rows:
        assert layer == 1
        assert score == pytest.approx(float(expected[idx]), rel=1e-12)
        assert d == pytest.approx(float(dot[idx]), rel=1e-12)
        assert in_graph == any(n.kind == "neuron" and n.layer == 1 and n.index == idx for n in g.nodes)
    assert res.n_units == a.facts.d_mlp


def test_congruence_features_and_errors():
    g = attributed("rms-gated", "transcoders")
    tc = g.context.transcoders
    res = congruence(g, [5], kind="feature", mode="input_scaled", top_k=4)
    u = g.context.adapter.W_U[:, 5].double()
    for _, layer, idx, score, _, _ in res.rows:
        expected = float(tc[layer].W_dec[idx].double() @ u) * float(tc[layer].W_enc[:, idx].double().norm())
        assert score == pytest.approx(expected, rel=1e-12)
    assert res.n_units == sum(t.d_sae for t in tc.layers.values())
    with pytest.raises(QueryError, match="congruence layer 5 requested, the model has 2 layers"):
        congruence(g, [5], layer=5)
    with pytest.raises(QueryError, match="needs transcoders"):
        congruence(attributed("rms-gated", "neurons"), [5], kind="feature")
    with pytest.raises(QueryError, match="one token or two"):
        congruence(g, [1, 2, 3])


# ------------------------------------------------------------------ weight-only vs the prompt's edges
def _residual_part(g: AttributionGraph, s, t) -> float:
    return head_split(g, s, t).by_head()["residual"]


def test_virtual_weight_times_frozen_factors_is_the_residual_part_of_the_edge():
    g = attributed("ln-gelu", "transcoders")
    lin = g.context.linearisation
    res = virtual_weights(g, {"kind": "feature", "layer": 0}, {"kind": "feature", "layer": 1}, top_k=10_000)
    vw = {(str(s), str(t)): w for s, t, w in res.rows}
    checked = 0
    for s_row, t_row in zip(g.edge_source, g.edge_target, strict=False):
        s, t = g.nodes[s_row], g.nodes[t_row]
        if s.kind == t.kind == "feature" and s.layer == 0 and t.layer == 1 and s.position == t.position:
            sigma = float(lin.sigma[("ln2", 1)][t.position])
            expected = _residual_part(g, s.id, t.id) * sigma / s.activation
            assert vw[(f"feature/0/{s.index}", f"feature/1/{t.index}")] == pytest.approx(expected, rel=1e-9)
            checked += 1
    assert checked >= 3
    assert res.n_pairs == len({(n.layer, n.index) for n in g.nodes if n.kind == "feature" and n.layer == 0}) * \
        len({(n.layer, n.index) for n in g.nodes if n.kind == "feature" and n.layer == 1})
    json.dumps(res.to_dict())


def test_virtual_weights_neurons_to_logits_direct():
    g = attributed("ln-gelu", "neurons")
    a = g.context.adapter
    res = virtual_weights(g, {"kind": "neuron", "layer": 1}, {"kind": "logit"}, top_k=3)
    n = a.norm("ln_final")
    for s, t, w in res.rows:
        g_dir = a.W_U[:, t.index].double() * n.gamma.double()
        g_dir = g_dir - g_dir.mean()
        assert w == pytest.approx(float(a.mlp_weights(1)["W_out"][s.index].double() @ g_dir), rel=1e-12)
    assert abs(res.rows[0][2]) >= abs(res.rows[-1][2])
    with pytest.raises(QueryError, match="virtual weights need"):
        virtual_weights(g, {"kind": "remainder"}, {"kind": "logit"})


def test_de_embedding_equals_embedding_edges_without_frozen_factors():
    g = attributed("ln-gelu", "neurons")
    lin = g.context.linearisation
    checked = 0
    for s_row, t_row in zip(g.edge_source, g.edge_target, strict=False):
        s, t = g.nodes[s_row], g.nodes[t_row]
        if not (s.kind == "embedding" and t.kind == "neuron" and t.layer == 0):
            continue
        sigma2 = float(lin.sigma[("ln2", 0)][t.position])
        if s.position == t.position:  # the residual-direct path
            res = de_embedding(g, t.id, top_k=g.context.adapter.facts.d_vocab)
            scores = {tok: v for tok, _, v in res.rows}
            assert scores[s.index] == pytest.approx(_residual_part(g, s.id, t.id) * sigma2, rel=1e-9)
            checked += 1
        # through head h of layer 0, reading source position s.position
        split = {(p.head, p.source_position): p.value for p in head_split(g, s.id, t.id, by_position=True).parts
                 if p.head is not None}
        for h in range(2):
            part = split.get((h, s.position), 0.0)
            A = float(lin.patterns[0][h, t.position, s.position])
            if A == 0:
                continue
            sigma1 = float(lin.sigma[("ln1", 0)][s.position])
            res = de_embedding(g, {"kind": "neuron", "layer": 0, "index": t.index}, top_k=50,
                               head={"layer": 0, "head": h})
            scores = {tok: v for tok, _, v in res.rows}
            assert scores[s.index] == pytest.approx(part * sigma1 * sigma2 / A, rel=1e-8, abs=1e-12)
            checked += 1
        if checked >= 8:
            break
    assert checked >= 4


def test_de_embedding_bad_input():
    g = attributed("ln-gelu", "neurons")
    with pytest.raises(QueryError, match="head L1H0 writes after neuron/0/3"):
        de_embedding(g, {"kind": "neuron", "layer": 0, "index": 3}, head=(1, 0))
    with pytest.raises(QueryError, match="head 9 requested, layer 0 has 4 heads"):
        de_embedding(g, {"kind": "neuron", "layer": 0, "index": 3}, head=(0, 9))
    with pytest.raises(QueryError, match="layer 4 requested, the model has 2 layers"):
        de_embedding(g, {"kind": "neuron", "layer": 4, "index": 0})
    with pytest.raises(QueryError, match="no transcoder is loaded"):
        de_embedding(g, {"kind": "feature", "layer": 0, "index": 0})
    with pytest.raises(QueryError, match="not a reader unit"):
        de_embedding(g, "embedding/-1/0/1")
