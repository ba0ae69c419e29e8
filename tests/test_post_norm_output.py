"""Dictionaries that write before Gemma-2's post-MLP norm (circuit-tracer's ``mlp.hook_out``).

TransformerLens's ``hook_mlp_out`` is ``ln2_post(mlp(x))``; such a dictionary reconstructs
``mlp(x)`` itself.  With the norm's sigma frozen, a write ``v`` reaches the residual stream as
``gamma * v / sigma(t)``.  Every check here recomputes that from the raw files and TransformerLens's
own cached values (``mlp.hook_post @ W_out + b_out`` is the MLP output before the norm).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import ResidualLocation, attribute
from circuitgraph.dictionaries import load_dictionaries
from circuitgraph.graph.nodes import NodeId
from circuitgraph.testing.synthetic import (
    random_clt,
    random_layer_dictionary,
    save_clt,
    save_layer_dictionary,
    tiny_model,
)

GEMMA2 = dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True, attn_soft_cap=30.0,
              logit_soft_cap=20.0, n_layers=3)
TOKENS = [1, 5, 7, 9, 4, 3, 11]


def _gemma_clt(tmp_path: Path, **kwargs):
    model = tiny_model(**GEMMA2)
    raw = random_clt(model, **kwargs)
    raw["config"]["feature_output_hook"] = "mlp.hook_out"
    d = save_clt(tmp_path / "clt", raw)
    adapter = ModelAdapter(model)
    return adapter, load_dictionaries(d, adapter), raw


def _pre_norm_mlp_out(model, cache: dict, k: int) -> torch.Tensor:
    """The MLP's own output (before ln2_post), from TransformerLens's hook_post and weights."""
    mlp = model.blocks[k].mlp
    return cache[f"blocks.{k}.mlp.hook_post"] @ mlp.W_out + mlp.b_out


def _post_norm(model, k: int, x: torch.Tensor, sigma: torch.Tensor | None = None) -> torch.Tensor:
    """Gemma's RMS post-norm of layer k by hand: ``w * x / sigma`` (sigma recomputed unless given)."""
    n = model.blocks[k].ln2_post
    if sigma is None:
        sigma = (x.pow(2).mean(-1, keepdim=True) + n.eps).sqrt()
    return x / sigma * n.w


def _files_acts(raw: dict, x: list[torch.Tensor], act: str) -> list[torch.Tensor]:
    out = []
    for l, t in enumerate(raw["layers"]):
        h = x[l] @ t["W_enc"].T + t["b_enc"]
        out.append(h * (h > t["threshold"]) if act == "jump_relu" else torch.relu(h))
    return out


def _files_recon(raw: dict, acts: list[torch.Tensor], x: list[torch.Tensor], k: int) -> torch.Tensor:
    """The CLT's reconstruction of MLP output k (before the post-norm), from the raw tensors."""
    t = raw["layers"][k]
    r = t["b_dec"] + sum(acts[l] @ raw["layers"][l]["W_dec"][:, k - l] for l in range(k + 1))
    return r + x[k] @ t["W_skip"] if "W_skip" in t else r


