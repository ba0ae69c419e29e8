"""Steering: interventions with generation, checked against an independent computation.

The reference in this file re-runs the TransformerLens model on the growing sequence with its
own hook functions, built from the dictionaries' raw weights (sae-lens objects, circuit-tracer
tensors): a feature's activation from the encoder, ``(a' - a) W_dec`` rows added to
``hook_mlp_out`` of every layer the feature writes; a neuron edited at ``hook_post``; a head's
``z`` scaled; the prompt's patterns written into ``hook_pattern``.  It never calls circuitgraph's
intervention code.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import circuitgraph
from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.attribution import attribute
from circuitgraph.attribution.targets import ResolvedTarget
from circuitgraph.dictionaries import TranscoderSet, load_dictionaries
from circuitgraph.errors import SpecError, ValidationRunError
from circuitgraph.testing.synthetic import random_clt, random_transcoders, save_bundle, save_clt, tiny_model
from circuitgraph.validation.predictions import direct_effects, total_effects
from circuitgraph.validation.steering import steer
from tests.helpers.bundles import run_tmpdir

PROMPT = [1, 5, 7, 9, 4, 3, 11]
TARGET = (3, 4)
N_NEW = 4
ARCH = dict(norm="LN", mlp="gelu", positional="learned", n_layers=3, n_ctx=16)
#: more architectures (Llama-style; Gemma-style post-norms and soft-caps)
ARCHS = {
    "gpt2": ARCH,
    "llama": dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2, n_layers=3, n_ctx=16),
    "gemma": dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True, attn_soft_cap=30.0,
                  logit_soft_cap=20.0, n_layers=3, n_ctx=16),
}


@functools.cache
def _setup(kind: str, arch: str = "gpt2"):
    """(adapter, dictionary, raw weights, graph): float64, loaded from files like any local model."""
    model = tiny_model(**ARCHS[arch])
    tmp = run_tmpdir("cg-steer-")
    if kind == "transcoders":
        raw = random_transcoders(model, active_frac=0.3)
        root = save_bundle(tmp, model, raw)
        adapter = load_model_dir(root / "model", dtype="float64")
        dictionary = TranscoderSet.from_dir(root / "transcoders", adapter, dtype=torch.float64)
        weights = {l: {"W_enc": tc.W_enc.detach().double(), "b_enc": tc.b_enc.detach().double(),
                       "W_dec": tc.W_dec.detach().double()[:, None, :], "hook_in": f"blocks.{l}.ln2.hook_normalized"}
                   for l, tc in raw.items()}
    else:
        raw = random_clt(model, active_frac=0.3)
        root = save_bundle(tmp, model)
        adapter = load_model_dir(root / "model", dtype="float64")
        dictionary = load_dictionaries(save_clt(tmp / "clt", raw), adapter, dtype=torch.float64)
        weights = {l: {"W_enc": t["W_enc"].double().T, "b_enc": t["b_enc"].double(), "W_dec": t["W_dec"].double(),
                       "hook_in": f"blocks.{l}.hook_resid_mid"} for l, t in enumerate(raw["layers"])}
    target = ResolvedTarget(kind="logit_diff", position=len(PROMPT) - 1, tokens=TARGET)
    graph = attribute(adapter, PROMPT, dictionary, [target], dtype=torch.float64)
    return adapter, dictionary, weights, graph


def _top_feature(graph, position=None):
    pos = len(PROMPT) - 1 if position is None else position
    D = direct_effects(graph)
    feats = [i for i, n in enumerate(graph.nodes) if n.kind == "feature" and n.position == pos and n.layer == 0]
    return graph.nodes[max(feats, key=lambda i: abs(D[i]))]


# ----------------------------------------------------------------------------- the reference
def _new_value(mode, value, a):
    return {"zero": lambda: torch.zeros_like(a), "set": lambda: torch.full_like(a, value),
            "scale": lambda: a * value}[mode]()


def _positions(spec, own, T, n):
    if spec == "prompt":
        return [own]
    if spec == "all":
        return [own] + list(range(T, n))
    return [p for p in spec if p < n]


def _reference_hooks(kind, what, mode, value, spec_positions, weights, n, T, patterns):
    """TransformerLens hooks for an ``n``-token sequence."""
    hooks = []
    if patterns is not None:
        def freeze(x, hook):
            x = x.clone()
            x[..., :T, :T] = patterns[hook.name]
            return x
        hooks += [(name, freeze) for name in patterns]
    site, layer, own, index = what
    pos = _positions(spec_positions, own, T, n)
    if site == "feature":
        w = weights[layer]
        store = {}

        def grab(x, hook):
            store["x"] = x
            return x

        def splice(x, hook, k):
            a = torch.relu(store["x"] @ w["W_enc"] + w["b_enc"])[:, pos, index]
            delta = torch.zeros_like(x)
            delta[:, pos] = (_new_value(mode, value, a) - a)[..., None] * w["W_dec"][index, k - layer]
            return x + delta

        hooks.append((w["hook_in"], grab))
        for k in range(layer, layer + w["W_dec"].shape[1]):
            hooks.append((f"blocks.{k}.hook_mlp_out", functools.partial(splice, k=k)))
    elif site == "neuron":
        def neuron(x, hook):
            x = x.clone()
            x[:, pos, index] = _new_value(mode, value, x[:, pos, index])
            return x
        hooks.append((f"blocks.{layer}.mlp.hook_post", neuron))
    else:
        c = {"zero": 0.0, "set": value, "scale": value}[mode]

        def head(x, hook):
            x = x.clone()
            x[:, pos, index] = c * x[:, pos, index]
            return x
        hooks.append((f"blocks.{layer}.attn.hook_z", head))
    return hooks


@torch.no_grad()
def _reference(model, what, mode, value, spec_positions, weights, freeze):
    T = len(PROMPT)
    patterns = None
    if freeze:
        names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.cfg.n_layers)]
        _, cache = model.run_with_cache(torch.tensor([PROMPT]), names_filter=lambda n: n in names)
        patterns = {n: cache[n] for n in names}
    seq, probs, first_logits = list(PROMPT), [], None
    for _ in range(N_NEW):
        hooks = _reference_hooks(None, what, mode, value, spec_positions, weights, len(seq), T, patterns)
        with model.hooks(fwd_hooks=hooks):
            logits = model(torch.tensor([seq]))
        first_logits = logits[0, -1] if first_logits is None else first_logits
        last = logits[0, -1].double()
        p = torch.softmax(last, -1)
        tok = int(torch.argmax(last))
        probs.append(p)
        seq.append(tok)
    metric = float(first_logits[TARGET[0]] - first_logits[TARGET[1]])
    return seq[T:], probs, metric


def _check_against_reference(kind, what, mode, value, positions, freeze, arch="gpt2"):
    adapter, _, weights, graph = _setup(kind, arch)
    site, layer, own, index = what
    node = {"feature": "feature", "neuron": "neuron", "head": "attention_head"}[site]
    iv = {"node": f"{node}/{layer}/{own}/{index}", "mode": mode, "positions": positions}
    if value is not None:
        iv["value"] = value
    res = steer(graph, [iv], generate={"max_new_tokens": N_NEW, "top_k": adapter.facts.d_vocab},
                freeze_attention=freeze)
    tokens, probs, metric = _reference(adapter.model, what, mode, value, positions, weights, freeze)
    assert res.intervened.tokens == tokens
    for step, p in zip(res.intervened.steps, probs, strict=False):
        got = torch.zeros_like(p)
        for entry in step["top"]:
            got[entry["token"]] = entry["probability"]
        # exactly: the same float64 numbers, not merely close
        assert torch.equal(got, p), float((got - p).abs().max())
        assert step["probability"] == float(p[step["token"]])
    base_tokens, base_probs, base_metric = _reference(adapter.model, what, "scale", 1.0, positions, weights, False)
    assert res.baseline.tokens == base_tokens
    assert [s["probability"] for s in res.baseline.steps] == pytest.approx(
        [float(p[t]) for p, t in zip(base_probs, base_tokens, strict=False)], abs=1e-12)
    # the intervention matters, so the comparison cannot pass by doing nothing
    assert max(float((p - q).abs().max()) for p, q in zip(probs, base_probs, strict=False)) > 1e-4
    assert res.metric["actual"] == pytest.approx(metric - base_metric, abs=1e-12)
    return res


FEATURE_CASES = [("zero", None, "prompt"), ("set", 3.0, "all"), ("scale", 2.5, "prompt"), ("scale", -1.0, "all")]


@pytest.mark.parametrize("freeze", [False, True], ids=["live-attention", "frozen-attention"])
@pytest.mark.parametrize("mode,value,positions", FEATURE_CASES, ids=[c[0] + "-" + c[2] for c in FEATURE_CASES])
@pytest.mark.parametrize("kind", ["transcoders", "clt"])
def test_feature_interventions_equal_an_independent_computation(kind, mode, value, positions, freeze):
    _, _, _, graph = _setup(kind)
    f = _top_feature(graph)
    _check_against_reference(kind, ("feature", f.layer, f.position, f.index), mode, value, positions, freeze)


@pytest.mark.parametrize("freeze", [False, True], ids=["live-attention", "frozen-attention"])
@pytest.mark.parametrize("arch", ["llama", "gemma"])
@pytest.mark.parametrize("kind", ["transcoders", "clt"])
def test_feature_interventions_on_other_architectures(kind, arch, freeze):
    _, _, _, graph = _setup(kind, arch)
    f = _top_feature(graph)
    _check_against_reference(kind, ("feature", f.layer, f.position, f.index), "scale", -1.5, "all", freeze, arch)
    _check_against_reference(kind, ("neuron", 1, 6, 3), "set", 1.5, "all", freeze, arch)
    _check_against_reference(kind, ("head", 1, 6, 1), "zero", None, "prompt", freeze, arch)


UNIT_CASES = [("neuron", 1, 5, "zero", None, "prompt"), ("neuron", 0, 6, "set", 2.0, "all"),
              ("neuron", 1, 6, "scale", 3.0, [6, 8]), ("head", 1, 6, "zero", None, "all"),
              ("head", 0, 4, "set", 0.5, "prompt"), ("head", 1, 6, "scale", -2.0, "prompt")]


@pytest.mark.parametrize("freeze", [False, True], ids=["live-attention", "frozen-attention"])
@pytest.mark.parametrize("site,layer,pos,mode,value,positions", UNIT_CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in UNIT_CASES])
def test_neuron_and_head_interventions_equal_an_independent_computation(site, layer, pos, mode, value,
                                                                       positions, freeze):
    index = 2 if site == "head" else 7
    _check_against_reference("transcoders", (site, layer, pos, index), mode, value, positions, freeze)


def test_frozen_attention_changes_the_continuation_only_through_the_patterns():
    """With the intervention at the last prompt position only, its own row of the pattern is
    frozen: the first step's distribution differs from the live one (the check is not vacuous)."""
    _, _, _, graph = _setup("transcoders")
    f = _top_feature(graph, position=2)
    iv = [{"node": str(f.id), "mode": "scale", "value": 4.0}]
    live = steer(graph, iv, generate={"max_new_tokens": 2})
    frozen = steer(graph, iv, generate={"max_new_tokens": 2}, freeze_attention=True)
    assert live.intervened.steps[0]["probability"] != frozen.intervened.steps[0]["probability"]
    assert live.baseline.to_dict() == frozen.baseline.to_dict()


