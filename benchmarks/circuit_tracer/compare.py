"""Compare circuitgraph's default transcoder graph with circuit-tracer's adjacency, edge by edge.

Run circuit-tracer first (its own venv, see NOTES.md):

    .venv-ct/bin/python benchmarks/circuit_tracer/run_ct.py --model B/model \
        --transcoders B/transcoders --tokens B/prompt.json --out OUT/graph.npz

then, with the project's Python:

    python benchmarks/circuit_tracer/compare.py --bundle B --ct OUT/graph.npz [--json RESULT.json]

circuitgraph is given the same prompt and the same logit targets (circuit-tracer's selected
tokens, relative to the mean logit); every entry of circuit-tracer's adjacency (features,
errors, tokens, logits) is compared with the corresponding circuitgraph edge (0 where
circuitgraph has none; circuit-tracer's position-0 error columns are all zero, circuitgraph
folds them into constants).  Reports the largest difference relative to the largest edge.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def compare(bundle: Path, ct_npz: Path, *, dtype: str = "float32") -> dict:
    from circuitgraph.adapters.loading import load_model_dir, torch_dtype
    from circuitgraph.attribution import ResolvedTarget, attribute
    from circuitgraph.dictionaries import TranscoderSet

    ct = np.load(ct_npz)
    adjacency = ct["adjacency_matrix"].astype(np.float64)
    active = ct["active_features"]
    selected = ct["selected_features"]
    n_layers, n_pos = int(ct["n_layers"]), int(ct["n_pos"])
    logit_tokens = ct["logit_tokens"].tolist()
    probs = ct["logit_probabilities"].tolist()
    tokens = ct["input_tokens"].tolist()

    t0 = time.perf_counter()
    adapter = load_model_dir(bundle / "model", dtype=dtype)
    tcs = TranscoderSet.from_dir(bundle / "transcoders", adapter, dtype=torch_dtype(dtype))
    targets = [ResolvedTarget("logit", len(tokens) - 1, float(p), (int(v),), True, probability=float(p))
               for v, p in zip(logit_tokens, probs, strict=False)]
    g = attribute(adapter, tokens, tcs, targets, dtype=torch_dtype(dtype))
    seconds = time.perf_counter() - t0

    # circuit-tracer's node order -> our node ids
    from circuitgraph.graph.nodes import NodeId

    order: list[NodeId | None] = []
    for i in selected.tolist():
        layer, pos, feat = active[i].tolist()
        order.append(NodeId("feature", layer, pos, feat))
    for layer in range(n_layers):
        for pos in range(n_pos):
            order.append(NodeId("error", layer, pos, 0))
    for pos in range(n_pos):
        order.append(NodeId("embedding", -1, pos, tokens[pos]))
    L = n_layers
    for v in logit_tokens:
        order.append(NodeId("logit", L, len(tokens) - 1, int(v)))
    assert len(order) == adjacency.shape[0], (len(order), adjacency.shape)
    ours = np.zeros_like(adjacency)
    ct_index = {nid: i for i, nid in enumerate(order)}
    missing_nodes = [str(n.id) for n in g.nodes if n.id not in ct_index]
    row_map = np.array([ct_index.get(n.id, -1) for n in g.nodes])
    t, s = row_map[g.edge_target], row_map[g.edge_source]
    keep = (t >= 0) & (s >= 0)
    np.add.at(ours, (t[keep], s[keep]), g.edge_weight[keep].astype(np.float64))
    dropped = float(np.abs(g.edge_weight[~keep]).max()) if (~keep).any() else 0.0
    scale = float(np.abs(adjacency).max())
    diff = np.abs(ours - adjacency)
    worst = np.unravel_index(diff.argmax(), diff.shape)
    return {
        "bundle": str(bundle),
        "n_nodes_ct": int(adjacency.shape[0]),
        "n_nodes_circuitgraph": g.n_nodes,
        "n_edges_circuitgraph": g.n_edges,
        "nonzero_ct": int((adjacency != 0).sum()),
        "largest_edge": scale,
        "max_abs_difference": float(diff.max()),
        "max_difference_relative_to_largest_edge": float(diff.max() / scale),
        "worst_entry": [str(order[worst[0]]), str(order[worst[1]])],
        "our_nodes_not_in_ct": missing_nodes[:10],
        "largest_dropped_edge": dropped,
        "completeness": g.metadata["completeness"],
        "circuitgraph_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--ct", type=Path, required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    result = compare(args.bundle, args.ct, dtype=args.dtype)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
