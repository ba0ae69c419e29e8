"""QK attribution: why a head attends where it does, split exactly over pairs of graph nodes.

With every sigma, every attention pattern and every node frozen, the query vector of head
``h`` of layer ``l`` at the query position ``q`` is an affine function of the residual stream
at ``(l, q)``, and that residual is a sum of the graph's node outputs (through frozen earlier
heads): ``q = sum_a u_a + c_q``.  Likewise the key at the key position ``k``:
``k = sum_b v_b + c_k``.  Rotary embeddings are a fixed linear map per position (folded into
the reader directions), grouped-query heads share their key weights.  The pre-softmax score

    s = q . k / scale = sum_{a,b} u_a . v_b / scale              (pairs)
                      + (sum_a u_a) . c_k / scale + c_q . (sum_b v_b) / scale + c_q . c_k / scale

is bilinear, so it splits exactly into

* **pairs** ``u_a . v_b / scale`` (node ``a`` on the query side, node ``b`` on the key side),
* **query marginals** ``u_a . k / scale`` (node ``a`` against the whole key), summing with the
  query constant ``c_q . k / scale`` to ``s``,
* **key marginals** ``q . v_b / scale``, summing with the key constant ``q . c_k / scale`` to ``s``,
* **constants**: every term that involves ``c_q`` or ``c_k`` (the projection biases ``b_Q``,
  ``b_K`` and the ln1 ``beta`` read through ``W_Q``/``W_K``, plus the biases, folded positional
  embeddings and position-0 MLP outputs carried in the residual), by name.

The vectors ``u_a`` come from the engine's transposed sweep
(:func:`circuitgraph.attribution.engine.attribute_directions`) with ``d_head`` readers at
``resid_pre(l)``: reader ``i`` reads the rotated query dimension ``i`` through ln1 at ``(l, q)``
with its frozen sigma (the residual itself in a model without input norms, OLMo-2); the "edges"
into it are every node's query-side components.  The same
for the key side at ``(l, k)``.  One sweep for all the heads asked; no per-pair work.

Query/key norms (Qwen3, Gemma-3 per head; OLMo-2, OLMoE over the whole projection) are frozen
like every norm: with their sigma fixed per head (or per projection) and position they are the
diagonal map ``gamma / sigma`` (:func:`qk_norm_scale`), folded into the reader directions.

With an attention soft-cap ``cap * tanh(s / cap)`` the capped score is not bilinear: the
pre-cap score ``s`` is decomposed and the capped one is reported as ``score_capped``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from circuitgraph.attribution.context import ResidualLocation
from circuitgraph.attribution.qk_readers import QKReaders, attention_module, qk_norm_scale
from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import REMAINDER_INDEX, NodeId
from circuitgraph.queries._base import QueryResult, check_k, format_table, require_context

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.attribution.context import AttributionContext

__all__ = ["QKPair", "QKMarginal", "QKDecomposition", "QKHead", "QKResult", "qk", "qk_decomposition",
           "model_attention_scores", "qk_problems", "qk_norm_scale"]


@dataclass(frozen=True)
class QKPair:
    """``u_a . v_b / scale``: query-side node ``a`` against key-side node ``b``."""

    query_node: NodeId
    key_node: NodeId
    value: float

    def to_dict(self) -> dict[str, Any]:
        return {"query_node": str(self.query_node), "key_node": str(self.key_node), "value": self.value}


@dataclass(frozen=True)
class QKMarginal:
    """One node's share of the score against the whole other side."""

    node: NodeId
    value: float

    def to_dict(self) -> dict[str, Any]:
        return {"node": str(self.node), "value": self.value}


