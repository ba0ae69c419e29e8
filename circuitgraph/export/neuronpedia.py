"""Export to the attribution-graph JSON that circuit-tracer writes and Neuronpedia shows.

The layout follows circuit-tracer's ``create_graph_files`` (``frontend/graph_models.py``)
and Neuronpedia's graph schema field for field: top-level ``metadata``, ``qParams``,
``nodes`` and ``links``.  Node ids use circuit-tracer's conventions:

==========================  ===========================  ==================  ================  ===============
our kind                    ``feature_type``             ``node_id``         ``jsNodeId``      ``feature``
==========================  ===========================  ==================  ================  ===============
feature                     ``cross layer transcoder``   ``{L}_{f}_{t}``     ``{L}_{f}-0``     cantor(L, f)
error                       ``mlp reconstruction error`` ``{L}_-1_{t}``      ``{L}_-1-{t}``    -1
embedding                   ``embedding``                ``E_{tok}_{t}``     ``E_{tok}-{t}``   t
logit                       ``logit``                    ``{L}_{tok}_{t}``   ``L_{tok}-{t}``   tok
neuron                      ``mlp neuron``               ``{L}_N{i}_{t}``    ``{L}_N{i}-0``    cantor(L, i)
attention_head              ``attention head``           ``{L}_H{h}_{t}``    ``{L}_H{h}-{t}``  -1
mlp                         ``mlp output``               ``{L}_M{i}_{t}``    ``{L}_M{i}-{t}``  -1
bias                        ``bias``                     ``{L}_B{i}_{t}``    ``{L}_B{i}-{t}``  -1
remainder                   ``remainder``                ``{L}_R{i}_{t}``    ``{L}_R{i}-{t}``  -1
positional                  ``positional embedding``     ``E_P{i}_{t}``      ``E_P{i}-{t}``    t
target                      ``custom target``            ``{L}_T{i}_{t}``    ``T_{i}-{t}``     i
==========================  ===========================  ==================  ================  ===============

``L`` is the viewer's layer string: ``"E"`` for layer -1 (embeddings), the block index
for blocks, and ``n_layers + 1`` for nodes that read after the last block (logits and
final-layer targets), exactly as circuit-tracer writes logits.  ``t`` is the position
(``ctx_idx``), ``f``/``i``/``h`` the index, ``tok`` the token id.

``influence`` is circuit-tracer's *cumulative* influence (the share of total influence
held by this node and every node more influential than it; the viewer prunes at
``node_threshold`` with it), computed from ``node.attrs["influence"]``, or taken from
``node.attrs["cumulative_influence"]`` when present; ``None`` when the graph has none.
The graph is written as given: prune it first (``prune:`` in the spec) to get the
viewer's usual size; the thresholds are recorded, not applied.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from importlib import metadata as importlib_metadata
from typing import Any, Mapping, Sequence

from circuitgraph._io import atomic_write_text
from circuitgraph.errors import ExportError
from circuitgraph.export.dot import is_structural_label
from circuitgraph.export.json_graph import _finite
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import BIAS_INDEX, REMAINDER_INDEX, Node, NodeId

__all__ = ["FEATURE_TYPES", "attach_qk", "graph_to_neuronpedia", "neuronpedia_node_id", "prompt_token_strings",
           "n_layers_of"]

#: our node kind -> the viewer's ``feature_type``
FEATURE_TYPES: dict[str, str] = {
    "feature": "cross layer transcoder",
    "error": "mlp reconstruction error",
    "embedding": "embedding",
    "logit": "logit",
    "neuron": "mlp neuron",
    "attention_head": "attention head",
    "mlp": "mlp output",
    "bias": "bias",
    "remainder": "remainder",
    "positional": "positional embedding",
    "target": "custom target",
}
_TAGS = {"neuron": "N", "attention_head": "H", "mlp": "M", "bias": "B", "remainder": "R", "target": "T"}
_BIAS_NAMES = {v: k for k, v in BIAS_INDEX.items()}
_REMAINDER_NAMES = {v: k for k, v in REMAINDER_INDEX.items()}

SCHEMA_VERSION = 1
DEFAULT_MAX_LINKS = 5_000_000


def graph_to_neuronpedia(
    graph: AttributionGraph,
    path: str | os.PathLike[str] | None = None,
    *,
    slug: str = "circuitgraph",
    scan: str | Sequence[str] | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    max_links: int | None = DEFAULT_MAX_LINKS,
    qk: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The graph in circuit-tracer's / Neuronpedia's attribution-graph JSON format.

    Args:
        graph: the graph (usually pruned first; every node and edge is written).
        path: write the JSON there (atomically) if given.
        slug: the graph's name in the viewer.
        scan: the Neuronpedia model id (e.g. ``"gpt2-small"``), or a list of transcoder
            ids (then ``scan`` becomes ``"custom-<hash>"`` and the list goes to
            ``transcoder_list``, as circuit-tracer does).  Default: the dictionary's own
            ``scan`` (``graph.metadata["transcoders"]["scan"]``, from a circuit-tracer
            ``config.yaml``), else the model name in ``graph.metadata["model"]``.
        node_threshold, edge_threshold: recorded in ``metadata`` (``node_threshold`` is the
            viewer's default dynamic pruning threshold) and ``pruning_settings``.
        max_links: refuse graphs with more edges; ``None`` disables the check.
        qk: results of the ``qk`` query (``QKResult.to_dict()``): each head's top pairs and
            marginals go, as ``qk_tracing_results``, onto the head's node at the query
            position (added, without links, when the graph has none); see :func:`attach_qk`.

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
    tokens = prompt_token_strings(graph)
    influence = _cumulative_influence(graph)
    target_ids = set(graph.target_ids)

    nodes = []
    ids: list[str] = []
    for row, node in enumerate(graph.nodes):
        record = _node_record(node, n_layers, tokens, influence.get(row), node.id in target_ids)
        nodes.append(record)
        ids.append(record["node_id"])
    if len(set(ids)) != len(ids):  # pragma: no cover - the id scheme is injective
        raise ExportError("two nodes map to the same Neuronpedia node_id; please report this")

    if qk:
        attach_qk(graph, nodes, qk, n_layers, tokens)
    links = [
        {"source": ids[s], "target": ids[t], "weight": _finite(w, f"edge {k} weight")}
        for k, (s, t, w) in enumerate(
            zip(graph.edge_source.tolist(), graph.edge_target.tolist(), graph.edge_weight.tolist())
        )
    ]
    prompt = graph.metadata.get("prompt")
    if not isinstance(prompt, str):
        prompt = "".join(tokens)
    info: dict[str, Any] = {
        "description": f"Exact attribution graph exported by circuitgraph ({graph.n_nodes} nodes, "
                       f"{graph.n_edges} edges).",
        "generator": {"name": "circuitgraph", "version": _package_version()},
    }
    source_urls = graph.metadata.get("source_urls")
    if isinstance(source_urls, list) and all(isinstance(u, str) for u in source_urls):
        info["source_urls"] = list(source_urls)
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
        "nodes": nodes,
        "links": links,
    }
    if path is not None:
        try:
            text = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
        except (TypeError, ValueError) as exc:
            raise ExportError(f"the Neuronpedia document cannot be written as JSON: {exc}") from None
        atomic_write_text(path, text)
    return doc


# --------------------------------------------------------------------------- node records
def neuronpedia_node_id(node: Node, n_layers: int) -> tuple[str, str]:
    """``(node_id, jsNodeId)`` of a node in the viewer's conventions (see the module table)."""
    layer = _layer_str(node.layer, n_layers)
    kind, t, i = node.kind, node.position, node.index
    if kind == "feature":
        return f"{layer}_{i}_{t}", f"{layer}_{i}-0"
    if kind == "error":
        return f"{layer}_-1_{t}", f"{layer}_-1-{t}"
    if kind == "embedding":
        return f"E_{i}_{t}", f"E_{i}-{t}"
    if kind == "logit":
        return f"{layer}_{i}_{t}", f"L_{i}-{t}"
    if kind == "positional":
        return f"E_P{i}_{t}", f"E_P{i}-{t}"
    if kind == "neuron":
        return f"{layer}_N{i}_{t}", f"{layer}_N{i}-0"
    if kind == "target":
        return f"{layer}_T{i}_{t}", f"T_{i}-{t}"
    tag = _TAGS[kind]
    return f"{layer}_{tag}{i}_{t}", f"{layer}_{tag}{i}-{t}"


