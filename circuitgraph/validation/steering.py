"""Steering: intervene on graph nodes in the real model and watch what it generates.

:func:`steer` takes a graph built from a model (it needs ``graph.context``), a list of
interventions (spec ``steer:`` items, :class:`~circuitgraph.spec.steering.SteerIntervention`,
or their dicts) and generation settings, and returns a :class:`SteeringResult`: the
continuation without (``baseline``) and with (``intervened``) the interventions, step by step
with the most probable tokens, and the change of the graph's target metric at the last prompt
position beside the graph's predictions.

What an intervention does, on the real TransformerLens model (through
:func:`~circuitgraph.validation.interventions.intervene`, the same scoped hooks as every check):

* a **feature** of layer ``l`` at position ``t``: its activation ``a`` (recomputed from the
  live input of that forward pass) becomes ``a'`` (``zero``: 0, ``set``: ``value``, ``scale``:
  ``value * a``, ``add``: ``a + value``), and every MLP output it writes into changes by
  ``(a' - a) W_dec`` (a cross-layer transcoder feature: every layer ``k >= l``, with its decoder
  row for ``k``).  The error node is left as it is: the rest of the MLP output is the model's own
  (circuit-tracer's ``feature_intervention``);
* a **neuron**: its activation (``hook_post``) is edited the same way;
* an **attention head** (and an error, whole-MLP or embedding node), a vector node of activation
  1: its output is multiplied by ``0`` (zero), ``value`` (set, scale) or ``1 + value`` (add);
* a **direction** ``d`` at a residual site: the coordinate ``c = x . d / (d . d)`` of the residual
  ``x`` along ``d`` becomes ``c'`` (the same four modes), ``x' = x + (c' - c) d``.

Generation re-runs the model on the growing sequence at every step (no cache), with each
intervention applied at the positions it covers among those present: ``prompt`` (the node's own
position), ``all`` (that position and every generated token), ``new`` (generated tokens only) or
an explicit list.  Everything downstream (features included) is recomputed from the intervened
residual stream.  With ``freeze_attention`` the attention patterns at prompt positions (query and
key both in the prompt) are those of the prompt's run without interventions; generated positions
attend as the model computes.

Greedy decoding (``temperature: 0``) takes the most probable token (the lowest id on a tie);
``temperature: T`` samples from ``softmax(logits / T)`` restricted to the nucleus ``top_p``, with
a ``torch.Generator`` seeded by ``seed`` (the same for the baseline and the intervened run).
Reported probabilities are always the model's, ``softmax(logits)`` at temperature 1.

The metric (``metric``): ``actual`` is the change of the graph's target metric (the weighted sum
of its targets, e.g. the logit difference) at the last prompt position, intervened minus
baseline, in the real model (with attention frozen when asked).  For each intervened graph node
``s`` at a prompt position, write ``c_s = a'_s / a_s`` (a rescaling of its output; ``a_s`` its
activation in the graph, 1 for vector nodes).  ``predicted_direct = sum_s (c_s - 1) D_s``, with
``D_s`` the node's direct (target-weighted) edge into the targets: the exact change in the frozen
model with only the direct paths.  ``predicted_total = sum_s (c_s - 1) V_s`` with ``V_s`` the
node's total effect on the targets in the graph's linear model (every path, each downstream
reader responding with its nonlinearity frozen: :func:`~circuitgraph.validation.predictions.
total_effects`), with the intervened nodes held at their new values: the edges into them are
cut (:func:`clamped_total_effects`), so a path from one intervened node through another counts
once.  Both are ``None`` when an intervention at a prompt position is not a rescaling of a
graph node (a direction, a node that is not in the graph, ``set``/``add`` on a node of activation
0) — ``notes`` says why; interventions at generated positions only predict 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitgraph.adapters.files import read_direction_file
from circuitgraph.adapters.sites import is_site
from circuitgraph.errors import ValidationRunError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.metadata import GraphMetadata
from circuitgraph.graph.nodes import NodeId
from circuitgraph.spec.steering import Generate, SteerIntervention, SteerItem, SteerPositions
from circuitgraph.validation._common import fmt, graph_context, markdown_table
from circuitgraph.validation.interventions import VECTOR_SITES, Intervention, Unit, intervene
from circuitgraph.validation.metrics import Metric
from circuitgraph.validation.predictions import INTERVENABLE_KINDS, direct_effects, select_nodes, total_effects

if TYPE_CHECKING:
    from pathlib import Path

    from circuitgraph.adapters.hook_names import HookPointLike
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.dictionaries.protocol import Dictionary

if TYPE_CHECKING:  # pragma: no cover
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["ResolvedIntervention", "Continuation", "SteeringResult", "steer", "steer_item", "clamped_total_effects"]


# ---------------------------------------------------------------------------- resolution
@dataclass(frozen=True)
class ResolvedIntervention:
    """One intervention on one unit (a node's site, layer and index) or on a direction,
    at the positions it covers.

    ``node``: the node id at its own position (``None`` for a direction); ``positions``: the
    absolute positions it covers in the longest sequence the generation runs on
    (``prompt_length + max_new_tokens - 1`` tokens).
    """

    node: NodeId | None
    site: str
    layer: int
    index: int
    own_position: int
    mode: str
    value: float | None
    positions_spec: SteerPositions
    positions: tuple[int, ...]
    direction: torch.Tensor | None = None

    @property
    def amount(self) -> float:
        """The value of a ``set``, ``scale`` or ``add`` intervention (the spec requires one)."""
        if self.value is None:
            raise ValidationRunError(f"a {self.mode} intervention needs a value")
        return self.value

    def at(self, n_pos: int) -> tuple[int, ...]:
        """The positions covered in an ``n_pos``-token sequence."""
        return tuple(p for p in self.positions if p < n_pos)

    def factor(self, activation: float) -> float | None:
        """``c`` with ``a' = c a`` for a node of activation ``activation`` (``None`` if ``a = 0``)."""
        vector = self.site in VECTOR_SITES
        a = 1.0 if vector else activation
        if self.mode == "zero":
            return 0.0
        if self.mode == "scale":
            return self.amount
        if a == 0:
            return None
        if self.mode == "set":
            return self.amount if vector else self.amount / a
        return 1.0 + self.amount if vector else (a + self.amount) / a

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": None if self.node is None else str(self.node), "site": self.site,
                               "layer": self.layer}
        if self.direction is None:
            out["index"] = self.index
        else:
            out["position"] = self.own_position
            out["direction_norm"] = float(self.direction.double().norm())
        out["mode"] = self.mode
        if self.value is not None:
            out["value"] = self.value
        out["positions_spec"] = (list(self.positions_spec) if isinstance(self.positions_spec, tuple)
                                 else self.positions_spec)
        out["positions"] = list(self.positions)
        return out


