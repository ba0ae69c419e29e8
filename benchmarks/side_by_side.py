#!/usr/bin/env python
"""Compare a circuitgraph graph with circuit-tracer's on the same bundle and prompt: edges and pruning.

    python benchmarks/side_by_side.py --ct-dir CT_OUT --graph FULL.npz [--json RESULT.json]

``CT_OUT`` is the output folder of ``benchmarks/circuit_tracer/ct_pipeline.py`` (``graph.npz``:
circuit-tracer's dense adjacency and node lists; ``prune.npz``: its ``prune_graph`` node mask
and kept edges); ``FULL.npz`` is circuitgraph's unpruned graph in its binary format (written
by ``bench_one.py``).  Nodes are matched by identity, in circuit-tracer's order (NOTES.md
section 1): selected features, error nodes (layer-major), token nodes, logit nodes.

Reported:

* **selected features** (with ``max_feature_nodes``; without it, every active feature): the set
  of ``(layer, position, feature)`` circuit-tracer selected against circuitgraph's feature nodes;
* **edges**: the largest ``|circuitgraph edge - circuit-tracer entry|`` over every entry of
  circuit-tracer's adjacency (an entry circuitgraph has no edge for counts as 0 there), also
  relative to the largest edge;
* **pruning**: circuitgraph's :func:`~circuitgraph.queries.prune_graph` (0.8 / 0.98) on its
  graph, against circuit-tracer's ``prune_graph`` masks: kept nodes equal, kept edges equal,
  and the edges kept by only one of them.

circuit-tracer has an error node at position 0 of every layer whose column is all zero;
circuitgraph folds the position-0 MLP output into constants, so those nodes have no
counterpart (and carry no edge).  With ``max_feature_nodes``, circuitgraph's remainder nodes (the
unselected features' contributions, summed per layer and position) have no circuit-tracer
counterpart either (their edges are counted on their own, not as differences); the kept nodes and
edges are compared over the nodes both have, the kept ones touching a remainder node counted
separately, and once more after removing the remainder nodes before pruning
(``pruning_without_remainders``: the graph then holds exactly circuit-tracer's adjacency).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ct_node_order", "selected_features_agreement", "edge_difference", "pruning_agreement", "compare",
           "cut_margin", "kept_edges_verdict"]


def ct_node_order(ct: Any) -> list:
    """circuit-tracer's rows as circuitgraph node ids (``ct``: the loaded ``graph.npz``)."""
    from circuitgraph.graph.nodes import NodeId

    active, selected = ct["active_features"], ct["selected_features"]
    n_layers, n_pos = int(ct["n_layers"]), int(ct["n_pos"])
    tokens = ct["input_tokens"].tolist()
    order = [NodeId("feature", *[int(v) for v in active[i]]) for i in selected.tolist()]
    order += [NodeId("error", layer, pos, 0) for layer in range(n_layers) for pos in range(n_pos)]
    order += [NodeId("embedding", -1, pos, int(tokens[pos])) for pos in range(n_pos)]
    order += [NodeId("logit", n_layers, n_pos - 1, int(v)) for v in ct["logit_tokens"].tolist()]
    return order


def selected_features_agreement(ct: Any, graph: Any) -> dict[str, Any]:
    """circuit-tracer's selected features against circuitgraph's feature nodes, as sets of
    ``(layer, position, feature)``."""
    active, selected = ct["active_features"], ct["selected_features"]
    theirs = {tuple(int(v) for v in active[i]) for i in selected.tolist()}
    ours = {(n.id.layer, n.id.position, n.id.index) for n in graph.nodes if n.kind == "feature"}
    return {"n_selected_ct": len(theirs), "n_selected_circuitgraph": len(ours), "n_active_ct": int(len(active)),
            "selected_features_equal": theirs == ours, "n_only_ct": len(theirs - ours),
            "n_only_circuitgraph": len(ours - theirs),
            "only_ct": [list(t) for t in sorted(theirs - ours)[:10]],
            "only_circuitgraph": [list(t) for t in sorted(ours - theirs)[:10]]}


def _row_map(graph: Any, order: list) -> np.ndarray:
    index = {nid: i for i, nid in enumerate(order)}
    return np.array([index.get(n.id, -1) for n in graph.nodes], dtype=np.int64)


