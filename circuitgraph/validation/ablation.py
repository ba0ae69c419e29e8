"""Ablation checks: intervene on graph nodes in the real model, compare with the graph.

:func:`ablate` intervenes on a node set at once and compares the change in the target
metric with the graph's prediction and with random control sets (matched on removed
magnitude and on count).  :func:`predicted_vs_actual` does it node by node: for each of
the top-k nodes the graph's prediction (direct edge and total effect), the change in the
*frozen* real model (:mod:`circuitgraph.validation.frozen`; it must equal the direct edge
to float precision: a built-in self-test of the graph) and the change in the real,
unfrozen model (reported, with correlations, never asserted).

Sign convention everywhere: an *effect* is ``metric(after) - metric(before)``; removing a
node whose edge into the target is ``+2`` has a predicted effect of ``-2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from circuitgraph._results import Tabular
from circuitgraph.errors import ValidationRunError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.validation._common import fmt, graph_context, markdown_table, pearson, resolve_prompt
from circuitgraph.validation.controls import (
    ControlKind,
    ControlSummary,
    draw_controls,
    reachable_positions,
    summarise_controls,
    unit_magnitudes,
)
from circuitgraph.validation.frozen import frozen_reader_values
from circuitgraph.validation.gradient_effects import gradient_effects
from circuitgraph.validation.interventions import VECTOR_SITES, Intervention, Mode, Unit, run_rows
from circuitgraph.validation.metrics import Metric
from circuitgraph.validation.predictions import direct_effects, select_nodes, total_effects

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.sites import Site
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.attribution.context import AttributionContext
    from circuitgraph.dictionaries.protocol import Dictionary
    from circuitgraph.graph.graph import AttributionGraph

__all__ = [
    "AblationResult",
    "PredictionRow",
    "PredictedVsActualResult",
    "ablate",
    "predicted_vs_actual",
    "frozen_tolerance",
]


def frozen_tolerance(adapter: ModelAdapter) -> float:
    """Relative tolerance of the frozen-model self-test for the model's dtype."""
    return 1e-9 if adapter.dtype == torch.float64 else 2e-4


@dataclass
class _Setup:
    ctx: AttributionContext
    adapter: ModelAdapter
    tokens: list[int]
    transcoders: Dictionary | None
    metric: Metric


def _setup(graph: AttributionGraph, check: str, metric: Metric | None) -> _Setup:
    ctx = graph_context(graph, check)
    tcs = ctx.transcoders
    return _Setup(ctx, ctx.adapter, ctx.linearisation.tokens.tolist(), tcs,
                  metric if metric is not None else Metric.from_graph(graph))


def _template(units: Sequence[Unit], mode: Mode, scale: float | None, value: float | None, reference: Sequence[Any],
              patch_prompt: Any, tokenizer: Tokenizer | None) -> Intervention:
    refs = tuple(tuple(resolve_prompt(p, tokenizer, where=f"reference_prompts[{i}]")) for i, p in enumerate(reference))
    patch = None if patch_prompt is None else tuple(resolve_prompt(patch_prompt, tokenizer, where="patch_prompt"))
    return Intervention(tuple(units), mode, scale, value, refs, patch)


def _scale_factors(units: Sequence[Unit], mode: str, scale: float | None, value: float | None,
                   mags: dict) -> list[float | None]:
    """Per unit: the factor ``c`` with ``output' = c * output`` (``None`` where the intervention is
    not a rescaling of the node's output: mean/patch of a vector node, gates and values)."""
    out: list[float | None] = []
    for unit in units:
        _, old, new = mags[(unit.site, unit.layer)]
        if unit.site in ("gate", "value"):
            out.append(None)
        elif unit.site in VECTOR_SITES:
            out.append(_vector_factor(mode, scale, value))
        else:
            a, a2 = float(old[unit.position, unit.index, 0]), float(new[unit.position, unit.index, 0])
            out.append(a2 / a if a != 0 else None)
    return out


def _vector_factor(mode: str, scale: float | None, value: float | None) -> float | None:
    return {"zero": 0.0, "scale": scale, "set": value, "add": None if value is None else 1 + value}.get(mode)


def _frozen_metric(ctx: AttributionContext, graph: AttributionGraph, ablate: Sequence[NodeId] = (),
                   scale: float = 0.0) -> float:
    vals = frozen_reader_values(ctx, list(ablate), scale=scale, readers=[t for t, _ in graph.targets])
    return float(sum(w * vals[t] for t, w in graph.targets))