def _covered(spec: SteerPositions, own: int, n_prompt: int, n_max: int) -> tuple[int, ...]:
    if spec == "prompt":
        ps = [own]
    elif spec == "all":
        ps = [own, *range(n_prompt, n_max)]
    elif spec == "new":
        ps = list(range(n_prompt, n_max))
    else:
        ps = list(spec)
    return tuple(sorted({p for p in ps if 0 <= p < n_max}))


def _direction_vector(direction: tuple[float, ...] | Path, d_model: int, where: str) -> torch.Tensor:
    if isinstance(direction, tuple):
        v = torch.tensor(direction, dtype=torch.float64)
    else:
        v = torch.from_numpy(read_direction_file(direction, where))
    if v.ndim != 1 or v.shape[0] != d_model:
        raise ValidationRunError(f"{where}: the direction has {v.shape[0]} numbers, the model's d_model is {d_model}; "
                                 f"give {d_model}")
    if not torch.isfinite(v).all() or float(v.norm()) == 0:
        raise ValidationRunError(f"{where}: the direction must be finite and non-zero")
    return v


def resolve(graph: AttributionGraph, interventions: Sequence[SteerIntervention], n_prompt: int, n_max: int
            ) -> list[ResolvedIntervention]:
    """The units each intervention acts on, at the positions it covers (see the module docstring)."""
    adapter = graph_context(graph, "steer").adapter
    L = adapter.facts.n_layers
    out: list[ResolvedIntervention] = []
    for i, iv in enumerate(interventions):
        where = f"interventions[{i}]"
        value = None if iv.value is None else float(iv.value)
        if iv.direction is not None:
            layer = iv.layer
            if layer is None:
                raise ValidationRunError(f"{where}: a direction needs layer: the block index of its residual site")
            if not 0 <= layer < L:
                raise ValidationRunError(f"{where}: layer {layer} requested, the model has {L} layers (0-{L - 1})")
            own = iv.position + n_prompt if iv.position < 0 else iv.position
            if not 0 <= own < n_prompt:
                raise ValidationRunError(f"{where}: position {iv.position} is outside the {n_prompt}-token prompt")
            vec = _direction_vector(iv.direction, adapter.facts.d_model, where)
            out.append(ResolvedIntervention(None, iv.site, layer, 0, own, iv.mode, value, iv.positions,
                                            _covered(iv.positions, own, n_prompt, n_max), vec))
            continue
        if iv.node is not None:
            node = NodeId.parse(iv.node)
            if node.position < 0:
                node = NodeId(node.kind, node.layer, node.position + n_prompt, node.index)
            if node.kind not in INTERVENABLE_KINDS:
                raise ValidationRunError(f"{where}: node {iv.node}: {node.kind} nodes cannot be intervened on; "
                                         f"interventions take {', '.join(sorted(INTERVENABLE_KINDS))} nodes")
            if not 0 <= node.position < n_prompt:
                raise ValidationRunError(f"{where}: node {iv.node} is at position {node.position}, outside the "
                                         f"{n_prompt}-token prompt (0-{n_prompt - 1})")
            nodes = [node]
        else:
            try:
                nodes = select_nodes(graph, iv.nodes, n_positions=n_prompt)
            except ValidationRunError as exc:
                raise ValidationRunError(f"{where}.nodes: {exc}") from None
        for node in nodes:
            unit = Unit.from_node(node)
            out.append(ResolvedIntervention(node, unit.site, unit.layer, 0 if unit.index is None else unit.index,
                                            node.position, iv.mode, value, iv.positions,
                                            _covered(iv.positions, node.position, n_prompt, n_max)))
    return out


