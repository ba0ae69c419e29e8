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

import torch

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


def _converter(name: str) -> Callable[..., dict]:
    from transformer_lens.pretrained import weight_conversions

    return getattr(weight_conversions, name)


#: architecture (config.json ``architectures[0]``) -> (config mapping, TransformerLens weight converter)
ARCHITECTURES: dict[str, tuple[Callable[[Any], dict[str, Any]], str]] = {
    "LlamaForCausalLM": (_llama, "convert_llama_weights"),
    "Gemma2ForCausalLM": (_gemma2, "convert_gemma_weights"),
    "Qwen3ForCausalLM": (_qwen3, "convert_qwen3_weights"),
    "GPT2LMHeadModel": (_gpt2, "convert_gpt2_weights"),
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
                                          center_unembed=center_unembed, fold_value_biases=True,
                                          refactor_factored_attn_matrices=False)
        return model.to(device)
