"""A torch-only HookedTransformer for TransformerLens-format model folders.

``circuitgraph run`` on a TransformerLens folder (``config.json`` of HookedTransformerConfig fields +
``model.safetensors``, a HookedTransformer state dict) needs a forward pass with TransformerLens's hook
points, nothing more. Importing transformer_lens costs seconds (it imports transformers, torch's
compiler stack, datasets, pandas...), more than the attribution of a small model takes. This module
computes HookedTransformer's forward with torch alone, for the configurations in
:func:`native_unsupported`'s whitelist; anything else is loaded with TransformerLens as before.

Names mirror TransformerLens exactly: modules and parameters (``embed.W_E``, ``blocks.0.attn.W_Q``,
``blocks.0.attn._W_K`` for grouped-query attention, ``blocks.0.mlp.W_gate``, ``ln_final.w``...), so the
same state dict loads with the same strict checks; hook points (``blocks.0.ln1.hook_scale``,
``blocks.0.attn.hook_pattern``...) with the same values, computed in the same order with the same
operations (float64: equal to TransformerLens to rounding, tested at 1e-12); ``hooks()`` and
``run_with_cache()`` with TransformerLens's semantics (a hook function gets ``(value, hook=point)`` and
returns None or a replacement). :meth:`NativeTransformer.to_transformer_lens` builds the equivalent
``HookedTransformer`` for a caller that needs TransformerLens itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from circuitgraph.adapters.model_config import IGNORED_CONFIG_FIELDS

__all__ = ["NativeConfig", "NativeTransformer", "native_unsupported", "NATIVE_ACT_FNS", "NATIVE_VALUE_RULES"]


# ----------------------------------------------------------------------------- activation functions
def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, as TransformerLens writes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_pytorch_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


#: the activation functions of the native forward (TransformerLens's SUPPORTED_ACTIVATIONS entries)
NATIVE_ACT_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_new": gelu_new, "gelu_fast": gelu_fast, "silu": F.silu, "relu": F.relu, "gelu": F.gelu,
    "gelu_pytorch_tanh": gelu_pytorch_tanh,
}

# ----------------------------------------------------------------------------- the config
#: HookedTransformerConfig's fields and defaults (TransformerLens 3.x) that a model folder may set
_DEFAULTS: dict[str, Any] = {
    "n_heads": -1, "d_mlp": None, "d_vocab": -1, "d_vocab_out": -1, "model_name": "custom", "act_fn": "relu",
    "eps": 1e-5, "use_attn_scale": True, "attn_scale": -1.0, "use_hook_mlp_in": False, "use_attn_in": False,
    "use_qk_norm": False, "clip_qkv": None, "use_logn_attn": False, "train_seq_length": None,
    "use_dynamic_ntk_rope": False, "use_local_attn": False, "ungroup_grouped_query_attention": False,
    "original_architecture": None, "window_size": None, "attn_types": None, "normalization_type": "LN",
    "attention_dir": "causal", "attn_only": False, "scale_attn_by_inverse_layer_idx": False, "final_rms": False,
    "parallel_attn_mlp": False, "rotary_dim": None, "use_hook_tokens": False, "gated_mlp": False,
    "tokenizer_prepends_bos": None, "post_embedding_ln": False, "rotary_base": 10000, "rotary_base_local": None,
    "rotary_scaling_factor": 1.0, "rotary_adjacent_pairs": False, "num_experts": None, "experts_per_token": None,
    "tie_word_embeddings": False, "use_normalization_before_and_after": False, "attn_scores_soft_cap": -1.0,
    "output_logits_soft_cap": -1.0, "use_NTK_by_parts_rope": False, "NTK_by_parts_low_freq_factor": 1.0,
    "NTK_by_parts_high_freq_factor": 4.0, "NTK_by_parts_factor": 8.0, "NTK_original_ctx_len": 8192,
    "use_yarn_rope": False, "yarn_factor": 1.0, "yarn_attention_factor": 1.0, "yarn_beta_fast": 32.0,
    "yarn_beta_slow": 1.0, "yarn_original_max_position_embeddings": 4096, "yarn_truncate": True,
    "yarn_global_attn_only": False, "use_attention_sinks": False, "norm_topk_prob": False,
    "default_prepend_bos": True, "use_attn_result": False, "use_split_qkv_input": False,
    "n_key_value_heads": None, "uses_rms_norm": False, "layer_norm_folding": False,
    "tokenizer_name": None, "trust_remote_code": False,
}

#: the fields whose value the native forward does not implement, with the values it does: a folder with
#: any other value is loaded with TransformerLens
NATIVE_VALUE_RULES: dict[str, tuple[Any, ...]] = {
    "normalization_type": ("LN", "LNPre", "RMS", "RMSPre", None),
    "positional_embedding_type": ("standard", "rotary"),
    "attention_dir": ("causal", "bidirectional"),
    "rotary_scaling_factor": (1.0,),
    "use_NTK_by_parts_rope": (False,),
    "use_yarn_rope": (False,),
    "use_dynamic_ntk_rope": (False,),
    "use_local_attn": (False,),
    "use_qk_norm": (False,),
    "clip_qkv": (None,),
    "use_logn_attn": (False,),
    "use_attention_sinks": (False,),
    "post_embedding_ln": (False,),
    "use_normalization_before_and_after": (False,),
    "parallel_attn_mlp": (False,),
    "num_experts": (None, 0),
    "experts_per_token": (None, 0),
    "ungroup_grouped_query_attention": (False,),
    "use_attn_result": (False,),
    "use_split_qkv_input": (False,),
    "use_attn_in": (False,),
    "use_hook_mlp_in": (False,),
    "use_hook_tokens": (False,),
    "tokenizer_name": (None,),
    "trust_remote_code": (None, False),
}
#: original_architecture values that change TransformerLens's forward (query/key norms, output norms, MoE)
_ARCH_WITH_OWN_FORWARD = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "GptOssForCausalLM",
                          "BertForMaskedLM", "T5ForConditionalGeneration")


def native_unsupported(raw: dict[str, Any]) -> str | None:
    """Why the native forward cannot run the config ``raw`` (HookedTransformerConfig keyword arguments
    as :func:`~circuitgraph.adapters.model_config.read_model_config` returns them): ``"FIELD is VALUE"``
    for the first field outside the whitelist, None when it can."""
    for key, allowed in NATIVE_VALUE_RULES.items():
        value = raw.get(key, _DEFAULTS.get(key, "standard" if key == "positional_embedding_type" else None))
        if not any(value is a or (type(value) is type(a) and value == a) or
                   (isinstance(a, float) and isinstance(value, (int, float)) and not isinstance(value, bool)
                    and value == a) for a in allowed):
            return f"{key} is {value!r} (native: {', '.join(map(repr, allowed))})"
    if raw.get("original_architecture") in _ARCH_WITH_OWN_FORWARD:
        return f"original_architecture is {raw['original_architecture']!r}"
    act = raw.get("act_fn", _DEFAULTS["act_fn"])
    if not raw.get("attn_only", False) and act not in NATIVE_ACT_FNS:
        return f"act_fn is {act!r} (native: {', '.join(NATIVE_ACT_FNS)})"
    return None


def _derived() -> Any:
    """A :class:`NativeConfig` attribute derived in ``__post_init__``: not an argument of the
    constructor, and not part of its repr or equality (``extra`` is)."""
    return dataclasses.field(init=False, repr=False, compare=False)


@dataclass
class NativeConfig:
    """HookedTransformerConfig's fields with their derived defaults computed as TransformerLens
    computes them (``n_heads`` from ``d_head``, ``d_mlp = 4 d_model``, ``d_vocab_out = d_vocab``,
    ``rotary_dim = d_head``, ``attn_scale = sqrt(d_head)``); the fields are attributes, as on
    ``model.cfg`` of a HookedTransformer."""

    d_model: int
    d_head: int
    n_layers: int
    n_ctx: int
    positional_embedding_type: str = "standard"
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    # the HookedTransformerConfig fields the native forward reads, set in __post_init__ from ``extra``
    # and _DEFAULTS (every key of _DEFAULTS is set; these are the ones code reads by name)
    n_heads: int = _derived()
    d_mlp: int = _derived()
    d_vocab: int = _derived()
    d_vocab_out: int = _derived()
    act_fn: str = _derived()
    eps: float = _derived()
    use_attn_scale: bool = _derived()
    attn_scale: float = _derived()
    scale_attn_by_inverse_layer_idx: bool = _derived()
    n_key_value_heads: int | None = _derived()
    normalization_type: str | None = _derived()
    final_rms: bool = _derived()
    attention_dir: str = _derived()
    attn_only: bool = _derived()
    gated_mlp: bool = _derived()
    rotary_dim: int | None = _derived()
    rotary_base: float = _derived()
    rotary_adjacent_pairs: bool = _derived()
    attn_scores_soft_cap: float = _derived()
    output_logits_soft_cap: float = _derived()

    def __post_init__(self) -> None:
        for key, value in _DEFAULTS.items():
            setattr(self, key, self.extra.get(key, value))
        unknown = sorted(set(self.extra) - set(_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown HookedTransformerConfig field {unknown[0]!r}")
        if self.n_heads == -1:
            if self.d_model % self.d_head:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by d_head ({self.d_head})")
            self.n_heads = self.d_model // self.d_head
        if self.d_mlp is None:
            self.d_mlp = self.d_model * 4
        if not self.attn_only and self.act_fn not in NATIVE_ACT_FNS:
            raise ValueError(f"act_fn={self.act_fn} is not one of {', '.join(NATIVE_ACT_FNS)}")
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        if self.positional_embedding_type == "rotary" and self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.use_attn_scale and self.attn_scale == -1.0:
            self.attn_scale = math.sqrt(self.d_head)
        if self.n_key_value_heads is not None and self.n_heads % self.n_key_value_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_key_value_heads "
                             f"({self.n_key_value_heads})")
        if self.d_vocab == -1:
            raise ValueError("d_vocab must be given (there is no tokenizer to infer it from)")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> NativeConfig:
        """From HookedTransformerConfig keyword arguments (``init_weights`` and other bookkeeping
        fields of TransformerLens's own are accepted and dropped)."""
        own = {k: kwargs.pop(k) for k in ("d_model", "d_head", "n_layers", "n_ctx", "positional_embedding_type",
                                           "dtype", "device") if k in kwargs}
        for k in IGNORED_CONFIG_FIELDS | {"init_weights"}:
            kwargs.pop(k, None)
        return cls(**own, extra=kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The HookedTransformerConfig keyword arguments of this config (:meth:`NativeTransformer.to_transformer_lens`)."""
        out = {k: getattr(self, k) for k in ("d_model", "d_head", "n_layers", "n_ctx", "positional_embedding_type",
                                             "dtype", "device")}
        out.update({k: getattr(self, k) for k in _DEFAULTS})
        return out

    @property
    def rotary_size(self) -> int:
        """The rotated width of a rotary model's heads: ``rotary_dim`` (``d_head`` unless given)."""
        return self.d_head if self.rotary_dim is None else self.rotary_dim

    def is_layer_norm_activation(self) -> bool:
        return self.act_fn is not None and self.act_fn.endswith("_ln")


# ----------------------------------------------------------------------------- hook points
class HookPoint(nn.Module):
    """The identity, with a ``name`` (its module path) that hook functions receive; hooks are torch
    forward hooks on it, as in TransformerLens."""

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None

    @property
    def fwd_hooks(self) -> list[Any]:
        """The forward hooks on this point (TransformerLens keeps the same list)."""
        return list(self._forward_hooks.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


# ----------------------------------------------------------------------------- norms
class _Norm(nn.Module):
    """TransformerLens's four norms in one: ``centre`` subtracts the mean (LayerNorm), ``weight`` /
    ``bias`` are the learned ``w`` / ``b`` (absent in the folded ``*Pre`` variants); the scale is
    ``sqrt(mean(x^2) + eps)``, computed in float32 at least, as TransformerLens does."""

    centre = weight = bias = False

    def __init__(self, cfg: NativeConfig):
        super().__init__()
        self.cfg = cfg
        self.eps = cfg.eps
        self.length = cfg.d_model
        if self.weight:
            self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))
        if self.bias:
            self.b = nn.Parameter(torch.zeros(self.length, dtype=cfg.dtype))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.dtype not in (torch.float32, torch.float64):
            x = x.to(torch.float32)
        if self.centre:
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale).to(self.cfg.dtype)
        if self.weight:
            x = x * self.w
        return x + self.b if self.bias else x