# ---------------------------------------------------------------------------- running the model
def _node_interventions(resolved: Sequence[ResolvedIntervention], n_pos: int) -> list[Intervention]:
    ivs = []
    for r in resolved:
        site = r.site
        if r.direction is not None or not is_site(site):  # a direction's residual site is not a unit's
            continue
        units = [Unit(site, r.layer, p, r.index) for p in r.at(n_pos)]
        if not units:
            continue
        if r.mode == "zero":
            ivs.append(Intervention.zero(units))
        elif r.mode == "set":
            ivs.append(Intervention.set_to(units, r.amount))
        elif r.mode == "scale":
            ivs.append(Intervention.scaled(units, r.amount))
        else:
            ivs.append(Intervention.added(units, r.amount))
    return ivs


def _resid_hook(adapter: ModelAdapter, site: str, layer: int) -> str:
    return {"resid_pre": adapter.hook_resid_pre, "resid_mid": adapter.hook_resid_mid,
            "resid_post": adapter.hook_resid_post}[site](layer)


def _direction_hooks(adapter: ModelAdapter, resolved: Sequence[ResolvedIntervention], n_pos: int) -> list:
    hooks = []
    for r in resolved:
        if r.direction is None or not r.at(n_pos):
            continue
        pos = list(r.at(n_pos))

        def edit(x: torch.Tensor, hook: HookPointLike, r: ResolvedIntervention = r,
                 pos: list[int] = pos, direction: torch.Tensor = r.direction) -> torch.Tensor:
            d = direction.to(device=x.device, dtype=x.dtype)
            xs = x[:, pos]
            c = (xs @ d) / (d @ d)
            if r.mode == "zero":
                new = torch.zeros_like(c)
            elif r.mode == "set":
                new = torch.full_like(c, r.amount)
            else:
                new = c * r.amount if r.mode == "scale" else c + r.amount
            x = x.clone()
            x[:, pos] = xs + (new - c).unsqueeze(-1) * d
            return x

        hooks.append((_resid_hook(adapter, r.site, r.layer), edit))
    return hooks


