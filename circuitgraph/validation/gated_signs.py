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

Per neuron, the *echo share* is the share of its ``top_k`` largest ``hook_post`` activations
(over every token of the prompts but the first position) that are echoes; a neuron is
*echo-dominated* when that share is at least ``echo_threshold``.  Removing the echo sets
``post`` to ``b_in`` (removes ``act(gate) * value``) exactly at the echo activations of the
chosen neurons, live in the forward pass; it is compared with random neurons of the same
layers matched on removed echo mass (the sum of ``act(gate) * value`` over their echo
activations) and with count-matched ones.  Effects are the change in the mean next-token
loss over the prompts and, with a graph, in its target metric on its prompt.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch

from circuitgraph._results import Tabular
from circuitgraph.errors import ValidationRunError
from circuitgraph.validation._common import fmt, markdown_table, resolve_prompt
from circuitgraph.validation.controls import ControlSummary, draw_controls, summarise_controls
from circuitgraph.validation.interventions import Unit
from circuitgraph.validation.metrics import Metric, next_token_loss

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["REGIMES", "EchoNeuron", "SignRegimeResult", "sign_regimes", "echo_removed", "regimes_of"]

REGIMES = ("open+", "open-", "echo", "closed")


def regimes_of(gate: torch.Tensor, value: torch.Tensor, act_gate: torch.Tensor) -> dict[str, torch.Tensor]:
    """Boolean masks of the four regimes for same-shaped gate, value and act(gate) tensors."""
    open_ = gate > 0
    echo = (~open_) & (value < 0) & (act_gate * value > 0)
    return {"open+": open_ & (value > 0), "open-": open_ & (value <= 0), "echo": echo, "closed": (~open_) & ~echo}


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
    echo_mass: float
    max_echo: float | None
    max_open: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(repr=False)
class SignRegimeResult(Tabular):
    """Regime shares per layer, echo-dominated neurons, and the echo-removal effects with controls."""

    layers: list[int]
    top_k: int
    echo_threshold: float
    n_tokens: int
    regime_shares: dict[int, dict[str, float]]
    echo_dominated: list[EchoNeuron]
    loss_change: float | None = None
    metric: str | None = None
    metric_change: float | None = None
    controls: list[ControlSummary] = field(default_factory=list)
    controls_metric: list[ControlSummary] = field(default_factory=list)
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.layers,
            "top_k": self.top_k,
            "echo_threshold": self.echo_threshold,
            "n_tokens": self.n_tokens,
            "regime_shares": {str(k): v for k, v in self.regime_shares.items()},
            "n_echo_dominated": len(self.echo_dominated),
            "echo_dominated": [n.to_dict() for n in self.echo_dominated],
            "loss_change": self.loss_change,
            "metric": self.metric,
            "metric_change": self.metric_change,
            "seed": self.seed,
            "controls": [c.to_dict() for c in self.controls],
            "controls_metric": [c.to_dict() for c in self.controls_metric],
            "notes": self.notes,
        }

    def table(self, max_rows: int = 10) -> str:
        shares = markdown_table(["layer"] + list(REGIMES) + ["echo-dominated"],
                                [[l] + [self.regime_shares[l][r] for r in REGIMES]
                                 + [sum(n.layer == l for n in self.echo_dominated)] for l in self.layers], max_rows)
        parts = [f"regime shares over {self.n_tokens} tokens:\n\n{shares}"]
        if self.echo_dominated:
            parts.append("\necho-dominated neurons (top-k echo share >= "
                         f"{fmt(self.echo_threshold)}):\n\n" + markdown_table(
                             ["neuron", "echo share", "echo mass", "max echo", "max open"],
                             [[f"L{n.layer}N{n.index}", n.echo_share, n.echo_mass, n.max_echo, n.max_open]
                              for n in self.echo_dominated], max_rows))
        if self.loss_change is not None:
            line = f"\nremoving their echo: loss change {fmt(self.loss_change)}"
            if self.metric_change is not None:
                line += f", {self.metric} change {fmt(self.metric_change)}"
            parts.append(line)
            rows = [c.row() for c in self.controls]
            rows += [["(metric) " + c.kind] + c.row()[1:] for c in self.controls_metric]
            if rows:
                table = markdown_table(ControlSummary.HEADERS, rows, max_rows)
                parts.append(f"\ncontrols (seed {self.seed}):\n\n{table}")
        parts += [f"\nnote: {n}" for n in self.notes]
        return "\n".join(parts)