def edge_difference(adjacency: np.ndarray, graph: Any, row_map: np.ndarray) -> dict[str, Any]:
    """Largest difference over every entry of ``adjacency`` (modified in place: zeroed where
    circuitgraph has an edge)."""
    t, s, w = row_map[graph.edge_target], row_map[graph.edge_source], graph.edge_weight.astype(np.float64)
    both = (t >= 0) & (s >= 0)
    scale = float(np.abs(adjacency).max())
    theirs = adjacency[t[both], s[both]].astype(np.float64)
    diff_on_ours = np.abs(w[both] - theirs)
    worst_i = int(diff_on_ours.argmax()) if diff_on_ours.size else -1
    # remainder nodes (max_feature_nodes) hold the unselected features' contributions, which
    # circuit-tracer leaves out of its adjacency: not a disagreement, counted on their own
    remainder = np.array([n.kind == "remainder" for n in graph.nodes], dtype=bool)
    from_remainder = remainder[graph.edge_source] | remainder[graph.edge_target]
    other = ~both & ~from_remainder
    only_ours = float(np.abs(w[other]).max()) if other.any() else 0.0
    adjacency[t[both], s[both]] = 0.0  # what is left: circuit-tracer entries circuitgraph lacks
    only_theirs = float(np.abs(adjacency).max())
    largest = max(float(diff_on_ours.max()) if diff_on_ours.size else 0.0, only_ours, only_theirs)
    return {
        "largest_edge": scale,
        "max_abs_difference": largest,
        "max_difference_relative_to_largest_edge": largest / scale if scale else 0.0,
        "max_difference_on_shared_edges": float(diff_on_ours.max()) if diff_on_ours.size else 0.0,
        "largest_ct_entry_without_circuitgraph_edge": only_theirs,
        "largest_circuitgraph_edge_without_ct_node": only_ours,
        "n_remainder_edges_circuitgraph": int(from_remainder.sum()),
        "largest_remainder_edge_circuitgraph": float(np.abs(w[from_remainder]).max()) if from_remainder.any() else 0.0,
        "worst_shared_edge": ([str(graph.nodes[int(graph.edge_source[both][worst_i])].id),
                               str(graph.nodes[int(graph.edge_target[both][worst_i])].id)]
                              if worst_i >= 0 else None),
        "n_edges_circuitgraph": int(graph.n_edges),
        "n_shared_edges": int(both.sum()),
    }


def pruning_agreement(ct_prune: Any, graph: Any, row_map: np.ndarray, order: list,
                      node_threshold: float = 0.8, edge_threshold: float = 0.98) -> dict[str, Any]:
    """circuitgraph's prune_graph on ``graph`` against circuit-tracer's saved masks."""
    from circuitgraph.queries import prune as prune_mod
    from circuitgraph.queries import prune_graph

    n = len(order)
    cuts: list[tuple[np.ndarray, float]] = []  # the score vectors prune_graph cuts (nodes, then edges)
    real_find = prune_mod.find_threshold

    def recording_find(scores: np.ndarray, threshold: float) -> float:
        cuts.append((scores, threshold))
        return real_find(scores, threshold)

    prune_mod.find_threshold = recording_find
    try:
        res = prune_graph(graph, node_threshold=node_threshold, edge_threshold=edge_threshold)
    finally:
        prune_mod.find_threshold = real_find
    ours_nodes = {int(r) for r in row_map[np.flatnonzero(res.node_mask)] if r >= 0}
    ct_nodes = set(np.flatnonzero(ct_prune["node_mask"]).tolist())
    em = res.edge_mask
    t, s = row_map[graph.edge_target[em]], row_map[graph.edge_source[em]]
    shared = (t >= 0) & (s >= 0)  # edges between nodes circuit-tracer also has (not remainder nodes)
    ours_edges = np.unique(t[shared] * np.int64(n) + s[shared])
    unmatched_nodes = {str(graph.nodes[int(i)].id) for i in np.flatnonzero(res.node_mask) if row_map[int(i)] < 0}
    idx = ct_prune["edge_mask_indices"]
    ct_edges = np.unique(idx[:, 0].astype(np.int64) * n + idx[:, 1])
    only_ours = np.setdiff1d(ours_edges, ct_edges)
    only_ct = np.setdiff1d(ct_edges, ours_edges)
    name = lambda k: f"{order[int(k) % n]} -> {order[int(k) // n]}"  # noqa: E731
    out = {
        "n_nodes_kept_ct": len(ct_nodes),
        "n_nodes_kept_circuitgraph": len(ours_nodes),
        "kept_nodes_equal": ours_nodes == ct_nodes,
        "nodes_only_ct": [str(order[i]) for i in sorted(ct_nodes - ours_nodes)][:20],
        "nodes_only_circuitgraph": [str(order[i]) for i in sorted(ours_nodes - ct_nodes)][:20],
        "n_nodes_kept_without_ct_node": len(unmatched_nodes),
        "n_edges_kept_without_ct_node": int((~shared).sum()),
        "n_edges_kept_ct": int(ct_edges.size),
        "n_edges_kept_circuitgraph": int(ours_edges.size),
        "kept_edges_equal": bool(only_ours.size == 0 and only_ct.size == 0),
        "n_edges_only_ct": int(only_ct.size),
        "n_edges_only_circuitgraph": int(only_ours.size),
        "edges_only_ct": [name(k) for k in only_ct[:10]],
        "edges_only_circuitgraph": [name(k) for k in only_ours[:10]],
        "circuitgraph_edge_score_threshold": res.edge_score_threshold,
        "circuitgraph_node_score_threshold": res.node_score_threshold,
        "edge_cut": cut_margin(*cuts[-1]) if cuts else None,
    }
    out["kept_edges_verdict"] = kept_edges_verdict(out)
    return out


