"""Neighbourhoods: parents and children with weights, subgraphs by filter, supernodes, and a
logit-difference node built from two logit nodes."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from circuitgraph.errors import ExportError, QueryError
from circuitgraph.graph.edges import merge_edges, reachable
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.metadata import GraphMetadata
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.queries._base import QueryResult, check_k, check_optional_k, format_table, share
from circuitgraph.queries._sparse import coalesced_edges
from circuitgraph.queries.filters import as_filter, describe_filter, filter_mask, match_nodes, resolve_node
from circuitgraph.spec.kinds import ACTIVATION_KINDS, OUTPUT_KINDS

__all__ = [
    "Neighbour",
    "NeighboursResult",
    "SubgraphResult",
    "SupernodesResult",
    "neighbours",
    "parents",
    "children",
    "subgraph",
    "supernodes",
    "logit_difference",
]
# (the package re-exports this list as it is; ``reaches_a_target``, ``propose_supernodes`` and
# ``merge_supernodes`` are the diagrams' helpers: circuitgraph.export.dot re-exports them)


@dataclass(frozen=True)
class Neighbour:
    """One edge seen from a node: the other end, the weight, and the weight as a share of the
    reader's pre-activation (the reader is the node for parents, the child for children)."""

    node: NodeId
    weight: float
    share: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"node": str(self.node), "weight": self.weight, "share": self.share}


def parents(graph: AttributionGraph, node: NodeId | str, top_k: int | None = None) -> list[Neighbour]:
    """Incoming edges of ``node``, strongest first; ``share = weight / pre_activation(node)``."""
    node = resolve_node(graph, node)
    top_k = check_optional_k(top_k, "top_k")
    pre = graph.node(node).pre_activation
    out = [Neighbour(s, w, share(w, pre)) for s, w in graph.in_edges(node)]
    return out if top_k is None else out[:top_k]


def children(graph: AttributionGraph, node: NodeId | str, top_k: int | None = None) -> list[Neighbour]:
    """Outgoing edges of ``node``, strongest first; ``share = weight / pre_activation(child)``."""
    node = resolve_node(graph, node)
    top_k = check_optional_k(top_k, "top_k")
    out = [Neighbour(t, w, share(w, graph.node(t).pre_activation)) for t, w in graph.out_edges(node)]
    return out if top_k is None else out[:top_k]


@dataclass(frozen=True, repr=False)
class NeighboursResult(QueryResult):
    """The strongest parents and/or children of one node."""

    kind = "neighbours"
    node: NodeId
    activation: float
    pre_activation: float | None
    constant: float | None
    incoming: tuple[Neighbour, ...] | None
    outgoing: tuple[Neighbour, ...] | None
    n_incoming: int
    n_outgoing: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": str(self.node),
            "activation": self.activation,
            "pre_activation": self.pre_activation,
            "constant": self.constant,
            "n_incoming": self.n_incoming,
            "n_outgoing": self.n_outgoing,
            "incoming": None if self.incoming is None else [n.to_dict() for n in self.incoming],
            "outgoing": None if self.outgoing is None else [n.to_dict() for n in self.outgoing],
        }

    def table(self, max_rows: int = 10) -> str:
        rows = []
        for direction, items in (("in", self.incoming), ("out", self.outgoing)):
            rows += [(direction, str(n.node), n.weight, n.share) for n in items or ()]
        return format_table(["dir", "node", "weight", "share"], rows, max_rows=max_rows,
                            title=f"neighbours of {self.node} (activation {self.activation:.4g})")


def neighbours(graph: AttributionGraph, node: NodeId | str,
               direction: Literal["in", "out", "both"] = "both", top_k: int = 10) -> NeighboursResult:
    """The ``top_k`` strongest incoming and/or outgoing edges of ``node``.

    Example::

        neighbours(graph, "feature/1/4/17", direction="in", top_k=5).incoming
    """
    node = resolve_node(graph, node, what="neighbours node")
    top_k = check_k(top_k, "top_k")
    if direction not in ("in", "out", "both"):
        raise QueryError(f"direction must be 'in', 'out' or 'both', got {direction!r}")
    rec = graph.node(node)
    ins = parents(graph, node)
    outs = children(graph, node)
    return NeighboursResult(
        node, float(rec.activation), rec.pre_activation, rec.constant,
        tuple(ins[:top_k]) if direction in ("in", "both") else None,
        tuple(outs[:top_k]) if direction in ("out", "both") else None,
        len(ins), len(outs),
    )