# ----------------------------------------------------------------------------- the metric
@pytest.mark.parametrize("kind", ["transcoders", "clt"])
def test_metric_is_reported_beside_the_graphs_predictions(kind):
    _, _, _, graph = _setup(kind)
    f = _top_feature(graph)
    row = graph.index_of(f.id)
    D, V = direct_effects(graph), total_effects(graph)
    res = steer(graph, [{"node": str(f.id), "mode": "zero"}], generate={"max_new_tokens": 1}, freeze_attention=True)
    m = res.metric
    assert m["predicted_direct"] == pytest.approx(-D[row], rel=1e-12)
    assert m["predicted_total"] == pytest.approx(-V[row], rel=1e-12)
    # the direct edge is the sum of the edges from the node into the target, weighted
    edges = [float(w) for s, t, w in zip(graph.edge_source, graph.edge_target, graph.edge_weight, strict=False)
             if s == row and graph.nodes[t].id == graph.target_ids[0]]
    assert m["predicted_direct"] == pytest.approx(-sum(edges), rel=1e-9)
    assert m["actual"] != 0 and m["baseline"] == pytest.approx(graph.node(graph.target_ids[0]).pre_activation)
    # set to its own activation: nothing changes, and nothing is predicted to
    same = steer(graph, [{"node": str(f.id), "mode": "set", "value": float(f.activation)}],
                 generate={"max_new_tokens": 1})
    assert abs(same.metric["actual"]) < 1e-9 and abs(same.metric["predicted_total"]) < 1e-9
    # scale 2 of a feature: predicted = +1 x the edges; add d: (d / a) x the edges
    add = steer(graph, [{"node": str(f.id), "mode": "add", "value": 0.5}], generate={"max_new_tokens": 1})
    assert add.metric["predicted_direct"] == pytest.approx(0.5 / f.activation * D[row], rel=1e-9)
    # generated positions only: the prompt's metric does not move and nothing is predicted
    new = steer(graph, [{"node": str(f.id), "mode": "zero", "positions": "new"}], generate={"max_new_tokens": 3})
    assert new.metric["actual"] == 0 and new.metric["predicted_direct"] == 0
    assert new.intervened.steps[0] == new.baseline.steps[0]
    assert new.interventions[0].positions == (len(PROMPT), len(PROMPT) + 1)