def _node_record(node: Node, n_layers: int, tokens: list[str], influence: float | None,
                 is_target: bool) -> dict[str, Any]:
    node_id, js_node_id = neuronpedia_node_id(node, n_layers)
    kind = node.kind
    token_prob = 0.0
    activation: float | None = None
    if kind in ("feature", "neuron"):
        feature = _cantor(node.layer, node.index)
        activation = _finite(node.activation, f"node {node.id} activation")
    elif kind in ("embedding", "positional"):
        feature = node.position
    elif kind in ("logit", "target"):
        feature = node.index
    else:
        feature = -1
    if kind == "logit":
        key = "token_prob" if "token_prob" in node.attrs else "probability"
        token_prob = _finite(node.attrs.get(key, 0.0), f"node {node.id} attrs[{key!r}]")
        clerp = f'Output "{_token_str(node, tokens)}" (p={token_prob:.3f})'
    elif kind in ("feature", "error", "embedding"):
        # circuit-tracer leaves these empty (the viewer fills in its own text)
        clerp = "" if is_structural_label(node) or kind != "feature" else node.label
    else:
        clerp = node.label or _default_clerp(node, tokens)
    return {
        "node_id": node_id,
        "feature": int(feature),
        "layer": _layer_str(node.layer, n_layers),
        "ctx_idx": int(node.position),
        "feature_type": FEATURE_TYPES[kind],
        "token_prob": token_prob,
        "is_target_logit": bool(is_target and kind in ("logit", "target")),
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "jsNodeId": js_node_id,
        "clerp": clerp,
        "influence": influence,
        "activation": activation,
    }


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
        return f"target #{i}"
    if kind == "embedding":
        return _token_str(node, tokens)
    return ""


