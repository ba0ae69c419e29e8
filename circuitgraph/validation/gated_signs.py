"""Sign regimes of gated (SwiGLU-style) MLP neurons, and the "double negative" echo.

A gated neuron outputs ``post = act(gate) * value + b_in`` with ``gate = hook_pre`` (the gate
pre-activation), ``value = hook_pre_linear`` and ``post = hook_post``; these three hooks are
the only ones used.  Every activation (one neuron at one token) is tagged by signs:

* ``open`` gate: ``gate > 0`` (then ``act(gate) > 0`` for SiLU/GELU); ``closed``: ``gate <= 0``;
* ``echo``: a closed gate times a negative value with a positive product,
  ``gate <= 0 and value < 0 and act(gate) * value > 0`` (SiLU/GELU are slightly negative for
  negative inputs, so a negative value comes out positive: the double-negative regime);
* the four regimes reported are ``open+`` (open, value > 0), ``open-`` (open, value <= 0),
  ``echo`` and ``closed`` (closed, not echo).

The protocol of the published SwiGLU gate-sign demo, in two sets of rows:

* **selection rows** (the graph's prompt unless left out, ``prompts`` and the selection part
  of ``dataset``): per neuron, the *echo share* is the share of its ``top_k`` largest
  ``hook_post`` activations (every token but the first position) that are echoes; a neuron is
  *echo-dominated* when that share is at least ``echo_threshold`` (default 1: every one of its
  top activations is an echo, "a top-k made of gate-closed echoes");
* **evaluation rows** (``eval_prompts`` and the evaluation part of ``dataset``; the selection
  rows when none are given, which is reported): the echo is removed (``post`` set to ``b_in``
  exactly at the echo activations of the chosen neurons, live in the forward pass) and the
  change in next-token loss (token-weighted mean over the rows) is compared with random
  neurons of the same layers, never echo-dominated, *matched on the echo mass they remove on
  the evaluation rows* (the sum of ``act(gate) * value`` over their echo activations) and with
  count-matched ones.  The same is reported per group of the echo-dominated neurons: those of
  layer ``group_layer`` (1), those whose gate never opened on the selection rows, and neither,
  each with its own matched controls (the first two may overlap).

Activations are streamed row by row (:mod:`circuitgraph.validation.echo_stats`): memory is
one row's forward pass plus ``top_k`` values per neuron, not every activation.  When a
requested control kind cannot be drawn for the echo-dominated set (a selection that is most
of its layer's echo), the result's ``status`` is ``uncontrolled`` with the reason; the run
records the check as ``uncontrolled``, never ``ok``.

Where the rows run is the ``runner``'s business (:class:`InProcessRows` by default;
:class:`circuitgraph.datasets.echo_runs.ExecutorRows` on the dataset executors): both fold the
rows' statistics and losses in row order, so the result is the same.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from circuitgraph._results import Tabular
from circuitgraph.errors import ValidationRunError
from circuitgraph.validation._common import fmt, markdown_table, resolve_prompt
from circuitgraph.validation.controls import ControlKind, ControlSummary, draw_controls, summarise_controls
from circuitgraph.validation.echo_stats import REGIMES, regimes_of, stream_stats
from circuitgraph.validation.interventions import Unit
from circuitgraph.validation.metrics import Metric

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["REGIMES", "EchoNeuron", "EchoGroup", "SignRegimeResult", "sign_regimes", "echo_removed", "regimes_of",
           "echo_loss_changes", "echo_masks", "row_nll_totals", "InProcessRows"]

#: the groups of the echo-dominated set, in table order ("layer N" is named after group_layer)
GROUPS = ("all", "layer", "never open", "neither")


@contextlib.contextmanager
def echo_removed(adapter: ModelAdapter, masks: dict[int, torch.Tensor], first_position: int = 1) -> Iterator[Any]:
    """Scoped: at the echo activations of the neurons in ``masks`` (layer -> ``(batch, d_mlp)`` bool),
    from ``first_position`` on, ``hook_post`` loses ``act(gate) * value``.  Hooks always removed."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for layer, mask in masks.items():
        pre, lin = adapter.hook_mlp_pre(layer), adapter.hook_mlp_pre_linear(layer)
        act = adapter.mlp_act_fn(layer)

        def grab(value, hook):
            seen[hook.name] = value
            return value

        def edit(post, hook, pre=pre, lin=lin, act=act, mask=mask):
            g, v = seen[pre], seen[lin]
            ag = act(g)
            where = regimes_of(g, v, ag)["echo"] & mask.to(post.device)[:, None, :]
            where[:, :first_position] = False
            return torch.where(where, post - ag * v, post)

        hooks += [(pre, grab), (lin, grab), (adapter.hook_mlp_post(layer), edit)]
    with adapter.model.hooks(fwd_hooks=hooks):
        yield adapter.model