def test_filter_and_direction_interventions():
    adapter, _, _, graph = _setup("transcoders")
    T = len(PROMPT)
    res = steer(graph, [{"nodes": {"kind": "feature", "layer": 0, "position": -1}, "mode": "zero"}],
                generate={"max_new_tokens": 2})
    resolved = {str(r.node) for r in res.interventions}
    expected = {str(n.id) for n in graph.nodes if n.kind == "feature" and n.layer == 0 and n.position == T - 1}
    assert resolved == expected and len(expected) > 1
    # a direction: zeroing the residual's component along the unembedding difference at the end
    d = (adapter.model.W_U[:, TARGET[0]] - adapter.model.W_U[:, TARGET[1]]).tolist()
    res = steer(graph, [{"direction": d, "layer": 2, "mode": "zero"}], generate={"max_new_tokens": 1})
    assert res.metric["predicted_direct"] is None and any("direction" in n for n in res.notes)
    x_clean = adapter.run_with_cache(torch.tensor([PROMPT]), ["blocks.2.hook_resid_post"])[1]["blocks.2.hook_resid_post"]
    dv = torch.tensor(d, dtype=torch.float64)
    x = x_clean[0, -1] - (x_clean[0, -1] @ dv) / (dv @ dv) * dv
    with adapter.model.hooks(fwd_hooks=[("blocks.2.hook_resid_post",
                                         lambda v, hook: torch.cat([v[:, :-1], x[None, None]], 1))]):
        logits = adapter.model(torch.tensor([PROMPT]))[0, -1]
    assert res.intervened.steps[0]["probability"] == pytest.approx(
        float(torch.softmax(logits.double(), -1)[res.intervened.tokens[0]]), rel=1e-12)


