"""Node filters and node references, resolved against a graph.

A filter is a :class:`circuitgraph.spec.NodeFilter` (keys ANDed, values within a key
ORed; ``layer`` an inclusive range; negative positions count from the end of the
prompt), or anything :func:`as_filter` turns into one: a mapping with the same keys, a
node id, a node-id string, or a list of them.  A filter that matches nothing, and an id
that is not in the graph, are :class:`QueryError` naming the filter or the id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from circuitgraph.errors import QueryError, SpecError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId
from circuitgraph.spec.filters import NodeFilter

__all__ = [
    "FilterLike",
    "as_filter",
    "describe_filter",
    "filter_mask",
    "match_nodes",
    "n_positions",
    "resolve_node",
    "resolve_target_set",
]

FilterLike = NodeFilter | Mapping | NodeId | str | Iterable


def as_filter(value: Any) -> NodeFilter:
    """A :class:`NodeFilter` from a filter, a mapping, a node id (string or value) or a list of ids."""
    if isinstance(value, NodeFilter):
        return value
    try:
        if isinstance(value, Mapping):
            return NodeFilter(**dict(value))
        if isinstance(value, (NodeId, str)):
            return NodeFilter(id=[str(value)])
        if isinstance(value, Iterable):
            ids = [str(v) for v in value]
            if not ids:
                raise QueryError("an empty list of node ids selects nothing; give at least one id")
            return NodeFilter(id=ids)
    except SpecError as exc:
        raise QueryError(f"bad node filter {value!r}: {exc}") from None
    raise QueryError(
        f"expected a node filter ({{kind, layer, position, index, id}}), a node id or a list of ids, got {value!r}"
    )


def describe_filter(filt: NodeFilter) -> str:
    """Compact text of a filter, e.g. ``{kind: feature, layer: [1, 2]}``."""
    parts = []
    for key in ("kind", "layer", "position", "index", "id"):
        v = getattr(filt, key)
        if v is None:
            continue
        if key == "layer":
            text = str(v[0]) if v[0] == v[1] else f"[{v[0]}, {v[1]}]"
        else:
            vals = list(v)
            text = str(vals[0]) if len(vals) == 1 else "[" + ", ".join(str(x) for x in vals) + "]"
        parts.append(f"{key}: {text}")
    return "{" + ", ".join(parts) + "}"


def n_positions(graph: AttributionGraph) -> int:
    """Prompt length: one past the largest embedding position (or any node's position)."""
    emb = [n.position for n in graph.nodes if n.kind == "embedding"]
    pool = emb or [n.position for n in graph.nodes]
    return max(pool) + 1 if pool else 0


def filter_mask(graph: AttributionGraph, filt: FilterLike, *, prompt_length: int | None = None) -> np.ndarray:
    """Boolean mask over the graph's node rows (no error when it is empty); negative positions
    count from the end of the prompt (``prompt_length``, default: read from the graph)."""
    f = as_filter(filt)
    T = n_positions(graph) if prompt_length is None else prompt_length
    return np.fromiter(
        (f.matches(n.kind, n.layer, n.position, n.index, n_positions=T) for n in graph.nodes),
        dtype=bool,
        count=graph.n_nodes,
    )


def _check_ids(graph: AttributionGraph, f: NodeFilter, what: str) -> None:
    if f.id is None:
        return
    missing = [i for i in f.id if NodeId.parse(i) not in graph]
    if missing:
        raise QueryError(
            f"{what}: node id{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} not in the graph ({graph.n_nodes} nodes)"
        )


def match_nodes(graph: AttributionGraph, filt: FilterLike, *, what: str = "filter") -> list[NodeId]:
    """Node ids matching ``filt``, in graph order; :class:`QueryError` if none (or an unknown id)."""
    f = as_filter(filt)
    _check_ids(graph, f, what)
    mask = filter_mask(graph, f)
    if not mask.any():
        kinds = sorted({n.kind for n in graph.nodes})
        raise QueryError(
            f"{what} {describe_filter(f)} matches no node of the graph "
            f"({graph.n_nodes} nodes; kinds present: {', '.join(kinds) or 'none'})"
        )
    return [graph.nodes[i].id for i in np.flatnonzero(mask)]


def resolve_node(graph: AttributionGraph, node: NodeId | str, *, what: str = "node") -> NodeId:
    """A node id that is in the graph; :class:`QueryError` naming it otherwise."""
    if isinstance(node, str):
        try:
            node = NodeId.parse(node)
        except ValueError as exc:
            raise QueryError(f"{what}: {exc} (e.g. 'feature/1/4/17')") from None
    if not isinstance(node, NodeId):
        raise QueryError(f"{what}: expected a node id 'kind/layer/position/index', got {node!r}")
    if node not in graph:
        raise QueryError(f"{what} {node} is not in the graph ({graph.n_nodes} nodes)")
    return node


def resolve_target_set(graph: AttributionGraph, target: Any, *, what: str = "target") -> list[NodeId]:
    """``"targets"`` -> the graph's targets; anything else is a filter."""
    if isinstance(target, str) and target == "targets":
        if not graph.targets:
            raise QueryError(f"{what}: 'targets' asked but the graph has no targets")
        return list(graph.target_ids)
    return match_nodes(graph, target, what=what)