class LayerNorm(_Norm):
    centre = weight = bias = True


class LayerNormPre(_Norm):
    centre = True


class RMSNorm(_Norm):
    weight = True


class RMSNormPre(_Norm):
    pass


def _norm(cfg: NativeConfig, final: bool = False) -> nn.Module:
    kind = cfg.normalization_type
    if final and cfg.final_rms and kind is not None:
        kind = {"LN": "RMS", "LNPre": "RMSPre"}.get(kind, kind)
    if kind is None:
        return nn.Identity()
    return {"LN": LayerNorm, "LNPre": LayerNormPre, "RMS": RMSNorm, "RMSPre": RMSNormPre}[kind](cfg)


# ----------------------------------------------------------------------------- embeddings
class Embed(nn.Module):
    def __init__(self, cfg: NativeConfig):
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_E[tokens, :]


class PosEmbed(nn.Module):
    def __init__(self, cfg: NativeConfig):
        super().__init__()
        self.cfg = cfg
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.size(-1)
        return self.W_pos[:n, :].unsqueeze(0).expand(tokens.size(0), -1, -1).clone()


class Unembed(nn.Module):
    def __init__(self, cfg: NativeConfig):
        super().__init__()
        self.cfg = cfg
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype))
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        residual = self.hook_in(residual)
        return self.hook_out(F.linear(residual, self.W_U.T.contiguous(), self.b_U))


