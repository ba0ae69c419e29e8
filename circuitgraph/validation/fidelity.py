"""Replacement fidelity: how well the replacement model reproduces the real one.

The *replacement model* is the real model with every MLP output that has a transcoder
replaced by the transcoder's reconstruction of its live input,
``mlp_out(l) := sum_j a_j(x) W_dec[j] + b_dec (+ W_skip x)`` (for a cross-layer transcoder
the sum runs over the features of every layer ``<= l``); errors are not added back, so
they propagate to later layers (a layer without a transcoder keeps its real MLP).  On each
prompt we report, over every position:

* ``agreement``: share of positions whose top next-token prediction is the same;
* ``kl``: mean ``KL(real || replacement)`` of the next-token distributions (nats);
* ``loss`` / ``loss_replacement``: mean next-token cross-entropy of each model;
* on the graph's prompt, the target metric of each model and the *task loss*
  ``-log p(answer)`` at the target position, where the answer is the first token of the
  first logit / logit-difference target.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from circuitgraph._results import Tabular
from circuitgraph.errors import ValidationRunError
from circuitgraph.validation._common import fmt, markdown_table, resolve_prompt
from circuitgraph.validation.interventions import dictionary_out_hook
from circuitgraph.validation.metrics import Metric, next_token_loss

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.dictionaries.protocol import Dictionary
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["FidelityRow", "ReplacementFidelityResult", "replacement_model", "replacement_fidelity"]


@contextlib.contextmanager
def replacement_model(adapter: ModelAdapter, transcoders: Dictionary | None,
                      layers: Sequence[int] | None = None) -> Iterator[Any]:
    """Scoped: the real model with the MLP outputs of ``layers`` (default: every layer with a
    transcoder) replaced by their transcoders' reconstructions.  Hooks are always removed."""
    if transcoders is None or len(transcoders) == 0:
        raise ValidationRunError("the replacement model needs transcoders; none are loaded")
    layers = sorted(transcoders.layers) if layers is None else list(layers)
    inputs: dict[int, torch.Tensor] = {}
    acts: dict[int, torch.Tensor] = {}
    hooks = []
    for layer in sorted(set(layers) | {l for k in layers for l in transcoders.source_layers(k)}):
        def grab(value, hook, layer=layer):
            inputs[layer] = value
            acts[layer] = transcoders[layer].activation(value)
            return value

        hooks.append((transcoders[layer].hook_in, grab))
    for layer in layers:
        def replace(value, hook, layer=layer):
            # a cross-layer transcoder's MLP output k sums the writes of every layer <= k
            return transcoders.reconstruct_at(layer, acts, inputs).to(value.dtype)

        hooks.append((dictionary_out_hook(adapter, transcoders, layer), replace))
    with adapter.hooks(hooks) as model:
        yield model


@dataclass
class FidelityRow:
    """One prompt: agreement, KL and losses of the replacement model."""

    tokens: list[int]
    agreement: float
    kl: float
    loss: float
    loss_replacement: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(repr=False)
class ReplacementFidelityResult(Tabular):
    """Per-prompt rows and their token-weighted means, plus the target metric on the graph's prompt."""

    rows: list[FidelityRow]
    replaced_layers: list[int]
    metric: str | None = None
    metric_real: float | None = None
    metric_replacement: float | None = None
    task_loss: float | None = None
    task_loss_replacement: float | None = None
    notes: list[str] = field(default_factory=list)

    def _mean(self, key: str) -> float:
        w = [len(r.tokens) - 1 for r in self.rows]
        total = sum(w)
        return sum(getattr(r, key) * n for r, n in zip(self.rows, w, strict=False)) / total if total else float("nan")

    @property
    def agreement(self) -> float:
        n = [len(r.tokens) for r in self.rows]
        return sum(r.agreement * k for r, k in zip(self.rows, n, strict=False)) / sum(n)

    @property
    def kl(self) -> float:
        n = [len(r.tokens) for r in self.rows]
        return sum(r.kl * k for r, k in zip(self.rows, n, strict=False)) / sum(n)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replaced_layers": self.replaced_layers,
            "agreement": self.agreement,
            "kl": self.kl,
            "loss": self._mean("loss"),
            "loss_replacement": self._mean("loss_replacement"),
            "metric": self.metric,
            "metric_real": self.metric_real,
            "metric_replacement": self.metric_replacement,
            "task_loss": self.task_loss,
            "task_loss_replacement": self.task_loss_replacement,
            "notes": self.notes,
            "rows": [r.to_dict() for r in self.rows],
        }

    def table(self, max_rows: int = 10) -> str:
        t = markdown_table(["prompt tokens", "agreement", "KL", "loss", "loss (replacement)"],
                           [[len(r.tokens), r.agreement, r.kl, r.loss, r.loss_replacement] for r in self.rows],
                           max_rows)
        lines = [t, "", f"overall: agreement {fmt(self.agreement)}, KL {fmt(self.kl)} nats, loss "
                 f"{fmt(self._mean('loss'))} -> {fmt(self._mean('loss_replacement'))} with MLPs of layers "
                 f"{self.replaced_layers} replaced"]
        if self.metric is not None:
            lines.append(f"target {self.metric}: {fmt(self.metric_real)} -> {fmt(self.metric_replacement)}; task loss "
                         f"{fmt(self.task_loss)} -> {fmt(self.task_loss_replacement)}")
        return "\n".join(lines)