def _layer_str(layer: int, n_layers: int) -> str:
    if layer < 0:
        return "E"
    if layer >= n_layers:
        return str(layer + 1)
    return str(layer)


def _cantor(x: int, y: int) -> int:
    """Cantor pairing, circuit-tracer's ``feature`` number of (layer, feature index)."""
    return (x + y) * (x + y + 1) // 2 + y


# --------------------------------------------------------------------------- QK tracing
def attach_qk(graph: AttributionGraph, records: list[dict[str, Any]], results: Sequence[Mapping[str, Any]],
              n_layers: int, tokens: list[str]) -> None:
    """Put each head's QK decomposition on its node, in the form Neuronpedia's QK-tracing graphs use::

        "qk_tracing_results": {
            "pair_wise_contributors": [[q_node_id, k_node_id, value], ...],
            "top_q_marginal_contributors": [[q_node_id, value], ...],
            "top_k_marginal_contributors": [[k_node_id, value], ...]}

    The head's node is ``attention_head/layer/query_position/head`` (a record is appended for it
    when the graph has none, e.g. with frozen attention).  Contributors that are not nodes of
    the exported graph (pruned away) are left out, so every id refers to a node of the file.
    """
    ids = {str(node.id): rec["node_id"] for node, rec in zip(graph.nodes, records)}
    by_np_id = {rec["node_id"]: rec for rec in records}
    for result in results:
        for head in result.get("heads", ()):
            head_id = NodeId("attention_head", int(head["layer"]), int(head["query_position"]), int(head["head"]))
            np_id, _ = neuronpedia_node_id(Node(head_id, 1.0), n_layers)
            record = by_np_id.get(np_id)
            if record is None:
                record = _node_record(Node(head_id, 1.0, label=f"attention head L{head_id.layer}H{head_id.index} "
                                                               f"(QK to position {head['key_position']})"),
                                      n_layers, tokens, None, False)
                records.append(record)
                by_np_id[np_id] = record
            pairs = [[ids[p["query_node"]], ids[p["key_node"]], _finite(p["value"], "qk pair value")]
                     for p in head.get("pairs", ()) if p["query_node"] in ids and p["key_node"] in ids]
            record["qk_tracing_results"] = {
                "pair_wise_contributors": pairs,
                "top_q_marginal_contributors": _marginals(head.get("query_marginals", ()), ids),
                "top_k_marginal_contributors": _marginals(head.get("key_marginals", ()), ids),
            }