def _softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    if cap is None or cap <= 0:
        return x
    return cap * torch.tanh(x / cap)


# ----------------------------------------------------------------------------- attention
def _parameter(params: dict[str, nn.Parameter | None], name: str) -> nn.Parameter:
    """A registered parameter of an attention module (every one of them is a tensor)."""
    value = params[name]
    if value is None:
        raise ValueError(f"attention parameter {name} is not set")
    return value


def _attn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TransformerLens's ``simple_attn_linear``: ``(batch, pos, d_model) -> (batch, pos, heads, d_head)``."""
    w2 = w.permute(0, 2, 1).reshape(-1, w.shape[1])  # (head d_head) d_model
    return F.linear(x, w2, b.reshape(-1)).reshape(x.shape[0], x.shape[1], b.shape[0], b.shape[1])


class Attention(nn.Module):
    """TransformerLens's ``Attention`` and ``GroupedQueryAttention`` (``n_key_value_heads`` set: the
    key/value weights are ``_W_K``/``_W_V``/``_b_K``/``_b_V`` with one head per key/value head, and
    ``W_K``... are the expanded views)."""

    ROTARY_INITIAL_CACHE_SIZE = 2048

    def __init__(self, cfg: NativeConfig, layer_id: int):
        super().__init__()
        self.cfg = cfg
        H, dm, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(H, dm, dh, dtype=cfg.dtype))
        self.W_O = nn.Parameter(torch.empty(H, dh, dm, dtype=cfg.dtype))
        kv = cfg.n_key_value_heads
        self.grouped = kv is not None
        if kv is not None:
            self.repeat_kv_heads = H // kv
            self._W_K = nn.Parameter(torch.empty(kv, dm, dh, dtype=cfg.dtype))
            self._W_V = nn.Parameter(torch.empty(kv, dm, dh, dtype=cfg.dtype))
            self._b_K = nn.Parameter(torch.zeros(kv, dh, dtype=cfg.dtype))
            self._b_V = nn.Parameter(torch.zeros(kv, dh, dtype=cfg.dtype))
        else:
            self.W_K = nn.Parameter(torch.empty(H, dm, dh, dtype=cfg.dtype))
            self.W_V = nn.Parameter(torch.empty(H, dm, dh, dtype=cfg.dtype))
        self.b_Q = nn.Parameter(torch.zeros(H, dh, dtype=cfg.dtype))
        if not self.grouped:
            self.b_K = nn.Parameter(torch.zeros(H, dh, dtype=cfg.dtype))
            self.b_V = nn.Parameter(torch.zeros(H, dh, dtype=cfg.dtype))
        self.b_O = nn.Parameter(torch.zeros(dm, dtype=cfg.dtype))
        self.q_norm = None
        self.k_norm = None
        self.attn_type = "global"
        self.register_buffer("mask", torch.empty((0, 0), dtype=torch.bool))
        self.register_buffer("IGNORE", torch.tensor(-torch.inf))
        self.layer_id = layer_id
        self.attn_scale = cfg.attn_scale if cfg.use_attn_scale else 1.0
        if cfg.scale_attn_by_inverse_layer_idx:
            self.attn_scale *= layer_id + 1
        self.hook_k = HookPoint()
        self.hook_q = HookPoint()
        self.hook_v = HookPoint()
        self.hook_z = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_result = HookPoint()
        if cfg.positional_embedding_type == "rotary":
            self.hook_rot_k = HookPoint()
            self.hook_rot_q = HookPoint()
            sin, cos = self.calculate_sin_cos_rotary(cfg.rotary_size, min(cfg.n_ctx, self.ROTARY_INITIAL_CACHE_SIZE),
                                                     base=cfg.rotary_base, dtype=cfg.dtype)
            self.register_buffer("rotary_sin", sin)
            self.register_buffer("rotary_cos", cos)

    # grouped-query attention: the expanded key/value weights, as TransformerLens's properties
    def __getattr__(self, name: str) -> Any:
        if name in ("W_K", "W_V", "b_K", "b_V"):
            params = self.__dict__.get("_parameters", {})
            if "_" + name in params:
                return torch.repeat_interleave(params["_" + name], dim=0, repeats=self.__dict__["repeat_kv_heads"])
        return super().__getattr__(name)

    def calculate_sin_cos_rotary(self, rotary_dim: int, n_ctx: int, base: float = 10000,
                                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        high_precision = torch.float32 if dtype != torch.float64 else torch.float64
        pos = torch.arange(n_ctx, dtype=high_precision)
        dim = torch.arange(rotary_dim // 2, dtype=high_precision)
        freq = base ** (dim / (rotary_dim / 2))
        freq = freq.repeat_interleave(2) if self.cfg.rotary_adjacent_pairs else freq.repeat(2)
        angles = pos[:, None] / freq[None, :]
        return torch.sin(angles).to(dtype), torch.cos(angles).to(dtype)

    def rotate_every_two(self, x: torch.Tensor) -> torch.Tensor:
        rot_x = x.clone()
        if self.cfg.rotary_adjacent_pairs:
            rot_x[..., ::2] = -x[..., 1::2]
            rot_x[..., 1::2] = x[..., ::2]
        else:
            n = x.size(-1) // 2
            rot_x[..., :n] = -x[..., n:]
            rot_x[..., n:] = x[..., :n]
        return rot_x

    def apply_rotary(self, x: torch.Tensor, past_kv_pos_offset: int = 0, attention_mask: Any = None) -> torch.Tensor:
        """TransformerLens's ``apply_rotary`` (no attention mask: unpadded prompts)."""
        if attention_mask is not None:
            raise NotImplementedError("the native forward runs unpadded prompts only (no padding mask)")
        if x.device != self.rotary_sin.device:
            x = x.to(self.rotary_sin.device)
        x_pos = x.size(1)
        x_rot = x[..., : self.cfg.rotary_dim]
        x_pass = x[..., self.cfg.rotary_dim:]
        x_flip = self.rotate_every_two(x_rot)
        needed = past_kv_pos_offset + x_pos
        if needed > self.rotary_cos.shape[0]:
            size = min(self.cfg.n_ctx, max(needed, 2 * self.rotary_cos.shape[0]))
            sin, cos = self.calculate_sin_cos_rotary(self.cfg.rotary_size, size, base=self.cfg.rotary_base,
                                                     dtype=self.cfg.dtype)
            self.rotary_sin = sin.to(self.rotary_sin.device)
            self.rotary_cos = cos.to(self.rotary_cos.device)
        cos = self.rotary_cos[None, past_kv_pos_offset:needed, None, :]
        sin = self.rotary_sin[None, past_kv_pos_offset:needed, None, :]
        return torch.cat([x_rot * cos + x_flip * sin, x_pass], dim=-1)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # as TransformerLens: a saved buffer of another length (an older mask or rotary table) keeps ours
        for buffer_name in ("mask", "rotary_sin", "rotary_cos"):
            key = prefix + buffer_name
            saved, current = state_dict.get(key), getattr(self, buffer_name, None)
            if isinstance(saved, torch.Tensor) and isinstance(current, torch.Tensor) and saved.shape != current.shape:
                state_dict = state_dict.copy()
                state_dict[key] = current
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, query_input: torch.Tensor, key_input: torch.Tensor, value_input: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        p = self._parameters
        if self.grouped:
            q = self.hook_q(_attn_linear(query_input, self.W_Q, self.b_Q))
            k = self.hook_k(_attn_linear(key_input, _parameter(p, "_W_K"), _parameter(p, "_b_K")))
            v = self.hook_v(_attn_linear(value_input, _parameter(p, "_W_V"), _parameter(p, "_b_V")))
        else:
            q = self.hook_q(_attn_linear(query_input, self.W_Q, self.b_Q))
            k = self.hook_k(_attn_linear(key_input, _parameter(p, "W_K"), _parameter(p, "b_K")))
            v = self.hook_v(_attn_linear(value_input, _parameter(p, "W_V"), _parameter(p, "b_V")))
        if cfg.positional_embedding_type == "rotary":
            q = self.hook_rot_q(self.apply_rotary(q, 0))
            k = self.hook_rot_k(self.apply_rotary(k, 0))
        if self.grouped:
            k = torch.repeat_interleave(k, dim=2, repeats=self.repeat_kv_heads)
        scores = q.permute(0, 2, 1, 3) @ k.permute(0, 2, 3, 1) / self.attn_scale
        scores = _softcap(scores, cfg.attn_scores_soft_cap)
        if cfg.attention_dir == "causal":
            T, S = scores.size(-2), scores.size(-1)
            keep = torch.arange(S, device=scores.device)[None, :] <= torch.arange(T, device=scores.device)[:, None]
            scores = torch.where(keep[None, None], scores, self.IGNORE.to(scores.device))
        scores = self.hook_attn_scores(scores)
        pattern = F.softmax(scores, dim=-1)
        pattern = torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern)
        pattern = self.hook_pattern(pattern)
        pattern = pattern.to(device=v.device, dtype=v.dtype)
        if self.grouped:
            v = torch.repeat_interleave(v, dim=2, repeats=self.repeat_kv_heads)
        z = self.hook_z((pattern @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3))
        w = self.W_O.permute(2, 0, 1).reshape(cfg.d_model, cfg.n_heads * cfg.d_head).contiguous()
        if z.dtype != w.dtype:
            z = z.to(w.dtype)
        z = z.reshape(z.shape[0], z.shape[1], cfg.d_head * cfg.n_heads)
        return F.linear(z, w, self.b_O)


# ----------------------------------------------------------------------------- MLPs
class MLP(nn.Module):
    def __init__(self, cfg: NativeConfig):
        super().__init__()
        self.cfg = cfg
        self.d_mlp = cfg.d_mlp
        self.act_fn = NATIVE_ACT_FNS[cfg.act_fn]
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=cfg.dtype))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model, dtype=cfg.dtype))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    @staticmethod
    def _addmm(bias: torch.Tensor, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """TransformerLens's ``batch_addmm`` (Hugging Face's Conv1D)."""
        size_out = x.size()[:-1] + (weight.shape[-1],)
        return torch.addmm(bias, x.view(-1, x.size(-1)), weight).view(size_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(self._addmm(self.b_in, self.W_in, x))
        post = self.hook_post(self.act_fn(pre))
        return self._addmm(self.b_out, self.W_out, post)


class GatedMLP(nn.Module):
    """``post = act(x @ W_gate) * (x @ W_in) + b_in``, ``out = post @ W_out + b_out`` (TransformerLens's
    ``GatedMLP``, b_in added after the product)."""

    def __init__(self, cfg: NativeConfig):
        super().__init__()
        self.cfg = cfg
        self.d_mlp = cfg.d_mlp
        self.act_fn = NATIVE_ACT_FNS[cfg.act_fn]
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model, dtype=cfg.dtype))
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=cfg.dtype))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp, dtype=cfg.dtype))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(F.linear(x, self.W_gate.T.contiguous()))
        pre_linear = self.hook_pre_linear(F.linear(x, self.W_in.T.contiguous()))
        post = self.hook_post((self.act_fn(pre) * pre_linear) + self.b_in)
        return F.linear(post, self.W_out.T.contiguous(), self.b_out)