@dataclass
class EchoNeuron:
    layer: int
    index: int
    echo_share: float
    echo_mass: float  # on the selection rows
    eval_echo_mass: float  # on the evaluation rows: what removing its echo removes
    never_open: bool
    max_echo: float | None
    max_open: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class EchoGroup:
    """One row of the published table: a set of echo-dominated neurons, the loss change when
    their echo is removed on the evaluation rows, and its controls."""

    name: str
    n_neurons: int
    echo_mass: float  # removed on the evaluation rows
    loss_change: float | None
    controls: list[ControlSummary] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # control kinds that could not be drawn, with why

    def control(self, kind: str) -> ControlSummary | None:
        return next((c for c in self.controls if c.kind == kind), None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n_neurons": self.n_neurons, "echo_mass": self.echo_mass,
                "loss_change": self.loss_change, "controls": [c.to_dict() for c in self.controls],
                "missing": self.missing}


@dataclass(repr=False)
class SignRegimeResult(Tabular):
    """Regime shares per layer, echo-dominated neurons, and the echo-removal effects with controls."""

    layers: list[int]
    top_k: int
    echo_threshold: float
    n_tokens: int  # selection tokens
    regime_shares: dict[int, dict[str, float]]
    echo_dominated: list[EchoNeuron]
    n_rows: int = 0  # selection rows
    n_eval_rows: int = 0
    n_eval_tokens: int = 0
    same_rows: bool = False  # selected and evaluated on the same rows
    groups: list[EchoGroup] = field(default_factory=list)
    metric: str | None = None
    metric_change: float | None = None
    controls_metric: list[ControlSummary] = field(default_factory=list)
    seed: int = 0
    status: str = "ok"  # "ok" or "uncontrolled"
    reason: str | None = None
    stats_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def loss_change(self) -> float | None:
        return self.groups[0].loss_change if self.groups else None

    @property
    def controls(self) -> list[ControlSummary]:
        return self.groups[0].controls if self.groups else []

    def group(self, name: str) -> EchoGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no group {name!r}; groups: {[g.name for g in self.groups]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "layers": self.layers,
            "top_k": self.top_k,
            "echo_threshold": self.echo_threshold,
            "n_rows": self.n_rows,
            "n_tokens": self.n_tokens,
            "n_eval_rows": self.n_eval_rows,
            "n_eval_tokens": self.n_eval_tokens,
            "same_rows": self.same_rows,
            "regime_shares": {str(k): v for k, v in self.regime_shares.items()},
            "n_echo_dominated": len(self.echo_dominated),
            "echo_dominated": [n.to_dict() for n in self.echo_dominated],
            "loss_change": self.loss_change,
            "groups": [g.to_dict() for g in self.groups],
            "metric": self.metric,
            "metric_change": self.metric_change,
            "seed": self.seed,
            "controls": [c.to_dict() for c in self.controls],
            "controls_metric": [c.to_dict() for c in self.controls_metric],
            "stats_bytes": self.stats_bytes,
            "seconds": self.seconds,
            "notes": self.notes,
        }

    def summary_rows(self) -> list[list[Any]]:
        """The published table: per group, the loss change of removing the echo, then each
        control kind's mean loss change, the neurons and the echo mass removed."""
        rows = []
        for g in self.groups:
            mm, cm = g.control("matched_magnitude"), g.control("count_matched")
            rows.append([g.name, g.n_neurons, g.echo_mass, g.loss_change,
                         mm.mean if mm and mm.effects else None,
                         float(sum(mm.magnitudes) / len(mm.magnitudes)) if mm and mm.magnitudes else None,
                         cm.mean if cm and cm.effects else None])
        return rows

    SUMMARY_HEADERS = ["neurons", "n", "echo removed", "Δ loss", "Δ loss, matched random", "their echo",
                       "Δ loss, count-matched random"]

    def table(self, max_rows: int = 10) -> str:
        shares = markdown_table(["layer"] + list(REGIMES) + ["echo-dominated"],
                                [[l] + [self.regime_shares[l][r] for r in REGIMES]
                                 + [sum(n.layer == l for n in self.echo_dominated)] for l in self.layers], max_rows)
        rows_line = (f"selected on {self.n_rows} rows ({self.n_tokens} tokens), evaluated on "
                     + ("the same rows" if self.same_rows else f"{self.n_eval_rows} other rows "
                        f"({self.n_eval_tokens} tokens)"))
        parts = [f"status: {self.status}" + (f" ({self.reason})" if self.reason else ""), rows_line,
                 f"\nregime shares on the selection rows:\n\n{shares}"]
        if self.echo_dominated:
            parts.append(f"\n{len(self.echo_dominated)} echo-dominated neurons (top-{self.top_k} echo share >= "
                         f"{fmt(self.echo_threshold)}):\n\n" + markdown_table(
                             ["neuron", "echo share", "echo mass", "eval echo mass", "never open", "max echo",
                              "max open"],
                             [[f"L{n.layer}N{n.index}", n.echo_share, n.echo_mass, n.eval_echo_mass, n.never_open,
                               n.max_echo, n.max_open] for n in self.echo_dominated], max_rows))
        if self.groups:
            parts.append(f"\nremoving the echo (seed {self.seed}):\n\n"
                         + markdown_table(self.SUMMARY_HEADERS, self.summary_rows(), max_rows))
            if self.metric_change is not None:
                parts.append(f"\n{self.metric} change on the graph's prompt: {fmt(self.metric_change)}")
            rows = [c.row() for c in self.controls]
            rows += [["(metric) " + c.kind] + c.row()[1:] for c in self.controls_metric]
            if rows:
                parts.append("\ncontrols of the echo-dominated set:\n\n"
                             + markdown_table(ControlSummary.HEADERS, rows, max_rows))
        parts += [f"\nnote: {n}" for n in self.notes]
        return "\n".join(parts)


