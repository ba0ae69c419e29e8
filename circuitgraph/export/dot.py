"""Graphviz DOT text for an attribution graph, built with the ``graphviz`` package's
``Digraph`` (no binary needed; :mod:`circuitgraph.export.render` draws it with the same
package's ``pipe``).

Conventions (docs/export.md, "Diagrams"):

* layout bottom to top by layer (``rankdir=BT``): one rank per layer, embeddings at the
  bottom, logits on top; attention heads (and attention biases) get their own rank just
  below the MLP-side nodes of their layer, since they write before the MLP reads;
* left to right by position: nodes of a rank are ordered by (position, kind, index)
  with invisible ordering edges, and nodes of one position share a Graphviz ``group``
  so a position tends to stay in one column;
* fill colour by node kind (:data:`KIND_COLORS`, shown in a legend); target nodes have
  a double border, error and remainder nodes a dashed one;
* edge colour by sign (:data:`POSITIVE_COLOR` excites, :data:`NEGATIVE_COLOR` inhibits)
  and pen width proportional to ``|weight|`` relative to the largest edge shown; the
  exact weight is the edge's tooltip in SVG;
* labels: ``F17 L1 @4`` (feature 17 of layer 1 at position 4), ``N`` for neurons,
  ``L1H3`` for head 3 of layer 1, token strings in quotes for embeddings and logits,
  plus the node's label on a second line when it says more than the id;
* a node budget: above ``max_nodes`` (default :data:`DEFAULT_MAX_NODES`, the spec's
  ``export.max_render_nodes``) the strongest nodes are kept (targets always; the others ranked
  by influence on the targets, else by their largest ``|edge|``), and the title says how
  many nodes and edges were left out and what share of the total influence the hidden nodes
  hold (``+1,751 nodes hidden (64% of the influence)``); the full graph still goes to JSON;
* legible at any depth: a layer with more than ``max_row_nodes`` drawn nodes is wrapped onto
  further rows (``L0``, ``L0 cont.``), so the width is bounded by the row length, not by the
  number of nodes of the busiest layer;
* for a paper: feature descriptions as labels, activations, a layer axis, an edge-width
  scale, supernodes, and nodes with no path to a target hidden (see :func:`graph_to_dot`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from contextlib import contextmanager
from typing import Any, TypeGuard

import graphviz
import numpy as np

from circuitgraph.errors import ExportError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import BIAS_INDEX, NODE_KINDS, REMAINDER_INDEX, Node, NodeAttrs, NodeId

# the analysis the drawing uses (influence, reachability, supernodes) lives in the queries;
# re-exported here, its old home
from circuitgraph.queries.influence import raw_influence
from circuitgraph.queries.neighbours import merge_supernodes, propose_supernodes, reaches_a_target
from circuitgraph.spec.export import ExportSpec
from circuitgraph.spec.kinds import ACTIVATION_KINDS

__all__ = [
    "graph_to_dot",
    "DEFAULT_MAX_NODES",
    "DEFAULT_MAX_ROW_NODES",
    "KIND_COLORS",
    "POSITIVE_COLOR",
    "NEGATIVE_COLOR",
    "dot_quote",
    "node_caption",
    "is_structural_label",
    "propose_supernodes",
    "merge_supernodes",
    "reaches_a_target",
    "raw_influence",
]

#: the node budget of a diagram (and of the explorer's first view): the spec's
#: ``export.max_render_nodes``, stated once there
DEFAULT_MAX_NODES: int = ExportSpec.model_fields["max_render_nodes"].default
#: nodes drawn side by side in one row; a layer with more is wrapped onto further rows
DEFAULT_MAX_ROW_NODES = 8

#: fill colour of each node kind
KIND_COLORS: dict[str, str] = {
    "embedding": "#b8e0b0",
    "positional": "#dcefd6",
    "feature": "#fdd49e",
    "error": "#d9d9d9",
    "neuron": "#fdbb84",
    "attention_head": "#c6dbef",
    "mlp": "#fcbba1",
    "bias": "#f0f0f0",
    "remainder": "#ffffff",
    "logit": "#d4c9e8",
    "target": "#bcbddc",
}
#: edge colours by sign of the weight
POSITIVE_COLOR = "#2166ac"
NEGATIVE_COLOR = "#b2182b"

_KIND_ORDER = {kind: i for i, kind in enumerate(NODE_KINDS)}
_BIAS_NAMES = {v: k for k, v in BIAS_INDEX.items()}
_REMAINDER_NAMES = {v: k for k, v in REMAINDER_INDEX.items()}
_MAX_TOKEN_CHARS = 24
_MAX_LABEL_CHARS = 32
_MIN_PEN, _MAX_PEN = 0.4, 5.0


def graph_to_dot(
    graph: AttributionGraph,
    *,
    max_nodes: int | None = DEFAULT_MAX_NODES,
    min_edge_fraction: float = 0.0,
    max_edges: int | None = -1,
    show_remainders: bool = False,
    show_unreachable: bool = False,
    title: str | None = None,
    labels: Mapping[tuple[int, int], str] | None = None,
    supernodes: Mapping[str, Any] | str | None = None,
    influence: Mapping[NodeId, float] | None = None,
    qk: Sequence[Mapping[str, Any]] = (),
    max_row_nodes: int | None = DEFAULT_MAX_ROW_NODES,
) -> str:
    """DOT text of ``graph`` (see the module docstring for the diagram's conventions).

    Args:
        graph: the graph to draw.
        max_nodes: draw at most this many nodes, the most influential (targets are always
            drawn, even beyond it); ``None`` draws all.  The title says how many were hidden
            and their share of the total influence.
        min_edge_fraction: leave out edges whose ``|weight|`` is below this fraction of
            the largest ``|weight|`` among the drawn nodes' edges (0 keeps all).
        max_edges: draw at most this many edges: the strongest, plus each drawn node's
            strongest edge so no node is left unconnected; ``-1`` (default) means three per
            drawn node, ``None`` draws all.
        show_remainders: draw ``remainder`` nodes (what pruning or a top-k cut left out);
            by default they are not drawn and the title says how many were hidden.
        show_unreachable: draw nodes with no path to a target; by default they are hidden
            (the title says how many).
        title: the diagram's title; default: the prompt from ``graph.metadata``.
        labels: ``{(layer, index): description}`` of feature and neuron nodes (see
            :func:`circuitgraph.export.labels.load_feature_labels`), drawn under their id.
        supernodes: ``{name: node filter}`` (as the ``supernodes`` query takes) or
            ``"auto"`` (:func:`propose_supernodes`): each group is drawn as one box named
            after it, with the edges to and from its members summed.
        influence: each node's influence on the targets (shown in tooltips, used to choose
            the nodes drawn); default: computed from ``graph`` when it has targets.
        qk: results of the ``qk`` query (``QKResult.to_dict()``) to draw as an inset: per
            head, a node ``QK L{l}H{h}`` with each top pair drawn as dashed edges from its
            query-side and key-side nodes (labelled ``q``/``k``) through a small pair node
            (its value) into the head; the pairs' nodes are drawn even beyond ``max_nodes``.
        max_row_nodes: at most this many nodes side by side in a layer's row; a layer with
            more is wrapped onto further rows above it (``None``: one row per layer, however
            wide).

    Returns:
        DOT source; render it with :func:`circuitgraph.export.render.render_dot_text`.

    >>> import numpy as np
    >>> from circuitgraph.graph.nodes import Node, NodeId
    >>> g = AttributionGraph([Node(NodeId("embedding", -1, 0, 7), 1.0, attrs={"token_str": "<bos>"})],
    ...                      [], [], np.zeros(0))
    >>> "rankdir=BT" in graph_to_dot(g)
    True
    """
    if max_nodes is not None and max_nodes < 1:
        raise ExportError(f"max_nodes must be at least 1, got {max_nodes}")
    if max_row_nodes is not None and max_row_nodes < 1:
        raise ExportError(f"max_row_nodes must be at least 1 (or None: one row per layer), got {max_row_nodes}")
    if not (0.0 <= min_edge_fraction <= 1.0):
        raise ExportError(f"min_edge_fraction must be between 0 and 1, got {min_edge_fraction}")
    if influence is None and graph.targets and not all(_is_number(n.attrs.get("influence")) for n in graph.nodes):
        influence = raw_influence(graph)
    totals = (graph.n_nodes, graph.n_edges)  # what the header counts against: the graph as given
    positions = not _position_free(graph)
    n_unreachable = 0
    if not show_unreachable and graph.targets:
        reach = reaches_a_target(graph)
        n_unreachable = int((~reach).sum())
        if n_unreachable:
            graph = graph.subgraph([n.id for n, r in zip(graph.nodes, reach, strict=False) if r])
    if supernodes is not None:
        groups = propose_supernodes(graph) if supernodes == "auto" else supernodes
        if isinstance(groups, str):
            raise ExportError(f"supernodes must be a mapping {{name: node filter}} or 'auto', got {groups!r}")
        before = graph.n_nodes
        graph = merge_supernodes(graph, groups)
        n_merged = before - graph.n_nodes
    else:
        n_merged = 0
    graph = _with_display_attrs(graph, labels, influence)

    hidden = set() if show_remainders else {r for r, n in enumerate(graph.nodes) if n.kind == "remainder"}
    rows, score_name = _select_rows(graph, max_nodes, hidden)
    qk_rows = _qk_rows(graph, qk)
    rows = list(rows) + [r for r in qk_rows if r not in set(rows)]
    kept = np.zeros(graph.n_nodes, dtype=bool)
    kept[rows] = True
    edge_sel = np.flatnonzero(kept[graph.edge_source] & kept[graph.edge_target])
    weights = graph.edge_weight[edge_sel].astype(np.float64)
    max_abs = float(np.abs(weights).max()) if weights.size else 0.0
    if min_edge_fraction > 0 and weights.size:
        strong = np.abs(weights) >= min_edge_fraction * max_abs
        edge_sel, weights = edge_sel[strong], weights[strong]
    if max_edges == -1:
        max_edges = 3 * len(rows)
    if max_edges is not None and weights.size > max_edges:
        edge_sel, weights = _strongest_edges(graph, edge_sel, weights, max_edges)
    # strongest edges drawn last, so they lie on top
    order = np.argsort(np.abs(weights), kind="stable")
    edge_sel, weights = edge_sel[order], weights[order]

    target_ids = set(graph.target_ids)
    ids = [graph.nodes[r].id for r in range(graph.n_nodes)]
    title_lines = _title_lines(graph, title, len(rows), len(edge_sel), score_name, len(hidden), n_unreachable,
                               totals=totals, n_merged=n_merged,
                               hidden_share=_hidden_influence_share(graph, rows, hidden) if score_name else None)
    dot = graphviz.Digraph("circuitgraph")
    dot.attr("graph", rankdir="BT", newrank="true", ranksep="0.8", nodesep="0.15", splines="true",
             fontname="Helvetica", fontsize="12", labelloc="t", label=_text(title_lines))
    dot.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="9",
             margin="0.06,0.03", height="0.28", penwidth="0.8", color="#555555")
    dot.attr("edge", arrowsize="0.45", color="#999999")

    ranks: dict[tuple[int, int], list[int]] = {}
    for r in rows:
        ranks.setdefault(_rank_key(graph.nodes[r]), []).append(r)
    rank_keys = sorted(ranks)
    n_layers = _n_layers(graph)
    axis_names = []
    for key in rank_keys:
        members = sorted(ranks[key], key=lambda r: _order_key(graph.nodes[r]))
        layer, sub = key
        for line, chunk in enumerate(_wrap(members, max_row_nodes)):
            name = f"layer {layer}" + (" attention" if sub == 0 else "") + (f" row {line + 1}" if line else "")
            axis = f"axis {name}"
            axis_names.append(axis)
            with _subgraph(dot, f"rank {name}") as rank:
                rank.attr(rank="same")
                # the layer axis: a label at the left end of every rank (a wrapped layer: "cont.")
                caption = _axis_label(layer, sub, n_layers) + (" cont." if line else "")
                rank.node(axis, label=_text([caption]), shape="plaintext", style="", fontsize="10",
                          fontcolor="#666666")
                for r in chunk:
                    _add_node(rank, graph.nodes[r], ids[r] in target_ids, positions=positions)
                chain = [axis] + [str(ids[r]) for r in chunk]
                for u, v in zip(chain, chain[1:], strict=False):
                    rank.edge(u, v, style="invis")
    # invisible edges between consecutive ranks keep the layers in order even where no
    # real edge joins them (and stack the axis labels in one column)
    for lower, upper in zip(axis_names, axis_names[1:], strict=False):
        dot.edge(lower, upper, style="invis", weight="10")

    for k, w in zip(edge_sel.tolist(), weights.tolist(), strict=False):
        s, t = int(graph.edge_source[k]), int(graph.edge_target[k])
        width = _MIN_PEN + (_MAX_PEN - _MIN_PEN) * (abs(w) / max_abs if max_abs > 0 else 0.0)
        color = NEGATIVE_COLOR if w < 0 else POSITIVE_COLOR
        dot.edge(str(ids[s]), str(ids[t]), color=color, penwidth=f"{width:.2f}",
                 tooltip=_text([f"{ids[s]} -> {ids[t]}: {w:+.6g}"]))

    n_linearised = _linearised_edges(dot, graph, kept, ids, max_abs, len(rows))
    _qk_inset(dot, graph, qk)
    _legend(dot, {graph.nodes[r].kind for r in rows}, max_abs, linearised=n_linearised > 0)
    return dot.source


def _linearised_edges(dot: graphviz.Digraph, graph: AttributionGraph, kept: np.ndarray, ids: list[NodeId],
                      max_abs: float, limit: int) -> int:
    """Draw the strongest ``limit`` linearised query / key edges (``graph.head_inputs``) between
    drawn nodes, dashed and labelled ``q`` / ``k`` (widths on the exact edges' scale); their count."""
    le = graph.linearised_edges
    if le is None or not len(le):
        return 0
    sel = np.flatnonzero(kept[le.source] & kept[le.target])
    if not sel.size:
        return 0
    sel = sel[np.argsort(-np.abs(le.weight[sel]), kind="stable")[:limit]][::-1]  # strongest drawn last
    scale = max_abs if max_abs > 0 else float(np.abs(le.weight[sel]).max())
    names = le.kind_names()
    for k in sel.tolist():
        s, t, w, kind = int(le.source[k]), int(le.target[k]), float(le.weight[k]), str(names[k])
        width = min(_MAX_PEN, _MIN_PEN + (_MAX_PEN - _MIN_PEN) * (abs(w) / scale if scale > 0 else 0.0))
        dot.edge(str(ids[s]), str(ids[t]), color=NEGATIVE_COLOR if w < 0 else POSITIVE_COLOR, style="dashed",
                 penwidth=f"{width:.2f}", label=kind[0], fontsize="8", fontcolor="#666666",
                 tooltip=_text([f"{ids[s]} -> {ids[t]} ({kind}, linearised): {w:+.6g}"]))
    return int(sel.size)


def _qk_rows(graph: AttributionGraph, qk: Sequence[Mapping[str, Any]]) -> list[int]:
    """Rows of the graph's nodes named by the top pairs of ``qk`` results."""
    out: list[int] = []
    for result in qk:
        for head in result.get("heads", ()):
            for p in head.get("pairs", ()):
                for key in ("query_node", "key_node"):
                    node_id = NodeId.parse(p[key])
                    if node_id in graph:
                        out.append(graph.index_of(node_id))
    return list(dict.fromkeys(out))


def _qk_inset(dot: graphviz.Digraph, graph: AttributionGraph, qk: Sequence[Mapping[str, Any]]) -> None:
    """The QK inset: per head a cluster with the head and one small node per top pair."""
    for n, result in enumerate(qk):
        for head in result.get("heads", ()):
            l, h, q, k = head["layer"], head["head"], head["query_position"], head["key_position"]
            name = f"qk L{l}H{h} {q}->{k} #{n}"
            pairs = [p for p in head.get("pairs", ())
                     if NodeId.parse(p["query_node"]) in graph and NodeId.parse(p["key_node"]) in graph]
            max_abs = max((abs(p["value"]) for p in pairs), default=0.0)
            outside: list[tuple[str, str, dict[str, str]]] = []  # so the graph's nodes stay in their ranks
            with _subgraph(dot, f"cluster {name}") as box:
                box.attr(label=_text([f"QK L{l}H{h}: query {q} -> key {k}"]), fontsize="10",
                         style="rounded,dashed", color="#888888")
                caption = [f"QK L{l}H{h} @{q}->{k}", f"score {head['score']:.4g}, p={head['probability']:.3f}"]
                box.node(name, label=_text(caption), shape="box", style="rounded,filled,bold", fillcolor="#fff2cc")
                for i, p in enumerate(pairs):
                    v = float(p["value"])
                    color = NEGATIVE_COLOR if v < 0 else POSITIVE_COLOR
                    width = f"{_MIN_PEN + (_MAX_PEN - _MIN_PEN) * (abs(v) / max_abs if max_abs > 0 else 0.0):.2f}"
                    pair = f"{name} pair {i}"
                    tip = _text([f"{p['query_node']} x {p['key_node']}: {v:+.6g}"])
                    box.node(pair, label=_text([f"{v:+.3g}"]), shape="ellipse", style="dashed", fontsize="8",
                             height="0.2", tooltip=tip)
                    box.edge(pair, name, style="dashed", color=color, penwidth=width, tooltip=tip)
                    for key, tag in (("query_node", "q"), ("key_node", "k")):
                        outside.append((p[key], pair, {"style": "dashed", "color": color, "label": tag,
                                                       "fontsize": "7", "penwidth": width}))
            for u, v, attrs in outside:
                dot.edge(u, v, **attrs)


def _strongest_edges(graph: AttributionGraph, edge_sel: np.ndarray, weights: np.ndarray,
                     max_edges: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``max_edges`` strongest edges plus every node's strongest incident edge."""
    mag = np.abs(weights)
    keep = np.zeros(mag.size, dtype=bool)
    keep[np.argpartition(-mag, max_edges - 1)[:max_edges]] = True
    for ends in (graph.edge_source[edge_sel], graph.edge_target[edge_sel]):
        order = np.lexsort((-mag, ends))  # by node, strongest first
        first = np.ones(order.size, dtype=bool)
        first[1:] = ends[order][1:] != ends[order][:-1]
        keep[order[first]] = True
    return edge_sel[keep], weights[keep]


# --------------------------------------------------------------------------- node selection
def _select_rows(graph: AttributionGraph, max_nodes: int | None,
                 hidden: Set[int] = frozenset()) -> tuple[list[int], str | None]:
    """Rows to draw (never the ``hidden`` ones), and the score used to choose them (None when
    all candidates are drawn)."""
    n = graph.n_nodes
    candidates = [r for r in range(n) if r not in hidden]
    if max_nodes is None or len(candidates) <= max_nodes:
        return candidates, None
    target_rows = {graph.index_of(t) for t in graph.target_ids}
    others = [r for r in candidates if r not in target_rows]
    influence = [graph.nodes[r].attrs.get("influence") for r in others]
    numeric = [float(v) for v in influence if _is_number(v)]
    if others and len(numeric) == len(others):
        scores = dict(zip(others, numeric, strict=True))
        score_name = "influence"
    else:
        strength = np.zeros(n, dtype=np.float64)
        magnitude = np.abs(graph.edge_weight.astype(np.float64))
        np.maximum.at(strength, graph.edge_source, magnitude)
        np.maximum.at(strength, graph.edge_target, magnitude)
        scores = {r: float(strength[r]) for r in others}
        score_name = "largest |edge|"
    budget = max(max_nodes - len(target_rows), 0)
    best = sorted(others, key=lambda r: (-scores[r], r))[:budget]
    return sorted(target_rows | set(best)), score_name


def _wrap(members: list[int], max_row_nodes: int | None) -> list[list[int]]:
    """``members`` (in drawing order) split into as few rows of at most ``max_row_nodes`` as
    possible, of balanced lengths (30 nodes at 8 a row: 8, 8, 7, 7)."""
    if max_row_nodes is None or len(members) <= max_row_nodes:
        return [members]
    n_rows = -(-len(members) // max_row_nodes)
    base, extra = divmod(len(members), n_rows)
    bounds = np.cumsum([0] + [base + (i < extra) for i in range(n_rows)])
    return [members[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=False)]


def _hidden_influence_share(graph: AttributionGraph, rows: Sequence[int], hidden: set[int]) -> float | None:
    """The share of the total influence (over the nodes that could be drawn: not targets, not
    ``hidden``) held by the nodes left out; None when a node has no influence to count."""
    target_rows = {graph.index_of(t) for t in graph.target_ids}
    drawn = set(rows)
    total = left = 0.0
    for r, node in enumerate(graph.nodes):
        if r in hidden or r in target_rows:
            continue
        value = node.attrs.get("influence")
        if not _is_number(value):
            return None
        total += abs(float(value))
        if r not in drawn:
            left += abs(float(value))
    return left / total if total > 0 else None


def _rank_key(node: Node) -> tuple[int, int]:
    attention_side = node.kind == "attention_head" or (node.kind == "bias" and node.index == BIAS_INDEX["attention"])
    return (node.layer, 0 if attention_side else 1)


def _order_key(node: Node) -> tuple[int, int, int]:
    return (node.position, _KIND_ORDER[node.kind], node.index)


# --------------------------------------------------------------------------- text
def _add_node(dot: graphviz.Digraph, node: Node, is_target: bool, *, positions: bool = True) -> None:
    """One node of the diagram (colour by kind, double border for targets, tooltip); ``positions``:
    captions say the node's position (not in a position-free aggregate)."""
    if "supernode" in node.attrs:
        members = node.attrs.get("members", [])
        tooltip = f"supernode {node.attrs['supernode']}: " + ", ".join(members)
        dot.node(str(node.id), label=_text([_shorten(_show_text(node.attrs["supernode"]), 40),
                                            *_member_lines(members, positions), f"({len(members)} nodes)"]),
                 fillcolor=KIND_COLORS[node.kind], style="filled,bold", shape="box", penwidth="2",
                 group=f"p{node.position}", tooltip=_text([tooltip]))
        return
    style = "rounded,filled,dashed" if node.kind in ("error", "remainder") else "rounded,filled"
    attrs = {"fillcolor": KIND_COLORS[node.kind], "style": style, "group": f"p{node.position}",
             "tooltip": _text([_tooltip(node)])}
    if is_target:
        attrs.update(peripheries="2", penwidth="1.4")
    href = node.attrs.get("href")
    if isinstance(href, str):  # a link, e.g. to the feature's dashboard in the HTML report
        attrs["URL"] = href
    dot.node(str(node.id), label=_text(_node_lines(node, positions=positions)), **attrs)


#: members named in a supernode box (the tooltip names them all)
_MAX_MEMBERS_SHOWN = 6


def _member_lines(members: Sequence[str], positions: bool) -> list[str]:
    """A supernode's members as captions, three a line (``F17 L1 @4, F3 L1 @4, ...``)."""
    captions = []
    for m in members[:_MAX_MEMBERS_SHOWN]:
        try:
            captions.append(node_caption(Node(NodeId.parse(m), 0.0), position=positions))
        except Exception:  # noqa: BLE001 - a member that is not a node id is shown as written
            captions.append(_shorten(_show_text(m), 20))
    lines = [", ".join(captions[i:i + 3]) for i in range(0, len(captions), 3)]
    if len(members) > _MAX_MEMBERS_SHOWN:
        lines.append(f"+ {len(members) - _MAX_MEMBERS_SHOWN} more")
    return lines


def _position_free(graph: AttributionGraph) -> bool:
    """A dataset aggregate keyed by (kind, layer, index): its nodes have no position."""
    agg = graph.metadata.aggregate
    return agg is not None and agg.get("position") == "free"


def _node_lines(node: Node, *, positions: bool = True) -> list[str]:
    kind, t, i = node.kind, node.position, node.index
    token = node.attrs.get("token_str")
    token = token if isinstance(token, str) else None
    label = _shorten_words(_show_text(node.label), _MAX_LABEL_CHARS) if node.label else ""
    text = token if token is not None else (node.label or None)
    quoted = f'"{_shorten(_show_text(text), _MAX_TOKEN_CHARS)}"' if text is not None else f"token {i}"
    at = f" @{t}" if positions else ""
    if kind == "embedding":
        return [quoted, f"emb{at}"]
    if kind == "logit":
        return [f"logit {quoted}"] + ([at.strip()] if at else [])
    head = node_caption(node, position=positions)
    if kind in ACTIVATION_KINDS:
        head += f" a={node.activation:.3g}"
    return [head] + ([label] if label and not is_structural_label(node) else [])


def node_caption(node: Node, *, position: bool = True) -> str:
    """The id-derived caption of a non-token node: ``F17 L1 @4``, ``L1H3 @4``, ``Err L1 @4`` ...
    (``position=False``: without the ``@4``, for position-free aggregates)."""
    if not position:
        return node_caption(node).rsplit(" @", 1)[0]
    kind, layer, t, i = node.kind, node.layer, node.position, node.index
    captions = {
        "positional": f"pos @{t}",
        "feature": f"F{i} L{layer} @{t}",
        "error": f"Err L{layer} @{t}",
        "neuron": f"N{i} L{layer} @{t}",
        "attention_head": f"L{layer}H{i} @{t}",
        "mlp": f"MLP L{layer} @{t}",
        "bias": f"{_BIAS_NAMES.get(i, str(i))} bias L{layer} @{t}",
        "remainder": f"rest ({_REMAINDER_NAMES.get(i, str(i))}) L{layer} @{t}",
        "target": f"target {i} @{t}",
        "embedding": f"emb {i} @{t}",
        "logit": f"logit {i} @{t}",
    }
    return captions[kind]


def is_structural_label(node: Node) -> bool:
    """True when the node's label only restates its id (e.g. ``"F17 L1@4"``), so adds nothing.

    Compared with :func:`node_caption` ignoring case, spaces and punctuation.
    """
    def norm(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    return not node.label or norm(node.label) == norm(node_caption(node))


def _tooltip(node: Node) -> str:
    parts = [str(node.id), f"activation {node.activation:.6g}"]
    if node.pre_activation is not None:
        parts.append(f"pre-activation {node.pre_activation:.6g}")
    influence = node.attrs.get("influence")
    if _is_number(influence):
        parts.append(f"influence {float(influence):.4g}")
    if not is_structural_label(node):
        parts.append(_show_text(node.label))
    return "; ".join(parts)


def _count(n: int, what: str) -> str:
    """``1 node``, ``2 nodes``, ``1,751 nodes``."""
    return f"{n} {what}" if n == 1 else f"{n:,} {what}s"


def _title_lines(graph: AttributionGraph, title: str | None, n_nodes: int, n_edges: int,
                 score_name: str | None, n_hidden: int = 0, n_unreachable: int = 0, *,
                 totals: tuple[int, int] | None = None, n_merged: int = 0,
                 hidden_share: float | None = None) -> list[str]:
    """The title, and what is left out: counted against ``totals`` (the graph as given, before
    unreachable nodes were hidden and supernodes merged); ``hidden_share``: the share of the
    total influence held by the nodes the budget left out."""
    if title is None:
        prompt = graph.metadata.prompt
        title = f'Attribution graph: "{_shorten(_show_text(prompt), 80)}"' if prompt is not None else \
            "Attribution graph"
    lines = [_show_text(title)]
    total_nodes, total_edges = totals if totals is not None else (graph.n_nodes, graph.n_edges)
    left_nodes, left_edges = total_nodes - n_nodes, total_edges - n_edges
    if left_nodes or left_edges:
        note = (f"showing {n_nodes:,} of {_count(total_nodes, 'node')} and {n_edges:,} of "
                f"{_count(total_edges, 'edge')}")
        reasons = []
        if n_hidden:
            reasons.append(f"{_count(n_hidden, 'remainder node')} (pruned-away contributions) not drawn")
        if n_merged:
            reasons.append(f"{_count(n_merged, 'node')} drawn inside supernode boxes")
        weaker = left_nodes - n_hidden - n_unreachable - n_merged
        if weaker > 0:
            held = f"; they hold {_percent(hidden_share)} of the influence" if hidden_share is not None else ""
            reasons.append(f"{_count(weaker, 'weaker node')} left out (ranked by {score_name}{held})")
        if left_edges:
            reasons.append(f"{_count(left_edges, 'edge')} left out")
        # one reason a line: a long title would set the diagram's width
        lines += [f"{note}:", *reasons] if reasons else [note]
    if n_unreachable:
        lines.append(f"{_count(n_unreachable, 'node')} with no path to a target not drawn")
    return lines


def _percent(share: float) -> str:
    """``0.643`` -> ``64%``; below 1% (but not zero) ``<1%``, above 99% (but not all) ``>99%``."""
    if 0 < share < 0.01:
        return "<1%"
    if 0.99 < share < 1:
        return ">99%"
    return f"{share:.0%}"


def _legend(dot: graphviz.Digraph, kinds: Iterable[str], max_abs: float = 0.0, *, linearised: bool = False) -> None:
    present = sorted(set(kinds), key=_KIND_ORDER.__getitem__)
    names = [f"legend {kind}" for kind in present] + ["legend positive", "legend negative"]
    names += ["legend linearised"] if linearised else []
    with _subgraph(dot, "cluster_legend") as legend:
        legend.attr(label="legend", fontsize="10", style="rounded", color="#bbbbbb", rank="same")
        for kind in present:
            legend.node(f"legend {kind}", label=_text([kind]), fillcolor=KIND_COLORS[kind])
        for sign, color in (("positive", POSITIVE_COLOR), ("negative", NEGATIVE_COLOR)):
            legend.node(f"legend {sign}", label=_text([f"→ {sign}"]), shape="plaintext", style="", fontcolor=color)
        if linearised:
            legend.node("legend linearised", label=_text(["⇢ q / k: query / key edge (linearised)"]),
                        shape="plaintext", style="", fontcolor="#666666")
        for u, v in zip(names, names[1:], strict=False):
            legend.edge(u, v, style="invis")
    if max_abs > 0:
        # the edge width scale: pen widths of three weights, drawn as short edges
        with _subgraph(dot, "cluster_widths") as widths:
            widths.attr(label="edge width = |weight|", fontsize="10", style="rounded", color="#bbbbbb")
            for i, frac in enumerate((1.0, 0.5, 0.1)):
                width = _MIN_PEN + (_MAX_PEN - _MIN_PEN) * frac
                a, b = f"width {i} a", f"width {i} b"
                widths.node(a, shape="point", width="0.02", style="", color="#ffffff")
                widths.node(b, label=_text([f"{frac * max_abs:.3g}"]), shape="plaintext", style="", fontsize="9")
                widths.edge(a, b, penwidth=f"{width:.2f}", color="#555555", arrowsize="0.3", minlen="1")


def _axis_label(layer: int, sub: int, n_layers: int | None) -> str:
    if layer < 0:
        return "Emb"
    if n_layers is not None and layer >= n_layers:
        return "Out"
    return f"L{layer}" + (" attn" if sub == 0 else "")


def _n_layers(graph: AttributionGraph) -> int | None:
    return graph.model_n_layers


def _with_display_attrs(graph: AttributionGraph, labels: Mapping[tuple[int, int], str] | None,
                        influence: Mapping[NodeId, float] | None) -> AttributionGraph:
    """A shallow copy whose nodes carry the description labels and influence to draw."""
    if not labels and not influence:
        return graph
    nodes = []
    for node in graph.nodes:
        label = node.label
        attrs: NodeAttrs = node.attrs
        if labels and node.kind in ACTIVATION_KINDS and "supernode" not in attrs:
            text = labels.get((node.layer, node.index))
            if text:
                label = str(text)
        if influence and node.id in influence and "supernode" not in attrs:
            attrs = {**attrs, "influence": float(influence[node.id])}
        nodes.append(Node(node.id, node.activation, node.pre_activation, node.constant, label, attrs))
    return AttributionGraph(nodes, graph.edge_target, graph.edge_source, graph.edge_weight,
                            targets=list(graph.targets), metadata=graph.metadata,
                            linearised_edges=graph.linearised_edges)


def dot_quote(text: str) -> str:
    r"""``text`` as a DOT double-quoted string: backslashes and quotes escaped, newlines as ``\n``.

    >>> print(dot_quote('say "hi" \\ bye'))
    "say \"hi\" \\ bye"
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\r", "").replace("\n", "\\n")
    return f'"{escaped}"'


def _text(lines: Iterable[str]) -> str:
    """A DOT label or tooltip of several lines, for the ``graphviz`` package: each line's
    backslashes and ``<...>`` made literal (``graphviz.escape``; the package quotes the value),
    joined by DOT's centred line break."""
    return "\\n".join(graphviz.escape(line) for line in lines)


def _show_text(text: Any) -> str:
    """Make whitespace and control characters in a token visible: ``\\n``, ``\\t``, ``\\x00``."""
    out = []
    for ch in str(text):
        if ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shorten_words(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters at a word boundary (``…`` marks the cut); a single word
    longer than half the limit is cut inside it."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + "…"


@contextmanager
def _subgraph(dot: graphviz.Digraph, name: str) -> Iterator[graphviz.Digraph]:
    """``dot.subgraph(name=name)``: graphviz returns a context manager whenever no graph is given."""
    context = dot.subgraph(name=name)
    assert context is not None
    with context as sub:
        yield sub


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
