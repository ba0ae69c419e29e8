"""QK attribution: exact on every head of every layer, against TransformerLens's own scores.

* the three sums (pairs, query marginals, key marginals, each + its constant) equal the
  model's pre-softmax score, ``hook_attn_scores`` with the soft-cap undone, to 1e-5 of
  ``|q| |k| / sqrt(d_head)`` in float32 and 1e-12 in float64 (q and k from ``hook_q``/``hook_k``
  or their rotated versions), on every architecture variant and granularity;
* layer-0 pairs equal a direct computation from the weights (W_E, W_pos, ln1, W_Q, W_K and
  the model's own rotary map applied to vectors);
* removing a node from one side only (``hook_q_input``/``hook_k_input``) in the frozen model
  changes the score by exactly its marginal;
* the spec query, its errors, the Neuronpedia export, the diagram inset, the example spec.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import circuitgraph
from circuitgraph.attribution import attribute
from circuitgraph.errors import QueryError, SpecError
from circuitgraph.queries import qk, qk_decomposition, run_query
from circuitgraph.validation.qk_check import qk_check
from tests.helpers.bundles import VARIANTS, load_bundle, make_bundle
from tests.helpers.qk import check_every_head, model_qk

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"








@pytest.mark.parametrize("granularity", ["transcoders", "neurons", "mlp"])
def test_sums_equal_the_model_score_every_head_float32(tmp_path, variant, granularity):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant, n_layers=3))
    attention = {0: "frozen", 1: "heads", 2: "frozen"} if granularity == "neurons" else "frozen"
    g = attribute(adapter, tokens, tcs, mlp=granularity, attention=attention)
    check_every_head(g, adapter, tokens, 1e-5)


@pytest.mark.parametrize("bundle", ["example-gpt2", "example-llama"])
def test_shipped_bundles_every_head(bundle):
    """The GPT-2-style (learned positions) and Llama-style (rotary, GQA) example bundles, with
    their transcoders, at every query position's top key and a fixed one."""
    adapter, tcs, tokens = load_bundle(EXAMPLES / "fixtures" / bundle)
    g = attribute(adapter, tokens, tcs)
    check_every_head(g, adapter, tokens, 1e-5, key_positions=("top", 1, -3))


def test_sums_equal_the_model_score_every_head_float64(tmp_path, variant):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant, kind="jumprelu_skip", input_site="raw"),
                                       dtype="float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, positional_nodes=True, bias_nodes=True)
    check_every_head(g, adapter, tokens, 1e-12)


def test_pairs_and_marginals_are_one_decomposition(tmp_path):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "rms-gated-rotary-gqa"), dtype="float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64)
    (d,) = qk_decomposition(g, 1, 3, -2, 1)
    P = d.pair_matrix()
    c = d.constants()
    # the top pairs are the largest entries of the full matrix; marginals are its row / column sums
    h = qk(g, 1, 3, -2, 1, top_k=5).heads[0]
    assert [p.value for p in h.pairs] == pytest.approx(sorted(P.ravel(), key=abs, reverse=True)[:5])
    cq, ck = d.query_constant, d.key_constant
    np.testing.assert_allclose(d.query_marginals(), P.sum(1) + d.query_vectors @ ck / d.scale, atol=1e-12)
    np.testing.assert_allclose(d.key_marginals(), P.sum(0) + d.key_vectors @ cq / d.scale, atol=1e-12)
    assert P.sum() + c["pairs_constant"] == pytest.approx(d.score, abs=1e-12)
    # the named constant parts add up to the totals
    assert sum(v for k, v in c.items() if k.startswith("query_constant/")) == pytest.approx(c["query_constant"])
    assert sum(v for k, v in c.items() if k.startswith("key_constant/")) == pytest.approx(c["key_constant"])
    assert any(k.startswith("query_constant/MLP L0") for k in c)  # b_dec and position 0 carried along
    # every node's query-side vector sums (with the constant) to the model's rotated query
    np.testing.assert_allclose(d.query, d.model_query, atol=1e-12)
    np.testing.assert_allclose(d.key, d.model_key, atol=1e-12)


