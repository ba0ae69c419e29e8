"""A head's query and key as affine readers of the residual stream before its layer.

With ln1's sigma frozen at its value on the prompt (and a query/key norm's sigma, where the
model has one), the rotated query of head ``h`` at position ``t`` is an affine function of the
residual ``x_pre(layer, t)``: dimension ``i`` is ``dirs[i] . x + consts[i]`` with
``dirs[i] = P(gamma1 * w_i) / sigma1(t)`` and ``consts[i] = w_i . beta1 + b_i``, where ``w_i``
is column ``i`` of ``W_Q^h`` after the frozen q-norm scale and the position's rotary map.  The
same for the key (grouped-query heads read their group's ``W_K``).  Used by QK attribution
(:mod:`circuitgraph.queries.qk`) and by the query/key edges into head nodes
(:mod:`circuitgraph.attribution.component_inputs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.adapters.architecture import NormWeights
from circuitgraph.errors import CircuitGraphError, QueryError

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.attribution.linearisation import Linearisation

__all__ = ["attention_module", "rotary_matrices", "qk_norm_scale", "QKReaders"]


def attention_module(adapter: ModelAdapter, layer: int, error: type[CircuitGraphError] = QueryError) -> Any:
    """The TransformerLens attention module of ``layer``; refuses (``error``) the models whose
    score is not bilinear in the residual stream."""
    attn = adapter.model.blocks[layer].attn
    cfg = adapter.model.cfg
    for flag, what in (("clip_qkv", "query/key clipping"),
                       ("use_logn_attn", "log-n query scaling")):
        if getattr(cfg, flag, None) not in (None, False):
            raise error(f"the model uses {what} ({flag}={getattr(cfg, flag)!r}), which makes the score "
                        "non-bilinear in the residual stream; query/key attribution supports models without it")
    return attn


def rotary_matrices(adapter: ModelAdapter, layer: int, n_pos: int) -> torch.Tensor | None:
    """``R (n_pos, d_head, d_head)`` with the rotated vector ``R[t] @ x`` at position ``t``, taken
    from the model's own ``apply_rotary`` (applied to the basis vectors); None without rotary."""
    if adapter.facts.positional != "rotary":
        return None
    attn = attention_module(adapter, layer)
    dh = adapter.facts.d_head
    eye = torch.eye(dh, dtype=adapter.dtype, device=adapter.device)
    basis = eye.expand(1, n_pos, dh, dh).contiguous()  # [batch, pos, "head" = basis index i, d_head]
    with torch.no_grad():
        out = attn.apply_rotary(basis, 0, None)  # out[0, t, i] = R[t] e_i
    return out[0].transpose(1, 2).contiguous()


def qk_norm_scale(adapter: ModelAdapter, lin: Linearisation, layer: int, side: str, head: int, t: int) -> torch.Tensor:
    """``gamma / sigma (d_head,)``: the frozen query (``side="q"``) or key norm of query head ``head``
    at position ``t``.  An RMSNorm ``gamma * v / sigma(v)`` with ``sigma`` frozen at its value on the
    prompt is the diagonal linear map ``v -> (gamma / sigma) * v``, so ``q`` and ``k`` stay affine in
    the residual stream and the score stays bilinear.  ``per_head`` norms (Qwen3, Gemma-3) have one
    sigma per head and position and a ``d_head`` gamma; ``whole`` norms (OLMo-2, OLMoE) one sigma per
    position over the whole projection (all heads) and the head's slice of its gamma.  Keys of
    grouped-query models use their key/value head ``head // (n_heads / n_kv_heads)``."""
    f = adapter.facts
    group = head if side == "q" else head // (f.n_heads // f.n_kv_heads)
    gamma = adapter.qk_norm(side, layer).gamma
    sigma = lin.qk_sigma[(side, layer)]  # (pos, heads) or (pos, 1)
    if f.qk_norm == "per_head":
        return gamma / sigma[t, group]
    dh = f.d_head
    return gamma[group * dh:(group + 1) * dh] / sigma[t, 0]


class QKReaders:
    """The query and key readers of every head of one layer (module docstring), in ``dtype``."""

    def __init__(self, adapter: ModelAdapter, lin: Linearisation, layer: int, dtype: torch.dtype, device: Any,
                 error: type[CircuitGraphError] = QueryError):
        self.adapter, self.lin, self.layer = adapter, lin, layer
        attn = attention_module(adapter, layer, error)
        self.scale = float(attn.attn_scale)
        self.W = {"q": attn.W_Q.detach().to(device, dtype), "k": attn.W_K.detach().to(device, dtype)}  # (H, D, dh)
        self.b = {"q": attn.b_Q.detach().to(device, dtype), "k": attn.b_K.detach().to(device, dtype)}  # (H, dh)
        R = rotary_matrices(adapter, layer, lin.n_pos)
        self.R = None if R is None else R.to(device, dtype)
        if adapter.has_norm("ln1"):
            norm = adapter.norm("ln1", layer)
            self.norm = NormWeights(None if norm.gamma is None else norm.gamma.to(device, dtype),
                                    None if norm.beta is None else norm.beta.to(device, dtype), norm.center)
            self.sigma = lin.sigma[("ln1", layer)].to(device, dtype)
        else:  # no input norm (OLMo-2): q and k read the residual stream itself (identity direction, sigma 1)
            self.norm = NormWeights(None, None, False)
            self.sigma = torch.ones(lin.n_pos, dtype=dtype, device=device)
        self.dtype, self.device = dtype, device

    def side(self, side: str, head: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dirs (d_head, d_model), consts (d_head,))``: the rotated query (``side="q"``) or key
        (``"k"``) of query head ``head`` at position ``t`` is ``dirs @ x_pre(layer, t) + consts``."""
        a = self.adapter
        W, b = self.W[side], self.b[side]
        W, b = W[head], b[head]  # TransformerLens expands grouped-query key weights to every query head
        if a.facts.qk_norm != "none":  # the frozen q/k norm scales each dimension: W e_i -> W e_i gamma_i / sigma
            scale = qk_norm_scale(a, self.lin, self.layer, side, head, t).to(self.device, self.dtype)
            W, b = W * scale, b * scale
        if self.R is not None:  # rotated dimension j reads sum_i R[t, j, i] (W[:, i] . n + b_i)
            W, b = W @ self.R[t].T, self.R[t] @ b
        w = W.T  # (d_head, d_model)
        return self.norm.reader_direction(w) / self.sigma[t], self.norm.reader_constant(w) + b
