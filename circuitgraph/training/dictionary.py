"""The trainable dictionaries (one module for all kinds) and their weights in model units.

Training runs in normalised units: inputs ``x / s_in`` and targets ``y / s_out`` per layer
(``s`` = root mean square norm of the first batch), so one learning rate and one sparsity
coefficient fit every layer.  :meth:`TrainableDictionary.export` folds the scales back:
``W_enc <- W_enc / s_in``, ``W_dec <- W_dec * s_out``, ``b_dec <- b_dec * s_out``,
``W_skip <- W_skip * s_out / s_in`` (the threshold and ``b_enc`` are unchanged).

Kinds: per-layer transcoders (``W_dec_l (F, D)``), skip transcoders (plus ``W_skip_l (D, D)``,
used as ``x @ W_skip.T``, circuit-tracer's orientation) and cross-layer transcoders (``W_dec_l
(F, n - l, D)``: feature ``j`` of layer ``l`` writes into every output ``k >= l``).
Activations: ReLU, and JumpReLU ``h * (h > theta)`` with ``theta = exp(log_theta)`` trained by a
straight-through estimate (a rectangle kernel of width ``bandwidth``), as in Rajamanoharan et al. 2024;
TopK: the ``k`` largest of ``max(h, 0)`` per token, the rest zero (Gao et al. 2024; gradients reach
the selected features only, as in EleutherAI's sparsify).  TopK needs no sparsity penalty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["TrainableDictionary", "DictionaryWeights", "apply_weights", "activate", "top_k"]

BANDWIDTH = 0.01


def activate(h: torch.Tensor, threshold: torch.Tensor | None, topk: int | None = None) -> torch.Tensor:
    """ReLU ``max(h, 0)``, JumpReLU ``h * (h > threshold)``, or (``topk``) the ``topk`` largest of
    ``max(h, 0)`` per row, the rest zero (autograd passes through the kept entries)."""
    if topk is not None:
        return top_k(h.clamp(min=0), topk)
    return h.clamp(min=0) if threshold is None else h * (h > threshold)


def top_k(a: torch.Tensor, k: int) -> torch.Tensor:
    """``a`` with all but its ``k`` largest entries of the last dimension set to zero."""
    idx = a.topk(min(k, a.shape[-1]), dim=-1).indices
    return torch.zeros_like(a).scatter(-1, idx, a.gather(-1, idx))


class TrainableDictionary(nn.Module):
    """Dictionaries for ``n`` layers: ``x (n, N, D) -> acts (n, N, F), recon (n, N, D)`` (normalised units)."""

    def __init__(self, n: int, d_model: int, width: int, *, kind: str, activation: str, seed: int, k: int = 0):
        super().__init__()
        if activation == "topk" and not 0 < k <= width:
            raise ValueError(f"activation topk needs 0 < k <= width, got k={k}, width={width}")
        self.k = k if activation == "topk" else None
        g = torch.Generator().manual_seed(seed)
        self.n, self.d_model, self.width, self.kind, self.activation = n, d_model, width, kind, activation
        dec = torch.randn(n, width, d_model, generator=g)
        dec = dec / dec.norm(dim=-1, keepdim=True) * 0.1
        self.W_enc = nn.Parameter(dec.transpose(1, 2).clone() * (d_model ** 0.5) * 0.5)  # (n, D, F)
        self.b_enc = nn.Parameter(torch.zeros(n, width))
        self.b_dec = nn.Parameter(torch.zeros(n, d_model))
        if kind == "cross_layer_transcoder":
            self.W_dec = nn.ParameterList(
                [nn.Parameter(torch.cat([dec[i][:, None, :], torch.zeros(width, n - i - 1, d_model)], dim=1))
                 for i in range(n)])
        else:
            self.W_dec = nn.ParameterList([nn.Parameter(dec.clone())])  # (n, F, D)
        self.W_skip = nn.Parameter(torch.zeros(n, d_model, d_model)) if kind == "skip_transcoder" else None
        self.log_threshold = nn.Parameter(torch.full((n, width), -4.0)) if activation == "jump_relu" else None
        self.register_buffer("s_in", torch.ones(n))
        self.register_buffer("s_out", torch.ones(n))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("lnd,ldf->lnf", x, self.W_enc) + self.b_enc[:, None, :]
        if self.k is not None:
            return top_k(torch.relu(h), self.k)
        if self.log_threshold is None:
            return torch.relu(h)
        return _jump(h, self.log_threshold)

    def decoder_norms(self) -> torch.Tensor:
        """``(n, F)``: the norm of each feature's whole decoder (over every output it writes)."""
        if self.kind == "cross_layer_transcoder":
            return torch.stack([w.flatten(1).norm(dim=1) for w in self.W_dec])
        return self.W_dec[0].norm(dim=-1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.encode(x)
        if self.kind == "cross_layer_transcoder":
            recon = self.b_dec[:, None, :].expand(self.n, x.shape[1], self.d_model).clone()
            for i in range(self.n):
                recon[i:] = recon[i:] + torch.einsum("nf,fkd->knd", a[i], self.W_dec[i])
        else:
            recon = torch.einsum("lnf,lfd->lnd", a, self.W_dec[0]) + self.b_dec[:, None, :]
        if self.W_skip is not None:
            recon = recon + torch.einsum("lnd,led->lne", x, self.W_skip)
        return a, recon

    def export(self) -> DictionaryWeights:
        """The weights in model units (see the module docstring), detached float32 copies."""
        with torch.no_grad():
            s_in, s_out = self.s_in, self.s_out
            W_enc = (self.W_enc / s_in[:, None, None]).float().clone()
            if self.kind == "cross_layer_transcoder":
                W_dec = [(w * s_out[i:, None][None, :, :]).float().clone() for i, w in enumerate(self.W_dec)]
            else:
                W_dec = [(self.W_dec[0][l] * s_out[l]).float().clone() for l in range(self.n)]
            W_skip = None if self.W_skip is None else \
                [(self.W_skip[l] * s_out[l] / s_in[l]).float().clone() for l in range(self.n)]
            thr = None if self.log_threshold is None else self.log_threshold.exp().float().clone()
            return DictionaryWeights(self.kind, W_enc.transpose(1, 2).contiguous(), self.b_enc.float().clone(),
                                     W_dec, (self.b_dec * s_out[:, None]).float().clone(), W_skip, thr, self.k)


def _jump(h: torch.Tensor, log_threshold: torch.Tensor) -> torch.Tensor:
    lt = log_threshold[:, None, :].expand_as(h)
    return _JumpReLUPerFeature.apply(h, lt)


class _JumpReLUPerFeature(torch.autograd.Function):
    """JumpReLU with a threshold tensor broadcast to ``h``'s shape (its gradient summed back by autograd)."""

    @staticmethod
    def forward(ctx, h, log_theta):
        theta = log_theta.exp()
        ctx.save_for_backward(h, theta)
        return h * (h > theta)

    @staticmethod
    def backward(ctx, grad):
        h, theta = ctx.saved_tensors
        near = ((h - theta).abs() < BANDWIDTH / 2).to(h.dtype)
        return grad * (h > theta), -(theta / BANDWIDTH) * near * grad * theta


@dataclass
class DictionaryWeights:
    """Trained weights in model units, circuit-tracer's orientation: ``W_enc (n, F, D)``; ``W_dec`` per
    layer ``(F, D)`` or, for a CLT, ``(F, n - l, D)``; ``W_skip`` per layer ``(D, D)`` used as ``x @ W_skip.T``."""

    kind: str
    W_enc: torch.Tensor
    b_enc: torch.Tensor
    W_dec: list[torch.Tensor]
    b_dec: torch.Tensor
    W_skip: list[torch.Tensor] | None
    threshold: torch.Tensor | None
    #: TopK's k (None for ReLU / JumpReLU)
    topk: int | None = None


def apply_weights(w: DictionaryWeights, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference forward of exported weights for inputs ``x (n, N, D)``: ``(acts, recon)``."""
    h = torch.einsum("lnd,lfd->lnf", x, w.W_enc) + w.b_enc[:, None, :]
    a = activate(h, None if w.threshold is None else w.threshold[:, None, :], w.topk)
    n = x.shape[0]
    recon = w.b_dec[:, None, :].expand(n, x.shape[1], -1).clone()
    for i in range(n):
        if w.kind == "cross_layer_transcoder":
            recon[i:] += torch.einsum("nf,fkd->knd", a[i], w.W_dec[i])
        else:
            recon[i] += a[i] @ w.W_dec[i]
        if w.W_skip is not None:
            recon[i] += x[i] @ w.W_skip[i].T
    return a, recon
