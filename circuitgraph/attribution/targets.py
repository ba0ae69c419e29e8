"""Resolved targets: what a reader at the output side of the graph reads.

The spec names targets by token strings and shorthands; :func:`resolve_targets` turns them into
:class:`ResolvedTarget` values with token ids, positions and weights, checking every bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from circuitgraph.errors import AttributionError, TokenError

if TYPE_CHECKING:
    from circuitgraph.adapters.tokenizer import Tokenizer

__all__ = ["ResolvedTarget", "resolve_token", "top_logit_targets"]

TargetKind = Literal["logit", "logit_diff", "feature", "neuron", "direction"]


@dataclass
class ResolvedTarget:
    """One target reader.

    ``kind`` logit: ``tokens=(v,)``; logit_diff: ``tokens=(a, b)``; feature/neuron: ``layer``
    and ``index``; direction: ``site`` (resid_pre|resid_mid|resid_post), ``layer`` and ``vector``.
    ``position`` is a non-negative position.  ``weight`` is used by influence and pruning.
    """

    kind: TargetKind
    position: int
    weight: float = 1.0
    tokens: tuple[int, ...] = ()
    relative_to_mean: bool = False
    layer: int | None = None
    index: int | None = None
    site: str | None = None
    vector: torch.Tensor | None = None
    name: str = ""
    probability: float | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


def normalise_position(position: int, n_pos: int, where: str) -> int:
    p = position + n_pos if position < 0 else position
    if not (0 <= p < n_pos):
        raise AttributionError(
            f"{where}: position {position} is out of range for a {n_pos}-token prompt "
            f"(valid: 0..{n_pos - 1} or -{n_pos}..-1)"
        )
    return p


def resolve_token(token: str | int, tokenizer: Tokenizer | None, d_vocab: int, where: str) -> int:
    """A token string (must be exactly one token) or id (must be < d_vocab) -> id."""
    if isinstance(token, bool):
        raise TokenError(f"{where}: expected a token string or id, got {token!r}")
    if isinstance(token, int):
        if not (0 <= token < d_vocab):
            raise TokenError(f"{where}: token id {token} is outside the vocabulary (0..{d_vocab - 1})")
        return token
    if tokenizer is None:
        raise TokenError(
            f"{where}: token string {token!r} needs a tokenizer and this model has none; give a token id instead"
        )
    tid = tokenizer.single_token(token, where=where)
    if not (0 <= tid < d_vocab):
        raise TokenError(f"{where}: token {token!r} has id {tid}, outside the model's vocabulary (0..{d_vocab - 1})")
    return tid


def top_logit_targets(
    logits: torch.Tensor,
    *,
    position: int,
    max_n: int,
    cumulative_probability: float,
    relative_to_mean: bool = True,
) -> list[ResolvedTarget]:
    """circuit-tracer's rule: the most probable next tokens at ``position``, in order, until their
    cumulative probability reaches the threshold or ``max_n`` tokens are taken.  Weights are the
    probabilities."""
    probs = torch.softmax(logits[position].double(), dim=-1)
    top_p, top_i = probs.sort(descending=True)
    top_p, top_i = top_p[:max_n], top_i[:max_n]
    cum = top_p.cumsum(0)
    n = int((cum < cumulative_probability).sum().item()) + 1
    n = min(n, max_n)
    return [
        ResolvedTarget(kind="logit", position=position, weight=float(p), tokens=(int(i),),
                       relative_to_mean=relative_to_mean, probability=float(p))
        for p, i in zip(top_p[:n].tolist(), top_i[:n].tolist(), strict=False)
    ]
