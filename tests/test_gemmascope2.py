"""GemmaScope-2 transcoders and cross-layer transcoders in their published layouts, on a tiny
Gemma-2-style TransformerLens model (post-norms, soft caps); checked against the raw files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import attribute
from circuitgraph.dictionaries import detect_format, load_dictionaries
from circuitgraph.errors import LoadError, ShapeMismatchError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.testing.synthetic import random_clt, random_layer_dictionary, save_bundle, tiny_model

GEMMA2 = dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True, attn_soft_cap=30.0,
              logit_soft_cap=20.0, n_layers=3)
TOKENS = [1, 5, 7, 9, 4, 3, 11]
#: the model the synthetic GemmaScope-2 files name: the tiny model's (a dictionary must name its model)
GEMMA2_NAME = f"tiny-{GEMMA2['norm']}-{GEMMA2['mlp']}-{GEMMA2['positional']}"
HF_OUT = {"hook_mlp_out": "post_feedforward_layernorm.output", "mlp.hook_out": "mlp.output"}


def _config(layer: int, kind: str, out: str, affine: bool) -> dict:
    return {"hf_hook_point_in": f"model.layers.{layer}.pre_feedforward_layernorm.output",
            "hf_hook_point_out": f"model.layers.{layer}.{HF_OUT[out]}", "width": 0, "l0": 10,
            "model_name": GEMMA2_NAME, "architecture": "jump_relu", "affine_connection": affine,
            "type": kind}


def save_gemmascope2_layers(folder: Path, layers: list[dict], out: str = "hook_mlp_out") -> Path:
    """Per-layer transcoders as google/gemma-scope-2-*/transcoder_all/ holds them."""
    for i, t in enumerate(layers):
        d = folder / (f"layer_{i}_width_16k_l0_small" + ("_affine" if "W_skip" in t else ""))
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(_config(i, "transcoder", out, "W_skip" in t)))
        tensors = {"w_enc": t["W_enc"], "b_enc": t["b_enc"], "threshold": t["threshold"], "w_dec": t["W_dec"],
                   "b_dec": t["b_dec"]}
        if "W_skip" in t:
            tensors["affine_skip_connection"] = t["W_skip"].T  # used as x @ A
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "params.safetensors"))
    return folder


def save_gemmascope2_clt(folder: Path, raw: dict, out: str = "hook_mlp_out") -> Path:
    """A CLT from random_clt as google/gemma-scope-2-*/clt/width_*/ holds it: w_dec of every layer
    has all n_layers output slots; the slots below the layer hold junk that must be ignored."""
    folder.mkdir(parents=True)
    L = len(raw["layers"])
    skip = "W_skip" in raw["layers"][0]
    (folder / "config.json").write_text(json.dumps(_config(0, "clt", out, skip)))
    for i, t in enumerate(raw["layers"]):
        F, _, D = t["W_dec"].shape
        w_dec = torch.randn(F, L, D) * 100.0  # junk below the diagonal
        w_dec[:, i:] = t["W_dec"]
        tensors = {"w_enc": t["W_enc"].T, "b_enc": t["b_enc"], "threshold": t["threshold"], "w_dec": w_dec,
                   "b_dec": t["b_dec"]}
        if skip:
            tensors["affine_skip_connection"] = t["W_skip"]
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / f"params_layer_{i}.safetensors"))
    return folder


def _cache(model) -> dict:
    L = model.cfg.n_layers
    names = {f"blocks.{k}.{h}" for k in range(L) for h in ("mlp.hook_post", "hook_mlp_out", "ln2.hook_normalized",
                                                           "ln2_post.hook_scale")}
    _, cache = model.run_with_cache(torch.tensor([TOKENS]), names_filter=lambda n: n in names)
    return {k: v[0] for k, v in cache.items()}


def _mlp_input(model, cache, k):
    return cache[f"blocks.{k}.ln2.hook_normalized"] * model.blocks[k].ln2.w


def _through(model, cache, k, v, out):
    """What a write v (at the dictionary's output hook) adds to the residual stream, frozen sigma."""
    if out == "hook_mlp_out":
        return v
    return v / cache[f"blocks.{k}.ln2_post.hook_scale"] * model.blocks[k].ln2_post.w


@pytest.mark.parametrize("out", ["hook_mlp_out", "mlp.hook_out"])
def test_gemmascope2_per_layer_published_layout(tmp_path, out):
    model = tiny_model(**GEMMA2)
    layers = random_layer_dictionary(model, activation="jump_relu", skip=True)
    d = save_gemmascope2_layers(tmp_path / "transcoder_all", layers, out)
    assert detect_format(d) == "gemmascope2"
    adapter = ModelAdapter(model)
    tcs = load_dictionaries(d, adapter)
    assert tcs.format == "gemmascope2" and tcs.output_site(0) == ("mlp_out" if out == "hook_mlp_out"
                                                                   else "before_post_norm")
    g = attribute(adapter, TOKENS, tcs)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    cache = _cache(model)
    for k, t in enumerate(layers):
        x = _mlp_input(model, cache, k)
        h = x @ t["W_enc"] + t["b_enc"]
        recon = (h * (h > t["threshold"])) @ t["W_dec"] + t["b_dec"] + x @ t["W_skip"].T
        for p in range(1, len(TOKENS)):
            (err,) = g.context.writes(NodeId("error", k, p, 0))
            expect = cache[f"blocks.{k}.hook_mlp_out"][p] - _through(model, cache, k, recon, out)[p]
            torch.testing.assert_close(err.vector, expect, atol=2e-5, rtol=0)


def test_gemmascope2_one_variant_per_layer(tmp_path):
    model = tiny_model(**GEMMA2)
    d = save_gemmascope2_layers(tmp_path / "t", random_layer_dictionary(model, activation="jump_relu"))
    save_gemmascope2_layers(tmp_path / "u", random_layer_dictionary(model, activation="jump_relu", seed=1))
    (tmp_path / "u" / "layer_1_width_16k_l0_small").rename(d / "layer_1_width_262k_l0_big")
    with pytest.raises(LoadError) as info:
        load_dictionaries(d, ModelAdapter(model))
    msg = str(info.value)
    assert "layer 1" in msg and "layer_1_width_262k_l0_big" in msg and "\n" not in msg


def _clt_files_reconstruction(raw: dict, x: list[torch.Tensor], k: int) -> torch.Tensor:
    acts = []
    for l in range(k + 1):
        t = raw["layers"][l]
        h = x[l] @ t["W_enc"].T + t["b_enc"]
        acts.append(h * (h > t["threshold"]))
    t = raw["layers"][k]
    r = t["b_dec"] + sum(acts[l] @ raw["layers"][l]["W_dec"][:, k - l] for l in range(k + 1))
    return r + x[k] @ t["W_skip"] if "W_skip" in t else r


@pytest.mark.parametrize("out,skip", [("hook_mlp_out", True), ("mlp.hook_out", False)])
def test_gemmascope2_clt_published_layout(tmp_path, out, skip):
    """Format detected and recorded; the error of every layer = TransformerLens's hook_mlp_out minus
    the reconstruction from the raw files (features of every layer <= k, w_dec[:, k], the MLP input
    read through ln2's gamma); lazy rows give the same graph; frozen-model edges."""
    from circuitgraph.validation.frozen import frozen_reader_values

    model = tiny_model(**GEMMA2)
    raw = random_clt(model, activation="jump_relu", skip=skip, input_site="normalized")
    for l, t in enumerate(raw["layers"]):  # the raw CLT reads the MLP input: gamma * ln2.hook_normalized
        t["W_enc"] = t["W_enc"] / model.blocks[l].ln2.w.detach()
    d = save_gemmascope2_clt(tmp_path / "clt" / ("width_262k_l0_medium" + ("_affine" if skip else "")), raw, out)
    assert detect_format(d) == "gemmascope2_clt"
    adapter = ModelAdapter(model)
    clt = load_dictionaries(d, adapter)
    assert clt.format == "gemmascope2_clt" and clt.kind == "cross_layer"
    g = attribute(adapter, TOKENS, clt)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    assert {n.layer for n in g.nodes if n.kind == "feature"} == {0, 1, 2}
    cache = _cache(model)
    L = model.cfg.n_layers
    x = [_mlp_input(model, cache, k) for k in range(L)]
    for k in range(L):
        recon = _clt_files_reconstruction(raw, x, k)
        for p in range(1, len(TOKENS)):
            (err,) = g.context.writes(NodeId("error", k, p, 0))
            expect = cache[f"blocks.{k}.hook_mlp_out"][p] - _through(model, cache, k, recon, out)[p]
            torch.testing.assert_close(err.vector, expect, atol=3e-5, rtol=0)
    lazy = attribute(adapter, TOKENS, load_dictionaries(d, adapter, lazy=True))
    np.testing.assert_array_equal(lazy.edge_weight, g.edge_weight)
    ctx = g.context
    base = frozen_reader_values(ctx)
    scale = float(np.abs(g.edge_weight).max())
    edges = {(g.nodes[t].id, g.nodes[s].id): w for t, s, w in zip(g.edge_target, g.edge_source, g.edge_weight, strict=False)}
    for f in [n.id for n in g.nodes if n.kind == "feature" and n.layer == 0][:3]:
        after = frozen_reader_values(ctx, [f])
        for r, v in base.items():
            assert abs((v - after[r]) - edges.get((r, f), 0.0)) < 1e-5 * scale, (f, r)


def test_circuit_tracer_config_listing_gemmascope2_clt_files(tmp_path, monkeypatch):
    """circuit-tracer's GemmaScope-2 CLT configs (model_kind: cross_layer_transcoder + transcoders: the
    params_layer_<i> files, hooks in its TransformerLens names): locally, and through the hub cache as
    a config repository listing hf:// files of the weights repository."""
    import huggingface_hub.constants

    from circuitgraph.dictionaries.hub import load_hf_dictionaries
    from circuitgraph.testing.synthetic import hf_cache_repo

    model = tiny_model(**GEMMA2)
    raw = random_clt(model, activation="jump_relu", skip=True, input_site="normalized")
    weights = tmp_path / "google" / "clt" / "width_16k_l0_small_affine"
    save_gemmascope2_clt(weights, raw)
    adapter = ModelAdapter(model)
    ref = attribute(adapter, TOKENS, load_dictionaries(weights, adapter))
    ct = {"model_kind": "cross_layer_transcoder", "feature_input_hook": "mlp.hook_in",
          "feature_output_hook": "hook_mlp_out", "scan": "example/scan"}
    (weights / "config.yaml").write_text(yaml.safe_dump({**ct, "transcoders": [
        f"params_layer_{i}.safetensors" for i in range(3)]}))
    assert detect_format(weights) == "circuit_tracer_clt"
    local = load_dictionaries(weights, adapter)
    assert local.format == "circuit_tracer_clt" and local.describe()["scan"] == "example/scan"
    np.testing.assert_array_equal(attribute(adapter, TOKENS, local).edge_weight, ref.edge_weight)
    (weights / "config.yaml").unlink()
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hf_cache_repo(cache, "example-google/gemma-scope-2-tiny-pt", tmp_path / "google")
    cfg = tmp_path / "config-repo" / "clt" / "width_16k_l0_small_affine"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({**ct, "transcoders": [
        f"hf://example-google/gemma-scope-2-tiny-pt/clt/width_16k_l0_small_affine/params_layer_{i}.safetensors"
        for i in range(3)]}))
    hf_cache_repo(cache, "example-org/gemma-scope-2-tiny-pt", tmp_path / "config-repo")
    hub = load_hf_dictionaries("example-org/gemma-scope-2-tiny-pt/clt/width_16k_l0_small_affine", adapter)
    np.testing.assert_array_equal(attribute(adapter, TOKENS, hub).edge_weight, ref.edge_weight)


