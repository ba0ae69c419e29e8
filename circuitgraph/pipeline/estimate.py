"""The dry run (``circuitgraph run --dry-run``): the memory a run would need, before it runs.

Before loading anything, the model and dictionary files' sizes are checked against the memory
available, so a model that cannot even be loaded is refused without loading it.  When they fit,
the forward pass and the node tables are made and the engine's edge plan
(:mod:`circuitgraph.attribution.plan`, which the engine itself checks before its sweep) is
reported, with the advice that would make a run fit.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX (Windows): the loading peak is not known
    resource = None  # type: ignore[assignment]

from circuitgraph._io import read_json_file, safetensors_header
from circuitgraph.adapters.dictionary_sources import existing_dictionary_folder
from circuitgraph.adapters.files import hf_weight_files, model_folder_format
from circuitgraph.adapters.model_sources import model_source
from circuitgraph.attribution.build import plan_run
from circuitgraph.attribution.plan import (  # re-exported: the plan's old home
    _LAST_RESORT,
    EDGE_PEAK_BYTES,
    FLOAT64_EXTRA_BYTES,
    MFN_EDGE_PEAK_BYTES,
    USABLE,
    EdgePlan,
    _gb,
    available_memory,
    check_plan,
    check_rows,
    device_working_set,
    plan_edges,
    process_memory,
)
from circuitgraph.dictionaries.formats import dictionary_footprint
from circuitgraph.pipeline.check_estimate import CheckEstimate, PeakWatch, estimate_checks, release_free_memory
from circuitgraph.pipeline.memory_watch import MEMORY_LIMIT_ENV, memory_budget
from circuitgraph.pipeline.runner import prepare
from circuitgraph.pipeline.stage_memory import check_edge_bytes
from circuitgraph.spec import Spec

__all__ = ["EdgePlan", "RunEstimate", "estimate_run", "plan_edges", "check_plan", "check_rows", "available_memory",
           "process_memory", "EDGE_PEAK_BYTES", "MFN_EDGE_PEAK_BYTES", "FLOAT64_EXTRA_BYTES", "device_working_set"]


def _model_folder_sizes(model_dir: Path) -> tuple[int, int, int]:
    """``(n_layers, d_model, weight bytes)`` of a model folder, from its config.json and the
    safetensors headers: a TransformerLens folder, or a Hugging Face one (its shards summed)."""
    cfg = read_json_file(model_dir / "config.json", "model config")
    if model_folder_format(model_dir) == "huggingface":
        get = lambda *keys: next(int(cfg[k]) for k in keys if cfg.get(k) is not None)  # noqa: E731
        L, D = get("num_hidden_layers", "n_layer"), get("hidden_size", "n_embd", "d_model")
        return L, D, sum(_safetensors_bytes(f) for f in hf_weight_files(model_dir))
    return int(cfg["n_layers"]), int(cfg["d_model"]), _safetensors_bytes(model_dir / "model.safetensors")


def _safetensors_bytes(path: Path) -> int:
    """Tensor bytes in a safetensors file, from its checked header (no tensor is read)."""
    return sum(end - start for start, end in (m["data_offsets"] for m in safetensors_header(path).values()))


@dataclass
class RunEstimate:
    """What ``circuitgraph run --dry-run`` reports."""

    n_pos: int
    n_layers: int
    d_model: int
    d_sae: int | None
    bytes_model: int
    bytes_transcoders: int
    available: int
    plan: EdgePlan | None
    static_fits: bool
    device: str = "cpu"
    device_lines: list[str] = field(default_factory=list)
    device_fits: bool = True
    notes: list[str] = field(default_factory=list)
    #: the checks that run the model many times (sign_regimes, patching), probed
    checks: list[CheckEstimate] = field(default_factory=list)

    def check_bytes(self, c: CheckEstimate) -> int:
        """What a probed check adds next to the model: its working set and, with an executor, each
        worker's model and working set."""
        return c.working_set + (c.processes - 1) * (self.bytes_model + c.working_set)

    def check_peak(self, c: CheckEstimate) -> int:
        """A probed check's stage at its peak: the base and the later stages' allowance, the full
        graph as it is held while checks run (its per-edge cost), and the check's working set."""
        p = self.plan
        assert p is not None
        return p.bytes_fixed + p.n_edges_final * check_edge_bytes(c.kind) + self.check_bytes(c)

    @property
    def checks_fit(self) -> bool:
        """Whether each probed check fits next to the model and what the process holds after the
        forward pass, with this spec's node tables and an empty graph (where the plan advises a
        smaller graph, its advice counts the checks: :attr:`lines` gives it first)."""
        p = self.plan
        if p is None:
            return True
        return all(p.bytes_fixed + self.check_bytes(c) <= p.limit for c in self.checks)

    @property
    def bytes_peak(self) -> int:
        """The run's estimated peak: the plan's (the sweep, and the later stages, the probed checks
        among them)."""
        return 0 if self.plan is None else self.plan.bytes_peak

    @property
    def fits(self) -> bool:
        return (self.static_fits and self.device_fits and (self.plan is None or self.plan.fits)
                and self.checks_fit)

    def lines(self) -> list[str]:
        out = [f"prompt: {self.n_pos} tokens; model: {self.n_layers} layers, d_model {self.d_model}"
               + (f"; transcoders: d_sae {self.d_sae}" if self.d_sae else "")]
        out.append(f"files: model {_gb(self.bytes_model)}, dictionaries {_gb(self.bytes_transcoders)}; "
                   f"{_gb(self.available)} of memory available")
        p = self.plan
        if p is not None:
            chosen = ([f"{p.max_feature_nodes} of the {p.n_feature_nodes} active features (max_feature_nodes)"]
                      if p.max_feature_nodes is not None else []) + \
                     ([f"{p.max_neuron_nodes} of the {p.n_neuron_nodes} neurons (max_neuron_nodes)"]
                      if p.max_neuron_nodes is not None else [])
            rows = f"rows of {' and '.join(chosen)}" if chosen else "every row"
            out.append(f"estimated nodes: {p.n_nodes} (feature nodes {p.n_feature_nodes}, neuron nodes "
                       f"{p.n_neuron_nodes}); edges at most {p.n_edges_upper:,} ({rows})")
            if p.probe_top_k is not None:
                out.append(f"the node tables of every neuron would not fit: they were made with neuron_top_k "
                           f"{p.probe_top_k} to plan (the edge bound is for those), the others counted at their cost")
            if p.selecting:
                out.append(f"after folding the unselected nodes: at most {p.n_edges_folded_upper:,} edges")
            st = p.stages
            if st is not None:
                kept = ("as many as the full graph" if st.kept_cap is None
                        else f"at most {st.kept_cap:,} (prune.top_k_edges or what its JSON export writes)")
                out.append(f"later stages: the heaviest on the full graph is {st.heaviest}; the exported graph "
                           f"keeps {kept} edges, {st.kept_edge_bytes} bytes each while exported (the exports add "
                           f"up to {_gb(p.bytes_exports)} to the peak if pruning keeps that many)"
                           + (f"; an unpruned graph's JSON holds at most {st.export_limit:,} edges"
                              if st.export_limit is not None else "")
                           + (f"; the heaviest check's forward passes ({st.check}) add {_gb(st.check_bytes)} to "
                              f"the full graph held at {st.check_edge_bytes} bytes an edge" if st.check_bytes else ""))
            out.append(f"memory: {_gb(p.base)} after the forward pass and node tables (measured), edges at most "
                       f"{_gb(p.bytes_edges)} ({p.bytes_per_edge} bytes each at the peak"
                       + (f"; {p.folded_bytes_per_edge} per folded edge" if p.selecting else "")
                       + (f"; loading peaked at {_gb(p.floor)}" if p.floor else "")
                       + f"); peak at most about {_gb(p.bytes_peak)} of the {_gb(p.limit)} a run may use")
        out += self.device_lines
        for c in self.checks:
            out.append(c.line(_gb) + (f"; its stage peaks at about {_gb(self.check_peak(c))} with the graph"
                                      if p is not None and c.forward_passes else ""))
        if p is not None:
            out.append(f"estimated peak of the run: {_gb(self.bytes_peak)} (the edge sweep, the later stages and "
                       f"the checks' forward passes; the run may use {_gb(p.limit)})")
        if self.fits:
            out.append("fits: yes")
        elif p is not None and self.static_fits and self.device_fits and p.may_fit:
            out.append(f"fits: probably - at most {_gb(p.bytes_peak)} if the widest feature rows are selected, "
                       f"{_gb(p.bytes_peak_lower)} if the narrowest; which are selected is known only as they are "
                       "computed, and the run stops with advice if it would pass the memory it may use")
        elif (p is not None and self.static_fits and self.device_fits and not p.fits
              and p.advice and p.advice != [_LAST_RESORT]):
            # a smaller graph fits, the checks' forward passes counted (the plan's later stages)
            out.append("fits: NO - " + "; or ".join(p.advice))
        elif p is not None and self.static_fits and self.device_fits and not self.checks_fit:
            worst = [c for c in self.checks if p.bytes_fixed + self.check_bytes(c) > p.limit]
            out.append("fits: NO - a check's forward passes do not fit next to the model, whatever the graph: "
                       + "; ".join(f"{c.where} {c.kind} needs about {_gb(self.check_bytes(c))} above the "
                                   f"{_gb(p.bytes_fixed)} the model and the forward pass hold"
                                   + (f": {c.advice}" if c.advice else "") for c in worst))
        elif not self.static_fits:
            out.append("fits: NO - the model and dictionaries alone do not fit in the memory available; "
                       "use a machine with more memory")
        elif p is not None and not p.fits:
            out.append("fits: NO - " + "; or ".join(p.advice or [_LAST_RESORT]))
        else:
            out.append("fits: NO - the model and the graph's working set do not fit on the device; "
                       "use model: {device: cpu} or a device with more memory")
        return out + [f"note: {n}" for n in self.notes]