@dataclass(frozen=True, eq=False, repr=False)
class SubgraphResult(QueryResult):
    """The subgraph induced by the nodes a filter selects (no remainder bookkeeping)."""

    kind = "subgraph"
    graph: AttributionGraph
    filter: str

    def to_dict(self) -> dict[str, Any]:
        g = self.graph
        ids = [str(n) for n in g.node_ids()]
        return {
            "filter": self.filter,
            "nodes": ids,
            "edges": [[ids[s], ids[t], float(w)] for s, t, w in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False)],
        }

    def table(self, max_rows: int = 10) -> str:
        g = self.graph
        order = np.argsort(-np.abs(g.edge_weight), kind="stable")
        rows = [(str(g.nodes[g.edge_source[i]].id), str(g.nodes[g.edge_target[i]].id), float(g.edge_weight[i]))
                for i in order]
        return format_table(["source", "target", "weight"], rows, max_rows=max_rows,
                            title=f"subgraph {self.filter}: {g.n_nodes} nodes, {g.n_edges} edges")


def subgraph(graph: AttributionGraph, filter: Any) -> SubgraphResult:  # the spec's key
    """The subgraph induced by the nodes matching ``filter``.

    Example::

        subgraph(graph, {"kind": "feature", "layer": [0, 1]}).graph.n_nodes
    """
    f = as_filter(filter)
    keep = match_nodes(graph, f, what="subgraph filter")
    return SubgraphResult(graph.subgraph(keep), describe_filter(f))


OTHER = "(other)"


@dataclass(frozen=True, repr=False)
class SupernodesResult(QueryResult):
    """Named groups of nodes and the summed edges between groups.

    ``edges`` holds ``(source group, target group, summed weight, n_edges)`` for every pair
    with at least one edge, including ``(other)`` (the nodes in no group) and a group to
    itself (its internal edges).
    """

    kind = "supernodes"
    groups: tuple[tuple[str, tuple[NodeId, ...]], ...]
    edges: tuple[tuple[str, str, float, int], ...]

    def members(self, name: str) -> tuple[NodeId, ...]:
        for g, ids in self.groups:
            if g == name:
                return ids
        raise QueryError(f"no supernode named {name!r}; groups: {', '.join(g for g, _ in self.groups)}")

    def weight(self, source: str, target: str) -> float:
        for s, t, w, _ in self.edges:
            if s == source and t == target:
                return w
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": {name: [str(i) for i in ids] for name, ids in self.groups},
            "edges": [{"source": s, "target": t, "weight": w, "n_edges": c} for s, t, w, c in self.edges],
        }

    def table(self, max_rows: int = 10) -> str:
        rows = [(s, t, w, c) for s, t, w, c in sorted(self.edges, key=lambda e: -abs(e[2]))]
        sizes = ", ".join(f"{name} ({len(ids)})" for name, ids in self.groups)
        return format_table(["source", "target", "weight", "n_edges"], rows, max_rows=max_rows,
                            title=f"supernodes: {sizes}")


