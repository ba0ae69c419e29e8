"""The model adapter: the only place that knows TransformerLens names and architecture facts.

The engine never reads ``model.cfg`` or builds hook names itself; it asks the adapter for
weights (as plain tensors, grouped-query heads already expanded) and hook names.

Norms are written ``N(x) = gamma * P(x) / sigma(x) + beta`` with ``P`` the mean-removal for
LayerNorm and the identity for RMSNorm (``beta = 0``).  For folded norms (TransformerLens
``LNPre``/``RMSPre``) ``gamma = 1`` and ``beta = 0``: the weights were folded into the next
layer, and :attr:`ArchitectureFacts.ln_folded` records it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from circuitgraph.errors import LoadError

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
    def hook_pattern(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_pattern"

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

    def has_hook(self, name: str) -> bool:
        return name in self.model.hook_dict

    def check_layer(self, layer: int, what: str = "layer") -> None:
        n = self.facts.n_layers
        if not (0 <= layer < n):
            from circuitgraph.errors import AttributionError

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