# ----------------------------------------------------------------------------- blocks and the model
class TransformerBlock(nn.Module):
    def __init__(self, cfg: NativeConfig, block_index: int):
        super().__init__()
        self.cfg = cfg
        self.ln1 = _norm(cfg)
        if not cfg.attn_only:
            self.ln2 = _norm(cfg)
        self.attn = Attention(cfg, block_index)
        if not cfg.attn_only:
            self.mlp = GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg)
        self.hook_attn_in = HookPoint()
        self.hook_q_input = HookPoint()
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()
        self.hook_mlp_in = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_pre = HookPoint()
        if not cfg.attn_only:
            self.hook_resid_mid = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: torch.Tensor) -> torch.Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        # TransformerLens normalises the query, key and value inputs separately (three ln1 calls: a
        # hook on ln1 sees each), and adds 0.0 to the query and key inputs
        attn_out = self.attn(query_input=self.ln1(resid_pre) + 0.0, key_input=self.ln1(resid_pre) + 0.0,
                             value_input=self.ln1(resid_pre))
        attn_out = self.hook_attn_out(attn_out)
        if self.cfg.attn_only:
            return self.hook_resid_post(resid_pre + attn_out)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


class NativeTransformer(nn.Module):
    """HookedTransformer's forward, modules, parameters, buffers and hook points for the configs of
    :func:`native_unsupported`'s whitelist, without TransformerLens. ``model(tokens)`` returns the logits
    ``(batch, pos, d_vocab_out)``."""

    def __init__(self, cfg: NativeConfig):
        super().__init__()
        reason = native_unsupported(cfg.to_dict())
        if reason is not None:
            raise ValueError(f"the native forward does not implement this config: {reason}")
        self.cfg = cfg
        self.tokenizer = None
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        if cfg.positional_embedding_type != "rotary":
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList([TransformerBlock(cfg, i) for i in range(cfg.n_layers)])
        if cfg.normalization_type is not None:
            self.ln_final = _norm(cfg, final=True)
        self.unembed = Unembed(cfg)
        self.hook_dict: dict[str, HookPoint] = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    # the weights HookedTransformer exposes as properties
    @property
    def W_E(self) -> torch.Tensor:
        return self.embed.W_E

    @property
    def W_pos(self) -> torch.Tensor:
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> torch.Tensor:
        return self.unembed.W_U

    @property
    def b_U(self) -> torch.Tensor:
        return self.unembed.b_U

    def forward(self, input: torch.Tensor, return_type: str | None = "logits", *,
                stop_at_layer: int | None = None) -> torch.Tensor | None:
        if return_type not in ("logits", None):
            raise ValueError(f"return_type {return_type!r}: the native forward returns logits (or None)")
        tokens = input if input.dim() > 1 else input[None]
        if tokens.device != self.embed.W_E.device:
            tokens = tokens.to(self.embed.W_E.device)
        residual = self.hook_embed(self.embed(tokens))
        if self.cfg.positional_embedding_type == "standard":
            residual = residual + self.hook_pos_embed(self.pos_embed(tokens))
        for block in list(self.blocks)[:stop_at_layer]:
            residual = block(residual)
        if stop_at_layer is not None:
            return residual
        if self.cfg.normalization_type is not None:
            residual = self.ln_final(residual)
        if return_type is None:
            return None
        return _softcap(self.unembed(residual), self.cfg.output_logits_soft_cap)

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[str | Callable[[str], bool], Callable]] = (),
              bwd_hooks: Sequence[Any] = (), reset_hooks_end: bool = True,
              clear_contexts: bool = False) -> Iterator[NativeTransformer]:
        """Scoped forward hooks, as TransformerLens's ``hooks``: ``(name or filter, fn)`` pairs, ``fn(value,
        hook=point)`` returns None or a replacement; removed on exit, even on error."""
        if bwd_hooks:
            raise NotImplementedError("the native model has forward hooks only")
        handles = []
        try:
            for name, fn in fwd_hooks:
                points = ([self.hook_dict[name]] if isinstance(name, str) else
                          [p for n, p in self.hook_dict.items() if name(n)])
                for point in points:
                    handles.append(point.register_forward_hook(
                        lambda module, args, output, fn=fn: fn(output, hook=module)))
            yield self
        finally:
            for h in handles:
                h.remove()

    def run_with_hooks(self, *args: Any, fwd_hooks: Sequence[tuple[Any, Callable]] = (),
                       bwd_hooks: Sequence[Any] = (), **kwargs: Any) -> Any:
        """``model(*args, **kwargs)`` under :meth:`hooks` (TransformerLens's ``run_with_hooks``)."""
        with self.hooks(fwd_hooks, bwd_hooks):
            return self(*args, **kwargs)

    def run_with_cache(self, *args: Any, names_filter: Any = None, **kwargs: Any) -> tuple[Any, dict[str, torch.Tensor]]:
        """``(model output, {hook name: value detached})``, as TransformerLens's ``run_with_cache``
        (``names_filter``: None for every hook, a name, a list of names or a predicate)."""
        if names_filter is None:
            keep = lambda n: True  # noqa: E731
        elif isinstance(names_filter, str):
            keep = lambda n: n == names_filter  # noqa: E731
        elif callable(names_filter):
            keep = names_filter
        else:
            wanted = set(names_filter)
            keep = lambda n: n in wanted  # noqa: E731
        cache: dict[str, torch.Tensor] = {}

        def save(value: torch.Tensor, hook: HookPoint) -> None:
            if hook.name is not None:  # every point of hook_dict is named
                cache[hook.name] = value.detach()

        with self.hooks([(n, save) for n in self.hook_dict if keep(n)]):
            out = self(*args, **kwargs)
        return out, cache

    def to(self, *args: Any, **kwargs: Any) -> NativeTransformer:
        """``nn.Module.to``, keeping ``cfg.dtype`` / ``cfg.device`` in step (as TransformerLens does: the
        norms cast to ``cfg.dtype``)."""
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.dtype):
                self.cfg.dtype = a
            elif isinstance(a, (str, torch.device)):
                self.cfg.device = str(a)
        return super().to(*args, **kwargs)

    def to_transformer_lens(self) -> Any:
        """The equivalent ``HookedTransformer`` (same config, weights copied), for callers that need
        TransformerLens itself; imports transformer_lens."""
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        cfg = HookedTransformerConfig(**{**self.cfg.to_dict(), "init_weights": False})
        with contextlib.redirect_stdout(io.StringIO()):
            model = HookedTransformer(cfg, move_to_device=False)
        result = model.load_state_dict(self.state_dict(), strict=False)
        buffers = {n for n, _ in model.named_buffers()}
        missing = [k for k in result.missing_keys if k not in buffers]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"HookedTransformer does not take the native state dict: missing {missing[:5]}, "
                               f"unexpected {list(result.unexpected_keys)[:5]}")
        torch.nn.Module.to(model, self.embed.W_E.device)
        return model.train(self.training)
