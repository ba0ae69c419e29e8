#!/usr/bin/env python
"""circuit-tracer 0.5.0 end to end, timed: load, ``attribute``, ``create_graph_files`` (circuit-tracer venv).

    .venv-ct/bin/python benchmarks/circuit_tracer/ct_pipeline.py \
        --model B/model --transcoders B/transcoders --tokens TOKENS.json --out-dir OUT \
        [--batch-size 512] [--max-feature-nodes N] [--t0-epoch SECONDS] [--threads N]

``run_benchmarks.py`` starts it in circuit-tracer's default environment (the inherited one
without any OpenMP / MKL variable, torch's own thread count: ``--ct-env default``), or with
circuitgraph's OpenMP settings and ``--threads`` (``--ct-env tuned``); the variables it saw are
recorded (``tuning_environment``).  The end-to-end window is what a circuit-tracer user runs to get a pruned graph JSON on disk:
process start and imports, loading (``run_ct.build_replacement_model``, the same loader as
``run_ct.py``), ``attribute`` and ``create_graph_files`` (which calls ``prune_graph`` with node
0.8 / edge 0.98 itself and writes the Neuronpedia JSON).  The process records the wall-clock
time (``time.time()``) and its peak RSS when that JSON is written.  ``--t0-epoch`` is the
caller's ``time.time()`` just before it started this process, so the caller gets the
whole-process time up to the JSON.

Only afterwards, outside that window, it writes what the comparison with circuitgraph needs:
``OUT/graph.npz`` (the fields of ``run_ct.py``'s npz that ``compare.py`` reads:
``adjacency_matrix``, ``active_features``, ``selected_features``, ``logit_tokens``,
``logit_probabilities``, ``input_tokens``, ``n_layers``, ``n_pos``, ``n_features``) and
``OUT/prune.npz`` (``prune_graph``'s node mask and kept edges as ``[target_row, source_col]``,
as ``run_ct.py --prune-out`` writes them), and ``OUT/ct_pipeline.json`` with the timings.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from run_ct import build_replacement_model, find_tokenizer_dir, log, peak_rss_mb, read_tokens  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--transcoders", required=True, type=Path)
    ap.add_argument("--tokens", required=True, help="JSON list or a JSON file {\"tokens\": [...]}")
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--max-feature-nodes", type=int, default=None)
    ap.add_argument("--max-n-logits", type=int, default=10)
    ap.add_argument("--desired-logit-prob", type=float, default=0.95)
    ap.add_argument("--node-threshold", type=float, default=0.8)
    ap.add_argument("--edge-threshold", type=float, default=0.98)
    ap.add_argument("--t0-epoch", type=float, default=None, help="the caller's time.time() at launch")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-dump", action="store_true", help="skip graph.npz / prune.npz")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    from circuit_tracer import attribute
    from circuit_tracer.utils.create_graph_files import create_graph_files

    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    timings = {"import": time.perf_counter() - T_START}
    peak = {"import": peak_rss_mb()}

    t0 = time.perf_counter()
    notes: list[str] = []
    model, archs, _ = build_replacement_model(args.model, args.transcoders, find_tokenizer_dir(args.model),
                                              out / "tokenizer", "clamp", notes)
    timings["load"] = time.perf_counter() - t0
    peak["load"] = peak_rss_mb()

    tokens = torch.tensor(read_tokens(args.tokens), dtype=torch.long)
    t0 = time.perf_counter()
    graph = attribute(tokens, model, max_n_logits=args.max_n_logits, desired_logit_prob=args.desired_logit_prob,
                      batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes)
    timings["attribute"] = time.perf_counter() - t0
    peak["attribute"] = peak_rss_mb()

    t0 = time.perf_counter()
    create_graph_files(graph, slug="graph", output_path=str(out), node_threshold=args.node_threshold,
                       edge_threshold=args.edge_threshold)
    timings["create_graph_files"] = time.perf_counter() - t0
    peak["create_graph_files"] = peak_rss_mb()
    epoch_json = time.time()
    timings["end_to_end_in_process"] = time.perf_counter() - T_START
    log(f"attribute {timings['attribute']:.1f}s, create_graph_files {timings['create_graph_files']:.1f}s, "
        f"peak {peak['create_graph_files']:.0f} MiB")

    info = {
        "timings_s": timings,
        "peak_rss_mb": peak,
        "epoch_json_written": epoch_json,
        "t0_epoch": args.t0_epoch,
        "end_to_end_s": (epoch_json - args.t0_epoch) if args.t0_epoch else None,
        "n_pos": int(graph.n_pos),
        "n_active_features": int(len(graph.active_features)),
        "n_selected_features": int(len(graph.selected_features)),
        "adjacency_shape": list(graph.adjacency_matrix.shape),
        "logit_tokens": graph.logit_token_ids.cpu().tolist(),
        "threads": torch.get_num_threads(),
        "tuning_environment": {k: v for k, v in sorted(os.environ.items())
                               if k.startswith(("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_"))},
        "batch_size": args.batch_size,
        "max_feature_nodes": args.max_feature_nodes,
        "architectures": archs,
        "notes": notes,
        "json_bytes": (out / "graph.json").stat().st_size,
    }
    try:
        import circuit_tracer

        info["versions"] = {"circuit_tracer": circuit_tracer.__version__, "torch": torch.__version__}
    except AttributeError:
        pass

    if not args.no_dump:
        from circuit_tracer.graph import prune_graph

        t0 = time.perf_counter()
        node_mask, edge_mask, _ = prune_graph(graph, node_threshold=args.node_threshold,
                                              edge_threshold=args.edge_threshold)
        em = edge_mask.cpu().numpy()
        np.savez_compressed(out / "prune.npz", node_mask=node_mask.cpu().numpy(),
                            edge_mask_indices=np.argwhere(em).astype(np.int64),
                            edge_mask_shape=np.array(em.shape, dtype=np.int64))
        del edge_mask, em
        np.savez(out / "graph.npz",
                 adjacency_matrix=graph.adjacency_matrix.float().cpu().numpy(),
                 active_features=graph.active_features.cpu().numpy().astype(np.int64),
                 selected_features=graph.selected_features.cpu().numpy().astype(np.int64),
                 logit_tokens=graph.logit_token_ids.cpu().numpy().astype(np.int64),
                 logit_probabilities=graph.logit_probabilities.float().cpu().numpy(),
                 input_tokens=graph.input_tokens.cpu().numpy().astype(np.int64),
                 n_layers=np.int64(model.cfg.n_layers), n_pos=np.int64(graph.n_pos),
                 n_features=np.int64(len(graph.selected_features)))
        info["dump_seconds"] = time.perf_counter() - t0
    info["peak_rss_mb"]["end"] = peak_rss_mb()
    (out / "ct_pipeline.json").write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