@torch.no_grad()
def sign_regimes(
    graph: Any = None,
    *,
    prompts: Sequence[Any] = (),
    layers: Sequence[int] | None = None,
    top_k: int = 20,
    echo_threshold: float = 0.5,
    adapter: ModelAdapter | None = None,
    metric: Metric | None = None,
    controls: Sequence[str] = ("matched_magnitude", "count_matched"),
    n_controls: int = 10,
    control_tolerance: float = 0.05,
    max_draws: int = 1000,
    seed: int = 0,
    first_position: int = 1,
    tokenizer: Any = None,
) -> SignRegimeResult:
    """Tag gated-neuron activations by sign regime, find echo-dominated neurons and remove
    their echo against matched controls (see the module docstring)."""
    token_lists: list[list[int]] = []
    if graph is not None and graph.context is not None:
        adapter = adapter or graph.context.adapter
        token_lists.append(graph.context.linearisation.tokens.tolist())
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
    token_lists += [resolve_prompt(p, tokenizer, where=f"sign_regimes.prompts[{i}]") for i, p in enumerate(prompts)]
    if not token_lists:
        raise ValidationRunError("sign_regimes: no prompt; give a graph or prompts=[...]")
    layers = list(range(f.n_layers)) if layers is None else sorted(set(layers))
    bad = [l for l in layers if not 0 <= l < f.n_layers]
    if bad:
        raise ValidationRunError(f"sign_regimes layers {bad} requested, the model has {f.n_layers} layers "
                                 f"(0-{f.n_layers - 1})")
    names = set()
    for l in layers:
        names |= {adapter.hook_mlp_pre(l), adapter.hook_mlp_pre_linear(l), adapter.hook_mlp_post(l)}
    acc: dict[int, dict[str, list[torch.Tensor]]] = {l: {"g": [], "v": [], "p": []} for l in layers}
    for toks in token_lists:
        _, cache = adapter.model.run_with_cache(torch.tensor([toks], device=adapter.device),
                                                names_filter=lambda n: n in names)
        for l in layers:
            acc[l]["g"].append(cache[adapter.hook_mlp_pre(l)][0, first_position:].double())
            acc[l]["v"].append(cache[adapter.hook_mlp_pre_linear(l)][0, first_position:].double())
            acc[l]["p"].append(cache[adapter.hook_mlp_post(l)][0, first_position:].double())
    n_tokens = sum(max(len(t) - first_position, 0) for t in token_lists)
    if n_tokens == 0:
        raise ValidationRunError(f"sign_regimes: no token at position >= {first_position} in the prompts")
    k = min(top_k, n_tokens)
    shares: dict[int, dict[str, float]] = {}
    dominated: list[EchoNeuron] = []
    echo_mass: dict[int, torch.Tensor] = {}
    for l in layers:
        g, v, p = (torch.cat(acc[l][key]) for key in ("g", "v", "p"))
        ag = adapter.mlp_act_fn(l)(g)
        reg = regimes_of(g, v, ag)
        shares[l] = {r: float(m.double().mean()) for r, m in reg.items()}
        prod = ag * v
        echo = reg["echo"]
        echo_mass[l] = torch.where(echo, prod, torch.zeros_like(prod)).sum(0).cpu()
        top = p.topk(k, dim=0).indices  # (k, d_mlp)
        share = echo.gather(0, top).double().mean(0)
        for i in (share >= echo_threshold).nonzero().flatten().tolist():
            e, o = p[echo[:, i], i], p[(g > 0)[:, i], i]
            dominated.append(EchoNeuron(l, i, float(share[i]), float(echo_mass[l][i]),
                                        float(e.max()) if e.numel() else None,
                                        float(o.max()) if o.numel() else None))
    dominated.sort(key=lambda n: (-n.echo_share, -n.echo_mass))
    result = SignRegimeResult(layers, k, echo_threshold, n_tokens, shares, dominated, seed=seed)
    if not dominated:
        result.notes.append("no echo-dominated neuron: nothing to remove")
        return result
    selected = [Unit("neuron", n.layer, None, n.index) for n in dominated]
    mags = {("neuron", l): (echo_mass[l].unsqueeze(0), None, None) for l in layers}
    sel_mass = float(sum(n.echo_mass for n in dominated))
    sets_by_kind = {}
    for kind in controls:
        draw = draw_controls(selected, mags, kind, n_controls, seed=seed, tolerance=control_tolerance,
                             max_draws=max_draws, match_layers=True, active_only=False)
        if draw:
            sets_by_kind[kind] = draw
        else:  # the check itself stays useful: report why this control kind is missing
            result.notes.append(f"{kind} controls skipped: {draw.shortfall}")
    controls = [kind for kind in controls if kind in sets_by_kind]
    neuron_sets = [selected] + [u for kind in controls for u, _ in sets_by_kind[kind]]
    loss_eff, metric_eff = _echo_effects(adapter, token_lists, neuron_sets, layers, f.d_mlp, first_position,
                                         metric if graph is not None else None)
    result.loss_change = loss_eff[0]
    if metric_eff is not None:
        result.metric, result.metric_change = metric.describe(tokenizer), metric_eff[0]
    i = 1
    for kind in controls:
        sets = sets_by_kind[kind]
        result.controls.append(summarise_controls(kind, seed, control_tolerance, loss_eff[0], sel_mass, sets,
                                                  loss_eff[i:i + len(sets)]))
        if metric_eff is not None:
            result.controls_metric.append(summarise_controls(kind, seed, control_tolerance, metric_eff[0], sel_mass,
                                                             sets, metric_eff[i:i + len(sets)]))
        i += len(sets)
    return result


