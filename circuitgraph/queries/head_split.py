"""Exact split of an edge through frozen attention over the heads that carry it.

An edge ``u -> r`` (writer ``u`` at residual location ``loc_u``, position ``s``; reader ``r``
at ``loc_r``, position ``t``) is the sum over every frozen path from ``u``'s output to
``r``'s input that passes through no node: residual connections, frozen attention (each
head, each source position), skip-transcoder linear paths.  Partition those paths by the
**last attention head they pass through** before the reader (the one nearest the reader),
and, optionally, by the source position that head reads from; the paths through no head at
all form the *residual-direct* part.  The parts sum to the edge exactly.

Computed with one backward sweep, as in :mod:`circuitgraph.attribution.engine`, but with
``1 + (heads) [x positions]`` channels instead of one: channel 0 carries the reader gradient
along the residual stream only; at each frozen attention layer ``m`` the gradient of channel
0 is split by :meth:`FrozenLinearModel.attention_transpose_per_head` into one new channel per
head ``(m, h)`` (and per source position ``p``, when asked); every other channel, whose last
head is already fixed, goes through attention whole (any head) and through the residual.  At
``u``'s location each channel's gradient at ``s`` dotted with ``u``'s output vector is that
channel's part.  By linearity of the frozen model, channel 0 plus all split channels equals
the full sweep, so the parts sum to the edge.

Only layers between the writer and the reader get channels, and only source positions in
``[s, t]`` (causal attention; every position with bidirectional attention); memory is
``channels x (t + 1) x d_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from circuitgraph.attribution.context import AttributionContext, ResidualLocation
from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries._base import QueryResult, format_table, require_context, share
from circuitgraph.queries.filters import resolve_node

__all__ = ["HeadPart", "HeadSplitResult", "head_split", "split_edge"]


@dataclass(frozen=True)
class HeadPart:
    """One part of an edge: through head ``(layer, head)`` last (reading source position
    ``source_position`` when split by position), or residual-direct when ``head`` is None.
    ``unsplit`` marks a whole edge that could not be split (an endpoint added after
    attribution, such as a remainder node of pruning)."""

    layer: int | None
    head: int | None
    source_position: int | None
    value: float
    unsplit: bool = False

    @property
    def label(self) -> str:
        if self.unsplit:
            return "unsplit"
        if self.head is None:
            return "residual"
        pos = "" if self.source_position is None else f"@{self.source_position}"
        return f"L{self.layer}H{self.head}{pos}"

    def to_dict(self) -> dict[str, Any]:
        return {"via": self.label, "layer": self.layer, "head": self.head,
                "source_position": self.source_position, "value": self.value}


@dataclass(frozen=True, repr=False)
class HeadSplitResult(QueryResult):
    """The parts of the edge ``source -> target``, largest first; ``sum(parts) == edge_weight``."""

    kind = "head_split"
    source: NodeId
    target: NodeId
    edge_weight: float
    parts: tuple[HeadPart, ...]
    by_position: bool

    @property
    def total(self) -> float:
        return float(sum(p.value for p in self.parts))

    def by_head(self) -> dict[str, float]:
        """Parts summed over source positions: ``{"residual": x, "L0H2": y, ...}``."""
        out: dict[str, float] = {}
        for p in self.parts:
            key = "residual" if p.head is None else f"L{p.layer}H{p.head}"
            out[key] = out.get(key, 0.0) + p.value
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "target": str(self.target),
            "edge_weight": self.edge_weight,
            "sum_of_parts": self.total,
            "by_position": self.by_position,
            "parts": [{**p.to_dict(), "share": share(p.value, self.edge_weight)} for p in self.parts],
        }

    def table(self, max_rows: int = 10) -> str:
        rows = [(p.label, p.value, share(p.value, self.edge_weight)) for p in self.parts]
        return format_table(["via", "value", "share"], rows, max_rows=max_rows,
                            title=f"edge {self.source} -> {self.target} = {self.edge_weight:.6g}, split by last head")


def split_edge(graph: AttributionGraph, source: NodeId, target: NodeId, *, by_position: bool = False
               ) -> list[HeadPart]:
    """The parts of the edge ``source -> target`` (unsorted; see the module docstring)."""
    ctx = require_context(graph, "splitting an edge over attention heads")
    if not ctx.writes(source):
        raise QueryError(f"head split: {source} is not a writer of the attributed graph (it writes nothing to the "
                         "residual, or was added after attribution, e.g. a remainder of pruning)")
    r = ctx.reader(target)
    if r is None:
        if target.kind == "attention_head":
            raise QueryError(f"head split: {target} is a head node, and head nodes have no incoming edges (with "
                             "attention: heads they are sources of the graph); split an edge into a feature, neuron "
                             "or target instead, or use attention: frozen and split the edges those heads carry")
        raise QueryError(f"head split: {target} is not a reader of the attributed graph (it has no incoming edges, "
                         "or was added after attribution)")
    loc_r, pos_t, g = r.location, r.position, r.direction
    # a cross-layer transcoder feature writes at several locations: split each write the
    # reader can see and add the parts up
    causal = ctx.frozen_model.causal  # bidirectional attention: a reader sees later positions too
    writes = [w for w in ctx.writes(source) if w.location <= loc_r and (w.position <= pos_t or not causal)]
    if not writes:
        raise QueryError(f"head split: {source} cannot reach {target} (it writes after the reader reads, "
                         "or at a later position)")
    crossed = {m: ctx.options.attention[m] for w in writes for m in range(ctx.n_layers)
               if w.location <= ResidualLocation.resid_pre(m) and ResidualLocation.resid_mid(m) <= loc_r}
    if crossed and all(mode != "frozen" for mode in crossed.values()):
        raise QueryError(f"head split: every attention layer between {source} and {target} (layers {sorted(crossed)}) "
                         "has attention: heads, so its heads are nodes and the edge passes through no frozen head to "
                         "split it over; look at the head nodes' edges (neighbours) or build the graph with attention: "
                         "frozen")
    total: dict[tuple[int | None, int | None, int | None], float] = {}
    for w in writes:
        for key, v in _split_one(ctx, w.location, w.position, w.vector, loc_r, pos_t, g, by_position).items():
            total[key] = total.get(key, 0.0) + v
    return [HeadPart(m, h, p, v) for (m, h, p), v in total.items() if v != 0.0 or m is None]


def _split_one(ctx: AttributionContext, loc_u: ResidualLocation, pos_s: int, vec: Any, loc_r: ResidualLocation,
               pos_t: int, g: Any, by_position: bool) -> dict[tuple[int | None, int | None, int | None], float]:
    """The parts of one write ``vec`` at ``(loc_u, pos_s)`` into reader ``g`` at ``(loc_r, pos_t)``."""
    fm = ctx.frozen_model
    H = ctx.adapter.facts.n_heads
    # the attention layers between the write and the read whose pattern is frozen
    layers = [m for m in range(ctx.n_layers)
              if loc_u <= ResidualLocation.resid_pre(m) and ResidualLocation.resid_mid(m) <= loc_r
              and ctx.options.attention[m] == "frozen"]
    span = range(pos_s, pos_t + 1) if fm.causal else range(ctx.n_pos)
    positions = list(span) if by_position else [None]
    keys: list[tuple[int | None, int | None, int | None]] = [(None, None, None)]
    channel: dict[tuple[int, int, int | None], int] = {}
    for m in layers:
        for h in range(H):
            for p in positions:
                channel[(m, h, p)] = len(keys)
                keys.append((m, h, p))
    with torch.no_grad():
        T = pos_t + 1 if fm.causal else ctx.n_pos
        G = torch.zeros(len(keys), T, ctx.adapter.facts.d_model, dtype=fm.dtype, device=fm.device)
        G[0, pos_t] += g.to(device=fm.device, dtype=fm.dtype)
        for loc in map(ResidualLocation, range(loc_r, loc_u, -1)):
            if loc.sublayer == "attn":
                m = loc.layer
                if ctx.options.attention[m] != "frozen":
                    continue
                if G.shape[0] > 1:
                    G[1:] = G[1:] + fm.attention_transpose(m, G[1:])
                per = fm.attention_transpose_per_head(m, G[0:1])[0]  # (H, T, d_model)
                for h in range(H):
                    if by_position:
                        for p in positions:
                            G[channel[(m, h, p)], p] += per[h, p]
                    else:
                        G[channel[(m, h, None)]] += per[h]
            else:
                G = fm.step_down(loc, G)
        values = (G[:, pos_s, :] @ vec.to(device=fm.device, dtype=fm.dtype)).double().cpu().numpy()
    return {key: float(v) for key, v in zip(keys, values, strict=False)}


def head_split(graph: AttributionGraph, source: NodeId | str, target: NodeId | str, *,
               by_position: bool = False) -> HeadSplitResult:
    """Split the edge ``source -> target`` over the last attention head its paths pass through.

    Example::

        res = head_split(graph, "feature/0/2/5", "logit/2/9/16")
        res.by_head()            # {'residual': ..., 'L1H3': ..., ...}, summing to the edge
    """
    source = resolve_node(graph, source, what="head_split source")
    target = resolve_node(graph, target, what="head_split target")
    parts = split_edge(graph, source, target, by_position=by_position)
    parts.sort(key=lambda p: -abs(p.value))
    return HeadSplitResult(source, target, graph.edge_weight_between(source, target), tuple(parts), by_position)


def parts_sum_check(result: HeadSplitResult) -> float:
    """``|sum(parts) - edge| / max(|edge|, sum |parts|)`` (0 for an exact split)."""
    scale = max(abs(result.edge_weight), float(np.sum([abs(p.value) for p in result.parts])), 1e-300)
    return abs(result.total - result.edge_weight) / scale
