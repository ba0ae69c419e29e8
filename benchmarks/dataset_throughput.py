"""Dataset runs: prompts per minute against workers, local processes and a local Ray instance.

Runs ``examples/demo_dataset.yaml`` on its first ``--n`` rows once per configuration
(local with 1 and 2 workers, Ray on a local instance with 1 and 2 workers), each in a fresh
Python process so every configuration pays its own start-up, and records:

* ``prompts_per_minute``: prompts over the executor's wall time, start-up included
  (loading the model in each worker, starting Ray);
* ``steady_prompts_per_minute``: ``60 * workers / mean seconds per prompt`` (start-up excluded);
* the aggregation's overhead: seconds reducing each graph (in the workers) and combining the
  parts and writing the Parquet files (in the driver), against the run's time;
* the machine's load average before and after each run (the machine may be shared).

    python benchmarks/dataset_throughput.py --n 100 --out docs/benchmarks/dataset.json

The Markdown table goes to stdout; ``run_benchmarks.py --only dataset`` records a run on docs/benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFIGS = [
    ("local", 1, {"kind": "local", "workers": 1}),
    ("local", 2, {"kind": "local", "workers": 2}),
    ("ray (local instance)", 1, {"kind": "ray", "address": "local", "workers": 1}),
    ("ray (local instance)", 2, {"kind": "ray", "address": "local", "workers": 2}),
]

_CHILD = r"""
import json, sys, time
import circuitgraph
spec = json.loads(sys.argv[1])
t0 = time.perf_counter()
result = circuitgraph.run(spec)
wall = time.perf_counter() - t0
m = circuitgraph.open_dataset(result.directory).manifest
ok = m[m["status"] == "ok"]
print(json.dumps({"timings": result.timings, "wall": wall, "n_ok": int(result.n_ok),
                  "mean_prompt_seconds": float(ok["time_total"].mean()),
                  "reduce_seconds": float(ok["time_reduce"].sum())}))
"""


def _spec(n: int, executor: dict, out: Path) -> dict:
    import yaml

    spec = yaml.safe_load((REPO / "examples" / "demo_dataset.yaml").read_text())
    rows = [json.loads(line) for line in (REPO / "examples" / "demo_dataset.jsonl").read_text().splitlines()[:n]]
    spec.update(dataset=rows, executor=executor)
    spec["export"] = {"dataset": str(out)}
    return spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="prompts per run (the first n of the demo dataset)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "dataset.json")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
               OMP_WAIT_POLICY="PASSIVE")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (executor, workers, cfg) in enumerate(CONFIGS):
            load_before = os.getloadavg()
            spec = _spec(args.n, cfg, Path(tmp) / f"run{i}")
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], env=env, capture_output=True,
                                  text=True, check=False)
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"{executor} x{workers} failed:\n{proc.stderr[-3000:]}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            t = out["timings"]
            runs.append({
                "executor": executor, "workers": workers, "prompts": args.n, "ok": out["n_ok"],
                "process_seconds": elapsed,
                "executor_seconds": t["time_prompts"],
                "prompts_per_minute": 60.0 * args.n / t["time_prompts"],
                "steady_prompts_per_minute": 60.0 * workers / out["mean_prompt_seconds"],
                "mean_prompt_seconds": out["mean_prompt_seconds"],
                "reduce_seconds_total": out["reduce_seconds"],
                "aggregate_seconds": t["time_aggregate"],
                "aggregation_overhead": (out["reduce_seconds"] + t["time_aggregate"]) / t["time_prompts"],
                "load_before": list(load_before), "load_after": list(os.getloadavg()),
            })
            print(f"{executor} x{workers}: {runs[-1]['prompts_per_minute']:.1f} prompts/min", file=sys.stderr)
    record = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
              "spec": "examples/demo_dataset.yaml (first n rows)", "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        "| executor | workers | prompts/min (start-up included) | prompts/min (steady) | s/prompt | "
        "aggregation overhead | load avg before -> after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['executor']} | {r['workers']} | {r['prompts_per_minute']:.1f} | {r['steady_prompts_per_minute']:.1f} | "
            f"{r['mean_prompt_seconds']:.3f} | {100 * r['aggregation_overhead']:.2f}% "
            f"({r['reduce_seconds_total']:.2f} s reduce + {r['aggregate_seconds']:.2f} s combine) | "
            f"{r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
