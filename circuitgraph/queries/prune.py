"""Pruning: keep the nodes and edges that carry most of the influence on the targets.

The algorithm is circuit-tracer's ``prune_graph`` (same defaults, same kept node set on
the same adjacency), written over sparse edges:

1. **Node influence.**  ``A`` = the absolute adjacency, row-normalised; ``w`` = target
   weights; ``influence = w (A + A^2 + ...)`` (:func:`~circuitgraph.queries.influence.node_influence`).
2. **Node threshold.**  Sort the influences in decreasing order; the cut is the first score at
   which the cumulative sum reaches ``node_threshold`` of the total (``find_threshold``);
   keep every node whose influence is at least that score.  Embedding nodes and targets are
   always kept (circuit-tracer: tokens and logits), and so are the remainder nodes of an
   earlier pruning.  Optional: ``top_k_nodes`` keeps at most
   that many of the other nodes (the most influential); ``target_share`` replaces step 2 by,
   for each target separately, the smallest set of nodes (by influence on that target alone)
   whose influence reaches that share of the target's total, united over the targets.
3. **Edge scores.**  Zero the rows and columns of the dropped nodes, row-normalise again,
   recompute the influence on that pruned matrix and add ``w``; an edge ``s -> t`` scores
   ``A'[t, s] * (influence'[t] + w[t])``.
4. **Edge threshold.**  Same cumulative cut on the (non-zero) edge scores with
   ``edge_threshold``; optional ``top_k_edges`` keeps at most that many edges.
5. **Connectivity.**  Repeat until nothing changes: drop edges touching dropped nodes; drop
   every node (other than embeddings and targets) without a kept outgoing edge, and every
   feature/neuron without a kept incoming edge.

**Remainder nodes.**  Every edge into a kept node that was pruned (its source was dropped, or
the edge itself was) is summed into an explicit remainder node
``remainder/<layer>/<position>/1`` (``REMAINDER_INDEX["pruned"]``) keyed by the *source's*
layer and position: one remainder per (layer, position) of the pruned writers, whatever their
kind.  So for every kept reader, ``pre_activation == sum of kept incoming edges + remainder
edges + constant`` still holds, to the storage precision of the edge weights.

Differences from circuit-tracer, all in degenerate cases: the node cut sorts all N
influences like circuit-tracer, but the edge cut sorts only the non-zero edge scores (there
are ``O(edges)`` of them, not ``N^2``): with ``edge_threshold = 1.0`` circuit-tracer's cut
can fall on a zero score and mark every *absent* edge as kept too; here every non-zero edge
is kept.  With ``node_threshold = 1.0`` both may keep zero-influence nodes when rounding
leaves the cumulative share just below 1 (the connectivity step then drops them unless they
are embeddings or targets).  Computations are in float64 (circuit-tracer: the adjacency's
dtype).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from circuitgraph.graph.dag import CHUNK, dag_order, graph_dag, sweep
from circuitgraph.graph.edges import cumulative_share
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.metadata import GraphMetadata
from circuitgraph.graph.nodes import REMAINDER_INDEX, Node, NodeId
from circuitgraph.queries._base import QueryResult, check_fraction, check_optional_k, format_table
from circuitgraph.queries._sparse import target_weight_vector, weighted_influence
from circuitgraph.spec.kinds import ACTIVATION_KINDS

__all__ = ["PruneResult", "prune_graph", "find_threshold", "ALWAYS_KEPT_KINDS", "NEEDS_INPUT_KINDS"]

#: kinds never pruned (circuit-tracer keeps tokens and logits); targets are always kept too
ALWAYS_KEPT_KINDS = frozenset({"embedding"})
#: kinds that are dropped when none of their incoming edges is kept (circuit-tracer: features): the
#: units with an activation, :data:`~circuitgraph.spec.kinds.ACTIVATION_KINDS`
NEEDS_INPUT_KINDS = ACTIVATION_KINDS

_PRUNED = REMAINDER_INDEX["pruned"]


def find_threshold(scores: np.ndarray, threshold: float) -> float:
    """circuit-tracer's cut: the score at which the cumulative share (largest first) first
    reaches ``threshold``.  Returns ``inf`` for an empty or all-zero score vector."""
    if scores.size == 0:
        return float("inf")
    s = np.sort(scores)[::-1]
    total = s.sum()
    if total <= 0:
        return float("inf")
    cum = np.cumsum(s) / total
    idx = int(np.searchsorted(cum, threshold, side="left"))
    return float(s[min(idx, s.size - 1)])


def _top_k(mask: np.ndarray, score: np.ndarray, k: int) -> np.ndarray:
    """Restrict ``mask`` to its ``k`` highest-scoring entries (ties broken by position)."""
    idx = np.flatnonzero(mask)
    if idx.size <= k:
        return mask
    order = np.argsort(-score[idx], kind="stable")[:k]
    out = np.zeros_like(mask)
    out[idx[order]] = True
    return out


@dataclass(frozen=True, eq=False, repr=False)
class PruneResult(QueryResult):
    """The pruned graph and the decisions that produced it.

    Attributes:
        graph: the pruned :class:`AttributionGraph` (kept nodes in the original order, then the
            remainder nodes); completeness holds on it.
        node_mask: per node of the input graph, whether it was kept.
        edge_mask: per edge of the input graph, whether it was kept as an edge.
        node_influence: circuit-tracer's node influence on the input graph.
        cumulative_scores: per node, the cumulative influence share of the nodes ranked at or
            above it (circuit-tracer's third output).
        node_score_threshold, edge_score_threshold: the score cuts (None when not used).
        remainder_nodes: the remainder nodes added.
        params: the arguments.
    """

    kind = "prune"
    graph: AttributionGraph
    node_mask: np.ndarray
    edge_mask: np.ndarray
    node_influence: np.ndarray
    cumulative_scores: np.ndarray
    node_score_threshold: float | None
    edge_score_threshold: float | None
    remainder_nodes: tuple[NodeId, ...]
    n_nodes_before: int
    n_edges_before: int
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def kept_nodes(self) -> list[NodeId]:
        """Ids of the kept nodes of the input graph (they come first in :attr:`graph`)."""
        return self.graph.node_ids()[: int(self.node_mask.sum())]

    def summary(self) -> dict[str, Any]:
        return {
            **self.params,
            "n_nodes_before": self.n_nodes_before,
            "n_edges_before": self.n_edges_before,
            "n_nodes_kept": int(self.node_mask.sum()),
            "n_edges_kept": int(self.edge_mask.sum()),
            "n_remainder_nodes": len(self.remainder_nodes),
            "n_nodes": self.graph.n_nodes,
            "n_edges": self.graph.n_edges,
            "node_score_threshold": self.node_score_threshold,
            "edge_score_threshold": self.edge_score_threshold,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "kept_nodes": [str(n) for n in self.kept_nodes],
            "remainder_nodes": [str(n) for n in self.remainder_nodes],
            "completeness": self.graph.check_completeness().to_dict(),
        }

    def table(self, max_rows: int = 10) -> str:
        rows = [(k, v) for k, v in self.summary().items()]
        return format_table(["pruning", "value"], rows, max_rows=max(max_rows, len(rows)))


def prune_graph(
    graph: AttributionGraph,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    top_k_nodes: int | None = None,
    top_k_edges: int | None = None,
    target_share: float | None = None,
) -> PruneResult:
    """Prune ``graph`` as circuit-tracer does, keeping the pruned part in remainder nodes.

    Example::

        res = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)
        res.graph.check_completeness().ok()
        True
    """
    node_threshold = check_fraction(node_threshold, "node_threshold")
    edge_threshold = check_fraction(edge_threshold, "edge_threshold")
    top_k_nodes = check_optional_k(top_k_nodes, "top_k_nodes")
    top_k_edges = check_optional_k(top_k_edges, "top_k_edges")
    if target_share is not None:
        target_share = check_fraction(target_share, "target_share")
    params = {"node_threshold": node_threshold, "edge_threshold": edge_threshold, "top_k_nodes": top_k_nodes,
              "top_k_edges": top_k_edges, "target_share": target_share}

    n = graph.n_nodes
    influence = weighted_influence(graph)
    gd = graph_dag(graph)
    dag = gd.dag
    w = target_weight_vector(graph)

    kinds = np.array([nd.kind for nd in graph.nodes], dtype=object)
    always = np.isin(kinds, list(ALWAYS_KEPT_KINDS))
    for t in graph.target_ids:
        always[graph.index_of(t)] = True
    always |= np.array([nd.kind == "remainder" and nd.index == _PRUNED for nd in graph.nodes], dtype=bool)

    # ---- step 2: nodes
    node_cut: float | None
    if target_share is None:
        node_cut = find_threshold(influence, node_threshold)
        node_mask = influence >= node_cut
    else:
        node_cut = None
        node_mask = np.zeros(n, dtype=bool)
        starts = np.zeros((n, len(graph.targets)), dtype=np.float64)
        for j, t in enumerate(graph.target_ids):
            starts[graph.index_of(t), j] = 1.0
        per_target = sweep(dag, abs_start=starts, row_divisor=gd.row_divisor)["abs"]
        for j in range(per_target.shape[1]):
            col = per_target[:, j]
            cut = find_threshold(col, target_share)
            node_mask |= (col >= cut) & (col > 0)
    if top_k_nodes is not None:
        node_mask = _top_k(node_mask & ~always, influence, top_k_nodes)
    node_mask = node_mask | always

    # ---- step 3: edge scores on the node-pruned matrix (rows and columns of dropped nodes zeroed)
    into_kept = _edges_into(dag, node_mask)  # one pass over every edge; the later selections are subsets
    inside_idx = into_kept[node_mask[dag.source[into_kept]]]
    it, is_ = dag.target[inside_idx], dag.source[inside_idx]
    a_in = np.abs(dag.weight[inside_idx].astype(np.float64))
    # rows of dropped nodes divide by infinity: they pass nothing on
    divisor2 = np.where(node_mask, np.maximum(np.bincount(it, weights=a_in, minlength=n), 1e-10), np.inf)
    inside = dag_order(n, it, is_, dag.weight[inside_idx], dag.level, trusted=True)  # the same levels hold
    influence2 = sweep(inside, abs_start=w, row_divisor=divisor2)["abs"][:, 0] + w
    scores = a_in / divisor2[it] * influence2[it]

    # ---- step 4: edges
    nonzero = scores > 0
    edge_cut = find_threshold(scores[nonzero], edge_threshold)
    kept = nonzero & (scores >= edge_cut)
    if top_k_edges is not None:
        kept = _top_k(kept, scores, top_k_edges)
    kept_idx = inside_idx[kept]  # indices into the graph's unique edges

    # ---- step 5: connectivity, to a fixed point (over the kept edges only)
    needs_out = ~always
    needs_in = np.isin(kinds, list(NEEDS_INPUT_KINDS)) & ~always
    kt, ks = dag.target[kept_idx], dag.source[kept_idx]
    alive = np.ones(kept_idx.size, dtype=bool)
    while True:
        alive &= node_mask[kt] & node_mask[ks]
        has_out = np.bincount(ks[alive], minlength=n) > 0
        has_in = np.bincount(kt[alive], minlength=n) > 0
        new_mask = node_mask & (~needs_out | has_out) & (~needs_in | has_in)
        if np.array_equal(new_mask, node_mask):
            break
        node_mask = new_mask
    kept_idx = kept_idx[alive]

    edge_mask_unique = np.zeros(dag.target.shape[0], dtype=bool)
    edge_mask_unique[kept_idx] = True
    pruned, remainders = _build_pruned_graph(graph, dag, node_mask, edge_mask_unique, params, kept_idx, into_kept)
    inverse = gd.inverse
    return PruneResult(
        graph=pruned,
        node_mask=node_mask,
        edge_mask=edge_mask_unique if inverse is None else edge_mask_unique[inverse],
        node_influence=influence,
        cumulative_scores=cumulative_share(influence),
        node_score_threshold=node_cut,
        edge_score_threshold=edge_cut if np.isfinite(edge_cut) else None,
        remainder_nodes=tuple(remainders),
        n_nodes_before=n,
        n_edges_before=graph.n_edges,
        params=params,
    )


def _edges_into(dag, node_mask: np.ndarray) -> np.ndarray:
    """Indices of the edges whose target is kept (chunked: no full-size temporaries besides the
    result)."""
    parts = []
    for c in range(0, dag.target.shape[0], CHUNK):
        parts.append(np.flatnonzero(node_mask[dag.target[c : c + CHUNK]]) + c)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _build_pruned_graph(graph: AttributionGraph, e: Any, node_mask: np.ndarray, edge_mask: np.ndarray,
                        params: dict[str, Any], kept_idx: np.ndarray,
                        candidates: np.ndarray) -> tuple[AttributionGraph, list[NodeId]]:
    """Kept nodes and edges, plus one remainder node per (layer, position) of pruned sources.

    ``kept_idx``: the kept edges (``edge_mask``'s true entries); ``candidates``: edges that
    include every edge into a kept node (the lost edges are looked for among them only)."""
    n = graph.n_nodes
    kept_rows = np.flatnonzero(node_mask)
    remap = -np.ones(n, dtype=np.int64)
    remap[kept_rows] = np.arange(kept_rows.size)
    nodes: list[Node] = [graph.nodes[r] for r in kept_rows]

    # pruned contributions into kept nodes, grouped by (target, source layer, source position)
    lost = candidates[node_mask[e.target[candidates]] & ~edge_mask[candidates]]
    lost_t, lost_s, lost_w = e.target[lost], e.source[lost], e.weight[lost].astype(np.float64)
    layers = np.array([nd.layer for nd in graph.nodes], dtype=np.int64)
    positions = np.array([nd.position for nd in graph.nodes], dtype=np.int64)
    kind_names = sorted({nd.kind for nd in graph.nodes})
    kind_code = np.array([kind_names.index(nd.kind) for nd in graph.nodes], dtype=np.int64)
    # one integer per (layer, position), vectorised over the (possibly millions of) lost edges
    span = int(positions.max()) + 1 if n else 1
    node_group = (layers - int(layers.min() if n else 0)) * span + positions
    edge_group = node_group[lost_s]
    uniq_groups, group_of = _unique_small(edge_group, int(node_group.max()) + 1 if n else 1)
    first = np.zeros(uniq_groups.size, dtype=np.int64)
    first[group_of[::-1]] = np.arange(lost_s.size)[::-1]  # a source row of each group
    groups: dict[tuple[int, int], int] = {}
    counts: dict[tuple[int, int], dict[str, int]] = {}
    per_kind = np.bincount(group_of * len(kind_names) + kind_code[lost_s],
                           minlength=uniq_groups.size * len(kind_names)).reshape(-1, len(kind_names))
    for g in range(uniq_groups.size):
        row = int(lost_s[first[g]])
        key = (int(layers[row]), int(positions[row]))
        groups[key] = g
        counts[key] = {kind_names[k]: int(c) for k, c in enumerate(per_kind[g]) if c}
    dropped_by_group: dict[tuple[int, int], int] = {}
    for r in np.flatnonzero(~node_mask):
        key = (graph.nodes[r].layer, graph.nodes[r].position)
        dropped_by_group[key] = dropped_by_group.get(key, 0) + 1

    remainder_rows: dict[tuple[int, int], int] = {}
    remainders: list[NodeId] = []
    for key in sorted(groups):
        rid = NodeId("remainder", key[0], key[1], _PRUNED)
        if rid in graph and node_mask[graph.index_of(rid)]:
            remainder_rows[key] = int(remap[graph.index_of(rid)])
            continue
        remainder_rows[key] = len(nodes)
        remainders.append(rid)
        nodes.append(Node(rid, activation=1.0, label=f"pruned L{key[0]}@{key[1]}",
                          attrs={"pruned_edges_by_source_kind": counts[key],
                                 "n_pruned_nodes": dropped_by_group.get(key, 0)}))
    group_row = np.array([remainder_rows[k] for k in sorted(groups, key=lambda g: groups[g])], dtype=np.int64)

    n_new = len(nodes)
    kept_idx = np.sort(kept_idx)  # the stored order, as a boolean selection gives it
    kt, ks = remap[e.target[kept_idx]], remap[e.source[kept_idx]]
    kw = e.weight[kept_idx].astype(np.float64)
    if lost_s.size:
        # the pruned contributions summed per (kept target, remainder), counted over the small
        # range kept targets x source groups (not over every (target, source) pair)
        n_groups = int(uniq_groups.size)
        lost_uniq, lost_inv = _unique_small(remap[lost_t] * np.int64(n_groups) + group_of,
                                            int(kept_rows.size) * n_groups)
        lt, ls = lost_uniq // n_groups, group_row[lost_uniq % n_groups]
        lw = np.bincount(lost_inv, weights=lost_w, minlength=lost_uniq.size)
        kt, ks, kw = np.concatenate([kt, lt]), np.concatenate([ks, ls]), np.concatenate([kw, lw])
    key = kt * np.int64(n_new) + ks
    if len(remainders) == len(groups):
        # kept edges come from kept nodes, summed pruned edges from new remainder rows: no pair is
        # met twice, so only the order (by target, then source) is made
        order = np.argsort(key, kind="stable")
        uniq, summed = key[order], kw[order]
    else:  # a kept remainder of the input also receives pruned edges: sum the pairs met twice
        uniq, inv = _unique_small(key, n_new ** 2)
        summed = np.bincount(inv, weights=kw, minlength=uniq.size)
    keep = summed != 0
    meta = GraphMetadata(graph.metadata)  # the pruned graph's own copy, completed below
    pruned = AttributionGraph(
        nodes=nodes,
        edge_target=(uniq // len(nodes))[keep],
        edge_source=(uniq % len(nodes))[keep],
        edge_weight=summed[keep].astype(graph.edge_weight.dtype, copy=False),
        targets=list(graph.targets),
        metadata=meta,
        context=graph.context,
        max_dense_nodes=graph.max_dense_nodes,
        # the linearised query / key edges between kept nodes (they take no part in the ranking)
        linearised_edges=None if graph.linearised_edges is None else graph.linearised_edges.remap(
            remap, _remainder_rows_of(graph, remap, remainder_rows)),
    )
    pruned.edges_unique = True  # summed per (target, source) above
    meta.set_pruning(params, n_nodes_before=n, n_edges_before=graph.n_edges, n_remainder_nodes=len(remainders))
    meta.set_completeness(pruned.check_completeness())
    return pruned, remainders


def _remainder_rows_of(graph: AttributionGraph, remap: np.ndarray, remainder_rows: dict[tuple[int, int], int]
                       ) -> np.ndarray:
    """Old row -> new row of every kept node, and of every dropped node whose (layer, position) has
    a remainder node in the pruned graph (-1 for the others): where a dropped writer's linearised
    query / key edges go, as its exact edges do."""
    out = remap.copy()
    for r in np.flatnonzero(remap < 0).tolist():
        out[r] = remainder_rows.get((graph.nodes[r].layer, graph.nodes[r].position), -1)
    return out


#: key ranges up to this many values are grouped by counting instead of sorting
_COUNTING_KEYS = 1 << 24


def _unique_small(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for non-negative keys below ``n_keys``: by
    counting (O(E), no sort) when the key range is small, else by sorting; same result."""
    if n_keys > _COUNTING_KEYS or keys.size == 0 or int(keys.min()) < 0:
        uniq, inv = np.unique(keys, return_inverse=True)
        return uniq, inv.reshape(-1)
    present = np.bincount(keys, minlength=n_keys) > 0
    uniq = np.flatnonzero(present)
    rank = np.cumsum(present) - 1
    return uniq.astype(keys.dtype, copy=False), rank[keys]


