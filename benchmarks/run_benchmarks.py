#!/usr/bin/env python
"""circuitgraph's benchmark suite: one command, random models built here, results in docs/benchmarks/.

    python benchmarks/run_benchmarks.py            # the full suite (~11 min on 2 cores, + bundles once)
    python benchmarks/run_benchmarks.py --quick    # small configurations, a couple of minutes

Random GPT-2-style models and ReLU transcoders are built natively by
``benchmarks/circuit_tracer/make_random_bundle.py`` (TransformerLens + sae-lens, seeded, no
download) and cached in the work folder.  Every configuration then runs in its own process
(``benchmarks/bench_one.py``), so the peak resident memory (``ru_maxrss`` of that child,
from ``os.wait4``) is per run; graph construction, scores, pruning (0.8 / 0.98), JSON export of
the pruned graph and binary export of the full graph are timed separately, and the 1-minute
load average is sampled while it runs.  Suites:

* ``prompt_length``: the 6-layer configuration (d_model 256, 8 heads, d_mlp 1024, d_vocab 1000,
  4096-feature transcoders, ~2% active) at 16 ... 512 tokens;
* ``active_features``: the same model at 32 tokens with transcoders ~0.25% ... 3% active;
* ``gpt2_small``: a GPT-2-small-sized model (12 layers, d_model 768, d_vocab 50257, 24576
  features, ~50 active per token per layer) at 64 and 256 tokens;
* ``precision``: float32, float64, bfloat16 and float16 weights (float32 accumulation) on a
  small configuration, with the completeness check of each;
* ``side_by_side``: circuit-tracer 0.5.0 (its own venv, ``--ct-python``) against
  ``circuitgraph run`` as whole processes from the spec to a pruned graph JSON on disk, on
  the same bundle and prompt, plus the edge-by-edge and kept-edge comparison
  (``benchmarks/side_by_side.py``).

Before each run a short child process counts the active features per (layer, position) on the
prompt; a run whose full graph would not fit the memory budget by that count
(``--memory-budget-gb``, default 16; the estimate is in the results) is run with
``max_feature_nodes`` instead, the other features folded into remainder nodes, and a run that
passes the budget anyway is stopped and retried with half as many feature rows.  Every child,
circuit-tracer's included, runs with the OpenMP wait policy ``circuitgraph run`` sets for itself
(``circuitgraph.cli.main.openmp_defaults``) and the same number of threads.  ``benchmarks/report.py`` writes ``results.md``,
``results.json`` and the plots; ``--report-only`` redraws them from ``results.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


#: the work folder of this invocation (set by main) and exact arguments recorded under a name
_WORK: list[Path] = [Path(tempfile.gettempdir()) / "circuitgraph-bench"]
#: wall-clock limit of one timed child (--time-limit-min; None: no limit)
_TIME_LIMIT_S: list[float | None] = [None]
_PORTABLE_NAMES: dict[str, str] = {}


def _portable(arg: object) -> str:
    """A recorded command argument without this machine's folders: the interpreter as
    ``python``, repository paths relative to the repository, the work folder as ``$WORK``."""
    text = str(arg)
    if text == sys.executable:
        return "python"
    if text in _PORTABLE_NAMES:
        return _PORTABLE_NAMES[text]
    for root, name in ((REPO, ""), (_WORK[0], "$WORK/")):
        prefix = str(root) + os.sep
        if text.startswith(prefix):
            return name + text[len(prefix):]
    return text
MAKE_BUNDLE = HERE / "circuit_tracer" / "make_random_bundle.py"
CT_PIPELINE = HERE / "circuit_tracer" / "ct_pipeline.py"
GB = 1024**3

#: peak bytes per edge of a full graph, attribute + scores + prune + export (measured at commit
#: dec8fe6: 75-83 bytes; 100-120 before the queries' rework)
PEAK_BYTES_PER_EDGE = 90
#: with max_feature_nodes: peak bytes per edge of the selected rows before folding, and the
#: share of the mean feature row a selected row is assumed to hold
MFN_BYTES_PER_EDGE = 110
MFN_ROW_SHARE = 0.5


@dataclass(frozen=True)
class Bundle:
    """A random model + transcoders, made by make_random_bundle.py (GPT-2 style, ReLU)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    d_mlp: int
    d_vocab: int
    d_sae: int
    active_frac: float
    n_ctx: int
    seed: int = 0
    fit_decoder: bool = True
    #: calibration prompts (n_calib of calib_len tokens): cover the longest prompt run on the
    #: bundle, so that about active_frac of the features fire at every position
    calib_len: int = 32
    n_calib: int = 64

    def args(self) -> list[str]:
        a = ["--n-layers", self.n_layers, "--d-model", self.d_model, "--n-heads", self.n_heads,
             "--d-mlp", self.d_mlp, "--d-vocab", self.d_vocab, "--d-sae", self.d_sae,
             "--active-frac", self.active_frac, "--n-ctx", self.n_ctx, "--seed", self.seed,
             "--prompt-len", self.calib_len, "--n-calib-prompts", self.n_calib]
        return [str(x) for x in a] + ([] if self.fit_decoder else ["--no-fit-decoder"])

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]

    def describe(self) -> str:
        return (f"{self.n_layers} layers, d_model {self.d_model}, {self.n_heads} heads, d_mlp {self.d_mlp}, "
                f"d_vocab {self.d_vocab}, {self.d_sae}-feature ReLU transcoders")


