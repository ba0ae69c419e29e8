"""The model adapter: the only place that knows TransformerLens names and architecture facts.

The engine never reads ``model.cfg`` or builds hook names itself; it asks the adapter for
weights (as plain tensors, grouped-query heads already expanded) and hook names.

:class:`ModelAdapter` is put together from one part per reason to change: hook names
(:mod:`circuitgraph.adapters.hook_names`), norms (:mod:`circuitgraph.adapters.norms`), weights
(:mod:`circuitgraph.adapters.model_weights`) and mixture-of-experts layers
(:mod:`circuitgraph.adapters.moe`); this module keeps loading-time checks, the facts, the virtual
hooks and the forward passes.

Norms are written ``N(x) = gamma * P(x) / sigma(x) + beta`` with ``P`` the mean-removal for
LayerNorm and the identity for RMSNorm (``beta = 0``).  For folded norms (TransformerLens
``LNPre``/``RMSPre``) ``gamma = 1`` and ``beta = 0``: the weights were folded into the next
layer, and :attr:`ArchitectureFacts.ln_folded` records it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from circuitgraph.adapters.facts import ArchitectureFacts, NormKind
from circuitgraph.adapters.hook_names import HookNames
from circuitgraph.adapters.moe import MixtureOfExperts
from circuitgraph.adapters.native_transformer import NativeTransformer
from circuitgraph.adapters.norms import Norms, NormWeights, _qk_norm_kind
from circuitgraph.errors import AttributionError, LoadError

if TYPE_CHECKING:
    from circuitgraph.adapters.hook_names import HookPointLike
    from circuitgraph.adapters.tokenizer import Tokenizer

__all__ = ["ArchitectureFacts", "NormWeights", "ModelAdapter"]


_NORM_KINDS: dict[Any, NormKind] = {"LN": "layernorm", "LNPre": "layernorm", "RMS": "rmsnorm",
                                     "RMSPre": "rmsnorm", None: "none"}

_UNSUPPORTED_ARCH = {"BertForMaskedLM", "T5ForConditionalGeneration"}
#: TransformerLens architectures whose ``ln1`` / ``ln2`` normalise the attention / MLP *output*
#: (TransformerLens's POST_NORM_ARCHITECTURES): the adapter presents them as post-norms
#: (``ln1_post`` / ``ln2_post``) of blocks without input norms
_OUTPUT_NORM_ARCH = {"Olmo2ForCausalLM", "Olmo3ForCausalLM"}
#: where a model format comes from: a TransformerLens folder / name, or a Hugging Face folder / snapshot
ModelFormat = Literal["transformer_lens", "huggingface"]
ModelBackendName = Literal["native", "transformer_lens"]


@dataclass(frozen=True)
class _VirtualHookPoint:
    """What a virtual hook's function receives as ``hook`` (TransformerLens passes a HookPoint)."""

    name: str


