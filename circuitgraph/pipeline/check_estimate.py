"""The dry run's estimate of the checks that run the model many times: ``sign_regimes`` and
``patching`` sweeps (memory and CPU time, before they run).

Their cost is not per edge of the graph (:mod:`circuitgraph.pipeline.stage_memory`) but per
forward pass, so each is *probed*: its heaviest forward pass runs once on the loaded model,
with the check's own hooks, and the resident memory it adds (the process's peak, ``VmHWM``,
reset before) and its time are measured; the check's number of forward passes is counted from
the spec and its rows, and the time scaled by their tokens.

* ``sign_regimes``: the statistics run one forward pass per selection and evaluation row (the
  probe: the longest selection row, hooks on every layer asked for); the removal runs
  ``1 + groups x (1 + kinds x n_controls)`` runs per evaluation row (``groups``: 4 with
  ``groups: true``, an upper bound: an empty group runs nothing), ``batch_size`` per forward
  pass (the probe: up to two passes of ``batch_size`` runs on the longest evaluation row, one neuron's echo removed
  in every layer), then the same sets on the graph's prompt for its metric.  With ``executor:`` every worker holds the model and one working set.
* ``patching``: one run per patch (a neuron sweep counts every neuron of the swept layers,
  an upper bound: neurons that do not differ between the prompts are not run), the sanity
  rows and the sets, 64 per forward pass, each with one clean pass for the patches' source
  (the probe: two passes of 64 copies of the corrupted prompt, each patching another neuron
  of the last layer from the clean one: a pass's logits live on while the next is computed).

The time is CPU seconds on this machine with its current torch threads, from one timed probe:
a loaded machine can stretch it (measured against the runs in docs/validation.md).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None  # type: ignore[assignment]

from circuitgraph.pipeline.inputs import resolve_prompt_like
from circuitgraph.spec import Spec
from circuitgraph.validation.dispatch import CheckCall, check_metric, sign_regimes_rows
from circuitgraph.validation.echo_stats import stream_stats
from circuitgraph.validation.gated_signs import echo_masks, row_nll_totals
from circuitgraph.validation.interventions import Intervention, Unit, run_rows
from circuitgraph.validation.metrics import Metric

__all__ = ["CheckEstimate", "PeakWatch", "estimate_checks", "reset_peak", "peak_so_far", "resident", "PATCH_BATCH"]

#: the patching check's runs per forward pass (``patching(batch_size=64)``)
PATCH_BATCH = 64
_PROC_SELF = Path("/proc/self")


#: how far above the resident memory the peak may read just after a reset that worked
_RESET_SLACK = 16 * 1024**2
#: the sampler's period where the peak cannot be reset (seconds)
SAMPLE_PERIOD = 0.002


def reset_peak() -> bool:
    """Start the process's peak resident memory afresh (Linux: ``5`` to ``/proc/self/clear_refs``
    resets ``VmHWM``). True where the reset took (the peak reads the resident memory again);
    False where it cannot be done or had no effect (not Linux, a sandbox's ``/proc``), and the
    peak stays the process's whole lifetime's."""
    try:
        (_PROC_SELF / "clear_refs").write_text("5")
    except OSError:
        return False
    peak, now = _status_kb("VmHWM"), _status_kb("VmRSS")
    return peak is not None and now is not None and peak <= now + _RESET_SLACK


def _status_kb(field: str) -> int | None:
    try:
        for line in (_PROC_SELF / "status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_so_far() -> int:
    """The process's peak resident memory since :func:`reset_peak` (``VmHWM``), or its lifetime
    peak (``ru_maxrss``) where ``/proc`` does not say; 0 where neither is known."""
    peak = _status_kb("VmHWM")
    if peak is not None:
        return peak
    if resource is None:  # pragma: no cover - not POSIX
        return 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def resident() -> int:
    """The process's resident memory now (``VmRSS``, else psutil's; 0 where unknown)."""
    now = _status_kb("VmRSS")
    if now is not None:
        return now
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with the run's requirements
        return 0
    return int(psutil.Process().memory_info().rss)


class PeakWatch:
    """The peak resident memory of the block it wraps: ``with PeakWatch() as w: ...; w.peak``.

    Where the kernel's peak can be reset (:func:`reset_peak`) it is read once at the end, exact.
    Where it cannot (the reset is refused or has no effect, as in some sandboxes), the lifetime
    peak would count whatever the process held before (a notebook, a test session), so a thread
    samples the resident memory every :data:`SAMPLE_PERIOD` instead; it can miss a spike shorter
    than that which holds the interpreter lock throughout."""

    def __init__(self) -> None:
        self.before = 0
        self.peak = 0
        self.sampled = False
        self._stop: Any = None
        self._thread: Any = None

    def __enter__(self) -> PeakWatch:
        self.before = resident()
        if reset_peak():
            return self
        import threading

        self.sampled = True
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="circuitgraph-peak-watch", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_PERIOD):
            self.peak = max(self.peak, resident())

    def __exit__(self, *exc: object) -> None:
        if self.sampled:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, resident())
        else:
            self.peak = peak_so_far()

    @property
    def added(self) -> int:
        """What the block added to the resident memory at its peak (bytes, at least 0)."""
        return max(self.peak - self.before, 0)


def _probe(fn: Any) -> tuple[int, float]:
    """``(bytes the call added to the resident memory at its peak, seconds)``."""
    with PeakWatch() as watch:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    return watch.added, seconds


@dataclass
class CheckEstimate:
    """One check: its forward passes, the working set of its heaviest one (measured) and its time."""

    where: str
    kind: str
    forward_passes: int
    working_set: int  # bytes above the model, measured on the probe
    seconds: float  # CPU seconds, estimated
    processes: int = 1  # processes holding the model and a working set (executor workers + this one)
    detail: str = ""

    def line(self, gb: Any) -> str:
        procs = (f"; {self.processes - 1} executor workers each load the model and hold their own"
                 if self.processes > 1 else "")
        return (f"{self.where} {self.kind}: {self.forward_passes:,} forward passes ({self.detail}); working set about "
                f"{gb(self.working_set)} above the model and the graph (measured on its largest forward pass{procs}); "
                f"about {self.seconds:,.0f} CPU seconds")


def _sign_regimes(c: CheckCall, p: Any, prompt: list[int], where: str) -> CheckEstimate:
    a = c.adapter
    selection, evaluation = sign_regimes_rows(c, p)
    if p.use_graph_prompt:
        selection = [prompt] + selection
    evaluation = evaluation or selection
    layers = sorted(set(p.layers)) if p.layers is not None else list(range(a.facts.n_layers))
    longest_sel = max(selection, key=len)
    longest_eval = max(evaluation, key=len)
    runs = 1 + (4 if p.groups else 1) * (1 + len(p.controls) * p.n_controls)
    per_row = math.ceil(runs / p.batch_size)
    stat_bytes, stat_s = _probe(lambda: stream_stats(a, [longest_sel], layers, p.top_k))
    # two passes when a row has more runs than one holds: the first pass's logits live on while
    # the second is computed
    probed = min(runs, 2 * p.batch_size)
    masks = echo_masks([[Unit("neuron", l, None, 0) for l in layers]] * (probed - 1), a.facts.d_mlp)
    rm_bytes, rm_s = _probe(lambda: row_nll_totals(a, longest_eval, masks, probed, 1, p.batch_size))
    rm_s /= math.ceil(probed / p.batch_size)
    n_stat = len(selection) + (0 if evaluation is selection else len(evaluation))
    stat_tokens = sum(map(len, selection)) + (0 if evaluation is selection else sum(map(len, evaluation)))
    seconds = stat_s * stat_tokens / max(len(longest_sel), 1) \
        + rm_s * per_row * sum(map(len, evaluation)) / max(len(longest_eval), 1)
    workers = 0
    if p.executor is not None:
        workers = p.executor.workers or 1
    # and the echo-dominated set with its controls on the graph's prompt, for the graph's metric
    n_metric = math.ceil((2 + len(p.controls) * p.n_controls) / p.batch_size)
    seconds += rm_s * n_metric * len(prompt) / max(len(longest_eval), 1)
    return CheckEstimate(where, "sign_regimes", n_stat + per_row * len(evaluation) + n_metric,
                         max(stat_bytes, rm_bytes),
                         seconds, 1 + workers,
                         f"{n_stat} rows of statistics, {len(evaluation)} evaluation rows x {per_row} of "
                         f"{p.batch_size} runs (at most {runs} runs a row)")


def _patching(c: CheckCall, p: Any, prompt: list[int], where: str) -> CheckEstimate:
    a = c.adapter
    f = a.facts
    clean = prompt if p.clean is None else c.prompt(p.clean, f"{where}.clean")
    corrupted = c.prompt(p.corrupted, f"{where}.corrupted")
    L, T, H = f.n_layers, len(clean), f.n_heads
    swept = L if p.layers is None else len(set(p.layers))
    g = set(p.granularity)
    runs = 3 + len(p.sets)
    runs += (L + 1) * T if "position" in g else 0
    runs += 2 * swept * (T + 1) if "layer" in g else 0
    runs += swept * H if "head" in g else 0
    if "neuron" in g:
        runs += swept * f.d_mlp + (0 if "layer" in g else swept)
    metric = check_metric(p.metric, a, c.tokenizer) or Metric.logit(0)
    # distinct patches (a sweep's rows each patch another unit): neurons of the last layer, two
    # passes when the sweep has them (the first pass's logits live on while the second is computed)
    probed = min(runs, 2 * PATCH_BATCH)
    rows = [[Intervention.patched((Unit("neuron", L - 1, None, i % f.d_mlp),), clean)] for i in range(probed)]
    work, secs = _probe(lambda: run_rows(a, corrupted, rows, metric, batch_size=PATCH_BATCH))
    secs /= math.ceil(probed / PATCH_BATCH)
    n_batches = math.ceil(runs / PATCH_BATCH)
    # each batch also runs the clean prompt once (the patches' source); before them the clean
    # metric and, for a neuron or feature sweep, the clean and corrupted caches: 4 single passes
    n_fwd = 4 + 2 * n_batches
    seconds = secs * n_batches  # the probe timed a full batch and its clean run
    detail = f"{runs:,} runs of {T} tokens, {PATCH_BATCH} a pass" + \
        ("; a neuron sweep counts every neuron of its layers" if "neuron" in g else "") + \
        ("; feature sweeps not counted" if "feature" in g else "")
    return CheckEstimate(where, "patching", n_fwd, work, seconds, 1, detail)


@torch.no_grad()
def estimate_checks(spec: Spec, adapter: Any, prompt: list[int]) -> list[CheckEstimate]:
    """The :class:`CheckEstimate` of every ``sign_regimes`` and ``patching`` check of ``spec``,
    probed on ``adapter`` (the loaded model; ``prompt``: the main prompt's token ids)."""
    out = []
    for i, item in enumerate(spec.validate):
        if item.kind not in ("sign_regimes", "patching"):
            continue
        where = f"validate[{i}]"
        call = CheckCall(None, adapter, adapter.tokenizer,
                         lambda v, where=where: resolve_prompt_like(v, adapter, where=where), spec.seed, spec)
        fn = _sign_regimes if item.kind == "sign_regimes" else _patching
        try:
            out.append(fn(call, item.params, list(prompt), where))
        except Exception as exc:  # noqa: BLE001 - the dry run reports it; the run would fail the check the same way
            out.append(CheckEstimate(where, item.kind, 0, 0, 0.0, 1, f"not estimated: {exc}"))
    return out
