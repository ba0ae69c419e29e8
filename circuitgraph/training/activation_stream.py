"""Activations streamed from the model, one batch of windows at a time (nothing cached on disk).

A dictionary of layer ``l`` reads ``blocks.l.ln2.hook_normalized`` (the residual stream at
resid_mid normalised by ln2, before its gain: circuit-tracer's ``feature_input_hook:
ln2.hook_normalized``) and reconstructs ``blocks.l.hook_mlp_out``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.hook_names import HookPointLike

__all__ = ["INPUT_HOOK", "OUTPUT_HOOK", "layer_activations", "next_token_loss", "spliced"]

#: circuit-tracer's hook names (relative to blocks.<l>) of what the dictionaries read and write
INPUT_HOOK = "ln2.hook_normalized"
OUTPUT_HOOK = "hook_mlp_out"


def _in(adapter: ModelAdapter, l: int) -> str:
    return adapter.hook_norm_normalized("ln2", l)


def _out(adapter: ModelAdapter, l: int) -> str:
    return adapter.hook_mlp_out(l)


def layer_activations(adapter: ModelAdapter, tokens: torch.Tensor, layers: list[int], *, skip_first: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, each ``(len(layers), n_tokens, d_model)`` float32 on the model's device: the
    dictionary inputs and the MLP outputs of the windows ``tokens (B, T)`` (position 0 left out
    when ``skip_first``: the BOS token's outliers are not trained on)."""
    got: dict[str, torch.Tensor] = {}

    def keep(value: torch.Tensor, hook: HookPointLike) -> None:
        got[hook.name] = value.detach()

    names = [n for l in layers for n in (_in(adapter, l), _out(adapter, l))]
    with torch.no_grad(), adapter.model.hooks(fwd_hooks=[(n, keep) for n in names]):
        adapter.model(tokens.to(adapter.device), stop_at_layer=max(layers) + 1)
    start = 1 if skip_first else 0

    def stack(fn: Callable[[Any, int], str]) -> torch.Tensor:
        return torch.stack([got[fn(adapter, l)][:, start:].reshape(-1, got[fn(adapter, l)].shape[-1])
                            for l in layers]).float()

    return stack(_in), stack(_out)


def next_token_loss(adapter: ModelAdapter, tokens: torch.Tensor) -> float:
    """Mean next-token cross-entropy of the windows (every position predicting the next token)."""
    with torch.no_grad():
        logits = adapter.model(tokens.to(adapter.device), return_type="logits").float()
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1).to(logits.device)))


@contextmanager
def spliced(adapter: ModelAdapter, layers: list[int],
            replace: Callable[[int, dict[int, torch.Tensor]], torch.Tensor] | None,
            *, start: int = 0) -> Iterator[None]:
    """Within the block, each listed layer's MLP output is ``replace(i, inputs)`` (``i``: its index in
    ``layers``; ``inputs``: the dictionary inputs ``(B, T, D)`` of the listed layers seen so far in this
    forward, by index), or zero when ``replace`` is None (zero-ablated MLPs), at positions ``start:``
    (the BOS position keeps the model's own output when the dictionaries were not trained on it)."""
    inputs: dict[int, torch.Tensor] = {}
    hooks = []
    for i, l in enumerate(layers):
        def read(value: torch.Tensor, hook: HookPointLike, i: int = i) -> None:
            inputs[i] = value.detach()

        def write(value: torch.Tensor, hook: HookPointLike, i: int = i) -> torch.Tensor:
            out = value.clone()
            new = torch.zeros_like(value) if replace is None else replace(i, inputs).to(value.dtype)
            out[:, start:] = new[:, start:]
            return out

        hooks += [(_in(adapter, l), read), (_out(adapter, l), write)]
    with adapter.model.hooks(fwd_hooks=hooks):
        yield
