"""QK attribution checked by intervention: remove a node from one side of the score only.

For a head ``h`` of layer ``l`` and a (query, key) pair, the query marginal of node ``a`` is
``u_a . k / scale``: the part of the pre-softmax score that goes away when ``a`` is removed
from the *query side only*.  This check does exactly that in the real TransformerLens model:

1. in the frozen model (every sigma, pattern and node frozen, see
   :mod:`circuitgraph.validation.frozen`) remove ``a``'s output and record the residual
   stream ``resid_pre(l)`` at the query position: the residual without ``a``;
2. run the clean model with split q/k/v inputs (``use_split_qkv_input``) and ln1's sigma
   frozen, replacing the query input ``blocks.l.hook_q_input`` of head ``h`` at the query
   position by that residual (the keys and values keep the clean input), and read
   ``hook_attn_scores`` (the soft-cap undone).

The change in the score is the *actual* effect, the marginal the *predicted* one; in the
frozen model they agree to float rounding.  Key-side marginals are checked the same way
through ``hook_k_input``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph._results import Tabular
from circuitgraph.attribution.linearisation import frozen
from circuitgraph.errors import ValidationRunError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries.qk import qk
from circuitgraph.validation._common import fmt, graph_context, markdown_table
from circuitgraph.validation.frozen import frozen_node_hooks

if TYPE_CHECKING:
    from circuitgraph.attribution.context import AttributionContext
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["QKCheckRow", "QKCheckResult", "qk_check", "qk_removal_effects"]


@dataclass
class QKCheckRow:
    """One node removed from one side: the marginal (predicted) and the change in the score (actual)."""

    head: int
    side: str  # "query" or "key"
    node: str
    predicted: float
    actual: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(repr=False)
class QKCheckResult(Tabular):
    """Predicted vs actual for the nodes of the top pairs; ``ok`` when every row agrees to
    ``tolerance`` relative to the head's ``|q| |k| / sqrt(d_head)``."""

    layer: int
    query_position: int
    rows: list[QKCheckRow]
    magnitudes: dict[int, float]
    tolerance: float
    notes: list[str] = field(default_factory=list)

    @property
    def max_relative_deviation(self) -> float | None:
        if not self.rows:
            return None
        return max(abs(r.predicted - r.actual) / max(self.magnitudes[r.head], 1e-30) for r in self.rows)

    @property
    def ok(self) -> bool | None:
        dev = self.max_relative_deviation
        return None if dev is None else bool(dev <= self.tolerance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "query_position": self.query_position,
            "max_relative_deviation": self.max_relative_deviation,
            "tolerance": self.tolerance,
            "ok": self.ok,
            "notes": list(self.notes),
            "rows": [r.to_dict() for r in self.rows],
        }

    def table(self, max_rows: int = 10) -> str:
        t = markdown_table(["head", "side", "node", "predicted (marginal)", "actual (removed)"],
                           [[r.head, r.side, r.node, r.predicted, r.actual] for r in self.rows], max_rows)
        status = {True: "passed", False: "FAILED", None: "not run"}[self.ok]
        return (f"{t}\n\nQK removal check {status} (max relative deviation {fmt(self.max_relative_deviation)}, "
                f"tolerance {fmt(self.tolerance)})")


def _sigma_hook(value: torch.Tensor):
    def fix(scale, hook):  # the split input adds a head dimension
        shape = [1, value.shape[0]] + [1] * (scale.ndim - 2)
        return value.to(scale.dtype).view(shape).expand_as(scale).clone()
    return fix


def _qk_sigma_hook(value: torch.Tensor):
    """Fix a query/key norm's ``hook_scale`` at its frozen ``(pos, heads)`` or ``(pos, 1)`` value in a
    batched run (per-head norms see ``(batch * pos * heads, 1)``, whole-projection ones ``(batch, pos, 1)``)."""
    def fix(scale, hook):
        n = scale.numel() // value.numel()
        return value.to(scale.dtype).expand(n, *value.shape).reshape(scale.shape).clone()
    return fix