@dataclass(frozen=True)
class Run:
    """One configuration: a bundle, a prompt length and the graph options."""

    name: str
    suite: str
    bundle: Bundle
    n_pos: int
    max_feature_nodes: int | None = None  # None: full graph if it fits, else fallback_mfn
    fallback_mfn: int = 4096
    model_dtype: str = "float32"
    graph_dtype: str = "float32"
    batch_size: int = 256
    memory_budget_gb: float | None = None  # None: the suite's --memory-budget-gb
    device: str = "cpu"


@dataclass
class Suite:
    bundles: list[Bundle]
    runs: list[Run]
    side_by_side: Run | None


def configurations(quick: bool) -> Suite:
    """The full suite, or small configurations for ``--quick``.  The 6-layer and GPT-2-sized
    bundles are calibrated on prompts as long as the longest run on them."""
    if quick:
        small = Bundle("small-4L-128d-1024f", 4, 128, 4, 512, 500, 1024, 0.02, 64)
        sparse = [Bundle(f"small-4L-128d-1024f-af{af}", 4, 128, 4, 512, 500, 1024, af, 64) for af in (0.01, 0.04)]
        runs = [Run(f"quick-T{t}", "prompt_length", small, t) for t in (8, 16, 32)]
        runs += [Run(f"quick-af{b.active_frac}-T16", "active_features", b, 16) for b in sparse]
        runs += [Run("quick-T16", "active_features", small, 16)]
        runs += [Run(f"quick-{dt}-T16", "precision", small, 16, model_dtype=dt,
                     graph_dtype="float64" if dt == "float64" else "float32")
                 for dt in ("float32", "float64", "bfloat16", "float16")]
        runs += [Run(f"quick-long-T{t}", "long_prompt_6l", small, t, max_feature_nodes=256) for t in (16, 32, 64)]
        return Suite([small, *sparse], runs, Run("quick-T16", "side_by_side", small, 16))
    six = Bundle("6L-256d-4096f", 6, 256, 8, 1024, 1000, 4096, 0.02, 512, calib_len=512, n_calib=16)
    six_af = [Bundle(f"6L-256d-4096f-af{af}", 6, 256, 8, 1024, 1000, 4096, af, 512, calib_len=512, n_calib=16)
              for af in (0.0025, 0.005, 0.01, 0.03)]
    # ~50 active per token and layer on the benchmark prompts: the encoder biases are set on 16
    # calibration prompts, and a new prompt activates ~1.4x more features than the calibration
    # set at this sparsity (noisy tail quantiles), hence 0.11% rather than 50 / 24576 = 0.20%
    gpt2 = Bundle("gpt2-small-size", 12, 768, 12, 3072, 50257, 24576, 0.0011, 1024, calib_len=256, n_calib=16)
    runs = [Run(f"6L-T{t}", "prompt_length", six, t) for t in (16, 32, 64, 128, 256, 512)]
    runs += [Run(f"6L-af{b.active_frac}-T32", "active_features", b, 32) for b in six_af]
    runs += [Run("6L-T32", "active_features", six, 32)]
    runs += [Run(f"gpt2-T{t}", "gpt2_small", gpt2, t, fallback_mfn=m) for t, m in ((64, 8192), (256, 4096))]
    small = Bundle("small-4L-128d-1024f", 4, 128, 4, 512, 500, 1024, 0.02, 64)
    runs += [Run(f"precision-{dt}-T16", "precision", small, 16, model_dtype=dt,
                 graph_dtype="float64" if dt == "float64" else "float32")
             for dt in ("float32", "float64", "bfloat16", "float16")]
    # long prompts (issue 12): a fixed feature budget, 256 to 2048 positions, 20 GiB
    six_long = Bundle("6L-256d-4096f-2k", 6, 256, 8, 1024, 1000, 4096, 0.02, 2048, calib_len=512, n_calib=16)
    gpt2_long = Bundle("gpt2-small-size-2k", 12, 768, 12, 3072, 50257, 24576, 0.0011, 2048, calib_len=256,
                       n_calib=16)
    runs += [Run(f"6L-long-T{t}", "long_prompt_6l", six_long, t, max_feature_nodes=4096, memory_budget_gb=20.0)
             for t in (256, 512, 1024, 2048)]
    runs += [Run(f"gpt2-long-T{t}", "long_prompt_gpt2", gpt2_long, t, max_feature_nodes=8192, memory_budget_gb=20.0)
             for t in (256, 512, 1024, 2048)]
    return Suite([six, *six_af, gpt2, small, six_long, gpt2_long], runs, Run("6L-T32", "side_by_side", six, 32))


