"""Weight-only (prompt-independent) connections: virtual weights and de-embeddings.

A reader reads the residual through a norm: ``pre = w . N(x) + b``; without the prompt's
``1/sigma`` its weight-only direction is ``g = P(gamma * w)`` (``P`` the mean removal of
LayerNorm, identity for RMSNorm; transcoders that read ``ln2.hook_normalized`` see no
``gamma``: ``g = P(W_enc[:, j])``; transcoders reading the raw residual: ``g = W_enc[:, j]``).
A writer's direction is its output vector per unit activation: ``W_dec[j]`` for a feature,
``W_out[i]`` for a neuron (through the post-norm's ``gamma * P(.)`` where the block has one),
``W_E[v]`` for a token embedding.

* **Virtual weight** from a writer unit to a reader unit = writer direction . ``g`` (the
  residual-direct path; paths through attention depend on the prompt's patterns).  Only
  pairs where the writer writes before the reader reads are reported.
* **De-embedding** of a reader: ``W_E g`` over the vocabulary (which tokens drive it
  directly), or through one head's OV circuit ``W_E P(gamma1 * W_V^h W_O^h g)``.

These need the model weights, so the graph's live context: a graph loaded from JSON has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitgraph.adapters.architecture import NormWeights
from circuitgraph.attribution.context import ResidualLocation
from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries._base import QueryResult, check_k, format_table, require_context
from circuitgraph.queries.filters import match_nodes

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.attribution.context import AttributionContext
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["Unit", "VirtualWeightsResult", "DeEmbeddingResult", "virtual_weights", "de_embedding",
           "feature_reader_directions", "feature_writer_directions", "neuron_reader_directions",
           "neuron_writer_directions"]

_NEEDS = "needs the live model: run the spec, not a loaded JSON"

READER_UNITS = ("feature", "neuron", "logit")
WRITER_UNITS = ("feature", "neuron", "embedding")


@dataclass(frozen=True, order=True)
class Unit:
    """A position-free unit: ``kind`` (feature, neuron, logit, embedding), ``layer``, ``index``."""

    kind: str
    layer: int
    index: int

    def __str__(self) -> str:
        return f"{self.kind}/{self.layer}/{self.index}"


def _parses(text: str) -> bool:
    try:
        NodeId.parse(text)
    except ValueError:
        return False
    return True


def _as_unit(node: Any) -> Unit:
    if isinstance(node, Unit):
        return node
    if isinstance(node, str):
        try:
            node = NodeId.parse(node)
        except ValueError as exc:
            raise QueryError(f"{exc} (e.g. 'feature/1/4/17')") from None
    if isinstance(node, NodeId):
        return Unit(node.kind, node.layer, node.index)
    if isinstance(node, Mapping):
        try:
            return Unit(str(node.get("kind", "feature")), int(node["layer"]), int(node["index"]))
        except KeyError as exc:
            raise QueryError(f"a unit needs kind, layer and index; missing {exc} in {dict(node)!r}") from None
    if all(hasattr(node, a) for a in ("kind", "layer", "index")):
        return Unit(str(node.kind), int(node.layer), int(node.index))
    if isinstance(node, tuple) and len(node) == 3:
        return Unit(str(node[0]), int(node[1]), int(node[2]))
    raise QueryError(f"expected a node id 'kind/layer/position/index' or {{kind, layer, index}}, got {node!r}")


class _Weights:
    """Weight-only reader and writer directions of one model (float64)."""

    def __init__(self, ctx: AttributionContext):
        self.ctx = ctx
        self.a = ctx.adapter
        self.f = self.a.facts

    def _check_layer(self, unit: Unit) -> None:
        L = self.f.n_layers
        if not (0 <= unit.layer < L):
            raise QueryError(f"{unit}: layer {unit.layer} requested, the model has {L} layers (0-{L - 1})")

    def _check_index(self, unit: Unit, size: int, what: str) -> None:
        if not (0 <= unit.index < size):
            raise QueryError(f"{unit}: index {unit.index} is out of range ({what} has {size}: 0-{size - 1})")

    def _dictionaries(self, unit: Unit) -> Dictionary:
        """The dictionaries, once ``unit`` (a feature) is checked against them."""
        self._check_layer(unit)
        tcs = self.ctx.transcoders
        if tcs is None or unit.layer not in tcs:
            raise QueryError(f"{unit}: no transcoder is loaded for layer {unit.layer}")
        tc = tcs[unit.layer]
        self._check_index(unit, tc.d_sae, f"the layer-{unit.layer} transcoder")
        return tcs

    def reader(self, unit: Unit) -> tuple[Any, ResidualLocation]:
        """``(g (d_model,), residual location read)``."""
        a, f = self.a, self.f
        if unit.kind == "feature":
            tcs = self._dictionaries(unit)
            w = feature_reader_directions(a, tcs, unit.layer, torch.tensor([unit.index]))[0]
            return w, ResidualLocation.resid_mid(unit.layer)
        if unit.kind == "neuron":
            self._check_layer(unit)
            self._check_index(unit, f.d_mlp, "the MLP")
            g = neuron_reader_directions(a, unit.layer, torch.tensor([unit.index]))[0]
            return g, ResidualLocation.resid_mid(unit.layer)
        if unit.kind == "logit":
            self._check_index(unit, f.d_vocab, "the vocabulary")
            return a.norm("ln_final").reader_direction(a.W_U[:, unit.index].double()), \
                ResidualLocation.resid_post(f.n_layers - 1)
        raise QueryError(f"{unit}: kind {unit.kind!r} is not a reader unit; expected one of {', '.join(READER_UNITS)}")

    def writer(self, unit: Unit) -> list[tuple[Any, ResidualLocation]]:
        """``[(direction (d_model,), residual location written)]``: one write for most units, one
        per downstream MLP output for a cross-layer transcoder feature."""
        return self._writer(unit) if unit.kind == "feature" else [self._writer(unit)]

    def _writer(self, unit: Unit) -> Any:
        a, f = self.a, self.f
        if unit.kind == "feature":
            tcs = self._dictionaries(unit)
            writes = feature_writer_directions(a, tcs, unit.layer, torch.tensor([unit.index]))
            return [(v[0], location) for v, location in writes]
        if unit.kind == "neuron":
            self._check_layer(unit)
            self._check_index(unit, f.d_mlp, "the MLP")
            return neuron_writer_directions(a, unit.layer, torch.tensor([unit.index]))[0], \
                ResidualLocation.resid_post(unit.layer)
        if unit.kind == "embedding":
            self._check_index(unit, f.d_vocab, "the vocabulary")
            return a.W_E[unit.index].double(), ResidualLocation.resid_pre(0)
        raise QueryError(f"{unit}: kind {unit.kind!r} is not a writer unit; expected one of {', '.join(WRITER_UNITS)}")


def feature_reader_directions(adapter: ModelAdapter, dictionaries: Dictionary, layer: int,
                              idx: torch.Tensor) -> torch.Tensor:
    """Weight-only reader directions ``g`` ``(n, d_model)`` (float64) of features ``idx`` of
    ``layer``: the encoder rows through the norm their input hook implies (see the module
    docstring).  The one implementation: :class:`_Weights` and the feature dashboards'
    de-embeddings (:mod:`circuitgraph.features`) call it."""
    tc = dictionaries[layer]
    w = tc.encoder_rows(idx).double()
    ln2 = adapter.norm("ln2", layer)
    if tc.input_site == "normalized":  # ln2's output before gamma: centred only
        w = NormWeights(None, None, ln2.center).reader_direction(w)
    elif tc.input_site == "mlp_input":  # the MLP's input, gamma2 * P(x) / sigma2 + beta2
        w = ln2.reader_direction(w)
    return w


def neuron_reader_directions(adapter: ModelAdapter, layer: int, idx: torch.Tensor,
                             weight: str = "W_in") -> torch.Tensor:
    """Weight-only reader directions ``g = P(gamma2 * w)`` ``(n, d_model)`` (float64) of neurons
    ``idx`` of ``layer``: ``w`` the column of ``W_in`` (the neuron's pre-activation; a gated
    MLP's value) or, with ``weight="W_gate"``, of a gated MLP's gate.  The one implementation:
    :class:`_Weights` and the neuron dashboards' input tokens call it."""
    w = adapter.mlp_weights(layer)[weight][:, idx].T.double()
    return adapter.norm("ln2", layer).reader_direction(w)


def neuron_writer_directions(adapter: ModelAdapter, layer: int, idx: torch.Tensor) -> torch.Tensor:
    """Weight-only writer directions ``(n, d_model)`` (float64) of neurons ``idx`` of ``layer``:
    rows of ``W_out``, through the post-MLP norm's ``gamma * P(v)`` where the block has one."""
    v = adapter.mlp_weights(layer)["W_out"][idx].double()
    if adapter.facts.post_norms:
        n = adapter.norm("ln2_post", layer)  # the writer through the post-norm: gamma * P(v)
        v = v - v.mean(-1, keepdim=True) if n.center else v
        v = v * n.gamma.double() if n.gamma is not None else v
    return v


def feature_writer_directions(adapter: ModelAdapter, dictionaries: Dictionary, layer: int,
                              idx: torch.Tensor) -> list[tuple[torch.Tensor, ResidualLocation]]:
    """``[(directions (n, d_model) float64, residual location written)]`` of features ``idx`` of
    ``layer``: one write per output layer (several for a cross-layer transcoder), through the
    post-MLP norm's ``gamma * P(v)`` where the dictionary writes before it."""
    rows = dictionaries.decoder_rows(layer, idx).double()  # (n, n_out, d_model)
    out = []
    for j, k in enumerate(dictionaries.output_layers(layer)):
        v = rows[:, j]
        if dictionaries.output_site(k) == "before_post_norm":  # written before ln2_post: gamma * P(v), as neurons
            n = adapter.norm("ln2_post", k)
            v = v - v.mean(-1, keepdim=True) if n.center else v
            v = v * n.gamma.double() if n.gamma is not None else v
        out.append((v, ResidualLocation.resid_post(k)))
    return out


def _units(graph: AttributionGraph, filt: Any, allowed: tuple[str, ...], what: str) -> tuple[list[Unit], int]:
    ids = match_nodes(graph, filt, what=what)
    units = sorted({Unit(i.kind, i.layer, i.index) for i in ids if i.kind in allowed})
    skipped = sum(1 for i in ids if i.kind not in allowed)
    if not units:
        kinds = sorted({i.kind for i in ids})
        raise QueryError(f"{what} matches only nodes of kind {', '.join(kinds)}; virtual weights need "
                         f"{', '.join(allowed)} nodes")
    return units, skipped


@dataclass(frozen=True, repr=False)
class VirtualWeightsResult(QueryResult):
    """The strongest weight-only connections ``(source unit, target unit, weight)``."""

    kind = "virtual_weights"
    rows: tuple[tuple[Unit, Unit, float], ...]
    n_pairs: int
    n_skipped_nodes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_pairs": self.n_pairs,
            "n_skipped_nodes": self.n_skipped_nodes,
            "top": [{"source": str(s), "target": str(t), "weight": w} for s, t, w in self.rows],
        }

    def table(self, max_rows: int = 10) -> str:
        rows = [(str(s), str(t), w) for s, t, w in self.rows]
        return format_table(["source", "target", "virtual weight"], rows, max_rows=max_rows,
                            title=f"virtual weights ({self.n_pairs} pairs)")


