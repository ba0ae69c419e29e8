"""Dictionaries that read the MLP's input (``blocks.<l>.mlp.hook_in``), folded into the encoder.

The MLP input of block ``l`` is ln2's output ``m = gamma * n + beta`` where ``n =
P(x)/sigma`` is TransformerLens's ``blocks.<l>.ln2.hook_normalized`` (``gamma``/``beta`` are
``None`` once folded into the model, and ``beta`` is absent for RMSNorm).  Any input-side
matrix ``M (d_in, k)`` applied as ``m @ M`` is therefore exactly ``n @ (gamma[:, None] * M) +
beta @ M``: :func:`fold_mlp_input` returns the folded matrix and the constant.  Every
dictionary kind that reads ``mlp.hook_in`` (per-layer transcoders of any format, sae-lens
``hook_name: blocks.<l>.mlp.hook_in``, cross-layer transcoders with ``feature_input_hook:
mlp.hook_in``) goes through this one function, so its features read ``ln2.hook_normalized``
and the engine needs no extra input site.  The arithmetic is done in float64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["MLP_INPUT_HOOK", "mlp_input_norm", "fold_input", "fold_mlp_input"]

#: the block-relative hook name (circuit-tracer's ``ReplacementMLP.hook_in``; sae-lens's
#: ``blocks.<l>.mlp.hook_in``)
MLP_INPUT_HOOK = "mlp.hook_in"


def mlp_input_norm(adapter: ModelAdapter, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(gamma, beta)`` of block ``layer``'s ln2 in float64 on the CPU (``None`` where absent)."""
    norm = adapter.norm("ln2", layer)
    conv = lambda t: None if t is None else t.detach().to(device="cpu", dtype=torch.float64)  # noqa: E731
    return conv(norm.gamma), conv(norm.beta)


def fold_input(M: torch.Tensor, gamma: torch.Tensor | None,
               beta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``M (d_in, k)`` applied to ``gamma * n + beta`` -> ``(gamma[:, None] * M, beta @ M)`` in
    float64 (the constant is ``None`` without ``beta``): ``(gamma * n + beta) @ M = n @ M' + c``."""
    M = M.detach().to(device="cpu", dtype=torch.float64)
    shift = None if beta is None else beta @ M
    return (M if gamma is None else gamma[:, None] * M), shift


def fold_mlp_input(adapter: ModelAdapter, layer: int, M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`fold_input` with block ``layer``'s ln2: ``m @ M = n @ M' + c`` where ``m`` is the
    MLP input and ``n`` = ``ln2.hook_normalized``."""
    return fold_input(M, *mlp_input_norm(adapter, layer))