# ----------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def child_env(threads: int) -> dict[str, str]:
    """The environment of every timed child, circuitgraph's and circuit-tracer's alike: the
    OpenMP wait policy ``circuitgraph run`` sets for itself (``circuitgraph.cli.main.openmp_defaults``:
    a brief spin, then sleep; unless the caller set one) and ``threads`` OpenMP threads."""
    from circuitgraph.cli.main import openmp_defaults

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    openmp_defaults(env)
    return env


def run_process(cmd: list[str], *, log_path: Path, env: dict[str, str] | None = None,
                memory_limit_mb: float | None = None, time_limit_s: float | None = None) -> dict[str, Any]:
    """Run ``cmd``; return wall time, the child's own peak RSS (``os.wait4``), exit status and
    the 1-minute load average sampled while it runs.  A child whose resident memory passes
    ``memory_limit_mb`` is killed (``killed_for_memory``), before the system's OOM killer would;
    one that runs longer than ``time_limit_s`` is killed too (``killed_for_time``)."""
    import psutil

    log_path.parent.mkdir(parents=True, exist_ok=True)
    loads = [os.getloadavg()[0]]
    killed = False
    timed_out = False
    t0_epoch = time.time()
    t0 = time.perf_counter()
    with open(log_path, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        watch = psutil.Process(proc.pid)
        n = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.25)
            n += 1
            if n % 4 == 0:
                loads.append(os.getloadavg()[0])
            if memory_limit_mb is not None and not killed:
                try:
                    if watch.memory_info().rss / 2**20 > memory_limit_mb:
                        proc.kill()
                        killed = True
                except psutil.NoSuchProcess:
                    pass
            if time_limit_s is not None and not timed_out and time.perf_counter() - t0 > time_limit_s:
                proc.kill()
                timed_out = True
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "cmd": [_portable(c) for c in cmd],
        "t0_epoch": t0_epoch,
        "wall_s": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "returncode": proc.returncode,
        "killed_for_memory": killed,
        "killed_for_time": timed_out,
        "load_avg_1min": {"start": loads[0], "mean": sum(loads) / len(loads), "max": max(loads)},
        "log": _portable(log_path),
        "log_tail": log_path.read_text()[-2000:] if proc.returncode else "",
    }


def build_bundle(b: Bundle, work: Path) -> Path:
    """Make (or reuse) the bundle; returns its folder."""
    out = work / "bundles" / f"{b.name}-{b.key()}"
    if (out / "bundle.json").exists():
        return out
    log(f"building bundle {b.name} ({b.describe()}, {b.active_frac:.2%} active)")
    res = run_process([sys.executable, str(MAKE_BUNDLE), "--out", str(out), *b.args()],
                      log_path=work / "logs" / f"bundle-{b.name}.log")
    if res["returncode"] != 0:
        raise SystemExit(f"building bundle {b.name} failed:\n{res['log_tail']}")
    return out


def prompt_tokens(b: Bundle, n_pos: int) -> list[int]:
    """A seeded random prompt: BOS (1), then tokens >= 3; shorter prompts are prefixes."""
    import numpy as np

    rng = np.random.default_rng(1234 + b.seed)
    return [1] + rng.integers(3, b.d_vocab, size=b.n_ctx - 1).tolist()[: n_pos - 1]