def test_gemmascope2_clt_through_the_spec(tmp_path):
    from circuitgraph.pipeline.runner import run
    from circuitgraph.spec import load_spec

    model = tiny_model(**GEMMA2)
    raw = random_clt(model, activation="jump_relu", input_site="normalized")
    d = save_gemmascope2_clt(tmp_path / "clt", raw)
    bundle = save_bundle(tmp_path / "b", model)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "format_version": 1, "model": {"path": str(bundle / "model")},
        "transcoders": {"path": str(d), "format": "gemmascope2_clt"},
        "prompt": {"tokens": TOKENS}, "targets": [{"top_logits": {"max_n": 2}}]}))
    result = run(load_spec(spec))
    assert result.graph.metadata["transcoders"]["format"] == "gemmascope2_clt"
    assert result.graph.metadata["completeness"]["max_relative_violation"] < 1e-5


@pytest.mark.parametrize("what", ["missing layer file", "wrong shape", "not a clt", "unknown hook point", "NaN weights"])
def test_bad_gemmascope2_clt_is_one_line_and_no_output(tmp_path, what):
    """Before any output: one line naming the file, CLI exit 2 (NaN in the lazily read encoder is
    found when it is read, still before anything is written)."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from circuitgraph.cli import main as cli
    from circuitgraph.errors import NumericalError

    model = tiny_model(**GEMMA2)
    d = save_gemmascope2_clt(tmp_path / "clt", random_clt(model, activation="jump_relu"))
    f = d / "params_layer_1.safetensors"
    if what == "missing layer file":
        f.unlink()
    elif what in ("wrong shape", "NaN weights"):
        t = load_file(str(f))
        if what == "wrong shape":
            t["w_dec"] = t["w_dec"][:, 1:].contiguous()
        else:
            t["w_enc"][2, 3] = float("nan")
        save_file(t, str(f))
    else:
        cfg = json.loads((d / "config.json").read_text())
        cfg = {**cfg, "type": "crosscoder"} if what == "not a clt" else \
            {**cfg, "hf_hook_point_in": "model.layers.0.self_attn.o_proj.input"}
        (d / "config.json").write_text(json.dumps(cfg))
        f = d / "config.json"
    adapter = ModelAdapter(model)
    with pytest.raises((LoadError, ShapeMismatchError, NumericalError)) as info:
        attribute(adapter, TOKENS, load_dictionaries(d, adapter))
    assert f.name in str(info.value) and "\n" not in str(info.value)
    bundle = save_bundle(tmp_path / "b", model)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "format_version": 1, "model": {"path": str(bundle / "model")}, "transcoders": {"path": str(d)},
        "prompt": {"tokens": TOKENS}, "targets": [{"top_logits": {"max_n": 2}}],
        "export": {"json": str(tmp_path / "out" / "g.json")}}))
    res = CliRunner().invoke(cli.app, ["run", str(spec)])
    assert res.exit_code == 2, res.output
    assert f.name in res.output
    assert not (tmp_path / "out").exists()


def test_dry_run_counts_the_clt_rows_not_the_files(tmp_path):
    from circuitgraph.dictionaries.formats import dictionary_footprint

    model = tiny_model(**GEMMA2)
    d = save_gemmascope2_clt(tmp_path / "clt", random_clt(model, activation="jump_relu", d_transcoder=1024,
                                                          n_fit_tokens=48))
    d_sae, on_disk, in_memory, note = dictionary_footprint(d)
    assert d_sae == 1024 and in_memory < on_disk / 3  # encoders + biases; no decoder (3 output slots per row)
    assert note.startswith("cross-layer transcoder") and "read into memory" in note
