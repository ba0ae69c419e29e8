"""Tiny random Hugging Face checkpoints of the mixture-of-experts families (and Qwen3, for query/key
norms), made with transformers' own classes and ``save_pretrained``: no download.

``moe_checkpoint(family, folder)`` writes a 2-layer, 4-expert, top-2, ``d_model`` 32 checkpoint
whose weights are perturbed away from the initialisation (so that every weight must reach the
right place for the logits to agree) and returns the transformers model, the reference forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["MOE_FAMILIES", "moe_checkpoint"]

#: family -> (transformers config class, model class) names
MOE_FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def _config(family: str, n_kv_heads: int) -> dict[str, Any]:
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=n_kv_heads, max_position_embeddings=64, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "mixtral":
        return dict(common, num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6, sliding_window=4)
    if family == "olmoe":  # q/k norms over the whole projection; no top-k renormalisation (as OLMoE-1B-7B)
        return dict(common, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)
    if family == "qwen3_moe":  # per-head q/k norms, head_dim != hidden / heads, renormalised top-k
        return dict(common, intermediate_size=40, moe_intermediate_size=24, head_dim=16, num_experts=4,
                    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    if family == "gpt_oss":  # attention sinks, sliding window 4 on even layers, YaRN, biased router and experts
        return dict(common, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"], attention_bias=True,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False, "original_max_position_embeddings": 16,
                                     "rope_theta": 150000.0})
    if family == "qwen3":
        return dict(common, head_dim=16)
    raise ValueError(f"unknown family {family!r}; known: {sorted(MOE_FAMILIES)}")


@torch.no_grad()
def moe_checkpoint(family: str, folder: str | Path | None = None, *, n_kv_heads: int = 2, seed: int = 0,
                   noise: float = 0.2) -> Any:
    """A tiny random checkpoint of ``family`` (:data:`MOE_FAMILIES`), saved to ``folder`` when given
    (config.json + model.safetensors, as ``save_pretrained`` writes them); returns the model (eval)."""
    import transformers

    cfg_name, cls_name = MOE_FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**_config(family, n_kv_heads))
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg).eval()
    for p in model.parameters():  # off the init's ones and zeros: every weight must land in its place
        p.add_(noise * torch.randn_like(p))
    if family == "gpt_oss":  # large enough expert projections that the SwiGLU clamps (|value| > 7, gate > 7) are hit
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(10.0)
    if folder is not None:
        model.save_pretrained(folder)
    # the reference forward: eager attention and experts (the grouped GEMM has no float64)
    model.set_attn_implementation("eager")
    if hasattr(model, "set_experts_implementation") and family != "qwen3":
        model.set_experts_implementation("eager")
    return model