@dataclass(frozen=True)
class QKDecomposition:
    """Every node's query-side and key-side vectors for one head at one (query, key) pair.

    ``query_vectors[a]`` is ``u_a`` (rotated, before the scale), ``key_vectors[b]`` is ``v_b``;
    ``query_constant``/``key_constant`` are ``c_q``/``c_k``, split by origin in the ``*_parts``
    dicts.  All arrays are float64 (computed in the graph's dtype).  ``score`` is the
    model's own pre-cap score (from TransformerLens's rotated q and k), ``score_capped`` its
    ``hook_attn_scores`` value, ``probability`` the frozen attention pattern.
    """

    layer: int
    head: int
    query_position: int
    key_position: int
    query_nodes: tuple[NodeId, ...]
    query_vectors: np.ndarray  # (n_q, d_head)
    key_nodes: tuple[NodeId, ...]
    key_vectors: np.ndarray  # (n_k, d_head)
    query_constant_parts: dict[str, np.ndarray]
    key_constant_parts: dict[str, np.ndarray]
    scale: float
    soft_cap: float | None
    score: float
    score_capped: float
    probability: float
    model_query: np.ndarray  # (d_head,) TransformerLens's (rotated) query vector
    model_key: np.ndarray  # (d_head,)

    @property
    def query_constant(self) -> np.ndarray:
        return sum(self.query_constant_parts.values(), np.zeros(self.query_vectors.shape[1]))

    @property
    def key_constant(self) -> np.ndarray:
        return sum(self.key_constant_parts.values(), np.zeros(self.key_vectors.shape[1]))

    @property
    def query(self) -> np.ndarray:
        """The decomposed query vector ``sum_a u_a + c_q``."""
        return self.query_vectors.sum(0) + self.query_constant

    @property
    def key(self) -> np.ndarray:
        return self.key_vectors.sum(0) + self.key_constant

    @property
    def magnitude(self) -> float:
        """``|q| |k| / sqrt(d_head)``: the scale that "relative" errors are measured against."""
        return float(np.linalg.norm(self.model_query) * np.linalg.norm(self.model_key)
                     / math.sqrt(self.query_vectors.shape[1]))

    def pair_matrix(self) -> np.ndarray:
        """All pairs ``(n_q, n_k)``: ``u_a . v_b / scale``."""
        return self.query_vectors @ self.key_vectors.T / self.scale

    def query_marginals(self) -> np.ndarray:
        return self.query_vectors @ self.key / self.scale

    def key_marginals(self) -> np.ndarray:
        return self.key_vectors @ self.query / self.scale

    def constants(self) -> dict[str, float]:
        """The constant terms by name (see :class:`QKHead`)."""
        q_nodes, k_nodes = self.query_vectors.sum(0), self.key_vectors.sum(0)
        cq, ck = self.query_constant, self.key_constant
        s = self.scale
        out = {
            "query_constant": float(cq @ self.key / s),
            "key_constant": float(self.query @ ck / s),
            "query_constant_x_key_nodes": float(cq @ k_nodes / s),
            "query_nodes_x_key_constant": float(q_nodes @ ck / s),
            "query_constant_x_key_constant": float(cq @ ck / s),
        }
        out["pairs_constant"] = (out["query_constant_x_key_nodes"] + out["query_nodes_x_key_constant"]
                                 + out["query_constant_x_key_constant"])
        for name, vec in self.query_constant_parts.items():
            out[f"query_constant/{name}"] = float(vec @ self.key / s)
        for name, vec in self.key_constant_parts.items():
            out[f"key_constant/{name}"] = float(self.query @ vec / s)
        return out


@dataclass(frozen=True)
class QKHead:
    """The QK decomposition of one head, top ``N`` of each list; the sums are over all nodes.

    ``constants`` names every term involving a constant: ``query_constant`` (``c_q . k``),
    ``key_constant`` (``q . c_k``), ``pairs_constant`` (``c_q . V + U . c_k + c_q . c_k``, with
    ``U``/``V`` the node sums) and its three parts, and ``query_constant/<origin>`` /
    ``key_constant/<origin>`` splitting the first two by where the constant comes from.
    """

    layer: int
    head: int
    query_position: int
    key_position: int
    score: float
    score_capped: float
    probability: float
    soft_cap: float | None
    scale: float
    magnitude: float
    pairs: tuple[QKPair, ...]
    query_marginals: tuple[QKMarginal, ...]
    key_marginals: tuple[QKMarginal, ...]
    constants: dict[str, float]
    pairs_sum_plus_constant: float
    query_marginals_sum_plus_constant: float
    key_marginals_sum_plus_constant: float
    n_query_nodes: int
    n_key_nodes: int
    decomposition: QKDecomposition | None = field(default=None, repr=False, compare=False)
    #: short labels of the reported nodes (token strings of embeddings), for :meth:`QKResult.table`
    labels: dict[NodeId, str] = field(default_factory=dict, repr=False, compare=False)

    def name(self, node: NodeId) -> str:
        label = self.labels.get(node)
        return f"{node} {label!r}" if label else str(node)

    def max_deviation(self) -> float:
        """The largest of the three sums' distances from ``score``, relative to ``magnitude``."""
        dev = max(abs(x - self.score) for x in (self.pairs_sum_plus_constant, self.query_marginals_sum_plus_constant,
                                                self.key_marginals_sum_plus_constant))
        return dev / self.magnitude if self.magnitude > 0 else dev

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "query_position": self.query_position,
            "key_position": self.key_position,
            "score": self.score,
            "score_capped": self.score_capped,
            "probability": self.probability,
            "soft_cap": self.soft_cap,
            "scale": self.scale,
            "magnitude": self.magnitude,
            "pairs": [p.to_dict() for p in self.pairs],
            "query_marginals": [m.to_dict() for m in self.query_marginals],
            "key_marginals": [m.to_dict() for m in self.key_marginals],
            "constants": dict(self.constants),
            "pairs_sum_plus_constant": self.pairs_sum_plus_constant,
            "query_marginals_sum_plus_constant": self.query_marginals_sum_plus_constant,
            "key_marginals_sum_plus_constant": self.key_marginals_sum_plus_constant,
            "n_query_nodes": self.n_query_nodes,
            "n_key_nodes": self.n_key_nodes,
            "max_relative_deviation": self.max_deviation(),
        }