def _site_layers(site: str, adapter: ModelAdapter, transcoders: Dictionary | None) -> list[int]:
    """The layers at which units of ``site`` exist (where controls for it may come from)."""
    if site in ("embed", "pos_embed"):
        return [-1]
    if site == "resid_pre":
        return []  # a residual-stream edit is matched in its own layer only
    n = adapter.facts.n_layers
    if site in ("feature", "error"):
        return [l for l in range(n) if transcoders is not None and l in transcoders]
    return list(range(n))


# ---------------------------------------------------------------------------- ablate
@dataclass(repr=False)
class AblationResult(Tabular):
    """One intervention on a node set, with predictions and controls (effects = after - before)."""

    nodes: list[str]
    mode: str
    metric: str
    before: float
    after: float
    predicted: float | None
    predicted_total: float | None
    frozen_change: float | None
    tolerance: float
    removed_magnitude: float
    controls: list[ControlSummary] = field(default_factory=list)
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def status(self) -> str:
        """``uncontrolled`` when a kind of controls asked for could not be drawn (fewer sets than
        requested: the change is not controlled as asked; the run records the check so, never
        ``ok``)."""
        return "uncontrolled" if self._short() else "ok"

    def _short(self) -> list[ControlSummary]:
        return [c for c in self.controls if len(c.effects) < (c.requested or 0) or not c.effects]

    @property
    def reason(self) -> str | None:
        short = self._short()
        if not short:
            return None
        return "; ".join(f"{c.kind}: {len(c.effects)} of {c.requested} sets drawn ({c.degenerate})" for c in short)

    @property
    def agrees(self) -> bool | None:
        """``|change - predicted_total| <= tolerance * |predicted_total|`` (``None`` without a prediction)."""
        if self.predicted_total is None:
            return None
        return abs(self.change - self.predicted_total) <= self.tolerance * abs(self.predicted_total)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "mode": self.mode,
            "params": self.params,
            "metric": self.metric,
            "before": self.before,
            "after": self.after,
            "change": self.change,
            "predicted": self.predicted,
            "predicted_total": self.predicted_total,
            "frozen_change": self.frozen_change,
            "tolerance": self.tolerance,
            "agrees": self.agrees,
            "removed_magnitude": self.removed_magnitude,
            "seed": self.seed,
            "status": self.status,
            "reason": self.reason,
            "controls": [c.to_dict() for c in self.controls],
        }

    def table(self, max_rows: int = 10) -> str:
        head = markdown_table(
            ["nodes", "mode", "before", "after", "change", "predicted (direct)", "predicted (total)", "frozen change",
             "agrees", "removed magnitude"],
            [[len(self.nodes), self.mode, self.before, self.after, self.change, self.predicted, self.predicted_total,
              self.frozen_change, self.agrees, self.removed_magnitude]], max_rows)
        if not self.controls:
            return head
        ctrl = markdown_table(ControlSummary.HEADERS, [c.row() for c in self.controls], max_rows)
        notes = "".join(f"\n\n{c.kind} controls are degenerate (no p-value): {c.degenerate}"
                        for c in self.controls if c.degenerate)
        return f"{head}\n\nControls (seed {self.seed}, selected effect {fmt(self.change)}):\n\n{ctrl}{notes}"