def supernodes(graph: AttributionGraph, groups: Mapping[str, Any]) -> SupernodesResult:
    """Merge each named filter's nodes into one supernode and sum the edges between groups.

    A node in two groups is an error (the sums would count it twice).

    Example::

        res = supernodes(graph, {"early": {"kind": "feature", "layer": 0},
                                 "late": {"kind": "feature", "layer": 1}})
        res.weight("early", "late")
    """
    if not groups:
        raise QueryError("supernodes needs at least one group {name: filter}")
    if OTHER in groups:
        raise QueryError(f"{OTHER!r} is reserved for the nodes in no group; rename that group")
    n = graph.n_nodes
    label = np.full(n, -1, dtype=np.int64)
    names = list(groups)
    members = []
    for gi, (name, filt) in enumerate(groups.items()):
        match_nodes(graph, filt, what=f"supernode {name!r}")
        mask = filter_mask(graph, filt)
        clash = np.flatnonzero(mask & (label >= 0))
        if clash.size:
            other = names[label[clash[0]]]
            raise QueryError(f"node {graph.nodes[clash[0]].id} is in both supernodes {other!r} and {name!r}; "
                             "make the groups disjoint")
        label[mask] = gi
        members.append((name, tuple(graph.nodes[i].id for i in np.flatnonzero(mask))))
    e = coalesced_edges(graph)
    g_of = np.where(label >= 0, label, len(names))
    all_names = names + [OTHER]
    key = g_of[e.source] * (len(all_names)) + g_of[e.target]
    sums = np.bincount(key, weights=e.weight, minlength=len(all_names) ** 2)
    counts = np.bincount(key, minlength=len(all_names) ** 2)
    edges = tuple(
        (all_names[k // len(all_names)], all_names[k % len(all_names)], float(sums[k]), int(counts[k]))
        for k in np.flatnonzero(counts)
    )
    return SupernodesResult(tuple(members), edges)


def logit_difference(graph: AttributionGraph, a: NodeId | str, b: NodeId | str, *,
                     as_only_target: bool = True) -> tuple[AttributionGraph, NodeId]:
    """A copy of ``graph`` with a new reader node ``a - b`` (e.g. logit(" an") - logit(" a")).

    Both nodes must be readers (logit or target nodes) at the same position.  The new node
    ``target/<layer>/<position>/<i>`` (``i`` the first unused index there) has incoming edges
    ``E[a, s] - E[b, s]``, pre-activation ``pre_a - pre_b`` and constant ``c_a - c_b``, so
    completeness holds for it exactly.  With ``as_only_target`` it becomes the graph's only
    target (weight 1), else it is added to the targets.

    Returns ``(new graph, new node id)``.
    """
    a = resolve_node(graph, a, what="logit_difference a")
    b = resolve_node(graph, b, what="logit_difference b")
    if a == b:
        raise QueryError(f"logit_difference: a and b are the same node {a}")
    na, nb = graph.node(a), graph.node(b)
    for nd in (na, nb):
        if nd.kind not in OUTPUT_KINDS or nd.pre_activation is None:
            raise QueryError(f"logit_difference: {nd.id} is not a logit or target reader node")
    assert na.pre_activation is not None and nb.pre_activation is not None  # checked just above
    if (na.layer, na.position) != (nb.layer, nb.position):
        raise QueryError(f"logit_difference: {a} and {b} read at different layers/positions; "
                         "a difference of readers needs the same residual site")
    used = {nd.index for nd in graph.nodes if nd.kind == "target" and nd.layer == na.layer
            and nd.position == na.position}
    index = 0
    while index in used:
        index += 1
    new_id = NodeId("target", na.layer, na.position, index)
    ra, rb = graph.index_of(a), graph.index_of(b)
    e = coalesced_edges(graph)
    into_a, into_b = e.target == ra, e.target == rb
    diff = (np.bincount(e.source[into_a], weights=e.weight[into_a], minlength=graph.n_nodes)
            - np.bincount(e.source[into_b], weights=e.weight[into_b], minlength=graph.n_nodes))
    src = np.flatnonzero(diff)
    pre = float(na.pre_activation - nb.pre_activation)
    const = None if na.constant is None or nb.constant is None else float(na.constant - nb.constant)
    node = Node(new_id, activation=pre, pre_activation=pre, constant=const, label=f"{na.label} - {nb.label}",
                attrs={"target_kind": "logit_diff", "from": [str(a), str(b)]})
    new_row = graph.n_nodes
    targets = [(new_id, 1.0)] if as_only_target else list(graph.targets) + [(new_id, 1.0)]
    out = AttributionGraph(
        nodes=list(graph.nodes) + [node],
        edge_target=np.concatenate([graph.edge_target, np.full(src.size, new_row, dtype=np.int64)]),
        edge_source=np.concatenate([graph.edge_source, src]),
        edge_weight=np.concatenate([graph.edge_weight, diff[src].astype(graph.edge_weight.dtype)]),
        targets=targets,
        metadata=GraphMetadata(graph.metadata),
        context=graph.context,
        max_dense_nodes=graph.max_dense_nodes,
    )
    return out, new_id


# ---------------------------------------------------------------------------- for the diagrams
def reaches_a_target(graph: AttributionGraph) -> np.ndarray:
    """Boolean per row: the node is a target or has a path (any edge weight) to one."""
    start = np.zeros(graph.n_nodes, dtype=bool)
    start[[graph.index_of(t) for t in graph.target_ids]] = True
    return reachable(graph.n_nodes, graph.edge_target, graph.edge_source, start)  # against the edges


def propose_supernodes(graph: AttributionGraph, *, min_similarity: float = 0.5,
                       kinds: Collection[str] = ACTIVATION_KINDS) -> dict[str, list[NodeId]]:
    """Groups of nodes that share their neighbours: nodes of one kind and layer whose sets of
    (in and out) neighbours overlap by at least ``min_similarity`` (Jaccard), merged greedily,
    strongest nodes first; groups of two or more, named ``"L{layer} group {i}"``."""
    neighbours: dict[int, set[int]] = {}
    strength = np.zeros(graph.n_nodes)
    np.add.at(strength, graph.edge_source, np.abs(graph.edge_weight.astype(np.float64)))
    np.add.at(strength, graph.edge_target, np.abs(graph.edge_weight.astype(np.float64)))
    for s, t in zip(graph.edge_source.tolist(), graph.edge_target.tolist(), strict=False):
        neighbours.setdefault(s, set()).add(t)
        neighbours.setdefault(t, set()).add(s)
    by_site: dict[tuple[str, int], list[int]] = {}
    targets = {graph.index_of(t) for t in graph.target_ids}
    for r, node in enumerate(graph.nodes):
        if node.kind in kinds and r not in targets and neighbours.get(r):
            by_site.setdefault((node.kind, node.layer), []).append(r)
    groups: dict[str, list[NodeId]] = {}
    for (_kind, layer), rows in sorted(by_site.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rows = sorted(rows, key=lambda r: -strength[r])
        taken: set[int] = set()
        for r in rows:
            if r in taken:
                continue
            members = [r]
            for o in rows:
                if o in taken or o == r:
                    continue
                a, b = neighbours[r], neighbours[o]
                if len(a & b) / len(a | b) >= min_similarity:
                    members.append(o)
            if len(members) > 1:
                taken.update(members)
                groups[f"L{layer} group {len([g for g in groups if g.startswith(f'L{layer} ')]) + 1}"] = \
                    [graph.nodes[m].id for m in members]
    return groups


def merge_supernodes(graph: AttributionGraph, groups: Mapping[str, Any]) -> AttributionGraph:
    """A copy of ``graph`` in which each group ``{name: node filter or list of ids}`` is one node
    (its strongest member's id, labelled with the name; ``attrs["supernode"]``,
    ``attrs["members"]``), with the edges to and from its members summed and the edges inside
    it dropped.  A node in two groups is an error."""
    group_of = np.full(graph.n_nodes, -1, dtype=np.int64)
    names = list(groups)
    for gi, name in enumerate(names):
        spec = groups[name]
        if isinstance(spec, (list, tuple)) and all(isinstance(x, (NodeId, str)) for x in spec):
            mask = np.zeros(graph.n_nodes, dtype=bool)
            mask[[graph.index_of(x) for x in spec]] = True
        else:
            mask = filter_mask(graph, spec)
        if not mask.any():
            raise ExportError(f"supernode {name!r} matches no node of the graph; check its filter")
        clash = np.flatnonzero(mask & (group_of >= 0))
        if clash.size:
            raise ExportError(f"node {graph.nodes[clash[0]].id} is in both supernodes {names[group_of[clash[0]]]!r} "
                              f"and {name!r}; make the groups disjoint")
        group_of[mask] = gi
    strength = np.zeros(graph.n_nodes)
    np.add.at(strength, graph.edge_source, np.abs(graph.edge_weight.astype(np.float64)))
    np.add.at(strength, graph.edge_target, np.abs(graph.edge_weight.astype(np.float64)))
    rep = np.arange(graph.n_nodes)
    nodes: list[Node] = []
    new_row = np.full(graph.n_nodes, -1, dtype=np.int64)
    for gi, _name in enumerate(names):
        members = np.flatnonzero(group_of == gi)
        head = members[np.argmax(strength[members])]
        rep[members] = head
    for r, node in enumerate(graph.nodes):
        if group_of[r] >= 0 and rep[r] != r:
            continue
        new_row[r] = len(nodes)
        if group_of[r] >= 0:
            members = np.flatnonzero(group_of == group_of[r])
            node = Node(node.id, float(sum(graph.nodes[m].activation for m in members)), None, None,
                        names[group_of[r]], {"supernode": names[group_of[r]],
                                             "members": [str(graph.nodes[m].id) for m in members]})
        nodes.append(node)
    new_row = new_row[rep]
    s, t = new_row[graph.edge_source], new_row[graph.edge_target]
    keep = s != t
    mt, ms, summed, _ = merge_edges(t[keep], s[keep], graph.edge_weight[keep], len(nodes))
    targets = []
    for tid, w in graph.targets:
        row = int(new_row[graph.index_of(tid)])
        if nodes[row].id not in {x for x, _ in targets}:
            targets.append((nodes[row].id, w))
    return AttributionGraph(nodes, mt, ms, summed, targets=targets,
                            metadata=GraphMetadata(graph.metadata))
