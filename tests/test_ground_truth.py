"""The ``ground_truth`` query: its ROC AUC against a brute-force pairwise count, its component
edges against TransformerLens's own values, and its scores on a circuit known by hand."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.errors import QueryError
from circuitgraph.queries import ground_truth, roc_auc, run_query
from circuitgraph.queries.ground_truth import component_edges


def _brute_auc(scores, labels):
    """Every (positive, negative) pair: 1 if the positive scores higher, 1/2 on a tie."""
    pos = [s for s, y in zip(scores, labels, strict=False) if y]
    neg = [s for s, y in zip(scores, labels, strict=False) if not y]
    total = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return total / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(6))
def test_roc_auc_equals_pairwise_count(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    scores = rng.integers(0, 6, n).astype(float)  # many ties
    if seed % 2:
        scores = scores + rng.normal(size=n) * (rng.random(n) < 0.5)
    labels = rng.random(n) < 0.4
    labels[0], labels[1] = True, False
    assert roc_auc(scores, labels) == pytest.approx(_brute_auc(scores, labels), abs=1e-12)


def test_roc_auc_edge_cases():
    assert roc_auc(np.array([3.0, 2.0, 1.0]), np.array([True, False, False])) == 1.0
    assert roc_auc(np.array([1.0, 2.0, 3.0]), np.array([True, False, False])) == 0.0
    assert roc_auc(np.array([1.0, 1.0]), np.array([True, False])) == 0.5
    assert np.isnan(roc_auc(np.array([1.0, 2.0]), np.array([True, True])))


def _model(**kw):
    from circuitgraph.adapters import ModelAdapter
    from circuitgraph.testing.synthetic import tiny_model

    return ModelAdapter(tiny_model(norm=None, mlp="relu", n_layers=2, attention_dir="bidirectional", seed=3, **kw))


def test_component_edges_equal_transformerlens_values():
    """Into a layer-0 head (value path): sum_s (attention paid to s) sum_k |x_s . W_V[h][:, k]| for
    the token embeddings x_s = hook_embed[s]; into the target: the graph's |edges|; into MLP 0:
    sum over every neuron of |x . W_in|."""
    a = _model()
    tokens = [1, 5, 7, 2, 9]
    g = attribute(a, tokens, None, [ResolvedTarget(kind="logit", position=4, tokens=(3,))], dtype=torch.float64,
                  mlp="mlp", attention="heads", positional_nodes=True)
    agg = component_edges(g)
    m = a.model.to(torch.float64)
    with torch.no_grad():
        _, cache = m.run_with_cache(torch.tensor([tokens]))
    emb = cache["hook_embed"][0]
    A = cache["blocks.0.attn.hook_pattern"][0]  # (H, t, s)
    for h in range(a.facts.n_heads):
        expected = float((A[h].sum(0)[:, None] * (emb @ m.blocks[0].attn.W_V[h]).abs()).sum())
        got = agg.weights[(("embedding", -1, -1), ("attention_head", 0, h), "direct")]
        assert got == pytest.approx(expected, rel=1e-10)
        q = float((emb @ m.blocks[0].attn.W_Q[h]).abs().sum() + (emb @ m.blocks[0].attn.W_K[h]).abs().sum())
        assert agg.weights[(("embedding", -1, -1), ("attention_head", 0, h), "qk")] == pytest.approx(q, rel=1e-10)
    resid_mid = cache["blocks.0.hook_resid_mid"][0]
    contrib = (emb @ m.blocks[0].mlp.W_in).abs()  # every neuron's pre-activation
    assert agg.weights[(("embedding", -1, -1), ("mlp", 0, 0), "direct")] == pytest.approx(float(contrib.sum()), rel=1e-10)
    assert resid_mid.shape[0] == len(tokens)
    target = g.target_ids[0]
    into = sum(abs(w) for s, w in g.in_edges(target) if s.kind == "mlp" and s.layer == 1)
    assert agg.weights[(("mlp", 1, 0), ("target", 2, -1), "direct")] == pytest.approx(into, rel=1e-12)


def test_ground_truth_scores_a_hand_circuit(tmp_path):
    """A circuit naming the strongest edges is scored 1; swapping one true edge for the weakest
    false one is a disagreement and lowers the AUC, exactly as the pairwise count says."""
    a = _model()
    g = attribute(a, [1, 5, 7, 2, 9], None, [ResolvedTarget(kind="logit", position=4, tokens=(3,))],
                  dtype=torch.float64, mlp="mlp", attention="heads", positional_nodes=True)
    agg = component_edges(g)
    direct = sorted(((w, k) for k, w in agg.weights.items() if k[2] == "direct"), reverse=True)
    node = lambda c: {"kind": c[0], "layer": c[1], "index": c[2]}  # noqa: E731
    top = [k for _, k in direct[:4]]
    circuit = {"nodes": [], "edges": [{"source": node(s), "target": node(d), "path": p} for s, d, p in top]}
    path = tmp_path / "circuit.json"
    path.write_text(json.dumps(circuit))
    res = ground_truth(g, path)
    assert res.edge_auc == 1.0 and res.disagreements == [] and res.n_true_edges == 4
    res2 = run_query(g, {"ground_truth": {"circuit": str(path)}})
    assert res2.to_dict()["edge_auc"] == 1.0
    weakest = [k for w, k in direct if w > 0][-1]
    circuit["edges"][0] = {"source": node(weakest[0]), "target": node(weakest[1]), "path": "direct"}
    res = ground_truth(g, circuit)
    rows = [r for r in res.edges if r["path"] == "direct"]
    assert res.edge_auc == pytest.approx(_brute_auc([r["weight"] for r in rows], [r["true"] for r in rows]))
    assert res.edge_auc < 1.0 and res.disagreements and res.disagreements[0]["n_false_above"] >= 1
    assert 0 < res.recall <= 1 and 0 < res.precision <= 1


def test_ground_truth_needs_heads():
    a = _model()
    g = attribute(a, [1, 5, 7], None, [ResolvedTarget(kind="logit", position=2, tokens=(3,))], mlp="mlp")
    with pytest.raises(QueryError, match="heads as nodes"):
        ground_truth(g, {"nodes": [], "edges": []})
    with pytest.raises(QueryError, match="does not exist"):
        ground_truth(g, "no/such/circuit.json")