def estimate_edges(counts: list[list[int]], n_targets: int = 10) -> dict[str, float]:
    """Edges of the full graph if every causally allowed (reader, writer) pair is non-zero, from
    the active features per (layer, position) (``counts[layer][position]``).

    A feature at (layer l, position p >= 1) reads the features and error nodes of layers < l at
    positions 1..p and the token nodes 0..p; each target (at the last position, above the last
    layer) reads every writer.  Frozen attention mixes all earlier positions, so on random
    models nearly every allowed pair is non-zero."""
    import numpy as np

    n = np.asarray(counts, dtype=np.float64)
    n[:, 0] = 0  # no feature nodes at the BOS position
    L, T = n.shape
    per_site = n + (np.arange(T) >= 1)[None, :]  # features + the error node, positions >= 1
    below = np.zeros((L + 1, T))
    below[1:] = np.cumsum(np.cumsum(per_site, axis=0), axis=1)  # layers < l, positions <= p
    row = below[:L] + np.arange(T)[None, :] + 1  # ... + token nodes 0..p
    feature_edges = float((n * row).sum())
    n_features = float(n.sum())
    target_row = float(below[L, T - 1] + T)
    return {"edges": feature_edges + n_targets * target_row, "n_features": n_features,
            "mean_row": feature_edges / max(n_features, 1.0), "widest_row": float(row.max())}


def count_features(run: Run, bundle_dir: Path, work: Path, threads: int) -> list[list[int]]:
    """Active features per (layer, position) on the run's prompt (a child process; cached)."""
    cache = work / "counts" / f"{bundle_dir.name}-T{run.n_pos}-{run.model_dtype}.json"
    if not cache.exists():
        tokens = work / "counts" / f"{bundle_dir.name}-T{run.n_pos}-tokens.json"
        tokens.parent.mkdir(parents=True, exist_ok=True)
        tokens.write_text(json.dumps({"tokens": prompt_tokens(run.bundle, run.n_pos)}))
        proc = run_process([sys.executable, str(HERE / "bench_one.py"), "--count-only", "--bundle", str(bundle_dir),
                            "--tokens", str(tokens), "--out-dir", str(cache.parent), "--result", str(cache),
                            "--model-dtype", run.model_dtype, "--threads", str(threads)],
                           log_path=cache.with_suffix(".log"), env=child_env(threads))
        if proc["returncode"] != 0:
            raise SystemExit(f"counting active features for {run.name} failed:\n{proc['log_tail']}")
    return json.loads(cache.read_text())["active_counts"]


def plan(run: Run, bundle_dir: Path, budget_gb: float, counts: list[list[int]]) -> dict[str, Any]:
    """Full graph, or the largest max_feature_nodes (fallback_mfn, halved) whose estimate fits.

    Peak = twice the weight files + the node tables (~5 copies of a d_model vector per active
    feature) + ``PEAK_BYTES_PER_EDGE`` per edge.  With max_feature_nodes the engine stores every
    edge of the selected rows, unselected sources included, before folding those into
    remainders (``MFN_BYTES_PER_EDGE`` at the peak); a selected row is assumed to hold
    ``MFN_ROW_SHARE`` of the mean feature row (6 layers / 64 tokens / 4096 features: 0.5)."""
    est = estimate_edges(counts)
    n_active = est["n_features"]
    base = (sum(f.stat().st_size for f in bundle_dir.rglob("*.safetensors")) * 2 + 0.5 * GB
            + 5 * 4 * run.bundle.d_model * n_active)
    full_gb = (base + PEAK_BYTES_PER_EDGE * est["edges"]) / GB
    fraction = n_active / max(1.0, run.bundle.d_sae * run.bundle.n_layers * (run.n_pos - 1))
    out: dict[str, Any] = {"n_active_features": n_active, "active_fraction": fraction,
                           "est_full_edges": est["edges"], "est_full_peak_gb": full_gb,
                           "dry_run": _dry_run_estimate(run, bundle_dir, fraction)}

    def mfn_gb(m: int) -> float:
        return (base + MFN_BYTES_PER_EDGE * m * MFN_ROW_SHARE * est["mean_row"]) / GB

    if run.max_feature_nodes is not None:
        out.update(max_feature_nodes=run.max_feature_nodes, reason="fixed",
                   est_mfn_peak_gb=mfn_gb(run.max_feature_nodes))
    elif full_gb <= budget_gb:
        out.update(max_feature_nodes=None, reason="full graph fits")
    else:
        m = run.fallback_mfn
        while m > 256 and mfn_gb(m) > budget_gb:
            m //= 2
        reason = f"full graph est. {full_gb:.0f} GB > {budget_gb:.0f} GB"
        if m != run.fallback_mfn:
            reason += f"; {run.fallback_mfn} features est. {mfn_gb(run.fallback_mfn):.0f} GB"
        out.update(max_feature_nodes=m, reason=reason, est_mfn_peak_gb=mfn_gb(m))
    return out


