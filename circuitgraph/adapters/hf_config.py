"""TransformerLens models built from a Hugging Face snapshot's own ``config.json``.

TransformerLens's ``from_pretrained`` takes several of its configs from tables keyed by the
official model name (``meta-llama/Llama-3.2-1B`` is always 16 layers of width 2048, whatever the
files say). Here the :class:`HookedTransformerConfig` is derived from the snapshot's
``config.json`` field by field, per architecture, and the weights are converted with
TransformerLens's own ``transformer_lens.pretrained.weight_conversions`` functions, so any
checkpoint of a supported architecture loads as it is (the real one or a small stand-in).
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import Any, Callable

import einops
import torch

from circuitgraph.errors import LoadError

#: GPT-OSS's clamped SwiGLU ``glu(min(gate, L)) * (clamp(value, -L, L) + 1)``, ``glu(g) = g sigmoid(alpha g)``:
#: TransformerLens's ``GptOssExpert`` constants (``gpt_oss_moe.GPT_OSS_LIMIT`` / ``GPT_OSS_ALPHA``)
GPT_OSS_LIMIT, GPT_OSS_ALPHA = 7.0, 1.702

N_CTX_CAP = 2048  # TransformerLens allocates n_ctx x n_ctx masks per layer; its own tables cap these models too


def _rope_theta(c: Any, default: float = 10000.0) -> float:
    theta = getattr(c, "rope_theta", None)
    if theta is None:
        params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else default)


def _kv_heads(c: Any) -> int | None:
    n = getattr(c, "num_key_value_heads", None)
    return n if n is not None and n != c.num_attention_heads else None


def _head_dim(c: Any) -> int:
    d = getattr(c, "head_dim", None)
    return int(d) if d else c.hidden_size // c.num_attention_heads


def _llama(c: Any) -> dict[str, Any]:
    d_head = _head_dim(c)
    cfg = {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads, "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers, "n_ctx": min(c.max_position_embeddings, N_CTX_CAP), "eps": c.rms_norm_eps,
        "d_vocab": c.vocab_size, "act_fn": getattr(c, "hidden_act", None), "n_key_value_heads": _kv_heads(c),
        "normalization_type": "RMS", "positional_embedding_type": "rotary", "rotary_adjacent_pairs": False,
        "rotary_dim": d_head, "rotary_base": _rope_theta(c), "final_rms": True, "gated_mlp": True,
    }
    scaling = getattr(c, "rope_scaling", None) or {}
    if (scaling.get("rope_type") or scaling.get("type") or "").lower() == "llama3":
        cfg.update(use_NTK_by_parts_rope=True,
                   NTK_original_ctx_len=scaling.get("original_max_position_embeddings", c.max_position_embeddings),
                   NTK_by_parts_low_freq_factor=scaling.get("low_freq_factor", 1.0),
                   NTK_by_parts_high_freq_factor=scaling.get("high_freq_factor", 4.0),
                   NTK_by_parts_factor=scaling.get("factor", 1.0))
    return cfg


def _qwen3(c: Any) -> dict[str, Any]:
    cfg = _llama(c)
    cfg.update(use_qk_norm=True, use_attn_scale=True, tokenizer_prepends_bos=True, default_prepend_bos=False,
               initializer_range=c.initializer_range)
    return cfg


def _gemma2(c: Any) -> dict[str, Any]:
    cfg = _llama(c)
    act = getattr(c, "hidden_activation", None) or getattr(c, "hidden_act", None) or "gelu_pytorch_tanh"
    layer_types = getattr(c, "layer_types", None) or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                      for i in range(c.num_hidden_layers)]
    window = getattr(c, "sliding_window", None)
    cfg.update(
        act_fn=act, use_attn_scale=True, attn_scale=math.sqrt(c.query_pre_attn_scalar),
        attn_scores_soft_cap=float(c.attn_logit_softcapping or -1.0),
        output_logits_soft_cap=float(c.final_logit_softcapping or -1.0),
        use_normalization_before_and_after=True, initializer_range=c.initializer_range,
    )
    if window:
        cfg.update(use_local_attn=True, window_size=int(window),
                   attn_types=["local" if t == "sliding_attention" else "global" for t in layer_types])
    return cfg


def _gpt2(c: Any) -> dict[str, Any]:
    return {
        "d_model": c.n_embd, "d_head": c.n_embd // c.n_head, "n_heads": c.n_head,
        "d_mlp": c.n_inner or 4 * c.n_embd, "n_layers": c.n_layer, "n_ctx": c.n_positions,
        "eps": c.layer_norm_epsilon, "d_vocab": c.vocab_size, "act_fn": c.activation_function,
        "use_attn_scale": getattr(c, "scale_attn_weights", True), "use_local_attn": False,
        "scale_attn_by_inverse_layer_idx": c.scale_attn_by_inverse_layer_idx, "normalization_type": "LN",
    }


# ----------------------------------------------------------------------------- mixture of experts
def _moe_layers_all_sparse(c: Any, family: str) -> None:
    """TransformerLens's MoE config is global: every layer must be a routed-expert layer."""
    dense = list(getattr(c, "mlp_only_layers", None) or [])
    step = int(getattr(c, "decoder_sparse_step", 1) or 1)
    if dense or step != 1:
        raise LoadError(f"{family}: layers with a dense MLP (mlp_only_layers={dense}, decoder_sparse_step={step}) "
                         "are not supported; every layer must be a mixture-of-experts layer")


