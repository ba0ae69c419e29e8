#!/usr/bin/env python
"""Where the time and the memory of ``circuitgraph run SPEC`` go: cProfile per stage, RSS over time.

    python benchmarks/profile_run.py SPEC.json [--memory] [--top 30] [--threads 2]

Runs :func:`circuitgraph.pipeline.runner.run` on the spec (what the ``circuitgraph run`` command does) under
cProfile and prints, for the functions of the pipeline (loading, linearisation, node
collection, edge computation and its attention transpose, scores, pruning, export), the
inclusive time split by caller -- e.g. ``sweep`` once under the scores and twice
under the pruning -- then the top functions by own time.  ``--memory`` instead samples the
process's resident memory every 20 ms together with the innermost circuitgraph frames of the
main thread, and prints each new 0.5 GB high-water mark with the code that reached it (no
cProfile, so the times are undisturbed).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
import time
import traceback

#: (label, file suffix, function name) of the pipeline's functions, in pipeline order
PIPELINE = [
    ("imports + load model and transcoders", "circuitgraph/pipeline/inputs.py", "load_inputs"),
    ("linearise (forward pass, cache)", "attribution/linearisation.py", "linearise"),
    ("collect_nodes (readers, writers)", "attribution/nodes_builder.py", "collect_nodes"),
    ("compute_edges (all edges)", "attribution/engine.py", "compute_edges"),
    ("  FrozenLinearModel.step_down", "attribution/frozen_model.py", "step_down"),
    ("    attention_transpose", "attribution/frozen_model.py", "attention_transpose"),
    ("      _attention_values (W_O, pattern)", "attribution/frozen_model.py", "_attention_values"),
    ("      _Norm.transpose (ln1 gamma, centring, 1/sigma)", "attribution/frozen_model.py", "transpose"),
    ("select_and_compute (max_feature_nodes)", "attribution/feature_selection.py", "select_and_compute"),
    ("fold_unselected (max_feature_nodes)", "attribution/feature_selection.py", "fold_unselected"),
    ("check_completeness", "graph/graph.py", "check_completeness"),
    ("  _incoming (one chunked pass: sums, |sums|)", "graph/graph.py", "_incoming"),
    ("scores: compute_scores", "queries/scores.py", "compute_scores"),
    ("graph_dag (levels, visiting order)", "graph/dag.py", "graph_dag"),
    ("  dag_order (levels checked on every edge)", "graph/dag.py", "dag_order"),
    ("sweep (back-substitution, one pass)", "graph/dag.py", "sweep"),
    ("prune_graph", "queries/prune.py", "prune_graph"),
    ("  _build_pruned_graph (remainders)", "queries/prune.py", "_build_pruned_graph"),
    ("  find_threshold (sort, cumsum)", "queries/prune.py", "find_threshold"),
    ("weighted_influence", "queries/_sparse.py", "weighted_influence"),
    ("export: graph_to_json", "export/json_graph.py", "graph_to_json"),
]
CALLER_NAMES = {"compute_scores": "scores", "prune_graph": "prune", "node_influence": "influence",
                "weighted_influence": "weighted_influence", "partial_influence": "max_feature_nodes ranking",
                "reader_gradients": "reader_gradients", "total_effects": "total_effects"}


def _find(stats: pstats.Stats, suffix: str, name: str):
    for func, value in stats.stats.items():  # type: ignore[attr-defined]
        if func[0].endswith(suffix) and func[2] == name:
            return func, value
    return None, None


def profile_times(spec: str, top: int) -> None:
    from circuitgraph.pipeline import runner as api

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    result = api.run(spec)
    prof.disable()
    total = time.perf_counter() - t0
    g = result.full_graph
    print(f"circuitgraph.pipeline.runner.run: {total:.1f} s under cProfile; graph {g.n_nodes:,} nodes, {g.n_edges:,} edges; "
          f"stages (api timings): " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items()))
    stats = pstats.Stats(prof)
    print("\n| stage / function | inclusive s | share | calls | by caller |\n|---|---|---|---|---|")
    for label, suffix, name in PIPELINE:
        func, value = _find(stats, suffix, name)
        if func is None:
            continue
        cc, nc, tt, ct, callers = value
        split = {}
        for caller, cv in callers.items():
            key = CALLER_NAMES.get(caller[2], caller[2])
            split[key] = split.get(key, 0.0) + cv[3]
        ranked = sorted(split.items(), key=lambda kv: -kv[1])
        by = ", ".join(f"{k} {v:.1f}" for k, v in ranked) if len(split) > 1 else ""
        print(f"| {label} | {ct:.2f} | {ct / total:.0%} | {nc} | {by} |")
    print(f"\nTop {top} by own time:")
    stats.sort_stats("tottime").print_stats(top)


def profile_memory(spec: str) -> None:
    import psutil

    from circuitgraph.pipeline import runner as api

    proc = psutil.Process()
    main_id = threading.get_ident()
    samples: list[tuple[float, int, list[str]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            frame = sys._current_frames().get(main_id)
            stack = [f"{f.filename.split('circuitgraph/')[-1]}:{f.lineno} {f.name}"
                     for f in traceback.extract_stack(frame) if "/circuitgraph/" in f.filename] if frame else []
            samples.append((time.perf_counter(), proc.memory_info().rss, stack[-3:]))
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    api.run(spec)
    done.set()
    thread.join()
    mark = 0
    print("| t (s) | RSS (GB) | where (innermost first) |\n|---|---|---|")
    for t, rss, stack in samples:
        if rss > mark + 0.5 * 1024**3:
            mark = rss
            print(f"| {t - t0:.1f} | {rss / 1024**3:.2f} | {' <- '.join(reversed(stack))} |")
    t, rss, stack = max(samples, key=lambda s: s[1])
    print(f"\npeak {rss / 1024**3:.2f} GB at {t - t0:.1f} s: {' <- '.join(reversed(stack))}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--memory", action="store_true", help="RSS timeline instead of cProfile")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.memory:
        profile_memory(args.spec)
    else:
        profile_times(args.spec, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