# ----------------------------------------------------------------------------- sampling
def test_temperature_sampling_is_reproducible_with_a_seed():
    adapter, _, _, graph = _setup("transcoders")
    f = _top_feature(graph)
    iv = [{"node": str(f.id), "mode": "scale", "value": 3.0, "positions": "all"}]
    gen = {"max_new_tokens": 6, "temperature": 1.5, "seed": 7}
    a, b = steer(graph, iv, generate=gen), steer(graph, iv, generate=gen)
    assert a.to_dict() == b.to_dict()
    others = [steer(graph, iv, generate={**gen, "seed": s}).intervened.tokens for s in (1, 2, 3)]
    assert any(o != a.intervened.tokens for o in others)
    # the baseline, sampled independently with the same generator, reproduces the reported tokens
    rng = torch.Generator().manual_seed(7)
    seq = list(PROMPT)
    for _ in range(6):
        logits = adapter.model(torch.tensor([seq]))[0, -1].double()
        seq.append(int(torch.multinomial(torch.softmax(logits / 1.5, -1), 1, generator=rng)))
    assert a.baseline.tokens == seq[len(PROMPT):]
    # nucleus sampling picks only tokens inside the nucleus of softmax(logits / T) = p^(1/T), renormalised
    nuc = steer(graph, iv, generate={**gen, "top_p": 0.5, "top_k": adapter.facts.d_vocab})
    for step in nuc.intervened.steps:
        p = torch.zeros(adapter.facts.d_vocab, dtype=torch.float64)
        for e in step["top"]:
            p[e["token"]] = e["probability"]
        p_t = p ** (1 / 1.5)
        p_t = p_t / p_t.sum()
        order = torch.argsort(p_t, descending=True)
        before = torch.cumsum(p_t[order], 0) - p_t[order]
        assert step["token"] in set(order[before < 0.5 - 1e-9].tolist()) | set(order[:1].tolist())
        assert len(order[before < 0.5 + 1e-9]) < adapter.facts.d_vocab  # the nucleus excludes something


