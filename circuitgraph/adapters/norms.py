"""The model's norms, one part of :class:`~circuitgraph.adapters.architecture.ModelAdapter`:
which norm sites a model has, their weights (:class:`NormWeights`, with the one norm read
direction) and their hooks (``hook_scale``: sigma, ``hook_normalized``), the query/key norms
included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from circuitgraph.adapters.facts import ArchitectureFacts, QKNorm
from circuitgraph.errors import AttributionError

__all__ = ["NormWeights", "Norms"]


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


def _qk_norm_kind(model: Any) -> QKNorm:
    """How TransformerLens normalises queries and keys (``AbstractAttention``): ``use_qk_norm``
    applies an RMSNorm of length ``d_head`` per head; the OLMo family (``q_norm`` of length
    ``n_heads * d_head``) one over the whole projection."""
    if getattr(model.cfg, "use_qk_norm", False):
        return "per_head"
    q_norm = getattr(model.blocks[0].attn, "q_norm", None) if len(model.blocks) else None
    if q_norm is not None:
        return "whole"
    return "none"


class Norms:
    """Norm sites, weights and hooks; needs the model (``model``) and its ``facts``."""

    model: Any
    facts: ArchitectureFacts

    def _norm_module_name(self, site: str) -> str | None:
        """TransformerLens's module of a norm site; None for a site the model does not have
        (the input norms of a model with output norms only, OLMo-2)."""
        if self.facts.input_norms:
            return site
        return {"ln1": None, "ln2": None, "ln1_post": "ln1", "ln2_post": "ln2"}.get(site, site)

    def _present_norm_module_name(self, site: str) -> str:
        """:meth:`_norm_module_name` of a site the model has (:meth:`has_norm` checked it)."""
        name = self._norm_module_name(site)
        if name is None:
            raise AttributionError(f"the model has no {site} norm module (its norms are output norms only)")
        return name

    def hook_norm_scale(self, site: str, layer: int | None = None) -> str:
        """``site`` in ln1, ln2, ln1_post, ln2_post, ln_final (a site the model has: :meth:`has_norm`)."""
        if site == "ln_final":
            return "ln_final.hook_scale"
        return f"blocks.{layer}.{self._norm_module_name(site)}.hook_scale"

    def hook_norm_normalized(self, site: str, layer: int | None = None) -> str:
        """``P(x)/sigma`` of a norm site; for a site the model does not have, a name no hook has
        (:meth:`has_hook` is false), never another norm's hook."""
        if site == "ln_final":
            return "ln_final.hook_normalized"
        return f"blocks.{layer}.{self._norm_module_name(site)}.hook_normalized"

    @staticmethod
    def hook_qk_norm_scale(side: Literal["q", "k"], layer: int) -> str:
        """sigma of the query (``q``) or key (``k``) norm: ``(batch * pos * heads, 1)`` for per-head
        norms (TransformerLens flattens the heads before the norm), ``(batch, pos, 1)`` for norms over
        the whole projection."""
        return f"blocks.{layer}.attn.{side}_norm.hook_scale"

    @staticmethod
    def hook_qk_normalized(side: Literal["q", "k"], layer: int) -> str:
        """The query (``q``) or key (``k``) norm's output before its weight, ``P(x) / sigma``."""
        return f"blocks.{layer}.attn.{side}_norm.hook_normalized"

    def _norm(self, module: Any) -> NormWeights:
        gamma = getattr(module, "w", None)
        beta = getattr(module, "b", None)
        return NormWeights(
            gamma=None if gamma is None else gamma.detach(),
            beta=None if beta is None else beta.detach(),
            center=self.facts.norm == "layernorm",
        )

    def has_norm(self, site: str, layer: int | None = None) -> bool:
        """Whether the model has the norm ``site`` (ln1, ln2, ln1_post, ln2_post, ln_final; it has a
        ``hook_scale``). False everywhere on norm-free models, for ln2 on attention-only ones and for
        the input norms of a model with output norms only (OLMo-2): such a site is the identity
        (sigma = 1)."""
        if self.facts.norm == "none":
            return False
        if self.facts.attn_only and site in ("ln2", "ln2_post"):
            return False
        if site in ("ln1_post", "ln2_post"):
            return self.facts.post_norms
        return self._norm_module_name(site) is not None

    def norm(self, site: str, layer: int | None = None) -> NormWeights:
        """Weights of a norm site: ln1, ln2, ln1_post, ln2_post (per layer) or ln_final. A site the
        model does not have (:meth:`has_norm`) is the identity: no gamma, no beta, no centring (sigma 1)."""
        if not self.has_norm(site, layer):
            return NormWeights(gamma=None, beta=None, center=False)
        if site == "ln_final":
            return self._norm(self.model.ln_final)
        return self._norm(getattr(self.model.blocks[layer], self._present_norm_module_name(site)))

    def qk_norm(self, side: Literal["q", "k"], layer: int) -> NormWeights:
        """gamma of the query or key norm of ``layer`` (RMSNorm: no beta, no centring); length
        ``d_head`` for per-head norms, the whole projection's for ``whole``."""
        module = getattr(self.model.blocks[layer].attn, f"{side}_norm")
        return NormWeights(gamma=module.w.detach(), beta=None, center=False)