def _mixtral(c: Any) -> dict[str, Any]:
    cfg = _llama(c)
    window = getattr(c, "sliding_window", None)
    # TransformerLens's Mixtral and OLMoE converters need n_key_value_heads set, even without grouping
    cfg.update(n_key_value_heads=c.num_key_value_heads, d_mlp=c.intermediate_size, num_experts=c.num_local_experts, experts_per_token=c.num_experts_per_tok,
               # MixtralTopKRouter renormalises the top-k weights unconditionally (no config field)
               norm_topk_prob=True)
    if window:
        cfg.update(use_local_attn=True, window_size=int(window), attn_types=["local"] * c.num_hidden_layers)
    return cfg


def _olmoe(c: Any) -> dict[str, Any]:
    # q/k norms over the whole projection: TransformerLens keys them on original_architecture
    cfg = _llama(c)
    cfg.update(n_key_value_heads=c.num_key_value_heads, num_experts=c.num_experts,
               experts_per_token=c.num_experts_per_tok, norm_topk_prob=bool(c.norm_topk_prob), clip_qkv=getattr(c, "clip_qkv", None),
               initializer_range=c.initializer_range)
    return cfg


def _qwen3_moe(c: Any) -> dict[str, Any]:
    _moe_layers_all_sparse(c, "Qwen3MoeForCausalLM")
    cfg = _qwen3(c)
    cfg.update(d_mlp=c.moe_intermediate_size, num_experts=c.num_experts, experts_per_token=c.num_experts_per_tok,
               norm_topk_prob=bool(c.norm_topk_prob))
    return cfg


def _gpt_oss(c: Any) -> dict[str, Any]:
    """GPT-OSS: attention sinks and biases, alternating sliding-window / full layers, YaRN rope, a
    biased router with the softmax after the top-k, biased experts with a clamped SwiGLU
    (TransformerLens's ``GptOssMoE``, whose clamp and alpha are fixed at 7.0 and 1.702)."""
    limit, alpha = float(getattr(c, "swiglu_limit", 7.0)), float(getattr(c, "swiglu_alpha", 1.702))
    if (limit, alpha) != (GPT_OSS_LIMIT, GPT_OSS_ALPHA):
        raise LoadError(f"GptOssForCausalLM: swiglu_limit={limit}, swiglu_alpha={alpha} are not supported "
                        "(TransformerLens's GPT-OSS experts fix them at 7.0 and 1.702)")
    cfg = _llama(c)
    layer_types = getattr(c, "layer_types", None) or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                      for i in range(c.num_hidden_layers)]
    cfg.update(n_key_value_heads=c.num_key_value_heads, num_experts=c.num_local_experts,
               experts_per_token=c.num_experts_per_tok, use_attention_sinks=True,
               use_local_attn=True, window_size=int(c.sliding_window),
               attn_types=["local" if t == "sliding_attention" else "global" for t in layer_types])
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if rope.get("rope_type") == "yarn":
        factor = float(rope["factor"])
        attention = rope.get("attention_factor")
        if attention is None:  # transformers' default: 0.1 ln(factor) + 1
            attention = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        cfg.update(use_yarn_rope=True, yarn_factor=factor, yarn_attention_factor=float(attention),
                   yarn_beta_fast=float(rope.get("beta_fast") or 32.0), yarn_beta_slow=float(rope.get("beta_slow") or 1.0),
                   yarn_original_max_position_embeddings=rope["original_max_position_embeddings"],
                   yarn_truncate=rope.get("truncate", True))
    return cfg