def _echo_effects(adapter: ModelAdapter, token_lists: list[list[int]], neuron_sets: list[list[Unit]], layers: list[int],
                  d_mlp: int, first_position: int, metric: Metric | None) -> tuple[list[float], list[float] | None]:
    """Change in mean loss (over prompts) and in the metric (first prompt) per neuron set."""
    B = len(neuron_sets) + 1  # row 0: nothing removed
    masks = {l: torch.zeros(B, d_mlp, dtype=torch.bool) for l in layers}
    for b, units in enumerate(neuron_sets, start=1):
        for u in units:
            masks[u.layer][b, u.index] = True
    masks = {l: m for l, m in masks.items() if m.any()}
    loss = torch.zeros(B, dtype=torch.float64)
    metric_vals = None
    for j, toks in enumerate(token_lists):
        x = torch.tensor([toks], device=adapter.device).expand(B, -1)
        captured: dict[str, torch.Tensor] = {}
        need = metric.hook_names(adapter, None) if (metric is not None and j == 0) else set()

        def keep(value, hook):
            captured[hook.name] = value
            return value

        with echo_removed(adapter, masks, first_position) as model, model.hooks(fwd_hooks=[(n, keep) for n in need]):
            logits = model(x)
        loss += next_token_loss(logits, x[0]).cpu()
        if metric is not None and j == 0:
            metric_vals = metric.combine(metric.values(logits, captured, adapter, None)).cpu()
    loss /= len(token_lists)
    loss_eff = (loss[1:] - loss[0]).tolist()
    metric_eff = None if metric_vals is None else (metric_vals[1:] - metric_vals[0]).tolist()
    return loss_eff, metric_eff