def recheck_dry_run(suite: Suite, work: Path, out: Path) -> int:
    """``--recheck-dry-run``: the dry run's estimate of each recorded run, made again with the
    current code, stored next to the first one (``plan.dry_run_recheck``, with the commit)."""
    from report import write_report

    results = json.loads((out / "results.json").read_text())
    by_name = {r.name: r for r in suite.runs}
    code = code_state()
    for rec in results["runs"]:
        run = by_name.get(rec["name"])
        if run is None or "result" not in rec:
            continue
        log(f"{run.name}: dry run at {code['commit']}")
        dr = _dry_run_estimate(run, build_bundle(run.bundle, work), 0.0) or {}
        rec["plan"]["dry_run_recheck"] = {**dr, "commit": code["commit"]}
        _save(results, out)
    results["dry_run_recheck_code"] = code
    _save(results, out)
    write_report(results, out)
    return 0


def _dry_run_estimate(run: Run, bundle_dir: Path, active_fraction: float) -> dict[str, Any] | None:
    """circuitgraph's own estimate, ``circuitgraph run SPEC --dry-run`` in a child process (it runs
    the forward pass and builds the node tables, then bounds the edges), recorded next to the
    measured peak.  ``active_fraction`` is unused (the dry run counts the active features)."""
    import re
    import tempfile

    spec = spec_dict(run, bundle_dir, prompt_tokens(run.bundle, run.n_pos), None, mfn=run.max_feature_nodes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec))
        try:
            proc = subprocess.run([sys.executable, "-m", "circuitgraph", "run", str(path), "--dry-run", "--quiet"],
                                  capture_output=True, text=True, timeout=1800, cwd=REPO)
        except subprocess.TimeoutExpired:
            return {"error": "dry run timed out"}
    text = proc.stdout + proc.stderr
    edges = re.search(r"edges at most ([\d,]+)", text)
    peak = re.search(r"peak at most about ([\d.]+) GB", text)
    if edges is None or peak is None:
        return {"error": text.strip().splitlines()[-1] if text.strip() else f"exit {proc.returncode}"}
    verdict = re.search(r"^fits: (yes|probably|NO)", text, re.M)
    # "probably" (max_feature_nodes): the widest selectable rows would pass the limit, the run is not
    # refused and stops with advice only if the rows it does compute would
    return {"n_edges_upper": int(edges.group(1).replace(",", "")), "peak_gb": float(peak.group(1)),
            "fits": "fits: yes" in text, "verdict": verdict.group(1) if verdict else None,
            "exit_code": proc.returncode}


def spec_dict(run: Run, bundle_dir: Path, tokens: list[int], json_out: Path | None,
              mfn: int | None = None) -> dict[str, Any]:
    graph: dict[str, Any] = {"dtype": run.graph_dtype, "batch_size": run.batch_size}
    if mfn is not None:
        graph["max_feature_nodes"] = mfn
    spec: dict[str, Any] = {
        "format_version": 1,
        "model": {"path": str(bundle_dir / "model"), "dtype": run.model_dtype},
        "transcoders": {"path": str(bundle_dir / "transcoders")},
        "prompt": {"tokens": tokens},
        "targets": [{"top_logits": {"max_n": 10, "cumulative_probability": 0.95}}],
        "graph": graph,
        "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
    }
    if json_out is not None:
        spec["export"] = {"json": str(json_out)}
    return spec


def run_circuitgraph(run: Run, bundle_dir: Path, work: Path, budget_gb: float, threads: int) -> dict[str, Any]:
    """``bench_one.py`` on one configuration, in its own process.  A run that passes the memory
    budget is stopped and, if it used max_feature_nodes (or could), retried with half as many."""
    p = plan(run, bundle_dir, budget_gb, count_features(run, bundle_dir, work, threads))
    tokens = prompt_tokens(run.bundle, run.n_pos)
    rdir = work / "runs" / run.name
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    out: dict[str, Any] = {"name": run.name, "suite": run.suite, "bundle": run.bundle.name,
                           "bundle_config": asdict(run.bundle), "plan": p, "attempts": []}
    mfn = p["max_feature_nodes"]
    while True:
        cmd = [sys.executable, str(HERE / "bench_one.py"), "--bundle", str(bundle_dir), "--tokens",
               str(rdir / "tokens.json"), "--out-dir", str(rdir), "--result", str(rdir / "result.json"),
               "--batch-size", str(run.batch_size), "--model-dtype", run.model_dtype,
               "--graph-dtype", run.graph_dtype, "--threads", str(threads), "--memory-limit-gb", str(budget_gb),
               "--device", run.device]
        if mfn is not None:
            cmd += ["--max-feature-nodes", str(mfn)]
        log(f"{run.name}: {run.n_pos} tokens, {p['reason']}" + (f", max_feature_nodes {mfn}" if mfn else ""))
        (rdir / "result.json").unlink(missing_ok=True)
        proc = run_process(cmd, log_path=rdir / "log.txt", env=child_env(threads), memory_limit_mb=budget_gb * 1024,
                           time_limit_s=_TIME_LIMIT_S[0])
        out["process"] = proc
        if not proc["killed_for_memory"] or run.max_feature_nodes is not None or (mfn is not None and mfn <= 256):
            break
        out["attempts"].append({"max_feature_nodes": mfn, "wall_s": proc["wall_s"],
                                "peak_rss_mb": proc["peak_rss_mb"]})
        log(f"{run.name}: stopped at the {budget_gb:.0f} GB budget after {proc['wall_s']:.0f}s; retrying with fewer "
            "feature rows")
        mfn = run.fallback_mfn if mfn is None else mfn // 2
        p["reason"] += f"; {out['attempts'][-1]['max_feature_nodes'] or 'full graph'} passed the budget"
    if proc["returncode"] == 0:
        out["result"] = json.loads((rdir / "result.json").read_text())
        r = out["result"]
        log(f"{run.name}: attribute {r['timings_s']['attribute']:.1f}s, {r['n_edges']:,} edges, "
            f"peak {proc['peak_rss_mb'] / 1024:.2f} GB, completeness "
            f"{r['completeness']['max_relative_violation']:.1e}")
    else:
        log(f"{run.name}: FAILED (exit {proc['returncode']}"
            + (", stopped at the memory budget" if proc["killed_for_memory"] else "")
            + (f", stopped at the time limit ({_TIME_LIMIT_S[0]:.0f} s)" if proc.get("killed_for_time") else "")
            + f"), see {proc['log']}")
    return out