def _freeze_hooks(adapter: ModelAdapter, patterns: dict[str, torch.Tensor] | None) -> list:
    if not patterns:
        return []

    def freeze(value: torch.Tensor, hook: HookPointLike) -> torch.Tensor:
        frozen = patterns[hook.name].to(device=value.device, dtype=value.dtype)
        T = frozen.shape[-1]
        value = value.clone()
        value[..., :T, :T] = frozen
        return value

    return [(name, freeze) for name in patterns]


@contextlib.contextmanager
def _model_with(adapter: ModelAdapter, transcoders: Dictionary | None, resolved: Sequence[ResolvedIntervention],
                n_pos: int,
                patterns: dict[str, torch.Tensor] | None, capture: set[str], captured: dict) -> Iterator[Any]:
    extra = _direction_hooks(adapter, resolved, n_pos) + _freeze_hooks(adapter, patterns)
    with intervene(adapter, _node_interventions(resolved, n_pos), n_pos=n_pos, transcoders=transcoders,
                   capture=sorted(capture), captured=captured) as model, adapter.hooks(extra):
        yield model


@dataclass
class Continuation:
    """A generated continuation: ``tokens`` (the generated ids), ``text`` (decoded, when the
    model has a tokenizer) and per step the chosen token, its probability and the ``top``
    tokens by probability (the model's, at temperature 1)."""

    tokens: list[int]
    text: str | None
    steps: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": list(self.tokens), "text": self.text, "steps": self.steps}


def _token_text(tokenizer: Tokenizer | None, token: int) -> str:
    return tokenizer.token_str(token) if tokenizer is not None else f"<{token}>"


def _choose(logits: torch.Tensor, gen: Generate, rng: torch.Generator | None) -> int:
    if gen.temperature == 0:
        return int(torch.argmax(logits))
    p = torch.softmax(logits / gen.temperature, dim=-1)
    if gen.top_p < 1.0:
        order = torch.argsort(p, descending=True, stable=True)
        sorted_p = p[order]
        before = torch.cumsum(sorted_p, 0) - sorted_p  # mass of the tokens ranked above
        keep = order[before < gen.top_p]
        q = torch.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return int(torch.multinomial(p, 1, generator=rng))


@torch.no_grad()
def _generate(adapter: ModelAdapter, transcoders: Dictionary | None, prompt: list[int],
              resolved: Sequence[ResolvedIntervention],
              gen: Generate, seed: int, patterns: dict[str, torch.Tensor] | None, metric: Metric,
              ) -> tuple[Continuation, float]:
    """The continuation and the metric on the prompt (the first step's forward pass)."""
    rng = torch.Generator().manual_seed(int(seed)) if gen.temperature > 0 else None
    tok = adapter.tokenizer
    seq = list(prompt)
    steps: list[dict[str, Any]] = []
    metric_value = float("nan")
    need = metric.hook_names(adapter, transcoders)
    for step in range(gen.max_new_tokens):
        captured: dict[str, torch.Tensor] = {}
        with _model_with(adapter, transcoders, resolved, len(seq), patterns, need if step == 0 else set(),
                         captured) as model:
            logits = model(torch.tensor([seq], dtype=torch.long, device=adapter.device))
        if step == 0:
            metric_value = float(metric.combine(metric.values(logits, captured, adapter, transcoders))[0])
        last = logits[0, -1].double().cpu()
        probs = torch.softmax(last, dim=-1)
        chosen = _choose(last, gen, rng)
        top = torch.topk(probs, min(gen.top_k, probs.numel()))
        steps.append({
            "token": chosen, "text": _token_text(tok, chosen), "probability": float(probs[chosen]),
            "top": [{"token": int(t), "text": _token_text(tok, int(t)), "probability": float(p)}
                    for p, t in zip(top.values.tolist(), top.indices.tolist(), strict=False)],
        })
        seq.append(chosen)
    new = seq[len(prompt):]
    text = None
    if tok is not None:
        try:
            text = tok.decode(new)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode: the pieces
            text = "".join(s["text"] for s in steps)
    return Continuation(new, text, steps), metric_value