def convert_qwen3_moe_weights(hf_model: Any, cfg: Any) -> dict[str, Any]:
    """Qwen3-MoE -> TransformerLens: Qwen3's attention (per-head q/k norms, no biases), as
    TransformerLens's ``convert_qwen3_weights``, and Mixtral's experts, as ``convert_mixtral_weights``
    (transformers 5 fuses each expert's gate and up projections, ``gate_up_proj (E, 2 d_mlp,
    d_model)``, gate first; ``down_proj (E, d_model, d_mlp)``; the router is ``mlp.gate.weight``)."""
    H, n_kv, dh, D = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads, cfg.d_head, cfg.d_model
    kv = "_" if cfg.n_key_value_heads is not None else ""
    zeros = lambda *shape: torch.zeros(*shape, dtype=cfg.dtype)  # noqa: E731
    m = hf_model.model
    state: dict[str, Any] = {"embed.W_E": m.embed_tokens.weight, "ln_final.w": m.norm.weight,
                             "unembed.W_U": hf_model.lm_head.weight.T, "unembed.b_U": zeros(cfg.d_vocab)}
    for l, layer in enumerate(m.layers):
        att, moe = layer.self_attn, layer.mlp
        state.update({
            f"blocks.{l}.ln1.w": layer.input_layernorm.weight,
            f"blocks.{l}.ln2.w": layer.post_attention_layernorm.weight,
            f"blocks.{l}.attn.W_Q": einops.rearrange(att.q_proj.weight, "(n h) m->n m h", n=H),
            f"blocks.{l}.attn.{kv}W_K": einops.rearrange(att.k_proj.weight, "(n h) m->n m h", n=n_kv),
            f"blocks.{l}.attn.{kv}W_V": einops.rearrange(att.v_proj.weight, "(n h) m->n m h", n=n_kv),
            f"blocks.{l}.attn.W_O": einops.rearrange(att.o_proj.weight, "m (n h)->n h m", n=H),
            f"blocks.{l}.attn.q_norm.w": att.q_norm.weight, f"blocks.{l}.attn.k_norm.w": att.k_norm.weight,
            f"blocks.{l}.attn.b_Q": zeros(H, dh), f"blocks.{l}.attn.{kv}b_K": zeros(n_kv, dh),
            f"blocks.{l}.attn.{kv}b_V": zeros(n_kv, dh), f"blocks.{l}.attn.b_O": zeros(D),
            f"blocks.{l}.mlp.W_gate.weight": moe.gate.weight,
        })
        gate_up, down, d_mlp = moe.experts.gate_up_proj, moe.experts.down_proj, cfg.d_mlp
        for e in range(cfg.num_experts):
            state[f"blocks.{l}.mlp.experts.{e}.W_gate.weight"] = gate_up[e, :d_mlp, :]
            state[f"blocks.{l}.mlp.experts.{e}.W_in.weight"] = gate_up[e, d_mlp:, :]
            state[f"blocks.{l}.mlp.experts.{e}.W_out.weight"] = down[e]
    return state


def _converter(name: str | Callable[..., dict]) -> Callable[..., dict]:
    if callable(name):
        return name
    from transformer_lens.pretrained import weight_conversions

    return getattr(weight_conversions, name)


#: architecture (config.json ``architectures[0]``) -> (config mapping, TransformerLens weight converter)
ARCHITECTURES: dict[str, tuple[Callable[[Any], dict[str, Any]], str | Callable[..., dict]]] = {
    "LlamaForCausalLM": (_llama, "convert_llama_weights"),
    "Gemma2ForCausalLM": (_gemma2, "convert_gemma_weights"),
    "Qwen3ForCausalLM": (_qwen3, "convert_qwen3_weights"),
    "GPT2LMHeadModel": (_gpt2, "convert_gpt2_weights"),
    # mixture of experts (issue 22b; docs/models.md "Mixture of experts")
    "MixtralForCausalLM": (_mixtral, "convert_mixtral_weights"),
    "OlmoeForCausalLM": (_olmoe, "convert_olmoe_weights"),
    "Qwen3MoeForCausalLM": (_qwen3_moe, convert_qwen3_moe_weights),
    "GptOssForCausalLM": (_gpt_oss, "convert_gpt_oss_weights"),
}


def hooked_config_dict(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a transformers config of a supported architecture."""
    arch = (getattr(hf_config, "architectures", None) or [type(hf_config).__name__])[0]
    if arch not in ARCHITECTURES:
        raise KeyError(arch)
    cfg = ARCHITECTURES[arch][0](hf_config)
    cfg["original_architecture"] = arch
    cfg["tie_word_embeddings"] = bool(getattr(hf_config, "tie_word_embeddings", False))
    return cfg


def load_snapshot(folder: str, *, dtype: Any, device: str, fold_ln: bool, center_writing_weights: bool,
                  center_unembed: bool, name: str):
    """A HookedTransformer from a Hugging Face snapshot folder (config.json, safetensors, tokenizer)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    hf_config = AutoConfig.from_pretrained(folder, local_files_only=True)
    raw = hooked_config_dict(hf_config)
    arch = raw["original_architecture"]

    tokenizer = None
    if any((Path(folder) / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    # else: a snapshot without tokenizer files (transformers would build an empty one): token ids only
    raw.update(dtype=dtype, device=device, tokenizer_name=name if tokenizer is not None else None)
    cfg = HookedTransformerConfig(**raw)

    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the CLI's output is the result or one error line, no progress bars
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, torch_dtype=torch.float32,
                                                        attn_implementation="eager")
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    state = _converter(ARCHITECTURES[arch][1])(hf_model, cfg)
    del hf_model
    with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens prints on device moves
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_and_process_state_dict(state, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                          center_unembed=center_unembed,
                                          # b_V -> b_O is exact only when every pattern row sums to 1: not with sinks
                                          fold_value_biases=not cfg.use_attention_sinks,
                                          refactor_factored_attn_matrices=False)
        if cfg.num_experts:  # TransformerLens's MoE makes its nn.Linear layers in torch's default dtype
            model = model.to(dtype)
        return model.to(device)
