"""Cross-layer transcoders in circuit-tracer's format: loading, exactness, agreement, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.circuit_tracer import clt_agreement
from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import ResidualLocation, attribute
from circuitgraph.dictionaries import CrossLayerTranscoder, detect_format, load_dictionaries
from circuitgraph.errors import LoadError, NumericalError, ShapeMismatchError
from circuitgraph.testing.synthetic import random_clt, save_bundle, save_clt, tiny_model
from tests.helpers.peers import circuit_tracer_or_skip

REPO = Path(__file__).resolve().parents[1]

GPT2 = dict(norm="LN", mlp="gelu", positional="learned", n_layers=3)
LLAMA = dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2, n_layers=3)
TOKENS = [1, 5, 7, 9, 4, 3, 11]


def _clt(tmp_path: Path, arch: dict, **kwargs) -> tuple[ModelAdapter, CrossLayerTranscoder, Path]:
    model = tiny_model(**arch)
    d = save_clt(tmp_path / "clt", random_clt(model, **kwargs))
    adapter = ModelAdapter(model)
    return adapter, load_dictionaries(d, adapter), d


# ----------------------------------------------------------------------------- agreement
def test_clt_edges_equal_circuit_tracers(tmp_path):
    """GPT-2 and Llama style, ReLU and JumpReLU: every edge of circuit-tracer's own CLT graph
    within 1e-5 of the largest edge, same feature nodes, completeness recorded."""
    circuit_tracer_or_skip()
    jobs = [clt_agreement.make_case(tmp_path, name) for name in clt_agreement.CASES]
    clt_agreement.run_circuit_tracer(jobs, tmp_path, clt_agreement.ct_python())
    for job in jobs:
        r = clt_agreement.compare(job)
        assert r["max_difference_relative_to_largest_edge"] < 1e-5, r
        assert r["n_features_ct"] == r["n_features_circuitgraph"] > 0, r
        assert r["our_nodes_not_in_ct"] == [] and r["largest_dropped_edge"] == 0.0, r
        assert r["completeness"]["max_relative_violation"] < 1e-5, r


# ----------------------------------------------------------------------------- exactness
def _files_reconstruction(d: Path, x: list[torch.Tensor], act: str) -> list[torch.Tensor]:
    """Reconstruction of every MLP output straight from the safetensors files (independent of
    the loader): recon_k = sum_{l<=k} act(x_l W_enc_l^T + b_enc_l) W_dec_l[:, k-l] + b_dec_k."""
    from safetensors.torch import load_file

    L = len(x)
    enc = [load_file(str(d / f"W_enc_{l}.safetensors")) for l in range(L)]
    dec = [load_file(str(d / f"W_dec_{l}.safetensors"))[f"W_dec_{l}"] for l in range(L)]
    acts = []
    for l in range(L):
        h = x[l] @ enc[l][f"W_enc_{l}"].T + enc[l][f"b_enc_{l}"]
        a = h * (h > enc[l][f"threshold_{l}"]) if act == "jump_relu" else torch.relu(h)
        a[0] = 0  # position 0 (BOS) is a constant, as in circuit-tracer
        acts.append(a)
    out = []
    for k in range(L):
        r = enc[k][f"b_dec_{k}"].clone().expand_as(x[k]).clone()
        for l in range(k + 1):
            r = r + acts[l] @ dec[l][:, k - l]
        out.append(r)
    return out


@pytest.mark.parametrize("arch", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("act", ["relu", "jump_relu"])
def test_clt_errors_and_writes_match_the_files(tmp_path, arch, act):
    """Error node of layer k = real MLP output minus the reconstruction computed from the files;
    a CLT feature of layer l writes a_j W_dec_l[j, k-l] at every k >= l."""
    adapter, clt, d = _clt(tmp_path, arch, activation=act)
    g = attribute(adapter, TOKENS, clt)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    ctx = g.context
    lin = ctx.linearisation
    L = adapter.facts.n_layers
    recon = _files_reconstruction(d, [lin.resid_mid[l] for l in range(L)], act)
    for k in range(L):
        for t in range(1, len(TOKENS)):
            (write,) = ctx.writes(_node(g, "error", k, t, 0))
            torch.testing.assert_close(write.vector, lin.mlp_out[k][t] - recon[k][t], atol=2e-5, rtol=0)
    from safetensors.torch import load_file

    feats = [n for n in g.nodes if n.kind == "feature"]
    assert {n.layer for n in feats} == set(range(L))
    for n in feats[:: max(1, len(feats) // 6)]:
        writes = ctx.writes(n.id)
        assert [w.location for w in writes] == [ResidualLocation.resid_post(k) for k in range(n.layer, L)]
        W_dec = load_file(str(d / f"W_dec_{n.layer}.safetensors"))[f"W_dec_{n.layer}"]
        for w in writes:
            k = w.location.layer
            torch.testing.assert_close(w.vector, n.activation * W_dec[n.index, k - n.layer], atol=1e-6, rtol=1e-5)


def _node(g, kind, layer, pos, index):
    from circuitgraph.graph.nodes import NodeId

    return NodeId(kind, layer, pos, index)


@pytest.mark.parametrize("arch,act,skip", [(GPT2, "topk", True), (LLAMA, "jump_relu", True), (GPT2, "relu", False)],
                         ids=["gpt2-topk-skip", "llama-jumprelu-skip", "gpt2-relu"])
def test_clt_edges_equal_frozen_model_interventions(tmp_path, arch, act, skip):
    """Removing a CLT feature from every downstream MLP output of the frozen real model changes
    each reader by exactly the edge (no engine code involved)."""
    from circuitgraph.validation.frozen import frozen_reader_values

    adapter, clt, _ = _clt(tmp_path, arch, activation=act, skip=skip)
    g = attribute(adapter, TOKENS, clt)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    ctx = g.context
    base = frozen_reader_values(ctx)
    scale = float(np.abs(g.edge_weight).max())
    feats = [n.id for n in g.nodes if n.kind == "feature" and n.layer < adapter.facts.n_layers - 1][:4]
    assert feats
    edges = {(g.nodes[t].id, g.nodes[s].id): w for t, s, w in zip(g.edge_target, g.edge_source, g.edge_weight, strict=False)}
    for f in feats:
        after = frozen_reader_values(ctx, [f])
        for r, v in base.items():
            assert abs((v - after[r]) - edges.get((r, f), 0.0)) < 1e-5 * scale, (f, r)


def test_prompt_with_no_active_feature_at_the_end(tmp_path):
    """circuit-tracer 0.5.0 crashes when the last positions have no active feature; circuitgraph
    builds the graph (errors carry the MLP outputs) and stays exact."""
    model = tiny_model(**GPT2)
    raw = random_clt(model, activation="jump_relu")
    for t in raw["layers"]:
        t["threshold"] = torch.full_like(t["threshold"], 1e6)  # nothing fires anywhere
    d = save_clt(tmp_path / "clt", raw)
    adapter = ModelAdapter(model)
    g = attribute(adapter, TOKENS, load_dictionaries(d, adapter))
    assert not [n for n in g.nodes if n.kind == "feature"]
    assert sum(n.kind == "error" for n in g.nodes) == 3 * (len(TOKENS) - 1)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5


def test_lazy_reads_only_active_rows(tmp_path):
    adapter, clt, d = _clt(tmp_path, GPT2)
    assert clt.lazy is False and clt.resident_bytes() < 4 * 3 * 32 * 16 * 2  # small: encoders cached on use
    from circuitgraph.dictionaries.clt import load_clt_dir

    lazy = load_clt_dir(d, adapter, lazy=True)
    g1 = attribute(adapter, TOKENS, lazy)
    g2 = attribute(adapter, TOKENS, clt)
    assert lazy._enc == {}  # nothing kept
    np.testing.assert_array_equal(g1.edge_weight, g2.edge_weight)
    rows = lazy.decoder_rows(1, torch.tensor([5, 2, 5]))
    assert rows.shape == (3, 2, 16) and torch.equal(rows[0], rows[2])


# ----------------------------------------------------------------------------- spec, metadata, formats
def _spec(tmp_path: Path, model_dir: Path, tc_dir: Path, extra: str = "") -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(
        "format_version: 1\n"
        f"model: {{path: {model_dir}}}\n"
        f"transcoders: {{path: {tc_dir}{extra}}}\n"
        f"prompt: {{tokens: {TOKENS}}}\n"
        "targets: [{top_logits: {max_n: 3}}]\n"
        f"export: {{json: {tmp_path / 'out' / 'graph.json'}}}\n"
    )
    return p


def test_spec_detects_the_clt_format(tmp_path):
    from circuitgraph.pipeline.runner import run
    from circuitgraph.spec import load_spec

    model = tiny_model(**GPT2)
    bundle = save_bundle(tmp_path / "b", model)
    d = save_clt(tmp_path / "clt", random_clt(model))
    assert detect_format(d) == "circuit_tracer_clt"
    result = run(load_spec(_spec(tmp_path, bundle / "model", d)))
    meta = result.graph.metadata["transcoders"]
    assert meta["format"] == "circuit_tracer_clt" and meta["kind"] == "cross_layer_transcoder"
    assert json.loads((tmp_path / "out" / "graph.json").read_text())["metadata"]["transcoders"]["format"] == \
        "circuit_tracer_clt"


def _break(d: Path, what: str) -> str:
    """Damage a saved CLT; returns the file name the error must name."""
    from safetensors.torch import load_file, save_file

    if what == "missing layer file":
        (d / "W_dec_2.safetensors").unlink()
        return "W_dec_2.safetensors"
    if what == "wrong shape":
        t = load_file(str(d / "W_dec_1.safetensors"))
        save_file({"W_dec_1": t["W_dec_1"][:, :1].contiguous()}, str(d / "W_dec_1.safetensors"))
        return "W_dec_1.safetensors"
    if what == "unknown hook":
        (d / "config.yaml").write_text((d / "config.yaml").read_text().replace("hook_resid_mid", "hook_foo"))
        return "config.yaml"
    if what == "NaN weights":
        t = load_file(str(d / "W_enc_1.safetensors"))
        t["W_enc_1"][3, 2] = float("nan")
        save_file(t, str(d / "W_enc_1.safetensors"))
        return "W_enc_1.safetensors"
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["missing layer file", "wrong shape", "unknown hook", "NaN weights"])
def test_bad_clt_is_one_line_naming_the_file_and_no_output(tmp_path, what):
    from typer.testing import CliRunner

    from circuitgraph.cli import main as cli

    model = tiny_model(**GPT2)
    bundle = save_bundle(tmp_path / "b", model)
    d = save_clt(tmp_path / "clt", random_clt(model))
    fname = _break(d, what)
    adapter = ModelAdapter(model)
    with pytest.raises((LoadError, ShapeMismatchError, NumericalError)) as info:
        attribute(adapter, TOKENS, load_dictionaries(d, adapter))
    msg = str(info.value)
    assert fname in msg and "\n" not in msg
    res = CliRunner().invoke(cli.app, ["run", str(_spec(tmp_path, bundle / "model", d))])
    assert res.exit_code == 2, res.output
    assert fname in res.output
    assert not (tmp_path / "out").exists()


def test_format_key_must_match_the_directory(tmp_path):
    model = tiny_model(**GPT2)
    d = save_clt(tmp_path / "clt", random_clt(model))
    with pytest.raises(LoadError, match="format"):
        load_dictionaries(d, ModelAdapter(model), format="saelens")


def test_clt_needs_transcoders_at_every_layer(tmp_path):
    from circuitgraph.errors import AttributionError

    adapter, clt, _ = _clt(tmp_path, GPT2)
    with pytest.raises(AttributionError, match="cross-layer"):
        attribute(adapter, TOKENS, clt, mlp={0: "transcoders", 1: "neurons", 2: "transcoders"})


# ----------------------------------------------------------------------------- interventions
def _file_hooks(d: Path, adapter: ModelAdapter, L: int, act: str, *, zero_feature=None, zero_error_at=()):
    """Independent TransformerLens hooks from the files: zero one CLT feature (l, t, j) in every
    MLP output k >= l, or replace MLP outputs by their reconstruction (error zeroed)."""
    from safetensors.torch import load_file

    enc = [load_file(str(d / f"W_enc_{l}.safetensors")) for l in range(L)]
    dec = [load_file(str(d / f"W_dec_{l}.safetensors"))[f"W_dec_{l}"] for l in range(L)]
    live: dict[int, torch.Tensor] = {}

    def grab(value, hook, l):
        h = value @ enc[l][f"W_enc_{l}"].T + enc[l][f"b_enc_{l}"]
        live[l] = h * (h > enc[l][f"threshold_{l}"]) if act == "jump_relu" else torch.relu(h)
        return value

    def mlp(value, hook, k):
        out = value.clone()
        if zero_feature is not None:
            l, t, j = zero_feature
            if k >= l:
                out[:, t] -= live[l][:, t, j, None] * dec[l][j, k - l]
        if k in zero_error_at:
            recon = enc[k][f"b_dec_{k}"] + sum(live[l] @ dec[l][:, k - l] for l in range(k + 1))
            out = recon.to(value.dtype)
        return out

    from functools import partial

    hooks = [(f"blocks.{l}.hook_resid_mid", partial(grab, l=l)) for l in range(L)]
    return hooks + [(f"blocks.{k}.hook_mlp_out", partial(mlp, k=k)) for k in range(L)]


@pytest.mark.parametrize("arch", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_clt_feature_intervention_writes_into_every_downstream_layer(tmp_path, arch):
    from circuitgraph.validation.interventions import Intervention, Unit, intervene

    adapter, clt, d = _clt(tmp_path, arch, activation="jump_relu")
    L = adapter.facts.n_layers
    g = attribute(adapter, TOKENS, clt)
    f = max((n for n in g.nodes if n.kind == "feature" and n.layer == 0), key=lambda n: n.activation)
    toks = torch.tensor([TOKENS])
    with intervene(adapter, Intervention.zero([Unit("feature", 0, f.position, f.index)]), n_pos=len(TOKENS),
                   transcoders=clt) as model:
        ours = model(toks)
    with adapter.model.hooks(fwd_hooks=_file_hooks(d, adapter, L, "jump_relu",
                                                   zero_feature=(0, f.position, f.index))):
        ref = adapter.model(toks)
    clean = adapter.model(toks)
    assert (ref - clean).abs().max() > 1e-3  # the edit matters
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    # the error of the last layer, zeroed: MLP output = reconstruction from every layer <= k
    with intervene(adapter, Intervention.zero([Unit("error", L - 1, None)]), n_pos=len(TOKENS),
                   transcoders=clt) as model:
        ours = model(toks)
    with adapter.model.hooks(fwd_hooks=_file_hooks(d, adapter, L, "jump_relu", zero_error_at=(L - 1,))):
        ref = adapter.model(toks)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_clt_replacement_model_reconstructs_every_layer(tmp_path):
    from circuitgraph.validation.fidelity import replacement_model

    adapter, clt, d = _clt(tmp_path, LLAMA, activation="relu")
    L = adapter.facts.n_layers
    toks = torch.tensor([TOKENS])
    with replacement_model(adapter, clt) as model:
        ours = model(toks)
    with adapter.model.hooks(fwd_hooks=_file_hooks(d, adapter, L, "relu", zero_error_at=tuple(range(L)))):
        ref = adapter.model(toks)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- the whole pipeline
def test_clt_spec_with_pruning_queries_validation_and_exports(tmp_path):
    import yaml

    from circuitgraph.pipeline.runner import run
    from circuitgraph.spec import load_spec

    model = tiny_model(**GPT2)
    bundle = save_bundle(tmp_path / "b", model)
    raw = random_clt(model)
    raw["config"]["scan"] = "example-org/example-clt"
    d = save_clt(tmp_path / "clt", raw)
    out = tmp_path / "out"
    spec = {
        "format_version": 1,
        "model": {"path": str(bundle / "model")},
        "transcoders": {"path": str(d), "format": "circuit_tracer_clt"},
        "prompt": {"tokens": TOKENS},
        "targets": [{"top_logits": {"max_n": 3}}],
        "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
        "queries": [{"scores": {}}, {"top_paths": {"source": {"kind": "embedding"}, "k": 3}},
                    {"virtual_weights": {"source": {"kind": "feature", "layer": 0},
                                         "target": {"kind": "feature", "layer": 2}, "top_k": 3}},
                    {"congruence": {"tokens": [5], "kind": "feature", "top_k": 3}}],
        "validate": [{"predicted_vs_actual": {"k": 4}}],
        "export": {"json": str(out / "graph.json"), "neuronpedia": str(out / "np.json")},
    }
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec))
    result = run(load_spec(p))
    g = result.graph
    assert g.metadata["transcoders"]["format"] == "circuit_tracer_clt"
    assert {n.kind for n in g.nodes} >= {"feature", "error", "embedding", "logit"}
    np_doc = json.loads((out / "np.json").read_text())
    assert np_doc["metadata"]["scan"] == "example-org/example-clt"
    assert np_doc["metadata"]["transcoder_list"] == []
    types = {n["feature_type"] for n in np_doc["nodes"]}
    assert "cross layer transcoder" in types and "mlp reconstruction error" in types
    doc = json.loads((out / "graph.json").read_text())
    assert doc["metadata"]["transcoders"]["kind"] == "cross_layer_transcoder"
    kinds = [q["kind"] if isinstance(q, dict) and "kind" in q else None for q in result.queries_json()]
    assert len(kinds) == 4
    # a list scan becomes circuit-tracer's custom-<hash> scan with the list in transcoder_list
    from circuitgraph.export.neuronpedia import graph_to_neuronpedia

    g.metadata["transcoders"]["scan"] = ["a/b", "c/d"]
    doc2 = graph_to_neuronpedia(g)
    assert doc2["metadata"]["scan"].startswith("custom-") and doc2["metadata"]["transcoder_list"] == ["a/b", "c/d"]


def test_head_split_of_a_clt_edge_sums_to_the_edge(tmp_path):
    from circuitgraph.queries.head_split import head_split, parts_sum_check

    adapter, clt, _ = _clt(tmp_path, GPT2)
    g = attribute(adapter, TOKENS, clt)
    logit = next(n.id for n in g.nodes if n.kind == "logit")
    srcs = [g.nodes[s].id for t, s in zip(g.edge_target, g.edge_source, strict=False)
            if g.nodes[t].id == logit and g.nodes[s].kind == "feature" and g.nodes[s].layer == 0]
    assert srcs
    for s in srcs[:3]:
        assert parts_sum_check(head_split(g, s, logit)) < 1e-5


def test_the_documented_example_runs():
    text = (REPO / "docs" / "dictionaries.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/dictionaries.md", "exec"), {})


def test_dry_run_counts_the_lazily_read_rows(tmp_path):
    """A wide CLT: the estimate holds the biases, the encoders and the active decoder rows, not
    the files."""
    from circuitgraph.pipeline.estimate import estimate_run
    from circuitgraph.spec import load_spec

    model = tiny_model(**GPT2)
    bundle = save_bundle(tmp_path / "b", model)
    d = save_clt(tmp_path / "clt", random_clt(model, d_transcoder=2048, n_fit_tokens=48))
    est = estimate_run(load_spec(_spec(tmp_path, bundle / "model", d)))
    on_disk = sum(p.stat().st_size for p in d.glob("W_*.safetensors"))
    assert est.d_sae == 2048
    assert 0 < est.bytes_transcoders < on_disk / 2
    assert any("cross-layer transcoder" in n and "read into memory" in n for n in est.notes)