def ablate(
    graph: AttributionGraph,
    nodes: Any = "top_nodes",
    *,
    k: int = 10,
    mode: Mode = "zero",
    value: float | None = None,
    scale: float | None = None,
    reference_prompts: Sequence[Any] = (),
    patch_prompt: Any = None,
    positions: Sequence[int] | None = None,
    controls: Sequence[ControlKind] = ("matched_magnitude", "count_matched"),
    n_controls: int = 10,
    tolerance: float = 0.1,
    control_tolerance: float = 0.05,
    max_draws: int = 1000,
    seed: int = 0,
    rank_by: Literal["edge", "total", "influence"] = "edge",
    part: Literal["post", "gate", "value"] = "post",
    match_positions: bool = False,
    match_layers: bool = False,
    metric: Metric | None = None,
    tokenizer: Tokenizer | None = None,
    batch_size: int = 32,
    eval_prompts: Sequence[Any] = (),
) -> AblationResult:
    """Intervene on ``nodes`` (see :func:`~circuitgraph.validation.predictions.select_nodes`) in the
    real model and compare with the graph and with random controls.

    ``tolerance``: relative agreement asked of the real change with the graph's total-effect
    prediction (``agrees``); ``control_tolerance``: how closely matched-magnitude controls
    match the selected set's removed magnitude.  Controls are drawn among the active units of
    the selected units' sites that can affect the metric, from every layer, or per layer
    (``match_layers``) and per position (``match_positions``); see
    :mod:`circuitgraph.validation.controls`.  ``part`` picks the gate or value of gated
    neurons.  Prompts may be token lists or text (tokenized with ``tokenizer`` or the model's).

    ``eval_prompts``: evaluation rows apart from the selection row (the graph's prompt, where
    the nodes were chosen), each of the graph prompt's length (the nodes sit at its positions):
    the intervention and the controls run on every evaluation row, the changes are the mean
    over them, and the controls are matched on the magnitude the units remove summed over them.
    The graph's predictions are for its own prompt and are left out (``None``) then.
    """
    s = _setup(graph, "ablate", metric)
    tokenizer = tokenizer if tokenizer is not None else s.adapter.tokenizer
    chosen = select_nodes(graph, nodes, k=k, positions=positions, rank_by=rank_by)
    units = [Unit.from_node(n, part=part) for n in chosen]
    template = _template(units, mode, scale, value, reference_prompts, patch_prompt, tokenizer)
    sls: list[tuple[Site, int]] = sorted({(u.site, u.layer) for u in units})
    if controls and not match_layers:
        others: set[tuple[Site, int]] = {(site, lyr) for site, _ in sls
                                         for lyr in _site_layers(site, s.adapter, s.transcoders)}
        sls = sorted(set(sls) | others)
    evaluation = [resolve_prompt(p, tokenizer, where=f"ablate.eval_prompts[{i}]") for i, p in enumerate(eval_prompts)]
    for i, toks in enumerate(evaluation):
        if len(toks) != len(s.tokens):
            raise ValidationRunError(
                f"ablate.eval_prompts[{i}]: {len(toks)} tokens; the nodes sit at positions of the graph's "
                f"{len(s.tokens)}-token prompt, so every evaluation row needs {len(s.tokens)} tokens")
    rows_eval = evaluation or [s.tokens]
    own = unit_magnitudes(s.adapter, s.tokens, template, sls, s.transcoders)  # the graph prompt's: its predictions
    mags: dict[tuple[str, int], tuple[torch.Tensor, Any, Any]] = own
    if evaluation:  # matched on what the units remove on the evaluation rows, summed over them
        mags = {}
        for toks in evaluation:
            for key, (m, *_rest) in unit_magnitudes(s.adapter, toks, template, sls, s.transcoders).items():
                mags[key] = (mags[key][0] + m if key in mags else m, None, None)
    selected_mag = float(sum(mags[(u.site, u.layer)][0][u.position, u.index] for u in units))

    reach = reachable_positions(s.metric, s.adapter.facts.n_layers, len(s.tokens), s.adapter.facts.causal)
    control_sets: dict[str, list[tuple[list[Unit], float]]] = {}
    for kind in controls:
        control_sets[kind] = draw_controls(units, mags, kind, n_controls, seed=seed, tolerance=control_tolerance,
                                           max_draws=max_draws, match_positions=match_positions,
                                           match_layers=match_layers, reach=reach)
    rows: list[list[Intervention]] = [[], [template]]
    for kind in controls:
        rows += [[replace(template, units=tuple(u))] if u else [] for u, _ in control_sets[kind]]
    # per run: the metric's mean over the evaluation rows (float64 sums in row order)
    runs = [run_rows(s.adapter, toks, rows, s.metric, transcoders=s.transcoders, batch_size=batch_size).metric.double()
            for toks in rows_eval]
    metric_runs = sum(runs, torch.zeros_like(runs[0])) / len(rows_eval)
    before, after = float(metric_runs[0]), float(metric_runs[1])
    summaries, i = [], 2
    for kind in controls:
        sets = control_sets[kind]
        effects = (metric_runs[i:i + len(sets)] - before).tolist()
        i += len(sets)
        summaries.append(summarise_controls(kind, seed, control_tolerance, after - before, selected_mag, sets, effects))

    factors = _scale_factors(units, mode, scale, value, own)
    predicted = predicted_total = frozen_change = None
    rescalings = [c for c in factors if c is not None]
    if not evaluation and len(rescalings) == len(factors):
        D, V = direct_effects(graph), total_effects(graph)
        rows_idx = [graph.index_of(n) for n in chosen]
        predicted = float(sum(-(1 - c) * D[r] for c, r in zip(rescalings, rows_idx, strict=False)))
        predicted_total = float(sum(-(1 - c) * V[r] for c, r in zip(rescalings, rows_idx, strict=False)))
        if len(set(rescalings)) == 1 and part == "post":
            frozen_change = _frozen_metric(s.ctx, graph, chosen, rescalings[0]) - _frozen_metric(s.ctx, graph)
    params = {"rank_by": rank_by, "n_controls": n_controls, "control_tolerance": control_tolerance,
              "match_layers": match_layers, "match_positions": match_positions, "part": part,
              "metric": s.metric.to_dict(), "n_eval_rows": len(evaluation),
              "same_rows": not evaluation}
    if isinstance(nodes, str) and nodes == "top_nodes":
        params["k"] = k  # k picks among the top nodes only; a filter ablates every match
    if mode == "mean":
        params["pooling"] = template.resolved_pooling(len(s.tokens))
    return AblationResult([str(n) for n in chosen], mode, s.metric.describe(tokenizer), before, after, predicted,
                          predicted_total, frozen_change, tolerance, selected_mag, summaries, seed, params)


