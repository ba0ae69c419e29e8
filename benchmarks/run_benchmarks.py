#!/usr/bin/env python
"""circuitgraph's benchmark suite: one command per suite, random models built here, one results page.

    python benchmarks/run_benchmarks.py --only side_by_side        # one suite, merged into docs/benchmarks/results.json
    python benchmarks/run_benchmarks.py --quick                    # every suite on small stand-ins (minutes)
    python benchmarks/run_benchmarks.py --report-only              # redraw docs/benchmarks/README.md
    python benchmarks/run_benchmarks.py --readme write             # README.md's speed paragraph from results.json

Random GPT-2-style models and ReLU transcoders are built natively by
``benchmarks/circuit_tracer/make_random_bundle.py`` (TransformerLens + sae-lens, seeded, no
download) and cached in the work folder (``--work``; a bundle already in ``WORK/bundles`` is
reused).  Every configuration runs in its own process (``benchmarks/bench_one.py``,
``circuitgraph run``, circuit-tracer's ``benchmarks/circuit_tracer/ct_pipeline.py``), so the peak
resident memory (``ru_maxrss`` of that child, from ``os.wait4``) is per run, and the 1-minute load
average is sampled while it runs.  The recorded suites (``--only``; all of them by default):

* ``side_by_side``: 6 layers, d_model 256, 4096-feature transcoders, 32 tokens, full graph:
  circuit-tracer 0.5.0 (its own venv, ``--ct-python``) against ``circuitgraph run`` as whole
  processes from the spec to a pruned graph JSON on disk, plus the edge-by-edge and kept-circuit
  comparison (``benchmarks/side_by_side.py``);
* ``gpt2_side_by_side``: GPT-2-small size (12 layers, d_model 768, 24576 features, ~0.85%
  active), 64 tokens, ``max_feature_nodes`` 4096 for both (circuit-tracer at batch size 64, and
  circuitgraph at the same batch size so that both rank features in the same rounds): times, peak
  memory, the selected features and the kept circuit compared; plus circuitgraph alone at 256
  tokens within 16 GiB;
* ``llama_1b``: Llama-3.2-1B size (a bundle made elsewhere, ``--llama-bundle``, or built with
  ``--llama-bundle-args``), 64 tokens, circuitgraph only: time, peak memory, the dry run's
  estimate; ``--ct-llama`` also tries circuit-tracer under a memory and a time cap;
* ``long_prompt_gpt2``: GPT-2 size, random decoders, 256 to 2048 tokens, ``max_feature_nodes``
  8192, 20 GiB budget (target: 2048 tokens within 30 minutes);
* ``dataset``: ``benchmarks/dataset_throughput.py`` (prompts per minute, local and Ray);
* ``gpu``: the side-by-side, GPT-2-size and long-prompt configurations with ``model: {device:
  cuda}`` where CUDA exists (``--device cuda`` is the same as ``--only gpu``); otherwise the page
  records why they were skipped (``--gpu-skip-reason``).

The older suites (``prompt_length``, ``active_features``, ``gpt2_small``, ``precision``,
``long_prompt_6l``) still run when named in ``--only``; they are not in the default set.

Environments.  circuit-tracer runs as a user runs it: ``--ct-env default`` (the default) gives it
the inherited environment without any OpenMP / MKL / BLAS variable (:func:`plain_env`), so it
uses torch's own thread count; ``--ct-env tuned`` gives it circuitgraph's OpenMP settings
(:func:`tuned_env`); ``both`` records both, separately (the ratio headline uses ``default``).
circuitgraph's processes get the same plain environment: ``circuitgraph run`` sets its own
OpenMP defaults inside itself (``circuitgraph.cli.main.main`` -> ``openmp_defaults``, before torch
is imported), and ``bench_one.py`` applies the same in-process.  ``--threads N`` sets
``OMP_NUM_THREADS`` for circuitgraph's processes and for the tuned circuit-tracer only.

Each invocation merges the suites it ran into ``OUT/results.json`` (one entry per suite, with its
own machine, load, commit and command), so suites can be recorded one at a time;
``benchmarks/report.py`` writes ``OUT/README.md`` (every table) and the plots from it.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import re
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
    if _WORK[0] is not None and text == str(_WORK[0]):
        return "$WORK"
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
    #: circuit-tracer's batch size in a side by side (its default 512; 64 at GPT-2 size, where 512 needs 35 GB)
    ct_batch_size: int = 512
    memory_budget_gb: float | None = None  # None: the suite's --memory-budget-gb
    device: str = "cpu"


@dataclass
class Suite:
    bundles: list[Bundle]
    runs: list[Run]
    #: side-by-side configurations with circuit-tracer (``Run.suite`` names the suite)
    side_by_sides: list[Run]


#: the suites recorded by default, in the order they run and appear on the page
RECORDED_SUITES = ("side_by_side", "gpt2_side_by_side", "llama_1b", "long_prompt_gpt2", "dataset", "gpu")
#: older suites, still available with --only
OLDER_SUITES = ("prompt_length", "active_features", "gpt2_small", "precision", "long_prompt_6l")
ALL_SUITES = RECORDED_SUITES + OLDER_SUITES
#: the Llama-3.2-1B-size bundle's placeholder; main() replaces it by the bundle's own description
LLAMA = Bundle("llama-1b-size", 16, 2048, 32, 8192, 128256, 32768, 0.0, 2048)
#: --quick's Llama-style stand-in (make_random_bundle.py arguments)
QUICK_LLAMA_ARGS = ("--style llama --n-layers 2 --d-model 64 --n-heads 4 --n-kv-heads 2 --d-mlp 128 "
                    "--d-vocab 3000 --d-sae 512 --active-frac 0.03 --n-ctx 128 --prompt-len 32 --n-calib-prompts 16")


def configurations(quick: bool, llama_mfn: int | None = 4096) -> Suite:
    """Every suite's configurations, or small stand-ins for ``--quick`` (the same code paths)."""
    small = Bundle("small-4L-128d-1024f", 4, 128, 4, 512, 500, 1024, 0.02, 64)
    if quick:
        sparse = [Bundle(f"small-4L-128d-1024f-af{af}", 4, 128, 4, 512, 500, 1024, af, 64) for af in (0.01, 0.04)]
        dense = Bundle("quick-gpt2-standin", 4, 128, 4, 512, 3000, 2048, 0.03, 64)
        rand = Bundle("quick-gpt2-2k-standin", 4, 128, 4, 512, 3000, 2048, 0.02, 128, fit_decoder=False)
        runs = [Run(f"quick-T{t}", "prompt_length", small, t) for t in (8, 16, 32)]
        runs += [Run(f"quick-af{b.active_frac}-T16", "active_features", b, 16) for b in sparse]
        runs += [Run("quick-T16", "active_features", small, 16)]
        runs += [Run(f"quick-{dt}-T16", "precision", small, 16, model_dtype=dt,
                     graph_dtype="float64" if dt == "float64" else "float32")
                 for dt in ("float32", "float64", "bfloat16", "float16")]
        runs += [Run(f"quick-long-T{t}", "long_prompt_6l", small, t, max_feature_nodes=256) for t in (16, 32, 64)]
        runs += [Run("quick-gpt2small-T16", "gpt2_small", small, 16, fallback_mfn=256)]
        runs += [Run("quick-gpt2-T32", "gpt2_side_by_side", dense, 32, max_feature_nodes=128, memory_budget_gb=16.0)]
        runs += [Run("quick-llama-T16", "llama_1b", LLAMA, 16, max_feature_nodes=llama_mfn and 128,
                     memory_budget_gb=16.0)]
        runs += [Run(f"quick-gpt2-long-T{t}", "long_prompt_gpt2", rand, t, max_feature_nodes=256, memory_budget_gb=20.0)
                 for t in (16, 32, 64)]
        sbs = [Run("quick-T16", "side_by_side", small, 16),
               Run("quick-gpt2-T16", "gpt2_side_by_side", dense, 16, max_feature_nodes=128, batch_size=64,
                   ct_batch_size=64)]
        return Suite([small, *sparse, dense, rand], runs, sbs)
    six = Bundle("6L-256d-4096f", 6, 256, 8, 1024, 1000, 4096, 0.02, 512, calib_len=512, n_calib=16)
    six_af = [Bundle(f"6L-256d-4096f-af{af}", 6, 256, 8, 1024, 1000, 4096, af, 512, calib_len=512, n_calib=16)
              for af in (0.0025, 0.005, 0.01, 0.03)]
    # ~50 active per token and layer on the benchmark prompts (older gpt2_small suite)
    gpt2 = Bundle("gpt2-small-size", 12, 768, 12, 3072, 50257, 24576, 0.0011, 1024, calib_len=256, n_calib=16)
    # issue 25: GPT-2-small size with ~0.85% active (about 220k active features on 64 tokens)
    gpt2_dense = Bundle("gpt2-size-dense", 12, 768, 12, 3072, 50257, 24576, 0.0085, 1024, calib_len=256, n_calib=16)
    # issue 25: the long-prompt configuration (~110 active per token and layer, random decoders)
    gpt2_2k = Bundle("gpt2-size-2k-random", 12, 768, 12, 3072, 50257, 24576, 0.0032, 2048, calib_len=256,
                     n_calib=16, fit_decoder=False)
    runs = [Run(f"6L-T{t}", "prompt_length", six, t) for t in (16, 32, 64, 128, 256, 512)]
    runs += [Run(f"6L-af{b.active_frac}-T32", "active_features", b, 32) for b in six_af]
    runs += [Run("6L-T32", "active_features", six, 32)]
    runs += [Run(f"gpt2-T{t}", "gpt2_small", gpt2, t, fallback_mfn=m) for t, m in ((64, 8192), (256, 4096))]
    runs += [Run(f"precision-{dt}-T16", "precision", small, 16, model_dtype=dt,
                 graph_dtype="float64" if dt == "float64" else "float32")
             for dt in ("float32", "float64", "bfloat16", "float16")]
    six_long = Bundle("6L-256d-4096f-2k", 6, 256, 8, 1024, 1000, 4096, 0.02, 2048, calib_len=512, n_calib=16)
    runs += [Run(f"6L-long-T{t}", "long_prompt_6l", six_long, t, max_feature_nodes=4096, memory_budget_gb=20.0)
             for t in (256, 512, 1024, 2048)]
    runs += [Run("gpt2-dense-T256", "gpt2_side_by_side", gpt2_dense, 256, max_feature_nodes=4096,
                 memory_budget_gb=16.0)]
    runs += [Run("llama-1b-T64", "llama_1b", LLAMA, 64, max_feature_nodes=llama_mfn, memory_budget_gb=16.0)]
    runs += [Run(f"gpt2-2k-T{t}", "long_prompt_gpt2", gpt2_2k, t, max_feature_nodes=8192, memory_budget_gb=20.0)
             for t in (256, 512, 1024, 2048)]
    sbs = [Run("6L-T32", "side_by_side", six, 32),
           Run("gpt2-dense-T64", "gpt2_side_by_side", gpt2_dense, 64, max_feature_nodes=4096, batch_size=64,
               ct_batch_size=64)]
    return Suite([six, *six_af, gpt2, small, six_long, gpt2_dense, gpt2_2k], runs, sbs)