def test_layer0_pairs_equal_a_direct_computation(tmp_path, variant):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant), dtype="float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, positional_nodes=True)
    m = adapter.model
    attn = m.blocks[0].attn
    _, _, _, sigma = model_qk(adapter, tokens, 0)
    gamma = m.blocks[0].ln1.w.detach() if hasattr(m.blocks[0].ln1, "w") else torch.ones(adapter.facts.d_model)
    center = adapter.facts.norm == "layernorm"
    T = len(tokens)

    def side(vec, t, W, h):
        """A residual vector at position t through ln1's linear part, W[h] and the rotary map."""
        v = vec - vec.mean() if center else vec
        x = (gamma * v / sigma[t]) @ W[h]
        if adapter.facts.positional == "rotary":
            full = torch.zeros(1, T, 1, x.shape[0], dtype=x.dtype)
            full[0, t, 0] = x
            x = attn.apply_rotary(full, 0, None)[0, t, 0]
        return x

    with torch.no_grad():
        for h in range(adapter.facts.n_heads):
            (d,) = qk_decomposition(g, 0, h, -1, 3)
            pairs = d.pair_matrix()
            checked = 0
            for a, qa in enumerate(d.query_nodes):
                for b, kb in enumerate(d.key_nodes):
                    writer = {"embedding": lambda n: m.W_E[n.index], "positional": lambda n: m.W_pos[n.position]}
                    u = side(writer[qa.kind](qa), T - 1, attn.W_Q, h)
                    v = side(writer[kb.kind](kb), 3, attn.W_K, h)
                    assert pairs[a, b] == pytest.approx(float(u @ v) / float(attn.attn_scale), rel=1e-10, abs=1e-12)
                    checked += 1
            assert {n.kind for n in d.query_nodes} <= {"embedding", "positional"}
            assert checked == len(d.query_nodes) * len(d.key_nodes) >= 1


@pytest.mark.parametrize("variant_name", sorted(VARIANTS))
def test_removal_from_one_side_matches_the_marginal(tmp_path, variant_name):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant_name))
    g = attribute(adapter, tokens, tcs, attention={0: "heads", 1: "frozen"}, positional_nodes=True)
    res = qk_check(g, 1, [0, 3], -1, "top", top_k=3)
    assert res.ok, res.table()
    assert {r.side for r in res.rows} == {"query", "key"}
    assert len(res.rows) >= 4
    assert res.max_relative_deviation < 1e-5
    # a wrong prediction would be caught: the removal effect is not the pair value alone
    d = {h.head: h for h in qk(g, 1, [0, 3], -1, "top", top_k=3).heads}
    row = res.rows[0]
    pair = next(p for p in d[row.head].pairs if str(p.query_node if row.side == "query" else p.key_node) == row.node)
    assert abs(pair.value - row.actual) > 1e-6 or len(d[row.head].pairs) == 1


def test_errors_name_the_rule_and_the_value(tmp_path):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned"))
    g = attribute(adapter, tokens, tcs)
    with pytest.raises(QueryError, match=r"layer 5 requested, the model has 2 layers \(0-1\)"):
        qk(g, 5, 0)
    with pytest.raises(QueryError, match=r"head 9 requested, the model has 4 heads per layer \(0-3\)"):
        qk(g, 0, [0, 9])
    with pytest.raises(QueryError, match="query_position -40 is outside the prompt"):
        qk(g, 0, 0, -40)
    with pytest.raises(QueryError, match="after query_position"):
        qk(g, 0, 0, 2, 5)
    with pytest.raises(QueryError, match="needs the live model"):
        run_query(circuitgraph.AttributionGraph.from_json(g.to_json()), {"qk": {"layer": 0, "head": 0}})
    for bad, where in (({"layer": 0, "head": True}, "head"), ({"layer": 0, "head": 0, "key_position": "first"},
                       "key_position"), ({"layer": 0}, "head"), ({"layer": 0, "head": [], "top_k": 2}, "head"),
                       ({"layer": 0, "head": 0, "top_k": 0}, "top_k")):
        with pytest.raises(SpecError, match=where):
            run_query(g, {"qk": bad})


