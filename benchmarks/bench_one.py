#!/usr/bin/env python
"""One benchmark run of circuitgraph, in its own process: load, attribute, score, prune, export.

    python benchmarks/bench_one.py --bundle DIR --tokens TOKENS.json --out-dir DIR --result RESULT.json \
        [--max-feature-nodes N] [--batch-size 256] [--model-dtype float32] [--graph-dtype float32] \
        [--threads N] [--no-export] [--memory-limit-gb GB] [--count-only]

``run_benchmarks.py`` starts this script once per configuration, so that the peak resident
memory it records (``ru_maxrss``) belongs to that run alone.  Each stage is timed separately:

* ``load``: the model and transcoders from the bundle (``circuitgraph.pipeline.inputs.load_inputs`` on a
  spec, so the model / graph dtypes follow the spec's rules);
* ``attribute``: graph construction, :func:`circuitgraph.attribution.attribute` (forward pass,
  targets, nodes, every edge, the completeness check);
* ``scores``: replacement / completeness scores (what ``circuitgraph run`` attaches to a graph);
* ``prune``: :func:`circuitgraph.queries.prune_graph` with node 0.8 / edge 0.98;
* ``export_json``: the pruned graph as JSON; ``export_npz``: the full graph in the binary format.

The result JSON holds the timings, the peak RSS after each stage (it only grows), the graph
sizes and the completeness report of the full and the pruned graph.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from circuitgraph.cli.main import openmp_defaults  # noqa: E402 - imports no torch

# as ``circuitgraph run`` does inside itself (``circuitgraph.cli.main.main``): OpenMP threads spin
# briefly, then sleep, unless the environment sets either variable (set before torch loads); the
# benchmark starts this process in the plain environment, as it starts ``circuitgraph run``
openmp_defaults(os.environ)
#: the thread-tuning variables this process runs with (recorded in the result)
TUNING_ENVIRONMENT = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("OMP_", "GOMP_", "KMP_", "MKL_"))}
import resource  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

__all__ = ["BenchParams", "run_one", "count_active", "peak_rss_mb"]


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dir_bytes(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


class BenchParams:
    """What one run does (plain attributes, so the smoke test can build one in-process)."""

    def __init__(self, bundle: Path, tokens: list[int], out_dir: Path, *, max_feature_nodes: int | None = None,
                 batch_size: int = 256, model_dtype: str = "float32", graph_dtype: str = "float32",
                 node_threshold: float = 0.8, edge_threshold: float = 0.98, export: bool = True,
                 threads: int | None = None, memory_limit_gb: float | None = None, device: str = "cpu"):
        self.bundle = Path(bundle)
        self.tokens = list(tokens)
        self.out_dir = Path(out_dir)
        self.max_feature_nodes = max_feature_nodes
        self.batch_size = batch_size
        self.model_dtype = model_dtype
        self.graph_dtype = graph_dtype
        self.node_threshold = node_threshold
        self.edge_threshold = edge_threshold
        self.export = export
        self.threads = threads
        self.memory_limit_gb = memory_limit_gb
        self.device = device

    def spec(self) -> dict[str, Any]:
        """The spec this run corresponds to (``circuitgraph run`` on it builds the same graph)."""
        graph: dict[str, Any] = {"dtype": self.graph_dtype, "batch_size": self.batch_size}
        if self.max_feature_nodes is not None:
            graph["max_feature_nodes"] = self.max_feature_nodes
        return {
            "format_version": 1,
            "model": {"path": str(self.bundle / "model"), "dtype": self.model_dtype, "device": self.device},
            "transcoders": {"path": str(self.bundle / "transcoders")},
            "prompt": {"tokens": self.tokens},
            "targets": [{"top_logits": {"max_n": 10, "cumulative_probability": 0.95}}],
            "graph": graph,
            "prune": {"node_threshold": self.node_threshold, "edge_threshold": self.edge_threshold},
        }


def run_one(p: BenchParams) -> dict[str, Any]:
    """Run every stage once; return timings (s), peak RSS (MiB) per stage, sizes and checks."""
    import gc

    gc.disable()  # as `circuitgraph run` does: no collector scans over the library imports (cli.main._settle_heap)
    import torch

    from circuitgraph.adapters.loading import torch_dtype
    from circuitgraph.attribution import attribute
    from circuitgraph.cli.main import _settle_heap
    from circuitgraph.export import graph_to_json, save_graph_binary
    from circuitgraph.pipeline.inputs import load_inputs
    from circuitgraph.queries import prune_graph
    from circuitgraph.queries.scores import graph_scores
    from circuitgraph.spec import load_spec

    _settle_heap()
    if p.threads:
        torch.set_num_threads(p.threads)
    timings: dict[str, float] = {"import": time.perf_counter() - T_START}
    peak: dict[str, float] = {"import": peak_rss_mb()}

    cuda = p.device.startswith("cuda")

    def stage(name: str, t0: float) -> None:
        if cuda:  # absolute device times: wait for the kernels of the stage
            torch.cuda.synchronize()
            peak[name + "_device"] = torch.cuda.max_memory_allocated() / 2**20
        timings[name] = time.perf_counter() - t0
        peak[name] = peak_rss_mb()

    spec = load_spec(p.spec())
    t0 = time.perf_counter()
    adapter, tcs = load_inputs(spec)
    stage("load", t0)

    t0 = time.perf_counter()
    limit = None if p.memory_limit_gb is None else int(p.memory_limit_gb * 1024**3)

    def progress(done: int, total: int) -> None:  # in the log (run_benchmarks.PROGRESS_LINE): where a stopped run was
        print(f"[progress {time.perf_counter() - t0:.1f} s] {done} / {total}", flush=True)

    graph = attribute(adapter, p.tokens, tcs, batch_size=p.batch_size, max_feature_nodes=p.max_feature_nodes,
                      dtype=torch_dtype(p.graph_dtype), memory_limit=limit, progress=progress)
    stage("attribute", t0)

    t0 = time.perf_counter()
    scores = graph_scores(graph, per_target=False)  # what circuitgraph run attaches
    graph.metadata["replacement_score"] = scores.replacement_score
    graph.metadata["completeness_score"] = scores.completeness_score
    stage("scores", t0)

    t0 = time.perf_counter()
    pr = prune_graph(graph, node_threshold=p.node_threshold, edge_threshold=p.edge_threshold)
    stage("prune", t0)

    files: dict[str, int] = {}
    if p.export:
        p.out_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        # every pruned edge (long prompts keep millions; the CLI's default limit is for interactive use)
        graph_to_json(pr.graph, str(p.out_dir / "pruned.json"), max_edges=max(int(pr.graph.n_edges), 1))
        stage("export_json", t0)
        t0 = time.perf_counter()
        save_graph_binary(graph, str(p.out_dir / "full.npz"))
        stage("export_npz", t0)
        files = {"pruned_json_bytes": _dir_bytes(p.out_dir / "pruned.json"),
                 "full_npz_bytes": _dir_bytes(p.out_dir / "full.npz")}

    kinds: dict[str, int] = {}
    for n in graph.nodes:
        kinds[n.kind] = kinds.get(n.kind, 0) + 1
    n_active = sum(1 for n in graph.context.attributed_nodes if n.kind == "feature")
    f = adapter.facts
    return {
        "n_pos": len(p.tokens),
        "n_layers": f.n_layers,
        "d_model": f.d_model,
        "d_sae": next(iter(tcs.layers.values())).d_sae if tcs is not None else None,
        "model_dtype": p.model_dtype,
        "graph_dtype": p.graph_dtype,
        "batch_size": p.batch_size,
        "max_feature_nodes": p.max_feature_nodes,
        "n_active_features": n_active,
        "active_per_token_per_layer": n_active / max(1, (len(p.tokens) - 1) * f.n_layers),
        "n_nodes": graph.n_nodes,
        "n_edges": graph.n_edges,
        "nodes_by_kind": kinds,
        "n_targets": len(graph.targets),
        "target_tokens": [int(t.index) for t, _ in graph.targets],
        "completeness": graph.metadata["completeness"],
        "replacement_score": scores.replacement_score,
        "completeness_score": scores.completeness_score,
        "pruned": {"n_nodes": pr.graph.n_nodes, "n_edges": pr.graph.n_edges,
                   "n_nodes_kept": int(pr.node_mask.sum()), "n_edges_kept": int(pr.edge_mask.sum()),
                   "completeness": pr.graph.metadata["completeness"]},
        "timings_s": timings,
        "peak_rss_mb": peak,
        "files": files,
        "threads": torch.get_num_threads(),
        "tuning_environment": TUNING_ENVIRONMENT,
        "device": p.device,
        "device_name": torch.cuda.get_device_name(0) if cuda else None,
        "versions": graph.metadata.get("versions") or _versions(),
    }


def count_active(p: BenchParams) -> dict[str, Any]:
    """Active transcoder features per (layer, position) on the prompt: one forward pass, no
    edges.  ``run_benchmarks.py`` plans a run's memory from these counts."""
    import torch

    from circuitgraph.attribution.linearisation import linearise
    from circuitgraph.pipeline.inputs import load_inputs
    from circuitgraph.spec import load_spec

    if p.threads:
        torch.set_num_threads(p.threads)
    adapter, tcs = load_inputs(load_spec(p.spec()))
    lin = linearise(adapter, torch.tensor(p.tokens), tcs)
    with torch.no_grad():
        counts = [(tcs[layer].activation(lin.tc_input[layer]) != 0).sum(-1).tolist() for layer in sorted(tcs.layers)]
    return {"n_pos": len(p.tokens), "n_layers": adapter.facts.n_layers, "d_model": adapter.facts.d_model,
            "active_counts": counts, "peak_rss_mb": {"count": peak_rss_mb()}}


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("circuitgraph", "torch", "transformer-lens", "sae-lens", "numpy", "scipy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="DIR with model/ and transcoders/")
    ap.add_argument("--tokens", type=Path, required=True, help='JSON file {"tokens": [...]} or a JSON list')
    ap.add_argument("--out-dir", type=Path, required=True, help="where the exported graphs go")
    ap.add_argument("--result", type=Path, required=True, help="the result JSON to write")
    ap.add_argument("--max-feature-nodes", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--model-dtype", default="float32")
    ap.add_argument("--graph-dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own count)")
    ap.add_argument("--device", default="cpu", help="model: {device: ...} (cuda: stage times wait for the device)")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--count-only", action="store_true",
                    help="only count the active features per (layer, position) (one forward pass)")
    ap.add_argument("--memory-limit-gb", type=float, default=None,
                    help="memory the engine's own guard may plan for (default: the memory available)")
    args = ap.parse_args(argv)
    raw = json.loads(args.tokens.read_text())
    tokens = raw["tokens"] if isinstance(raw, dict) else raw
    params = BenchParams(args.bundle, tokens, args.out_dir, max_feature_nodes=args.max_feature_nodes,
                         batch_size=args.batch_size, model_dtype=args.model_dtype, graph_dtype=args.graph_dtype,
                         export=not args.no_export, threads=args.threads, memory_limit_gb=args.memory_limit_gb,
                         device=args.device)
    if args.count_only:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps(count_active(params)) + "\n")
        return 0
    result = run_one(params)
    result["pid"] = os.getpid()
    result["epoch_end"] = time.time()
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: result[k] for k in ("n_pos", "n_active_features", "n_edges", "timings_s")}),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
