"""Reading a model folder's ``config.json`` through an allow-list.

A model folder is data, and data must not run code.  TransformerLens builds a tokenizer
from ``tokenizer_name`` when the config names one, and with ``trust_remote_code`` it
imports whatever Python the tokenizer's ``auto_map`` points at.  So ``config.json`` is never
handed to TransformerLens as it is: every field is checked against the table below (the
fields that define the computation, each with its type and range), bookkeeping fields are
dropped, and ``tokenizer_name`` / ``trust_remote_code`` pass only when the spec says
``model: {trust_remote_code: true}``.  circuitgraph reads the tokenizer from the folder's own
``tokenizer/`` with the ``tokenizers`` library, which never runs code.

Every problem is a :class:`~circuitgraph.errors.LoadError` naming the field, the value
and the fix; the checks also bound the work a config can ask for (sizes are checked
against the weights file before anything is allocated).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from circuitgraph._io import read_json_file
from circuitgraph.errors import LoadError

__all__ = ["read_model_config", "CONFIG_FIELDS", "IGNORED_CONFIG_FIELDS", "REMOTE_CODE_FIELDS",
           "check_config_against_weights"]

#: a model folder's config.json larger than this is not a model config
MAX_CONFIG_BYTES = 1 << 20
#: the longest context a model folder may declare
MAX_N_CTX = 1 << 20
#: the largest size (d_model, d_vocab...) a model folder may declare
MAX_SIZE = 1 << 24


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(lo: int = 1, hi: int = MAX_SIZE, optional: bool = False, sentinel: int | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if sentinel is not None and value == sentinel and not isinstance(value, bool):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {_describe(value)}"
        if not lo <= value <= hi:
            return f"must be between {lo} and {hi}, got {value}"
        return None

    return check


def _float(positive: bool = False, optional: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {_describe(value)}"
        if not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if positive and value <= 0:
            return f"must be > 0, got {value}"
        return None

    return check


def _bool(optional: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, bool):
            return f"expected true or false, got {_describe(value)}"
        return None

    return check


def _choice(*choices: Any) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or value not in choices:
            return f"expected one of {', '.join(map(repr, choices))}, got {_describe(value)}"
        return None

    return check


def _str(optional: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or len(value) > 1000:
            return f"expected a string, got {_describe(value)}"
        return None

    return check


def _attn_types(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_SIZE or not all(v in ("global", "local") for v in value):
        return f"expected null or a list of 'global'/'local', got {_describe(value)}"
    return None


#: TransformerLens 3.x's SUPPORTED_ACTIVATIONS (written out: importing it would import torch,
#: and ``circuitgraph validate`` reads config.json without torch)
ACT_FNS = ("solu", "solu_ln", "gelu_new", "gelu_fast", "silu", "relu", "gelu", "gelu_pytorch_tanh", "xielu", "relu2")


def _act_fns() -> tuple[str, ...]:
    return ACT_FNS


#: the HookedTransformerConfig fields circuitgraph passes on, each with its check
CONFIG_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "d_model": _int(),
    "d_head": _int(),
    "n_layers": _int(hi=10_000),
    "n_ctx": _int(hi=MAX_N_CTX),
    "n_heads": _int(hi=100_000),
    "d_mlp": _int(optional=True),
    "d_vocab": _int(),
    "d_vocab_out": _int(sentinel=-1),
    "n_key_value_heads": _int(hi=100_000, optional=True),
    "act_fn": lambda v: None if v is None else _choice(*_act_fns())(v),
    "normalization_type": _choice("LN", "LNPre", "RMS", "RMSPre", None),
    "positional_embedding_type": _choice("standard", "rotary"),
    "attention_dir": _choice("causal", "bidirectional"),
    "eps": _float(positive=True),
    "attn_scale": _float(),
    "use_attn_scale": _bool(),
    "attn_only": _bool(),
    "gated_mlp": _bool(),
    "final_rms": _bool(),
    "uses_rms_norm": _bool(),
    "layer_norm_folding": _bool(),
    "parallel_attn_mlp": _bool(),
    "scale_attn_by_inverse_layer_idx": _bool(),
    "rotary_dim": _int(optional=True),
    "rotary_base": _float(positive=True),
    "rotary_base_local": _float(positive=True, optional=True),
    "rotary_scaling_factor": _float(positive=True),
    "rotary_adjacent_pairs": _bool(),
    "use_NTK_by_parts_rope": _bool(),
    "NTK_by_parts_low_freq_factor": _float(),
    "NTK_by_parts_high_freq_factor": _float(),
    "NTK_by_parts_factor": _float(),
    "NTK_original_ctx_len": _int(hi=MAX_N_CTX),
    "use_yarn_rope": _bool(),
    "yarn_factor": _float(),
    "yarn_attention_factor": _float(),
    "yarn_beta_fast": _float(),
    "yarn_beta_slow": _float(),
    "yarn_original_max_position_embeddings": _int(hi=MAX_N_CTX),
    "yarn_truncate": _bool(),
    "yarn_global_attn_only": _bool(),
    "use_local_attn": _bool(),
    "window_size": _int(hi=MAX_N_CTX, optional=True),
    "attn_types": _attn_types,
    "use_qk_norm": _bool(),
    "clip_qkv": _float(positive=True, optional=True),
    "use_logn_attn": _bool(),
    "train_seq_length": _int(hi=MAX_N_CTX, optional=True),
    "use_dynamic_ntk_rope": _bool(),
    "use_attention_sinks": _bool(),
    "post_embedding_ln": _bool(),
    "use_normalization_before_and_after": _bool(),
    "attn_scores_soft_cap": _float(),
    "output_logits_soft_cap": _float(),
    "tie_word_embeddings": _bool(),
    "num_experts": _int(optional=True),
    "experts_per_token": _int(optional=True),
    "norm_topk_prob": _bool(),
    "default_prepend_bos": _bool(),
    "tokenizer_prepends_bos": _bool(optional=True),
    "ungroup_grouped_query_attention": _bool(),
    "use_attn_result": _bool(),
    "use_split_qkv_input": _bool(),
    "use_hook_mlp_in": _bool(),
    "use_attn_in": _bool(),
    "use_hook_tokens": _bool(),
    "model_name": _str(),
    "original_architecture": _str(optional=True),
}

#: fields that say how a model was made or stored, not what it computes: dropped
IGNORED_CONFIG_FIELDS = frozenset({
    "n_params", "seed", "init_mode", "init_weights", "initializer_range", "checkpoint_index",
    "checkpoint_label_type", "checkpoint_value", "from_checkpoint", "n_devices", "device", "dtype",
    "load_in_4bit", "quantization_method", "relative_attention_max_distance",
    "relative_attention_num_buckets", "decoder_start_token_id",
})

#: fields that make TransformerLens load (and possibly run) code from elsewhere
REMOTE_CODE_FIELDS = ("tokenizer_name", "trust_remote_code")

_REQUIRED = ("d_model", "d_head", "n_layers", "n_ctx", "d_vocab")


def read_model_config(cfg_file: Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """The HookedTransformerConfig keyword arguments a model folder's config.json allows.

    Raises :class:`LoadError` for an unreadable or oversized file, a field circuitgraph does
    not read, a value of the wrong type or out of range, a missing ``act_fn`` (the model
    would silently run as ReLU), or ``tokenizer_name``/``trust_remote_code`` without
    ``model: {trust_remote_code: true}`` in the spec.
    """
    raw = read_json_file(cfg_file, "model config", MAX_CONFIG_BYTES)
    if not isinstance(raw, dict):
        raise LoadError(f"{cfg_file} must hold a JSON object of HookedTransformerConfig fields, "
                        f"got a {type(raw).__name__}")
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in raw.items():
        if key in IGNORED_CONFIG_FIELDS:
            continue
        if key in REMOTE_CODE_FIELDS:
            if value in (None, False):
                continue
            if not trust_remote_code:
                problems.append(
                    f"{key} is {_describe(value)}: it makes TransformerLens load a tokenizer (and, with "
                    "trust_remote_code, run its code) from elsewhere; circuitgraph reads the tokenizer from "
                    "the folder's tokenizer/: remove the field, or set model: {trust_remote_code: true} "
                    "in the spec if you trust its source"
                )
                continue
            out[key] = value
            continue
        check = CONFIG_FIELDS.get(key)
        if check is None:
            problems.append(f"unknown field {key!r} (circuitgraph reads only HookedTransformerConfig fields "
                            "that define the computation); remove it")
            continue
        problem = check(value)
        if problem:
            problems.append(f"{key}: {problem}")
        else:
            out[key] = value
    for key in _REQUIRED:
        if key not in raw:
            problems.append(f"missing required field {key!r}")
    if not out.get("attn_only", False) and raw.get("act_fn") is None:
        problems.append("act_fn is not given (TransformerLens would silently use relu); add e.g. "
                        '"act_fn": "gelu_new" (one of ' + ", ".join(_act_fns()) + ")")
    if not out.get("attn_only", False) and "d_mlp" in raw and raw.get("d_mlp") is None:
        problems.append("d_mlp is null but attn_only is false; give the MLP width")
    if problems:
        head = f"{cfg_file}: " + ("; ".join(problems[:5]))
        if len(problems) > 5:
            head += f"; ... ({len(problems)} problems)"
        raise LoadError(head)
    return out


def check_config_against_weights(cfg: dict[str, Any], n_weight_elements: int, where: Path) -> None:
    """Refuse configs whose model would be far larger than the weights file (bounded work).

    TransformerLens allocates every parameter and an ``n_ctx x n_ctx`` mask per layer when
    it builds the model; a hand-edited config could ask for terabytes before the weights are
    even compared.  The parameter count is estimated from the config (attention + MLP +
    embeddings) and must not exceed the file's element count by more than a factor of 4.
    """
    d_model, n_layers = cfg["d_model"], cfg["n_layers"]
    d_head, n_heads = cfg["d_head"], cfg.get("n_heads", 1)
    d_mlp = cfg.get("d_mlp") or 0
    gated = 3 if cfg.get("gated_mlp") else 2
    experts = cfg.get("num_experts") or 1
    d_vocab = cfg["d_vocab"]
    d_vocab_out = cfg.get("d_vocab_out", -1)
    d_vocab_out = d_vocab if d_vocab_out == -1 else d_vocab_out
    pos = cfg["n_ctx"] * d_model if cfg.get("positional_embedding_type", "standard") == "standard" else 0
    params = (n_layers * (4 * d_model * d_head * n_heads + experts * gated * d_model * d_mlp)
              + d_vocab * d_model + d_model * d_vocab_out + pos)
    if params > 4 * max(n_weight_elements, 1) + 1_000_000:
        raise LoadError(
            f"{where}: config.json describes a model of about {params:,} parameters but model.safetensors "
            f"holds {n_weight_elements:,} numbers; fix the sizes in config.json (d_model, d_mlp, d_vocab, "
            "n_layers, n_ctx...)"
        )
    mask_bytes = n_layers * cfg["n_ctx"] ** 2
    if mask_bytes > 8 * 2**30:
        raise LoadError(
            f"{where}: n_ctx {cfg['n_ctx']} with {n_layers} layers needs {mask_bytes / 2**30:.0f} GiB of attention "
            "masks; lower n_ctx in config.json to the longest prompt you will use"
        )