def test_example_spec_runs_and_writes_the_results(tmp_path):
    spec = yaml.safe_load((EXAMPLES / "qk_demo.yaml").read_text())
    for key in ("json", "neuronpedia", "svg"):
        spec["export"][key] = str(tmp_path / Path(spec["export"][key]).name)
    if shutil.which("dot") is None:  # the DOT text is checked below without the binary
        spec["export"].pop("svg")
    spec["export"]["dot"] = str(tmp_path / "graph.dot")
    circuitgraph.run(spec)
    doc = json.loads((tmp_path / "graph.json").read_text())
    (entry,) = [q for q in doc["queries"] if q["kind"] == "qk"]
    heads = entry["result"]["heads"]
    assert [h["head"] for h in heads] == [0, 1, 2, 3]
    ids = {n["id"] for n in doc["nodes"]}
    for h in heads:
        for name in ("pairs_sum_plus_constant", "query_marginals_sum_plus_constant", "key_marginals_sum_plus_constant"):
            assert h[name] == pytest.approx(h["score"], abs=1e-5 * max(1.0, h["magnitude"]))
        assert h["score_capped"] == pytest.approx(h["score"])  # the demo model has no soft-cap
        for p in h["pairs"]:
            assert {p["query_node"], p["key_node"]} <= ids and set(p) == {"query_node", "key_node", "value"}
        for m in h["query_marginals"] + h["key_marginals"]:
            assert m["node"] in ids and set(m) == {"node", "value"}
        assert "query_constant" in h["constants"] and "key_constant" in h["constants"]
    # the noun head: L0H0 looks from the article position at " owl", because of the noun's embedding
    h0 = heads[0]
    assert h0["key_position"] == 4 and h0["probability"] > 0.8
    assert h0["pairs"][0]["key_node"].startswith("embedding/-1/4/")
    (check,) = doc["validation"]
    assert check["kind"] == "qk" and check["result"]["ok"] is True
    # Neuronpedia: qk_tracing_results on the head's node at the query position
    np_doc = json.loads((tmp_path / "neuronpedia.json").read_text())
    by_id = {n["node_id"]: n for n in np_doc["nodes"]}
    head_node = by_id["0_H0_11"]
    qkr = head_node["qk_tracing_results"]
    assert set(qkr) == {"pair_wise_contributors", "top_q_marginal_contributors", "top_k_marginal_contributors"}
    assert len(qkr["pair_wise_contributors"][0]) == 3 and len(qkr["top_q_marginal_contributors"][0]) == 2
    for q_id, k_id, value in qkr["pair_wise_contributors"]:
        assert q_id in by_id and k_id in by_id and isinstance(value, float)
    assert qkr["pair_wise_contributors"][0][2] == pytest.approx(h0["pairs"][0]["value"])
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates against Neuronpedia's schema")
    schema = json.loads((EXAMPLES.parent / "schemas" / "neuronpedia" / "graph-schema.json").read_text())
    jsonschema.validate(np_doc, schema)
    # the diagram inset: one cluster per head, each top pair as dashed q/k edges into the head
    dot = (tmp_path / "graph.dot").read_text()
    assert dot.count('"cluster qk L0H') == 4
    p0 = h0["pairs"][0]
    def dashed_edge(source: str, target: str) -> bool:
        return any(line.strip().startswith(f'"{source}" -> "{target}" [') and "style=dashed" in line
                   for line in dot.splitlines())

    assert dashed_edge(p0["query_node"], "qk L0H0 11->4 #0 pair 0")
    assert dashed_edge(p0["key_node"], "qk L0H0 11->4 #0 pair 0")
    assert dashed_edge("qk L0H0 11->4 #0 pair 0", "qk L0H0 11->4 #0")
    if "svg" in spec["export"]:
        assert "QK L0H0" in (tmp_path / "graph.svg").read_text()


def test_cli_bad_head_or_position_exits_2_before_writing(tmp_path):
    from typer.testing import CliRunner

    from circuitgraph.cli import main as cli

    spec = yaml.safe_load((EXAMPLES / "qk_demo.yaml").read_text())
    spec["export"] = {"json": str(tmp_path / "graph.json")}
    spec["queries"] = [{"qk": {"layer": 0, "head": [0, 9], "query_position": 2, "key_position": 5}}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(cli.app, ["run", str(path)])
    assert r.exit_code == 2
    assert "queries[0].qk.head: head 9 requested, the model has 4 heads per layer (0-3)" in r.output
    assert "queries[0].qk.key_position: key_position 5 is after query_position 2" in r.output
    assert not (tmp_path / "graph.json").exists()


def test_folded_and_pruned_nodes_are_reported_as_their_remainders(tmp_path):
    from circuitgraph.queries import prune_graph

    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned"))
    g = attribute(adapter, tokens, tcs, max_feature_nodes=10)
    pruned = prune_graph(g, node_threshold=0.5, edge_threshold=0.8).graph
    for graph in (g, pruned):
        h = qk(graph, 1, 2, -1, "top", top_k=1000).heads[0]
        ids = {m.node for m in h.query_marginals + h.key_marginals}
        assert ids and all(i in graph for i in ids)
        assert any(i.kind == "remainder" for i in ids)
        assert h.max_deviation() < 1e-5
    assert pruned.n_nodes < g.n_nodes


def test_bidirectional_key_after_the_query(tmp_path):
    """Bidirectional attention: a key after the query is allowed and its score is exact."""
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "none-relu-bidirectional", n_layers=3), dtype="float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64)
    for layer in range(adapter.facts.n_layers):
        _, _, scores, _ = model_qk(adapter, tokens, layer)
        for h in qk(g, layer, list(range(adapter.facts.n_heads)), 1, len(tokens) - 2, top_k=3).heads:
            ref = float(scores[h.head, 1, len(tokens) - 2])
            for value in (h.score, h.pairs_sum_plus_constant, h.query_marginals_sum_plus_constant,
                          h.key_marginals_sum_plus_constant):
                assert value == pytest.approx(ref, abs=1e-10)
    causal, c_tcs, c_tokens = load_bundle(make_bundle(tmp_path, "none-relu-learned"), dtype="float64")
    with pytest.raises(QueryError, match="causal attention"):
        qk(attribute(causal, c_tokens, c_tcs, dtype=torch.float64), 1, 0, 1, 3)
