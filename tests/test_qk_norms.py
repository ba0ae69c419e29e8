"""QK attribution on models with query/key norms: each norm's sigma is frozen per head and position
(per position over the whole projection for the OLMo family, tested on OLMoE in test_moe.py), so
q and k stay affine in the residual stream and the pairs plus constants equal the model's own
pre-softmax score (TransformerLens's ``hook_attn_scores``, read from its cache)."""

from __future__ import annotations

import pytest
import torch

from circuitgraph.adapters import ModelAdapter
from circuitgraph.adapters.hf_config import load_snapshot
from circuitgraph.attribution import attribute
from circuitgraph.attribution.linearisation import linearise
from circuitgraph.queries.qk import qk, qk_decomposition, qk_norm_scale
from circuitgraph.testing.hf_moe import moe_checkpoint
from circuitgraph.testing.synthetic import tiny_config, tiny_model

TOKENS = [1, 5, 7, 9, 4, 3, 11, 6]

#: TransformerLens-native variants with per-head q/k norms (and non-zero b_Q, b_K)
NATIVE = {
    "qwen3-style": dict(norm="RMS", mlp="gated", positional="rotary"),
    "qwen3-style-gqa": dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2),
    "gemma3-style": dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True, n_kv_heads=2),
    "learned-positions": dict(norm="LN", mlp="gelu", positional="learned"),
}


def _native(variant: str, dtype: torch.dtype):
    cfg = tiny_config(**NATIVE[variant])
    cfg.use_qk_norm, cfg.dtype = True, dtype
    return tiny_model(cfg)


def _check_scores(adapter: ModelAdapter, dtype: torch.dtype, tol: float) -> None:
    g = attribute(adapter, TOKENS, mlp="neurons", dtype=dtype)
    _, cache = adapter.model.run_with_cache(torch.tensor([TOKENS]))
    n = 0
    for layer in range(adapter.facts.n_layers):
        for key in ("top", 0, 3):
            for h in qk(g, layer=layer, head=list(range(adapter.facts.n_heads)), query_position=-1,
                        key_position=key).heads:
                s = float(cache[f"blocks.{layer}.attn.hook_attn_scores"][0, h.head, h.query_position, h.key_position])
                assert abs(h.score - s) < tol * max(1.0, abs(s))
                for total in (h.pairs_sum_plus_constant, h.query_marginals_sum_plus_constant,
                              h.key_marginals_sum_plus_constant):
                    assert abs(total - s) < tol * max(1.0, abs(s)), (layer, h.head, key, total, s)
                n += 1
    assert n == adapter.facts.n_layers * 3 * adapter.facts.n_heads


@pytest.mark.parametrize("variant", sorted(NATIVE))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_native_qk_norm_models(variant, dtype, tol):
    adapter = ModelAdapter(_native(variant, dtype))
    assert adapter.facts.qk_norm == "per_head"
    _check_scores(adapter, dtype, tol)


@pytest.mark.parametrize("n_kv_heads", [2, 4])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_qwen3_checkpoint(n_kv_heads, dtype, tol, tmp_path):
    ref = moe_checkpoint("qwen3", tmp_path, n_kv_heads=n_kv_heads)
    model = load_snapshot(str(tmp_path), dtype=dtype, device="cpu", fold_ln=False, center_writing_weights=False,
                          center_unembed=False, name="tiny-qwen3")
    with torch.no_grad():  # the loaded model is transformers' Qwen3
        theirs = ref(torch.tensor([TOKENS])).logits[0]
        assert (model(torch.tensor([TOKENS]))[0].float() - theirs).abs().max() < 1e-4 * max(1.0, theirs.abs().max())
    adapter = ModelAdapter(model)
    assert adapter.facts.qk_norm == "per_head" and adapter.facts.grouped_query == (n_kv_heads != 4)
    _check_scores(adapter, dtype, tol)


def test_frozen_sigmas_are_the_models_norm_scales():
    """The recorded sigma is the model's own RMS of the raw query/key per head and position, and the
    frozen map reproduces TransformerLens's normalised query exactly."""
    m = _native("qwen3-style-gqa", torch.float64)
    adapter = ModelAdapter(m)
    lin = linearise(adapter, torch.tensor(TOKENS))
    _, cache = m.run_with_cache(torch.tensor([TOKENS]))
    eps = m.cfg.eps
    for layer in range(2):
        for side, heads in (("q", 4), ("k", 2)):
            raw = cache[f"blocks.{layer}.attn.hook_{side}"][0]  # (pos, heads, d_head), before the norm
            rms = (raw.pow(2).mean(-1) + eps).sqrt()
            assert lin.qk_sigma[(side, layer)].shape == (len(TOKENS), heads)
            assert torch.allclose(lin.qk_sigma[(side, layer)], rms, atol=1e-14)
        q_raw = cache[f"blocks.{layer}.attn.hook_q"][0]
        normed = torch.stack([torch.stack([q_raw[t, h] * qk_norm_scale(adapter, lin, layer, "q", h, t)
                                           for h in range(4)]) for t in range(len(TOKENS))])
        q_model = m.blocks[layer].attn.q_norm(q_raw.reshape(-1, q_raw.shape[-1])).reshape(q_raw.shape)
        assert torch.allclose(normed, q_model, atol=1e-13)


def test_decomposed_query_equals_the_models_rotated_query():
    adapter = ModelAdapter(_native("gemma3-style", torch.float64))
    g = attribute(adapter, TOKENS, dtype=torch.float64, mlp="neurons")
    for d in qk_decomposition(g, layer=1, head=[0, 3], query_position=-1, key_position=2):
        assert abs(d.query - d.model_query).max() < 1e-12 * max(1.0, abs(d.model_query).max())
        assert abs(d.key - d.model_key).max() < 1e-12 * max(1.0, abs(d.model_key).max())


@pytest.mark.parametrize("variant", ["qwen3-style-gqa", "gemma3-style"])
def test_qk_intervention_check_with_frozen_qk_norms(variant):
    """validate: qk on a q/k-norm model: removing a node from one side of the score in the real
    model (ln1's and the q/k norms' sigma frozen) changes the score by that node's marginal."""
    from circuitgraph.validation.qk_check import qk_check

    adapter = ModelAdapter(_native(variant, torch.float64))
    g = attribute(adapter, TOKENS, dtype=torch.float64, mlp="neurons")
    res = qk_check(g, layer=1, head=[0, 3], top_k=3)
    assert res.rows and res.ok, res.table()
    assert {r.side for r in res.rows} == {"query", "key"}
