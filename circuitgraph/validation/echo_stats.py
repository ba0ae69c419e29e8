"""Streamed per-neuron statistics of gated (SwiGLU-style) MLP activations.

One forward pass per row, each layer's gate (``hook_pre``), value (``hook_pre_linear``) and
output (``hook_post``) folded into a :class:`LayerStats` inside the hooks and then dropped, so
memory does not grow with the number of rows or their length beyond one row's forward pass:
per layer and neuron the ``top_k`` largest outputs (and whether each is an echo), whether the
gate ever opened, the echo mass and count, the largest echo and open-gate outputs, and the
regime counts.  ``stop_at_layer`` skips every block after the last layer asked for.

Precision: the activations are compared and tagged in the model's dtype (float32 for the
real models; signs and orderings need no more); sums (echo mass, regime counts) accumulate in
float64 / int64.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["REGIMES", "LayerStats", "regimes_of", "stream_stats"]

REGIMES = ("open+", "open-", "echo", "closed")


def regimes_of(gate: torch.Tensor, value: torch.Tensor, act_gate: torch.Tensor) -> dict[str, torch.Tensor]:
    """Boolean masks of the four regimes for same-shaped gate, value and act(gate) tensors."""
    open_ = gate > 0
    echo = (~open_) & (value < 0) & (act_gate * value > 0)
    return {"open+": open_ & (value > 0), "open-": open_ & (value <= 0), "echo": echo, "closed": (~open_) & ~echo}


@dataclass
class LayerStats:
    """What one layer's neurons did over the rows streamed so far (``d`` neurons, ``k`` top)."""

    top_values: torch.Tensor  # (k, d) the k largest hook_post values, -inf where fewer were seen
    top_echo: torch.Tensor  # (k, d) bool: that value is an echo
    regime_counts: torch.Tensor  # (4,) int64, in REGIMES order
    ever_open: torch.Tensor  # (d,) bool
    echo_mass: torch.Tensor  # (d,) float64: sum of act(gate) * value over echo activations
    echo_count: torch.Tensor  # (d,) int64
    max_echo: torch.Tensor  # (d,) -inf where none
    max_open: torch.Tensor  # (d,) -inf where none
    n_tokens: int = 0

    @classmethod
    def empty(cls, k: int, d: int, dtype: torch.dtype = torch.float32) -> LayerStats:
        inf = torch.full((d,), float("-inf"), dtype=dtype)
        return cls(torch.full((k, d), float("-inf"), dtype=dtype), torch.zeros(k, d, dtype=torch.bool),
                   torch.zeros(4, dtype=torch.int64), torch.zeros(d, dtype=torch.bool),
                   torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.int64), inf.clone(), inf.clone())

    def update(self, gate: torch.Tensor, value: torch.Tensor, act_gate: torch.Tensor, post: torch.Tensor) -> None:
        """Fold in ``(T, d)`` activations of one row (positions already chosen)."""
        if gate.shape[0] == 0:
            return
        reg = regimes_of(gate, value, act_gate)
        echo = reg["echo"]
        self.regime_counts += torch.stack([reg[r].sum() for r in REGIMES]).to(torch.int64).cpu()
        open_ = gate > 0
        self.ever_open |= open_.any(0).cpu()
        prod = torch.where(echo, act_gate * value, torch.zeros((), dtype=post.dtype))
        self.echo_mass += prod.sum(0, dtype=torch.float64).cpu()
        self.echo_count += echo.sum(0).cpu()
        neg = torch.tensor(float("-inf"), dtype=post.dtype, device=post.device)
        self.max_echo = torch.maximum(self.max_echo, torch.where(echo, post, neg).amax(0).to(self.max_echo).cpu())
        self.max_open = torch.maximum(self.max_open, torch.where(open_, post, neg).amax(0).to(self.max_open).cpu())
        values = torch.cat([self.top_values, post.to(self.top_values).cpu()])
        flags = torch.cat([self.top_echo, echo.cpu()])
        k = self.top_values.shape[0]
        top = values.topk(k, dim=0)
        self.top_values = top.values
        self.top_echo = flags.gather(0, top.indices)
        self.n_tokens += int(gate.shape[0])

    @property
    def n_top(self) -> torch.Tensor:
        """(d,) how many top values were seen (at most k)."""
        return torch.isfinite(self.top_values).sum(0)

    def echo_share(self) -> torch.Tensor:
        """(d,) float64: the share of each neuron's top values that are echoes."""
        n = self.n_top.clamp(min=1).double()
        return (self.top_echo & torch.isfinite(self.top_values)).sum(0).double() / n

    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in (self.top_values, self.top_echo, self.regime_counts,
                                                          self.ever_open, self.echo_mass, self.echo_count,
                                                          self.max_echo, self.max_open))


@torch.no_grad()
def stream_stats(adapter: ModelAdapter, token_lists: Iterable[Sequence[int]], layers: Sequence[int], top_k: int,
                 first_position: int = 1) -> dict[int, LayerStats]:
    """Per layer, the :class:`LayerStats` of the rows in ``token_lists`` (positions from
    ``first_position`` on), one row a forward pass (see the module docstring)."""
    layers = sorted(layers)
    d = adapter.facts.d_mlp
    stats = {l: LayerStats.empty(top_k, d) for l in layers}
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for l in layers:
        pre, lin, act = adapter.hook_mlp_pre(l), adapter.hook_mlp_pre_linear(l), adapter.mlp_act_fn(l)

        def grab(value, hook):
            seen[hook.name] = value
            return value

        def fold(post, hook, l=l, pre=pre, lin=lin, act=act):
            g, v = seen.pop(pre)[0, first_position:], seen.pop(lin)[0, first_position:]
            stats[l].update(g, v, act(g), post[0, first_position:])
            return post

        hooks += [(pre, grab), (lin, grab), (adapter.hook_mlp_post(l), fold)]
    with adapter.model.hooks(fwd_hooks=hooks) as model:
        for toks in token_lists:
            model(torch.tensor([list(toks)], device=adapter.device), stop_at_layer=layers[-1] + 1)
    return stats