# ----------------------------------------------------------------------------- bad input, the spec
@pytest.mark.parametrize("iv,message", [
    ({"node": "feature/0/6/1", "mode": "zero", "value": 1.0}, "value is only used with mode"),
    ({"node": "feature/0/6/1", "mode": "scale"}, "mode: scale needs value"),
    ({"node": "feature/0/6/1", "layer": 1}, "layer is only used with direction"),
    ({"node": "feature/0/6/1", "nodes": {"kind": "feature"}}, "exactly one of node, nodes or direction"),
    ({"direction": [1.0, 2.0]}, "a direction needs layer"),
    ({"node": "feature/0/6/1", "positions": [3, 3]}, "repeated"),
])
def test_bad_interventions_are_one_line_spec_errors(iv, message):
    with pytest.raises(SpecError, match=message):
        circuitgraph.load_spec({"format_version": 1, "model": {"builtin": "demo"}, "prompt": "a b",
                                "steer": [{"interventions": [iv]}]})


def test_bad_generation_settings_are_errors():
    base = {"format_version": 1, "model": {"builtin": "demo"}, "prompt": "a b"}
    for gen, message in (({"top_p": 0.5}, "top_p is only used when sampling"),
                         ({"seed": 3}, "seed is only used when sampling"),
                         ({"max_new_tokens": 0}, "must be > 0")):
        with pytest.raises(SpecError, match=message):
            circuitgraph.load_spec({**base, "steer": [{"interventions": [{"node": "feature/0/1/1"}], "generate": gen}]})
    _, _, _, graph = _setup("transcoders")
    with pytest.raises(ValidationRunError, match="context is 16"):
        steer(graph, [{"node": "neuron/0/1/1"}], generate={"max_new_tokens": 20})
    with pytest.raises(ValidationRunError, match="target nodes cannot be intervened on"):
        steer(graph, [{"node": str(graph.target_ids[0])}])
    with pytest.raises(ValidationRunError, match="outside the 7-token prompt"):
        steer(graph, [{"node": "neuron/0/9/1"}])


def test_spec_steer_items_go_into_the_graph_json_and_the_summary(tmp_path):
    model = tiny_model(**ARCH)
    root = save_bundle(tmp_path / "b", model, random_transcoders(model, active_frac=0.3))
    spec = {"format_version": 1, "model": {"path": str(root / "model")}, "transcoders": {"path": str(root / "transcoders")},
            "prompt": {"tokens": PROMPT}, "targets": [{"logit_diff": list(TARGET)}],
            "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
            "steer": [{"name": "off", "interventions": [{"nodes": {"kind": "feature", "position": -1}, "mode": "zero"}],
                       "generate": {"max_new_tokens": 3}},
                      {"interventions": [{"node": "feature/0/99/1"}]}],
            "export": {"json": str(tmp_path / "g.json"), "html": str(tmp_path / "r.html"),
                       "graph": str(tmp_path / "g.npz")}}
    result = circuitgraph.run(spec)
    doc = json.loads((tmp_path / "g.json").read_text())
    ok, bad = doc["steering"]
    assert ok["status"] == "ok" and ok["error"] is None
    assert set(ok["result"]) >= {"interventions", "baseline", "intervened", "metric"}
    assert set(ok["result"]["metric"]) >= {"actual", "predicted_direct", "predicted_total"}
    assert len(ok["result"]["intervened"]["tokens"]) == 3 and len(ok["result"]["intervened"]["steps"]) == 3
    assert {"top", "token", "probability"} <= set(ok["result"]["intervened"]["steps"][0])
    assert bad["status"] == "failed" and "outside the 7-token prompt" in bad["error"]
    assert result.failures == [f"steer[1] steer: {bad['error']}"]
    lines = "\n".join(result.summary_lines())
    assert "steer[0] off:" in lines and "steer[1]: FAILED" in lines
    html = (tmp_path / "r.html").read_text()
    assert "Steering" in html
    import jsonschema

    schema = json.loads((Path(circuitgraph.__file__).resolve().parents[1] / "schemas" / "graph.schema.json").read_text())
    jsonschema.validate(doc, schema)
    # the graph file still loads, with its steering results
    from circuitgraph.export.json_graph import read_graph_json

    assert read_graph_json(tmp_path / "g.json").steering == doc["steering"]
    from circuitgraph.export.binary import read_graph_binary

    assert read_graph_binary(tmp_path / "g.npz").steering == doc["steering"]
    from circuitgraph.export.html import write_report

    write_report(tmp_path / "g.json", tmp_path / "from_file.html")
    assert "Steering" in (tmp_path / "from_file.html").read_text()