# ---------------------------------------------------------------------------- predicted vs actual
@dataclass
class PredictionRow:
    """One node: the graph's predictions and the measured effects of removing it."""

    node: str
    activation: float
    factor: float | None
    predicted: float | None
    predicted_total: float | None
    actual_frozen: float | None
    actual: float
    #: ``-(1 - c) a . dM/da`` on the real model (attribution patching; None for features, errors)
    predicted_gradient: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(repr=False)
class PredictedVsActualResult(Tabular):
    """Node-by-node predictions vs interventions; ``frozen_ok`` is the exactness self-test."""

    mode: str
    metric: str
    metric_before: float
    rows: list[PredictionRow]
    frozen_max_deviation: float | None
    frozen_tolerance: float
    correlation: float | None
    correlation_total: float | None
    sign_agreement: float | None
    notes: list[str] = field(default_factory=list)
    correlation_gradient: float | None = None
    sign_agreement_gradient: float | None = None

    @property
    def frozen_ok(self) -> bool | None:
        if self.frozen_max_deviation is None:
            return None
        return bool(self.frozen_max_deviation <= self.frozen_tolerance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "metric": self.metric,
            "metric_before": self.metric_before,
            "frozen_max_relative_deviation": self.frozen_max_deviation,
            "frozen_tolerance": self.frozen_tolerance,
            "frozen_ok": self.frozen_ok,
            "correlation": self.correlation,
            "correlation_total": self.correlation_total,
            "sign_agreement": self.sign_agreement,
            "correlation_gradient": self.correlation_gradient,
            "sign_agreement_gradient": self.sign_agreement_gradient,
            "notes": self.notes,
            "rows": [r.to_dict() for r in self.rows],
        }

    def table(self, max_rows: int = 10) -> str:
        t = markdown_table(["node", "activation", "predicted (edge)", "predicted (total)", "predicted (gradient)",
                            "actual (frozen)", "actual (real)"],
                           [[r.node, r.activation, r.predicted, r.predicted_total, r.predicted_gradient,
                             r.actual_frozen, r.actual] for r in self.rows], max_rows)
        status = {True: "passed", False: "FAILED", None: "not run"}[self.frozen_ok]
        return (f"{t}\n\nfrozen self-test {status} (max relative deviation {fmt(self.frozen_max_deviation)}, "
                f"tolerance {fmt(self.frozen_tolerance)}); correlation with the real model: edge "
                f"{fmt(self.correlation)}, total {fmt(self.correlation_total)}, gradient "
                f"{fmt(self.correlation_gradient)}; sign agreement {fmt(self.sign_agreement)} (edge), "
                f"{fmt(self.sign_agreement_gradient)} (gradient)")