def _check_layers(layers: Sequence[int] | None, n_layers: int, what: str) -> list[int]:
    layers = list(range(n_layers)) if layers is None else sorted(set(layers))
    bad = [l for l in layers if not 0 <= l < n_layers]
    if bad:
        raise ValidationRunError(f"sign_regimes {what} {bad} requested, the model has {n_layers} layers "
                                 f"(0-{n_layers - 1})")
    return layers


@torch.no_grad()
def sign_regimes(
    graph: AttributionGraph | None = None,
    *,
    prompts: Sequence[Any] = (),
    eval_prompts: Sequence[Any] = (),
    use_graph_prompt: bool = True,
    layers: Sequence[int] | None = None,
    top_k: int = 20,
    echo_threshold: float = 1.0,
    adapter: ModelAdapter | None = None,
    metric: Metric | None = None,
    controls: Sequence[ControlKind] = ("matched_magnitude", "count_matched"),
    n_controls: int = 10,
    control_tolerance: float = 0.05,
    max_draws: int = 1000,
    seed: int = 0,
    groups: bool = True,
    group_layer: int = 1,
    first_position: int = 1,
    batch_size: int = 8,
    tokenizer: Tokenizer | None = None,
    runner: Any = None,
) -> SignRegimeResult:
    """Tag gated-neuron activations by sign regime on the selection rows (the graph's prompt
    and ``prompts``), find echo-dominated neurons, and remove their echo on the evaluation rows
    (``eval_prompts``; the selection rows when empty) against controls matched there (see the
    module docstring).  ``batch_size``: evaluation runs (neuron sets) per forward pass;
    ``runner``: where the rows run (default :class:`InProcessRows`: this process;
    :class:`circuitgraph.datasets.echo_runs.ExecutorRows`: the dataset executors, same result)."""
    t_start = time.perf_counter()
    selection: list[list[int]] = []
    if graph is not None and graph.context is not None:
        adapter = adapter or graph.context.adapter
        if use_graph_prompt:
            selection.append(graph.context.linearisation.tokens.tolist())
        if metric is None and graph.context.targets:
            metric = Metric.from_graph(graph)
    if adapter is None:
        raise ValidationRunError("sign_regimes needs a graph with its model, or adapter= and prompts=")
    f = adapter.facts
    if not f.gated_mlp:
        raise ValidationRunError(
            f"sign_regimes applies to gated (SwiGLU-style) MLPs, with a gate (hook_pre) and a value "
            f"(hook_pre_linear); this model's MLP is a plain {f.act_fn} MLP"
        )
    tokenizer = tokenizer if tokenizer is not None else adapter.tokenizer
    selection += [resolve_prompt(p, tokenizer, where=f"sign_regimes.prompts[{i}]") for i, p in enumerate(prompts)]
    evaluation = [resolve_prompt(p, tokenizer, where=f"sign_regimes.eval_prompts[{i}]")
                  for i, p in enumerate(eval_prompts)]
    if not selection:
        raise ValidationRunError("sign_regimes: no selection row; give a graph, prompts=[...] or a dataset")
    layers = _check_layers(layers, f.n_layers, "layers")
    for name, n in (("top_k", top_k), ("n_controls", n_controls), ("batch_size", batch_size)):
        if n < 1:
            raise ValidationRunError(f"sign_regimes {name} must be at least 1, got {n}")

    runner = runner if runner is not None else InProcessRows(adapter)
    stats = runner.stats(selection, layers, top_k, first_position)
    n_tokens = sum(s.n_tokens for s in stats.values()) // max(len(layers), 1)
    if n_tokens == 0:
        raise ValidationRunError(f"sign_regimes: no token at position >= {first_position} in the selection rows")
    same_rows = not evaluation
    eval_stats = stats if same_rows else runner.stats(evaluation, layers, 1, first_position)
    evaluation = selection if same_rows else evaluation
    n_eval_tokens = sum(max(len(t) - first_position, 0) for t in evaluation)
    seconds = {"statistics": time.perf_counter() - t_start}

    shares: dict[int, dict[str, float]] = {}
    dominated: list[EchoNeuron] = []
    k = min(top_k, n_tokens)
    for l in layers:
        s = stats[l]
        total = max(int(s.regime_counts.sum()), 1)
        shares[l] = {r: int(c) / total for r, c in zip(REGIMES, s.regime_counts.tolist(), strict=False)}
        share = s.echo_share()
        ev = eval_stats[l].echo_mass
        for i in (share >= echo_threshold - 1e-12).nonzero().flatten().tolist():
            dominated.append(EchoNeuron(l, i, float(share[i]), float(s.echo_mass[i]), float(ev[i]),
                                        not bool(s.ever_open[i]),
                                        float(s.max_echo[i]) if s.echo_count[i] > 0 else None,
                                        float(s.max_open[i]) if s.ever_open[i] else None))
    dominated.sort(key=lambda n: (-n.echo_share, -n.echo_mass))
    result = SignRegimeResult(layers, k, echo_threshold, n_tokens, shares, dominated, n_rows=len(selection),
                              n_eval_rows=len(evaluation), n_eval_tokens=n_eval_tokens, same_rows=same_rows,
                              seed=seed, stats_bytes=sum(s.nbytes() for s in stats.values()))
    result.notes.append("activations tagged in the model's dtype "
                        f"({str(next(adapter.model.parameters()).dtype).replace('torch.', '')}), sums in float64")
    if same_rows:
        result.notes.append("selected and evaluated on the same rows (give eval_prompts or a dataset split for the "
                            "published protocol: select on some rows, measure on others)")
    if not dominated:
        result.notes.append("no echo-dominated neuron: nothing to remove")
        result.seconds = seconds
        return result

    all_units = [Unit("neuron", n.layer, None, n.index) for n in dominated]
    by_unit = dict(zip(all_units, dominated, strict=False))
    members = {"all": all_units}
    if groups:
        in_layer = [u for u in all_units if u.layer == group_layer]
        never = [u for u in all_units if by_unit[u].never_open]
        members[f"layer {group_layer}"] = in_layer
        members["never open"] = never
        members["neither"] = [u for u in all_units if u.layer != group_layer and not by_unit[u].never_open]
    mags = {("neuron", l): (eval_stats[l].echo_mass.unsqueeze(0), None, None) for l in layers}
    plans: list[tuple[str, list[Unit], dict[str, Any]]] = []
    missing_all: list[str] = []
    for name, units in members.items():
        draws: dict[str, Any] = {}
        missing: list[str] = []
        if units:
            for kind in controls:
                draw = draw_controls(units, mags, kind, n_controls, seed=seed, tolerance=control_tolerance,
                                     max_draws=max_draws, match_layers=True, active_only=False, exclude=all_units)
                if draw and draw.shortfall is None:
                    draws[kind] = draw
                else:
                    missing.append(f"{kind}: {draw.shortfall or 'no set could be drawn'}")
        plans.append((name, units, draws))
        if name == "all":
            missing_all = missing
        result.groups.append(EchoGroup(name, len(units), float(sum(by_unit[u].eval_echo_mass for u in units)),
                                       None, missing=missing))
    sets = [units for _, units, draws in plans if units]
    sets += [u for _, units, draws in plans if units for kind in controls if kind in draws for u, _ in draws[kind]]
    t0 = time.perf_counter()
    changes = echo_loss_changes(adapter, evaluation, sets, first_position, batch_size, runner)
    seconds["removal"] = time.perf_counter() - t0
    i_sel, i = 0, sum(1 for _, units, _ in plans if units)
    for g, (_name, units, draws) in zip(result.groups, plans, strict=False):
        if not units:
            continue
        g.loss_change = changes[i_sel]
        i_sel += 1
        for kind in controls:
            if kind not in draws:
                continue
            draw = draws[kind]
            g.controls.append(summarise_controls(kind, seed, control_tolerance, g.loss_change, g.echo_mass, draw,
                                                 changes[i:i + len(draw)]))
            i += len(draw)
    for g in result.groups[1:]:
        for why in g.missing:
            result.notes.append(f"group {g.name}: {why}")
    if missing_all:
        result.status = "uncontrolled"
        result.reason = "; ".join(missing_all)
    if graph is not None and metric is not None:
        if graph.context is None:
            raise ValidationRunError("sign_regimes: a metric is measured on the graph's prompt, and this graph "
                                     "was loaded without its model; build it in this session or drop metric")
        full = plans[0][2]
        metric_sets = [all_units] + [u for kind in controls if kind in full for u, _ in full[kind]]
        eff = _metric_changes(adapter, graph.context.linearisation.tokens.tolist(), metric_sets, first_position,
                              metric, batch_size)
        result.metric, result.metric_change = metric.describe(tokenizer), eff[0]
        j = 1
        for kind in controls:
            if kind in full:
                draw = full[kind]
                result.controls_metric.append(summarise_controls(kind, seed, control_tolerance, eff[0],
                                                                 result.groups[0].echo_mass, draw,
                                                                 eff[j:j + len(draw)]))
                j += len(draw)
    seconds["total"] = time.perf_counter() - t_start
    result.seconds = seconds
    return result