def estimate_run(spec: Spec, *, memory_limit: int | None = None) -> RunEstimate:
    """The dry run: the files' sizes first; when the model fits, the forward pass and the node
    tables (what is active where), the resident memory measured, and the edges bounded, with
    what the later stages (queries and checks on the full graph, pruning, exports) add.
    ``memory_limit``: the budget in bytes (else ``CIRCUITGRAPH_MEMORY_LIMIT``), which lowers the
    memory the run may use."""
    m = spec.model
    notes: list[str] = []
    bytes_model, bytes_tc, d_sae, L, D = 0, 0, None, 0, 0
    source = model_source(m)
    model_dir = source.local_folder(m)
    pending = source.pending(m) if model_dir is None else None
    if pending is not None:  # a GGUF file not converted yet (its header's sizes), a model not fetched yet
        L, D, bytes_model = pending.n_layers, pending.d_model, pending.bytes
        notes.append(pending.note + (f" (about {_gb(bytes_model)})" if bytes_model else ""))
    elif model_dir is not None:
        L, D, bytes_model = _model_folder_sizes(model_dir)
    if source.local:
        tc_dir = existing_dictionary_folder(spec.transcoders)
        if tc_dir is not None:
            d_sae, _, bytes_tc, note = dictionary_footprint(tc_dir)  # lazily read layouts: what is read
            notes.append(note)
    else:
        notes.append("hub model: its size is known only once it is loaded")
    avail = available_memory()
    base = process_memory()
    budget = memory_budget(memory_limit)
    usable = int(USABLE * (avail + base))
    limit = usable if budget is None else min(budget, usable)
    if budget is not None:
        notes.append(f"memory budget: {_gb(budget)} (--memory-limit or {MEMORY_LIMIT_ENV}); the run may use "
                     f"{_gb(limit)}")
    # loading holds a dictionary twice while it is converted
    static_fits = base + bytes_model + 2 * bytes_tc <= limit
    if not static_fits:
        return RunEstimate(0, L, D, d_sae, bytes_model, bytes_tc, avail, None, False, m.device, notes=notes)

    # the loading peak is this estimate's, not what the process ran before (a notebook, a test session)
    with PeakWatch() as loading:
        p = prepare(spec, memory_limit=budget)
    f = p.adapter.facts
    # the checks that run the model: their forward passes probed, their working set counted as a
    # later stage of the plan (with the graph they run on), so that its advice leaves room for them
    before_probes = process_memory()
    checks = estimate_checks(spec, p.adapter, p.lin.tokens.tolist(), options=p.options, transcoders=p.transcoders)
    # what the probes freed goes back to the system before the plan measures the base
    gc.collect()
    release_free_memory()
    left = process_memory() - before_probes
    if left > 64 * 1024**2:
        notes.append(f"the checks' probes left {_gb(left)} resident (counted in the measured base)")
    probed = [c for c in checks if c.forward_passes]
    st = getattr(p.options, "stages", None)
    if probed and st is not None:
        extra = [c.working_set + (c.processes - 1) * (bytes_model + c.working_set) for c in probed]
        worst = probed[max(range(len(probed)), key=extra.__getitem__)]
        p.options.stages = replace(st, check_bytes=max(extra), check=f"{worst.where} {worst.kind}",
                                   check_edge_bytes=max(check_edge_bytes(c.kind) for c in probed))
    # loading the model and dictionaries passes through a higher peak, whose pages a run may keep
    plan, need = plan_run(p.adapter, p.lin, p.transcoders, p.targets, p.options, floor=loading.peak)
    if plan.floor > plan.limit or (not plan.fits and not plan.advice):
        plan.advice = [_LAST_RESORT]  # loading alone passes the limit: no setting of the graph helps
    est = RunEstimate(p.lin.n_pos, f.n_layers, f.d_model, d_sae, bytes_model, bytes_tc, avail, plan, True,
                      str(p.adapter.device), notes=notes, checks=checks)
    if str(p.adapter.device).startswith("cuda"):
        free = _device_free(p.adapter.device)
        est.device_fits = need <= USABLE * free
        est.device_lines = [f"device {p.adapter.device}: about {_gb(need)} more needed for the edge sweep, "
                            f"{_gb(free)} free"]
    return est


def _device_free(device: Any) -> int:
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free)
