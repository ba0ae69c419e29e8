"""The Python API: run a spec end to end.

``run(spec)`` loads the model and transcoders, linearises the prompt, builds the exact graph,
prunes it if asked, runs the declared queries and validation checks, and writes the exports.
The CLI is a thin layer over this module.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import logging
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph._results import ResultEntry, RunOutcome, stored_results
from circuitgraph.adapters.loading import torch_dtype
from circuitgraph.attribution.build import build_graph
from circuitgraph.attribution.linearisation import linearise
from circuitgraph.attribution.nodes_builder import GraphOptions
from circuitgraph.errors import RenderError, ResourceError, SpecError, TokenWarning, one_line
from circuitgraph.export import graph_to_json
from circuitgraph.export.dot import raw_influence
from circuitgraph.export.html import run_html, write_report
from circuitgraph.export.labels import LABELS_FILE, apply_feature_labels, load_feature_labels
from circuitgraph.export.neuronpedia import DEFAULT_MAX_LINKS
from circuitgraph.export.outputs import OutputSet
from circuitgraph.export.portable import portable_paths
from circuitgraph.features.summary import open_features
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.metadata import ModelRecord, RunMetadata
from circuitgraph.pipeline.exports import EXPORT_WRITERS, ExportJob
from circuitgraph.pipeline.inputs import (
    check_layer_keys,
    load_inputs,
    resolve_prompt,
    resolve_prompt_like,
    resolve_targets,
)
from circuitgraph.pipeline.memory_watch import MemoryWatch, memory_budget, run_limit
from circuitgraph.pipeline.precision import precision_warning
from circuitgraph.pipeline.stage_memory import later_stages
from circuitgraph.queries import graph_scores, prune_graph, run_query
from circuitgraph.queries._base import require_context
from circuitgraph.queries.qk import qk_problems
from circuitgraph.spec import Spec, SpecSource, load_spec
from circuitgraph.spec.export import EXPORT_KINDS
from circuitgraph.validation import run_check
from circuitgraph.validation.steering import steer_item

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.attribution.linearisation import Linearisation
    from circuitgraph.attribution.targets import ResolvedTarget
    from circuitgraph.dictionaries.protocol import Dictionary
    from circuitgraph.graph.nodes import Node
    from circuitgraph.pipeline.inputs import LoadedInputs
    from circuitgraph.spec.graph import PruneSpec

__all__ = ["RunResult", "run", "build", "prepare", "steer_spec"]

logger = logging.getLogger("circuitgraph")


@dataclass(repr=False)
class RunResult(RunOutcome):
    """What a run produced.

    Attributes:
        spec: the validated spec.
        graph: the exported graph (pruned when the spec asks for pruning).
        full_graph: the unpruned graph.
        queries: one :class:`~circuitgraph._results.ResultEntry` per declared query (``kind``,
            ``params``, ``on``, ``status``, ``error``, ``result``; also readable as a mapping of
            those keys); ``status`` is ``"ok"`` (``result`` is the result object, ``error`` None),
            ``"failed"`` (``error`` is the one-line message, ``result`` None).
        validation: one entry per declared check, same shape; a check that ran but whose result
            cannot be trusted reports its own status (``"uncontrolled"``: controls that could not be
            drawn), ``error`` the reason and ``result`` the result.
        steering: one entry per ``steer:`` item, same shape (``result`` a
            :class:`~circuitgraph.validation.steering.SteeringResult`).
        exports: ``{kind: path}`` of every file written.
        timings: seconds per stage.
        warnings: what the run warned about (unknown pieces of prompt texts...), also in the
            graph's metadata under ``warnings``.
        memory: per stage, the process's resident memory when it started and its peak, in
            bytes (``{stage: {"start", "peak"}}``, sampled by
            :class:`~circuitgraph.pipeline.memory_watch.MemoryWatch`).
    """

    spec: Spec
    graph: AttributionGraph
    full_graph: AttributionGraph
    queries: list[ResultEntry] = field(default_factory=list)
    validation: list[ResultEntry] = field(default_factory=list)
    exports: dict[str, Path] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    steering: list[ResultEntry] = field(default_factory=list)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        """One line per failed (or uncontrolled) query, check or steer item: ``queries[i] kind: error``."""
        return [f"{where}[{i}] {e.kind}: " + ("" if e.status == "failed" else f"{e.status}: ") + f"{e.error}"
                for where, entries in (("queries", self.queries), ("validate", self.validation),
                                       ("steer", self.steering))
                for i, e in enumerate(entries) if not e.ok]

    def _entries_json(self, entries: list[ResultEntry]) -> list[dict[str, Any]]:
        pruned = self.graph is not self.full_graph
        out = []
        for e in entries:
            d: dict[str, Any] = {"kind": e.kind, "params": e.params, "on": e.on, "status": e.status}
            if not e.ok:
                d["error"] = e.error
            if e.on == "full" and pruned:
                d["refers_to"] = ("unpruned graph: node ids name nodes of the full graph, some of which "
                                  "are not in this (pruned) graph")
            d["result"] = None if e.result is None else e.result.to_dict()
            out.append(d)

        return portable_paths(out, spec_base_dir(self.spec))  # no local folders in shared results

    def __repr__(self) -> str:
        failed = len(self.failures)
        return (f"<RunResult: {self.graph.n_nodes} nodes, {self.graph.n_edges} edges; {len(self.queries)} queries, "
                f"{len(self.validation)} checks" + (f", {failed} failed" if failed else "") + ">")

    def _repr_html_(self) -> str:
        return run_html(self)

    def to_json(self, path: str | Path | None = None) -> str:
        """The exported graph with every query and validation result, in our JSON format. With
        ``path``: write the file and return the path; without: return the JSON text."""
        text = graph_to_json(self.graph, path, queries=self.queries_json(), validation=self.validation_json(),
                             steering=self.steering_json() if self.steering else None)
        return str(path) if path is not None else text

    def report(self, path: str | Path) -> str:
        """Write the one-file HTML report of this run (:mod:`circuitgraph.export.html`), its diagram at
        the spec's node budget (``export.max_render_nodes``); returns the path."""
        return write_report(self, path, max_nodes=self.spec.export.max_render_nodes)

    def queries_json(self) -> list[dict[str, Any]]:
        return self._entries_json(self.queries)

    def validation_json(self) -> list[dict[str, Any]]:
        return self._entries_json(self.validation)

    def steering_json(self) -> list[dict[str, Any]]:
        """The ``steering`` list of the graph JSON: per item ``{kind, params, on, status, error, result}``
        (``error`` null unless failed; ``result`` holds ``interventions``, ``baseline``, ``intervened``
        and ``metric``)."""
        return [{**e, "error": e.get("error")} for e in self._entries_json(self.steering)]

    def summary_lines(self) -> list[str]:
        g, full = self.graph, self.full_graph
        kinds: dict[str, int] = {}
        for n in g.nodes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        comp = full.metadata.completeness or {}
        lines = [
            f"model: {full.metadata.model_name or '?'}; prompt: {len(full.metadata.prompt_tokens or [])} tokens",
            f"graph: {g.n_nodes} nodes ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}), {g.n_edges} edges"
            + (f" (pruned from {full.n_nodes} nodes, {full.n_edges} edges)" if g is not full else ""),
            "targets: " + ", ".join(f"{_target_text(g.node(t))} (w={w:.3g})" for t, w in g.targets),
            f"completeness: max relative violation {comp.get('max_relative_violation', float('nan')):.2e}"
            + (" (above what the dtype allows: see the warning below)" if comp.get("precision_warning") else ""),
        ]
        for key, value in (("replacement_score", full.metadata.replacement_score),
                           ("completeness_score", full.metadata.completeness_score)):
            if value is not None:
                lines.append(f"{key}: {value:.4f}")
        pruned = g is not full
        for what, entries in (("query", self.queries), ("validation", self.validation)):
            for e in entries:
                on = f" (on the {'unpruned' if e.on == 'full' else 'pruned'} graph)" if pruned else ""
                if e.status == "failed":
                    lines.append(f"{what} {e.kind}{on}: FAILED: {e.error}")
                    continue
                lines.append(f"{what} {e.kind}{on}:")
                lines += ["  " + line for line in e.result.table().splitlines()]
        for i, e in enumerate(self.steering):
            if e.status == "failed":
                lines.append(f"steer[{i}]: FAILED: {e.error}")
                continue
            lines.append(f"steer[{i}]" + (f" {e.result.name}" if e.result.name else "") + ":")
            lines += ["  " + line for line in e.result.table().splitlines()]
        for w in self.warnings:
            lines.append(f"warning: {w}")
        for kind, path in self.exports.items():
            lines.append(f"wrote {kind}: {Path(path).resolve()}")
        lines.append("time: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()))
        return lines


def _target_text(node: Node) -> str:
    """A target as a reader sees it: a token quoted (``' an'``, its space visible)."""
    if node.kind == "logit" and node.label:
        return repr(node.label)
    return node.label or str(node.id)


@contextmanager
def _recorded_warnings(sink: list[str]) -> Iterator[None]:
    """Collect :class:`~circuitgraph.errors.TokenWarning` messages (unknown prompt pieces, targets
    without their leading space) into ``sink`` (the run's ``warnings``, printed by the CLI); other
    warnings pass through unchanged."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TokenWarning)
        yield
    for w in caught:
        if issubclass(w.category, TokenWarning):
            if str(w.message) not in sink:
                sink.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _attempt(fn: Any, what: str) -> tuple[str, str | None, Any]:
    """``(status, error, result)`` of ``fn()``: a query or check that fails is a result, not an abort."""
    try:
        return "ok", None, fn()
    except Exception as exc:  # every failure is recorded with its message
        logger.debug("%s failed", what, exc_info=True)
        return "failed", one_line(exc), None


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("circuitgraph", "torch", "transformer-lens", "sae-lens"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def _progress_bar(enabled: bool, desc: str):
    if not enabled:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=0, desc=desc, file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return bar, update


def _check_outputs(spec: Spec) -> None:
    """Fail before any work when an output cannot be produced (no file is half-written)."""
    ex = spec.export
    if ex.diagram.labels is not None:
        load_feature_labels(ex.diagram.labels)
    if ex.features is not None:
        units = open_features(ex.features).units  # a folder written by a features run, checked before any work
        if units != "features":
            raise SpecError([("export.features", f"{ex.features} holds {units} dashboards; a one-prompt run reads "
                                                 "transcoder features' dashboards here (units: features); show "
                                                 f"{units} dashboards with circuitgraph serve")])
    needs_dot = [k.key for k in EXPORT_KINDS.values() if k.requires_dot and getattr(ex, k.key) is not None]
    if needs_dot and shutil.which("dot") is None:
        raise RenderError(
            f"Graphviz 'dot' binary not found, needed for export.{'/'.join(needs_dot)}; install it with "
            "`apt-get install graphviz` (Debian/Ubuntu) or `brew install graphviz`, or export dot text instead"
        )


@dataclass
class Prepared:
    """Everything a graph is built from: the loaded inputs, the forward pass, the options."""

    adapter: ModelAdapter
    transcoders: Dictionary | None
    lin: Linearisation
    targets: list[ResolvedTarget]
    options: GraphOptions
    metadata: dict[str, Any]


def build(spec: SpecSource, *, progress: bool = False, inputs: LoadedInputs | None = None,
          memory_limit: int | None = None) -> AttributionGraph:
    """Load inputs and build the unpruned graph of a spec (no queries, no exports).

    ``inputs`` is an ``(adapter, transcoders)`` pair already loaded for this spec's model and
    dictionaries (dataset workers load them once and reuse them for every prompt).
    ``memory_limit``: the budget in bytes (see :func:`run`).
    """
    spec = load_spec(spec)
    return _build_prepared(spec, prepare(spec, inputs=inputs, memory_limit=memory_limit), progress)


def _build_prepared(spec: Spec, p: Prepared, progress: bool) -> AttributionGraph:
    """The unpruned graph of a prepared spec (:func:`build` after :func:`prepare`)."""
    bar, update = _progress_bar(progress, "attribution")
    try:
        graph = build_graph(p.adapter, p.lin, p.transcoders, p.targets, p.options, progress=update,
                            metadata=p.metadata)
    finally:
        if bar is not None:
            bar.close()
    graph.max_dense_nodes = spec.graph.max_dense_nodes
    return graph


def prepare(spec: SpecSource, *, inputs: LoadedInputs | None = None, memory_limit: int | None = None) -> Prepared:
    """Load the model and dictionaries (unless ``inputs`` gives them), run the forward pass,
    resolve targets and options.  ``memory_limit``: the budget in bytes (else
    ``CIRCUITGRAPH_MEMORY_LIMIT``; :func:`~circuitgraph.pipeline.memory_watch.memory_budget`),
    with what the later stages cost on top of the sweep (:func:`~circuitgraph.pipeline.stage_memory.later_stages`)."""
    spec = load_spec(spec)
    torch.manual_seed(spec.seed)
    adapter, tcs = load_inputs(spec) if inputs is None else inputs
    check_layer_keys(spec, adapter.facts.n_layers)
    run_warnings: list[str] = []
    with _recorded_warnings(run_warnings):
        tokens = resolve_prompt(spec, adapter)
    _check_qk_items(spec, adapter, len(tokens))
    lin = linearise(adapter, torch.tensor(tokens), tcs)
    with _recorded_warnings(run_warnings):
        targets = resolve_targets(spec, adapter, tcs, lin.logits, len(tokens))
    L = adapter.facts.n_layers
    g = spec.graph
    options = GraphOptions(
        mlp={l: g.mlp_for(l, has_transcoders=tcs is not None and l in tcs) for l in range(L)},
        attention={l: g.attention_for(l) for l in range(L)},
        positional_nodes=g.positional_nodes,
        bias_nodes=g.bias_nodes,
        bos_nodes=g.bos_nodes,
        neuron_top_k=g.neuron_top_k,
        max_feature_nodes=g.max_feature_nodes,
        component_inputs=g.component_inputs,
        head_inputs=tuple(g.head_inputs),
        max_neuron_nodes=g.max_neuron_nodes,
        dtype=torch_dtype(g.dtype),
        batch_size=g.batch_size,
        memory_limit=memory_budget(memory_limit),
        stages=later_stages(spec),
    )
    tok = adapter.tokenizer
    strs = [tok.token_str(t) if tok is not None else f"<{t}>" for t in tokens]
    metadata = RunMetadata(
        spec=spec.model_dump(mode="json"),
        model=ModelRecord(adapter.name, L, adapter.source, adapter.facts.to_dict(), adapter.format,
                          adapter.backend, adapter.quantisation),
        transcoders=tcs.describe() if tcs is not None else None,
        prompt_tokens=tokens,
        prompt_token_strs=strs,
        prompt=_prompt_text(spec, tok, tokens, strs),
        graph_options={
            "mlp": {str(k): v for k, v in options.mlp.items()},
            "attention": {str(k): v for k, v in options.attention.items()},
            "positional_nodes": options.positional_nodes,
            "bias_nodes": options.bias_nodes,
            "bos_nodes": options.bos_nodes,
            "neuron_top_k": options.neuron_top_k,
            "max_feature_nodes": options.max_feature_nodes,
            **({"component_inputs": True} if options.component_inputs else {}),
            **({"head_inputs": list(options.head_inputs)} if options.head_inputs != ("value",) else {}),
            "max_neuron_nodes": options.max_neuron_nodes,
        },
        versions=_versions(),
        warnings=run_warnings,
    ).to_dict()

    # a shared graph must not reveal the user's folders: paths relative to the spec, or names
    metadata = portable_paths(metadata, spec_base_dir(spec))
    return Prepared(adapter, tcs, lin, targets, options, metadata)


def _prompt_text(spec: Spec, tokenizer: Tokenizer | None, tokens: list[int], strs: list[str]) -> str:
    """The prompt as text: the spec's text, else the tokens decoded (as circuit-tracer writes it)."""
    text = getattr(spec.prompt, "text", spec.prompt if isinstance(spec.prompt, str) else None)
    if isinstance(text, str):
        return text
    if tokenizer is not None:
        try:
            return tokenizer.decode(list(tokens), skip_special_tokens=False)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode: fall back to the pieces
            pass
    return "".join(strs)


def _check_qk_items(spec: Spec, adapter: ModelAdapter, n_pos: int) -> None:
    """``qk`` queries and checks name layers, heads and positions the model and prompt must have:
    checked before the graph is built, so bad input fails fast and writes nothing."""
    f = adapter.facts
    problems = []
    for where, items in (("queries", spec.queries), ("validate", spec.validate)):
        for i, item in enumerate(items):
            if item.kind == "qk":
                p = item.params
                head = p.head if isinstance(p.head, int) else list(p.head)
                problems += [(f"{where}[{i}].qk.{field}", msg) for field, msg in qk_problems(
                    p.layer, head, p.query_position, p.key_position, n_layers=f.n_layers, n_heads=f.n_heads,
                    n_pos=n_pos, causal=f.causal)]
    if problems:
        raise SpecError(problems)


def run(spec: SpecSource, *, progress: bool = False, force: bool = False, inputs: LoadedInputs | None = None,
        memory_limit: int | None = None) -> Any:
    """Run a spec (a path, a dict or a :class:`~circuitgraph.spec.Spec`) end to end.

    The exports are written together or not at all (:class:`~circuitgraph.export.outputs.OutputSet`);
    an existing file at an export path that circuitgraph did not write is refused before any
    work unless ``force`` is true.

    ``memory_limit``: the memory budget in bytes (default: the ``CIRCUITGRAPH_MEMORY_LIMIT``
    environment variable in GB, else none); the run may use the smaller of it and what is
    available.  A run that would not fit is refused before its edge sweep with advice; one that
    passes the limit anyway is stopped by :class:`~circuitgraph.pipeline.memory_watch.MemoryWatch`
    with a :class:`~circuitgraph.errors.ResourceError`, and writes nothing.

    The single-prompt pipeline; returns a :class:`RunResult`.  ``inputs``: see :func:`build`.
    A spec with ``dataset:`` is run by :func:`circuitgraph.run`
    (:func:`circuitgraph.pipeline.entry.run`), which calls this function once per row
    (docs/dataset.md).
    """
    spec = load_spec(spec)
    if spec.is_dataset:
        raise SpecError([("dataset", "a dataset spec runs through circuitgraph.run (circuitgraph.pipeline.entry.run), "
                                     "not the single-prompt pipeline runner.run")])
    _check_outputs(spec)
    heatmaps = _heatmap_outputs(spec)
    OutputSet({**spec.export.outputs(), **heatmaps}, force=force).check()
    budget = memory_budget(memory_limit)
    watch = MemoryWatch(run_limit(budget), budget_given=budget is not None)
    with watch.watching():
        result = _run_stages(spec, watch, progress=progress, force=force, inputs=inputs, budget=budget,
                             heatmaps=heatmaps)
    result.memory = {stage: {"start": watch.starts.get(stage, 0), "peak": peak} for stage, peak in watch.peaks.items()}
    return result


def _run_stages(spec: Spec, watch: MemoryWatch, *, progress: bool, force: bool, inputs: LoadedInputs | None,
                budget: int | None,
                heatmaps: dict[str, Path]) -> RunResult:
    """The stages of :func:`run`, each under the memory watch."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with watch.stage("load and forward"):
        prepared = prepare(spec, inputs=inputs, memory_limit=budget)
    with watch.stage("graph"):
        full = _build_prepared(spec, prepared, progress)
    del prepared
    timings["graph"] = time.perf_counter() - t0
    _label_features(spec, full)
    precision = precision_warning(full.metadata.completeness or {}, weights_dtype=spec.model.dtype,
                                  graph_dtype=spec.graph.dtype)
    if precision is not None:  # a bfloat16 model's graph is exact only to its rounding: say so
        full.metadata.set_precision_warning(precision)

    t0 = time.perf_counter()
    with watch.stage("scores"):
        _attach_scores(full)
    graph = full
    if spec.pruning is not None:
        p = spec.pruning
        with watch.stage("prune"):
            graph = _prune_within(full, p, export_edge_limit(spec))
        timings["prune"] = time.perf_counter() - t0

    graphs = {"full": full, "pruned": graph}
    queries = []
    if spec.queries:
        t0 = time.perf_counter()
        for i, q in enumerate(spec.queries):
            with watch.stage(f"queries[{i}] {q.kind}"):
                status, error, res = _attempt(lambda q=q: run_query(graphs[q.on], q), f"queries[{i}]")
            queries.append(ResultEntry(q.kind, _params(q), q.on, status, error, res))
        timings["queries"] = time.perf_counter() - t0
    validation = []
    run_warnings = full.metadata.run_warnings()
    if spec.validate:
        adapter = require_context(full, "the spec's validate: checks").adapter
        t0 = time.perf_counter()
        for i, c in enumerate(spec.validate):
            resolver = lambda p, i=i: resolve_prompt_like(p, adapter, where=f"validate[{i}]")  # noqa: E731
            # checks need the live model; a pruned graph keeps its parent's context
            on = graphs[c.on] if graphs[c.on].context is not None else full
            with _recorded_warnings(run_warnings), watch.stage(f"validate[{i}] {c.kind}"):
                status, error, res = _attempt(
                    lambda c=c, on=on, resolver=resolver: run_check(on, c, prompt_resolver=resolver,
                                                                        seed=spec.seed, spec=spec).result,
                    f"validate[{i}]")
            if status == "ok" and getattr(res, "status", "ok") != "ok":  # e.g. controls that could not be drawn
                status, error = res.status, getattr(res, "reason", None)
            validation.append(ResultEntry(c.kind, _params(c), c.on, status, error, res))
        timings["validation"] = time.perf_counter() - t0
        OutputSet.record([path for path in heatmaps.values() if Path(path).is_file()])
    with watch.stage("steering"):
        steering = _run_steering(spec, full, run_warnings, timings)
    if graph is not full:
        graph.metadata.set_warnings(run_warnings)
    result = RunResult(spec, graph, full, queries, validation, {}, timings, list(run_warnings), steering)
    t0 = time.perf_counter()
    result.exports = _write_exports(result, force=force, watch=watch)
    timings["export"] = time.perf_counter() - t0
    return result


def export_edge_limit(spec: Spec) -> int | None:
    """The most edges the spec's exports accept: ``export.max_json_edges`` with a JSON export,
    the Neuronpedia export's limit with one (``None``: no export limits the edges)."""
    ex = spec.export
    caps = [c for c in (ex.max_json_edges if ex.json is not None else None,
                        DEFAULT_MAX_LINKS if ex.neuronpedia is not None else None) if c is not None]
    return min(caps) if caps else None


def _prune_within(full: AttributionGraph, p: PruneSpec, cap: int | None) -> AttributionGraph:
    """The pruned graph of ``prune:``, with at most ``cap`` edges (what the JSON and Neuronpedia
    exports write at most, :func:`export_edge_limit`): when the thresholds keep more, the most
    influential edges are kept (``top_k_edges`` lowered until the edges kept plus the remainder
    nodes' edges fit; the run records a warning), so an export never refuses the pruned graph
    after the sweep."""
    top_k = p.top_k_edges

    def prune(k: int | None) -> Any:
        return prune_graph(full, node_threshold=p.node_threshold, edge_threshold=p.edge_threshold,
                           top_k_nodes=p.top_k_nodes, top_k_edges=k, target_share=p.target_share)

    res = prune(top_k)
    if cap is None or res.graph.n_edges <= cap:
        return res.graph
    # the largest top_k_edges whose graph (kept edges and the remainder nodes' edges) fits: the
    # first guess leaves room for the remainder edges seen, then bisection (to 1% of the cap)
    hi = cap if top_k is None else min(top_k, cap)
    lo, best = 0, None
    k = max(1, hi - (res.graph.n_edges - min(int(res.edge_mask.sum()), hi)))
    for _ in range(16):
        trial = prune(k)
        if trial.graph.n_edges <= cap:
            lo, best = k, trial
        else:
            hi = k
        if hi - lo <= max(1, cap // 100):
            break
        k = (lo + hi) // 2 if lo or hi <= 1 else max(1, hi // 2)
    if best is None:
        raise ResourceError(f"pruning cannot keep the graph within the {cap:,} edges its JSON/Neuronpedia export "
                            "writes (export.max_json_edges): raise it or write export.graph (.npz) instead")
    full.metadata.add_warning(
        f"pruning kept {best.graph.n_edges:,} edges (the most influential; the most the JSON/Neuronpedia export "
        f"writes is {cap:,}, export.max_json_edges); the thresholds alone keep more: raise it to keep them")
    return best.graph


def _run_steering(spec: Spec, full: AttributionGraph, run_warnings: list[str],
                  timings: dict[str, float]) -> list[ResultEntry]:
    """Run the spec's ``steer:`` items on the unpruned graph (each one a result or a failure)."""
    if not spec.steer:
        return []
    t0 = time.perf_counter()
    out = []
    for i, item in enumerate(spec.steer):
        with _recorded_warnings(run_warnings):
            status, error, res = _attempt(lambda item=item: steer_item(full, item, seed=spec.seed), f"steer[{i}]")
        out.append(ResultEntry("steer", item.model_dump(mode="json"), "full", status, error, res))
    timings["steering"] = time.perf_counter() - t0
    return out


def steer_spec(spec: SpecSource, *, progress: bool = False, inputs: LoadedInputs | None = None) -> list[ResultEntry]:
    """Build a spec's graph and run only its ``steer:`` items (no queries, checks or exports):
    one entry per item, as :meth:`RunResult.steering_json` writes them, with ``result`` the
    :class:`~circuitgraph.validation.steering.SteeringResult` (``status``/``error`` on failure).
    ``circuitgraph steer SPEC`` prints them.  For one experiment on a graph in hand, see
    :func:`circuitgraph.steer`."""
    spec = load_spec(spec)
    if not spec.steer:
        raise SpecError("the spec has no steer: items; add steer: [{interventions: [...], generate: {...}}]")
    full = build(spec, progress=progress, inputs=inputs)
    return _run_steering(spec, full, full.metadata.run_warnings(), {})


def _label_features(spec: Spec, graph: AttributionGraph) -> None:
    """Put the labels of ``export.features``'s ``labels.csv`` (feature nodes) and of
    ``export.diagram.labels`` (feature and neuron nodes; these win) on the graph's nodes, so every
    diagram, report table, path listing and export names them."""
    ex = spec.export
    if ex.features is not None and (Path(ex.features) / LABELS_FILE).is_file():
        apply_feature_labels(graph, load_feature_labels(ex.features), kinds=("feature",))
    if ex.diagram.labels is not None:
        apply_feature_labels(graph, load_feature_labels(ex.diagram.labels))


def _params(item: Any) -> Any:
    params = item.params
    return params.model_dump(mode="json") if hasattr(params, "model_dump") else params


def _attach_scores(graph: AttributionGraph) -> None:
    """circuit-tracer's replacement and completeness scores of the unpruned graph."""
    scores = graph_scores(graph, per_target=False)  # the `scores` query gives per-target shares
    graph.metadata.set_scores(scores.replacement_score, scores.completeness_score)


def _heatmap_outputs(spec: Spec) -> dict[str, Path]:
    """The image files validation checks write (``patching.heatmap``), checked like exports."""
    return {f"validate[{i}].patching.heatmap": c.params.heatmap for i, c in enumerate(spec.validate)
            if c.kind == "patching" and getattr(c.params, "heatmap", None) is not None}


def spec_base_dir(spec: Spec) -> Path | None:
    """The folder relative paths of ``spec`` are relative to (its file's folder), if known."""
    return getattr(spec, "base_dir", None)


def _write_exports(result: RunResult, *, force: bool = False, watch: MemoryWatch | None = None) -> dict[str, Path]:
    """Write every export of the spec: staged, then moved into place all together (or none);
    each one a stage of ``watch`` (its memory recorded, the run stopped above the limit)."""
    def stage(name: str) -> Any:
        return watch.stage(f"export {name}") if watch is not None else contextlib.nullcontext()

    ex = result.spec.export
    g = result.graph  # a pruned graph carries the full graph's scores (attached before pruning)
    base = spec_base_dir(result.spec)
    queries = portable_paths(result.queries_json(), base)
    validation = portable_paths(result.validation_json(), base)
    qk = stored_results(queries, "qk")
    inset = qk if ex.qk_inset else ()
    outputs = ex.outputs()
    if not outputs:
        return {}
    dashboards = None
    if ex.features is not None:
        dashboards = open_features(ex.features)
    with stage("diagram influence"):
        diagram = _diagram_options(result) if any(EXPORT_KINDS[k].diagram for k in outputs) else {}
    steering = portable_paths(result.steering_json(), base) if result.steering else None
    job = ExportJob(result, g, queries, validation, steering, qk, inset, diagram, dashboards)
    with OutputSet(outputs, force=force).writing() as out:
        for key, write in EXPORT_WRITERS.items():
            if key in outputs:
                with stage(key):
                    write(job, str(out.stage(key)))
    return {kind: Path(path) for kind, path in outputs.items()}


def _diagram_options(result: RunResult) -> dict[str, Any]:
    """``graph_to_dot`` options from ``export.diagram``, with the influence of the unpruned graph."""
    d = result.spec.export.diagram
    options: dict[str, Any] = {"show_unreachable": d.show_unreachable}
    if result.full_graph.targets:
        options["influence"] = raw_influence(result.full_graph)
    if d.labels is not None:
        options["labels"] = load_feature_labels(d.labels)
    if d.supernodes is not None:
        options["supernodes"] = d.supernodes
    return options