def _answer(metric: Metric) -> tuple[int, int] | None:
    for r in metric.readouts:
        if r.kind in ("logit", "logit_diff"):
            return r.tokens[0], r.position
    return None


@torch.no_grad()
def replacement_fidelity(
    graph: AttributionGraph | None = None,
    *,
    prompts: Sequence[Any] = (),
    adapter: ModelAdapter | None = None,
    transcoders: Dictionary | None = None,
    metric: Metric | None = None,
    tokenizer: Tokenizer | None = None,
) -> ReplacementFidelityResult:
    """Real vs replacement model on the graph's prompt (when a graph is given) and ``prompts``."""
    token_lists: list[list[int]] = []
    if graph is not None and graph.context is not None:
        ctx = graph.context
        adapter = adapter or ctx.adapter
        transcoders = transcoders if transcoders is not None else ctx.transcoders
        token_lists.append(ctx.linearisation.tokens.tolist())
        if metric is None and ctx.targets:
            metric = Metric.from_graph(graph)
    if adapter is None:
        raise ValidationRunError("replacement_fidelity needs a graph with its model, or adapter= and transcoders=")
    tokenizer = tokenizer if tokenizer is not None else adapter.tokenizer
    token_lists += [resolve_prompt(p, tokenizer, where=f"replacement_fidelity.prompts[{i}]")
                    for i, p in enumerate(prompts)]
    if not token_lists:
        raise ValidationRunError("replacement_fidelity: no prompt; give a graph or prompts=[...]")
    layers = sorted(transcoders.layers) if transcoders is not None else []
    notes = []
    missing = [l for l in range(adapter.facts.n_layers) if l not in layers]
    if missing:
        notes.append(f"layers {missing} have no transcoder and keep their real MLP")
    rows = []
    result = ReplacementFidelityResult(rows, layers, notes=notes)
    for i, toks in enumerate(token_lists):
        x = torch.tensor([toks], dtype=torch.long, device=adapter.device)
        real = adapter.model(x)
        with replacement_model(adapter, transcoders) as model:
            repl = model(x)
        lp, lq = F.log_softmax(real[0].double(), -1), F.log_softmax(repl[0].double(), -1)
        kl = (lp.exp() * (lp - lq)).sum(-1).mean().item()
        agree = (real[0].argmax(-1) == repl[0].argmax(-1)).double().mean().item()
        if len(toks) > 1:
            loss, loss_r = next_token_loss(real, x[0]).item(), next_token_loss(repl, x[0]).item()
        else:
            loss = loss_r = float("nan")
        rows.append(FidelityRow(list(toks), agree, kl, loss, loss_r))
        if i == 0 and graph is not None and metric is not None:
            result.metric = metric.describe(tokenizer)
            need = metric.hook_names(adapter, transcoders)
            result.metric_real = _metric_value(adapter, x, metric, need, transcoders, None)
            result.metric_replacement = _metric_value(adapter, x, metric, need, transcoders, transcoders)
            ans = _answer(metric)
            if ans is not None:
                tok, pos = ans
                result.task_loss = -lp[pos, tok].item()
                result.task_loss_replacement = -lq[pos, tok].item()
    return result


def _metric_value(adapter: ModelAdapter, x: torch.Tensor, metric: Metric, need: set[str],
                  transcoders: Dictionary | None,
                  replace_with: Any) -> float:
    captured: dict[str, torch.Tensor] = {}

    def keep(value, hook):
        captured[hook.name] = value
        return value

    if replace_with is not None:
        ctx = replacement_model(adapter, replace_with)
    else:
        ctx = contextlib.nullcontext(adapter.model)
    with ctx as model, model.hooks(fwd_hooks=[(n, keep) for n in need]):
        logits = model(x)
    return float(metric.combine(metric.values(logits, captured, adapter, transcoders))[0])