def test_the_steer_command(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from circuitgraph.cli.main import EXIT_FAILED_CHECKS, app

    model = tiny_model(**ARCH)
    root = save_bundle(tmp_path / "b", model, random_transcoders(model, active_frac=0.3))
    spec = {"format_version": 1, "model": {"path": str(root / "model")},
            "transcoders": {"path": str(root / "transcoders")}, "prompt": {"tokens": PROMPT},
            "targets": [{"logit_diff": list(TARGET)}],
            "steer": [{"interventions": [{"nodes": {"kind": "feature", "layer": 0, "position": -1}, "mode": "zero"}],
                       "generate": {"max_new_tokens": 2}}]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    runner = CliRunner()
    out = runner.invoke(app, ["steer", str(path), "-q", "-o", str(tmp_path / "s.json")])
    assert out.exit_code == 0, out.output
    assert "steer[0]:" in out.output and "graph predicts" in out.output
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc[0]["status"] == "ok" and len(doc[0]["result"]["intervened"]["tokens"]) == 2
    spec["steer"].append({"interventions": [{"node": "neuron/0/50/1"}]})
    path.write_text(yaml.safe_dump(spec))
    out = runner.invoke(app, ["steer", str(path), "-q"])
    assert out.exit_code == EXIT_FAILED_CHECKS and "failed: steer[1]" in out.output
    path.write_text(yaml.safe_dump({k: v for k, v in spec.items() if k != "steer"}))
    out = runner.invoke(app, ["steer", str(path), "-q"])
    assert out.exit_code == 2 and "no steer: items" in out.output


def test_clamped_total_effects_count_each_path_once():
    """e -> f1 -> f2 -> T and f1 -> T: zeroing f1 and f2 together removes f1's direct edge and
    f2's whole contribution (-3 - 4), not f1's total effect (7, which includes the path through
    f2) plus f2's (4)."""
    import numpy as np

    from circuitgraph.graph.graph import AttributionGraph
    from circuitgraph.graph.nodes import Node, NodeId
    from circuitgraph.validation.steering import clamped_total_effects

    ids = [NodeId("embedding", -1, 0, 5), NodeId("feature", 0, 0, 1), NodeId("feature", 1, 0, 2),
           NodeId("logit", 2, 0, 7)]
    nodes = [Node(ids[0], 1.0), Node(ids[1], 2.0, pre_activation=2.0), Node(ids[2], 1.0, pre_activation=1.0),
             Node(ids[3], 8.0, pre_activation=8.0)]
    g = AttributionGraph(nodes, np.array([1, 2, 3, 3]), np.array([0, 1, 1, 2]), np.array([2.0, 1.0, 3.0, 4.0]),
                         [(ids[3], 1.0)], {"n_layers": 2})
    assert clamped_total_effects(g, [1]).tolist()[1:3] == [7.0, 4.0]  # alone: every path
    both = clamped_total_effects(g, [1, 2])
    assert -(both[1] + both[2]) == -7.0
