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
  ``|E[r, s]| / sum_s' |E[r, s']|`` (circuit-tracer's normalisation; a product of shares);
* ``"flow"``: by the share of the target carried by the path's weakest edge.  The *flow* of an
  edge ``u -> v`` towards ``T`` is ``E[v, u] * y_T[v]`` with ``y_T[v] = d pre_T / d pre_v`` in
  the linear model: the sum of the contributions of *all* paths through that edge (counting
  ``u``'s whole pre-activation), so it does not shrink with the path's length.  A path scores
  ``min |flow| / |pre_T|`` over its edges (the widest path); paths that share their weakest
  edge tie, and are listed by ``|contribution|``.

Why the exact ranking returns short paths: a path's share of the target is a product of one
factor per edge, ``E[r_{i+1}, r_i] / pre_{r_{i+1}}`` (the part of each reader's value that the
previous node gives it), and a node of a real model has hundreds of inputs, so every hop
multiplies by a small number.  The target's value is spread over exponentially many long
paths, each small; ``embedding -> layer-0 neuron -> target`` (a layer-0 neuron's input is
mostly its token's embedding, and its output reaches the logits directly) carries the most of
any single path.  ``min_length`` (at least this many edges) and ``through`` (e.g. a range of
layers) ask for the paths through the middle of the model under the same exact ranking;
``rank="flow"`` ranks by edges instead of whole paths.

Search (``method``):

* ``"exact"``: k-best dynamic programming over the graph restricted to the nodes reachable
  from the sources and reaching the targets, level by level in topological order, vectorised
  (numpy over every edge into a level at once).  Scores combine along a path monotonically (a
  product of non-negative factors, or a bottleneck), so the k best paths into a node extend the
  k best paths into its predecessors: keeping k per node (per constraint state: which
  ``through`` filters were visited, and the length when ``max_length`` or ``min_length`` is
  set) is exact on a DAG;
* ``"beam"``: greedy beam search backwards from the targets, keeping the ``beam_width`` best
  partial paths at each step; for very large graphs; not guaranteed optimal;
* ``"auto"``: exact when (relevant edges x k x constraint states) is at most
  :data:`EXACT_BUDGET` and the relevant graph is acyclic, else beam.  The result says which ran.
  ``min_length`` and ``rank="flow"`` need the exact search.

``expand_heads``: each edge of each path is split exactly over the last attention head (and
the source position it reads) its frozen paths pass through (Dunefsky et al.'s computational
paths; :mod:`circuitgraph.queries.head_split`), and the best head-resolved versions of the path
are listed, each with its exact contribution (parts of an edge sum to the edge, so the
versions of a path sum to the path).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from circuitgraph.errors import QueryError
from circuitgraph.graph.edges import reachable, topological_levels
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId, display_name
from circuitgraph.queries._base import QueryResult, check_k, fmt, format_table, share
from circuitgraph.queries._sparse import coalesced_edges, pass_through_divisors, row_normalised_abs
from circuitgraph.queries.filters import filter_mask, match_nodes, resolve_target_set
from circuitgraph.queries.head_split import HeadPart, split_edge
from circuitgraph.queries.influence import reader_gradients

__all__ = ["AttributionPath", "PathsResult", "HeadResolvedPath", "top_paths", "path_contribution", "EXACT_BUDGET",
           "RANKS"]

#: ``method="auto"`` runs the exact search when edges x k x states is at most this (it is
#: vectorised by level: ~1 s per 10 million)
EXACT_BUDGET = 200_000_000
#: the path rankings (the module docstring defines them)
RANKS = ("exact", "normalized", "flow")
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
    #: ``rank="flow"``: the share of the target carried by the path's weakest edge (every path through
    #: that edge counted): ``min |E[v, u] y_T[v]|`` over its edges, over ``pre_T``
    flow_share: float | None = None
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
        if self.flow_share is not None:
            out["flow_share"] = self.flow_share
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
    rank: Literal["exact", "normalized", "flow"]
    k: int
    n_sources: int
    n_targets: int
    max_length: int | None = None
    beam_width: int | None = None
    min_length: int | None = None
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
            "min_length": self.min_length,
            "beam_width": self.beam_width,
            "paths": [p.to_dict() for p in self.paths],
        }

    def table(self, max_rows: int = 10) -> str:
        flow = self.rank == "flow"
        rows = [(" -> ".join(self._named(n) for n in p.nodes), p.contribution, p.share,
                 p.flow_share if flow else p.normalized_weight, "cancelling" if p.cancelling else "")
                for p in self.paths]
        values = ", ".join(f"{t} = {fmt(v)}" for t, v in self.target_values)
        footer = (f"share = contribution / the target's value ({values}); paths of both signs add up to it, so "
                  "|share| > 1 marks a cancelling path (larger than the whole target, offset by paths of the other "
                  "sign)") if self.target_values else None
        return format_table(["path", "contribution", "share of target", "weakest edge's share" if flow else "normalized",
                             ""], rows, max_rows=max_rows,
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
    for i, (u, v) in enumerate(zip(rows[:-1], rows[1:], strict=False)):
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


def _log_abs(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.abs(x))


# ---------------------------------------------------------------------------- searches
@dataclass(frozen=True)
class _States:
    """The constraint states of the exact search: which ``through`` filters were visited (a bit
    mask, ``full`` when all were) and, when lengths matter, the path's length in edges (capped at
    ``cap``: ``max_length`` when given, else ``min_length``, beyond which lengths are alike)."""

    full: int
    cap: int  # 0: lengths are not tracked
    max_length: int | None
    min_length: int

    @property
    def n_lengths(self) -> int:
        return max(self.cap, 1)

    @property
    def n(self) -> int:
        return (self.full + 1) * self.n_lengths

    def encode(self, mask: np.ndarray, length: np.ndarray) -> np.ndarray:
        if not self.cap:
            return mask
        return mask * self.cap + (np.minimum(length, self.cap) - 1)

    def mask(self, state: np.ndarray) -> np.ndarray:
        return state // self.cap if self.cap else state

    def length(self, state: np.ndarray) -> np.ndarray:
        return state % self.cap + 1 if self.cap else np.ones_like(state)

    def final(self, state: np.ndarray) -> np.ndarray:
        """States a path may end in: every ``through`` filter visited, at least ``min_length`` edges."""
        return (self.mask(state) == self.full) & (self.length(state) >= self.min_length)


#: candidate entries built at once by the exact search (memory: ~40 bytes each)
_CHUNK = 4_000_000
#: the exact search's tables hold nodes x states x k entries (24 bytes each): above this, the beam
_MAX_TABLE = 40_000_000


def _above_bound(groups: np.ndarray, bound: np.ndarray) -> Callable[[tuple[np.ndarray, ...]], tuple[np.ndarray, ...]]:
    """The candidates ``(group, score, ...)`` whose score reaches their group's lower bound (the
    groups without a bound keep every candidate)."""
    def strong(cand: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        i = np.minimum(np.searchsorted(groups, cand[0]), groups.size - 1)
        floor = np.where(groups[i] == cand[0], bound[i], -np.inf)
        keep = cand[1] >= floor
        return tuple(x[keep] for x in cand)
    return strong


def _every_candidate(cand: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    return cand


def _kbest_dag(
    n: int, src: np.ndarray, dst: np.ndarray, score_start: np.ndarray, score_mid: np.ndarray, combine: str,
    is_source: np.ndarray, is_target: np.ndarray, bits: np.ndarray, states: _States, k: int, level: np.ndarray,
) -> list[tuple[float, list[int]]]:
    """The k best paths on a DAG, vectorised by topological level; returns ``[(score, [rows])]``.

    A path's score starts as ``score_start[j]`` of its first edge and each further edge ``j``
    combines it with ``score_mid[j]``: ``combine="sum"`` adds (log-factors: a product), ``"min"``
    takes the smaller (a bottleneck).  Both are monotone (a better partial path never makes a worse
    extension), so the k best paths into a node per constraint state extend the k best into its
    predecessors: keeping k per (node, state), nodes taken level by level (every predecessor of a
    level lies in an earlier one), is exact.  Ties between equal scores are broken by node order."""
    S = states.n
    score = np.full((n, S, k), -np.inf)
    pred_node = np.full((n, S, k), -1, dtype=np.int64)
    pred_code = np.full((n, S, k), -1, dtype=np.int64)  # state * k + slot of the predecessor; -1: a start
    edge_level = level[dst]
    by_level = np.argsort(edge_level, kind="stable")
    bounds = np.searchsorted(edge_level[by_level], np.arange(int(level.max(initial=0)) + 2))

    def extend(j: np.ndarray, best_only: bool) -> tuple[np.ndarray, ...]:
        """Candidates ``(group, score, pred node, pred code)`` extending the partial paths into the
        sources of edges ``j`` (only each state's best with ``best_only``)."""
        kk = 1 if best_only else k
        base = score[src[j], :, :kk].reshape(j.size, S * kk)
        row, c = np.nonzero(np.isfinite(base))
        code = (c // kk) * k + c % kk  # the predecessor's state * k + slot
        jj, old = j[row], c // kk
        length = states.length(old) + 1
        if states.max_length is not None:
            fits = length <= states.max_length
            row, c, code, jj, old, length = row[fits], c[fits], code[fits], jj[fits], old[fits], length[fits]
        base_score = base[row, c]
        new = base_score + score_mid[jj] if combine == "sum" else np.minimum(base_score, score_mid[jj])
        group = dst[jj] * np.int64(S) + states.encode(states.mask(old) | bits[dst[jj]], length)
        return group, new, src[jj], code

    for d in range(int(level.max(initial=0)) + 1):
        edges = by_level[bounds[d]:bounds[d + 1]]
        if not edges.size:
            continue
        parts = []  # (group = node * S + state, score, pred node, pred code)
        first = edges[is_source[src[edges]] & np.isfinite(score_start[edges])]
        if first.size:
            length = np.ones(first.size, dtype=np.int64)
            parts.append((dst[first] * np.int64(S) + states.encode(bits[src[first]] | bits[dst[first]], length),
                          score_start[first], src[first], np.full(first.size, -1, dtype=np.int64)))
        live = edges[np.isfinite(score_mid[edges]) & np.isfinite(score[src[edges], :, 0]).any(axis=1)]
        per_chunk = max(1, _CHUNK // (S * k))
        chunks = [live[c:c + per_chunk] for c in range(0, live.size, per_chunk)]
        if k > 1 and live.size:
            # a lower bound of each group's k-th best: the k-th best of the candidates extending
            # each predecessor's best partial path (they are candidates too); weaker ones are dropped
            # before the sort, so it sorts about as many candidates as edges, not edges x k
            g0, v0 = (np.concatenate(x) for x in zip(*[(p[0], p[1]) for p in parts],
                                                      *[extend(j, True)[:2] for j in chunks], strict=False))
            order = np.lexsort((-v0, g0))
            g0, v0 = g0[order], v0[order]
            starts = np.r_[0, np.flatnonzero(g0[1:] != g0[:-1]) + 1]
            rank = np.arange(g0.size) - np.repeat(starts, np.diff(np.r_[starts, g0.size]))
            groups, bound = g0[starts], np.full(starts.size, -np.inf)
            at_k = rank == k - 1
            bound[np.searchsorted(groups, g0[at_k])] = v0[at_k]

            strong = _above_bound(groups, bound)
        else:
            strong = _every_candidate
        parts = [strong(p) for p in parts] + [strong(extend(j, False)) for j in chunks]
        if not parts:
            continue
        group, value, p_node, p_code = (np.concatenate(x) for x in zip(*parts, strict=False))
        order = np.lexsort((p_code, p_node, -value, group))  # per group, best first
        group, value = group[order], value[order]
        starts = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1]
        rank = np.arange(group.size) - np.repeat(starts, np.diff(np.r_[starts, group.size]))
        take = rank < k
        g, r = group[take], rank[take]
        score[g // S, g % S, r] = value[take]
        pred_node[g // S, g % S, r] = p_node[order][take]
        pred_code[g // S, g % S, r] = p_code[order][take]
    # the best k finished paths: at a target, in a final state
    t_rows = np.flatnonzero(is_target)
    finals = score[t_rows]  # (n_targets, S, k)
    finals = np.where(states.final(np.arange(S))[None, :, None], finals, -np.inf)
    flat = finals.reshape(-1)
    n_found = int(np.isfinite(flat).sum())
    best = np.lexsort((np.arange(flat.size), -flat))[:min(k, n_found)]
    out = []
    for b in best.tolist():
        t, rest = divmod(b, S * k)
        st, slot = divmod(rest, k)
        v = int(t_rows[t])
        rows = [v]
        while True:
            u, code = int(pred_node[v, st, slot]), int(pred_code[v, st, slot])
            rows.append(u)
            if code < 0:
                break
            v, (st, slot) = u, divmod(code, k)
        out.append((float(flat[b]), rows[::-1]))
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
                    done.append((float(new), list(cand[1])))
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
    rank: Literal["exact", "normalized", "flow"] = "exact",
    method: Literal["auto", "exact", "beam"] = "auto",
    beam_width: int = 100,
    max_length: int | None = None,
    min_length: int | None = None,
    through: Iterable[Any] = (),
    avoid: Iterable[Any] = (),
    expand_heads: bool = False,
) -> PathsResult:
    """The ``k`` best paths from any node matching ``source`` to any node in ``target``.

    ``source``/``through``/``avoid`` are node filters; ``target`` is ``"targets"`` (the graph's
    targets) or a filter.  Paths must visit a node of every ``through`` filter, no node of any
    ``avoid`` filter, and have at least ``min_length`` and at most ``max_length`` edges.
    ``rank`` is ``"exact"``, ``"normalized"`` or ``"flow"`` (the module docstring defines them).

    Example::

        res = top_paths(graph, {"kind": "embedding"}, k=5)
        res.paths[0].nodes, res.paths[0].contribution, res.method
    """
    k = check_k(k, "k")
    beam_width = check_k(beam_width, "beam_width")
    if max_length is not None:
        max_length = check_k(max_length, "max_length")
    if min_length is not None:
        min_length = check_k(min_length, "min_length")
        if max_length is not None and min_length > max_length:
            raise QueryError(f"top_paths: min_length {min_length} is above max_length {max_length}; no path has "
                             "both; lower min_length or raise max_length")
    if rank not in RANKS:
        raise QueryError(f"rank must be one of {', '.join(repr(r) for r in RANKS)}, got {rank!r}")
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
        _check_passable(matched, bool(has_in[mask].any()), bool(has_out[mask].any()), f"top_paths through[{i}]")
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

    states = _States(full, max_length or min_length or 0, max_length, min_length or 1)
    level = None  # the topological levels: computed whenever the exact search is chosen
    chosen: Literal["exact", "beam"] = "beam"
    if method == "auto" and (src.size * k * states.n > EXACT_BUDGET or n * states.n * k > _MAX_TABLE):
        chosen = "beam"
    elif method in ("auto", "exact"):
        level = topological_levels(n, src, dst)
        if n * states.n * k > _MAX_TABLE:
            raise QueryError(f"top_paths method 'exact': {n:,} nodes x {states.n:,} constraint states x k={k} is more "
                             "than the exact search holds; use fewer through filters, a smaller k or method 'beam'")
        if (level[relevant] < 0).any():
            if method == "exact":
                raise QueryError("top_paths method 'exact' needs an acyclic graph; this one has a cycle (use 'beam')")
            chosen = "beam"
        else:
            chosen = "exact"
    if chosen == "beam" and min_length is not None:
        raise QueryError(f"top_paths min_length needs the exact search, and this graph is too large for it "
                         f"({src.size:,} relevant edges x k={k} x {states.n} states > {EXACT_BUDGET:,}) or cyclic; "
                         "lower k, narrow source or target, or drop min_length")

    flows = None
    if rank == "flow":
        flows = _edge_flows(graph, idx, is_target)
    if chosen == "exact":
        found = []
        if rank == "flow":  # a flow is relative to one target: one search per target
            assert flows is not None and level is not None
            for t, (flow, share_of) in flows.items():
                only = np.zeros(n, dtype=bool)
                only[t] = True
                score = _log_abs(flow[keep]) - (math.log(abs(share_of)) if share_of else 0.0)
                found += _kbest_dag(n, src, dst, score, score, "min", is_source, only, bits, states, k, level)
            found = sorted(found, key=lambda f: -f[0])[:k]
        else:
            assert level is not None
            if rank == "normalized":
                score_start = score_mid = _log_abs(norm)
            else:
                score_start = _log_abs(w)
                with np.errstate(divide="ignore", invalid="ignore"):
                    score_mid = _log_abs(w) - _log_abs(idx.divisor[src])
                score_mid[~np.isfinite(_log_abs(idx.divisor[src]))] = -np.inf
            found = _kbest_dag(n, src, dst, score_start, score_mid, "sum", is_source, is_target, bits, states, k,
                               level)
    else:
        if rank == "flow":
            raise QueryError("top_paths rank 'flow' needs the exact search (an acyclic graph within the budget); "
                             "lower k or narrow source or target")
        targets_rel = [int(t) for t in np.flatnonzero(is_target & relevant)]
        found = _beam(n, src, dst, w, idx.divisor, norm, rank, is_source, targets_rel, bits, full, k,
                      beam_width, max_length)
    paths = []
    for _, rows in found:
        value, normalized, weights = _contribution(idx, rows)
        tgt = graph.nodes[rows[-1]]
        bottleneck = None
        if flows is not None:
            flow = flows[rows[-1]][0]
            bottleneck = min(abs(float(flow[idx.find(u, v)])) for u, v in zip(rows[:-1], rows[1:], strict=False))
        paths.append(AttributionPath(
            nodes=tuple(graph.nodes[r].id for r in rows),
            edge_weights=tuple(weights),
            contribution=value,
            share=share(value, tgt.pre_activation),
            normalized_weight=normalized,
            flow_share=share(bottleneck, tgt.pre_activation) if bottleneck is not None else None,
        ))
    if rank == "flow":  # equal bottlenecks (paths sharing their weakest edge): the larger contribution first
        paths.sort(key=lambda p: (-abs(p.flow_share or 0.0), -abs(p.contribution)))
    if expand_heads:
        _check_frozen_attention(graph)
        paths = [_expand(graph, p) for p in paths]
    names = {n: display_name(graph.node(n)) for p in paths for n in p.nodes}
    ends = dict.fromkeys(p.nodes[-1] for p in paths)
    values = tuple((str(t), graph.node(t).pre_activation) for t in ends)
    return PathsResult(tuple(paths), chosen, rank, k, int(is_source.sum()), int(is_target.sum()), max_length,
                       beam_width if chosen == "beam" else None, names={n: t for n, t in names.items() if t},
                       target_values=values, min_length=min_length)


def _edge_flows(graph: AttributionGraph, idx: _EdgeIndex, is_target: np.ndarray) -> dict[int, tuple[np.ndarray, float]]:
    """Per target row ``T``: the flow of every edge of ``idx``, ``E[v, u] * y_T[v]`` with
    ``y_T = d pre_T / d pre`` (the part of ``pre_T`` carried by all paths through the edge), and
    ``pre_T``, what a flow's share is relative to."""
    t_rows = np.flatnonzero(is_target)
    y = reader_gradients(graph, [graph.nodes[t].id for t in t_rows])
    out = {}
    for j, t in enumerate(t_rows.tolist()):
        pre = graph.nodes[t].pre_activation
        out[t] = (idx.weight * y[idx.target, j], float(pre) if pre is not None else 0.0)
    return out


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
    for (u, v), w in zip(zip(path.nodes[:-1], path.nodes[1:], strict=False), path.edge_weights, strict=False):
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
    for parts, w in zip(parts_per_edge, path.edge_weights, strict=False):
        nxt = [(c * (p.value / w if w != 0 else 0.0), idx + (i,))
               for c, idx in combos for i, p in enumerate(parts[:N_HEAD_RESOLVED])]
        combos = heapq.nlargest(N_HEAD_RESOLVED, nxt, key=lambda x: abs(x[0]))
    resolved = tuple(
        HeadResolvedPath(tuple(parts_per_edge[e][i].label for e, i in enumerate(idx)), path.contribution * frac)
        for frac, idx in combos
    )
    return dataclasses.replace(path, edge_parts=tuple(parts_per_edge), head_resolved=resolved)
