"""Streamed per-neuron statistics of gated (SwiGLU-style) MLP activations.

One forward pass per row, each layer's gate (``hook_pre``), value (``hook_pre_linear``) and
output (``hook_post``) folded into a :class:`LayerStats` inside the hooks and then dropped, so
memory does not grow with the number of rows or their length beyond one row's forward pass:
per layer and neuron the ``top_k`` largest outputs (and whether each is an echo), whether the
gate ever opened, the echo mass and count, the largest echo and open-gate outputs, and the
regime counts.  ``stop_at_layer`` skips every block after the last layer asked for.

**Merging is exact.**  The rows may be split into shards folded apart (the dataset executors'
workers, :mod:`circuitgraph.datasets.echo_runs`) and merged in row order
(:meth:`LayerStats.merge`): the result is identical to one process folding every row, however
the rows are split.  The top values are the ``k`` smallest under the total order (larger value
first, then earlier row, then earlier position), kept by a *stable* sort, so the choice among
equal values (and so the echo flags) does not depend on the split; counts, ``ever_open`` and
maxima are exact; the echo mass is a float64 sum of per-row sums added in row order, and a
shard folded for merging keeps its per-row sums (``row_echo_mass``) for that, instead of
adding them itself.  Each row's activations are the same in any process running the model
with the same number of torch threads (a worker runs ``executor.threads``, 1 by default);
with another number the matrix products may round differently (float round-off).

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
    #: a shard folded for merging: each row's echo mass, in row order (None: added into echo_mass)
    row_echo_mass: list[torch.Tensor] | None = None

    @classmethod
    def empty(cls, k: int, d: int, dtype: torch.dtype = torch.float32, keep_rows: bool = False) -> LayerStats:
        """No row yet; ``keep_rows``: a shard to be merged (keeps its rows' echo masses apart)."""
        inf = torch.full((d,), float("-inf"), dtype=dtype)
        return cls(torch.full((k, d), float("-inf"), dtype=dtype), torch.zeros(k, d, dtype=torch.bool),
                   torch.zeros(4, dtype=torch.int64), torch.zeros(d, dtype=torch.bool),
                   torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.int64), inf.clone(), inf.clone(),
                   row_echo_mass=[] if keep_rows else None)

    def _keep_top(self, values: torch.Tensor, flags: torch.Tensor) -> None:
        """The first ``k`` of ``values`` (earlier rows first) by a stable descending sort."""
        k = self.top_values.shape[0]
        order = torch.sort(values, dim=0, descending=True, stable=True).indices[:k]
        self.top_values = values.gather(0, order)
        self.top_echo = flags.gather(0, order)

    def merge(self, later: LayerStats) -> None:
        """Fold in ``later``: the statistics of the rows that follow this one's (see the module
        docstring: the result equals folding its rows here one by one)."""
        if later.top_values.shape != self.top_values.shape:
            raise ValueError(f"cannot merge statistics of top {later.top_values.shape[0]} over "
                             f"{later.top_values.shape[1]} neurons into top {self.top_values.shape[0]} over "
                             f"{self.top_values.shape[1]}")
        self._keep_top(torch.cat([self.top_values, later.top_values]), torch.cat([self.top_echo, later.top_echo]))
        self.regime_counts += later.regime_counts
        self.ever_open |= later.ever_open
        for row in (later.row_echo_mass if later.row_echo_mass is not None else [later.echo_mass]):
            self._add_mass(row)
        self.echo_count += later.echo_count
        self.max_echo = torch.maximum(self.max_echo, later.max_echo)
        self.max_open = torch.maximum(self.max_open, later.max_open)
        self.n_tokens += later.n_tokens

    def _add_mass(self, row: torch.Tensor) -> None:
        if self.row_echo_mass is not None:
            self.row_echo_mass.append(row)
        else:
            self.echo_mass += row

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
        self._add_mass(prod.sum(0, dtype=torch.float64).cpu())
        self.echo_count += echo.sum(0).cpu()
        neg = torch.tensor(float("-inf"), dtype=post.dtype, device=post.device)
        self.max_echo = torch.maximum(self.max_echo, torch.where(echo, post, neg).amax(0).to(self.max_echo).cpu())
        self.max_open = torch.maximum(self.max_open, torch.where(open_, post, neg).amax(0).to(self.max_open).cpu())
        self._keep_top(torch.cat([self.top_values, post.to(self.top_values).cpu()]),
                       torch.cat([self.top_echo, echo.cpu()]))
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
                                                          self.max_echo, self.max_open, *(self.row_echo_mass or ())))


@torch.no_grad()
def stream_stats(adapter: ModelAdapter, token_lists: Iterable[Sequence[int]], layers: Sequence[int], top_k: int,
                 first_position: int = 1, keep_rows: bool = False) -> dict[int, LayerStats]:
    """Per layer, the :class:`LayerStats` of the rows in ``token_lists`` (positions from
    ``first_position`` on), one row a forward pass (see the module docstring); ``keep_rows``:
    a shard to be merged."""
    layers = sorted(layers)
    d = adapter.facts.d_mlp
    stats = {l: LayerStats.empty(top_k, d, keep_rows=keep_rows) for l in layers}
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