def gpu_reason() -> str | None:
    """Why the GPU runs cannot be made here (None: they can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def gpu_runs(suite: Suite, bundle_dirs: dict[Bundle, Path], work: Path, args: Any, by_name: dict[str, Any],
             out: Path, results: dict[str, Any]) -> dict[str, Any]:
    """The side-by-side configuration and the 6-layer long prompts with ``model: {device: cuda}``,
    each in its own process (times include ``torch.cuda.synchronize``), or the reason they were
    skipped."""
    reason = gpu_reason()
    if reason is not None:
        log(f"GPU runs skipped: {reason}")
        return {"skipped": reason}
    cfgs = [r for r in suite.runs if r.suite == "long_prompt_6l"]
    if suite.side_by_side is not None:
        cfgs.insert(0, dataclasses.replace(suite.side_by_side, name=suite.side_by_side.name + "-cuda-sbs"))
    done = []
    for r in cfgs:
        run = dataclasses.replace(r, name=r.name + "-cuda", suite="gpu", device="cuda")
        if run.bundle not in bundle_dirs:
            bundle_dirs[run.bundle] = build_bundle(run.bundle, work)
        res = run_circuitgraph(run, bundle_dirs[run.bundle], work, run.memory_budget_gb or args.memory_budget_gb,
                               args.threads)
        results["runs"].append(res)
        done.append(run.name)
        _save(results, out)
    return {"runs": done}


# ----------------------------------------------------------------------------- side by side
def side_by_side(run: Run, bundle_dir: Path, work: Path, ct_python: Path | None, threads: int,
                 budget_gb: float) -> dict[str, Any]:
    """circuit-tracer and ``circuitgraph run`` as whole processes, then the comparison.

    Order: ``circuitgraph run`` (end to end), ``bench_one.py`` (circuitgraph's stages, and the
    full graph for the comparison), circuit-tracer, ``circuitgraph run`` again; the two
    end-to-end runs of circuitgraph bracket circuit-tracer's in time, so a change in the
    machine's load shows up as a difference between them."""
    sdir = work / "side_by_side" / run.name
    sdir.mkdir(parents=True, exist_ok=True)
    tokens = prompt_tokens(run.bundle, run.n_pos)
    (sdir / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    out: dict[str, Any] = {"name": run.name, "bundle": run.bundle.name, "bundle_config": asdict(run.bundle),
                           "n_pos": run.n_pos, "circuitgraph_cli_runs": []}
    env = child_env(threads)
    spec_path = sdir / "spec.json"
    spec_path.write_text(json.dumps(spec_dict(run, bundle_dir, tokens, sdir / "circuitgraph" / "graph.json"), indent=1))
    cli = shutil.which("circuitgraph")
    cli_cmd = [cli] if cli else [sys.executable, "-m", "circuitgraph"]

    def circuitgraph_cli(i: int) -> None:
        log(f"side by side {run.name}: circuitgraph run ({i})")
        cg = run_process([*cli_cmd, "run", "-q", str(spec_path)], log_path=sdir / f"circuitgraph-{i}.log", env=env)
        cg["stage_times_s"] = _parse_cli_times((sdir / f"circuitgraph-{i}.log").read_text())
        cg["json_bytes"] = (sdir / "circuitgraph" / "graph.json").stat().st_size if cg["returncode"] == 0 else None
        out["circuitgraph_cli_runs"].append(cg)
        log(f"side by side {run.name}: circuitgraph run {cg['wall_s']:.1f}s, peak {cg['peak_rss_mb'] / 1024:.2f} GB")

    circuitgraph_cli(1)
    stages = dataclasses.replace(run, name=f"side-by-side-{run.name}")
    cg_result = run_circuitgraph(stages, bundle_dir, work, budget_gb, threads)
    out["circuitgraph_stages"] = cg_result

    if ct_python is None or not ct_python.exists():
        out["circuit_tracer"] = {"skipped": f"no circuit-tracer venv python at {ct_python}; "
                                            "create it with scripts/install_circuit_tracer.sh"}
        return out
    ct_dir = sdir / "circuit_tracer"
    log(f"side by side {run.name}: circuit-tracer (attribute + create_graph_files)")
    t0_epoch = time.time()
    ct = run_process([str(ct_python), str(CT_PIPELINE), "--model", str(bundle_dir / "model"),
                      "--transcoders", str(bundle_dir / "transcoders"), "--tokens", str(sdir / "tokens.json"),
                      "--out-dir", str(ct_dir), "--batch-size", "512", "--t0-epoch", repr(t0_epoch),
                      "--threads", str(threads)], log_path=sdir / "circuit_tracer.log", env=env)
    if ct["returncode"] == 0:
        ct["pipeline"] = json.loads((ct_dir / "ct_pipeline.json").read_text())
        log(f"side by side {run.name}: circuit-tracer end to end {ct['pipeline']['end_to_end_s']:.1f}s, "
            f"attribute {ct['pipeline']['timings_s']['attribute']:.1f}s")
    out["circuit_tracer"] = ct
    circuitgraph_cli(2)
    if ct["returncode"] != 0 or "result" not in cg_result:
        return out
    log(f"side by side {run.name}: comparing edges and pruning")
    cmp_path = sdir / "comparison.json"
    cmp = run_process([sys.executable, str(HERE / "side_by_side.py"), "--ct-dir", str(ct_dir), "--graph",
                       str(work / "runs" / stages.name / "full.npz"), "--json", str(cmp_path)],
                      log_path=sdir / "comparison.log", env=child_env(threads))
    out["comparison"] = json.loads(cmp_path.read_text()) if cmp["returncode"] == 0 else {"error": cmp["log_tail"]}
    return out


def _parse_cli_times(text: str) -> dict[str, float]:
    """``time: graph 1.23s, prune 0.45s, export 0.01s`` from ``circuitgraph run``'s summary."""
    for line in text.splitlines():
        if line.startswith("time: "):
            parts = [p.strip().split() for p in line[6:].split(",")]
            return {k: float(v.rstrip("s")) for k, v in parts}
    return {}


def code_state() -> dict[str, Any]:
    """The commit and the uncommitted changes of the package being measured (the tree may be
    edited while a long run goes on: this is recorded at the start and at the end)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = [line for line in git("status", "--porcelain", "--", "circuitgraph").splitlines() if line]
    return {"commit": git("rev-parse", "--short", "HEAD"), "subject": git("log", "-1", "--format=%s"),
            "uncommitted_package_files": dirty,
            "package_diff_sha1": hashlib.sha1(git("diff", "HEAD", "--", "circuitgraph").encode()).hexdigest()[:10]}


def machine() -> dict[str, Any]:
    import psutil
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "memory_gb": psutil.virtual_memory().total / GB, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def _save(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small configurations (a couple of minutes)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results folder (default docs/benchmarks, or docs/benchmarks/quick with --quick)")
    ap.add_argument("--work", type=Path,
                    default=Path(os.environ.get("CIRCUITGRAPH_BENCH_DIR", Path(tempfile.gettempdir()) / "circuitgraph-bench")),
                    help="bundles, graphs and logs (default $TMPDIR/circuitgraph-bench, or $CIRCUITGRAPH_BENCH_DIR)")
    ap.add_argument("--only", default=None,
                    help="comma-separated suites: prompt_length,active_features,gpt2_small,precision,side_by_side,"
                         "long_prompt_6l,long_prompt_gpt2")
    ap.add_argument("--ct-python", type=Path, default=Path(os.environ.get("CIRCUITGRAPH_CT_PYTHON", HERE.parent / ".venv-ct" / "bin" / "python")),
                    help="python of the circuit-tracer 0.5.0 venv (scripts/install_circuit_tracer.sh)")
    ap.add_argument("--skip-ct", action="store_true", help="no circuit-tracer side by side")
    ap.add_argument("--memory-budget-gb", type=float, default=16.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report-only", action="store_true", help="redraw results.md and plots from results.json")
    ap.add_argument("--runs", default=None,
                    help="comma-separated run names (e.g. 6L-long-T1024,gpt2-long-T256): only these, within --only")
    ap.add_argument("--recheck-dry-run", action="store_true",
                    help="re-make `circuitgraph run --dry-run`'s estimate of every recorded run in --out's "
                         "results.json with the current code (next to the measured peak), and redraw the report")
    ap.add_argument("--time-limit-min", type=float, default=None,
                    help="stop a timed run after this many minutes (recorded as stopped at the time limit)")
    ap.add_argument("--gpu", action="store_true",
                    help="also run the side-by-side configuration and the 6-layer long prompts on CUDA "
                         "(model: {device: cuda}; absolute device times); skipped, with the reason recorded, "
                         "where no GPU is available")
    args = ap.parse_args(argv)
    _WORK[0] = Path(args.work).resolve()
    _TIME_LIMIT_S[0] = None if args.time_limit_min is None else 60 * args.time_limit_min
    _PORTABLE_NAMES[str(args.ct_python)] = ".venv-ct/bin/python"
    _PORTABLE_NAMES[shutil.which("circuitgraph") or "circuitgraph"] = "circuitgraph"
    out = args.out or (REPO / "docs" / "benchmarks" / ("quick" if args.quick else ""))
    sys.path.insert(0, str(HERE))
    from report import write_report

    if args.report_only:
        write_report(json.loads((out / "results.json").read_text()), out)
        return 0
    suite = configurations(args.quick)
    only = set(args.only.split(",")) if args.only else None
    if args.runs:
        names = set(args.runs.split(","))
        unknown = names - {r.name for r in suite.runs}
        if unknown:
            ap.error(f"--runs: unknown run names {sorted(unknown)}; known: {', '.join(r.name for r in suite.runs)}")
        suite.runs = [r for r in suite.runs if r.name in names]
    work = args.work / ("quick" if args.quick else "full")
    if args.recheck_dry_run:
        return recheck_dry_run(suite, work, out)
    t_start = time.time()
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "command": " ".join(["python benchmarks/run_benchmarks.py"] + [
            "$WORK" if a == str(args.work) else _portable(a) for a in (sys.argv[1:] if argv is None else argv)]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "load_avg_at_start": list(os.getloadavg()),
        "code_at_start": code_state(),
        "omp_wait_policy": " ".join(f"{k}={child_env(args.threads).get(k)}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                                    if child_env(args.threads).get(k)),
        "memory_budget_gb": args.memory_budget_gb,
        "peak_bytes_per_edge_assumed": PEAK_BYTES_PER_EDGE,
        "runs": [],
        "side_by_side": None,
    }
    wanted_bundles = {r.bundle for r in suite.runs if only is None or r.suite in only}
    if suite.side_by_side and (only is None or "side_by_side" in only):
        wanted_bundles.add(suite.side_by_side.bundle)
    bundle_dirs = {b: build_bundle(b, work) for b in suite.bundles if b in wanted_bundles}
    sbs = suite.side_by_side
    if sbs is not None and (only is None or "side_by_side" in only):
        # first: the comparison matters most, and both sides should meet the same machine load
        ct_python = None if args.skip_ct else args.ct_python
        results["side_by_side"] = side_by_side(sbs, bundle_dirs[sbs.bundle], work, ct_python, args.threads,
                                               args.memory_budget_gb)
    by_name: dict[str, dict[str, Any]] = {}
    order = ("prompt_length", "active_features", "precision", "gpt2_small", "long_prompt_6l", "long_prompt_gpt2")
    for run in sorted(suite.runs, key=lambda r: order.index(r.suite)):
        if only is not None and run.suite not in only:
            continue
        if run.name in by_name:  # the same configuration listed in two suites: run once
            results["runs"].append({**by_name[run.name], "suite": run.suite})
            continue
        res = run_circuitgraph(run, bundle_dirs[run.bundle], work, run.memory_budget_gb or args.memory_budget_gb,
                               args.threads)
        by_name[run.name] = res
        results["runs"].append(res)
        _save(results, out)  # partial results survive an interrupted run
    if args.gpu:
        results["gpu"] = gpu_runs(suite, bundle_dirs, work, args, by_name, out, results)
    results["load_avg_at_end"] = list(os.getloadavg())
    results["code_at_end"] = code_state()
    results["total_seconds"] = time.time() - t_start
    _save(results, out)
    write_report(results, out)
    log(f"wrote {out / 'results.md'} ({results['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
