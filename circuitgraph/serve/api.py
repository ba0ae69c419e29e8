"""The explorer's JSON API, as plain functions of a :class:`~circuitgraph.serve.catalog.Catalog`.

The HTTP layer (:mod:`circuitgraph.serve.server`) only routes requests here; every answer is
JSON (or a file to download) computed by circuitgraph's own functions:

* the pruned graph is :func:`circuitgraph.queries.prune.prune_graph` of the loaded graph at the
  thresholds asked (the page never prunes by itself);
* groups are :func:`~circuitgraph.export.dot.merge_supernodes`, the automatic proposals
  :func:`~circuitgraph.export.dot.propose_supernodes` (as the diagrams use them);
* a graph file's steering results are its ``steering`` list as read
  (:class:`~circuitgraph.export.json_graph.GraphDocument`), and a comparison of two graphs is
  :func:`circuitgraph.queries.diff.diff_graphs`'s JSON (:meth:`~circuitgraph.queries.diff.GraphDiff.to_dict`);
* a saved subgraph is written by the exporters: :func:`~circuitgraph.export.json_graph.graph_to_json`,
  :func:`~circuitgraph.export.neuronpedia.graph_to_neuronpedia` and
  :func:`~circuitgraph.export.dot.graph_to_dot` rendered with Graphviz, one :data:`DOWNLOADS` entry
  per export kind the explorer offers (:func:`explorer_kinds`, the spec's
  :data:`~circuitgraph.spec.export.EXPORT_KINDS` with ``explorer`` set); ``GET /api/registries``
  lists them, and the page builds its "save pinned" links from that list alone.

Bad parameters raise :class:`ApiError` (status 400, one line); unknown graphs, nodes and
features status 404.  docs/explorer.md documents every endpoint.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from circuitgraph._results import stored_results
from circuitgraph.datasets.store import open_dataset
from circuitgraph.errors import CircuitGraphError
from circuitgraph.export.dot import (
    DEFAULT_MAX_NODES,
    KIND_COLORS,
    NEGATIVE_COLOR,
    POSITIVE_COLOR,
    graph_to_dot,
    is_structural_label,
    merge_supernodes,
    node_caption,
    propose_supernodes,
)
from circuitgraph.export.json_graph import graph_to_json
from circuitgraph.export.neuronpedia import graph_to_neuronpedia, n_layers_of, neuronpedia_node_id
from circuitgraph.export.render import render_dot_bytes
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NODE_KINDS, REMAINDER_INDEX, Node, NodeId
from circuitgraph.queries.diff import MATCHES, SORTS, diff_graphs
from circuitgraph.queries.prune import ALWAYS_KEPT_KINDS, PruneResult, prune_graph
from circuitgraph.serve.catalog import Catalog
from circuitgraph.serve.dashboards import UNITS_OF_NODE_KIND
from circuitgraph.spec.export import EXPORT_KINDS, ExportKind
from circuitgraph.spec.graph import PruneSpec

__all__ = ["ApiError", "Explorer", "Download", "ExplorerView", "VIEWS", "DEFAULT_NODE_THRESHOLD", "DEFAULT_EDGE_THRESHOLD",
           "DOWNLOADS", "explorer_kinds", "DEFAULT_DIFF_TOP", "DEFAULT_TOP_K_NODES"]

#: the thresholds of an unpruned graph's first view: the spec's pruning defaults
DEFAULT_NODE_THRESHOLD = PruneSpec.model_fields["node_threshold"].default
DEFAULT_EDGE_THRESHOLD = PruneSpec.model_fields["edge_threshold"].default
#: the node budget of every view unless a request says otherwise (``top_k_nodes``, prune's cap on
#: the nodes kept besides embeddings, targets and remainders): the diagrams' budget, stated once in
#: the spec (``export.max_render_nodes``), so a large graph opens at once at its most influential nodes
DEFAULT_TOP_K_NODES = DEFAULT_MAX_NODES
#: a node's inputs and outputs listed by default (the strongest)
DEFAULT_EDGE_LIMIT = 30
#: the largest pruned view the API sends to the page (a browser draws about this many SVG paths)
MAX_VIEW_EDGES = 100_000
#: the top changes a diff lists by default (``GET /api/diff``'s ``top``)
DEFAULT_DIFF_TOP = 20
#: pruned views kept per explorer (the slider asks for many)
_CACHE_SIZE = 32
_THRESHOLD_KEYS = ("node_threshold", "edge_threshold", "top_k_nodes")
#: the scores a graph's view and a dataset run's summary show (the graph's metadata, the manifest's columns)
_SCORES = ("replacement_score", "completeness_score")


class ApiError(Exception):
    """A request the API refuses: ``status`` (400 bad parameters, 404 unknown) and one line;
    ``detail``: what the answer carries besides (``error``), e.g. the thresholds a refused view was
    asked at, so the page shows what was requested."""

    def __init__(self, status: int, message: str, **detail: Any):
        super().__init__(message)
        self.status = status
        self.message = " ".join(str(message).split())
        self.detail = detail


@dataclass(frozen=True)
class Download:
    """A file the API hands out: its bytes, content type and file name."""

    data: bytes
    content_type: str
    filename: str


# --------------------------------------------------------------------------- parameters
def _params(query: Mapping[str, list[str]], allowed: tuple[str, ...]) -> dict[str, str]:
    """One value per parameter; unknown or repeated parameters are refused."""
    out = {}
    for key, values in query.items():
        if key not in allowed:
            expected = ", ".join(allowed) if allowed else "none"
            raise ApiError(400, f"unknown parameter {key!r}; expected {expected}")
        if len(values) != 1:
            raise ApiError(400, f"parameter {key!r} is given {len(values)} times; give it once")
        out[key] = values[0]
    return out


def _fraction(params: Mapping[str, str], key: str, default: float) -> float:
    text = params.get(key)
    if text is None:
        return float(default)
    try:
        value = float(text)
    except ValueError:
        raise ApiError(400, f"{key} must be a number in (0, 1], got {text[:40]!r}") from None
    if not math.isfinite(value) or not 0.0 < value <= 1.0:
        raise ApiError(400, f"{key} must be a number in (0, 1], got {text[:40]!r}")
    return value


def _int(params: Mapping[str, str], key: str, default: int, low: int = 1) -> int:
    text = params.get(key)
    if text is None:
        return default
    if not re.fullmatch(r"-?\d{1,9}", text):
        raise ApiError(400, f"{key} must be an integer, got {text[:40]!r}")
    value = int(text)
    if value < low:
        raise ApiError(400, f"{key} must be at least {low}, got {value}")
    return value


def _budget(params: Mapping[str, str]) -> int | None:
    """``top_k_nodes``: an integer of at least 1, or ``all`` (no budget); missing: the default budget."""
    if params.get("top_k_nodes", "").lower() == "all":
        return None
    return _int(params, "top_k_nodes", DEFAULT_TOP_K_NODES)


def _flag(params: Mapping[str, str], key: str) -> bool:
    text = params.get(key, "false").lower()
    if text not in ("true", "false", "1", "0"):
        raise ApiError(400, f"{key} must be true or false, got {text[:40]!r}")
    return text in ("true", "1")


def _node_id(text: str) -> NodeId:
    try:
        return NodeId.parse(text)
    except ValueError as exc:
        raise ApiError(400, f"bad node id {text[:80]!r}: {exc}") from None


def _groups(params: Mapping[str, str]) -> dict[str, list[str]]:
    """``supernodes``: a JSON object ``{name: [node id, ...]}``."""
    text = params.get("supernodes")
    if not text:
        return {}
    try:
        groups = json.loads(text)
    except ValueError:
        raise ApiError(400, "supernodes must be a JSON object {name: [node id, ...]}") from None
    if not isinstance(groups, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, list) and v and all(isinstance(x, str) for x in v)
            for k, v in groups.items()):
        raise ApiError(400, "supernodes must be a JSON object {name: [node id, ...]} with non-empty names and lists")
    for members in groups.values():
        for m in members:
            _node_id(m)
    return groups


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------- the API
class Explorer:
    """The API over one catalog (thread-safe: the server answers requests in threads)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._lock = threading.RLock()
        self._pruned: OrderedDict[tuple[str, float, float], PruneResult] = OrderedDict()
        self._labelled: dict[str, AttributionGraph] = {}
        self._feature_errors: dict[str, str] = {}

    # ------------------------------------------------------------------ helpers
    def _entry(self, name: str) -> Any:
        if name not in self.catalog.graphs:
            raise ApiError(404, f"no graph named {name[:200]!r}; GET /api/graphs lists them")
        return self.catalog.graphs[name]

    def graph(self, name: str) -> AttributionGraph:
        """The graph ``name`` as loaded, with the features folder's labels (``labels.csv``) on its
        feature nodes."""
        self._entry(name)
        with self._lock:
            if name not in self._labelled:
                try:
                    graph = self.catalog.document(name).graph
                except CircuitGraphError as exc:
                    raise ApiError(400, f"cannot read graph {name!r}: {exc}") from None
                self._labelled[name] = self._with_labels(graph)
            return self._labelled[name]

    def document(self, name: str) -> Any:
        """The graph file ``name`` as read (:class:`~circuitgraph.export.json_graph.GraphDocument`)."""
        self._entry(name)
        try:
            return self.catalog.document(name)
        except CircuitGraphError as exc:
            raise ApiError(400, f"cannot read graph {name!r}: {exc}") from None

    def _dash(self) -> Any:
        """The default features folder, or None when there is none or it cannot be read (then
        ``GET /api/graphs`` says why in ``feature_errors``, and graphs are shown without it)."""
        try:
            return self.catalog.dashboards()
        except CircuitGraphError as exc:
            self._feature_errors[next(iter(self.catalog.features))] = str(exc)
            return None

    def _dash_of(self, kind: str) -> Any:
        """The features folder with the dashboards of graph nodes of ``kind`` (feature, neuron,
        attention_head: a folder of features, neurons or heads), or None (an unreadable folder is
        reported in ``feature_errors``, as :meth:`_dash`)."""
        units = UNITS_OF_NODE_KIND.get(kind)
        if units is None:
            return None
        try:
            return self.catalog.dashboards_for(units)
        except CircuitGraphError as exc:
            self._feature_errors[units] = str(exc)
            return None

    def _with_labels(self, graph: AttributionGraph) -> AttributionGraph:
        dash = self._dash()
        if dash is None or not dash.labels:
            return graph
        nodes = []
        for node in graph.nodes:
            label = dash.labels.get((node.layer, node.index)) if node.kind == "feature" else None
            if label:  # the features folder's description wins over an id-like or count label
                node = Node(node.id, node.activation, node.pre_activation, node.constant, label, node.attrs)
            nodes.append(node)
        out = AttributionGraph(nodes, graph.edge_target, graph.edge_source, graph.edge_weight,
                               targets=list(graph.targets), metadata=graph.metadata, edges_unique=graph.edges_unique,
                               linearised_edges=graph.linearised_edges)
        return out

    def default_thresholds(self, graph: AttributionGraph) -> tuple[float, float]:
        """A graph pruned already (it has pruning's remainder nodes) starts unpruned further (1, 1);
        any other starts at the spec's pruning defaults."""
        pruned = any(n.kind == "remainder" and n.index == REMAINDER_INDEX["pruned"] for n in graph.nodes)
        return (1.0, 1.0) if pruned else (DEFAULT_NODE_THRESHOLD, DEFAULT_EDGE_THRESHOLD)

    def _thresholds(self, graph: AttributionGraph, params: Mapping[str, str]) -> tuple[float, float, int | None]:
        """The view's node and edge thresholds and node budget (``top_k_nodes``; None: all)."""
        node_default, edge_default = self.default_thresholds(graph)
        return (_fraction(params, "node_threshold", node_default), _fraction(params, "edge_threshold", edge_default),
                _budget(params))

    def pruned(self, name: str, node_threshold: float, edge_threshold: float,
               top_k_nodes: int | None = None) -> PruneResult:
        """``prune_graph`` of the graph ``name`` at these thresholds and node budget (cached)."""
        graph = self.graph(name)
        key = (name, float(node_threshold), float(edge_threshold), top_k_nodes)
        with self._lock:
            hit = self._pruned.get(key)
            if hit is not None:
                self._pruned.move_to_end(key)
                return hit
            try:
                result = prune_graph(graph, node_threshold=node_threshold, edge_threshold=edge_threshold,
                                     top_k_nodes=top_k_nodes)
            except CircuitGraphError as exc:
                raise ApiError(400, str(exc)) from None
            self._pruned[key] = result
            while len(self._pruned) > _CACHE_SIZE:
                self._pruned.popitem(last=False)
            return result

    def view(self, name: str, node_threshold: float, edge_threshold: float,
             top_k_nodes: int | None = None) -> tuple[AttributionGraph, PruneResult | None]:
        """What the page shows of graph ``name``: ``prune_graph`` at these thresholds and node budget,
        or, for a graph without targets (pruning ranks nodes by their influence on the targets), the
        graph whole."""
        graph = self.graph(name)
        if not graph.targets:
            return graph, None
        result = self.pruned(name, node_threshold, edge_threshold, top_k_nodes)
        return result.graph, result

    def _node_json(self, node: Node, influence: float | None, targets: set[NodeId]) -> dict[str, Any]:
        token = node.attrs.get("token_str")
        dash = self._dash_of(node.kind)
        rec = {
            "id": str(node.id),
            "kind": node.kind,
            "layer": node.layer,
            "position": node.position,
            "index": node.index,
            "activation": _number(node.activation),
            "label": node.label if not is_structural_label(node) else "",
            "token": token if isinstance(token, str) else None,
            "caption": node_caption(node),
            "influence": _number(influence),
            "is_target": node.id in targets,
            "has_dashboard": bool(dash is not None and (node.layer, node.index) in dash),
        }
        if "supernode" in node.attrs:
            rec["supernode"] = node.attrs["supernode"]
            rec["members"] = list(node.attrs.get("members", []))
        return rec

    # ------------------------------------------------------------------ endpoints
    def list_graphs(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/graphs``."""
        _params(query, ())
        self._dash()
        return {
            "graphs": [e.info(self.catalog.root_dir) for e in self.catalog.graphs.values()],
            "feature_errors": dict(self._feature_errors),
            "datasets": sorted(self.catalog.datasets),
            "features": list(self.catalog.features),
            "truncated": self.catalog.truncated,
            "kind_colors": KIND_COLORS,
            "edge_colors": {"positive": POSITIVE_COLOR, "negative": NEGATIVE_COLOR},
        }

    def registries(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/registries``: what the page's controls are built from, read from circuitgraph's
        registries (the page lists none of it by hand): ``downloads``, the export kinds a pinned
        subgraph can be saved as (:func:`explorer_kinds`: ``format``, the ``format`` parameter of
        ``GET /api/export``; ``label``, the link's text; ``suffix``, how the file's name ends), in
        the registry's order; ``node_kinds``, every node kind in the order the page stacks a cell's
        nodes (:data:`~circuitgraph.graph.nodes.NODE_KINDS`)."""
        _params(query, ())
        return {
            "downloads": [{"format": k.key, "label": k.explorer_label, "suffix": k.explorer} for k in explorer_kinds()],
            "node_kinds": list(NODE_KINDS),
        }

    def graph_view(self, name: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/graph/NAME?node_threshold=T&edge_threshold=E[&supernodes=JSON]``: the pruned graph."""
        params = _params(query, (*_THRESHOLD_KEYS, "supernodes"))
        graph = self.graph(name)
        nt, et, budget = self._thresholds(graph, params)
        groups = _groups(params)
        view, result = self.view(name, nt, et, budget)
        if view.n_edges > MAX_VIEW_EDGES:
            raise ApiError(400, f"the graph pruned at node_threshold={nt}, edge_threshold={et} has {view.n_edges:,} "
                                f"edges, more than the page draws ({MAX_VIEW_EDGES:,}); lower the thresholds or "
                                f"the node budget (top_k_nodes={budget if budget is not None else 'all'})",
                           node_threshold=nt, edge_threshold=et)
        influence: dict[NodeId, float] = {}
        influence_share = None
        if result is not None:
            kept = result.node_influence[result.node_mask]
            influence = {n.id: float(v) for n, v in zip(view.nodes, kept, strict=False)}
            total = float(result.node_influence.sum())
            influence_share = float(kept.sum()) / total if total > 0 else None
        if groups:
            try:
                view = merge_supernodes(view, groups)
            except CircuitGraphError as exc:
                raise ApiError(400, str(exc)) from None
            for node in view.nodes:
                if "supernode" in node.attrs:
                    influence[node.id] = sum(influence.get(NodeId.parse(m), 0.0) for m in node.attrs["members"])
        targets = set(view.target_ids)
        ids = [str(n.id) for n in view.nodes]
        meta = graph.metadata
        default = self.default_thresholds(graph)
        return {
            "name": name,
            "node_threshold": nt,
            "edge_threshold": et,
            "default_node_threshold": default[0],
            "default_edge_threshold": default[1],
            "top_k_nodes": budget,
            "default_top_k_nodes": DEFAULT_TOP_K_NODES,
            "n_rankable_nodes": sum(1 for n in graph.nodes if n.kind not in ALWAYS_KEPT_KINDS and n.kind != "remainder")
            - len(graph.targets),
            "influence_share": influence_share,
            "prunable": result is not None,
            "n_nodes_before": graph.n_nodes,
            "n_edges_before": graph.n_edges,
            "node_score_threshold": _number(result.node_score_threshold) if result is not None else None,
            "edge_score_threshold": _number(result.edge_score_threshold) if result is not None else None,
            "prompt": meta.prompt,
            "prompt_tokens": meta.prompt_token_strs,
            "scores": {k: _number(v) for k, v in zip(_SCORES, (meta.replacement_score, meta.completeness_score),
                                                     strict=True) if v is not None},
            "model": meta.model_name,
            "has_qk": bool(self._qk_heads(name)),
            "n_steering": len(self.document(name).steering),
            "nodes": [self._node_json(n, influence.get(n.id), targets) for n in view.nodes],
            "edges": [{"source": ids[s], "target": ids[t], "weight": w} for s, t, w in
                      zip(view.edge_source.tolist(), view.edge_target.tolist(), view.edge_weight.tolist(), strict=False)],
            "supernodes": groups,
            "linearised_edges": _linearised_view_edges(view, ids, 3 * len(ids)),
        }

    def node(self, name: str, node_text: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/node/NAME/NODE_ID``: the node, its inputs and outputs, its dashboard and QK."""
        params = _params(query, (*_THRESHOLD_KEYS, "limit"))
        node_id = _node_id(node_text)
        graph = self.graph(name)
        limit = _int(params, "limit", DEFAULT_EDGE_LIMIT)
        nt, et, budget = self._thresholds(graph, params)
        view, result = self.view(name, nt, et, budget)
        source, influence = graph, None
        if node_id in graph:  # prune's node influence is that of the graph it was given
            if result is not None:
                influence = float(result.node_influence[graph.index_of(node_id)])
        else:  # a remainder node of the pruned view
            source = view
            if node_id not in source:
                raise ApiError(404, f"node {node_id} is not in graph {name!r}")
        node = source.node(node_id)
        rec = self._node_json(node, influence, set(source.target_ids))
        ins, outs = source.in_edges(node_id), source.out_edges(node_id)
        rec.update({
            "pre_activation": _number(node.pre_activation),
            "constant": _number(node.constant),
            "attrs": _jsonable_attrs(node.attrs),
            "n_inputs": len(ins),
            "n_outputs": len(outs),
            "inputs": [self._edge_json(source, s, w) for s, w in ins[:limit]],
            "outputs": [self._edge_json(source, t, w) for t, w in outs[:limit]],
            "sum_inputs": float(sum(w for _, w in ins)),
            "dashboard": None,
            "qk": [h for h in self._qk_heads(name) if node.kind == "attention_head" and int(h["layer"]) == node.layer
                   and int(h["head"]) == node.index and int(h["query_position"]) == node.position],
        })
        rec["linearised_inputs"] = self._linearised_inputs(source, node_id, limit)
        rec["qk_names"] = self._qk_names(name, rec["qk"])
        dash = self._dash_of(node.kind)
        if dash is not None:
            rec["dashboard"] = dash.dashboard(node.layer, node.index)
        return rec

    def _linearised_inputs(self, graph: AttributionGraph, node_id: NodeId, limit: int) -> list[dict[str, Any]]:
        """A head's linearised query and key inputs (``graph.head_inputs``), one entry per kind:
        the strongest edges, their count and sum, the constant and the per-head sum they make."""
        le = graph.linearised_edges
        if le is None or node_id not in graph:
            return []
        row = graph.index_of(node_id)
        out = []
        names = le.kind_names()
        for kind in le.kinds:
            if row not in le.totals.get(kind, {}):
                continue
            sel = np.flatnonzero((le.target == row) & (names == kind))
            sel = sel[np.argsort(-np.abs(le.weight[sel]), kind="stable")]
            out.append({"kind": kind, "linearised": True, "n_inputs": int(sel.size),
                        "sum_inputs": float(le.weight[sel].sum()),
                        "constant": _number(le.constants.get(kind, {}).get(row, 0.0)),
                        "total": _number(le.totals[kind][row]),
                        "inputs": [self._edge_json(graph, graph.nodes[int(le.source[k])].id, float(le.weight[k]))
                                   for k in sel[:limit].tolist()]})
        return out

    @staticmethod
    def _edge_json(graph: AttributionGraph, other: NodeId, weight: float) -> dict[str, Any]:
        node = graph.node(other)
        token = node.attrs.get("token_str")
        return {"id": str(other), "kind": other.kind, "caption": node_caption(node), "weight": weight,
                "token": token if isinstance(token, str) else None,
                "label": node.label if not is_structural_label(node) else ""}

    def feature(self, layer_text: str, index_text: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/features/LAYER/INDEX[?features=NAME]``: one feature's dashboard."""
        params = _params(query, ("features",))
        if not re.fullmatch(r"-?\d{1,9}", layer_text) or not re.fullmatch(r"\d{1,12}", index_text):
            raise ApiError(400, f"a feature is /api/features/LAYER/INDEX with integers, got {layer_text[:20]!r}/"
                                f"{index_text[:20]!r}")
        dash = self._dashboards(params.get("features"))
        board = dash.dashboard(int(layer_text), int(index_text))
        if board is None:
            raise ApiError(404, f"feature {index_text} of layer {layer_text} is not in {dash.directory.name}")
        return board

    def features(self, rest: list[str], query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/features`` (the folders and their layers), ``GET /api/features/LAYER``
        (a layer's features, ``offset``/``limit``) or ``GET /api/features/LAYER/INDEX`` (a dashboard)."""
        if len(rest) == 2:
            return self.feature(rest[0], rest[1], query)
        if len(rest) > 2:
            raise ApiError(400, "a feature is /api/features/LAYER/INDEX")
        params = _params(query, ("features", "offset", "limit"))
        dash = self._dashboards(params.get("features"))
        if not rest:
            _params(query, ("features",))
            return {"folders": list(self.catalog.features), "source": dash.directory.name,
                    "layers": {str(k): v for k, v in dash.layers().items()}}
        if not re.fullmatch(r"-?\d{1,9}", rest[0]):
            raise ApiError(400, f"a layer's features are /api/features/LAYER with an integer, got {rest[0][:20]!r}")
        offset, limit = _int(params, "offset", 0, low=0), _int(params, "limit", 200)
        layer = int(rest[0])
        return {"source": dash.directory.name, "layer": layer, "n_features": dash.layers().get(layer, 0),
                "offset": offset, "features": dash.listing(layer, offset, limit)}

    def _dashboards(self, source: str | None) -> Any:
        if source is not None and source not in self.catalog.features:
            raise ApiError(404, f"no features folder named {source[:200]!r}; GET /api/graphs lists them")
        try:
            dash = self.catalog.dashboards(source)
        except CircuitGraphError as exc:
            raise ApiError(400, str(exc)) from None
        if dash is None:
            raise ApiError(404, "no features folder is being served; serve a folder holding one, or pass --features")
        return dash

    def supernode_proposals(self, name: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/supernodes/NAME?...``: :func:`propose_supernodes` of the pruned graph."""
        params = _params(query, _THRESHOLD_KEYS)
        graph = self.graph(name)
        nt, et, budget = self._thresholds(graph, params)
        proposals = propose_supernodes(self.view(name, nt, et, budget)[0])
        return {"name": name, "node_threshold": nt, "edge_threshold": et,
                "proposals": {k: [str(m) for m in v] for k, v in proposals.items()}}

    def _qk_heads(self, name: str) -> list[dict[str, Any]]:
        doc = self.catalog.document(name)
        heads = []
        for result in stored_results(doc.queries, "qk"):
            found = result.get("heads")
            heads.extend(h for h in (found if isinstance(found, list) else ()) if isinstance(h, dict))
        return heads

    def qk(self, name: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/qk/NAME``: the QK decompositions stored with the graph (``qk`` queries), and
        ``names``: a display name of every node they mention."""
        _params(query, ())
        heads = self._qk_heads(name)
        return {"name": name, "heads": heads, "names": self._qk_names(name, heads)}

    def _qk_names(self, name: str, heads: list[dict[str, Any]]) -> dict[str, str]:
        graph = self.graph(name)
        names = {}
        for h in heads:
            ids = [p[k] for p in h.get("pairs", ()) for k in ("query_node", "key_node")]
            ids += [m["node"] for key in ("query_marginals", "key_marginals") for m in h.get(key, ())]
            for text in ids:
                try:
                    node = graph.node(text)
                except CircuitGraphError:
                    continue
                token = node.attrs.get("token_str")
                names[text] = node_caption(node) + (f" {json.dumps(token, ensure_ascii=False)}"
                                                    if isinstance(token, str) else "")
        return names

    def dataset(self, name: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/dataset/NAME``: the run's manifest (scores per prompt) and its graphs."""
        _params(query, ())
        entry = self.catalog.datasets.get(name)
        if entry is None:
            raise ApiError(404, f"no dataset run named {name[:200]!r}; GET /api/graphs lists them")
        ds = open_dataset(entry.path)
        manifest = ds.manifest
        columns = [c for c in ("id", "row", "status", "error", *_SCORES, "n_nodes", "n_edges", "n_tokens",
                               "time_total") if c in manifest.columns]
        rows = []
        for rec in manifest[columns].to_dict(orient="records"):
            rec = {k: (_number(v) if isinstance(v, float) else v.item() if hasattr(v, "item") else v)
                   for k, v in rec.items()}
            rec["graph"] = entry.prompt_graphs.get(str(rec.get("id")))
            rows.append(rec)
        ok = manifest[manifest["status"] == "ok"] if "status" in manifest.columns else manifest
        summary = {}
        for col in _SCORES:
            if col in ok.columns and len(ok):
                summary[col] = {"mean": _number(ok[col].mean()), "median": _number(ok[col].median()),
                                "min": _number(ok[col].min()), "max": _number(ok[col].max())}
        return {"name": name, "aggregate": f"{name}/aggregate", "n_prompts": len(manifest), "n_ok": len(ok),
                "n_aggregated": ds.n_aggregated, "scores": summary, "rows": rows}

    def steering(self, name: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/steering/NAME``: the graph file's ``steering`` list (the spec's ``steer:`` items'
        results) as the file holds it."""
        _params(query, ())
        return {"name": name, "steering": self.document(name).steering}

    def diff(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """``GET /api/diff?a=NAME&b=NAME[&match=M][&allow_different=true][&top=K][&sort=change|flip]``:
        :func:`~circuitgraph.queries.diff.diff_graphs` of the two graphs as loaded, as its JSON
        (``circuitgraph.diff``, :meth:`~circuitgraph.queries.diff.GraphDiff.to_dict`), named by their
        catalog names."""
        params = _params(query, ("a", "b", "match", "allow_different", "top", "sort"))
        for key in ("a", "b"):
            if not params.get(key):
                raise ApiError(400, f"{key} must name a graph (GET /api/graphs lists them), e.g. /api/diff?a=A&b=B")
        match = params.get("match", "position")
        if match not in MATCHES:
            raise ApiError(400, f"match must be one of {', '.join(MATCHES)}, got {match[:40]!r}")
        allow = _flag(params, "allow_different")
        top = _int(params, "top", DEFAULT_DIFF_TOP)
        sort = params.get("sort", "change")
        if sort not in SORTS:
            raise ApiError(400, f"sort must be one of {', '.join(SORTS)}, got {sort[:40]!r}")
        a, b = params["a"], params["b"]
        graph_a, graph_b = self.document(a).graph, self.document(b).graph
        try:
            result = diff_graphs(graph_a, graph_b, match=match, allow_different=allow, names=(a, b))  # type: ignore[arg-type]
        except CircuitGraphError as exc:
            message = str(exc).replace("pass allow_different=True (--allow-different-models)",
                                       "add allow_different=true to the query")
            raise ApiError(400, message) from None
        return result.to_dict(top=top, sort=sort)  # type: ignore[arg-type]

    def export(self, name: str, query: Mapping[str, list[str]]) -> Download:
        """``GET /api/export/NAME?format=F&nodes=ID,ID...``: the pinned nodes' subgraph of the pruned
        view, written by circuitgraph's own exporters (``format``: an export kind the explorer offers,
        :func:`explorer_kinds`; json unless given)."""
        params = _params(query, (*_THRESHOLD_KEYS, "format", "nodes", "supernodes"))
        fmt = params.get("format", "json")
        offered = [k.key for k in explorer_kinds()]
        if fmt not in offered:
            raise ApiError(400, f"format must be one of {', '.join(offered)}, got {fmt[:40]!r}")
        text = params.get("nodes", "")
        ids = [_node_id(t) for t in text.split(",") if t.strip()]
        if not ids:
            raise ApiError(400, "nodes must list the node ids to save, separated by commas (pin some nodes)")
        graph = self.graph(name)
        nt, et, budget = self._thresholds(graph, params)
        view = self.view(name, nt, et, budget)[0]
        missing = [i for i in ids if i not in view]
        if missing:
            raise ApiError(400, f"node {missing[0]} is not in the pruned graph at node_threshold={nt}, "
                                f"edge_threshold={et}; lower the thresholds or unpin it")
        groups = _groups(params)
        pinned = {str(i) for i in ids}
        for gname, members in groups.items():
            stray = [m for m in members if m not in pinned]
            if stray:
                raise ApiError(400, f"supernode {gname!r} holds {stray[0]}, which is not pinned; pin it or drop it")
        sub = view.subgraph(ids)
        sub.metadata.set_explorer(source=name, node_threshold=nt, edge_threshold=et, top_k_nodes=budget,
                                  pinned=sorted(pinned), supernodes=groups)
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.") or "graph"
        save = SavedSubgraph(self, graph, sub, ids, groups, stem, nt, et)
        try:
            data, content_type = DOWNLOADS[fmt](save)
        except CircuitGraphError as exc:
            raise ApiError(400, f"cannot save the subgraph as {fmt}: {exc}") from None
        return Download(data, content_type, f"{stem}-subgraph{EXPORT_KINDS[fmt].explorer}")


@dataclass
class SavedSubgraph:
    """What a download of a pinned subgraph is written from (``GET /api/export``)."""

    explorer: Explorer
    graph: AttributionGraph
    sub: AttributionGraph
    ids: list[NodeId]
    groups: dict[str, list[str]]
    stem: str
    node_threshold: float
    edge_threshold: float


#: what follows an explorer view's route in its URL: nothing (``/api/graphs``), a name
#: (``/api/graph/NAME``), path segments (``/api/features/LAYER/INDEX``) or a graph's name and a node
#: id (``/api/node/NAME/KIND/LAYER/POSITION/INDEX``)
ViewPath = Literal["none", "name", "segments", "node"]


@dataclass(frozen=True)
class ExplorerView:
    """One view of the explorer: the record a new view adds (docs/architecture.md).

    ``GET /api/<route>/...`` calls ``method`` (an :class:`Explorer` method, given the name,
    the path segments or nothing, then the query) and the page's ``panel`` (the function of
    ``static/explorer.js`` that asks for it) shows the answer."""

    route: str
    method: Callable[..., Any]
    path: ViewPath
    panel: str


#: every view of the explorer by route (the HTTP layer routes ``/api/<route>`` through these alone)
VIEWS: dict[str, ExplorerView] = {v.route: v for v in (
    ExplorerView("graphs", Explorer.list_graphs, "none", "start"),
    ExplorerView("registries", Explorer.registries, "none", "loadRegistries"),
    ExplorerView("graph", Explorer.graph_view, "name", "loadView"),
    ExplorerView("node", Explorer.node, "node", "selectNode"),
    ExplorerView("supernodes", Explorer.supernode_proposals, "name", "propose"),
    ExplorerView("qk", Explorer.qk, "name", "showQK"),
    ExplorerView("dataset", Explorer.dataset, "name", "showDataset"),
    ExplorerView("export", Explorer.export, "name", "renderPinned"),
    ExplorerView("features", Explorer.features, "segments", "loadFeatures"),
    ExplorerView("steering", Explorer.steering, "name", "showSteering"),
    ExplorerView("diff", Explorer.diff, "none", "showDiff"),
)}


#: export key -> its download: ``(bytes, content type)``; each registers itself (``@_downloads(key)``)
#: under a key of the spec's :data:`~circuitgraph.spec.export.EXPORT_KINDS` whose ``explorer`` is set
DOWNLOADS: dict[str, Callable[[SavedSubgraph], tuple[bytes, str]]] = {}


def _downloads(key: str) -> Callable[[Callable[[SavedSubgraph], tuple[bytes, str]]],
                                     Callable[[SavedSubgraph], tuple[bytes, str]]]:
    def register(fn: Callable[[SavedSubgraph], tuple[bytes, str]]) -> Callable[[SavedSubgraph], tuple[bytes, str]]:
        DOWNLOADS[key] = fn
        return fn
    return register


@_downloads("json")
def _download_json(s: SavedSubgraph) -> tuple[bytes, str]:
    return graph_to_json(s.sub).encode("utf-8"), "application/json"


@_downloads("neuronpedia")
def _download_neuronpedia(s: SavedSubgraph) -> tuple[bytes, str]:
    keep_remainders = any(i.kind == "remainder" for i in s.ids)
    doc = graph_to_neuronpedia(s.sub, full_graph=s.graph, slug=f"{s.stem}-subgraph", node_threshold=s.node_threshold,
                               edge_threshold=s.edge_threshold, keep_remainders=keep_remainders)
    present = {rec["node_id"] for rec in doc["nodes"]}
    doc["qParams"]["pinnedIds"] = sorted(present)
    n_layers = n_layers_of(s.sub)
    doc["qParams"]["supernodes"] = [
        [gname, *[np_id for np_id in (neuronpedia_node_id(NodeId.parse(m), n_layers)[0] for m in members)
                  if np_id in present]] for gname, members in s.groups.items()]
    text = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
    return text.encode("utf-8"), "application/json"


@_downloads("svg")
def _download_svg(s: SavedSubgraph) -> tuple[bytes, str]:
    dash = s.explorer._dash()
    dot = graph_to_dot(s.sub, max_nodes=None, max_edges=None, show_remainders=True, show_unreachable=True,
                       labels=dash.labels if dash is not None and dash.labels else None,
                       supernodes=s.groups or None)
    return render_dot_bytes(dot, "svg"), "image/svg+xml"


def explorer_kinds() -> tuple[ExportKind, ...]:
    """What a pinned subgraph can be saved as: the spec's export kinds with ``explorer`` set, in the
    registry's order (read at each call, so a kind registered later is offered at once)."""
    return tuple(kind for kind in EXPORT_KINDS.values() if kind.explorer is not None)


if set(DOWNLOADS) != {k.key for k in explorer_kinds()}:  # pragma: no cover - an offered kind without a download
    raise ImportError(f"explorer downloads {sorted(DOWNLOADS)} do not match the export kinds it offers "
                      f"{sorted(k.key for k in explorer_kinds())}")


def _jsonable_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The node's attrs that JSON can hold as they are (numbers, strings, short lists)."""
    out = {}
    for k, v in attrs.items():
        if isinstance(v, (str, bool, int)) or v is None:
            out[k] = v
        elif isinstance(v, float):
            out[k] = _number(v)
        elif isinstance(v, (list, tuple)) and len(v) <= 64 and all(isinstance(x, (str, int, float)) for x in v):
            out[k] = [_number(x) if isinstance(x, float) else x for x in v]
    return out


def _linearised_view_edges(view: AttributionGraph, ids: list[str], limit: int) -> list[dict[str, Any]]:
    """The ``limit`` strongest linearised query / key edges of the view (``graph.head_inputs``)."""
    le = view.linearised_edges
    if le is None or not len(le) or le.target.max(initial=-1) >= len(ids):
        return []
    order = np.argsort(-np.abs(le.weight), kind="stable")[:limit]
    names = le.kind_names()
    return [{"source": ids[int(le.source[k])], "target": ids[int(le.target[k])], "weight": float(le.weight[k]),
             "kind": str(names[k]), "linearised": True} for k in order.tolist()]