def predicted_vs_actual(
    graph: AttributionGraph,
    *,
    k: int = 10,
    mode: Literal["zero", "mean"] = "zero",
    reference_prompts: Sequence[Any] = (),
    nodes: Any = "top_nodes",
    rank_by: Literal["edge", "total", "influence"] = "edge",
    metric: Metric | None = None,
    tokenizer: Tokenizer | None = None,
    frozen_check: bool = True,
    batch_size: int = 32,
) -> PredictedVsActualResult:
    """For each selected node: the predicted effect of removing it (``predicted = -(1 - c) x edge``
    into the targets, ``predicted_total`` along every path; ``c = 0`` for zero ablation,
    ``mean / activation`` for mean ablation), the effect in the frozen real model
    (``actual_frozen``; equal to ``predicted`` to float precision) and in the real model
    (``actual``).  Mean ablation of a vector node is not a rescaling: its predictions are
    ``None``."""
    s = _setup(graph, "predicted_vs_actual", metric)
    tokenizer = tokenizer if tokenizer is not None else s.adapter.tokenizer
    chosen = select_nodes(graph, nodes, k=k, rank_by=rank_by)
    units = [Unit.from_node(n) for n in chosen]
    template = _template(units, mode, None, None, reference_prompts, None, tokenizer)
    sls: list[tuple[Site, int]] = sorted({(u.site, u.layer) for u in units})
    mags = unit_magnitudes(s.adapter, s.tokens, template, sls, s.transcoders)
    factors = _scale_factors(units, mode, None, None, mags)
    notes = []
    if mode == "mean":
        notes.append(f"mean over the reference prompts, pooled {template.resolved_pooling(len(s.tokens))!r} "
                     "('position': per position; 'all': over every position but the first)")
    if mode == "mean" and any(u.site in VECTOR_SITES for u in units):
        notes.append("mean ablation of a vector node (error, head, MLP, embedding) is not a rescaling of its "
                     "output: no prediction or frozen value for those rows")
    rows_iv = [[]] + [[replace(template, units=(u,))] for u in units]
    out = run_rows(s.adapter, s.tokens, rows_iv, s.metric, transcoders=s.transcoders, batch_size=batch_size)
    before = float(out.metric[0])
    D, V = direct_effects(graph), total_effects(graph)
    if s.transcoders:
        grads = [None] * len(units)
        notes.append("no gradient predictions: the graph has transcoders (the real-model gradient of a spliced "
                     "dictionary is not computed)")
    else:
        grads = gradient_effects(s.adapter, s.tokens, s.metric, units)
    frozen_base = _frozen_metric(s.ctx, graph) if frozen_check else None
    rows, devs = [], []
    scale_ref = max([abs(frozen_base or 0.0)] + [abs(D[graph.index_of(n)]) for n in chosen] + [1e-12])
    for j, (node, c) in enumerate(zip(chosen, factors, strict=False)):
        r = graph.index_of(node)
        pred = pred_total = frozen_val = pred_grad = None
        if c is not None:
            pred, pred_total = float(-(1 - c) * D[r]), float(-(1 - c) * V[r])
            if frozen_base is not None:  # frozen_check
                frozen_val = _frozen_metric(s.ctx, graph, [node], c) - frozen_base
                devs.append(abs(frozen_val - pred) / scale_ref)
            grad = grads[j]
            if grad is not None:
                pred_grad = float(-(1 - c) * grad)
        rows.append(PredictionRow(str(node), float(graph.nodes[r].activation), c, pred, pred_total, frozen_val,
                                  float(out.metric[j + 1]) - before, pred_grad))
    actual = [r.actual for r in rows]
    signs = [np.sign(r.predicted) == np.sign(r.actual) for r in rows if r.predicted is not None and r.predicted != 0]
    gsigns = [np.sign(r.predicted_gradient) == np.sign(r.actual) for r in rows
              if r.predicted_gradient is not None and r.predicted_gradient != 0]
    return PredictedVsActualResult(
        mode, s.metric.describe(tokenizer), before, rows, float(max(devs)) if devs else None,
        frozen_tolerance(s.adapter),
        pearson([r.predicted for r in rows], actual), pearson([r.predicted_total for r in rows], actual),
        float(np.mean(signs)) if signs else None, notes,
        pearson([r.predicted_gradient for r in rows], actual), float(np.mean(gsigns)) if gsigns else None)