@dataclass(frozen=True)
class QKResult(QueryResult):
    """``qk`` query: one :class:`QKHead` per head asked."""

    kind = "qk"
    layer: int
    query_position: int
    key_position: int | str
    top_k: int
    heads: tuple[QKHead, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "query_position": self.query_position, "key_position": self.key_position,
                "top_k": self.top_k, "heads": [h.to_dict() for h in self.heads]}

    def table(self, max_rows: int = 10) -> str:
        out = []
        for h in self.heads:
            title = (f"L{h.layer}H{h.head} query {h.query_position} -> key {h.key_position}: score {h.score:.6g} "
                     f"(capped {h.score_capped:.6g}, p={h.probability:.4g}); pairs+constant "
                     f"{h.pairs_sum_plus_constant:.6g}")
            out.append(format_table(["query node", "key node", "value"],
                                    [(h.name(p.query_node), h.name(p.key_node), p.value) for p in h.pairs],
                                    max_rows=max_rows, title=title))
            out.append(format_table(["query node", "marginal"], [(h.name(m.node), m.value) for m in h.query_marginals],
                                    max_rows=max_rows))
            out.append(format_table(["key node", "marginal"], [(h.name(m.node), m.value) for m in h.key_marginals],
                                    max_rows=max_rows))
        return "\n\n".join(out)


# ----------------------------------------------------------------------------- the model's side
def _attention_module(adapter: ModelAdapter, layer: int) -> Any:
    return attention_module(adapter, layer)


class _Stop(Exception):
    pass