def echo_masks(neuron_sets: Sequence[Sequence[Unit]], d_mlp: int) -> dict[int, torch.Tensor]:
    """Layer -> ``(1 + len(sets), d_mlp)`` bool masks; row 0 removes nothing."""
    masks: dict[int, torch.Tensor] = {}
    for b, units in enumerate(neuron_sets, start=1):
        for u in units:
            m = masks.setdefault(u.layer, torch.zeros(len(neuron_sets) + 1, d_mlp, dtype=torch.bool))
            m[b, u.index] = True
    return masks


def _row_nll(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Summed next-token negative log-likelihood per batch row, float64 sums of float32 terms."""
    lp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -lp.gather(-1, tokens[1:].to(lp.device).view(1, -1, 1).expand(logits.shape[0], -1, 1)).squeeze(-1)
    return nll.sum(-1, dtype=torch.float64).cpu()


def row_nll_totals(adapter: ModelAdapter, toks: Sequence[int], masks: dict[int, torch.Tensor], n_runs: int,
                   first_position: int = 1, batch_size: int = 8) -> torch.Tensor:
    """One row: ``(n_runs,)`` float64 summed next-token negative log-likelihoods, run ``b``
    removing the echo of the neurons in row ``b`` of ``masks`` (:func:`echo_masks`; run 0 removes
    nothing), ``batch_size`` runs per forward pass (empty for a row of fewer than two tokens)."""
    B = n_runs
    x = torch.tensor(list(toks), device=adapter.device)
    total = torch.zeros(B, dtype=torch.float64)
    if x.numel() < 2:
        return total[:0]
    for lo in range(0, B, batch_size):
        hi = min(B, lo + batch_size)
        part = {l: m[lo:hi] for l, m in masks.items() if m[lo:hi].any()}
        with echo_removed(adapter, part, first_position) as model:
            logits = model(x.unsqueeze(0).expand(hi - lo, -1))
        total[lo:hi] = _row_nll(logits, x)
    return total


class InProcessRows:
    """Where :func:`sign_regimes` runs its rows by default: in this process, one after another.
    :class:`circuitgraph.datasets.echo_runs.ExecutorRows` runs them on the dataset executors
    with the same results (both fold rows in row order)."""

    def __init__(self, adapter: ModelAdapter):
        self.adapter = adapter

    def stats(self, rows: Sequence[Sequence[int]], layers: Sequence[int], top_k: int,
              first_position: int) -> dict[int, Any]:
        return stream_stats(self.adapter, rows, layers, top_k, first_position)

    def nll_totals(self, rows: Sequence[Sequence[int]], neuron_sets: Sequence[Sequence[Unit]], first_position: int,
                   batch_size: int) -> Iterator[torch.Tensor]:
        masks = echo_masks(neuron_sets, self.adapter.facts.d_mlp)
        for toks in rows:
            yield row_nll_totals(self.adapter, toks, masks, len(neuron_sets) + 1, first_position, batch_size)


@torch.no_grad()
def echo_loss_changes(adapter: ModelAdapter, rows: Sequence[Sequence[int]], neuron_sets: Sequence[Sequence[Unit]],
                      first_position: int = 1, batch_size: int = 8, runner: Any = None) -> list[float]:
    """Per neuron set: the change in next-token loss (token-weighted mean over ``rows``) when
    the echo of its neurons is removed.  Each row runs once without removal and once per set,
    ``batch_size`` runs per forward pass, so memory does not grow with the rows or the sets;
    the rows' float64 sums are added in row order (``runner``: where the rows run, default this
    process)."""
    runner = runner if runner is not None else InProcessRows(adapter)
    total = torch.zeros(len(neuron_sets) + 1, dtype=torch.float64)
    n_pred = 0
    for toks, row_total in zip(rows, runner.nll_totals(rows, neuron_sets, first_position, batch_size), strict=True):
        if row_total.numel():
            n_pred += len(toks) - 1
            total += row_total
    if n_pred == 0:
        raise ValidationRunError("sign_regimes: the evaluation rows have no next token to predict (one token each)")
    loss = total / n_pred
    return (loss[1:] - loss[0]).tolist()


def _metric_changes(adapter: ModelAdapter, tokens: list[int], neuron_sets: Sequence[Sequence[Unit]],
                    first_position: int, metric: Metric, batch_size: int) -> list[float]:
    masks = echo_masks(neuron_sets, adapter.facts.d_mlp)
    B = len(neuron_sets) + 1
    x = torch.tensor([tokens], device=adapter.device)
    need = metric.hook_names(adapter, None)
    vals = []
    for lo in range(0, B, batch_size):
        hi = min(B, lo + batch_size)
        captured: dict[str, torch.Tensor] = {}

        def keep(value, hook, captured=captured):
            captured[hook.name] = value
            return value

        part = {l: m[lo:hi] for l, m in masks.items() if m[lo:hi].any()}
        with echo_removed(adapter, part, first_position) as model, model.hooks(fwd_hooks=[(n, keep) for n in need]):
            logits = model(x.expand(hi - lo, -1))
        vals.append(metric.combine(metric.values(logits, captured, adapter, None)).cpu())
    v = torch.cat(vals)
    return (v[1:] - v[0]).tolist()

