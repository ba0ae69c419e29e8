#!/usr/bin/env python
"""The memory of every stage of one ``circuitgraph run``, next to the dry run's estimate.

    python benchmarks/memory_stages.py SPEC [--result RESULT.json] [--memory-limit GB] [--no-dry-run]

First the dry run, in its own process (``circuitgraph run SPEC --dry-run``: its estimate and
advice); then the run itself in this process (:func:`circuitgraph.pipeline.runner.run`), whose
memory watch (:class:`circuitgraph.pipeline.memory_watch.MemoryWatch`, sampling the resident
memory every 20 ms) records each stage's resident memory at its start and its peak.  Printed:
one line per stage (start, peak, growth, growth per edge of the full graph and per edge of the
pruned graph), the process's peak (``ru_maxrss``) and the estimate.  docs/benchmarks/memory.md
records what it measured and how the per-edge costs of :mod:`circuitgraph.pipeline.stage_memory`
were derived from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from circuitgraph.cli.main import openmp_defaults

openmp_defaults(os.environ)


def _dry_run(spec: str, memory_limit: float | None) -> list[str]:
    cmd = [sys.executable, "-m", "circuitgraph", "run", spec, "--dry-run"]
    if memory_limit is not None:
        cmd += ["--memory-limit", str(memory_limit)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return [line for line in out.stdout.splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec")
    ap.add_argument("--result", default=None, help="write the numbers as JSON here")
    ap.add_argument("--memory-limit", type=float, default=None, help="the run's budget in GB")
    ap.add_argument("--no-dry-run", action="store_true")
    args = ap.parse_args()
    dry = [] if args.no_dry_run else _dry_run(args.spec, args.memory_limit)
    for line in dry:
        print("dry run:", line, flush=True)

    from circuitgraph.pipeline.runner import run

    limit = None if args.memory_limit is None else int(args.memory_limit * 1024**3)
    record: dict = {"spec": args.spec, "dry_run": dry, "memory_limit_gb": args.memory_limit}
    try:
        result = run(args.spec, force=True, memory_limit=limit)
    except Exception as exc:  # noqa: BLE001 - the refusal is the measurement
        record["error"] = f"{type(exc).__name__}: {exc}"
        print("run stopped:", record["error"], flush=True)
    else:
        full, kept = result.full_graph.n_edges, result.graph.n_edges
        record.update(full_edges=full, kept_edges=kept, nodes=result.full_graph.n_nodes, stages=result.memory,
                      timings=result.timings)
        print(f"full graph: {result.full_graph.n_nodes:,} nodes, {full:,} edges; pruned: {kept:,} edges")
        record["completeness_max_relative_violation"] = result.full_graph.metadata["completeness"][
            "max_relative_violation"]
        record["validation"] = [
            {"kind": v["kind"], "status": v["status"], **({"correlation": v["result"].correlation,
                                                          "correlation_total": v["result"].correlation_total,
                                                          "sign_agreement": v["result"].sign_agreement}
                                                         if v["kind"] == "predicted_vs_actual" and v["result"] else {})}
            for v in result.validation]
        print(f"completeness (max relative violation): {record['completeness_max_relative_violation']:.2e}; "
              f"validation: {record['validation']}")
        print(f"{'stage':34s} {'start GB':>9s} {'peak GB':>9s} {'growth GB':>10s} {'B/full edge':>12s} "
              f"{'B/kept edge':>12s}")
        for stage, m in result.memory.items():
            growth = m["peak"] - m["start"]
            print(f"{stage:34s} {m['start'] / 1024**3:9.3f} {m['peak'] / 1024**3:9.3f} {growth / 1024**3:10.3f} "
                  f"{growth / max(full, 1):12.1f} {growth / max(kept, 1):12.1f}")
    record["ru_maxrss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"process peak (ru_maxrss): {record['ru_maxrss_gb']:.3f} GB")
    if args.result:
        Path(args.result).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