@torch.no_grad()
def model_attention_scores(adapter: ModelAdapter, tokens: torch.Tensor, layer: int,
                           extra_hooks: Sequence[tuple[str, Any]] = ()) -> dict[str, torch.Tensor]:
    """The model's own query and key vectors (rotated, grouped-query heads expanded) and its
    ``hook_attn_scores`` at ``layer``: ``q, k (pos, n_heads, d_head)``, ``scores (n_heads, pos, pos)``.
    The forward pass stops after ``layer``'s scores."""
    _attention_module(adapter, layer)
    rotary = adapter.facts.positional == "rotary"
    qk_norm = adapter.facts.qk_norm != "none"
    if rotary or not qk_norm:
        names = {adapter.hook_qk(layer, s, rotated=rotary): s for s in ("q", "k")}
    else:  # learned positions with q/k norms: the norm's P(x)/sigma (TransformerLens's hook_q is before it)
        names = {adapter.hook_qk_normalized(s, layer): s for s in ("q", "k")}
    scores_name = adapter.hook_attn_scores(layer)
    got: dict[str, torch.Tensor] = {}

    def keep(value, hook):
        got[names[hook.name]] = value.detach()  # batch 1
        return value

    def stop(value, hook):
        got["scores"] = value.detach()[0]
        raise _Stop

    hooks = list(extra_hooks) + [(n, keep) for n in names] + [(scores_name, stop)]
    try:
        with adapter.model.hooks(fwd_hooks=hooks):
            adapter.model(tokens.to(adapter.device)[None])
    except _Stop:
        pass
    H = adapter.facts.n_heads
    if qk_norm and not rotary:
        T, dh = tokens.shape[-1], adapter.facts.d_head
        for side in _SIDES:  # per head (pos * heads, d_head), whole (pos, heads * d_head): times gamma
            gamma = _qk_gamma(adapter, side, layer)
            got[side] = (got[side].reshape(-1, gamma.numel()) * gamma).reshape(T, -1, dh)
    else:
        got["q"], got["k"] = got["q"][0], got["k"][0]
    k = got["k"]
    if k.shape[1] != H:  # grouped-query attention: one key per group of query heads
        k = k.repeat_interleave(H // k.shape[1], dim=1)
    return {"q": got["q"], "k": k, "scores": got["scores"]}


# ----------------------------------------------------------------------------- the sweep
def _constant_name(loc: int, side: str, bos_nodes: bool) -> str:
    if loc < 0:
        return f"{side} projection bias"  # b_Q / b_K and ln1 beta read through W_Q / W_K
    where = ResidualLocation(loc)
    if where.sublayer == "embed":
        return "positional embeddings"
    if where.sublayer == "attn":
        return f"attention L{where.layer} biases"
    return f"MLP L{where.layer} biases" + ("" if bos_nodes else " and position-0 outputs")


def _readers(ctx: AttributionContext, layer: int, heads: Sequence[int], q_pos: int, k_pos: Sequence[int]):
    """Reader directions ``(n, d_model)`` and own constants ``(n,)`` in the graph's dtype: per head,
    ``d_head`` rotated query dimensions at ``(layer, q_pos)`` then ``d_head`` key dimensions at
    ``(layer, k_pos[j])``.  ``g = P(gamma1 * w) / sigma1``, own constant ``w . beta1 + b``
    (:class:`~circuitgraph.attribution.qk_readers.QKReaders`)."""
    readers = QKReaders(ctx.adapter, ctx.linearisation, layer, ctx.options.dtype, ctx.adapter.device)
    dirs, consts, positions = [], [], []
    for h, kp in zip(heads, k_pos, strict=False):
        for side, t in (("q", q_pos), ("k", kp)):
            d, c = readers.side(side, h, t)
            dirs.append(d)
            consts.append(c)
            positions += [t] * d.shape[0]
    return torch.cat(dirs), torch.cat(consts), positions


_SIDES: tuple[Literal["q", "k"], ...] = ("q", "k")


def _qk_gamma(adapter: ModelAdapter, side: Literal["q", "k"], layer: int) -> torch.Tensor:
    """gamma of the query or key norm of ``layer`` (an RMSNorm: it always has one)."""
    gamma = adapter.qk_norm(side, layer).gamma
    assert gamma is not None
    return gamma


def _graph_id(graph: AttributionGraph, node_id: NodeId) -> NodeId:
    """The id a writer has in ``graph``: itself, or the remainder that holds it (a feature folded
    away by ``max_feature_nodes``, or any writer removed by pruning, which keeps the pruned part
    of each (layer, position) in ``remainder/<layer>/<position>/1``)."""
    if node_id in graph:
        return node_id
    for kind, index in (("feature", REMAINDER_INDEX["features"]), (None, REMAINDER_INDEX["pruned"])):
        if kind is None or node_id.kind == kind:
            rem = NodeId("remainder", node_id.layer, node_id.position, index)
            if rem in graph:
                return rem
    return node_id


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _heads(head: Any) -> list[int]:
    return [int(head)] if _is_int(head) else [int(h) for h in head]


def qk_problems(layer: Any, head: Any, query_position: Any, key_position: Any, *, n_layers: int, n_heads: int,
                n_pos: int, causal: bool = True) -> list[tuple[str, str]]:
    """Every problem with the arguments of a ``qk`` query for a model and prompt, each as
    ``(field, message)`` naming the value and the allowed range (empty when all is well); a key
    after the query is a problem only under causal attention."""
    out: list[tuple[str, str]] = []
    if not _is_int(layer) or not 0 <= layer < n_layers:
        out.append(("layer", f"layer {layer!r} requested, the model has {n_layers} layers (0-{n_layers - 1})"))
    heads = [head] if _is_int(head) else (list(head) if isinstance(head, (list, tuple)) else [head])
    if not heads:
        out.append(("head", "head is an empty list; give a head index or a non-empty list of them"))
    for h in heads:
        if not _is_int(h) or not 0 <= h < n_heads:
            out.append(("head", f"head {h!r} requested, the model has {n_heads} heads per layer (0-{n_heads - 1})"))
    q = None
    if not _is_int(query_position) or not -n_pos <= query_position < n_pos:
        out.append(("query_position", f"query_position {query_position!r} is outside the prompt ({n_pos} positions: "
                                      f"0..{n_pos - 1} or -{n_pos}..-1)"))
    else:
        q = query_position + n_pos if query_position < 0 else query_position
    if isinstance(key_position, str):
        if key_position != "top":
            out.append(("key_position", f"key_position must be an integer or 'top', got {key_position!r}"))
    elif not _is_int(key_position) or not -n_pos <= key_position < n_pos:
        out.append(("key_position", f"key_position {key_position!r} is outside the prompt ({n_pos} positions: "
                                    f"0..{n_pos - 1} or -{n_pos}..-1)"))
    elif causal and q is not None and (key_position + n_pos if key_position < 0 else key_position) > q:
        out.append(("key_position", f"key_position {key_position} is after query_position {query_position} "
                                    f"(position {q}); causal attention reads only keys at or before the query"))
    return out


@torch.no_grad()
def qk_decomposition(
    graph: AttributionGraph,
    layer: int,
    head: int | Sequence[int],
    query_position: int = -1,
    key_position: int | str = "top",
) -> list[QKDecomposition]:
    """Every node's exact query-side and key-side vectors for each head (one engine sweep).

    ``key_position="top"`` picks, per head, the key the head attends to most from the query.
    Needs the live model (a graph from ``run``/``attribute``, not one loaded from JSON).
    """
    ctx = require_context(graph, "qk")
    a, lin = ctx.adapter, ctx.linearisation
    f = a.facts
    problems = qk_problems(layer, head, query_position, key_position, n_layers=f.n_layers, n_heads=f.n_heads,
                           n_pos=lin.n_pos, causal=f.causal)
    if problems:
        raise QueryError("qk: " + "; ".join(msg for _, msg in problems))
    heads = _heads(head)
    T = lin.n_pos
    q_pos = int(query_position) + T if int(query_position) < 0 else int(query_position)
    pattern = lin.patterns[layer]  # (H, T, T)
    if key_position == "top":
        k_pos = [int(pattern[h, q_pos, : q_pos + 1].argmax()) for h in heads]
    else:
        k_pos = [int(key_position) + T if int(key_position) < 0 else int(key_position)] * len(heads)

    dirs, consts, positions = _readers(ctx, layer, heads, q_pos, k_pos)
    # queries and keys read the residual stream before the layer
    edges = ctx.attribute_directions(ResidualLocation.resid_pre(layer), positions, dirs, consts.tolist())

    scores = model_attention_scores(a, lin.tokens, layer)
    attn = _attention_module(a, layer)
    scale = float(attn.attn_scale)
    cap = f.attn_scores_soft_cap
    dh = f.d_head
    bos_nodes = bool(ctx.options.bos_nodes)
    out = []
    tgt, w = edges.reader, edges.weight.astype(np.float64)
    for j, (h, kp) in enumerate(zip(heads, k_pos, strict=False)):
        sides = []
        for side in range(2):
            lo = (2 * j + side) * dh
            mask = (tgt >= lo) & (tgt < lo + dh)
            rows, inv = np.unique(edges.writer[mask], return_inverse=True)
            uniq: dict[NodeId, int] = {}  # graph ids (several writers may share a remainder)
            to_uniq = np.array([uniq.setdefault(_graph_id(graph, edges.writer_ids[r]), len(uniq))
                                for r in rows.tolist()], dtype=np.int64)
            vecs = np.zeros((len(uniq), dh))
            np.add.at(vecs, (to_uniq[inv.reshape(-1)], tgt[mask] - lo), w[mask])
            named: dict[str, np.ndarray] = {}
            for d in range(dh):
                for loc, value in edges.constants[lo + d].items():
                    name = _constant_name(loc, "query" if side == 0 else "key", bos_nodes)
                    named.setdefault(name, np.zeros(dh))[d] += value
            sides.append((tuple(uniq), vecs, {k: v for k, v in named.items() if np.any(v != 0.0)}))
        (qn, qv, qc), (kn, kv, kc) = sides
        q_model = scores["q"][q_pos, h].double().cpu().numpy()
        k_model = scores["k"][kp, h].double().cpu().numpy()
        out.append(QKDecomposition(
            layer=layer, head=int(h), query_position=q_pos, key_position=int(kp),
            query_nodes=qn, query_vectors=qv, key_nodes=kn, key_vectors=kv,
            query_constant_parts=qc, key_constant_parts=kc, scale=scale, soft_cap=cap,
            score=float(q_model @ k_model / scale), score_capped=float(scores["scores"][h, q_pos, kp]),
            probability=float(pattern[h, q_pos, kp]), model_query=q_model, model_key=k_model,
        ))
    return out


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest ``|values|``, largest first (ties by index)."""
    if values.size <= k:
        return np.lexsort((np.arange(values.size), -np.abs(values)))
    part = np.argpartition(-np.abs(values), k - 1)[:k]
    return part[np.lexsort((part, -np.abs(values[part])))]


def _top_pairs(d: QKDecomposition, k: int, chunk: int = 4096) -> list[QKPair]:
    """The ``k`` largest pairs by magnitude, computed in row chunks (never all at once)."""
    best: list[tuple[float, int, int]] = []
    for start in range(0, len(d.query_nodes), chunk):
        block = d.query_vectors[start:start + chunk] @ d.key_vectors.T / d.scale
        flat = block.ravel()
        for i in _top(flat, k).tolist():
            best.append((float(flat[i]), start + i // block.shape[1], i % block.shape[1]))
        best.sort(key=lambda x: (-abs(x[0]), x[1], x[2]))
        del best[k:]
    return [QKPair(d.query_nodes[a], d.key_nodes[b], v) for v, a, b in best]


def summarise(d: QKDecomposition, top_k: int, *, keep: bool = True,
              graph: AttributionGraph | None = None) -> QKHead:
    """The :class:`QKHead` of a decomposition: top ``top_k`` pairs and marginals, and the sums."""
    qm, km = d.query_marginals(), d.key_marginals()
    c = d.constants()
    pairs_sum = float(d.query_vectors.sum(0) @ d.key_vectors.sum(0) / d.scale)
    pairs = tuple(_top_pairs(d, top_k))
    q_top = tuple(QKMarginal(d.query_nodes[i], float(qm[i])) for i in _top(qm, top_k))
    k_top = tuple(QKMarginal(d.key_nodes[i], float(km[i])) for i in _top(km, top_k))
    labels: dict[NodeId, str] = {}
    if graph is not None:
        shown = [p.query_node for p in pairs] + [p.key_node for p in pairs] + [m.node for m in q_top + k_top]
        for node in shown:
            if node.kind == "embedding" and node in graph:
                labels[node] = str(graph.node(node).attrs.get("token_str") or graph.node(node).label or "")
    return QKHead(
        layer=d.layer, head=d.head, query_position=d.query_position, key_position=d.key_position,
        score=d.score, score_capped=d.score_capped, probability=d.probability, soft_cap=d.soft_cap,
        scale=d.scale, magnitude=d.magnitude,
        pairs=pairs, query_marginals=q_top, key_marginals=k_top,
        constants=c,
        pairs_sum_plus_constant=pairs_sum + c["pairs_constant"],
        query_marginals_sum_plus_constant=float(qm.sum()) + c["query_constant"],
        key_marginals_sum_plus_constant=float(km.sum()) + c["key_constant"],
        n_query_nodes=len(d.query_nodes), n_key_nodes=len(d.key_nodes),
        decomposition=d if keep else None, labels=labels,
    )


def qk(
    graph: AttributionGraph,
    layer: int,
    head: int | Sequence[int],
    query_position: int = -1,
    key_position: int | str = "top",
    top_k: int = 10,
) -> QKResult:
    """Why head ``head`` of ``layer`` attends from ``query_position`` to ``key_position``: its
    pre-softmax score split exactly over (query-side node, key-side node) pairs of ``graph``.

    Positions may be negative (from the end); ``key_position="top"`` is the key the head
    attends to most; ``head`` may be a list.  Each head's entry holds the top ``top_k`` pairs
    and marginals, the constant terms by name, and the three sums over all nodes, each equal
    to ``score`` (the model's pre-cap score) up to float rounding.

    Example::

        >>> from circuitgraph.synthetic import tiny_model
        >>> from circuitgraph.adapters import ModelAdapter
        >>> from circuitgraph.attribution import attribute
        >>> g = attribute(ModelAdapter(tiny_model()), [1, 5, 7, 2])
        >>> h = qk(g, layer=1, head=0, query_position=-1, key_position="top").heads[0]
        >>> abs(h.pairs_sum_plus_constant - h.score) < 1e-4 * max(1.0, h.magnitude)
        True
    """
    top_k = check_k(top_k, "top_k")
    decs = qk_decomposition(graph, layer, head, query_position, key_position)
    heads = tuple(summarise(d, top_k, graph=graph) for d in decs)
    return QKResult(layer=int(layer), query_position=decs[0].query_position, key_position=key_position,
                    top_k=top_k, heads=heads)