def _marginals(items: Sequence[Mapping[str, Any]], ids: Mapping[str, str]) -> list[list[Any]]:
    return [[ids[m["node"]], _finite(m["value"], "qk marginal value")] for m in items if m["node"] in ids]


# --------------------------------------------------------------------------- graph-level helpers
def n_layers_of(graph: AttributionGraph) -> int:
    """The model's number of blocks: ``metadata["model"]["n_layers"]``, else the logit layer,
    else one more than the deepest block seen."""
    model = graph.metadata.get("model")
    if isinstance(model, Mapping) and isinstance(model.get("n_layers"), int):
        return int(model["n_layers"])
    if isinstance(graph.metadata.get("n_layers"), int):
        return int(graph.metadata["n_layers"])
    logit_layers = [n.layer for n in graph.nodes if n.kind == "logit"]
    if logit_layers:
        return max(logit_layers)
    return max((n.layer for n in graph.nodes if n.kind != "target"), default=-1) + 1


def prompt_token_strings(graph: AttributionGraph) -> list[str]:
    """The prompt's tokens as strings.

    Taken from ``metadata["prompt_token_strs"]`` (or ``metadata["prompt_tokens"]`` when it
    holds strings); otherwise rebuilt from the embedding nodes' ``attrs["token_str"]`` or
    labels, one entry per position (empty where no embedding node says).
    """
    for key in ("prompt_token_strs", "prompt_str_tokens", "prompt_tokens"):
        value = graph.metadata.get(key)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return list(value)
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


def _cumulative_influence(graph: AttributionGraph) -> dict[int, float]:
    """Row -> circuit-tracer's cumulative influence score (see module docstring)."""
    out: dict[int, float] = {}
    scored: list[tuple[float, int]] = []
    for row, node in enumerate(graph.nodes):
        cumulative = node.attrs.get("cumulative_influence")
        if _is_number(cumulative):
            out[row] = float(cumulative)
            continue
        value = node.attrs.get("influence")
        if node.kind not in ("logit", "target") and _is_number(value):
            scored.append((float(value), row))
    total = sum(v for v, _ in scored)
    if scored and total > 0:
        running = 0.0
        for value, row in sorted(scored, key=lambda vr: (-vr[0], vr[1])):
            running += value
            out.setdefault(row, running / total)
    return out


def _scan(graph: AttributionGraph, scan: str | Sequence[str] | None) -> tuple[str, list[str]]:
    if isinstance(scan, str):
        return scan, []
    if scan is not None:
        transcoders = [str(s) for s in scan]
        digest = hashlib.sha256("-".join(transcoders).encode("utf-8")).hexdigest()[:12]
        return f"custom-{digest}", transcoders
    # the dictionary's own scan (a circuit-tracer config.yaml `scan:`, a string or a list of
    # transcoder ids), as circuit-tracer's create_graph_files uses it
    tc = graph.metadata.get("transcoders")
    tc_scan = tc.get("scan") if isinstance(tc, Mapping) else None
    if isinstance(tc_scan, str) and tc_scan:
        return tc_scan, []
    if isinstance(tc_scan, list) and tc_scan:
        return _scan(graph, [str(s) for s in tc_scan])
    model = graph.metadata.get("model")
    name = model.get("name") if isinstance(model, Mapping) else model
    if isinstance(name, str) and name:
        return name, []
    raise ExportError(
        "the Neuronpedia format needs a scan (the model id on Neuronpedia) and graph.metadata['model'] "
        "names none: pass scan='gpt2-small' (for example)"
    )


def _package_version() -> str:
    try:
        return importlib_metadata.version("circuitgraph")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
