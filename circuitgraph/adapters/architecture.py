"""The model adapter: the only place that knows TransformerLens names and architecture facts.

The engine never reads ``model.cfg`` or builds hook names itself; it asks the adapter for
weights (as plain tensors, grouped-query heads already expanded) and hook names.

Norms are written ``N(x) = gamma * P(x) / sigma(x) + beta`` with ``P`` the mean-removal for
LayerNorm and the identity for RMSNorm (``beta = 0``).  For folded norms (TransformerLens
``LNPre``/``RMSPre``) ``gamma = 1`` and ``beta = 0``: the weights were folded into the next
layer, and :attr:`ArchitectureFacts.ln_folded` records it.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Literal, Sequence

import torch

from circuitgraph.errors import AttributionError, LoadError

__all__ = ["ArchitectureFacts", "NormWeights", "ModelAdapter"]

NormKind = Literal["layernorm", "rmsnorm"]


@dataclass(frozen=True)
class ArchitectureFacts:
    """What the engine needs to know about a model, recorded once at load time."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    norm: NormKind
    ln_folded: bool
    gated_mlp: bool
    act_fn: str
    positional: Literal["learned", "rotary", "none"]
    grouped_query: bool
    post_norms: bool
    parallel_attn_mlp: bool
    attn_scores_soft_cap: float | None
    output_logits_soft_cap: float | None
    attention_sinks: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NormWeights:
    """gamma and beta of one norm site (beta None for RMSNorm / folded); ``center`` = LayerNorm."""

    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    center: bool

    def reader_direction(self, w: torch.Tensor) -> torch.Tensor:
        """``P(gamma * w)``: the residual direction read by ``w . N(x)`` (before ``1/sigma``).

        ``w`` has shape ``(..., d_model)`` and is not modified (the result may be ``w`` itself when
        there is neither gamma nor centring). The one implementation: the engine's readers, its
        frozen propagation and the queries all call it.
        """
        if self.gamma is not None:
            g = w * self.gamma
            if self.center:
                g -= g.mean(-1, keepdim=True)  # g is a new tensor here
            return g
        return w - w.mean(-1, keepdim=True) if self.center else w

    def reader_constant(self, w: torch.Tensor) -> torch.Tensor:
        """``w . beta``: the constant part of ``w . N(x)``."""
        if self.beta is None:
            return torch.zeros(w.shape[:-1], dtype=w.dtype, device=w.device)
        return w @ self.beta


_UNSUPPORTED_ARCH = {"BertForMaskedLM", "T5ForConditionalGeneration"}


@dataclass(frozen=True)
class _VirtualHookPoint:
    """What a virtual hook's function receives as ``hook`` (TransformerLens passes a HookPoint)."""

    name: str