@torch.no_grad()
def qk_removal_effects(context: AttributionContext, layer: int, head: int, query_position: int, key_position: int,
                       nodes: Sequence[tuple[str, NodeId]]) -> list[float]:
    """For each ``(side, node)``: the pre-cap score of ``head`` at (query, key) minus the score
    with ``node`` removed from that side only (``side`` is ``"query"`` or ``"key"``)."""
    a, lin = context.adapter, context.linearisation
    model = a.transformer_lens_model()  # split query/key inputs are TransformerLens's (use_split_qkv_input)
    resid_name = a.hook_resid_pre(layer)
    # 1. the residual at resid_pre(layer) with each node removed, in the frozen model
    removed: list[torch.Tensor] = []
    for _, node in nodes:
        hooks, captured = frozen_node_hooks(context, [node])

        def keep(value, hook, captured=captured):
            captured["resid"] = value.detach()[0].clone()
            return value

        with frozen(a, lin, extra_hooks=hooks + [(resid_name, keep)]) as m:
            m(lin.tokens.to(a.device)[None])
        removed.append(captured["resid"])
    # 2. each removed residual on one side only, in one batched run with split q/k inputs
    n = len(nodes)
    cap = a.facts.attn_scores_soft_cap
    scores: dict[int, torch.Tensor] = {}

    def side_hook(side: str, position: int):
        def fn(value, hook):  # [batch, pos, head, d_model]
            value = value.clone()
            for b, (s, _) in enumerate(nodes):
                if s == side:
                    h = head if side == "query" else head // (a.facts.n_heads // value.shape[2])
                    value[b + 1, position, h] = removed[b].to(value.dtype)[position]
            return value
        return fn

    def grab(value, hook):
        scores[0] = value.detach()[:, head, query_position, key_position].double()
        return value

    sigma_hook = [(a.hook_norm_scale("ln1", layer), _sigma_hook(lin.sigma[("ln1", layer)]))] if a.has_norm("ln1", layer) else []
    hooks = sigma_hook + [
             (a.hook_qk_input(layer, "q"), side_hook("query", query_position)),
             (a.hook_qk_input(layer, "k"), side_hook("key", key_position)),
             (a.hook_attn_scores(layer), grab)]
    # query/key norms: their sigma frozen too, as in the decomposition (queries/qk.py)
    hooks += [(a.hook_qk_norm_scale(side, layer), _qk_sigma_hook(lin.qk_sigma[(side, layer)]))
              for side in ("q", "k") if (side, layer) in lin.qk_sigma]
    previous = model.cfg.use_split_qkv_input
    model.set_use_split_qkv_input(True)
    try:
        with model.hooks(fwd_hooks=hooks):
            model(lin.tokens.to(a.device)[None].expand(n + 1, -1))
    finally:
        model.set_use_split_qkv_input(previous)
    s = scores[0]
    if cap is not None:
        s = cap * torch.atanh(s / cap)
    return [float(s[0] - s[b + 1]) for b in range(n)]


def qk_check(graph: AttributionGraph, layer: int, head: int | Sequence[int], query_position: int = -1,
             key_position: int | str = "top", top_k: int = 5, *, tolerance: float | None = None) -> QKCheckResult:
    """Predicted (marginal) vs actual (removal) for every node of each head's top ``top_k`` pairs,
    on the query side and on the key side."""
    ctx = graph_context(graph, "qk")
    res = qk(graph, layer, head, query_position, key_position, top_k=top_k)
    rows: list[QKCheckRow] = []
    notes: list[str] = []
    magnitudes: dict[int, float] = {}
    for h in res.heads:
        d = h.decomposition
        if d is None:  # qk() keeps every head's decomposition; a summary without one has no nodes to remove
            raise ValidationRunError(f"qk check: head {h.head} has no decomposition to check")
        magnitudes[h.head] = h.magnitude
        qm = dict(zip(d.query_nodes, d.query_marginals(), strict=False))
        km = dict(zip(d.key_nodes, d.key_marginals(), strict=False))
        items: list[tuple[str, NodeId]] = []
        for p in h.pairs:
            for side, node in (("query", p.query_node), ("key", p.key_node)):
                if (side, node) in items:
                    continue
                if not _removable(ctx, node):
                    notes.append(f"L{layer}H{h.head} {side} node {node}: not removable in the frozen model "
                                 "(attention writers need graph.attention: heads; folded remainders are not writers)")
                    continue
                items.append((side, node))
        actual = qk_removal_effects(ctx, layer, h.head, h.query_position, h.key_position, items) if items else []
        for (side, node), act in zip(items, actual, strict=False):
            pred = qm[node] if side == "query" else km[node]
            rows.append(QKCheckRow(h.head, side, str(node), float(pred), act))
    if tolerance is None:
        tolerance = 1e-5 if ctx.options.dtype == torch.float32 else 1e-10
    return QKCheckResult(int(layer), res.query_position, rows, magnitudes, float(tolerance), _dedupe(notes))


def _removable(ctx: AttributionContext, node: NodeId) -> bool:
    """Whether the frozen model can remove ``node`` (a writer; attention writers only in heads mode)."""
    try:
        frozen_node_hooks(ctx, [node])
    except ValidationRunError:
        return False
    return True


def _dedupe(notes: list[str]) -> list[str]:
    return list(dict.fromkeys(notes))
