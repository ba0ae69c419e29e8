"""Export to the attribution-graph JSON that circuit-tracer writes and Neuronpedia shows.

The layout follows circuit-tracer's ``create_graph_files`` (``frontend/graph_models.py``)
and Neuronpedia's published graph schema (vendored in ``schemas/neuronpedia/``): top-level
``metadata``, ``qParams``, ``nodes`` and ``links``.

**Only the four node types the viewers know.**  circuit-tracer's frontend and Neuronpedia
handle ``cross layer transcoder``, ``mlp reconstruction error``, ``embedding`` and
``logit`` nodes; Neuronpedia computes its replacement and completeness scores from the file
by sorting nodes in that type order, so any other ``feature_type`` would be sorted after
the logits and silently break the scores.  Every circuitgraph kind is therefore written as
one of the four, with the same roles our own scores give them
(:data:`circuitgraph.queries.scores.ERROR_KINDS` / ``INPUT_KINDS``):

================  ============================  ==========================  =====================
our kind          ``feature_type``               ``node_id``                 ``feature``
================  ============================  ==========================  =====================
feature           ``cross layer transcoder``     ``{L}_{f}_{t}``             cantor(L, f)
neuron            ``cross layer transcoder``     ``{L}_N{i}_{t}``            cantor(L, i)
error             ``mlp reconstruction error``   ``{L}_-1_{t}``              -1
mlp               ``mlp reconstruction error``   ``{L}_M_{t}``               -2
bias              ``embedding`` (an input)       ``{L}_B{b}_{t}``            -(3 + b)
remainder         ``mlp reconstruction error``   ``{L}_R{i}_{t}``            -(8 + i)
attention_head    ``mlp reconstruction error``   ``{L}_H{h}_{t}``            -(16 + h)
embedding         ``embedding``                  ``E_{tok}_{t}``             t
positional        ``embedding``                  ``E_P_{t}``                 -2
logit             ``logit``                      ``{n_layers+1}_{tok}_{t}``  tok
target            ``logit``                      ``{n_layers+1}_{V+k}_{t}``  V + k
================  ============================  ==========================  =====================

``L`` is the block index (``"E"`` for embeddings), ``t`` the position (``ctx_idx``), ``V``
the vocabulary size and ``k`` the target's number in the spec: a custom target (a logit
difference, a direction, a feature or neuron target) is written the way circuit-tracer
writes its custom targets, as an output node on the logit row (layer ``n_layers + 1``)
with the virtual token index ``V + k``, its label in ``clerp`` as ``Output "<label>"
(p=<weight>)`` and its target weight as ``token_prob`` (the weight the viewers' scores
give it; a logit's ``clerp`` shows its probability).  The viewers key a node by
``(layer, feature, ctx_idx)`` and merge nodes that share it, so the codes above are
distinct within every (layer, position); the exporter checks it.

**influence** is circuit-tracer's cumulative influence (``prune_graph``'s
``cumulative_scores``): with ``A`` the row-normalised ``|adjacency|`` of the *unpruned*
graph and ``w`` the target weights, ``influence = w (A + A^2 + ...)``; nodes sorted by it,
largest first, get the running share of the total.  The viewer's pruning slider keeps the
nodes whose value is at most its threshold.  Pass the unpruned graph as ``full_graph``
(the pipeline does); without it the values are computed on the graph given.  Every node
carries a number (circuit-tracer leaves logits at ``null``; here they get theirs, which is
near 1 since targets feed nothing).

**Remainder nodes** (what pruning left out, which keep our own sums exact) are left out by
default, with their edges, as circuit-tracer's files have no such nodes; the kept nodes and
links are then exactly circuit-tracer's pruned file.  ``keep_remainders=True`` writes them
as error-like nodes, which lowers the completeness score the viewer computes (their inputs
count as unexplained) -- see docs/export.md.

:func:`neuronpedia_scores` recomputes Neuronpedia's replacement and completeness scores
from a document exactly as its graph page does.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata as importlib_metadata
from typing import TYPE_CHECKING, Any

import numpy as np

from circuitgraph._io import atomic_write_text
from circuitgraph.errors import ExportError
from circuitgraph.export.dot import is_structural_label
from circuitgraph.export.json_graph import _finite
from circuitgraph.graph.edges import cumulative_share
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import BIAS_INDEX, REMAINDER_INDEX, Node, NodeId
from circuitgraph.queries._sparse import weighted_influence
from circuitgraph.spec.kinds import ACTIVATION_KINDS, OUTPUT_KINDS, TOKEN_KINDS

if TYPE_CHECKING:
    from circuitgraph.features.summary import FeatureDashboards

__all__ = [
    "FEATURE_TYPES",
    "VIEWER_FEATURE_TYPES",
    "attach_qk",
    "graph_to_neuronpedia",
    "neuronpedia_node_id",
    "neuronpedia_feature_code",
    "neuronpedia_scores",
    "cumulative_influence",
    "prompt_token_strings",
    "n_layers_of",
]

#: the feature types circuit-tracer's frontend and Neuronpedia know (Neuronpedia's score order)
VIEWER_FEATURE_TYPES = ("cross layer transcoder", "mlp reconstruction error", "embedding", "logit")

#: our node kind -> the viewer's ``feature_type`` (see the module table)
FEATURE_TYPES: dict[str, str] = {
    "feature": "cross layer transcoder",
    "neuron": "cross layer transcoder",
    "error": "mlp reconstruction error",
    "mlp": "mlp reconstruction error",
    "remainder": "mlp reconstruction error",
    "attention_head": "mlp reconstruction error",
    "embedding": "embedding",
    "positional": "embedding",
    "bias": "embedding",
    "logit": "logit",
    "target": "logit",
}
_BIAS_NAMES = {v: k for k, v in BIAS_INDEX.items()}
_REMAINDER_NAMES = {v: k for k, v in REMAINDER_INDEX.items()}

SCHEMA_VERSION = 1
DEFAULT_MAX_LINKS = 5_000_000


def graph_to_neuronpedia(
    graph: AttributionGraph,
    path: str | os.PathLike[str] | None = None,
    *,
    full_graph: AttributionGraph | None = None,
    slug: str = "circuitgraph",
    scan: str | Sequence[str] | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    keep_remainders: bool = False,
    max_links: int | None = DEFAULT_MAX_LINKS,
    qk: Sequence[Mapping[str, Any]] = (),
    dashboards: FeatureDashboards | None = None,
) -> dict[str, Any]:
    """The graph in circuit-tracer's / Neuronpedia's attribution-graph JSON format.

    Args:
        graph: the graph to write (usually the pruned one).
        path: write the JSON there (atomically) if given.
        full_graph: the unpruned graph the ``influence`` values come from (circuit-tracer
            computes them before pruning); default: ``graph`` itself.
        slug: the graph's name in the viewer.
        scan: the Neuronpedia model id (e.g. ``"gpt2-small"``), or a list of transcoder
            ids (then ``scan`` becomes ``"custom-<hash>"`` and the list goes to
            ``transcoder_list``, as circuit-tracer does).  Default: the dictionary's own
            ``scan`` (``graph.metadata["transcoders"]["scan"]``, from a circuit-tracer
            ``config.yaml``), else the model name in ``graph.metadata["model"]``.
        node_threshold, edge_threshold: recorded in ``metadata`` (``node_threshold`` is the
            viewer's default pruning threshold) and ``pruning_settings``.
        keep_remainders: also write the ``remainder`` nodes (error-like) and their edges.
        max_links: refuse graphs with more edges; ``None`` disables the check.
        qk: results of the ``qk`` query (``QKResult.to_dict()``): each head's top pairs and
            marginals go, as ``qk_tracing_results``, onto the head's node at the query
            position (added, without links, when the graph has none); see :func:`attach_qk`.
        dashboards: a features folder (:class:`~circuitgraph.features.FeatureDashboards`, or
            anything with ``dashboard(layer, index)``): each feature node it has gets its
            dashboard as ``dashboard`` (top examples, density, quantiles, output and input
            tokens; see docs/features.md), so a viewer shows it without a server, and its
            ``labels.csv`` label as ``clerp`` when the node has none.

    Returns:
        The document as a dict (``metadata``, ``qParams``, ``nodes``, ``links``).
    """
    if max_links is not None and graph.n_edges > max_links:
        raise ExportError(
            f"the graph has {graph.n_edges:,} edges, more than max_links={max_links:,} for the Neuronpedia "
            "viewer; prune it first (`prune: {node_threshold: 0.8, edge_threshold: 0.98}` in the spec)"
        )
    scan_id, transcoder_list = _scan(graph, scan)
    n_layers = n_layers_of(graph)
    d_vocab = _vocab_size(graph)
    tokens = prompt_token_strings(graph)
    influence = cumulative_influence(full_graph if full_graph is not None else graph)
    targets = {t: (k, float(w)) for k, (t, w) in enumerate(graph.targets)}

    # links: coalesced (the viewers assign, not add, a repeated source -> target pair)
    keep = np.array([keep_remainders or n.kind != "remainder" for n in graph.nodes], dtype=bool)
    sel = keep[graph.edge_source] & keep[graph.edge_target]
    pairs: dict[tuple[int, int], float] = {}
    for s, t, w in zip(graph.edge_source[sel].tolist(), graph.edge_target[sel].tolist(),
                       graph.edge_weight[sel].astype(np.float64).tolist(), strict=False):
        pairs[(s, t)] = pairs.get((s, t), 0.0) + w
    linked = set()
    for s, t in pairs:
        linked.update((s, t))

    records: dict[int, dict[str, Any]] = {}
    for row, node in enumerate(graph.nodes):
        if not keep[row]:
            continue
        # circuit-tracer writes only nodes with a kept link, plus every token and logit
        if row not in linked and node.kind not in TOKEN_KINDS and node.id not in targets:
            continue
        records[row] = _node_record(node, n_layers, d_vocab, tokens, influence.get(node.id, 1.0),
                                    targets.get(node.id))
        if dashboards is not None and node.kind == "feature":
            board = dashboards.dashboard(node.layer, node.index)
            if board is not None:
                records[row]["dashboard"] = board
                if not records[row]["clerp"] and board.get("label"):
                    records[row]["clerp"] = board["label"]
    if qk:
        ids = {str(graph.nodes[row].id): rec["node_id"] for row, rec in records.items()}
        extra = attach_qk(list(records.values()), ids, qk, n_layers, d_vocab, tokens, influence)
        for k, rec in enumerate(extra):
            records[-1 - k] = rec
    _check_distinct(records.values())
    links = [
        {"source": records[s]["node_id"], "target": records[t]["node_id"], "weight": _finite(w, "edge weight")}
        for (s, t), w in pairs.items()
    ]

    prompt = graph.metadata.prompt
    if prompt is None:
        prompt = "".join(tokens)
    info: dict[str, Any] = {
        "description": f"Exact attribution graph exported by circuitgraph ({len(records)} nodes, "
                       f"{len(links)} links).",
        "generator": {"name": "circuitgraph", "version": _package_version()},
    }
    source_urls = graph.metadata.source_urls
    if source_urls is not None:
        info["source_urls"] = source_urls
    doc = {
        "metadata": {
            "slug": slug,
            "scan": scan_id,
            "transcoder_list": transcoder_list,
            "prompt_tokens": tokens,
            "prompt": prompt,
            "node_threshold": float(node_threshold),
            "schema_version": SCHEMA_VERSION,
            "info": info,
            "pruning_settings": {"node_threshold": float(node_threshold), "edge_threshold": float(edge_threshold)},
        },
        "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""},
        "nodes": list(records.values()),
        "links": links,
    }
    if graph.linearised_edges is not None:
        # the linearised query / key edges into heads (graph.head_inputs), apart from "links": a
        # viewer assigns a repeated source -> target pair, and these are not direct effects
        le = graph.linearised_edges
        doc["linearised_links"] = [
            {"source": records[s]["node_id"], "target": records[t]["node_id"], "weight": _finite(w, "edge weight"),
             "kind": k, "linearised": True}
            for s, t, w, k in zip(le.source.tolist(), le.target.tolist(), le.weight.tolist(),
                                  le.kind_names().tolist(), strict=True) if s in records and t in records]
    if path is not None:
        try:
            text = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
        except (TypeError, ValueError) as exc:
            raise ExportError(f"the Neuronpedia document cannot be written as JSON: {exc}") from None
        atomic_write_text(path, text)
    return doc


# --------------------------------------------------------------------------- node records
def neuronpedia_feature_code(node_id: NodeId, d_vocab: int | None = None) -> int:
    """The viewer's ``feature`` number of a node (see the module table); ``d_vocab`` is needed
    for ``target`` nodes."""
    kind, layer, t, i = node_id.kind, node_id.layer, node_id.position, node_id.index
    if kind in ACTIVATION_KINDS:
        return _cantor(max(layer, 0), i)
    if kind == "embedding":
        return t
    if kind == "logit":
        return i
    if kind == "target":
        if d_vocab is None:
            raise ExportError("a target node's feature code needs the vocabulary size")
        return d_vocab + i
    fixed = {"error": -1, "mlp": -2, "positional": -2}
    if kind in fixed:
        return fixed[kind]
    if kind == "bias":
        return -(3 + i)
    if kind == "remainder":
        return -(8 + i)
    if kind == "attention_head":
        return -(16 + i)
    raise ExportError(f"no Neuronpedia feature code for node kind {kind!r}")


def neuronpedia_node_id(node: Node | NodeId, n_layers: int, d_vocab: int | None = None) -> tuple[str, str]:
    """``(node_id, jsNodeId)`` of a node in the viewer's conventions (see the module table)."""
    nid = node.id if isinstance(node, Node) else node
    kind, t, i = nid.kind, nid.position, nid.index
    layer = _layer_str(nid, n_layers)
    if kind == "feature":
        return f"{layer}_{i}_{t}", f"{layer}_{i}-0"
    if kind == "neuron":
        return f"{layer}_N{i}_{t}", f"{layer}_N{i}-0"
    if kind == "error":
        return f"{layer}_-1_{t}", f"{layer}_-1-{t}"
    if kind == "embedding":
        return f"E_{i}_{t}", f"E_{i}-{t}"
    if kind == "positional":
        return f"E_P_{t}", f"E_P-{t}"
    if kind in OUTPUT_KINDS:
        v = neuronpedia_feature_code(nid, d_vocab)
        return f"{layer}_{v}_{t}", f"L_{v}-{t}"
    tag = {"mlp": "M", "bias": f"B{i}", "remainder": f"R{i}", "attention_head": f"H{i}"}[kind]
    return f"{layer}_{tag}_{t}", f"{layer}_{tag}-{t}"


def _node_record(node: Node, n_layers: int, d_vocab: int | None, tokens: list[str], influence: float,
                 target: tuple[int, float] | None) -> dict[str, Any]:
    kind = node.kind
    out_id = node.id
    if target is not None and kind not in OUTPUT_KINDS:
        # a feature/neuron target: written on the logit row as a custom target
        out_id = NodeId("target", node.layer, node.position, target[0])
    node_id, js_node_id = neuronpedia_node_id(out_id, n_layers, d_vocab)
    out_kind = out_id.kind
    token_prob = 0.0
    activation: float | None = None
    if out_kind in ACTIVATION_KINDS:
        activation = _finite(node.activation, f"node {node.id} activation")
    if out_kind in OUTPUT_KINDS:
        # token_prob is what the viewers weight the output by (their scores): the target weight;
        # the clerp shows the token's probability when it is known
        token_prob = target[1] if target is not None else (_logit_prob(node) or 0.0)
        shown = _logit_prob(node) if out_kind == "logit" and _logit_prob(node) is not None else token_prob
        clerp = f'Output "{_target_label(node, tokens)}" (p={shown:.3f})'
    elif kind in ("feature", "error", "embedding"):
        # circuit-tracer leaves these empty (the viewer fills in its own text)
        clerp = "" if is_structural_label(node) or kind != "feature" else node.label
    else:
        clerp = node.label if node.label and not is_structural_label(node) else _default_clerp(node, tokens)
    return {
        "node_id": node_id,
        "feature": int(neuronpedia_feature_code(out_id, d_vocab)),
        "layer": _layer_str(out_id, n_layers),
        "ctx_idx": int(node.position),
        "feature_type": FEATURE_TYPES[out_kind],
        "token_prob": float(token_prob),
        "is_target_logit": target is not None,
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "jsNodeId": js_node_id,
        "clerp": clerp,
        "influence": float(influence),
        "activation": activation,
    }


def _check_distinct(records: Iterable[dict[str, Any]]) -> None:
    seen: dict[tuple[str, int, int], str] = {}
    ids: set[str] = set()
    for r in records:
        key = (r["layer"], r["feature"], r["ctx_idx"])
        if key in seen or r["node_id"] in ids:  # the code scheme is injective
            raise ExportError(
                f"nodes {seen.get(key)!r} and {r['node_id']!r} share the viewer key (layer, feature, ctx_idx) "
                f"= {key}; please report this"
            )
        seen[key] = r["node_id"]
        ids.add(r["node_id"])


def _logit_prob(node: Node) -> float | None:
    # token_prob: a key of no circuitgraph graph (NODE_ATTRS), kept from a graph file another tool wrote
    stored: dict[str, object] = dict(node.attrs)
    for key in ("token_prob", "probability"):
        if key in stored:
            return _finite(stored[key], f"node {node.id} attrs[{key!r}]")
    return None


def _target_label(node: Node, tokens: list[str]) -> str:
    text = node.attrs.get("token_str")
    if isinstance(text, str):
        return text.replace('"', "'")
    if node.label:
        return node.label.replace('"', "'")
    return _default_clerp(node, tokens).replace('"', "'")


def _default_clerp(node: Node, tokens: list[str]) -> str:
    kind, layer, i = node.kind, node.layer, node.index
    if kind == "neuron":
        return f"neuron L{layer} #{i}"
    if kind == "attention_head":
        return f"attention head L{layer}H{i}"
    if kind == "mlp":
        return f"MLP L{layer} output"
    if kind == "bias":
        return f"{_BIAS_NAMES.get(i, str(i))} bias L{layer}"
    if kind == "remainder":
        return f"remainder ({_REMAINDER_NAMES.get(i, str(i))}) L{layer}"
    if kind == "positional":
        return f"positional embedding @{node.position}"
    if kind == "target":
        return f"target {i}"
    if kind == "feature":
        return f"F{i} L{layer}"
    if kind == "embedding":
        return _token_str(node, tokens)
    return ""


def _layer_str(nid: NodeId, n_layers: int) -> str:
    if nid.kind in OUTPUT_KINDS:
        return str(n_layers + 1)
    if nid.layer < 0:
        return "E"
    return str(nid.layer)


def _cantor(x: int, y: int) -> int:
    """Cantor pairing, circuit-tracer's ``feature`` number of (layer, feature index)."""
    return (x + y) * (x + y + 1) // 2 + y


# --------------------------------------------------------------------------- QK tracing
def attach_qk(records: list[dict[str, Any]], ids: Mapping[str, str], results: Sequence[Mapping[str, Any]],
              n_layers: int, d_vocab: int | None, tokens: list[str],
              influence: Mapping[NodeId, float] | None = None) -> list[dict[str, Any]]:
    """Put each head's QK decomposition on its node, in the form Neuronpedia's QK-tracing graphs use::

        "qk_tracing_results": {
            "pair_wise_contributors": [[q_node_id, k_node_id, value], ...],
            "top_q_marginal_contributors": [[q_node_id, value], ...],
            "top_k_marginal_contributors": [[k_node_id, value], ...]}

    ``records`` are the document's node records and ``ids`` maps our node ids (strings) to
    their ``node_id``.  The head's node is ``attention_head/layer/query_position/head``; a record
    is made for it when the file has none (e.g. with frozen attention) and returned (the caller
    adds it).  Contributors that are not nodes of the file (pruned away) are left out, so every
    id refers to a node of the file.
    """
    by_np_id = {rec["node_id"]: rec for rec in records}
    added: list[dict[str, Any]] = []
    for result in results:
        for head in result.get("heads", ()):
            head_id = NodeId("attention_head", int(head["layer"]), int(head["query_position"]), int(head["head"]))
            np_id, _ = neuronpedia_node_id(head_id, n_layers, d_vocab)
            record = by_np_id.get(np_id)
            if record is None:
                node = Node(head_id, 1.0, label=f"attention head L{head_id.layer}H{head_id.index} "
                                                f"(QK to position {head['key_position']})")
                record = _node_record(node, n_layers, d_vocab, tokens, (influence or {}).get(head_id, 1.0), None)
                added.append(record)
                by_np_id[np_id] = record
            pairs = [[ids[p["query_node"]], ids[p["key_node"]], _finite(p["value"], "qk pair value")]
                     for p in head.get("pairs", ()) if p["query_node"] in ids and p["key_node"] in ids]
            record["qk_tracing_results"] = {
                "pair_wise_contributors": pairs,
                "top_q_marginal_contributors": _marginals(head.get("query_marginals", ()), ids),
                "top_k_marginal_contributors": _marginals(head.get("key_marginals", ()), ids),
            }
    return added


def _marginals(items: Sequence[Mapping[str, Any]], ids: Mapping[str, str]) -> list[list[Any]]:
    return [[ids[m["node"]], _finite(m["value"], "qk marginal value")] for m in items if m["node"] in ids]


# --------------------------------------------------------------------------- influence
def cumulative_influence(graph: AttributionGraph) -> dict[NodeId, float]:
    """circuit-tracer's cumulative influence of every node (``prune_graph``'s
    ``cumulative_scores``; see the module docstring).  Empty when the graph has no targets."""
    if not graph.targets or graph.n_nodes == 0:
        return {}

    scores = cumulative_share(weighted_influence(graph))
    return {node.id: float(scores[r]) for r, node in enumerate(graph.nodes)}


# --------------------------------------------------------------------------- Neuronpedia's scores
def neuronpedia_scores(doc: Mapping[str, Any], pinned_ids: Sequence[str] = ()) -> dict[str, float]:
    """Neuronpedia's replacement and completeness scores of a graph document, computed as its
    graph page computes them (``score.worker.ts`` of the Neuronpedia webapp).

    Nodes are sorted by (type order ``cross layer transcoder, lorsa, mlp reconstruction
    error, lorsa error, embedding, logit``, unknown types last; layer with ``"E"`` as 0;
    ``ctx_idx``; ``feature``), the adjacency is rebuilt from the links (a repeated pair
    overwrites), the last ``n_logits`` rows are weighted by the logit nodes' ``token_prob``,
    and circuit-tracer's ``compute_graph_scores`` is applied.  With ``pinned_ids``,
    unpinned transcoder features are merged into the error node of their (layer, position)
    first.  Returns ``{"replacement_score", "completeness_score"}`` (-1 when the graph has
    ``lorsa`` nodes, which Neuronpedia does not score).
    """
    nodes = list(doc["nodes"])
    if any(n.get("feature_type") in ("lorsa", "lorsa error") for n in nodes):
        return {"replacement_score": -1.0, "completeness_score": -1.0}
    order = ["cross layer transcoder", "lorsa", "mlp reconstruction error", "lorsa error", "embedding", "logit"]

    def sort_key(n: Mapping[str, Any]) -> tuple[float, ...]:
        ft = n.get("feature_type")
        priority = order.index(ft) if ft in order else len(order)
        layer = n.get("layer")
        if layer == "E":
            layer_num = 0.0
        else:
            try:
                layer_num = float(int(str(layer).strip()))
            except ValueError:
                layer_num = 999.0
        return (priority, layer_num, n.get("ctx_idx") or 0, n.get("feature") or 0)

    nodes = sorted(nodes, key=sort_key)  # stable, like Array.prototype.sort
    index = {n["node_id"]: i for i, n in enumerate(nodes)}
    size = len(nodes)
    adj = np.zeros((size, size), dtype=np.float64)
    for link in doc["links"]:
        s, t = index.get(link["source"]), index.get(link["target"])
        if s is not None and t is not None:
            adj[t, s] = float(link["weight"])

    types = [n.get("feature_type") for n in nodes]
    if pinned_ids:
        pinned = set(pinned_ids)
        error_at = {(n["layer"], n["ctx_idx"]): i for i, n in enumerate(nodes)
                    if n.get("feature_type") == "mlp reconstruction error"}
        for i, n in enumerate(nodes):
            if n.get("feature_type") != "cross layer transcoder" or n["node_id"] in pinned:
                continue
            e = error_at.get((n["layer"], n["ctx_idx"]))
            if e is not None:
                adj[:, e] += adj[:, i]
            adj[i, :] = 0.0
            adj[:, i] = 0.0

    n_features = types.count("cross layer transcoder")
    n_errors = types.count("mlp reconstruction error")
    n_tokens = types.count("embedding")
    probs = [float(n.get("token_prob") or 0.0) for n in nodes if n.get("feature_type") == "logit"]
    error_start, error_end = n_features, n_features + n_errors
    token_end = error_end + n_tokens
    logit_weights = np.zeros(size)
    if probs:
        logit_weights[size - len(probs):] = probs

    absolute = np.abs(adj)
    normalised = absolute / np.maximum(absolute.sum(axis=1, keepdims=True), 1e-10)
    current = logit_weights @ normalised
    influence = current.copy()
    for _ in range(1000):
        if not np.any(current):
            break
        current = current @ normalised
        influence += current
    else:
        raise ExportError("Neuronpedia's influence computation did not converge after 1000 iterations")
    token_influence = influence[error_end:token_end].sum()
    error_influence = influence[error_start:error_end].sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        replacement = token_influence / (token_influence + error_influence)
        non_error = 1.0 - normalised[:, error_start:error_end].sum(axis=1)
        output_influence = influence + logit_weights
        completeness = (non_error * output_influence).sum() / output_influence.sum()
    return {
        "replacement_score": 0.0 if math.isnan(replacement) else float(replacement),
        "completeness_score": 0.0 if math.isnan(completeness) else float(completeness),
    }


# --------------------------------------------------------------------------- graph-level helpers
def n_layers_of(graph: AttributionGraph) -> int:
    """The model's number of blocks: ``metadata["model"]["n_layers"]``, else the logit layer,
    else one more than the deepest block seen."""
    if graph.model_n_layers is not None:
        return graph.model_n_layers
    logit_layers = [n.layer for n in graph.nodes if n.kind == "logit"]
    if logit_layers:
        return max(logit_layers)
    return max((n.layer for n in graph.nodes if n.kind != "target"), default=-1) + 1


def _vocab_size(graph: AttributionGraph) -> int:
    """``d_vocab`` from the model metadata, else one more than the largest token id seen."""
    if graph.metadata.d_vocab is not None:
        return graph.metadata.d_vocab
    ids = [n.index for n in graph.nodes if n.kind in TOKEN_KINDS]
    ids += [t for t in graph.metadata.prompt_tokens or [] if isinstance(t, int)]
    return max(ids, default=-1) + 1


def prompt_token_strings(graph: AttributionGraph) -> list[str]:
    """The prompt's tokens as strings.

    Taken from ``metadata["prompt_token_strs"]`` (or ``metadata["prompt_tokens"]`` when it
    holds strings); otherwise rebuilt from the embedding nodes' ``attrs["token_str"]`` or
    labels, one entry per position (empty where no embedding node says).
    """
    meta = graph.metadata
    candidates: tuple[list[Any] | None, ...] = (meta.prompt_token_strs, meta.prompt_str_tokens, meta.prompt_tokens)
    for value in candidates:
        if value and all(isinstance(v, str) for v in value):
            return [str(v) for v in value]
    n_pos = max((n.position for n in graph.nodes), default=-1) + 1
    tokens = [""] * n_pos
    for node in graph.nodes:
        if node.kind == "embedding" and 0 <= node.position < n_pos:
            tokens[node.position] = str(node.attrs.get("token_str") or node.label or tokens[node.position])
    return tokens


def _token_str(node: Node, tokens: list[str]) -> str:
    text = node.attrs.get("token_str")
    if isinstance(text, str):
        return text
    if node.label:
        return node.label
    if node.kind == "embedding" and 0 <= node.position < len(tokens):
        return tokens[node.position]
    return str(node.index)


def _scan(graph: AttributionGraph, scan: str | Sequence[str] | None) -> tuple[str, list[str]]:
    if isinstance(scan, str):
        return scan, []
    if scan is not None:
        transcoders = [str(s) for s in scan]
        digest = hashlib.sha256("-".join(transcoders).encode("utf-8")).hexdigest()[:12]
        return f"custom-{digest}", transcoders
    # the dictionary's own scan (a circuit-tracer config.yaml `scan:`, a string or a list of
    # transcoder ids), as circuit-tracer's create_graph_files uses it
    tc = graph.metadata.transcoders
    tc_scan = tc.get("scan") if tc is not None else None
    if isinstance(tc_scan, str) and tc_scan:
        return tc_scan, []
    if isinstance(tc_scan, list) and tc_scan:
        return _scan(graph, [str(s) for s in tc_scan])
    name = graph.metadata.model_name
    if name is not None:
        return name, []
    raise ExportError(
        "the Neuronpedia format needs a scan (the model id on Neuronpedia) and graph.metadata['model'] "
        "names none: pass scan='gpt2-small' (for example)"
    )


def _package_version() -> str:
    try:
        return importlib_metadata.version("circuitgraph-lm")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