class ModelAdapter:
    """Wraps a TransformerLens ``HookedTransformer`` and records its architecture facts."""

    def __init__(self, model: Any, *, tokenizer: Any = None, source: dict[str, Any] | None = None):
        cfg = model.cfg
        if getattr(cfg, "original_architecture", None) in _UNSUPPORTED_ARCH:
            raise LoadError(
                f"architecture {cfg.original_architecture} is not a pre-norm decoder; "
                "circuitgraph supports pre-norm causal transformers (GPT-2, Llama, Gemma, ...)"
            )
        if getattr(cfg, "attn_only", False):
            raise LoadError("attention-only models are not supported yet (no MLP layers to analyse)")
        if cfg.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre"):
            raise LoadError(
                f"normalization_type {cfg.normalization_type!r} is not supported; "
                "expected LN, LNPre, RMS or RMSPre"
            )
        if cfg.positional_embedding_type not in ("standard", "rotary"):
            raise LoadError(
                f"positional_embedding_type {cfg.positional_embedding_type!r} is not supported; "
                "expected 'standard' (learned) or 'rotary'"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.source = dict(source or {})
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
            norm="layernorm" if cfg.normalization_type in ("LN", "LNPre") else "rmsnorm",
            ln_folded=cfg.normalization_type in ("LNPre", "RMSPre"),
            gated_mlp=bool(cfg.gated_mlp),
            act_fn=str(cfg.act_fn),
            positional="learned" if cfg.positional_embedding_type == "standard" else "rotary",
            grouped_query=n_kv != cfg.n_heads,
            post_norms=bool(cfg.use_normalization_before_and_after),
            parallel_attn_mlp=bool(cfg.parallel_attn_mlp),
            attn_scores_soft_cap=soft(getattr(cfg, "attn_scores_soft_cap", -1.0)),
            output_logits_soft_cap=soft(getattr(cfg, "output_logits_soft_cap", -1.0)),
            attention_sinks=bool(getattr(cfg, "use_attention_sinks", False)),
        )
        if self.facts.parallel_attn_mlp:
            raise LoadError("parallel attention/MLP blocks are not supported yet")

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        return str(self.model.cfg.model_name)

    @property
    def device(self) -> torch.device:
        return self.model.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.W_E.dtype

    # ------------------------------------------------------------------ hook names
    @staticmethod
    def hook_resid_pre(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_pre"

    @staticmethod
    def hook_resid_mid(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_mid"

    @staticmethod
    def hook_resid_post(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_post"

    @staticmethod
    def hook_norm_scale(site: str, layer: int | None = None) -> str:
        """``site`` in ln1, ln2, ln1_post, ln2_post, ln_final."""
        return "ln_final.hook_scale" if site == "ln_final" else f"blocks.{layer}.{site}.hook_scale"

    @staticmethod
    def hook_norm_normalized(site: str, layer: int | None = None) -> str:
        return "ln_final.hook_normalized" if site == "ln_final" else f"blocks.{layer}.{site}.hook_normalized"

    @staticmethod
    def block_hook(layer: int, name: str) -> str:
        """The hook ``name`` of block ``layer``, ``name`` relative to the block as dictionary configs
        give it (``ln2.hook_normalized``, ``mlp.hook_in``, ``hook_mlp_out``)."""
        return f"blocks.{layer}.{name}"

    @staticmethod
    def hook_pattern(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_pattern"

    @staticmethod
    def hook_attn_scores(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_attn_scores"

    @staticmethod
    def hook_qk(layer: int, side: str, rotated: bool = False) -> str:
        """The queries (``side="q"``) or keys (``"k"``) of ``layer``'s attention, after the rotary
        embedding when ``rotated``."""
        return f"blocks.{layer}.attn.hook_{'rot_' if rotated else ''}{side}"

    @staticmethod
    def hook_qk_input(layer: int, side: str) -> str:
        """The residual stream the queries (``side="q"``) or keys (``"k"``) read, with
        ``use_split_qkv_input``."""
        return f"blocks.{layer}.hook_{side}_input"

    @staticmethod
    def hook_z(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_z"

    @staticmethod
    def hook_attn_out(layer: int) -> str:
        return f"blocks.{layer}.hook_attn_out"

    @staticmethod
    def hook_mlp_out(layer: int) -> str:
        return f"blocks.{layer}.hook_mlp_out"

    @staticmethod
    def hook_mlp_pre(layer: int) -> str:
        """GELU/ReLU: the neuron pre-activation; gated: the gate pre-activation."""
        return f"blocks.{layer}.mlp.hook_pre"

    @staticmethod
    def hook_mlp_pre_linear(layer: int) -> str:
        """Gated MLPs only: the linear (value) branch, without b_in."""
        return f"blocks.{layer}.mlp.hook_pre_linear"

    @staticmethod
    def hook_mlp_post(layer: int) -> str:
        return f"blocks.{layer}.mlp.hook_post"

    @staticmethod
    def hook_embed() -> str:
        return "hook_embed"

    @staticmethod
    def hook_pos_embed() -> str:
        return "hook_pos_embed"

    @staticmethod
    def hook_mlp_out_before_post_norm(layer: int) -> str:
        """circuit-tracer's ``mlp.hook_out``: the MLP's own output, *before* a post-MLP norm
        (Gemma-2's ``ln2_post``).  TransformerLens has no hook there: on models with post-norms it
        is a virtual hook that :meth:`hooks` and :meth:`run_with_cache` provide (a forward
        pre-hook on the block's ``ln2_post`` module, whose input is that value); on models
        without post-norms it is the same value as :meth:`hook_mlp_out`."""
        return f"blocks.{layer}.mlp.hook_out"

    def _virtual_layer(self, name: str) -> int | None:
        """The layer of a virtual ``blocks.<l>.mlp.hook_out`` hook on a post-norm model, else None."""
        m = re.fullmatch(r"blocks\.(\d+)\.mlp\.hook_out", name)
        if m and self.facts.post_norms and int(m.group(1)) < self.facts.n_layers:
            return int(m.group(1))
        return None

    def has_hook(self, name: str) -> bool:
        return name in self.model.hook_dict or self._virtual_layer(name) is not None

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[str, Callable]]) -> Iterator[Any]:
        """Scoped forward hooks, as TransformerLens's ``model.hooks``, plus the virtual
        ``blocks.<l>.mlp.hook_out`` of post-norm models (see :meth:`hook_mlp_out_before_post_norm`):
        its function gets ``(mlp_output, hook)`` and may return a replacement, which the post-norm
        then normalises.  Every hook is removed on exit, even on error."""
        real, handles = [], []
        try:
            for name, fn in fwd_hooks:
                layer = self._virtual_layer(name)
                if layer is None:
                    real.append((name, fn))
                    continue
                point = _VirtualHookPoint(name)

                def pre(module: Any, args: tuple, fn: Callable = fn, point: _VirtualHookPoint = point) -> Any:
                    out = fn(args[0], point)
                    return None if out is None else (out, *args[1:])

                handles.append(self.model.blocks[layer].ln2_post.register_forward_pre_hook(pre))
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

        def keep(value: torch.Tensor, hook: Any) -> torch.Tensor:
            cache[hook.name] = value.detach()
            return value

        with self.hooks([(n, keep) for n in sorted(set(names))]) as model:
            logits = model(tokens)
        return logits, cache

    def check_layer(self, layer: int, what: str = "layer") -> None:
        n = self.facts.n_layers
        if not (0 <= layer < n):
            raise AttributionError(f"{what} {layer} requested, the model has {n} layers (0-{n - 1})")

    # ------------------------------------------------------------------ weights
    def _norm(self, module: Any) -> NormWeights:
        gamma = getattr(module, "w", None)
        beta = getattr(module, "b", None)
        return NormWeights(
            gamma=None if gamma is None else gamma.detach(),
            beta=None if beta is None else beta.detach(),
            center=self.facts.norm == "layernorm",
        )

    def norm(self, site: str, layer: int | None = None) -> NormWeights:
        """Weights of a norm site: ln1, ln2, ln1_post, ln2_post (per layer) or ln_final."""
        module = self.model.ln_final if site == "ln_final" else getattr(self.model.blocks[layer], site)
        return self._norm(module)

    @property
    def W_E(self) -> torch.Tensor:
        return self.model.W_E.detach()

    @property
    def W_pos(self) -> torch.Tensor | None:
        return self.model.W_pos.detach() if self.facts.positional == "learned" else None

    @property
    def W_U(self) -> torch.Tensor:
        return self.model.W_U.detach()

    @property
    def b_U(self) -> torch.Tensor:
        return self.model.b_U.detach()

    def attn_weights(self, layer: int) -> dict[str, torch.Tensor]:
        """``W_V (n_heads, d_model, d_head)``, ``b_V (n_heads, d_head)``, ``W_O (n_heads, d_head,
        d_model)``, ``b_O (d_model,)``; grouped-query heads expanded to one per query head."""
        attn = self.model.blocks[layer].attn
        return {
            "W_V": attn.W_V.detach(),
            "b_V": attn.b_V.detach(),
            "W_O": attn.W_O.detach(),
            "b_O": attn.b_O.detach(),
        }

    def mlp_weights(self, layer: int) -> dict[str, torch.Tensor]:
        """``W_in (d_model, d_mlp)``, ``b_in``, ``W_out (d_mlp, d_model)``, ``b_out`` and, for
        gated MLPs, ``W_gate (d_model, d_mlp)``."""
        mlp = self.model.blocks[layer].mlp
        out = {
            "W_in": mlp.W_in.detach(),
            "b_in": mlp.b_in.detach(),
            "W_out": mlp.W_out.detach(),
            "b_out": mlp.b_out.detach(),
        }
        if self.facts.gated_mlp:
            out["W_gate"] = mlp.W_gate.detach()
        return out

    def mlp_act_fn(self, layer: int):
        return self.model.blocks[layer].mlp.act_fn

    def describe(self) -> dict[str, Any]:
        """Identity for metadata: name, source and facts."""
        return {"name": self.name, "source": self.source, "architecture": self.facts.to_dict()}
