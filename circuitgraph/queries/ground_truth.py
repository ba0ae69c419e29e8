"""Scoring a graph against a known circuit (a tracr-compiled model's ``circuit.json``).

The ground truth names components, position-free: ``embedding`` and ``positional`` (layer -1,
index -1), ``attention_head`` (layer, head), ``mlp`` (layer, index 0) and ``target`` (the
output readout), with true edges ``source -> target`` along a ``direct`` (value/output) or a
``qk`` (query/key) path (:mod:`circuitgraph.testing.tracr`).

The graph's nodes are mapped to those components (any token's embedding is the embedding; a
head at any position is the head; an MLP vector, its neurons, features and error nodes are the
MLP; every logit or target node is the target) and its edges aggregated by component, summing
``|weight|`` over positions (and tokens, neurons, features):

* into the target: the graph's own edges into its target nodes;
* into a head or a whole MLP, when the graph has component inputs (``graph.component_inputs``):
  the graph's own edges into those nodes (each a writer's share of the component's total effect
  through its value / MLP input, exactly path patching of the frozen model), ``|weight|`` summed
  over positions; the query/key paths (``qk``): the graph's own linearised query and key edges
  when it has them (``graph.head_inputs: [value, query, key]``), else as below;
* into a head or a whole MLP of a graph without component inputs (vector nodes, not readers): the same exact sweep of
  the frozen model with the component's input directions as readers
  (:meth:`AttributionContext.attribute_directions`), at every position: a head's value path
  reads ``W_V`` (through ln1's frozen norm) and its contribution at source ``s`` counts with the
  attention paid to ``s`` (``sum_t A[t, s]``: what reaches the head's output); its query and
  key paths (``qk``) read ``W_Q`` and ``W_K`` at every position (the query and key dimensions QK
  attribution reads, before any rotary map: a magnitude, summed over dimensions); a whole
  MLP reads ``W_in`` through ln2: every neuron's pre-activation, active or not (what the MLP
  reads is its input; which neurons pass it on is the MLP's own computation).

Every (writer component, reader component) pair whose writer comes before the reader is a
candidate edge, labelled true or false by the ground truth; the scores:

* ``edge_auc``: ROC AUC of the direct edges' aggregated ``|weight|`` (the Mann-Whitney statistic:
  the probability that a true edge outweighs a false one, ties counting one half);
  ``qk_edge_auc`` the same for the query/key edges;
* ``node_auc``: ROC AUC of each component's influence on the target (the power series of the
  row-normalised component graph) for "is the component on a true edge";
* ``precision`` / ``recall`` of the pruned circuit: per reader component, the fewest incoming
  edges carrying ``edge_threshold`` of its |weight| (exact zeros never kept);
* ``disagreements``: each true edge that some false edge outweighs, with the strongest such
  false edge and the weights of both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from circuitgraph._io import read_json_file
from circuitgraph.attribution.context import ResidualLocation
from circuitgraph.errors import LoadError, QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries._base import QueryResult, fmt, format_table, require_context
from circuitgraph.queries.qk import _attention_module
from circuitgraph.spec.kinds import OUTPUT_KINDS

__all__ = ["GroundTruthResult", "ground_truth", "roc_auc", "component_of", "component_edges", "load_circuit"]

Component = tuple[str, int, int]  # (kind, layer, index)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic: ``P(score of a positive > score of a negative)``
    with ties counting 1/2 (average ranks).  NaN when one class is empty."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # average rank (1-based) of each run of equal scores
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    for a, b in zip(starts, ends, strict=False):
        ranks[order[a:b]] = (a + b + 1) / 2.0
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def load_circuit(circuit: str | Path | dict) -> dict[str, Any]:
    """The ground truth from a ``circuit.json`` path or its parsed dict, checked."""
    if not isinstance(circuit, dict):
        path = Path(circuit)
        if not path.is_file():
            raise QueryError(f"ground_truth: circuit file {path} does not exist; give the circuit.json "
                             "that compile_program wrote")
        try:
            circuit = read_json_file(path, "circuit file")
        except LoadError as exc:
            raise QueryError(f"ground_truth: {path} is not JSON ({exc})") from None
    if not isinstance(circuit, dict) or not isinstance(circuit.get("edges"), list):
        raise QueryError("ground_truth: a circuit is {\"nodes\": [...], \"edges\": [{source, target, path}]}; "
                         "got no edges list")
    for i, e in enumerate(circuit["edges"]):
        if not (isinstance(e, dict) and {"source", "target", "path"} <= set(e) and e["path"] in ("direct", "qk")):
            raise QueryError(f"ground_truth: edges[{i}] must have source, target and path 'direct' or 'qk'; got {e}")
    return circuit


def _key(node: dict) -> Component:
    return (str(node["kind"]), int(node["layer"]), int(node["index"]))


def component_of(node: NodeId, n_layers: int, targets: set[NodeId]) -> Component | None:
    """The position-free component a graph node belongs to (None: a bias, a remainder, ...)."""
    if node in targets or node.kind in OUTPUT_KINDS:
        return ("target", n_layers, -1)
    if node.kind == "embedding":
        return ("embedding", -1, -1)
    if node.kind == "positional":
        return ("positional", -1, -1)
    if node.kind == "attention_head":
        return ("attention_head", node.layer, node.index)
    if node.kind in ("mlp", "neuron", "feature", "error"):
        return ("mlp", node.layer, 0)
    return None


def _order(c: Component) -> tuple[int, int]:
    """(residual location written, residual location read) of a component."""
    kind, layer, _ = c
    if kind in ("embedding", "positional"):
        return 0, -1
    if kind in ("attention_head", "mlp"):
        return int(ResidualLocation.written_by(kind, layer)), int(ResidualLocation.read_by(kind, layer))
    return 10**9, 10**9 - 1


@dataclass(frozen=True)
class ComponentEdges:
    """Aggregated ``|weight|`` per ``(source, target, path)`` and the components seen."""

    weights: dict[tuple[Component, Component, str], float]
    components: list[Component]


@torch.no_grad()
def component_edges(graph: AttributionGraph) -> ComponentEdges:
    """The graph's edges aggregated by component (module docstring), direct and qk."""
    ctx = require_context(graph, "ground_truth")
    L = ctx.n_layers
    opts = ctx.options
    frozen_layers = [l for l in range(L) if opts.attention[l] != "heads"]
    if frozen_layers:
        raise QueryError(f"ground_truth needs heads as nodes; layers {frozen_layers} pass attention through "
                         "(set graph: {attention: heads})")
    targets = {t for t, _ in graph.targets}
    comp = {n.id: component_of(n.id, L, targets) for n in graph.nodes}
    weights: dict[tuple[Component, Component, str], float] = {}

    def add(src: Component | None, dst: Component, path: str, w: float) -> None:
        if src is None or src == dst:
            return
        key = (src, dst, path)
        weights[key] = weights.get(key, 0.0) + w

    # into the target (and, with component inputs, into heads and MLPs): the graph's own edges
    own_inputs = bool(getattr(opts, "component_inputs", False))
    t_rows = {graph.index_of(t) for t in targets}
    component_rows = {i for i, n in enumerate(graph.nodes) if n.kind in ("attention_head", "mlp")} if own_inputs else set()
    for s, d, x in zip(graph.edge_source.tolist(), graph.edge_target.tolist(), np.abs(graph.edge_weight).tolist(), strict=False):
        if d in t_rows:
            add(comp[graph.nodes[s].id], ("target", L, -1), "direct", x)
        elif d in component_rows:
            dst = comp[graph.nodes[d].id]
            if dst is not None:
                add(comp[graph.nodes[s].id], dst, "direct", x)
    # into heads through their query and key, when the graph has them (graph.head_inputs): its own
    # linearised edges, |weight| summed by component
    le = graph.linearised_edges
    own_qk = own_inputs and le is not None and set(le.kinds) == {"query", "key"}
    if own_qk:
        assert le is not None
        for s, d, x in zip(le.source.tolist(), le.target.tolist(), np.abs(le.weight).tolist(), strict=True):
            dst = comp[graph.nodes[d].id]
            if dst is not None:
                add(comp[graph.nodes[s].id], dst, "qk", x)
    # into heads and MLPs: their input directions as extra readers of the same sweep
    a, lin, fm = ctx.adapter, ctx.linearisation, ctx.frozen_model
    T = lin.n_pos
    dtype, device = fm.dtype, fm.device
    for layer in range(L):
        ln1 = fm.ln1[layer]
        full = _attention_module(a, layer)
        qkv = {"value": a.attn_weights(layer)["W_V"], "query": full.W_Q.detach(), "key": full.W_K.detach()}
        if qkv["key"].shape[0] != qkv["query"].shape[0]:  # grouped-query: one key per group
            qkv["key"] = qkv["key"].repeat_interleave(qkv["query"].shape[0] // qkv["key"].shape[0], dim=0)
        A = fm.pattern(layer).to(torch.float64)  # (H, T, T)
        attended = A.sum(1)  # (H, s): attention paid to each source position
        for side, W in qkv.items():
            if (own_inputs and side == "value") or (own_qk and side != "value"):  # the graph's own edges (above)
                continue
            H, D, dh = W.shape
            cols = W.to(device=device, dtype=dtype).permute(0, 2, 1).reshape(H * dh, D)
            g = ln1.reader_direction(cols)  # (H dh, D), before 1/sigma
            dirs = (g[None] / ln1.sigma[:T, None, None]).reshape(T * H * dh, D)
            positions = np.repeat(np.arange(T), H * dh)
            edges = ctx.attribute_directions(int(ResidualLocation.resid_pre(layer)), positions.tolist(), dirs,
                                             [0.0] * len(positions))
            head = (edges.reader % (H * dh)) // dh
            pos = edges.reader // (H * dh)
            mags = np.abs(edges.weight.astype(np.float64))
            if side == "value":
                mags = mags * attended.cpu().numpy()[head, pos]
            path = "direct" if side == "value" else "qk"
            for wr, h, m in zip(edges.writer.tolist(), head.tolist(), mags.tolist(), strict=False):
                add(comp.get(edges.writer_ids[wr]), ("attention_head", layer, int(h)), path, m)
        if a.facts.attn_only or own_inputs:
            continue
        W_in = a.mlp_weights(layer)["W_in"].to(device=device, dtype=dtype)  # (D, d_mlp)
        ln2 = fm.ln2[layer]
        g = ln2.reader_direction(W_in.T)  # (d_mlp, D): every neuron's pre-activation, active or not
        d_mlp = g.shape[0]
        dirs = (g[None] / ln2.sigma[:T, None, None]).reshape(T * d_mlp, D)
        positions = np.repeat(np.arange(T), d_mlp)
        edges = ctx.attribute_directions(int(ResidualLocation.resid_mid(layer)), positions.tolist(), dirs,
                                         [0.0] * len(positions))
        for wr, m in zip(edges.writer.tolist(), np.abs(edges.weight.astype(np.float64)).tolist(), strict=False):
            add(comp.get(edges.writer_ids[wr]), ("mlp", layer, 0), "direct", m)
    components = sorted({c for c in comp.values() if c is not None})
    return ComponentEdges(weights, components)


def _influence(weights: dict, components: list[Component], target: Component) -> dict[Component, float]:
    """Each component's influence on ``target``: the power series of the row-normalised component
    graph (rows = readers; a head's value and query/key inputs together), as circuit-tracer's node
    influence."""
    index = {c: i for i, c in enumerate(components)}
    n = len(components)
    M = np.zeros((n, n))
    for (s, d, _path), w in weights.items():  # a head's value and query/key inputs alike
        if s in index and d in index:
            M[index[d], index[s]] += w
    rows = M.sum(1, keepdims=True)
    M = np.divide(M, rows, out=np.zeros_like(M), where=rows > 0)
    e = np.zeros(n)
    e[index[target]] = 1.0
    infl = e @ np.linalg.pinv(np.eye(n) - M) - e  # sum_k e M^k, k >= 1 (M is nilpotent: a DAG)
    return {c: float(infl[index[c]]) for c in components}


def _pruned(weights: dict, threshold: float) -> set:
    """Per reader component (and path): the fewest incoming edges carrying ``threshold`` of its |weight|."""
    by_reader: dict = {}
    for (s, d, path), w in weights.items():
        by_reader.setdefault((d, path), []).append(((s, d, path), w))
    kept = set()
    for items in by_reader.values():
        items.sort(key=lambda x: -x[1])
        total = sum(w for _, w in items)
        acc = 0.0
        for key, w in items:
            if w <= 0 or (total > 0 and acc >= threshold * total):
                break
            kept.add(key)
            acc += w
    return kept


@dataclass(frozen=True)
class GroundTruthResult(QueryResult):
    kind: ClassVar[str] = "ground_truth"

    edge_auc: float
    qk_edge_auc: float
    node_auc: float
    precision: float
    recall: float
    n_true_edges: int
    n_candidate_edges: int
    edges: list[dict[str, Any]] = field(default_factory=list)
    disagreements: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"edge_auc": self.edge_auc, "qk_edge_auc": self.qk_edge_auc, "node_auc": self.node_auc,
                "precision": self.precision, "recall": self.recall, "n_true_edges": self.n_true_edges,
                "n_candidate_edges": self.n_candidate_edges, "edges": self.edges,
                "disagreements": self.disagreements, "nodes": self.nodes}

    def table(self, max_rows: int = 10) -> str:
        head = (f"edge ROC AUC {fmt(self.edge_auc)}, QK edge AUC {fmt(self.qk_edge_auc)}, node AUC "
                f"{fmt(self.node_auc)}, precision {fmt(self.precision)}, recall {fmt(self.recall)} "
                f"({self.n_true_edges} true of {self.n_candidate_edges} candidate edges)")
        rows = [[e["source"], e["target"], e["path"], "yes" if e["true"] else "no", fmt(e["weight"])]
                for e in self.edges[:max_rows]]
        return head + "\n" + format_table(["source", "target", "path", "true", "|weight|"], rows)


