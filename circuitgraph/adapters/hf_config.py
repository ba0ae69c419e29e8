"""TransformerLens models built from a Hugging Face folder's own ``config.json``: the families table.

A Hugging Face model folder (what ``save_pretrained`` writes, or a hub snapshot) is read here.
TransformerLens's ``from_pretrained`` takes several of its configs from tables keyed by the
official model name (``meta-llama/Llama-3.2-1B`` is always 16 layers of width 2048, whatever the
files say). Instead, each supported family is one row of :data:`FAMILIES`, keyed by config.json's
``model_type``: the :class:`HookedTransformerConfig` is derived from the folder's config field by
field, the weights are converted with TransformerLens's own
``transformer_lens.pretrained.weight_conversions`` function, and what TransformerLens lacks is
finished on the built model by the row's ``finish`` step (SmolLM3's layers without rotary
positions). Any checkpoint of a supported family loads as it is: the real one, a fine-tuned one,
or a small stand-in. No code from the folder runs: the config is read by transformers's own
config class of the family (``trust_remote_code`` only when the spec sets it).

This module imports neither torch nor transformers at import time (``validate`` reads the table).
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitgraph.errors import LoadError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = ["Family", "FAMILIES", "unsupported_model_type_message", "hooked_config_dict", "load_snapshot",
           "check_against_transformers", "N_CTX_CAP", "GPT_OSS_LIMIT", "GPT_OSS_ALPHA"]

N_CTX_CAP = 2048  # TransformerLens allocates n_ctx x n_ctx masks per layer; its own tables cap these models too
#: GPT-OSS's clamped SwiGLU ``glu(min(gate, L)) * (clamp(value, -L, L) + 1)``, ``glu(g) = g sigmoid(alpha g)``:
#: TransformerLens's ``GptOssExpert`` constants (``gpt_oss_moe.GPT_OSS_LIMIT`` / ``GPT_OSS_ALPHA``)
GPT_OSS_LIMIT, GPT_OSS_ALPHA = 7.0, 1.702


# ---------------------------------------------------------------------------------------------- helpers
def _get(c: PretrainedConfig, name: str, default: Any = None) -> Any:
    try:
        value = getattr(c, name, default)
    except Exception:  # noqa: BLE001 - transformers >= 5.15 raises on some per-layer fields
        return default
    return default if value is None else value


def _rope(c: PretrainedConfig, layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters of ``c`` (transformers 5 ``rope_parameters``, older ``rope_scaling``),
    per layer type where the config keeps one dict per layer type (Gemma-3)."""
    params = _get(c, "rope_parameters") or _get(c, "rope_scaling") or {}
    if not isinstance(params, dict):
        return {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        return params[layer_type]
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        return params["full_attention"]
    return params


def _rope_theta(c: PretrainedConfig, default: float = 10000.0, layer_type: str | None = None) -> float:
    theta = _rope(c, layer_type).get("rope_theta")
    if theta is None:
        theta = _get(c, "rope_theta")
    return float(theta if theta is not None else default)


def _kv_heads(c: PretrainedConfig) -> int | None:
    n = _get(c, "num_key_value_heads")
    return n if n is not None and n != c.num_attention_heads else None


def _head_dim(c: PretrainedConfig) -> int:
    d = _get(c, "head_dim")
    return int(d) if d else c.hidden_size // c.num_attention_heads


def _windows(c: PretrainedConfig, every_layer: bool = False, types: list[str] | None = None) -> dict[str, Any]:
    """Sliding-window attention: per layer from ``types`` (default the config's ``layer_types``;
    ``sliding_attention`` is local), or on every layer (``every_layer``: Mistral and Phi-3 window
    all layers when a window is set)."""
    window = _get(c, "sliding_window")
    if not window or (hasattr(c, "use_sliding_window") and not c.use_sliding_window and not every_layer):
        return {}
    types = types or _get(c, "layer_types")
    if every_layer or not types:
        kinds = ["local"] * c.num_hidden_layers
    else:
        kinds = ["local" if t == "sliding_attention" else "global" for t in types]
    if "local" not in kinds:
        return {}
    return {"use_local_attn": True, "window_size": int(window), "attn_types": kinds}


def _rope_scaling(c: PretrainedConfig, *, yarn: bool = False) -> dict[str, Any]:
    """Llama-3 style frequency scaling ("llama3" rope type); linear scaling of global layers; with
    ``yarn``, YaRN is left to the caller (GPT-OSS)."""
    p = _rope(c)
    kind = (p.get("rope_type") or p.get("type") or "default").lower()
    if yarn and kind == "yarn":
        return {}
    if kind == "llama3":
        return {"use_NTK_by_parts_rope": True,
                "NTK_original_ctx_len": p.get("original_max_position_embeddings", c.max_position_embeddings),
                "NTK_by_parts_low_freq_factor": p.get("low_freq_factor", 1.0),
                "NTK_by_parts_high_freq_factor": p.get("high_freq_factor", 4.0),
                "NTK_by_parts_factor": p.get("factor", 1.0)}
    if kind == "linear":
        return {"rotary_scaling_factor": float(p.get("factor", 1.0))}
    if kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported (supported: default, llama3, linear)")
    return {}


# ---------------------------------------------------------------------------------------------- families
def _llama(c: PretrainedConfig, *, yarn: bool = False) -> dict[str, Any]:
    d_head = _head_dim(c)
    cfg = {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads, "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers, "n_ctx": min(c.max_position_embeddings, N_CTX_CAP), "eps": c.rms_norm_eps,
        "d_vocab": c.vocab_size, "act_fn": _get(c, "hidden_act"), "n_key_value_heads": _kv_heads(c),
        "normalization_type": "RMS", "positional_embedding_type": "rotary", "rotary_adjacent_pairs": False,
        "rotary_dim": d_head, "rotary_base": _rope_theta(c), "final_rms": True, "gated_mlp": True,
    }
    cfg.update(_rope_scaling(c, yarn=yarn))
    return cfg


def _mistral(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)
    cfg.update(_windows(c, every_layer=True))
    return cfg


def _qwen2(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)  # q, k, v biases: converted by TransformerLens's qwen2 conversion
    cfg.update(_windows(c))
    return cfg


def _qwen3(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)
    cfg.update(use_qk_norm=True, use_attn_scale=True, tokenizer_prepends_bos=True, default_prepend_bos=False,
               initializer_range=c.initializer_range)
    cfg.update(_windows(c))
    return cfg


def _smollm3(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)
    cfg.update(_windows(c))
    return cfg


def _gemma2(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)
    act = _get(c, "hidden_activation") or _get(c, "hidden_act") or "gelu_pytorch_tanh"
    cfg.update(
        act_fn=act, use_attn_scale=True, attn_scale=math.sqrt(c.query_pre_attn_scalar),
        attn_scores_soft_cap=float(_get(c, "attn_logit_softcapping") or -1.0),
        output_logits_soft_cap=float(_get(c, "final_logit_softcapping") or -1.0),
        use_normalization_before_and_after=True, initializer_range=c.initializer_range,
    )
    types = _get(c, "layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                       for i in range(c.num_hidden_layers)]  # Gemma-2 alternates
    cfg.update(_windows(c, types=types))
    return cfg


def _gemma3(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _gemma2(c)
    cfg.update(use_qk_norm=True, rotary_base=_rope_theta(c, 1_000_000.0, "full_attention"),
               rotary_base_local=_rope_theta(c, 10_000.0, "sliding_attention"))
    return cfg


def _gemma3_multimodal(c: PretrainedConfig) -> dict[str, Any]:
    """Gemma-3 4B and larger (``Gemma3ForConditionalGeneration``): the text model of ``text_config``;
    the vision tower is not converted (prompts are text)."""
    return _gemma3(c.text_config)


def _olmo2(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)  # TransformerLens's OLMo-2 blocks: ln1/ln2 are the norms of the attention/MLP outputs
    cfg.update(_windows(c))
    return cfg


def _phi3(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)  # fused qkv and gate/up projections: split by TransformerLens's phi3 conversion
    cfg.update(_windows(c, every_layer=True))
    return cfg


def _gpt2(c: PretrainedConfig) -> dict[str, Any]:
    return {
        "d_model": c.n_embd, "d_head": c.n_embd // c.n_head, "n_heads": c.n_head,
        "d_mlp": c.n_inner or 4 * c.n_embd, "n_layers": c.n_layer, "n_ctx": c.n_positions,
        "eps": c.layer_norm_epsilon, "d_vocab": c.vocab_size, "act_fn": c.activation_function,
        "use_attn_scale": getattr(c, "scale_attn_weights", True), "use_local_attn": False,
        "scale_attn_by_inverse_layer_idx": c.scale_attn_by_inverse_layer_idx, "normalization_type": "LN",
    }


def _neox(c: PretrainedConfig) -> dict[str, Any]:
    d_head = c.hidden_size // c.num_attention_heads
    p = _rope(c)
    pct = p.get("partial_rotary_factor", _get(c, "partial_rotary_factor", _get(c, "rotary_pct", 1.0)))
    return {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads, "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers, "n_ctx": min(c.max_position_embeddings, N_CTX_CAP), "eps": c.layer_norm_eps,
        "d_vocab": c.vocab_size, "act_fn": c.hidden_act, "use_attn_scale": True, "normalization_type": "LN",
        "parallel_attn_mlp": bool(_get(c, "use_parallel_residual", True)), "positional_embedding_type": "rotary",
        "rotary_adjacent_pairs": False, "rotary_dim": round(pct * d_head), "rotary_base": _rope_theta(c),
        "default_prepend_bos": False,
    }


def _gptj(c: PretrainedConfig) -> dict[str, Any]:
    return {
        "d_model": c.n_embd, "d_head": c.n_embd // c.n_head, "n_heads": c.n_head, "d_mlp": c.n_inner or 4 * c.n_embd,
        "n_layers": c.n_layer, "n_ctx": min(c.n_positions, N_CTX_CAP), "eps": c.layer_norm_epsilon,
        "d_vocab": c.vocab_size, "act_fn": c.activation_function, "use_attn_scale": True,
        "parallel_attn_mlp": True, "positional_embedding_type": "rotary", "rotary_dim": c.rotary_dim or c.n_embd // c.n_head,
        "rotary_adjacent_pairs": True, "rotary_base": 10000.0, "normalization_type": "LN",
    }


def _phi(c: PretrainedConfig) -> dict[str, Any]:
    d_head = c.hidden_size // c.num_attention_heads
    pct = _rope(c).get("partial_rotary_factor", _get(c, "partial_rotary_factor", 0.5))
    return {
        "d_model": c.hidden_size, "d_head": d_head, "n_heads": c.num_attention_heads, "d_mlp": c.intermediate_size,
        "n_layers": c.num_hidden_layers, "n_ctx": min(c.max_position_embeddings, N_CTX_CAP), "eps": c.layer_norm_eps,
        "d_vocab": c.vocab_size, "act_fn": c.hidden_act, "normalization_type": "LN",
        "positional_embedding_type": "rotary", "rotary_base": _rope_theta(c), "use_attn_scale": True,
        "parallel_attn_mlp": True, "rotary_dim": round(pct * d_head), "default_prepend_bos": False,
        "n_key_value_heads": _kv_heads(c),
    }


def _convert_olmo2(hf_model: PreTrainedModel, cfg: Any) -> dict[str, Any]:
    """TransformerLens's OLMo-2 conversion, with grouped-query keys and values (OLMo-2 32B) stored
    as TransformerLens's grouped-query attention holds them (``_W_K``, ``_W_V``: one per kv head)."""
    import einops
    import torch

    state = _converter("convert_olmo2_weights")(hf_model, cfg)
    if cfg.n_key_value_heads is None:
        return state
    for l, layer in enumerate(hf_model.model.layers):
        for name, proj in (("K", layer.self_attn.k_proj), ("V", layer.self_attn.v_proj)):
            del state[f"blocks.{l}.attn.W_{name}"], state[f"blocks.{l}.attn.b_{name}"]
            state[f"blocks.{l}.attn._W_{name}"] = einops.rearrange(proj.weight, "(n h) m->n m h",
                                                                   n=cfg.n_key_value_heads)
            state[f"blocks.{l}.attn._b_{name}"] = torch.zeros(cfg.n_key_value_heads, cfg.d_head, dtype=cfg.dtype)
    return state


def _no_rope_layers(model: Any, hf_config: Any) -> None:
    """SmolLM3: layers whose ``no_rope_layers`` entry is 0 use no rotary positions. TransformerLens
    has no such layer, so their rotation is made the identity (cos = 1, sin = 0 at every position):
    the same attention, with q and k unrotated, exactly as transformers computes it."""
    flags = _get(hf_config, "no_rope_layers") or [1] * hf_config.num_hidden_layers
    for layer, use_rope in enumerate(flags):
        if not use_rope:
            attn = model.blocks[layer].attn
            attn.rotary_sin.zero_()
            attn.rotary_cos.fill_(1.0)


# --------------------------------------------------------------------------------------------- mixture of experts
def _moe_layers_all_sparse(c: PretrainedConfig, family: str) -> None:
    """TransformerLens's MoE config is global: every layer must be a routed-expert layer."""
    dense = list(getattr(c, "mlp_only_layers", None) or [])
    step = int(getattr(c, "decoder_sparse_step", 1) or 1)
    if dense or step != 1:
        raise LoadError(f"{family}: layers with a dense MLP (mlp_only_layers={dense}, decoder_sparse_step={step}) "
                         "are not supported; every layer must be a mixture-of-experts layer")


def _mixtral(c: PretrainedConfig) -> dict[str, Any]:
    cfg = _llama(c)
    window = getattr(c, "sliding_window", None)
    # TransformerLens's Mixtral and OLMoE converters need n_key_value_heads set, even without grouping
    cfg.update(n_key_value_heads=c.num_key_value_heads, d_mlp=c.intermediate_size, num_experts=c.num_local_experts, experts_per_token=c.num_experts_per_tok,
               # MixtralTopKRouter renormalises the top-k weights unconditionally (no config field)
               norm_topk_prob=True)
    if window:
        cfg.update(use_local_attn=True, window_size=int(window), attn_types=["local"] * c.num_hidden_layers)
    return cfg


def _olmoe(c: PretrainedConfig) -> dict[str, Any]:
    # q/k norms over the whole projection: TransformerLens keys them on original_architecture
    cfg = _llama(c)
    cfg.update(n_key_value_heads=c.num_key_value_heads, num_experts=c.num_experts,
               experts_per_token=c.num_experts_per_tok, norm_topk_prob=bool(c.norm_topk_prob), clip_qkv=getattr(c, "clip_qkv", None),
               initializer_range=c.initializer_range)
    return cfg


def _qwen3_moe(c: PretrainedConfig) -> dict[str, Any]:
    _moe_layers_all_sparse(c, "Qwen3MoeForCausalLM")
    cfg = _qwen3(c)
    cfg.update(d_mlp=c.moe_intermediate_size, num_experts=c.num_experts, experts_per_token=c.num_experts_per_tok,
               norm_topk_prob=bool(c.norm_topk_prob))
    return cfg


def _gpt_oss(c: PretrainedConfig) -> dict[str, Any]:
    """GPT-OSS: attention sinks and biases, alternating sliding-window / full layers, YaRN rope, a
    biased router with the softmax after the top-k, biased experts with a clamped SwiGLU
    (TransformerLens's ``GptOssMoE``, whose clamp and alpha are fixed at 7.0 and 1.702)."""
    limit, alpha = float(getattr(c, "swiglu_limit", 7.0)), float(getattr(c, "swiglu_alpha", 1.702))
    if (limit, alpha) != (GPT_OSS_LIMIT, GPT_OSS_ALPHA):
        raise LoadError(f"GptOssForCausalLM: swiglu_limit={limit}, swiglu_alpha={alpha} are not supported "
                        "(TransformerLens's GPT-OSS experts fix them at 7.0 and 1.702)")
    cfg = _llama(c, yarn=True)
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


def convert_qwen3_moe_weights(hf_model: PreTrainedModel, cfg: Any) -> dict[str, Any]:
    """Qwen3-MoE -> TransformerLens: Qwen3's attention (per-head q/k norms, no biases), as
    TransformerLens's ``convert_qwen3_weights``, and Mixtral's experts, as ``convert_mixtral_weights``
    (transformers 5 fuses each expert's gate and up projections, ``gate_up_proj (E, 2 d_mlp,
    d_model)``, gate first; ``down_proj (E, d_model, d_mlp)``; the router is ``mlp.gate.weight``)."""
    import einops
    import torch

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


@dataclass(frozen=True)
class Family:
    """One supported family: how its config.json becomes a HookedTransformerConfig, which
    TransformerLens conversion reads its weights, and what the engine freezes in it.

    ``qk``: None where QK attribution is exact; otherwise why it refuses (query/key norms, #22b).
    """

    model_type: str
    name: str
    config: Callable[[Any], dict[str, Any]]
    #: a function of transformer_lens.pretrained.weight_conversions, by name, or one of this module
    converter: str | Callable[[Any, Any], dict[str, Any]]
    frozen: str
    finish: Callable[[Any, Any], None] | None = None
    qk: str | None = None
    #: TransformerLens's fold_ln applies (False where the norms are on the sublayer outputs)
    foldable: bool = True


#: config.json ``model_type`` -> its family (the one table of supported architectures; docs/models.md)
FAMILIES: dict[str, Family] = {f.model_type: f for f in [
    Family("gpt2", "GPT-2", _gpt2, "convert_gpt2_weights",
           "ln1/ln2/ln_final sigmas (LayerNorm), attention patterns, GELU neurons"),
    Family("gpt_neox", "GPT-NeoX / Pythia", _neox, "convert_neox_weights",
           "parallel blocks: ln1 and ln2 sigmas both on the block input, patterns (partial rotary), GELU neurons"),
    Family("gptj", "GPT-J", _gptj, "convert_gptj_weights",
           "parallel blocks with one shared norm on the block input, patterns (partial rotary, adjacent pairs)"),
    Family("phi", "Phi-1/2", _phi, "convert_phi_weights",
           "parallel blocks with one shared norm on the block input, patterns (partial rotary), GELU neurons"),
    Family("llama", "Llama 2/3.x", _llama, "convert_llama_weights",
           "RMSNorm sigmas, patterns (rope scaling), SwiGLU gates"),
    Family("mistral", "Mistral", _mistral, "convert_mistral_weights",
           "RMSNorm sigmas, patterns (sliding window), SwiGLU gates"),
    Family("qwen2", "Qwen2 / Qwen2.5", _qwen2, "convert_qwen2_weights",
           "RMSNorm sigmas, patterns (q/k/v biases), SwiGLU gates"),
    Family("qwen3", "Qwen3", _qwen3, "convert_qwen3_weights",
           "RMSNorm sigmas, patterns (per-head q/k norms inside them), SwiGLU gates"),
    Family("gemma2", "Gemma-2", _gemma2, "convert_gemma_weights",
           "input and post norm sigmas, patterns (soft-capped, sliding window), GeGLU gates, embedding scale",
           ),
    Family("gemma3_text", "Gemma-3 (text)", _gemma3, "convert_gemma_weights",
           "input and post norm sigmas, patterns (q/k norms, local layers with their own rope base and window)"),
    Family("gemma3", "Gemma-3 (4B+, text model of the multimodal checkpoint)", _gemma3_multimodal,
           "convert_gemma_weights",
           "as Gemma-3 (text); the vision tower is not converted (text prompts only)"),
    Family("olmo2", "OLMo-2", _olmo2, _convert_olmo2,
           "post norm sigmas only (no input norms), patterns (q/k norms over the whole projection), SwiGLU gates",
           foldable=False),
    Family("phi3", "Phi-3", _phi3, "convert_phi3_weights",
           "RMSNorm sigmas, patterns (fused qkv), SwiGLU gates (fused gate/up)"),
    Family("smollm3", "SmolLM3", _smollm3, "convert_llama_weights",
           "RMSNorm sigmas, patterns (layers without rotary positions), SwiGLU gates", finish=_no_rope_layers),
    # mixture of experts (docs/models.md "Mixture of experts"): the routing is frozen with the rest
    Family("mixtral", "Mixtral", _mixtral, "convert_mixtral_weights",
           "RMSNorm sigmas, patterns (sliding window), routing (top-k weights renormalised), experts' SwiGLU gates"),
    Family("olmoe", "OLMoE", _olmoe, "convert_olmoe_weights",
           "RMSNorm sigmas, patterns (q/k norms over the whole projection), routing (top-k softmax weights), "
           "experts' SwiGLU gates"),
    Family("qwen3_moe", "Qwen3-MoE", _qwen3_moe, convert_qwen3_moe_weights,
           "RMSNorm sigmas, patterns (per-head q/k norms), routing (top-k weights), experts' SwiGLU gates"),
    Family("gpt_oss", "GPT-OSS", _gpt_oss, "convert_gpt_oss_weights",
           "RMSNorm sigmas, patterns (attention sinks, sliding window, YaRN rope), routing (softmax after the "
           "top-k), experts' clamped SwiGLU gates"),
]}


def unsupported_model_type_message(model_type: Any, where: Any) -> str:
    """The one line for a config.json whose ``model_type`` has no row in :data:`FAMILIES`."""
    families = ", ".join(f"{f.name} ({k})" for k, f in FAMILIES.items())
    return (f"{where}: model_type {model_type!r} is not a supported family; supported: {families}. "
            "A TransformerLens folder (HookedTransformerConfig fields in config.json) also loads")


def hooked_config_dict(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields for a transformers config of a supported family."""
    family = FAMILIES.get(getattr(hf_config, "model_type", None) or "")
    if family is None:
        raise KeyError(getattr(hf_config, "model_type", None))
    cfg = family.config(hf_config)
    arch = (_get(hf_config, "architectures") or [None])[0]
    cfg["original_architecture"] = arch or _ARCH_OF.get(family.model_type)
    cfg["tie_word_embeddings"] = bool(_get(hf_config, "tie_word_embeddings", False))
    return cfg


#: each family's transformers class, for a config.json without ``architectures`` (TransformerLens keys
#: some behaviour on it: OLMo-2's output-only norms)
_ARCH_OF = {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM", "gptj": "GPTJForCausalLM",
            "phi": "PhiForCausalLM", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
            "gemma3_text": "Gemma3ForCausalLM", "gemma3": "Gemma3ForConditionalGeneration",
            "olmo2": "Olmo2ForCausalLM", "phi3": "Phi3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
            "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "gpt_oss": "GptOssForCausalLM"}


def load_snapshot(folder: str, *, dtype: Any, device: str, fold_ln: bool, center_writing_weights: bool,
                  center_unembed: bool, name: str, trust_remote_code: bool = False, hf_tokenizer: bool = True):
    """A HookedTransformer from a Hugging Face folder (config.json, safetensors, tokenizer); with
    ``hf_tokenizer``, transformers's tokenizer of the folder is attached to it."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    remote = {"trust_remote_code": True} if trust_remote_code else {}
    hf_config = AutoConfig.from_pretrained(folder, local_files_only=True, **remote)
    family = FAMILIES[hf_config.model_type]
    if fold_ln and not family.foldable:
        raise LoadError(f"fold_ln folds each block's input norms into the weights after them; {family.name} has "
                        "no input norms (its norms are on the attention and MLP outputs): remove fold_ln")
    raw = hooked_config_dict(hf_config)
    tokenizer = None
    if hf_tokenizer and any((Path(folder) / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **remote)
    # else: a folder without tokenizer files (transformers would build an empty one): token ids only
    raw.update(dtype=dtype, device=device, tokenizer_name=name if tokenizer is not None else None)
    cfg = HookedTransformerConfig(**raw)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the CLI's output is the result or one error line, no progress bars
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32,
                                                        attn_implementation="eager", **remote)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    convert = family.converter if callable(family.converter) else _converter(family.converter)
    state = convert(hf_model, cfg)
    tokens = probe_tokens(cfg.d_vocab)
    with torch.no_grad():  # transformers's own logits, before its model is released
        theirs = hf_model(tokens).logits[0].double()
    del hf_model
    with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens prints on device moves
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_and_process_state_dict(state, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                          center_unembed=center_unembed,
                                          # b_V -> b_O is exact only when every pattern row sums to 1: not with sinks
                                          fold_value_biases=not cfg.use_attention_sinks,
                                          refactor_factored_attn_matrices=False)
        del state
        if cfg.num_experts:  # TransformerLens's MoE makes its nn.Linear layers in torch's default dtype
            model = model.to(dtype)
        if family.finish is not None:
            with torch.no_grad():
                family.finish(model, hf_config)
        model = model.to(device)
    if not center_writing_weights:  # centring what writes to an RMSNorm stream changes the model itself
        check_against_transformers(model, theirs, family, centred=center_unembed)
    return model


#: the probe the converted model is checked on at load time (token ids, taken modulo the vocabulary)
PROBE_TOKENS = (1, 5, 2, 7, 3, 9, 4, 6)


def probe_tokens(vocab: int) -> Any:
    import torch

    return torch.tensor([[t % vocab for t in PROBE_TOKENS]])


def check_against_transformers(model: Any, theirs: Any, family: Family, *, centred: bool = False) -> float:
    """Refuse a conversion that does not compute what transformers computes: the converted model's
    logits on :data:`PROBE_TOKENS` must equal ``theirs``, transformers's own forward on them, to
    float round-off (1e-3 of the largest logit in float32/64, 5e-2 in 16-bit dtypes). A checkpoint
    using something the family's row does not convert (a bias, a rope variant) fails here in one
    line instead of giving a silently different model. Returns the largest difference."""
    import torch

    tokens = probe_tokens(int(model.cfg.d_vocab))
    with torch.no_grad():
        ours = model(tokens.to(model.W_E.device))[0].double().cpu()
    if centred:  # center_unembed removes each position's mean logit
        ours, theirs = ours - ours.mean(-1, keepdim=True), theirs - theirs.mean(-1, keepdim=True)
    diff = float((ours - theirs).abs().max())
    low = model.cfg.dtype in (torch.float16, torch.bfloat16)
    tol = (5e-2 if low else 1e-3) * max(1.0, float(theirs.abs().max()))
    if not diff <= tol:
        raise LoadError(f"the {family.name} conversion of this checkpoint does not match transformers's forward "
                        f"(largest logit difference {diff:.3g} on a probe, allowed {tol:.2g}): the checkpoint uses "
                        "something circuitgraph's row for its family does not convert (e.g. attention or MLP biases, "
                        "a rope variant); please report it with its config.json")
    return diff


def _converter(name: str | Callable[..., dict]) -> Callable[..., dict]:
    if callable(name):
        return name
    from transformer_lens.pretrained import weight_conversions

    return getattr(weight_conversions, name)
