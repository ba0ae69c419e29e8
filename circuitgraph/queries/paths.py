"""Top-k attribution paths between two node sets.

A path ``s -> r_1 -> ... -> r_m -> T`` carries, exactly, this much of the target's
pre-activation in the linear replacement model (:mod:`circuitgraph.queries.influence`):

    contribution = E[r_1, s] * (E[r_2, r_1] / pre_{r_1}) * ... * (E[T, r_m] / pre_{r_m})

(edge weights, each intermediate reader dividing by its pre-activation: the frozen gain
that passes a change of its input through; for active ReLU features that is dividing by
the activation).  The sum of the contributions of all paths from ``s`` to ``T`` is ``s``'s
total effect on ``T``.  ``share = contribution / pre_T``: the part of the target's value
(its pre-activation, e.g. the logit difference) that the path carries.  The shares of every path
into ``T`` sum to ``(pre_T - constant_T) / pre_T``, but paths of both signs cancel: when the
target is small next to its paths a share can be far outside ``[-1, 1]`` (6.0 and -5.98 for two
paths into a target of 0.41).  Such a path is flagged ``cancelling``: it is large, and most of it
is cancelled by paths of the other sign.

Ranking (``rank``):

* ``"exact"``: by ``|contribution|``;
* ``"normalized"``: by the product of row-normalised absolute edge weights
  ``|E[r, s]| / sum_s' |E[r, s']|`` (circuit-tracer's normalisation; a product of shares).

Search (``method``):

* ``"exact"``: k-best dynamic programming over the graph restricted to the nodes reachable
  from the sources and reaching the targets, in topological order.  Scores multiply along a
  path by non-negative factors, so the k best paths into a node extend the k best paths into
  its predecessors: keeping k per node (per constraint state: which ``through`` filters were
  visited, and the length when ``max_length`` is set) is exact on a DAG;
* ``"beam"``: greedy beam search backwards from the targets, keeping the ``beam_width`` best
  partial paths at each step; for very large graphs; not guaranteed optimal;
* ``"auto"``: exact when (relevant edges x k x constraint states) is at most
  :data:`EXACT_BUDGET` and the relevant graph is acyclic, else beam.  The result says which ran.

``expand_heads``: each edge of each path is split exactly over the last attention head (and
the source position it reads) its frozen paths pass through (Dunefsky et al.'s computational
paths; :mod:`circuitgraph.queries.head_split`), and the best head-resolved versions of the path
are listed, each with its exact contribution (parts of an edge sum to the edge, so the
versions of a path sum to the path).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

import numpy as np

from circuitgraph.errors import QueryError
from circuitgraph.graph.edges import reachable, topological_levels
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId, display_name
from circuitgraph.queries._base import QueryResult, check_k, fmt, format_table, share
from circuitgraph.queries._sparse import coalesced_edges, pass_through_divisors, row_normalised_abs
from circuitgraph.queries.filters import filter_mask, match_nodes, resolve_target_set
from circuitgraph.queries.head_split import HeadPart, split_edge

__all__ = ["AttributionPath", "PathsResult", "HeadResolvedPath", "top_paths", "path_contribution", "EXACT_BUDGET"]

#: ``method="auto"`` runs the exact search when edges x k x states is at most this
EXACT_BUDGET = 4_000_000
#: head-resolved versions listed per path when ``expand_heads`` is on
N_HEAD_RESOLVED = 5


@dataclass(frozen=True)
class HeadResolvedPath:
    """One head-resolved version of a path: per edge, ``"residual"`` or ``"L{m}H{h}@{p}"``."""

    via: tuple[str, ...]
    contribution: float

    def to_dict(self) -> dict[str, Any]:
        return {"via": list(self.via), "contribution": self.contribution}


@dataclass(frozen=True)
class AttributionPath:
    """A path with its exact contribution to its last node (the target)."""

    nodes: tuple[NodeId, ...]
    edge_weights: tuple[float, ...]
    contribution: float
    share: float | None
    normalized_weight: float
    edge_parts: tuple[tuple[Any, ...], ...] | None = None
    head_resolved: tuple[HeadResolvedPath, ...] | None = None

    @property
    def length(self) -> int:
        return len(self.nodes) - 1

    @property
    def cancelling(self) -> bool:
        """``|share| > 1``: the path carries more than the target's whole value, and paths of the other
        sign cancel the excess."""
        return self.share is not None and abs(self.share) > 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "nodes": [str(n) for n in self.nodes],
            "edge_weights": list(self.edge_weights),
            "contribution": self.contribution,
            "share": self.share,
            "cancelling": self.cancelling,
            "normalized_weight": self.normalized_weight,
        }
        if self.edge_parts is not None:
            out["edge_parts"] = [[p.to_dict() for p in parts] for parts in self.edge_parts]
        if self.head_resolved is not None:
            out["head_resolved"] = [h.to_dict() for h in self.head_resolved]
        return out


@dataclass(frozen=True, repr=False)
class PathsResult(QueryResult):
    """The k best paths, best first, and which search produced them."""

    kind = "top_paths"
    paths: tuple[AttributionPath, ...]
    method: Literal["exact", "beam"]
    rank: Literal["exact", "normalized"]
    k: int
    n_sources: int
    n_targets: int
    max_length: int | None = None
    beam_width: int | None = None
    #: what the paths' nodes are called besides their ids (token strings, feature labels)
    names: dict[NodeId, str] = field(default_factory=dict, repr=False, compare=False)

    def _named(self, node: NodeId) -> str:
        name = self.names.get(node)
        return f'{node} "{name}"' if name else str(node)
    #: each path's target and its value (pre-activation): what ``share`` is relative to
    target_values: tuple[tuple[str, float | None], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "share_of": "the target's value (pre-activation); |share| > 1: cancelling path",
            "target_values": {t: v for t, v in self.target_values},
            "method": self.method,
            "rank": self.rank,
            "k": self.k,
            "n_sources": self.n_sources,
            "n_targets": self.n_targets,
            "max_length": self.max_length,
            "beam_width": self.beam_width,
            "paths": [p.to_dict() for p in self.paths],
        }

    def table(self, max_rows: int = 10) -> str:
        rows = [(" -> ".join(self._named(n) for n in p.nodes), p.contribution, p.share, p.normalized_weight,
                 "cancelling" if p.cancelling else "") for p in self.paths]
        values = ", ".join(f"{t} = {fmt(v)}" for t, v in self.target_values)
        footer = (f"share = contribution / the target's value ({values}); paths of both signs add up to it, so "
                  "|share| > 1 marks a cancelling path (larger than the whole target, offset by paths of the other "
                  "sign)") if self.target_values else None
        return format_table(["path", "contribution", "share of target", "normalized", ""], rows, max_rows=max_rows,
                            title=f"top {self.k} paths (rank {self.rank}, method {self.method})", footer=footer)


# ---------------------------------------------------------------------------- helpers
class _EdgeIndex:
    """Coalesced, non-zero edges with per-edge factors and lookups."""

    def __init__(self, graph: AttributionGraph):
        e = coalesced_edges(graph)
        nz = e.weight != 0
        self.n = graph.n_nodes
        self.target, self.source, self.weight = e.target[nz], e.source[nz], e.weight[nz]
        self.norm = row_normalised_abs(e.target, e.weight, self.n)[nz]
        self.divisor = pass_through_divisors(graph)
        key = self.target * np.int64(self.n) + self.source
        self._order = np.argsort(key, kind="stable")
        self._keys = key[self._order]

    def find(self, source: int, target: int) -> int:
        key = target * self.n + source
        i = int(np.searchsorted(self._keys, key))
        if i >= self._keys.size or self._keys[i] != key:
            raise KeyError((source, target))
        return int(self._order[i])


def path_contribution(graph: AttributionGraph, nodes: Iterable[NodeId | str]) -> float:
    """Exact contribution of one path (see the module docstring); 0 if an edge is missing."""
    rows = [graph.index_of(n) for n in nodes]
    idx = _EdgeIndex(graph)
    return _contribution(idx, rows)[0]


def _contribution(idx: _EdgeIndex, rows: list[int]) -> tuple[float, float, list[float]]:
    value, normalized, weights = 1.0, 1.0, []
    for i, (u, v) in enumerate(zip(rows[:-1], rows[1:])):
        try:
            j = idx.find(u, v)
        except KeyError:
            return 0.0, 0.0, []
        w = float(idx.weight[j])
        weights.append(w)
        normalized *= float(idx.norm[j])
        if i == 0:
            value *= w
        else:
            d = idx.divisor[u]
            value = value * w / d if d != 0 else 0.0
    return value, normalized, weights


def _topological_order(n: int, nodes: np.ndarray, src: np.ndarray, dst: np.ndarray) -> list[int] | None:
    """``nodes`` (the only ends of the edges ``src -> dst``) in a topological order; None when
    there is a cycle."""
    level = topological_levels(n, src, dst)[nodes]
    if (level < 0).any():
        return None
    return nodes[np.argsort(level, kind="stable")].tolist()


def _log_abs(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.abs(x))


# ---------------------------------------------------------------------------- searches
def _exact_kbest(
    n: int, src: np.ndarray, dst: np.ndarray, logf_start: np.ndarray, logf_mid: np.ndarray,
    is_source: np.ndarray, is_target: np.ndarray, bits: np.ndarray, full: int, k: int,
    max_length: int | None, order: list[int],
) -> list[tuple[float, list[int]]]:
    """k best paths by sum of log-factors; returns ``[(score, [rows])]``.

    ``logf_start[j]`` is edge j's log-factor when its source starts the path, ``logf_mid[j]``
    when its source is an intermediate node."""
    in_order = np.argsort(dst, kind="stable")
    ptr = np.searchsorted(dst[in_order], np.arange(n + 1))
    # entries[v]: state -> list of (score, length, pred_node, pred_state, pred_idx); pred_idx -1 = start
    entries: dict[int, dict[tuple[int, int], list[tuple[float, int, int, Any, int]]]] = {}
    for v in order:
        cands: dict[tuple[int, int], list[tuple[float, int, int, Any, int]]] = {}
        bv = int(bits[v])
        for j in in_order[ptr[v] : ptr[v + 1]]:
            u = int(src[j])
            if is_source[u] and math.isfinite(logf_start[j]):
                state = (int(bits[u]) | bv, 1 if max_length else 0)
                cands.setdefault(state, []).append((float(logf_start[j]), 1, u, None, -1))
            lf = float(logf_mid[j])
            if not math.isfinite(lf):
                continue
            for u_state, lst in entries.get(u, {}).items():
                for i, (score, length, *_rest) in enumerate(lst):
                    if max_length and length + 1 > max_length:
                        continue
                    state = (u_state[0] | bv, length + 1 if max_length else 0)
                    cands.setdefault(state, []).append((score + lf, length + 1, u, u_state, i))
        if cands:
            entries[v] = {s: heapq.nlargest(k, lst, key=lambda c: c[0]) for s, lst in cands.items()}
    finals = []
    for v in order:
        if not is_target[v]:
            continue
        for state, lst in entries.get(v, {}).items():
            if state[0] != full:
                continue
            for i, c in enumerate(lst):
                finals.append((c[0], v, state, i))
    best = heapq.nlargest(k, finals, key=lambda c: c[0])
    out = []
    for score, v, state, i in best:
        rows = [v]
        node, st, idx = v, state, i
        while True:
            c = entries[node][st][idx]
            _, _, u, pst, pidx = c
            rows.append(u)
            if pidx < 0:
                break
            node, st, idx = u, pst, pidx
        out.append((score, rows[::-1]))
    return out


def _beam(
    n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray, divisor: np.ndarray, norm: np.ndarray, rank: str,
    is_source: np.ndarray, targets: list[int], bits: np.ndarray, full: int, k: int, beam_width: int,
    max_length: int | None,
) -> list[tuple[float, list[int]]]:
    """Greedy beam search backwards from the targets; returns ``[(score, [rows])]``.

    A partial path ``v -> ... -> T`` is scored by what it would carry if ``v`` started it:
    extending it by ``u -> v`` multiplies by ``E[v, u]``, divided by ``pre_v`` unless ``v`` is
    the target itself (``rank="exact"``), or by ``A[v, u]`` (``rank="normalized"``)."""
    in_order = np.argsort(dst, kind="stable")
    ptr = np.searchsorted(dst[in_order], np.arange(n + 1))
    logw = _log_abs(w)
    logn = _log_abs(norm)
    logd = _log_abs(divisor)
    beam = [(0.0, (int(t),), int(bits[t])) for t in targets]
    done: list[tuple[float, list[int]]] = []
    steps = max_length if max_length else n
    for _ in range(steps):
        cands = []
        for score, path, mask in beam:
            v = path[0]
            for j in in_order[ptr[v] : ptr[v + 1]]:
                u = int(src[j])
                if u in path:
                    continue
                if rank == "normalized":
                    new = score + logn[j]
                else:
                    new = score + logw[j] - (logd[v] if len(path) > 1 else 0.0)
                if not math.isfinite(new):
                    continue
                m = mask | int(bits[u])
                cand = (new, (u,) + path, m)
                cands.append(cand)
                if is_source[u] and m == full:
                    done.append((new, list(cand[1])))
        if not cands:
            break
        beam = heapq.nlargest(beam_width, cands, key=lambda c: c[0])
    return heapq.nlargest(k, done, key=lambda c: c[0])


# ---------------------------------------------------------------------------- the query
def top_paths(
    graph: AttributionGraph,
    source: Any,
    target: Any = "targets",
    k: int = 10,
    *,
    rank: Literal["exact", "normalized"] = "exact",
    method: Literal["auto", "exact", "beam"] = "auto",
    beam_width: int = 100,
    max_length: int | None = None,
    through: Iterable[Any] = (),
    avoid: Iterable[Any] = (),
    expand_heads: bool = False,
) -> PathsResult:
    """The ``k`` best paths from any node matching ``source`` to any node in ``target``.

    ``source``/``through``/``avoid`` are node filters; ``target`` is ``"targets"`` (the graph's
    targets) or a filter.  Paths must visit a node of every ``through`` filter, no node of any
    ``avoid`` filter, and have at most ``max_length`` edges.

    Example::

        res = top_paths(graph, {"kind": "embedding"}, k=5)
        res.paths[0].nodes, res.paths[0].contribution, res.method
    """
    k = check_k(k, "k")
    beam_width = check_k(beam_width, "beam_width")
    if max_length is not None:
        max_length = check_k(max_length, "max_length")
    if rank not in ("exact", "normalized"):
        raise QueryError(f"rank must be 'exact' or 'normalized', got {rank!r}")
    if method not in ("auto", "exact", "beam"):
        raise QueryError(f"method must be 'auto', 'exact' or 'beam', got {method!r}")
    n = graph.n_nodes
    src_ids = match_nodes(graph, source, what="top_paths source")
    tgt_ids = resolve_target_set(graph, target, what="top_paths target")
    through = list(through)
    avoid = list(avoid)
    if len(through) > 16:
        raise QueryError(f"top_paths: at most 16 'through' filters, got {len(through)}")
    bits = np.zeros(n, dtype=np.int64)
    has_in = np.zeros(n, dtype=bool)
    has_in[graph.edge_target] = True
    has_out = np.zeros(n, dtype=bool)
    has_out[graph.edge_source] = True
    for i, f in enumerate(through):
        matched = match_nodes(graph, f, what=f"top_paths through[{i}]")
        mask = filter_mask(graph, f)
        _check_passable(matched, has_in[mask].any(), has_out[mask].any(), f"top_paths through[{i}]")
        bits[mask] |= 1 << i
    full = (1 << len(through)) - 1
    avoided = np.zeros(n, dtype=bool)
    for i, f in enumerate(avoid):
        match_nodes(graph, f, what=f"top_paths avoid[{i}]")
        avoided |= filter_mask(graph, f)

    is_source = np.zeros(n, dtype=bool)
    is_source[[graph.index_of(s) for s in src_ids]] = True
    is_target = np.zeros(n, dtype=bool)
    is_target[[graph.index_of(t) for t in tgt_ids]] = True
    is_source &= ~avoided
    is_target &= ~avoided

    idx = _EdgeIndex(graph)
    allowed = ~avoided[idx.source] & ~avoided[idx.target]
    fwd = reachable(n, idx.source[allowed], idx.target[allowed], is_source)
    bwd = reachable(n, idx.target[allowed], idx.source[allowed], is_target)
    relevant = fwd & bwd
    keep = allowed & relevant[idx.source] & relevant[idx.target]
    src, dst, w, norm = idx.source[keep], idx.target[keep], idx.weight[keep], idx.norm[keep]

    n_states = (full + 1) * (max_length or 1)
    order = None
    chosen = method
    if method == "auto" and src.size * k * n_states > EXACT_BUDGET:
        chosen = "beam"
    elif method in ("auto", "exact"):
        order = _topological_order(n, np.flatnonzero(relevant), src, dst)
        if order is None and method == "exact":
            raise QueryError("top_paths method 'exact' needs an acyclic graph; this one has a cycle (use 'beam')")
        chosen = "exact" if order is not None else "beam"

    if chosen == "exact":
        if rank == "normalized":
            logf_start = logf_mid = _log_abs(norm)
        else:
            logf_start = _log_abs(w)
            with np.errstate(divide="ignore", invalid="ignore"):
                logf_mid = _log_abs(w) - _log_abs(idx.divisor[src])
            logf_mid[~np.isfinite(_log_abs(idx.divisor[src]))] = -np.inf
        found = _exact_kbest(n, src, dst, logf_start, logf_mid, is_source, is_target, bits, full, k,
                             max_length, order)
    else:
        targets_rel = [int(t) for t in np.flatnonzero(is_target & relevant)]
        found = _beam(n, src, dst, w, idx.divisor, norm, rank, is_source, targets_rel, bits, full, k,
                      beam_width, max_length)
    paths = []
    for _, rows in found:
        value, normalized, weights = _contribution(idx, rows)
        tgt = graph.nodes[rows[-1]]
        paths.append(AttributionPath(
            nodes=tuple(graph.nodes[r].id for r in rows),
            edge_weights=tuple(weights),
            contribution=value,
            share=share(value, tgt.pre_activation),
            normalized_weight=normalized,
        ))
    if expand_heads:
        _check_frozen_attention(graph)
        paths = [_expand(graph, p) for p in paths]
    names = {n: display_name(graph.node(n)) for p in paths for n in p.nodes}
    ends = dict.fromkeys(p.nodes[-1] for p in paths)
    values = tuple((str(t), graph.node(t).pre_activation) for t in ends)
    return PathsResult(tuple(paths), chosen, rank, k, int(is_source.sum()), int(is_target.sum()), max_length,
                       beam_width if chosen == "beam" else None, names={n: t for n, t in names.items() if t},
                       target_values=values)


def _check_passable(matched: list[NodeId], any_in: bool, any_out: bool, what: str) -> None:
    """A path can pass through a node only if it has incoming and outgoing edges."""
    if any_in and any_out:
        return
    kinds = sorted({m.kind for m in matched})
    if not any_in:
        hint = ("; with attention: heads, head nodes are sources of the graph (their inputs are not edges): start "
                "paths at them with source: {kind: attention_head}, or use attention: frozen with expand_heads: true "
                "to see which heads each path passes through") if "attention_head" in kinds else \
            "; use it as source instead"
        raise QueryError(f"{what}: none of the {len(matched)} node(s) it matches ({', '.join(kinds)}) has incoming "
                         f"edges, so no path can pass through them{hint}")
    raise QueryError(f"{what}: none of the {len(matched)} node(s) it matches ({', '.join(kinds)}) has outgoing edges, "
                     "so no path can pass through them; use it as target instead")


def _check_frozen_attention(graph: AttributionGraph) -> None:
    """``expand_heads`` splits edges over frozen attention: it needs at least one frozen layer."""
    ctx = graph.context
    modes = ctx.options.attention if ctx is not None else None
    if modes is not None and all(m != "frozen" for m in modes.values()):
        raise QueryError("top_paths expand_heads: this graph has attention: heads in every layer, so heads are nodes "
                         "and no edge passes through frozen attention to split; drop expand_heads (paths already name "
                         "their head nodes) or build the graph with attention: frozen")


def _expand(graph: AttributionGraph, path: AttributionPath) -> AttributionPath:
    """Attach the exact per-(head, source position) split of every edge of ``path``."""
    parts_per_edge = []
    for (u, v), w in zip(zip(path.nodes[:-1], path.nodes[1:]), path.edge_weights):
        try:
            parts = split_edge(graph, u, v, by_position=True)
        except QueryError:
            if graph.context is None:
                raise
            parts = [HeadPart(None, None, None, w, unsplit=True)]  # e.g. from a remainder of pruning
        parts = [p for p in parts if p.value != 0.0] or parts[:1]
        parts.sort(key=lambda p: -abs(p.value))
        parts_per_edge.append(tuple(parts))
    # k best combinations of one part per edge, by |product of part / edge|
    combos: list[tuple[float, tuple[int, ...]]] = [(1.0, ())]
    for parts, w in zip(parts_per_edge, path.edge_weights):
        nxt = [(c * (p.value / w if w != 0 else 0.0), idx + (i,))
               for c, idx in combos for i, p in enumerate(parts[:N_HEAD_RESOLVED])]
        combos = heapq.nlargest(N_HEAD_RESOLVED, nxt, key=lambda x: abs(x[0]))
    resolved = tuple(
        HeadResolvedPath(tuple(parts_per_edge[e][i].label for e, i in enumerate(idx)), path.contribution * frac)
        for frac, idx in combos
    )
    return AttributionPath(path.nodes, path.edge_weights, path.contribution, path.share, path.normalized_weight,
                           tuple(parts_per_edge), resolved)
