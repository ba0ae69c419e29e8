"""The model's weights as plain tensors (grouped-query heads expanded) and its identity (name,
device, dtype), one part of :class:`~circuitgraph.adapters.architecture.ModelAdapter`."""

from __future__ import annotations

from typing import Any

import torch

from circuitgraph.adapters.facts import ArchitectureFacts

__all__ = ["Weights"]


class Weights:
    """Embedding, unembedding, attention and MLP weights; needs the model (``model``) and its ``facts``."""

    model: Any
    facts: ArchitectureFacts

    @property
    def name(self) -> str:
        return str(self.model.cfg.model_name)

    @property
    def device(self) -> torch.device:
        return self.model.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.W_E.dtype

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
        mlp = self.model.blocks[layer].mlp
        return mlp.experts[0].act_fn if self.facts.num_experts else mlp.act_fn