#: the time target of the longest long prompt (issue 25: 2048 tokens within 30 minutes)
LONG_PROMPT_TARGET_S = 30 * 60


# ----------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


#: the variables that tune OpenMP, MKL or BLAS threads (what a benchmark could add to a process's
#: environment): every ``OMP_*``, ``GOMP_*``, ``KMP_*`` and ``MKL_*`` variable, and the other
#: libraries' thread counts; none of them reaches a process run in the plain environment (other
#: variables, e.g. ``OPENBLAS_CORETYPE`` set by the system, are kept)
TUNING_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_")
TUNING_NAMES = ("OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS",
                "BLIS_NUM_THREADS")


def tuning_variables(env: dict[str, str]) -> dict[str, str]:
    """The thread-tuning variables of ``env`` (:data:`TUNING_PREFIXES`, :data:`TUNING_NAMES`)."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(TUNING_PREFIXES) or k in TUNING_NAMES}


def plain_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The inherited environment without any thread-tuning variable: what a user's shell gives a
    process, with nothing added by the benchmark (and nothing left over from the caller's own
    tuning, e.g. ``OMP_NUM_THREADS=1``).  circuit-tracer's default environment, and the one every
    circuitgraph process starts from (``circuitgraph run`` sets its own OpenMP defaults inside)."""
    env = dict(os.environ if environ is None else environ)
    for k in tuning_variables(env):
        del env[k]
    return env