def cut_margin(scores: np.ndarray, threshold: float) -> dict[str, Any]:
    """How sharp circuit-tracer's cumulative-share cut is on these scores: the rank of the cut
    (largest first), the share of the total that one score at the cut holds, and how far the
    cumulative share is from ``threshold`` at the cut and just before it.  circuit-tracer makes
    the same cut in float32 (scores, cumulative shares: a float32 step near 1 is 6e-8), so when
    both distances are a few float32 steps a cut one rank earlier or later is a tie, not a
    different circuit."""
    s = np.sort(np.asarray(scores, dtype=np.float64))[::-1]
    total = float(s.sum())
    if s.size == 0 or total <= 0:
        return {"rank": None}
    cum = np.cumsum(s) / total
    k = min(int(np.searchsorted(cum, threshold, side="left")), s.size - 1)
    return {
        "rank": k,
        "n_scores": int(s.size),
        "share_of_one_score_at_cut": float(s[k] / total),
        "cumulative_share_at_cut_minus_threshold": float(cum[k] - threshold),
        "cumulative_share_before_cut_minus_threshold": float(cum[k - 1] - threshold) if k else None,
    }


def kept_edges_verdict(p: dict[str, Any]) -> str:
    """``equal``; ``tie at the cut`` (the kept sets differ only by edges kept one rank before or
    after the cut and the cut is within float32 resolution of the threshold); or ``different``."""
    if p["kept_edges_equal"]:
        return "equal"
    cut = p.get("edge_cut") or {}
    n_diff = p["n_edges_only_ct"] + p["n_edges_only_circuitgraph"]
    near = [cut.get("cumulative_share_at_cut_minus_threshold"), cut.get("cumulative_share_before_cut_minus_threshold")]
    float32_steps = 4 * 2.0**-24  # a few float32 steps of a cumulative share near 1
    if (cut.get("rank") is not None and n_diff <= 2 and None not in near
            and abs(p["n_edges_kept_ct"] - p["n_edges_kept_circuitgraph"]) == n_diff
            and min(abs(x) for x in near) <= float32_steps):
        return "tie at the cut"
    return "different"


def compare(ct_dir: Path, graph_npz: Path) -> dict[str, Any]:
    from circuitgraph.export import load_graph_binary

    graph = load_graph_binary(str(graph_npz))
    with np.load(ct_dir / "graph.npz") as z:
        ct = {k: z[k] for k in z.files}
    order = ct_node_order(ct)
    row_map = _row_map(graph, order)
    ct_targets = [str(n) for n in order[-len(ct["logit_tokens"]):]]
    our_targets = [str(t) for t, _ in graph.targets]
    out: dict[str, Any] = {"targets_equal": ct_targets == our_targets, "n_nodes_ct": len(order),
                           "selected_features": selected_features_agreement(ct, graph),
                           "n_nodes_circuitgraph": graph.n_nodes,
                           "circuitgraph_nodes_without_ct_node": int((row_map < 0).sum())}
    adjacency = ct.pop("adjacency_matrix")
    out["nonzero_ct"] = int(np.count_nonzero(adjacency))
    out.update(edge_difference(adjacency, graph, row_map))
    del adjacency
    with np.load(ct_dir / "prune.npz") as z:
        ct_prune = {k: z[k] for k in z.files}
    out["pruning"] = pruning_agreement(ct_prune, graph, row_map, order)
    if any(n.kind == "remainder" for n in graph.nodes):
        # the same pruning on circuit-tracer's node set: circuitgraph's graph without its remainder
        # nodes holds exactly circuit-tracer's adjacency, so a difference left here is a pruning one
        same_nodes = graph.subgraph([n.id for n in graph.nodes if n.kind != "remainder"])
        out["pruning_without_remainders"] = pruning_agreement(ct_prune, same_nodes, _row_map(same_nodes, order),
                                                              order)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ct-dir", type=Path, required=True)
    ap.add_argument("--graph", type=Path, required=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    text = json.dumps(compare(args.ct_dir, args.graph), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