def virtual_weights(graph: AttributionGraph, source: Any, target: Any, top_k: int = 20) -> VirtualWeightsResult:
    """Weight-only virtual weights from the units of the ``source`` nodes to those of the
    ``target`` nodes (positions ignored), strongest ``top_k`` by ``|weight|``.

    Example::

        virtual_weights(graph, {"kind": "feature", "layer": 0}, {"kind": "logit"}, top_k=5).rows
    """
    ctx = require_context(graph, "virtual_weights")
    top_k = check_k(top_k, "top_k")
    W = _Weights(ctx)
    srcs, skip_s = _units(graph, source, WRITER_UNITS, "virtual_weights source")
    tgts, skip_t = _units(graph, target, READER_UNITS, "virtual_weights target")
    writes = [(i, v, lw) for i, u in enumerate(srcs) for v, lw in W.writer(u)]
    rs = [W.reader(u) for u in tgts]
    D = torch.stack([v for _, v, _ in writes])  # (n_writes, d_model)
    G = torch.stack([g for g, _ in rs])  # (n_tgt, d_model)
    ok = np.array([lw for _, _, lw in writes])[:, None] <= np.array([lr for _, lr in rs])[None, :]
    owner = np.array([i for i, _, _ in writes])
    # a unit that writes at several locations (a CLT feature) sums the writes below the reader
    M = np.zeros((len(srcs), len(tgts)))
    np.add.at(M, owner, np.where(ok, (D @ G.T).numpy(), 0.0))
    valid = np.zeros((len(srcs), len(tgts)), dtype=bool)
    np.logical_or.at(valid, owner, ok)
    n_pairs = int(valid.sum())
    flat = np.abs(M).ravel()
    k = min(top_k, n_pairs)
    cand = np.argpartition(-flat, k - 1)[:k] if k < flat.size else np.arange(flat.size)
    cand = cand[np.argsort(-flat[cand], kind="stable")]
    rows = tuple((srcs[i // len(tgts)], tgts[i % len(tgts)], float(M.ravel()[i]))
                 for i in cand if valid.ravel()[i])[:k]
    return VirtualWeightsResult(rows, n_pairs, skip_s + skip_t)


@dataclass(frozen=True, repr=False)
class DeEmbeddingResult(QueryResult):
    """Tokens whose embeddings drive a unit most: rows ``(token id, token string, score)``."""

    kind = "de_embedding"
    unit: Unit
    head: tuple[int, int] | None
    rows: tuple[tuple[int, str, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": str(self.unit),
            "head": None if self.head is None else {"layer": self.head[0], "head": self.head[1]},
            "top": [{"token": t, "token_str": s, "score": v} for t, s, v in self.rows],
        }

    def table(self, max_rows: int = 10) -> str:
        via = "" if self.head is None else f" through L{self.head[0]}H{self.head[1]} OV"
        return format_table(["token", "string", "score"], self.rows, max_rows=max_rows,
                            title=f"de-embedding of {self.unit}{via}")


def de_embedding(graph: AttributionGraph, node: Any, top_k: int = 10, head: Any = None) -> DeEmbeddingResult:
    """The tokens whose embedding most increases a feature, neuron or logit directly, or
    through one head's OV circuit (``head = (layer, head)`` or ``{layer, head}``).

    Example::

        de_embedding(graph, {"kind": "feature", "layer": 1, "index": 17}, top_k=5).rows
    """
    ctx = require_context(graph, "de_embedding")
    top_k = check_k(top_k, "top_k")
    if isinstance(node, (str, NodeId)):
        nid = NodeId.parse(node) if isinstance(node, str) and _parses(node) else node
        if isinstance(nid, NodeId) and nid not in graph:
            raise QueryError(
                f"de_embedding node {nid} is not in the graph ({graph.n_nodes} nodes); give a node of the graph, or "
                f"{{kind: {nid.kind}, layer: {nid.layer}, index: {nid.index}}} for the unit at any position (weights "
                "only, whether or not it is active on this prompt)")
    unit = _as_unit(node)
    W = _Weights(ctx)
    g, loc = W.reader(unit)
    a, f = W.a, W.f
    hl = None
    if head is not None:
        if isinstance(head, Mapping):
            m, h = int(head["layer"]), int(head["head"])
        elif hasattr(head, "layer") and hasattr(head, "head"):
            m, h = int(head.layer), int(head.head)
        else:
            m, h = (int(x) for x in head)
        if not (0 <= m < f.n_layers):
            raise QueryError(f"de_embedding head layer {m} requested, the model has {f.n_layers} layers "
                             f"(0-{f.n_layers - 1})")
        if not (0 <= h < f.n_heads):
            raise QueryError(f"de_embedding head {h} requested, layer {m} has {f.n_heads} heads (0-{f.n_heads - 1})")
        if ResidualLocation.resid_mid(m) > loc:
            raise QueryError(f"de_embedding: head L{m}H{h} writes after {unit} reads (layer {unit.layer}); "
                             "pick a head in an earlier layer (or the same layer for a feature/neuron)")
        if f.post_norms:
            g = a.norm("ln1_post", m).reader_direction(g)
        w = a.attn_weights(m)
        v = w["W_V"][h].double() @ (w["W_O"][h].double() @ g)
        g = a.norm("ln1", m).reader_direction(v)
        hl = (m, h)
    scores = a.W_E.double() @ g
    k = min(top_k, scores.shape[0])

    top = torch.topk(scores, k).indices.tolist()
    tk = a.tokenizer
    rows = tuple((int(t), tk.token_str(int(t)) if tk is not None else f"<{t}>", float(scores[t])) for t in top)
    return DeEmbeddingResult(unit, hl, rows)