def _prompt_patterns(adapter: ModelAdapter, prompt: list[int]) -> dict[str, torch.Tensor]:
    names = [adapter.hook_pattern(l) for l in range(adapter.facts.n_layers)]
    _, cache = adapter.run_with_cache(torch.tensor([prompt], dtype=torch.long, device=adapter.device), names)
    return cache


# ---------------------------------------------------------------------------- the result
@dataclass
class SteeringResult:
    """One steering item: the interventions as resolved, both continuations, the metric."""

    interventions: list[ResolvedIntervention]
    baseline: Continuation
    intervened: Continuation
    metric: dict[str, Any]
    generate: dict[str, Any]
    freeze_attention: bool
    prompt_tokens: list[int]
    name: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the intervened continuation differs from the baseline."""
        return self.baseline.tokens != self.intervened.tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "interventions": [r.to_dict() for r in self.interventions],
            "generate": self.generate,
            "freeze_attention": self.freeze_attention,
            "prompt_tokens": list(self.prompt_tokens),
            "baseline": self.baseline.to_dict(),
            "intervened": self.intervened.to_dict(),
            "changed": self.changed,
            "metric": self.metric,
            "notes": list(self.notes),
        }

    def table(self, max_rows: int = 10) -> str:
        rows = []
        for i, (b, a) in enumerate(zip(self.baseline.steps, self.intervened.steps, strict=False)):
            rows.append([i, repr(b["text"]), b["probability"], repr(a["text"]), a["probability"]])
        t = markdown_table(["step", "baseline", "p", "intervened", "p"], rows, max_rows)
        m = self.metric
        what = ", ".join(f"{r.node or f'direction@{r.site}/{r.layer}'} {r.mode}"
                         + (f" {fmt(r.value)}" if r.value is not None else "") for r in self.interventions[:4])
        if len(self.interventions) > 4:
            what += f", ... ({len(self.interventions)} in all)"
        return (f"interventions: {what}\n\n{t}\n\nbaseline: {self.baseline.text!r}\nintervened: "
                f"{self.intervened.text!r}\n\nmetric {m['name']} at the last prompt position: baseline "
                f"{fmt(m['baseline'])}, intervened {fmt(m['intervened'])}; change {fmt(m['actual'])} (graph predicts "
                f"{fmt(m['predicted_direct'])} direct, {fmt(m['predicted_total'])} total)")


def clamped_total_effects(graph: AttributionGraph, rows: Sequence[int]) -> np.ndarray:
    """Target-weighted total effects (as :func:`~circuitgraph.validation.predictions.total_effects`)
    in the graph's linear model with the nodes ``rows`` held at their intervened values: the
    edges *into* those nodes are cut, so a path from one intervened node through another is not
    counted twice.  ``(N,)`` float64; equal to ``total_effects`` for a single node."""
    clamped = np.zeros(graph.n_nodes, dtype=bool)
    clamped[list(rows)] = True
    keep = ~clamped[np.asarray(graph.edge_target)]
    cut = AttributionGraph(list(graph.nodes), np.asarray(graph.edge_target)[keep],
                           np.asarray(graph.edge_source)[keep], np.asarray(graph.edge_weight)[keep],
                           list(graph.targets), GraphMetadata(graph.metadata))
    return total_effects(cut)


def _predictions(graph: AttributionGraph, resolved: Sequence[ResolvedIntervention], n_prompt: int,
                 notes: list[str]) -> tuple[float | None, float | None]:
    """``(predicted_direct, predicted_total)``: see the module docstring."""
    D = direct_effects(graph)
    changes: dict[int, float] = {}
    ok = True
    for r in resolved:
        prompt_positions = [p for p in r.positions if p < n_prompt]
        node = r.node
        if node is None:  # a direction
            if prompt_positions:
                notes.append(f"a direction at {r.site} layer {r.layer} is not a graph node: no prediction")
                ok = False
            continue
        for p in prompt_positions:
            nid = NodeId(node.kind, node.layer, p, node.index)
            if nid not in graph:
                notes.append(f"{nid} is not a node of the graph: no prediction")
                ok = False
                continue
            row = graph.index_of(nid)
            c = r.factor(float(graph.nodes[row].activation))
            if c is None:
                notes.append(f"{nid} has activation 0: {r.mode} is not a rescaling, no prediction")
                ok = False
                continue
            if row in changes:
                notes.append(f"{nid} is intervened on more than once: no prediction")
                ok = False
                continue
            changes[row] = c - 1
    if not ok:
        return None, None
    if not changes:
        return 0.0, 0.0
    V = clamped_total_effects(graph, list(changes))
    return (float(sum(d * D[row] for row, d in changes.items())),
            float(sum(d * V[row] for row, d in changes.items())))


def steer(graph: AttributionGraph, interventions: Sequence[Any], *, generate: Generate | dict | None = None,
          freeze_attention: bool = False, seed: int | None = None, name: str | None = None,
          metric: Metric | None = None) -> SteeringResult:
    """Apply ``interventions`` (``SteerIntervention`` models or their dicts, see
    :mod:`circuitgraph.spec.steering`) to the real model behind ``graph`` and generate with and
    without them (see the module docstring).  ``seed`` (sampling only): default 0, or
    ``generate.seed`` when given.

    >>> result = steer(graph, [{"node": "feature/1/11/3", "mode": "zero"}],
    ...                generate={"max_new_tokens": 4})          # doctest: +SKIP
    >>> result.baseline.text, result.intervened.text            # doctest: +SKIP
    """
    ctx = graph_context(graph, "steer")
    adapter, tcs = ctx.adapter, ctx.transcoders
    gen = generate if isinstance(generate, Generate) else Generate(**(generate or {}))
    ivs = [iv if isinstance(iv, SteerIntervention) else SteerIntervention(**iv) for iv in interventions]
    if not ivs:
        raise ValidationRunError("steer needs at least one intervention")
    prompt = [int(t) for t in ctx.linearisation.tokens.tolist()]
    T = len(prompt)
    n_max = T + gen.max_new_tokens - 1
    if n_max > adapter.facts.n_ctx:
        raise ValidationRunError(
            f"generate.max_new_tokens: {gen.max_new_tokens} new tokens after a {T}-token prompt need "
            f"{n_max} positions, the model's context is {adapter.facts.n_ctx}; ask for at most "
            f"{adapter.facts.n_ctx - T + 1}")
    resolved = resolve(graph, ivs, T, n_max)
    metric = metric if metric is not None else Metric.from_graph(graph)
    patterns = _prompt_patterns(adapter, prompt) if freeze_attention else None
    use_seed = gen.seed if gen.seed is not None else (0 if seed is None else int(seed))
    base, m0 = _generate(adapter, tcs, prompt, [], gen, use_seed, None, metric)  # the model as it is
    after, m1 = _generate(adapter, tcs, prompt, resolved, gen, use_seed, patterns, metric)
    notes: list[str] = []
    direct, total = _predictions(graph, resolved, T, notes)
    tokenizer = adapter.tokenizer
    metric_d = {"name": metric.describe(tokenizer), "position": T - 1, "baseline": m0, "intervened": m1,
                "actual": m1 - m0, "predicted_direct": direct, "predicted_total": total}
    gen_d = gen.model_dump(mode="json")
    if gen.temperature > 0:
        gen_d["seed"] = use_seed
    return SteeringResult(resolved, base, after, metric_d, gen_d, bool(freeze_attention), prompt, name,
                          list(dict.fromkeys(notes)))


def steer_item(graph: AttributionGraph, item: SteerItem, *, seed: int = 0) -> SteeringResult:
    """One ``steer:`` item of a spec (``seed``: the spec's, for sampling without ``generate.seed``)."""
    return steer(graph, item.interventions, generate=item.generate, freeze_attention=item.freeze_attention,
                 seed=seed, name=item.name)