def tuned_env(threads: int | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """circuit-tracer's ``tuned`` environment: the plain one plus the OpenMP settings
    ``circuitgraph run`` gives itself (``circuitgraph.cli.main.OPENMP_DEFAULTS``) and
    ``OMP_NUM_THREADS`` (``threads``, default the number of cores)."""
    from circuitgraph.cli.main import OPENMP_DEFAULTS

    env = plain_env(environ)
    env.update(OPENMP_DEFAULTS)
    env["OMP_NUM_THREADS"] = str(threads or os.cpu_count() or 1)
    return env


def circuitgraph_env(threads: int | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """circuitgraph's processes: the plain environment (``--threads N``: plus ``OMP_NUM_THREADS``)."""
    env = plain_env(environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def ct_env(kind: str, threads: int | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """circuit-tracer's environment of kind ``default`` (:func:`plain_env`) or ``tuned`` (:func:`tuned_env`)."""
    if kind == "default":
        return plain_env(environ)
    if kind == "tuned":
        return tuned_env(threads, environ)
    raise ValueError(f"circuit-tracer environment {kind!r}: expected 'default' or 'tuned'")


def _thread_args(threads: int | None) -> list[str]:
    return [] if not threads else ["--threads", str(threads)]


#: bench_one's progress lines in its log: ``[progress SECONDS s] DONE / TOTAL``
PROGRESS_LINE = re.compile(r"\[progress ([0-9.]+) s\] (\d+) / (\d+)$")

#: where bundles are looked for before one is built (the first is where a new one goes; main sets them)
_BUNDLE_DIRS: list[Path] = []


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
    """Make (or reuse) the bundle; returns its folder.  A bundle already made under any of the
    bundle folders (``WORK/bundles``, ``WORK/<mode>/bundles``, the folder of ``--bundles``) with
    the same definition (name and hash of every field) is reused."""
    name = f"{b.name}-{b.key()}"
    dirs = _BUNDLE_DIRS or [work / "bundles"]
    for d in dirs:
        if (d / name / "bundle.json").exists():
            return d / name
    out = dirs[0] / name
    log(f"building bundle {b.name} ({b.describe()}, {b.active_frac:.2%} active) in {out}")
    res = run_process([sys.executable, str(MAKE_BUNDLE), "--out", str(out), *b.args()],
                      log_path=work / "logs" / f"bundle-{b.name}.log", env=plain_env())
    if res["returncode"] != 0:
        raise SystemExit(f"building bundle {b.name} failed:\n{res['log_tail']}")
    return out


def external_bundle(path: Path, make_args: str | None, work: Path, name: str) -> tuple[Bundle, Path] | str:
    """A bundle made elsewhere (e.g. the Llama-3.2-1B-size one), described from its files as a
    :class:`Bundle` (for the tables); built first with ``make_random_bundle.py --out PATH
    MAKE_ARGS`` when ``PATH`` holds no model and ``make_args`` is given.  A string: why not."""
    import shlex

    if not (path / "bundle.json").exists():  # make_random_bundle.py writes it last
        if not make_args:
            what = "an incomplete bundle (no bundle.json: still being built?)" if path.exists() else "no bundle"
            return (f"{what} at {_portable(path)} (give --llama-bundle DIR, or --llama-bundle-args "
                    "'make_random_bundle.py arguments' to build one there)")
        log(f"building bundle {name} in {path}: make_random_bundle.py {make_args}")
        res = run_process([sys.executable, str(MAKE_BUNDLE), "--out", str(path), *shlex.split(make_args)],
                          log_path=work / "logs" / f"bundle-{name}.log", env=plain_env())
        if res["returncode"] != 0:
            return f"building the bundle failed (exit {res['returncode']}): {res['log_tail'][-300:]}"
    cfg = json.loads((path / "model" / "config.json").read_text())
    layers = sorted((path / "transcoders").glob("layer_*/cfg.json"))
    d_sae = json.loads(layers[0].read_text()).get("d_sae", 0) if layers else 0
    meta = json.loads((path / "bundle.json").read_text()) if (path / "bundle.json").exists() else {}
    active = float((meta.get("args") or {}).get("active_frac") or 0.0)
    desc = Bundle(name, int(cfg["n_layers"]), int(cfg["d_model"]), int(cfg["n_heads"]), int(cfg.get("d_mlp") or 0),
                  int(cfg["d_vocab"]), int(d_sae), active, int(cfg.get("n_ctx") or 2048))
    return desc, path


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


def count_features(run: Run, bundle_dir: Path, work: Path, threads: int | None) -> list[list[int]]:
    """Active features per (layer, position) on the run's prompt (a child process; cached)."""
    cache = work / "counts" / f"{bundle_dir.name}-T{run.n_pos}-{run.model_dtype}.json"
    if not cache.exists():
        tokens = work / "counts" / f"{bundle_dir.name}-T{run.n_pos}-tokens.json"
        tokens.parent.mkdir(parents=True, exist_ok=True)
        tokens.write_text(json.dumps({"tokens": prompt_tokens(run.bundle, run.n_pos)}))
        proc = run_process([sys.executable, str(HERE / "bench_one.py"), "--count-only", "--bundle", str(bundle_dir),
                            "--tokens", str(tokens), "--out-dir", str(cache.parent), "--result", str(cache),
                            "--model-dtype", run.model_dtype, *_thread_args(threads)],
                           log_path=cache.with_suffix(".log"), env=circuitgraph_env(threads))
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


def recheck_dry_run(suite: Suite, resolve: Any, out: Path) -> int:
    """``--recheck-dry-run``: the dry run's estimate of each recorded run, made again with the
    current code, stored next to the first one (``plan.dry_run_recheck``, with the commit).
    ``resolve(run)``: the run's bundle folder, or None."""
    from report import write_report

    results = load_results(out)
    by_name = {r.name: r for r in suite.runs}
    code = code_state()
    for entry in results["suites"].values():
        for rec in entry.get("runs") or []:
            run = by_name.get(rec["name"])
            if run is None or "result" not in rec:
                continue
            bundle_dir = resolve(run)
            if bundle_dir is None:
                continue
            log(f"{run.name}: dry run at {code['commit']}")
            dr = _dry_run_estimate(run, bundle_dir, 0.0) or {}
            rec["plan"]["dry_run_recheck"] = {**dr, "commit": code["commit"]}
            save_results(results, out)
    results["dry_run_recheck_code"] = code
    save_results(results, out)
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
                                  capture_output=True, text=True, timeout=1800, cwd=REPO, env=plain_env())
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


def run_circuitgraph(run: Run, bundle_dir: Path, work: Path, budget_gb: float, threads: int | None) -> dict[str, Any]:
    """``bench_one.py`` on one configuration, in its own process.  A run that passes the memory
    budget is stopped and, if it used max_feature_nodes (or could), retried with half as many."""
    p = plan(run, bundle_dir, budget_gb, count_features(run, bundle_dir, work, threads))
    tokens = prompt_tokens(run.bundle, run.n_pos)
    rdir = work / "runs" / run.name
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    out: dict[str, Any] = {"name": run.name, "suite": run.suite, "n_pos": run.n_pos, "bundle": run.bundle.name,
                           "bundle_config": asdict(run.bundle), "plan": p, "attempts": []}
    mfn = p["max_feature_nodes"]
    while True:
        cmd = [sys.executable, str(HERE / "bench_one.py"), "--bundle", str(bundle_dir), "--tokens",
               str(rdir / "tokens.json"), "--out-dir", str(rdir), "--result", str(rdir / "result.json"),
               "--batch-size", str(run.batch_size), "--model-dtype", run.model_dtype,
               "--graph-dtype", run.graph_dtype, *_thread_args(threads), "--memory-limit-gb", str(budget_gb),
               "--device", run.device]
        if mfn is not None:
            cmd += ["--max-feature-nodes", str(mfn)]
        log(f"{run.name}: {run.n_pos} tokens, {p['reason']}" + (f", max_feature_nodes {mfn}" if mfn else ""))
        (rdir / "result.json").unlink(missing_ok=True)
        proc = run_process(cmd, log_path=rdir / "log.txt", env=circuitgraph_env(threads), memory_limit_mb=budget_gb * 1024,
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
        marks = [m for ln in (proc.get("log_tail") or "").splitlines() if (m := PROGRESS_LINE.match(ln))]
        if marks:  # where it stopped: seconds into the attribution, feature rows (or batches) done of all
            seconds, done, total = marks[-1].groups()
            out["progress_at_stop"] = {"seconds": float(seconds), "done": int(done), "total": int(total)}
        log(f"{run.name}: FAILED (exit {proc['returncode']}"
            + (", stopped at the memory budget" if proc["killed_for_memory"] else "")
            + (f", stopped at the time limit ({_TIME_LIMIT_S[0]:.0f} s)" if proc.get("killed_for_time") else "")
            + (f", {marks[-1].group(0)}" if marks else "") + f"), see {proc['log']}")
    return out


def gpu_reason(override: str | None = None) -> str | None:
    """Why the GPU runs cannot be made here (None: they can).  ``override`` (``--gpu-skip-reason``)
    replaces the generic reason, e.g. with what the session's device tool said."""
    try:
        import torch
    except ImportError:
        return override or "torch is not installed"
    if not torch.cuda.is_available():
        return override or f"no CUDA device here (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def gpu_configurations(suite: Suite) -> list[Run]:
    """The GPU suite: the side-by-side configurations, circuitgraph's GPT-2-size, Llama-size and
    long-prompt runs, each with ``model: {device: cuda}`` (its CPU counterpart keeps its name
    without ``-cuda``)."""
    base = [*suite.side_by_sides] + [r for r in suite.runs if r.suite in ("gpt2_side_by_side", "llama_1b",
                                                                        "long_prompt_gpt2")]
    return [dataclasses.replace(r, name=r.name + "-cuda", suite="gpu", device="cuda") for r in base]


# ----------------------------------------------------------------------------- side by side
def _ct_command(ct_python: Path, run: Run, bundle_dir: Path, tokens: Path, out_dir: Path, t0_epoch: float,
                threads: int | None, dump: bool) -> list[str]:
    cmd = [str(ct_python), str(CT_PIPELINE), "--model", str(bundle_dir / "model"),
           "--transcoders", str(bundle_dir / "transcoders"), "--tokens", str(tokens),
           "--out-dir", str(out_dir), "--batch-size", str(run.ct_batch_size), "--t0-epoch", repr(t0_epoch)]
    if run.max_feature_nodes is not None:
        cmd += ["--max-feature-nodes", str(run.max_feature_nodes)]
    cmd += _thread_args(threads)
    return cmd + ([] if dump else ["--no-dump"])


def side_by_side(run: Run, bundle_dir: Path, work: Path, ct_python: Path | None, threads: int | None,
                 budget_gb: float, ct_envs: tuple[str, ...] = ("default",)) -> dict[str, Any]:
    """circuit-tracer and ``circuitgraph run`` as whole processes, then the comparison.

    Order: ``circuitgraph run`` (end to end), ``bench_one.py`` (circuitgraph's stages, and the
    full graph for the comparison), circuit-tracer once per environment in ``ct_envs``
    (``default``: :func:`plain_env`; ``tuned``: :func:`tuned_env`), ``circuitgraph run`` again; the
    two end-to-end runs of circuitgraph bracket circuit-tracer's in time, so a change in the
    machine's load shows up as a difference between them.  With ``run.max_feature_nodes`` both
    select at most that many features (circuit-tracer at ``run.ct_batch_size``)."""
    sdir = work / "side_by_side" / run.name
    sdir.mkdir(parents=True, exist_ok=True)
    tokens = prompt_tokens(run.bundle, run.n_pos)
    (sdir / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    out: dict[str, Any] = {"name": run.name, "bundle": run.bundle.name, "bundle_config": asdict(run.bundle),
                           "n_pos": run.n_pos, "max_feature_nodes": run.max_feature_nodes,
                           "batch_size": run.batch_size, "ct_batch_size": run.ct_batch_size,
                           "circuitgraph_cli_runs": [], "circuit_tracer": {}}
    env = circuitgraph_env(threads)
    out["circuitgraph_environment"] = tuning_variables(env)
    spec_path = sdir / "spec.json"
    spec_path.write_text(json.dumps(spec_dict(run, bundle_dir, tokens, sdir / "circuitgraph" / "graph.json",
                                              mfn=run.max_feature_nodes), indent=1))
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
        out["circuit_tracer"] = {"skipped": f"no circuit-tracer venv python at {_portable(ct_python)}; "
                                            "create it with scripts/install_circuit_tracer.sh"}
        return out
    dumped: Path | None = None
    for kind in ct_envs:
        ct_dir = sdir / f"circuit_tracer-{kind}"
        cenv = ct_env(kind, threads)
        log(f"side by side {run.name}: circuit-tracer, {kind} environment (attribute + create_graph_files)")
        t0_epoch = time.time()
        cmd = _ct_command(ct_python, run, bundle_dir, sdir / "tokens.json", ct_dir, t0_epoch,
                          threads if kind == "tuned" else None, dump=dumped is None)
        ct = run_process(cmd, log_path=sdir / f"circuit_tracer-{kind}.log", env=cenv)
        ct["environment"] = tuning_variables(cenv)
        if ct["returncode"] == 0:
            ct["pipeline"] = json.loads((ct_dir / "ct_pipeline.json").read_text())
            dumped = dumped or ct_dir
            log(f"side by side {run.name}: circuit-tracer ({kind}) end to end {ct['pipeline']['end_to_end_s']:.1f}s, "
                f"attribute {ct['pipeline']['timings_s']['attribute']:.1f}s")
        out["circuit_tracer"][kind] = ct
    circuitgraph_cli(2)
    if dumped is None or "result" not in cg_result:
        return out
    log(f"side by side {run.name}: comparing features, edges and pruning")
    cmp_path = sdir / "comparison.json"
    cmp = run_process([sys.executable, str(HERE / "side_by_side.py"), "--ct-dir", str(dumped), "--graph",
                       str(work / "runs" / stages.name / "full.npz"), "--json", str(cmp_path)],
                      log_path=sdir / "comparison.log", env=circuitgraph_env(threads))
    out["comparison"] = json.loads(cmp_path.read_text()) if cmp["returncode"] == 0 else {"error": cmp["log_tail"]}
    return out


def ct_attempt(run: Run, bundle_dir: Path, work: Path, ct_python: Path | None, memory_cap_gb: float,
               time_cap_s: float) -> dict[str, Any]:
    """circuit-tracer on ``run``'s bundle in its default environment, stopped above
    ``memory_cap_gb`` of resident memory or after ``time_cap_s``: whether it fits, and why not."""
    if ct_python is None or not ct_python.exists():
        return {"fits": None, "why": f"not tried: no circuit-tracer venv python at {_portable(ct_python)}"}
    sdir = work / "ct_attempt" / run.name
    sdir.mkdir(parents=True, exist_ok=True)
    (sdir / "tokens.json").write_text(json.dumps({"tokens": prompt_tokens(run.bundle, run.n_pos)}))
    log(f"{run.name}: circuit-tracer attempt (cap {memory_cap_gb:.0f} GiB, {time_cap_s / 60:.0f} min)")
    cmd = _ct_command(ct_python, dataclasses.replace(run, ct_batch_size=64), bundle_dir, sdir / "tokens.json",
                      sdir / "out", time.time(), None, dump=False)
    proc = run_process(cmd, log_path=sdir / "circuit_tracer.log", env=plain_env(),
                       memory_limit_mb=memory_cap_gb * 1024, time_limit_s=time_cap_s)
    res: dict[str, Any] = {"process": proc, "memory_cap_gb": memory_cap_gb, "time_cap_s": time_cap_s,
                           "batch_size": 64, "max_feature_nodes": run.max_feature_nodes}
    if proc["returncode"] == 0:
        res["pipeline"] = json.loads((sdir / "out" / "ct_pipeline.json").read_text())
        res.update(fits=True, why=f"completed in {res['pipeline']['end_to_end_s']:.0f} s, peak "
                                  f"{proc['peak_rss_mb'] / 1024:.1f} GiB")
    elif proc["killed_for_memory"]:
        res.update(fits=False, why=f"passed the {memory_cap_gb:.0f} GiB cap after {proc['wall_s']:.0f} s (stopped)")
    elif proc["killed_for_time"]:
        res.update(fits=None, why=f"still running at the {time_cap_s / 60:.0f}-minute cap (stopped), peak "
                                  f"{proc['peak_rss_mb'] / 1024:.1f} GiB")
    else:
        last = [ln for ln in proc["log_tail"].splitlines() if ln.strip()]
        res.update(fits=False, why=f"failed (exit {proc['returncode']}): " + (last[-1][:300] if last else "no output"))
    log(f"{run.name}: circuit-tracer {res['why']}")
    return res


def dataset_suite(work: Path, n: int) -> dict[str, Any]:
    """``benchmarks/dataset_throughput.py --n N`` in a child process; its JSON record."""
    path = work / "dataset" / "dataset.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    log(f"dataset throughput: {n} prompts, local and Ray, 1 and 2 workers")
    proc = run_process([sys.executable, str(HERE / "dataset_throughput.py"), "--n", str(n), "--out", str(path)],
                       log_path=work / "dataset" / "log.txt", env=plain_env())
    if proc["returncode"] != 0:
        return {"process": proc, "error": proc["log_tail"][-1000:]}
    return {"process": proc, "record": json.loads(path.read_text())}



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


def load_results(out: Path) -> dict[str, Any]:
    """``OUT/results.json`` (``{"format": 2, "suites": {name: entry}}``), or an empty record."""
    path = out / "results.json"
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("format") == RESULTS_FORMAT:
            return data
        log(f"{_portable(path)} is in an older format (no per-suite entries): starting a new record")
    return {"format": RESULTS_FORMAT, "suites": {}}


def save_results(results: dict[str, Any], out: Path) -> None:
    """Write ``OUT/results.json`` whole (a temporary file, then renamed: never a partial file)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "results.json.partial"
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    tmp.replace(out / "results.json")


RESULTS_FORMAT = 2


def reproduce_command(argv: list[str], suite: str) -> str:
    """The command that records ``suite`` alone, with the options of this invocation that change
    what is measured (``--only`` replaced; ``--report-only``/``--readme`` dropped)."""
    keep: list[str] = []
    skip_next = False
    for i, a in enumerate(argv):
        if skip_next:
            skip_next = False
            continue
        name = a.split("=", 1)[0]
        if name in ("--only", "--runs", "--readme", "--out", "--work"):
            skip_next = "=" not in a and i + 1 < len(argv)
            continue
        if name in ("--report-only",) or (name == "--device" and i + 1 < len(argv) and argv[i + 1] == "cuda"):
            skip_next = name == "--device"
            continue
        keep.append(_portable(a))
    return " ".join(["python benchmarks/run_benchmarks.py", "--only", suite, *(shlex_quote(a) for a in keep)])


def shlex_quote(a: str) -> str:
    import shlex

    return shlex.quote(a) if a and not a.startswith("$") else a


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="small stand-ins for every suite (minutes)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results folder (default docs/benchmarks; with --quick, WORK/quick/report)")
    ap.add_argument("--work", type=Path,
                    default=Path(os.environ.get("CIRCUITGRAPH_BENCH_DIR", Path(tempfile.gettempdir()) / "circuitgraph-bench")),
                    help="bundles, graphs and logs (default $TMPDIR/circuitgraph-bench, or $CIRCUITGRAPH_BENCH_DIR); "
                         "bundles in WORK/bundles are reused")
    ap.add_argument("--only", default=None,
                    help=f"comma-separated suites (default: {','.join(RECORDED_SUITES)}); also: {','.join(OLDER_SUITES)}")
    ap.add_argument("--ct-python", type=Path, default=Path(os.environ.get("CIRCUITGRAPH_CT_PYTHON", HERE.parent / ".venv-ct" / "bin" / "python")),
                    help="python of the circuit-tracer 0.5.0 venv (scripts/install_circuit_tracer.sh)")
    ap.add_argument("--ct-env", choices=("default", "tuned", "both"), default="default",
                    help="circuit-tracer's environment: default (inherited, no OpenMP/MKL variables: as a user runs "
                         "it), tuned (circuitgraph's OpenMP settings and OMP_NUM_THREADS), or both, recorded separately")
    ap.add_argument("--skip-ct", action="store_true", help="no circuit-tracer side by side")
    ap.add_argument("--memory-budget-gb", type=float, default=16.0)
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for circuitgraph's processes and the tuned circuit-tracer "
                         "(default: none set, torch's own thread count)")
    ap.add_argument("--report-only", action="store_true", help="redraw README.md and the plots from results.json")
    ap.add_argument("--readme", choices=("print", "write"), default=None,
                    help="print, or rewrite in README.md (between its benchmark markers), the speed paragraph "
                         "made from results.json")
    ap.add_argument("--runs", default=None,
                    help="comma-separated run names (e.g. gpt2-2k-T1024): only these, within --only")
    ap.add_argument("--recheck-dry-run", action="store_true",
                    help="re-make `circuitgraph run --dry-run`'s estimate of every recorded run in --out's "
                         "results.json with the current code (next to the measured peak), and redraw the report")
    ap.add_argument("--time-limit-min", type=float, default=None,
                    help="stop a timed run after this many minutes (recorded as stopped at the time limit)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: run the gpu suite (the same as --only gpu)")
    ap.add_argument("--gpu-skip-reason", default=None,
                    help="the reason recorded when no CUDA device is available (e.g. what the device tool said)")
    ap.add_argument("--llama-bundle", type=Path, default=None,
                    help="the Llama-3.2-1B-size bundle folder (model/, transcoders/; default WORK/bundles/llama-1b-size)")
    ap.add_argument("--llama-bundle-args", default=None,
                    help="make_random_bundle.py arguments to build the Llama bundle at --llama-bundle when it is "
                         "missing (one quoted string)")
    ap.add_argument("--llama-max-feature-nodes", type=int, default=4096,
                    help="max_feature_nodes of the Llama-size run (0: the full graph if it fits the budget)")
    ap.add_argument("--ct-llama", action="store_true",
                    help="also try circuit-tracer on the Llama-size bundle (default environment, capped)")
    ap.add_argument("--ct-memory-cap-gb", type=float, default=22.0,
                    help="stop circuit-tracer's Llama-size attempt above this resident memory")
    ap.add_argument("--ct-time-cap-min", type=float, default=60.0,
                    help="stop circuit-tracer's Llama-size attempt after this many minutes")
    ap.add_argument("--dataset-n", type=int, default=None, help="prompts of the dataset suite (default 100, --quick 4)")
    ap.add_argument("--sbs-batch-size", type=int, default=None,
                    help="circuitgraph's graph.batch_size in a side by side with max_feature_nodes (default: "
                         "circuit-tracer's, so that both rank features in the same rounds and select the same ones)")
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(raw_argv)
    work_root = Path(args.work).resolve()
    _WORK[0] = work_root
    _TIME_LIMIT_S[0] = None if args.time_limit_min is None else 60 * args.time_limit_min
    _PORTABLE_NAMES[str(args.ct_python)] = ".venv-ct/bin/python"
    _PORTABLE_NAMES[shutil.which("circuitgraph") or "circuitgraph"] = "circuitgraph"
    work = work_root / ("quick" if args.quick else "full")
    out = Path(args.out or (work / "report" if args.quick else REPO / "docs" / "benchmarks"))
    sys.path.insert(0, str(HERE))
    from report import readme_paragraph, rewrite_readme, write_report

    if args.readme:
        results = load_results(out)
        if args.readme == "print":
            print(readme_paragraph(results))
        else:
            rewrite_readme(REPO / "README.md", readme_paragraph(results))
            log("rewrote the speed paragraph of README.md")
        return 0
    if args.report_only:
        write_report(load_results(out), out)
        log(f"wrote {out / 'README.md'}")
        return 0
    _BUNDLE_DIRS[:] = [work_root / "bundles", work / "bundles"]
    suite = configurations(args.quick, args.llama_max_feature_nodes or None)
    if args.only:
        only = [s for s in args.only.split(",") if s]
        unknown = sorted(set(only) - set(ALL_SUITES))
        if unknown:
            ap.error(f"--only: unknown suites {unknown}; known: {', '.join(ALL_SUITES)}")
    else:
        only = list(RECORDED_SUITES)
    if args.device == "cuda":
        only = ["gpu"]
    if args.sbs_batch_size:
        suite.side_by_sides = [dataclasses.replace(r, batch_size=args.sbs_batch_size) if r.max_feature_nodes else r
                               for r in suite.side_by_sides]
    if args.runs:
        names = set(args.runs.split(","))
        known = {r.name for r in suite.runs} | {r.name for r in suite.side_by_sides}
        unknown = names - known
        if unknown:
            ap.error(f"--runs: unknown run names {sorted(unknown)}; known: {', '.join(sorted(known))}")
        suite.runs = [r for r in suite.runs if r.name in names]
        suite.side_by_sides = [r for r in suite.side_by_sides if r.name in names]

    # the Llama-size bundle: made elsewhere (or here, from --llama-bundle-args)
    llama_path = Path(args.llama_bundle or (work_root / "bundles" / "llama-1b-size")).resolve()
    llama_make = args.llama_bundle_args or (QUICK_LLAMA_ARGS if args.quick and not args.llama_bundle else None)
    if args.quick and not args.llama_bundle:
        llama_path = work / "bundles" / "quick-llama-standin"
    llama: tuple[Bundle, Path] | str | None = None
    bundle_dirs: dict[Bundle, Path] = {}

    def resolve(run: Run) -> Path | None:
        """The run's bundle folder (built if needed), or None (the Llama bundle is missing)."""
        nonlocal llama
        if run.bundle == LLAMA:
            if llama is None:
                llama = external_bundle(llama_path, llama_make, work, "llama-1b-size")
            return None if isinstance(llama, str) else llama[1]
        if run.bundle not in bundle_dirs:
            bundle_dirs[run.bundle] = build_bundle(run.bundle, work)
        return bundle_dirs[run.bundle]

    def with_bundle(run: Run) -> Run:
        return dataclasses.replace(run, bundle=llama[0]) if run.bundle == LLAMA and isinstance(llama, tuple) else run

    if args.recheck_dry_run:
        return recheck_dry_run(suite, lambda r: resolve(r), out)

    results = load_results(out)
    ct_python = None if args.skip_ct else args.ct_python
    ct_envs = ("default", "tuned") if args.ct_env == "both" else (args.ct_env,)
    for name in [s for s in ALL_SUITES if s in only]:
        t_start = time.time()
        entry: dict[str, Any] = {
            "suite": name, "mode": "quick" if args.quick else "full",
            "command": " ".join(["python benchmarks/run_benchmarks.py", *(_portable(a) for a in raw_argv)]),
            "reproduce": reproduce_command(raw_argv, name),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(),
            "load_avg_at_start": list(os.getloadavg()), "code_at_start": code_state(),
            "environment": {"stripped_from_inherited": sorted(tuning_variables(dict(os.environ))),
                            "circuitgraph": tuning_variables(circuitgraph_env(args.threads)),
                            "circuit_tracer": {k: tuning_variables(ct_env(k, args.threads)) for k in ct_envs},
                            "threads_option": args.threads},
            "memory_budget_gb": args.memory_budget_gb, "peak_bytes_per_edge_assumed": PEAK_BYTES_PER_EDGE,
            "runs": [],
        }
        if args.quick:
            entry["stand_ins"] = "quick: small stand-in configurations, not the recorded sizes"
        previous = results["suites"].get(name)
        if args.runs and previous and previous.get("mode") == entry["mode"]:
            # --runs re-measures some runs: the suite's other runs stay, each saying when and with which
            # code it was measured (a suite's record is not replaced by a partial invocation)
            rerun = set(args.runs.split(","))
            for old in previous.get("runs", []):
                if old.get("name") not in rerun:
                    old.setdefault("recorded_with", {"started": previous.get("started"),
                                                     "code": previous.get("code_at_start"),
                                                     "command": previous.get("command")})
                    entry["runs"].append(old)
            if "side_by_side" in previous and not any(r.suite == name for r in suite.side_by_sides):
                entry["side_by_side"] = previous["side_by_side"]
        results["suites"][name] = entry
        log(f"suite {name}")

        def save() -> None:
            save_results(results, out)

        if name == "dataset":
            entry["dataset"] = dataset_suite(work, args.dataset_n or (4 if args.quick else 100))
        elif name == "gpu":
            reason = gpu_reason(args.gpu_skip_reason)
            if reason is not None:
                log(f"GPU suite skipped: {reason}")
                entry["skipped"] = reason
            for run in [] if reason else gpu_configurations(suite):
                bdir = resolve(run)
                if bdir is None:
                    entry.setdefault("not_run", []).append({"name": run.name, "why": llama})
                    continue
                run = with_bundle(run)
                entry["runs"].append(run_circuitgraph(run, bdir, work, run.memory_budget_gb or args.memory_budget_gb,
                                                      args.threads))
                save()
        else:
            for sbs in [r for r in suite.side_by_sides if r.suite == name]:
                entry["side_by_side"] = side_by_side(sbs, resolve(sbs), work, ct_python, args.threads,
                                                     sbs.memory_budget_gb or args.memory_budget_gb, ct_envs)
                save()
            for run in [r for r in suite.runs if r.suite == name]:
                bdir = resolve(run)
                if bdir is None:
                    log(f"{run.name}: skipped: {llama}")
                    entry["skipped"] = llama
                    continue
                run = with_bundle(run)
                res = run_circuitgraph(run, bdir, work, run.memory_budget_gb or args.memory_budget_gb, args.threads)
                entry["runs"].append(res)
                save()  # partial results survive an interrupted run
                if name == "llama_1b" and args.ct_llama:
                    entry["ct_attempt"] = ct_attempt(run, bdir, work, ct_python, args.ct_memory_cap_gb,
                                                     60 * args.ct_time_cap_min)
                    save()
        entry["load_avg_at_end"] = list(os.getloadavg())
        entry["code_at_end"] = code_state()
        entry["total_seconds"] = time.time() - t_start
        save_results(results, out)
        write_report(results, out)
    log(f"wrote {out / 'README.md'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