class ModelAdapter(HookNames, Norms, MixtureOfExperts):
    """Wraps a TransformerLens ``HookedTransformer`` and records its architecture facts.

    ``format`` says where it came from (``transformer_lens``: a TransformerLens folder or name;
    ``huggingface``: a Hugging Face folder or snapshot, ``family`` its row of
    :data:`circuitgraph.adapters.hf_config.FAMILIES`)."""

    def __init__(self, model: Any, *, tokenizer: Tokenizer | None = None, source: dict[str, Any] | None = None,
                 format: ModelFormat = "transformer_lens", family: str | None = None,
                 quantisation: dict[str, Any] | None = None):
        cfg = model.cfg
        if getattr(cfg, "original_architecture", None) in _UNSUPPORTED_ARCH:
            raise LoadError(
                f"architecture {cfg.original_architecture} is not a pre-norm decoder; "
                "circuitgraph supports pre-norm causal transformers (GPT-2, Llama, Gemma, ...)"
            )
        if cfg.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre", None):
            raise LoadError(
                f"normalization_type {cfg.normalization_type!r} is not supported; "
                "expected LN, LNPre, RMS, RMSPre or None (no norms)"
            )
        if getattr(cfg, "attention_dir", "causal") not in ("causal", "bidirectional"):
            raise LoadError(f"attention_dir {cfg.attention_dir!r} is not supported; expected causal or bidirectional")
        if cfg.positional_embedding_type not in ("standard", "rotary"):
            raise LoadError(
                f"positional_embedding_type {cfg.positional_embedding_type!r} is not supported; "
                "expected 'standard' (learned) or 'rotary'"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.source = dict(source or {})
        self.format = format
        #: the row of circuitgraph.adapters.hf_config.FAMILIES (config.json model_type), None otherwise
        self.family = family
        #: the quantised checkpoint the weights were dequantised from (a GGUF file's type and tensor
        #: types, circuitgraph.adapters.gguf), None for weights as published
        self.quantisation = dict(quantisation) if quantisation is not None else None
        #: which implementation runs the forward: ``native`` (circuitgraph's torch-only HookedTransformer,
        #: circuitgraph.adapters.native_transformer) or ``transformer_lens``
        self.backend: ModelBackendName = "native" if isinstance(model, NativeTransformer) else "transformer_lens"
        output_norms = getattr(cfg, "original_architecture", None) in _OUTPUT_NORM_ARCH
        n_kv = cfg.n_key_value_heads if cfg.n_key_value_heads is not None else cfg.n_heads
        soft = lambda v: None if v is None or v <= 0 else float(v)  # noqa: E731
        self.facts = ArchitectureFacts(
            n_layers=cfg.n_layers,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            n_kv_heads=n_kv,
            d_head=cfg.d_head,
            d_mlp=cfg.d_mlp,
            d_vocab=cfg.d_vocab,
            n_ctx=cfg.n_ctx,
            norm=_NORM_KINDS[cfg.normalization_type],
            ln_folded=cfg.normalization_type in ("LNPre", "RMSPre"),
            gated_mlp=bool(cfg.gated_mlp),
            act_fn=str(cfg.act_fn),
            positional="learned" if cfg.positional_embedding_type == "standard" else "rotary",
            grouped_query=n_kv != cfg.n_heads,
            post_norms=bool(cfg.use_normalization_before_and_after) or output_norms,
            parallel_attn_mlp=bool(cfg.parallel_attn_mlp),
            attn_scores_soft_cap=soft(getattr(cfg, "attn_scores_soft_cap", -1.0)),
            output_logits_soft_cap=soft(getattr(cfg, "output_logits_soft_cap", -1.0)),
            attention_sinks=bool(getattr(cfg, "use_attention_sinks", False)),
            qk_norm=_qk_norm_kind(model),
            num_experts=int(getattr(cfg, "num_experts", None) or 0),
            experts_per_token=int(getattr(cfg, "experts_per_token", None) or 0),
            attn_only=bool(getattr(cfg, "attn_only", False)),
            causal=getattr(cfg, "attention_dir", "causal") == "causal",
            input_norms=not output_norms,
        )
        #: GPT-OSS experts (TransformerLens ``GptOssMoE``): biased, clamped SwiGLU, softmax after the top-k
        self._gpt_oss = bool(self.facts.num_experts) and type(model.blocks[0].mlp).__name__ == "GptOssMoE"
        if self.facts.parallel_attn_mlp and self.facts.post_norms:
            raise LoadError("parallel attention/MLP blocks with post-norms are not supported")

    # ------------------------------------------------------------------ virtual hooks and forward passes
    def _virtual_layer(self, name: str) -> int | None:
        """The layer of a virtual ``blocks.<l>.mlp.hook_out`` hook on a post-norm model, else None."""
        m = re.fullmatch(r"blocks\.(\d+)\.mlp\.hook_out", name)
        if m and self.facts.post_norms and int(m.group(1)) < self.facts.n_layers:
            return int(m.group(1))
        return None

    def hook_alias(self, name: str) -> str | None:
        """The hook that carries ``name``'s value on a model without it, ``""`` where the value does
        not exist (nothing to hook), None where ``name`` is a real hook or unknown.

        Norm-free models: ``ln1/ln2/ln_final.hook_normalized`` are the identity of their input
        (resid_pre, resid_mid, the last resid_post).  Attention-only models: ``hook_resid_mid`` is
        ``hook_resid_post`` and the MLP hooks (``hook_mlp_out``, ``mlp.hook_*``) do not exist."""
        if name in self.model.hook_dict:
            return None
        m = re.fullmatch(r"blocks\.(\d+)\.(hook_resid_mid|hook_mlp_out|mlp\.hook_\w+|ln[12]\.hook_normalized)", name)
        if name == "ln_final.hook_normalized" and self.facts.norm == "none":
            return self.hook_resid_post(self.facts.n_layers - 1)
        if m is None:
            return None
        layer, what = int(m.group(1)), m.group(2)
        if self.facts.attn_only:
            if what in ("hook_resid_mid", "ln2.hook_normalized"):
                return self.hook_resid_post(layer)
            if what == "hook_mlp_out" or what.startswith("mlp."):
                return ""
        if self.facts.norm == "none" and what.endswith("hook_normalized"):
            return self.hook_resid_pre(layer) if what.startswith("ln1") else self.hook_resid_mid(layer)
        return None

    def transformer_lens_model(self) -> Any:
        """The model as a TransformerLens ``HookedTransformer``, for the callers that need its own
        options (``use_split_qkv_input``): the model itself, or for the native backend its conversion
        (:meth:`NativeTransformer.to_transformer_lens`: same config and weights), built once per
        dtype and device."""
        if not isinstance(self.model, NativeTransformer):
            return self.model
        key = (self.dtype, self.device)
        cached = getattr(self, "_tl_model", None)
        if cached is None or cached[0] != key:
            cached = (key, self.model.to_transformer_lens())
            self._tl_model = cached
        return cached[1]

    def has_hook(self, name: str) -> bool:
        return name in self.model.hook_dict or self._virtual_layer(name) is not None or bool(self.hook_alias(name))

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[str, Callable]]) -> Iterator[Any]:
        """Scoped forward hooks, as TransformerLens's ``model.hooks``, plus the aliases of models
        without norms or MLPs (:meth:`hook_alias`) and the virtual
        ``blocks.<l>.mlp.hook_out`` of post-norm models (see :meth:`hook_mlp_out_before_post_norm`):
        its function gets ``(mlp_output, hook)`` and may return a replacement, which the post-norm
        then normalises.  Every hook is removed on exit, even on error."""
        real, handles = [], []
        try:
            for name, fn in fwd_hooks:
                alias = self.hook_alias(name)
                if alias == "":  # the value does not exist in this model (an attention-only model's MLP)
                    continue
                if alias is not None:  # the function sees the name it asked for
                    point = _VirtualHookPoint(name)
                    real.append((alias, lambda value, hook, fn=fn, point=point: fn(value, point)))
                    continue
                layer = self._virtual_layer(name)
                if layer is None:
                    real.append((name, fn))
                    continue
                point = _VirtualHookPoint(name)

                def pre(module: Any, args: tuple, fn: Callable = fn, point: _VirtualHookPoint = point) -> Any:
                    out = fn(args[0], point)
                    return None if out is None else (out, *args[1:])

                module = getattr(self.model.blocks[layer], self._present_norm_module_name("ln2_post"))
                handles.append(module.register_forward_pre_hook(pre))
            with self.model.hooks(fwd_hooks=real):
                yield self.model
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def run_with_cache(self, tokens: torch.Tensor, names: set[str] | Sequence[str]) -> tuple[torch.Tensor, dict]:
        """``(logits, {name: value})`` of one forward pass on ``tokens (batch, pos)``, for hook
        names including the virtual ``mlp.hook_out`` ones."""
        cache: dict[str, torch.Tensor] = {}

        def keep(value: torch.Tensor, hook: HookPointLike) -> torch.Tensor:
            cache[hook.name] = value.detach()
            return value

        with self.hooks([(n, keep) for n in sorted(set(names))]) as model:
            logits = model(tokens)
        return logits, cache

    def check_layer(self, layer: int, what: str = "layer") -> None:
        n = self.facts.n_layers
        if not (0 <= layer < n):
            raise AttributionError(f"{what} {layer} requested, the model has {n} layers (0-{n - 1})")

    def describe(self) -> dict[str, Any]:
        """Identity for metadata: name, source and facts."""
        out = {"name": self.name, "source": self.source, "format": self.format, "backend": self.backend,
               "architecture": self.facts.to_dict()}
        if self.family is not None:
            out["family"] = self.family
        if self.quantisation is not None:
            out["quantisation"] = self.quantisation
        return out
