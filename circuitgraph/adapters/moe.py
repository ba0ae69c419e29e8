"""Mixture-of-experts layers, one part of :class:`~circuitgraph.adapters.architecture.ModelAdapter`:
the router's and the experts' hooks, the routing and expert neuron activations of a prompt, and
the experts' weights (TransformerLens's ``MoE``, GPT-OSS's clamped SwiGLU experts included)."""

from __future__ import annotations

from typing import Literal

import torch

from circuitgraph.adapters.hf_config import GPT_OSS_ALPHA, GPT_OSS_LIMIT
from circuitgraph.adapters.model_weights import Weights

__all__ = ["MixtureOfExperts"]


class MixtureOfExperts(Weights):
    """MoE hooks, activations and weights; ``_gpt_oss`` says whether the experts are GPT-OSS's."""

    _gpt_oss: bool = False

    @staticmethod
    def hook_expert_weights(layer: int) -> str:
        """MoE: the router's softmax over every expert ``(batch * pos, num_experts)`` (before the top-k)."""
        return f"blocks.{layer}.mlp.hook_expert_weights"

    @staticmethod
    def hook_expert_indices(layer: int) -> str:
        """MoE: the chosen experts ``(batch * pos, experts_per_token)``, best first."""
        return f"blocks.{layer}.mlp.hook_expert_indices"

    @staticmethod
    def hook_expert(layer: int, expert: int, what: Literal["gate", "pre", "post"]) -> str:
        """MoE: one expert's gate pre-activation, linear branch or activation ``act(gate) * linear``,
        over the tokens routed to it only (``(n_routed, d_mlp)``, see :meth:`moe_activations`)."""
        return f"blocks.{layer}.mlp.experts.{expert}.hook_{what}"

    def moe_hooks(self, layer: int) -> set[str]:
        """Every hook :meth:`moe_activations` reads for ``layer``."""
        names = {self.hook_expert_weights(layer), self.hook_expert_indices(layer)}
        for e in range(self.facts.num_experts):
            names |= {self.hook_expert(layer, e, w) for w in ("gate", "pre", "post")}
        return names

    def expert_value_map(self, layer: int, gate: torch.Tensor, linear: torch.Tensor,
                         b_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, offset)`` with an expert neuron's ``act(gate) * value`` equal to
        ``scale * (W_in[:, i] . x) + offset`` once its gate (and clamp) is frozen; ``gate`` and
        ``linear`` are its recorded gate pre-activation and value branch (``hook_gate``, ``hook_pre``,
        the value including ``b_in``), ``b_in`` its value bias.

        SwiGLU experts (Mixtral, OLMoE, Qwen3-MoE): ``scale = act(gate)``, ``offset = 0``. GPT-OSS:
        ``glu(min(gate, 7)) * (clamp(value, -7, 7) + 1)``: ``scale = glu`` and ``offset = glu * (b_in + 1)``
        where the value is inside the clamp; where it is clamped the neuron reads nothing
        (``scale = 0``, ``offset`` = its value)."""
        if not self._gpt_oss:
            return self.mlp_act_fn(layer)(gate), torch.zeros_like(gate)
        g = gate.clamp(max=GPT_OSS_LIMIT)
        glu = g * torch.sigmoid(g * GPT_OSS_ALPHA)
        live = (linear > -GPT_OSS_LIMIT) & (linear < GPT_OSS_LIMIT)
        scale = torch.where(live, glu, torch.zeros_like(glu))
        offset = torch.where(live, glu * (b_in + 1), glu * (linear.clamp(-GPT_OSS_LIMIT, GPT_OSS_LIMIT) + 1))
        return scale, offset

    def moe_activations(self, cache: dict[str, torch.Tensor], layer: int, n_pos: int) -> dict[str, torch.Tensor]:
        """The routing and the expert neurons of MoE layer ``layer`` on one prompt (batch 1), from
        TransformerLens's MoE hooks in ``cache`` (names as :meth:`moe_hooks`, batch dimension kept).

        Returns ``indices (pos, k)`` and ``weights (pos, k)`` (the chosen experts and their routing
        weights, renormalised over the top k where the model does), ``routing (pos, num_experts)``
        (the weight of every expert, 0 where not chosen), and over the flat neuron index
        ``e * d_mlp + i``: ``gate`` (gate pre-activation), ``linear`` (value branch), ``post``
        (``act(gate) * linear``) and ``activation`` (``routing weight * post``, what the neuron
        writes with ``W_out``), each ``(pos, num_experts * d_mlp)``, 0 for experts not chosen.

        TransformerLens's ``MoE.forward`` runs expert ``e`` on the rows ``torch.where(mask[e])`` of
        the one-hot mask ``(experts, k, tokens)``: ordered by top-k slot, then token; its hooks'
        rows are mapped back to positions in that order."""
        f = self.facts
        E, d = f.num_experts, f.d_mlp
        indices = cache[self.hook_expert_indices(layer)].reshape(n_pos, -1)
        probs = cache[self.hook_expert_weights(layer)].reshape(n_pos, E)
        weights = probs.gather(1, indices)  # GPT-OSS: its hook holds the routing weights themselves
        if self.model.cfg.norm_topk_prob and not self._gpt_oss:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(self.dtype)
        routing = torch.zeros(n_pos, E, dtype=self.dtype, device=weights.device).scatter(1, indices, weights)
        out = {w: torch.zeros(n_pos, E * d, dtype=self.dtype, device=weights.device) for w in ("gate", "linear", "post")}
        mask = torch.nn.functional.one_hot(indices, num_classes=E).permute(2, 1, 0)  # (E, k, pos)
        for e in range(E):
            _, tok = torch.where(mask[e])
            if not tok.numel():  # GPT-OSS skips an expert no token chose (no hook call)
                continue
            reads: tuple[tuple[str, Literal["gate", "pre", "post"]], ...] = (("gate", "gate"), ("linear", "pre"),
                                                                                ("post", "post"))
            for key, what in reads:
                value = cache[self.hook_expert(layer, e, what)].reshape(-1, d)
                out[key][tok, e * d:(e + 1) * d] = value.to(self.dtype)
        out["activation"] = out["post"] * routing.repeat_interleave(d, dim=1)
        out.update(indices=indices, weights=weights, routing=routing)
        return out

    def expert_weights(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert of MoE layer ``layer``: ``W_gate``, ``W_in (d_model, d_mlp)``, ``W_out (d_mlp,
        d_model)`` and ``b_gate``, ``b_in``, ``b_out`` (zeros for TransformerLens's ``MoEGatedMLP``, which
        has none; GPT-OSS's experts have them)."""
        e = self.model.blocks[layer].mlp.experts[expert]
        out = {"W_gate": e.W_gate.weight.detach().T, "W_in": e.W_in.weight.detach().T,
               "W_out": e.W_out.weight.detach().T}
        zeros = lambda n: torch.zeros(n, dtype=self.dtype, device=self.device)  # noqa: E731
        for key, lin, n in (("b_gate", e.W_gate, self.facts.d_mlp), ("b_in", e.W_in, self.facts.d_mlp),
                            ("b_out", e.W_out, self.facts.d_model)):
            out[key] = lin.bias.detach() if lin.bias is not None else zeros(n)
        return out

    def expert_neuron_weights(self, layer: int, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """``W_in (d_model, n)``, ``W_out (n, d_model)`` and ``b_in (n,)`` of the flat expert neuron indices ``idx``
        (``expert * d_mlp + neuron``), in the order given."""
        d = self.facts.d_mlp
        experts = idx // d
        W_in = torch.empty(self.facts.d_model, idx.numel(), dtype=self.dtype, device=self.device)
        W_out = torch.empty(idx.numel(), self.facts.d_model, dtype=self.dtype, device=self.device)
        b_in = torch.empty(idx.numel(), dtype=self.dtype, device=self.device)
        for e in experts.unique().tolist():
            sel = (experts == e).nonzero().flatten()
            w = self.expert_weights(layer, e)
            W_in[:, sel] = w["W_in"][:, idx[sel] - e * d]
            W_out[sel] = w["W_out"][idx[sel] - e * d]
            b_in[sel] = w["b_in"][idx[sel] - e * d]
        return {"W_in": W_in, "W_out": W_out, "b_in": b_in}