def _name(c: Component) -> str:
    kind, layer, index = c
    return {"embedding": "embedding", "positional": "positional", "target": "target"}.get(
        kind, f"L{layer}H{index}" if kind == "attention_head" else f"MLP L{layer}")


def ground_truth(graph: AttributionGraph, circuit: str | Path | dict, *, edge_threshold: float = 0.98,
                 max_disagreements: int = 20) -> GroundTruthResult:
    """Score ``graph`` against the ground-truth ``circuit`` (module docstring)."""
    truth = load_circuit(circuit)
    agg = component_edges(graph)
    L = require_context(graph, "ground_truth").n_layers
    target = ("target", L, -1)
    true_edges = {(_key(e["source"]), _key(e["target"]), e["path"]) for e in truth["edges"]}
    # the circuit's nodes: those on a true edge (a node of the file that nothing reads is not)
    truth_nodes = {s for s, _, _ in true_edges} | {d for _, d, _ in true_edges}
    components = sorted(set(agg.components) | truth_nodes | {_key(n) for n in truth.get("nodes", [])})
    readers = [c for c in components if c[0] in ("attention_head", "mlp", "target")]
    candidates = []
    for d in readers:
        for s in components:
            if s == d or s[0] == "target" or _order(s)[0] > _order(d)[1]:
                continue
            candidates.append((s, d, "direct"))
            if d[0] == "attention_head":
                candidates.append((s, d, "qk"))
    rows = [{"source": _name(s), "target": _name(d), "path": p, "true": (s, d, p) in true_edges,
             "weight": agg.weights.get((s, d, p), 0.0), "_key": (s, d, p)} for s, d, p in candidates]
    missing = true_edges - {r["_key"] for r in rows}
    if missing:
        raise QueryError(f"ground_truth: {len(missing)} true edges are not edges this graph can have, e.g. "
                         f"{sorted(missing)[0]}; is the circuit for this model?")
    rows.sort(key=lambda r: (-r["weight"], r["source"], r["target"]))

    def auc(path: str) -> float:
        sel = [r for r in rows if r["path"] == path]
        return roc_auc(np.array([r["weight"] for r in sel]), np.array([r["true"] for r in sel]))

    all_weights = {r["_key"]: r["weight"] for r in rows}
    kept = _pruned({k: w for k, w in agg.weights.items() if k[2] == "direct"}, edge_threshold)
    true_direct = {k for k in true_edges if k[2] == "direct"}
    tp = len(kept & true_direct)
    precision = tp / len(kept) if kept else float("nan")
    recall = tp / len(true_direct) if true_direct else float("nan")
    infl = _influence(all_weights, components, target)
    node_rows = [{"node": _name(c), "kind": c[0], "layer": c[1], "index": c[2], "influence": infl.get(c, 0.0),
                  "true": c in truth_nodes} for c in components if c != target]
    node_auc = roc_auc(np.array([r["influence"] for r in node_rows]), np.array([r["true"] for r in node_rows]))
    node_rows.sort(key=lambda r: -r["influence"])
    disagreements = []
    for path in ("direct", "qk"):
        sel = [r for r in rows if r["path"] == path]
        false = [r for r in sel if not r["true"]]
        for r in sel:
            if not r["true"]:
                continue
            above = [f for f in false if f["weight"] >= r["weight"]]
            if above:
                top = max(above, key=lambda f: f["weight"])
                disagreements.append({"true_edge": f"{r['source']} -> {r['target']}", "path": path,
                                      "weight": r["weight"], "n_false_above": len(above),
                                      "strongest_false_edge": f"{top['source']} -> {top['target']}",
                                      "false_weight": top["weight"]})
    disagreements.sort(key=lambda d: (-d["n_false_above"], d["weight"]))
    for r in rows:
        del r["_key"]
    return GroundTruthResult(
        edge_auc=auc("direct"), qk_edge_auc=auc("qk"), node_auc=node_auc, precision=precision, recall=recall,
        n_true_edges=len(true_direct), n_candidate_edges=sum(1 for r in rows if r["path"] == "direct"),
        edges=rows, disagreements=disagreements[:max_disagreements], nodes=node_rows)