@pytest.mark.parametrize("act,skip", [("jump_relu", True), ("relu", False)], ids=["jumprelu-skip", "relu"])
def test_clt_writing_before_the_post_norm_is_exact(tmp_path, act, skip):
    """Completeness, error = hook_mlp_out - frozen-norm image of the files' reconstruction, and
    feature writes = gamma * a * W_dec / sigma_post, against TransformerLens's cached values."""
    adapter, clt, raw = _gemma_clt(tmp_path, activation=act, skip=skip, input_site="normalized")
    assert clt.output_site(0) == "before_post_norm" and clt.hook_out(1) == "blocks.1.mlp.hook_out"
    g = attribute(adapter, TOKENS, clt)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    assert clt.describe()["output_site"] == "before_post_norm"
    model, L = adapter.model, adapter.facts.n_layers
    names = {f"blocks.{k}.{h}" for k in range(L) for h in ("mlp.hook_post", "hook_mlp_out", "ln2.hook_normalized",
                                                           "ln2_post.hook_scale")}
    _, cache = model.run_with_cache(torch.tensor([TOKENS]), names_filter=lambda n: n in names)
    cache = {k: v[0] for k, v in cache.items()}
    x = [cache[f"blocks.{k}.ln2.hook_normalized"] for k in range(L)]
    acts = _files_acts(raw, x, act)
    ctx = g.context
    for k in range(L):
        sigma = cache[f"blocks.{k}.ln2_post.hook_scale"]
        pre = _pre_norm_mlp_out(model, cache, k)
        # the norm really is there: TransformerLens's output is the normalised MLP output
        torch.testing.assert_close(cache[f"blocks.{k}.hook_mlp_out"], _post_norm(model, k, pre, sigma),
                                   atol=1e-5, rtol=1e-5)
        recon = _files_recon(raw, acts, x, k)
        for t in range(1, len(TOKENS)):
            (err,) = ctx.writes(NodeId("error", k, t, 0))
            expect = cache[f"blocks.{k}.hook_mlp_out"][t] - (recon[t] / sigma[t] * model.blocks[k].ln2_post.w)
            torch.testing.assert_close(err.vector, expect, atol=2e-5, rtol=0)
            # hook_mlp_out = post-norm image of (features + error-in-pre-norm-space): the reconstruction
            # plus the error through the frozen norm gives TransformerLens's value back
            torch.testing.assert_close(err.vector + recon[t] / sigma[t] * model.blocks[k].ln2_post.w,
                                       cache[f"blocks.{k}.hook_mlp_out"][t], atol=2e-5, rtol=0)
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert {n.layer for n in feats} == set(range(L))
    for n in feats[:: max(1, len(feats) // 8)]:
        writes = ctx.writes(n.id)
        assert [w.location for w in writes] == [ResidualLocation.resid_post(k) for k in range(n.layer, L)]
        for w in writes:
            k = w.location.layer
            sigma = cache[f"blocks.{k}.ln2_post.hook_scale"][n.position]
            expect = n.activation * raw["layers"][n.layer]["W_dec"][n.index, k - n.layer] / sigma * \
                model.blocks[k].ln2_post.w
            torch.testing.assert_close(w.vector, expect, atol=1e-6, rtol=1e-5)


def test_clt_before_post_norm_edges_equal_frozen_model_interventions(tmp_path):
    """Removing a feature from the frozen real model (recorded MLP outputs, skip path through the
    frozen post-norm) changes each reader by exactly the edge."""
    from circuitgraph.validation.frozen import frozen_reader_values

    adapter, clt, _ = _gemma_clt(tmp_path, activation="jump_relu", skip=True)
    g = attribute(adapter, TOKENS, clt)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    ctx = g.context
    base = frozen_reader_values(ctx)
    scale = float(np.abs(g.edge_weight).max())
    edges = {(g.nodes[t].id, g.nodes[s].id): w for t, s, w in zip(g.edge_target, g.edge_source, g.edge_weight, strict=False)}
    feats = [n.id for n in g.nodes if n.kind == "feature" and n.layer < adapter.facts.n_layers - 1][:4]
    errors = [n.id for n in g.nodes if n.kind == "error" and n.layer == 0][:2]
    assert feats and errors
    for f in feats + errors:
        after = frozen_reader_values(ctx, [f])
        for r, v in base.items():
            assert abs((v - after[r]) - edges.get((r, f), 0.0)) < 1e-5 * scale, (f, r)


def _independent_hooks(raw: dict, model, L: int, act: str, *, feature=None, sigma=None, replace=False):
    """TransformerLens hooks that edit hook_mlp_out from the files: the MLP output before the norm
    (hook_post @ W_out + b_out) minus one feature's writes (or replaced by the reconstruction),
    normalised again (sigma recomputed, or the given frozen sigmas)."""
    live: dict[str, torch.Tensor] = {}

    def keep(value, hook):
        live[hook.name] = value
        return value

    def out(value, hook, k):
        pre = live[f"blocks.{k}.mlp.hook_post"] @ model.blocks[k].mlp.W_out + model.blocks[k].mlp.b_out
        x = [live[f"blocks.{l}.ln2.hook_normalized"] for l in range(k + 1)]
        acts = _files_acts({"layers": raw["layers"][: k + 1]}, x, act)
        if feature is not None:
            l, t, j = feature
            if k >= l:
                pre = pre.clone()
                pre[:, t] -= acts[l][:, t, j, None] * raw["layers"][l]["W_dec"][j, k - l]
        if replace:
            pre = _files_recon(raw, acts, x, k)
        return _post_norm(model, k, pre, None if sigma is None else sigma[k][None, :, None]).to(value.dtype)

    hooks = []
    for k in range(L):
        hooks += [(f"blocks.{k}.ln2.hook_normalized", keep), (f"blocks.{k}.mlp.hook_post", keep)]
    return hooks + [(f"blocks.{k}.hook_mlp_out", partial(out, k=k)) for k in range(L)]


@pytest.mark.parametrize("frozen_sigma", [False, True], ids=["live-norm", "frozen-norm"])
def test_feature_intervention_splices_before_the_post_norm(tmp_path, frozen_sigma):
    """Zeroing a feature through validation's interventions (spliced before ln2_post, the norm then
    renormalises -- or keeps its frozen sigma inside ``frozen``) equals the independent edit."""
    from circuitgraph.attribution.linearisation import frozen, linearise
    from circuitgraph.validation.interventions import Intervention, Unit, intervene

    adapter, clt, raw = _gemma_clt(tmp_path, activation="jump_relu", input_site="normalized")
    model, L = adapter.model, adapter.facts.n_layers
    g = attribute(adapter, TOKENS, clt)
    f = max((n for n in g.nodes if n.kind == "feature" and n.layer == 0), key=lambda n: n.activation)
    toks = torch.tensor([TOKENS])
    iv = Intervention.zero([Unit("feature", 0, f.position, f.index)])
    lin = linearise(adapter, torch.tensor(TOKENS), clt)
    sigma = [lin.sigma[("ln2_post", k)] for k in range(L)] if frozen_sigma else None
    ref_hooks = _independent_hooks(raw, model, L, "jump_relu", feature=(0, f.position, f.index), sigma=sigma)
    if frozen_sigma:
        with frozen(adapter, lin), intervene(adapter, iv, n_pos=len(TOKENS), transcoders=clt) as m:
            ours = m(toks)
        with frozen(adapter, lin, extra_hooks=ref_hooks) as m:
            ref = m(toks)
        with frozen(adapter, lin) as m:
            clean = m(toks)
    else:
        with intervene(adapter, iv, n_pos=len(TOKENS), transcoders=clt) as m:
            ours = m(toks)
        with model.hooks(fwd_hooks=ref_hooks):
            ref = model(toks)
        clean = model(toks)
    assert (ref - clean).abs().max() > 1e-3  # the edit matters
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_replacement_model_reconstructs_before_the_post_norm(tmp_path):
    from circuitgraph.validation.fidelity import replacement_model

    adapter, clt, raw = _gemma_clt(tmp_path, activation="relu", input_site="normalized")
    model, L = adapter.model, adapter.facts.n_layers
    toks = torch.tensor([TOKENS])
    with replacement_model(adapter, clt) as m:
        ours = m(toks)
    with model.hooks(fwd_hooks=_independent_hooks(raw, model, L, "relu", replace=True)):
        ref = model(toks)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_per_layer_transcoders_writing_before_the_post_norm(tmp_path):
    """circuit-tracer's transcoder_set (mlp.hook_in -> mlp.hook_out, JumpReLU + skip) on a
    Gemma-2-style model: completeness and the error against the raw files."""
    model = tiny_model(**GEMMA2)
    layers = random_layer_dictionary(model, activation="jump_relu", skip=True)
    d = save_layer_dictionary(tmp_path / "ts", layers, "circuit_tracer_transcoder_set")
    assert yaml.safe_load((d / "config.yaml").read_text())["feature_output_hook"] == "mlp.hook_out"
    adapter = ModelAdapter(model)
    tcs = load_dictionaries(d, adapter)
    assert tcs.output_site(1) == "before_post_norm" and tcs[1].hook_out == "blocks.1.mlp.hook_out"
    g = attribute(adapter, TOKENS, tcs)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    L = adapter.facts.n_layers
    names = {f"blocks.{k}.{h}" for k in range(L) for h in ("mlp.hook_post", "hook_mlp_out", "ln2.hook_normalized",
                                                           "ln2_post.hook_scale")}
    _, cache = model.run_with_cache(torch.tensor([TOKENS]), names_filter=lambda n: n in names)
    cache = {k: v[0] for k, v in cache.items()}
    for k, t in enumerate(layers):
        x = cache[f"blocks.{k}.ln2.hook_normalized"] * model.blocks[k].ln2.w  # the MLP input (mlp.hook_in)
        h = x @ t["W_enc"] + t["b_enc"]
        recon = (h * (h > t["threshold"])) @ t["W_dec"] + t["b_dec"] + x @ t["W_skip"].T
        sigma = cache[f"blocks.{k}.ln2_post.hook_scale"]
        for p in range(1, len(TOKENS)):
            (err,) = g.context.writes(NodeId("error", k, p, 0))
            expect = cache[f"blocks.{k}.hook_mlp_out"][p] - recon[p] / sigma[p] * model.blocks[k].ln2_post.w
            torch.testing.assert_close(err.vector, expect, atol=2e-5, rtol=0)


def test_virtual_hook_is_the_mlp_output_before_the_norm():
    model = tiny_model(**GEMMA2)
    adapter = ModelAdapter(model)
    assert adapter.has_hook("blocks.2.mlp.hook_out") and not adapter.has_hook("blocks.3.mlp.hook_out")
    names = {"blocks.1.mlp.hook_out", "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out"}
    logits, cache = adapter.run_with_cache(torch.tensor([TOKENS]), names)
    torch.testing.assert_close(cache["blocks.1.mlp.hook_out"], _pre_norm_mlp_out(model, cache, 1))
    torch.testing.assert_close(logits, model(torch.tensor([TOKENS])))
    assert not ModelAdapter(tiny_model(norm="RMS", mlp="gated", positional="rotary")).has_hook("blocks.0.mlp.hook_out")


@pytest.mark.parametrize("input_site", ["mlp_input", "normalized"])
def test_saelens_transcoders_writing_mlp_hook_out(tmp_path, input_site):
    """sae-lens-format transcoders whose hook_name_out is blocks.<l>.mlp.hook_out (JumpReLU + skip)
    on a Gemma-2-style model write before the post-MLP norm, as the per-layer formats do:
    completeness, activations = sae-lens's own encode, and each error = hook_mlp_out minus the
    post-norm image of the reconstruction computed here from the sae-lens tensors; on a model
    without post-norms the same hook is hook_mlp_out."""
    from circuitgraph.testing.synthetic import random_transcoders, save_bundle

    model = tiny_model(**GEMMA2)
    tcs = random_transcoders(model, d_sae=24, kind="jumprelu_skip", input_site=input_site, output_hook="mlp.hook_out")
    bundle = save_bundle(tmp_path / "b", model, tcs)
    adapter = ModelAdapter(model)
    loaded = load_dictionaries(bundle / "transcoders", adapter)
    assert all(loaded.output_site(k) == "before_post_norm" for k in tcs)
    assert loaded[1].hook_out == "blocks.1.mlp.hook_out"
    g = attribute(adapter, TOKENS, loaded)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    L = adapter.facts.n_layers
    names = {f"blocks.{k}.{h}" for k in range(L) for h in ("hook_mlp_out", "ln2.hook_normalized", "ln2_post.hook_scale")}
    _, cache = model.run_with_cache(torch.tensor([TOKENS]), names_filter=lambda n: n in names)
    cache = {k: v[0] for k, v in cache.items()}
    feats = [n for n in g.nodes if n.kind == "feature"]
    assert {n.layer for n in feats} == set(range(L))
    for k, tc in tcs.items():
        x = cache[f"blocks.{k}.ln2.hook_normalized"]
        if input_site == "mlp_input":
            x = x * model.blocks[k].ln2.w  # the MLP input (RMSNorm: no bias)
        with torch.no_grad():
            acts = tc.encode(x)
            recon = acts @ tc.W_dec + tc.b_dec + x @ tc.W_skip.T
        for n in (n for n in feats if n.layer == k):
            assert abs(n.activation - float(acts[n.position, n.index])) < 1e-5, n.id
        sigma = cache[f"blocks.{k}.ln2_post.hook_scale"]
        for p in range(1, len(TOKENS)):
            (err,) = g.context.writes(NodeId("error", k, p, 0))
            expect = cache[f"blocks.{k}.hook_mlp_out"][p] - recon[p] / sigma[p] * model.blocks[k].ln2_post.w
            torch.testing.assert_close(err.vector, expect, atol=2e-5, rtol=0)
    # no post-norm: mlp.hook_out is hook_mlp_out itself
    plain = tiny_model(norm="RMS", mlp="gated", positional="rotary", n_layers=2)
    d = save_bundle(tmp_path / "p", plain, random_transcoders(plain, d_sae=24, output_hook="mlp.hook_out"))
    plain_tcs = load_dictionaries(d / "transcoders", ModelAdapter(plain))
    assert plain_tcs.output_site(0) == "mlp_out" and plain_tcs[0].hook_out == "blocks.0.hook_mlp_out"
    g = attribute(ModelAdapter(plain), TOKENS, plain_tcs)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
