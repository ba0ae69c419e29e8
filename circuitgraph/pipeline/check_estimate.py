"""The dry run's estimate of the checks that run the model: their forward passes and the
working set of the heaviest one (memory and CPU time, before they run).

Their cost is not per edge of the graph (:mod:`circuitgraph.pipeline.stage_memory`) but per
forward pass, so each is *probed*: its heaviest forward pass runs once on the loaded model,
with the check's own hooks, and the resident memory it adds (the process's peak, ``VmHWM``,
reset before) and its time are measured; the check's number of forward passes is counted from
the spec and its rows, and the time scaled by their tokens.  The dry run counts the heaviest
working set as a later stage of the memory plan, next to the full graph the check runs on
(:class:`~circuitgraph.attribution.later_stages.LaterStages` ``check_bytes``), so that its
advice leaves room for it; a check that does not fit next to the model alone is refused with
its own advice (:attr:`CheckEstimate.advice`).  The probes (:data:`PROBES`):

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
* ``predicted_vs_actual``: ``1 + k`` runs of the graph's prompt, 32 a pass (the probe: those
  runs, each removing one neuron), and ``1 + k`` runs of the frozen model, one at a time (the
  probe: a pass keeping the hooks :func:`~circuitgraph.validation.frozen.frozen_reader_values`
  keeps); the larger working set counts.
* ``ablate``: ``2 + kinds x n_controls`` runs per evaluation row, 32 a pass (probed as above),
  the controls' magnitudes (one pass caching the site in every layer, probed) and two frozen runs.
* ``faithfulness``: 4 runs of the graph's prompt in one pass, every unit of the model ablated
  (the probe: the same rows on the units the graph's options make).
* ``faithfulness_curve``: ``unit: nodes``: ``2 + sizes`` runs, every unit ablated (probed as
  faithfulness); ``unit: edges``: one frozen run per size (probed as above; the reference
  graphs of ``ablation: mean/patch`` are not counted).
* ``replacement_fidelity``: the real and the replacement model on each prompt (the probe: the
  check itself on the longest prompt).

``qk``, the only other check, runs one engine sweep of extra readers over the graph's writers
and no forward pass of the model: its cost is per edge, like the queries'.

The time is CPU seconds on this machine with its current torch threads, from one timed probe:
a loaded machine can stretch it (measured against the runs in docs/validation.md).
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import torch

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None  # type: ignore[assignment]

from circuitgraph.pipeline.inputs import resolve_prompt_like
from circuitgraph.spec import Spec
from circuitgraph.validation.circuit_faithfulness import universe_units
from circuitgraph.validation.controls import unit_magnitudes
from circuitgraph.validation.dispatch import CheckCall, _file_rows, check_metric, sign_regimes_rows
from circuitgraph.validation.echo_stats import stream_stats
from circuitgraph.validation.fidelity import replacement_fidelity
from circuitgraph.validation.frozen import frozen_capture_names
from circuitgraph.validation.gated_signs import echo_masks, row_nll_totals
from circuitgraph.validation.gradient_effects import gradient_effects
from circuitgraph.validation.interventions import Intervention, Unit, run_rows
from circuitgraph.validation.metrics import Metric

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.hook_names import HookPointLike
    from circuitgraph.adapters.sites import Site
    from circuitgraph.attribution.nodes_builder import GraphOptions
    from circuitgraph.dictionaries.protocol import Dictionary
    from circuitgraph.spec.validation import (
        Ablate,
        Faithfulness,
        FaithfulnessCurve,
        Patching,
        PredictedVsActual,
        ReplacementFidelity,
        SignRegimes,
    )

__all__ = ["CheckEstimate", "PeakWatch", "PROBES", "release_free_memory", "PER_EDGE_CHECKS", "estimate_checks", "reset_peak", "peak_so_far", "resident", "PATCH_BATCH"]

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


def release_free_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere), so that a measured block's allocations are not hidden by pages an earlier one
    freed and the allocator kept (blocks under its mmap threshold, up to 32 MB, are kept)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


#: a probe's measured working set is counted at this factor plus :data:`PROBE_SLACK`: the check's
#: own work around its forward passes (the graph's effects, the chosen nodes, its rows and
#: results) added up to 6% on a tiny model whose logits dominate (``tests/test_check_estimate.py``)
PROBE_MARGIN = 1.25
PROBE_SLACK = 32 * 1024**2


def _probe(fn: Any) -> tuple[int, float]:
    """``(bytes the call added to the resident memory at its peak, with the margin; seconds)``."""
    release_free_memory()
    with PeakWatch() as watch:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    return int(PROBE_MARGIN * watch.added) + PROBE_SLACK, seconds


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
    advice: str = ""  # what lowers the working set, when it does not fit

    def line(self, gb: Any) -> str:
        procs = (f"; {self.processes - 1} executor workers each load the model and hold their own"
                 if self.processes > 1 else "")
        return (f"{self.where} {self.kind}: {self.forward_passes:,} forward passes ({self.detail}); working set about "
                f"{gb(self.working_set)} above the model and the graph (measured on its largest forward pass{procs}); "
                f"about {self.seconds:,.0f} CPU seconds")


def _sign_regimes(c: CheckCall, p: SignRegimes, prompt: list[int], where: str) -> CheckEstimate:
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
                         f"{p.batch_size} runs (at most {runs} runs a row)",
                         f"lower {where}.batch_size or max_row_tokens, or run it with fewer executor workers")


def _patching(c: CheckCall, p: Patching, prompt: list[int], where: str) -> CheckEstimate:
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
    return CheckEstimate(where, "patching", n_fwd, work, seconds, 1, detail,
                         f"a shorter corrupted prompt for {where} (its {PATCH_BATCH} runs share a forward pass)")


#: ``run_rows``' runs per forward pass in the checks that do not set it (ablate, predicted_vs_actual,
#: faithfulness, faithfulness_curve)
ROWS_BATCH = 32


def _removal_rows(a: ModelAdapter, tokens: list[int], n_rows: int, batch: int) -> tuple[int, float]:
    """Probe ``run_rows`` on ``tokens`` with ``n_rows`` runs (up to two passes of ``batch``: the first
    pass's logits live on while the second is computed), each removing another neuron of the last
    layer at the last position (the clean run first, as the checks' rows): ``(bytes, seconds a pass)``."""
    f = a.facts
    probed = min(n_rows, 2 * batch)
    T = len(tokens)
    rows = [[]] + [[Intervention((Unit("neuron", f.n_layers - 1, T - 1, i % f.d_mlp),), "zero")]
                   for i in range(probed - 1)]
    work, secs = _probe(lambda: run_rows(a, tokens, rows, Metric.logit(0), batch_size=batch))
    return work, secs / math.ceil(probed / batch)


def _frozen_pass(a: ModelAdapter, tokens: list[int]) -> tuple[int, float]:
    """Probe one frozen run's captures (``frozen_reader_values`` keeps every layer's residuals and
    MLP inputs of the prompt): a forward pass keeping the same hooks."""
    captured: dict[str, torch.Tensor] = {}

    def keep(value: torch.Tensor, hook: HookPointLike) -> torch.Tensor:
        captured[hook.name] = value.detach()[0]
        return value

    x = torch.as_tensor(tokens, dtype=torch.long, device=a.device)[None]

    def run() -> None:
        with a.model.hooks(fwd_hooks=[(n, keep) for n in frozen_capture_names(a)]):
            a.model(x)
        captured.clear()

    return _probe(run)


def _gradient_pass(a: ModelAdapter, tokens: list[int]) -> tuple[int, float]:
    """Probe the ``predicted_gradient`` column's forward and backward pass (``gradient_effects``:
    the autograd graph of the whole prompt kept for the backward pass): one neuron of every layer
    at the last position, read by the last position's first logit."""
    t = len(tokens) - 1
    units = [Unit("neuron", layer, t, 0) for layer in range(a.facts.n_layers)]
    try:
        return _probe(lambda: gradient_effects(a, tokens, Metric.logit(0, position=t), units))
    except Exception:  # noqa: BLE001 - a model without neuron hooks (mixture of experts): the check has no such column
        return 0, 0.0


def _neuron_sites(a: ModelAdapter, options: GraphOptions, transcoders: Dictionary | None) -> list[tuple[Site, int]]:
    """The (site, layer) pairs whose magnitudes ``unit_magnitudes`` caches for the controls of a
    graph made with ``options`` (every layer of the site: controls come from every layer)."""
    L = a.facts.n_layers
    modes = getattr(options, "mlp", None) or {}
    if any(modes.get(l) == "transcoders" for l in range(L)) and transcoders is not None:
        return [("feature", l) for l in range(L) if l in transcoders]
    return [("neuron", l) for l in range(L)]


def _predicted_vs_actual(c: CheckCall, p: PredictedVsActual, prompt: list[int], where: str, options: GraphOptions,
                         transcoders: Dictionary) -> CheckEstimate:
    a = c.adapter
    n_rows = 1 + p.k
    rm_bytes, rm_s = _removal_rows(a, prompt, n_rows, ROWS_BATCH)
    fz_bytes, fz_s = _frozen_pass(a, prompt)
    gr_bytes, gr_s = _gradient_pass(a, prompt)
    n_batches = math.ceil(n_rows / ROWS_BATCH)
    # a magnitude pass, the rows, the frozen base, one frozen run per node and the gradient's pass
    n_fwd = 1 + n_batches + 1 + p.k + 1
    return CheckEstimate(where, "predicted_vs_actual", n_fwd, max(rm_bytes, fz_bytes, gr_bytes),
                         rm_s * (1 + n_batches) + fz_s * (1 + p.k) + gr_s, 1,
                         f"{n_rows} runs of {len(prompt)} tokens, {ROWS_BATCH} a pass, {1 + p.k} frozen runs "
                         "and one forward and backward pass (predicted_gradient)",
                         f"lower {where}.k (its {n_rows} runs share a forward pass) or shorten the prompt")


def _ablate(c: CheckCall, p: Ablate, prompt: list[int], where: str, options: GraphOptions,
            transcoders: Dictionary) -> CheckEstimate:
    a = c.adapter
    evaluation = c.prompts(p.eval_prompts, f"{where}.eval_prompts")
    if p.eval_dataset is not None:
        evaluation += _file_rows(c, p.eval_dataset, p.max_rows, f"{where}.eval_dataset")
    rows_eval = evaluation or [prompt]
    n_rows = 2 + len(p.controls) * p.n_controls
    rm_bytes, rm_s = _removal_rows(a, prompt, n_rows, ROWS_BATCH)
    sites = _neuron_sites(a, options, transcoders) if p.controls else []
    template = Intervention((Unit(sites[0][0], sites[0][1], len(prompt) - 1, 0),) if sites else (), "zero")
    mag_bytes, mag_s = _probe(lambda: unit_magnitudes(a, prompt, template, sites, transcoders)) if sites else (0, 0.0)
    fz_bytes, fz_s = _frozen_pass(a, prompt)
    per_row = math.ceil(n_rows / ROWS_BATCH)
    n_fwd = (1 + len(evaluation)) + per_row * len(rows_eval) + 2
    return CheckEstimate(where, "ablate", n_fwd, max(rm_bytes, mag_bytes, fz_bytes),
                         mag_s * (1 + len(evaluation)) + rm_s * per_row * len(rows_eval) + 2 * fz_s, 1,
                         f"{len(rows_eval)} rows x {n_rows} runs of {len(prompt)} tokens, {ROWS_BATCH} a pass",
                         f"lower {where}.n_controls (its {n_rows} runs share a forward pass) or shorten the prompt")


def _universe(a: ModelAdapter, options: GraphOptions, T: int) -> list[Unit]:
    return universe_units(a, options, T)


def _faithfulness(c: CheckCall, p: Faithfulness, prompt: list[int], where: str, options: GraphOptions,
                  transcoders: Dictionary) -> CheckEstimate:
    a = c.adapter
    if p.mode == "mean":
        refs = tuple(tuple(t) for t in c.prompts(p.reference_prompts, f"{where}.reference_prompts")) \
            or (tuple(prompt),)
        kw: dict[str, Any] = dict(reference=refs, pooling="auto" if p.reference_prompts else "all")
    else:
        kw = {}
    universe = tuple(_universe(a, options, len(prompt)))
    circuit = universe[-min(len(universe), 64):]  # the graph's nodes are not known before the sweep
    rows = [[], [Intervention(universe, p.mode, exclude=circuit, **kw)], [Intervention(universe, p.mode, **kw)],
            [Intervention(circuit, p.mode, **kw)]]
    work, secs = _probe(lambda: run_rows(a, prompt, rows, Metric.logit(0), transcoders=transcoders))
    return CheckEstimate(where, "faithfulness", 1 + len(kw.get("reference", ())), work, secs, 1,
                         f"4 runs of {len(prompt)} tokens in one pass, every unit of the model ablated",
                         "shorten the prompt (its 4 runs share one forward pass)")


def _faithfulness_curve(c: CheckCall, p: FaithfulnessCurve, prompt: list[int], where: str, options: GraphOptions,
                        transcoders: Dictionary) -> CheckEstimate:
    a = c.adapter
    n_rows = 2 + len(p.sizes)
    if p.unit == "nodes":
        kw: dict[str, Any] = {}
        if p.ablation == "mean":
            kw = dict(reference=tuple(tuple(t) for t in c.prompts(p.reference_prompts, f"{where}.reference_prompts")))
        elif p.ablation == "patch":
            kw = dict(patch=tuple(c.prompt(p.patch_prompt, f"{where}.patch_prompt")))
        universe = tuple(_universe(a, options, len(prompt)))
        rows = [[]] + [[Intervention(universe, p.ablation, **kw)]] * (n_rows - 1)
        work, secs = _probe(lambda: run_rows(a, prompt, rows, Metric.logit(0), transcoders=transcoders,
                                             batch_size=ROWS_BATCH))
        n_fwd = math.ceil(n_rows / ROWS_BATCH) + len(kw.get("reference", ())) + (1 if "patch" in kw else 0)
        return CheckEstimate(where, "faithfulness_curve", n_fwd, work, secs * n_fwd, 1,
                             f"{n_rows} runs of {len(prompt)} tokens, {ROWS_BATCH} a pass",
                             "fewer sizes or a shorter prompt")
    # edges: one frozen run per size with the ablated edges' hooks; the reference prompts' graphs
    # (ablation mean/patch) are built as the main graph is, and are not estimated here
    work, secs = _frozen_pass(a, prompt)
    refs = len(p.reference_prompts) + (1 if p.patch_prompt is not None else 0)
    return CheckEstimate(where, "faithfulness_curve", n_rows, work, secs * n_rows, 1,
                         f"{n_rows} frozen runs of {len(prompt)} tokens"
                         + (f"; the {refs} reference graphs not counted (each as large as the run's)" if refs else ""),
                         "fewer sizes or a shorter prompt")


def _replacement_fidelity(c: CheckCall, p: ReplacementFidelity, prompt: list[int], where: str, options: GraphOptions,
                          transcoders: Dictionary) -> CheckEstimate:
    a = c.adapter
    rows = [prompt] + c.prompts(p.prompts, f"{where}.prompts")
    longest = max(rows, key=len)
    work, secs = _probe(lambda: replacement_fidelity(None, prompts=[longest], adapter=a, transcoders=transcoders))
    tokens = sum(map(len, rows))
    return CheckEstimate(where, "replacement_fidelity", 2 * len(rows) + 2, work,
                         secs * tokens / max(len(longest), 1), 1,
                         f"{len(rows)} prompts, the real and the replacement model on each",
                         "shorter prompts")


#: check kind -> its probe; the other checks of the registry (``CHECK_TYPES``) cost what the graph
#: holds (:mod:`circuitgraph.pipeline.stage_memory`): ``qk`` runs one engine sweep of extra readers
#: over the graph's writers, no forward pass of the model
PROBES: dict[str, Any] = {
    "sign_regimes": lambda c, p, prompt, where, options, tcs: _sign_regimes(c, p, prompt, where),
    "patching": lambda c, p, prompt, where, options, tcs: _patching(c, p, prompt, where),
    "predicted_vs_actual": _predicted_vs_actual,
    "ablate": _ablate,
    "faithfulness": _faithfulness,
    "faithfulness_curve": _faithfulness_curve,
    "replacement_fidelity": _replacement_fidelity,
}
#: the checks whose cost is per edge of the graph, not per forward pass (see :data:`PROBES`)
PER_EDGE_CHECKS = frozenset({"qk"})


@torch.no_grad()
def estimate_checks(spec: Spec, adapter: ModelAdapter, prompt: list[int], *, options: GraphOptions | None = None,
                    transcoders: Dictionary | None = None) -> list[CheckEstimate]:
    """The :class:`CheckEstimate` of every check of ``spec`` that runs the model (:data:`PROBES`),
    probed on ``adapter`` (the loaded model; ``prompt``: the main prompt's token ids; ``options``,
    ``transcoders``: the graph's, as the run makes them)."""
    out = []
    for i, item in enumerate(spec.validate):
        if item.kind not in PROBES:
            continue
        where = f"validate[{i}]"
        call = CheckCall(None, adapter, adapter.tokenizer,
                         lambda v, where=where: resolve_prompt_like(v, adapter, where=where), spec.seed, spec)
        try:
            out.append(PROBES[item.kind](call, item.params, list(prompt), where, options, transcoders))
        except Exception as exc:  # noqa: BLE001 - the dry run reports it; the run would fail the check the same way
            out.append(CheckEstimate(where, item.kind, 0, 0, 0.0, 1, f"not estimated: {exc}"))
    return out
