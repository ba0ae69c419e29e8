"""Faithfulness curves: the metric's recovery as a function of circuit size, with MIB's CPR and CMD.

For each size ``f`` (a fraction of the graph's nodes or edges) the circuit keeps the top
``ceil(f N)`` by the graph's ranking and everything else of the graph is ablated **in the real
model**; the recovery is ``(m(circuit) - m(empty)) / (m(full) - m(empty))`` with ``m(full)`` the
clean metric (nothing ablated) and ``m(empty)`` the metric with every node (or edge) of the graph
ablated.  Size 0 is the empty circuit (recovery 0), size 1 the whole graph (recovery 1, exactly:
nothing is ablated).

* ``unit: nodes``: nodes ranked by influence on the targets (circuit-tracer's node influence);
  an ablated node is intervened on with the existing intervention machinery
  (:mod:`~circuitgraph.validation.interventions`): ``zero``, ``mean`` over ``reference_prompts``
  (or over the prompt's own positions but the first, when none are given) or ``patch`` from
  ``patch_prompt``; everything downstream runs as the real model does.  Works for every
  granularity (features, neurons, heads, whole MLPs).
* ``unit: edges``: edges ranked by circuit-tracer's edge score (``|w| / sum of |w|`` into the
  reader, times the reader's influence plus its target weight).  Ablating an edge ``u -> r``
  patches that edge's contribution at its reader in the real model: ``r``'s pre-activation is
  shifted by ``-w`` (zero ablation; ``w`` is the edge's exact direct effect in the linearisation
  on the prompt), every other input of ``r`` and every other reader unchanged, and the real
  model runs on from there (a neuron's shifted pre-activation goes through its nonlinearity; a
  target's shift is its readout's; a transcoder feature's shifted pre-activation gives it a new
  activation, whose difference times its decoder row is spliced into the MLP output, its error
  node unchanged).  For component graphs (heads and whole MLPs as vector nodes, attention
  patterns frozen in the graph) the only readers are the targets, so an edge ablation removes
  exactly that writer's direct contribution to the readout.  ``ablation: mean`` and ``patch``
  replace the edge's value by its value on reference prompts instead of 0 (as MIB and EAP
  patch edges): the reader receives ``pre_r - sum(ablated clean edges) + sum(ablated reference
  edges)``.  The reference value of ``u -> r`` is the weight of the edge with the same writer and
  reader in the graph attributed on the reference prompt with the same options and targets
  (``u``'s output on that prompt times the frozen paths of that prompt's linearisation):
  ``patch`` takes it from ``patch_prompt``, ``mean`` averages it over ``reference_prompts``.
  Edges are matched by node identity (kind, layer, position, index) at the same positions, an
  embedding by its position only (its index is the token); an edge absent from a reference
  graph has reference value 0.  As for zero ablation the shift is added to the reader's live
  input and the real model runs on, and the reader's own constant stays the clean prompt's (it
  carries folded writers through frozen norms), so the empty circuit is not the reference
  prompt's forward pass.  Edge ablation supports readers that are targets, neurons and
  per-layer ReLU/JumpReLU transcoder features.

The curve's areas (MIB, Mueller et al. 2025), by the trapezoid rule over the sizes with the
points ``(0, 0)`` and ``(1, 1)`` added at the ends when they are missing: ``CPR`` = the area
under the recovery curve (higher is better), ``CMD`` = the area between the curve and 1,
``integral |1 - recovery|`` (0 is best).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from circuitgraph._io import atomic_write_bytes
from circuitgraph.attribution.build import build_graph
from circuitgraph.attribution.linearisation import linearise
from circuitgraph.dictionaries.protocol import require_dictionary
from circuitgraph.errors import ValidationRunError
from circuitgraph.queries.influence import node_influence
from circuitgraph.validation._common import graph_context, markdown_table, resolve_prompt
from circuitgraph.validation.interventions import NODE_SITES, Intervention, Unit, dictionary_out_hook, run_rows
from circuitgraph.validation.metrics import Metric

if TYPE_CHECKING:
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.graph.graph import AttributionGraph

if TYPE_CHECKING:  # pragma: no cover
    from circuitgraph.attribution.context import AttributionContext

__all__ = ["FaithfulnessCurveResult", "faithfulness_curve", "curve_areas", "plot_faithfulness_curve",
           "DEFAULT_SIZES"]

#: MIB's circuit sizes (fractions of the graph's edges or nodes)
DEFAULT_SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def curve_areas(sizes: Sequence[float], recovery: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: the trapezoid areas under the curve and between it and 1, over [0, 1]
    with ``(0, 0)`` and ``(1, 1)`` added where the sizes do not reach the ends."""
    x = [float(s) for s in sizes]
    y = [float(r) for r in recovery]
    order = np.argsort(x, kind="mergesort")
    x, y = [x[i] for i in order], [y[i] for i in order]
    if not x or x[0] > 0:
        x, y = [0.0] + x, [0.0] + y
    if x[-1] < 1:
        x, y = x + [1.0], y + [1.0]
    xa, ya = np.asarray(x), np.asarray(y)
    dx = np.diff(xa)
    cpr = float(np.sum(dx * (ya[1:] + ya[:-1]) / 2))
    gap = np.abs(1.0 - ya)
    cmd = float(np.sum(dx * (gap[1:] + gap[:-1]) / 2))
    return cpr, cmd


@dataclass
class FaithfulnessCurveResult:
    unit: str
    ablation: str
    metric: str
    sizes: list[float]
    n_kept: list[int]
    n_total: int
    values: list[float]  #: the metric at each size
    recovery: list[float | None]
    full: float  #: the clean metric (nothing ablated)
    empty: float  #: every node (edge) of the graph ablated
    cpr: float | None
    cmd: float | None
    notes: list[str] = field(default_factory=list)
    plot: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "ablation": self.ablation, "metric": self.metric, "n_total": self.n_total,
                "full": self.full, "empty": self.empty, "cpr": self.cpr, "cmd": self.cmd,
                "points": [{"size": s, "n_kept": k, "metric": v, "recovery": r}
                           for s, k, v, r in zip(self.sizes, self.n_kept, self.values, self.recovery, strict=False)],
                "notes": self.notes, "plot": self.plot}

    def table(self, max_rows: int = 20) -> str:
        head = (f"{self.unit}, {self.ablation} ablation, metric {self.metric}: full {self.full:.4g}, empty "
                f"{self.empty:.4g}, CPR {_f(self.cpr)}, CMD {_f(self.cmd)}\n\n")
        return head + markdown_table(["size", f"{self.unit} kept", "metric", "recovery"],
                                     [[s, k, v, r] for s, k, v, r in zip(self.sizes, self.n_kept, self.values,
                                                                          self.recovery, strict=False)], max_rows)


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _node_ranking(graph: AttributionGraph) -> list[Any]:
    """The graph's nodes that are units of the model, most influential first (ties: graph order)."""
    infl = node_influence(graph)
    rows = [i for i, n in enumerate(graph.nodes) if n.kind in NODE_SITES]
    rows.sort(key=lambda i: -abs(float(infl[i])))
    return [graph.nodes[i].id for i in rows]


def _edge_ranking(graph: AttributionGraph) -> np.ndarray:
    """Edge indices (into the graph's edge arrays), highest circuit-tracer edge score first."""
    infl = node_influence(graph)
    w = np.abs(np.asarray(graph.edge_weight, dtype=np.float64))
    tgt = np.asarray(graph.edge_target, dtype=np.int64)
    row_sum = np.bincount(tgt, weights=w, minlength=graph.n_nodes)
    tw = np.zeros(graph.n_nodes)
    for t, weight in graph.targets:
        tw[graph.index_of(t)] += abs(weight)
    score = np.divide(w, row_sum[tgt], out=np.zeros_like(w), where=row_sum[tgt] > 0) * (np.abs(infl[tgt]) + tw[tgt])
    return np.argsort(-score, kind="mergesort")


def _ablation_kw(mode: str, reference: Sequence[Any], patch_prompt: Any, tokenizer: Tokenizer | None, tokens: list[int],
                 notes: list[str]) -> dict[str, Any]:
    if mode == "zero":
        return {}
    if mode == "mean":
        if reference:
            refs = tuple(tuple(resolve_prompt(p, tokenizer, where=f"reference_prompts[{i}]"))
                         for i, p in enumerate(reference))
            return dict(reference=refs, pooling="auto")
        notes.append("no reference prompts: mean over the prompt's own positions (but the first)")
        return dict(reference=(tuple(tokens),), pooling="all")
    if mode == "patch":
        if patch_prompt is None:
            raise ValidationRunError("faithfulness_curve: ablation: patch needs patch_prompt")
        return dict(patch=tuple(resolve_prompt(patch_prompt, tokenizer, where="patch_prompt")))
    raise ValidationRunError(f"faithfulness_curve ablation {mode!r}: expected zero, mean or patch")


def _counts(sizes: Sequence[float], n: int) -> list[int]:
    return [min(n, int(math.ceil(float(s) * n - 1e-9))) for s in sizes]


def faithfulness_curve(
    graph: AttributionGraph,
    *,
    sizes: Sequence[float] = DEFAULT_SIZES,
    ablation: Literal["zero", "mean", "patch"] = "zero",
    unit: Literal["edges", "nodes"] = "edges",
    reference_prompts: Sequence[Any] = (),
    patch_prompt: Any = None,
    metric: Metric | None = None,
    plot: str | None = None,
    tokenizer: Tokenizer | None = None,
) -> FaithfulnessCurveResult:
    """The faithfulness curve of ``graph`` (module docstring)."""
    ctx = graph_context(graph, "faithfulness_curve")
    a = ctx.adapter
    tokenizer = tokenizer if tokenizer is not None else a.tokenizer
    metric = metric if metric is not None else Metric.from_graph(graph)
    tokens = ctx.linearisation.tokens.tolist()
    sizes = [float(s) for s in sizes]
    if any(not 0 <= s <= 1 for s in sizes):
        raise ValidationRunError(f"faithfulness_curve sizes must lie in [0, 1], got {sizes}")
    notes: list[str] = []
    if unit == "nodes":
        ranked = _node_ranking(graph)
        if not ranked:
            raise ValidationRunError("faithfulness_curve: the graph has no node that maps to a unit of the model")
        kw = _ablation_kw(ablation, reference_prompts, patch_prompt, tokenizer, tokens, notes)
        units = [Unit.from_node(n) for n in ranked]
        counts = _counts(sizes, len(units))
        rows: list[list[Intervention]] = [[], [Intervention(tuple(units), ablation, **kw)]]
        rows += [[Intervention(tuple(units[k:]), ablation, **kw)] if k < len(units) else [] for k in counts]
        out = run_rows(a, tokens, rows, metric, transcoders=ctx.transcoders).metric.tolist()
        full, empty, values = out[0], out[1], out[2:]
        n_total = len(units)
    elif unit == "edges":
        order = _edge_ranking(graph)
        n_total = len(order)
        if not n_total:
            raise ValidationRunError("faithfulness_curve: the graph has no edges")
        ref = _edge_reference_values(ctx, graph, _edge_reference_prompts(ablation, reference_prompts, patch_prompt,
                                                                         tokenizer))
        counts = _counts(sizes, n_total)
        full = _edge_ablated_metric(ctx, graph, metric, np.zeros(0, dtype=np.int64), ref)
        empty = _edge_ablated_metric(ctx, graph, metric, order, ref)
        values = [full if k == n_total else _edge_ablated_metric(ctx, graph, metric, order[k:], ref) for k in counts]
    else:
        raise ValidationRunError(f"faithfulness_curve unit {unit!r}: expected edges or nodes")
    d = full - empty
    recovery = [None if d == 0 else (v - empty) / d for v in values]
    recovery = [1.0 if k == n_total and r is not None else r for k, r in zip(counts, recovery, strict=False)]
    cpr = cmd = None
    if d != 0:
        cpr, cmd = curve_areas(sizes, [r for r in recovery if r is not None])  # none is None when d != 0
    else:
        notes.append("the fully ablated metric equals the clean one: recovery is undefined")
    result = FaithfulnessCurveResult(unit, ablation, metric.describe(tokenizer), sizes, counts, n_total, values,
                                     recovery, full, empty, cpr, cmd, notes)
    if plot is not None:
        result.plot = plot_faithfulness_curve(result, plot)
    return result


def _act_of_pre(tc: Any, h: torch.Tensor) -> torch.Tensor:
    """A per-layer transcoder's activation as a function of its pre-activation: JumpReLU with its
    threshold, else ReLU (the caller checks it against the dictionary's own activation)."""
    if tc.threshold is not None:
        return h * (h > tc.threshold.to(h.dtype))
    return torch.relu(h)


def _edge_reference_prompts(mode: str, reference: Sequence[Any], patch_prompt: Any,
                            tokenizer: Tokenizer | None) -> list[list[int]] | None:
    """The prompts whose edge values replace the ablated edges' (None: zero ablation)."""
    if mode == "zero":
        return None
    if mode == "mean":
        if not reference:
            raise ValidationRunError("faithfulness_curve: unit: edges with ablation: mean needs reference_prompts "
                                     "(the edges' values are averaged over them); add reference_prompts")
        return [resolve_prompt(p, tokenizer, where=f"reference_prompts[{i}]") for i, p in enumerate(reference)]
    if mode == "patch":
        if patch_prompt is None:
            raise ValidationRunError("faithfulness_curve: ablation: patch needs patch_prompt")
        return [resolve_prompt(patch_prompt, tokenizer, where="patch_prompt")]
    raise ValidationRunError(f"faithfulness_curve ablation {mode!r}: expected zero, mean or patch")


_PAIR = np.int64(1) << 31  # node codes stay below 2**31


def _edge_key(node_id: Any) -> tuple[str, int, int, int]:
    """A writer's or reader's identity across prompts: an embedding by its position (its index is
    the prompt's token), every other node by kind, layer, position and index."""
    return (node_id.kind, node_id.layer, node_id.position, -1 if node_id.kind == "embedding" else node_id.index)


def _edge_reference_values(ctx: AttributionContext, graph: AttributionGraph,
                           prompts: list[list[int]] | None) -> np.ndarray | None:
    """Per edge of ``graph``, the mean over ``prompts`` of the same edge's weight in the graph
    attributed on each prompt with the graph's options and targets (0 where a prompt's graph
    lacks the edge)."""
    if prompts is None:
        return None
    codes: dict[tuple[str, int, int, int], int] = {}

    def pairs(g: Any) -> np.ndarray:  # (writer, reader) identities as one int64 per edge
        node = np.array([codes.setdefault(_edge_key(n.id), len(codes)) for n in g.nodes], dtype=np.int64)
        return node[np.asarray(g.edge_source, dtype=np.int64)] * _PAIR + node[np.asarray(g.edge_target, dtype=np.int64)]

    clean, inverse, multiplicity = np.unique(pairs(graph), return_inverse=True, return_counts=True)
    last = max((t.position for t in ctx.targets), default=0)
    total = np.zeros(len(clean))
    for i, tokens in enumerate(prompts):
        if len(tokens) <= last:
            raise ValidationRunError(f"faithfulness_curve: reference prompt {i} has {len(tokens)} tokens, the targets "
                                     f"read position {last}; use reference prompts at least {last + 1} tokens long")
        lin = linearise(ctx.adapter, torch.tensor(tokens), ctx.transcoders)
        ref = build_graph(ctx.adapter, lin, ctx.transcoders, ctx.targets, ctx.options)
        found, where = np.unique(pairs(ref), return_inverse=True)
        summed = np.bincount(where, weights=np.asarray(ref.edge_weight, dtype=np.float64), minlength=len(found))
        at = np.minimum(np.searchsorted(found, clean), max(len(found) - 1, 0))
        hit = (found[at] == clean) if len(found) else np.zeros(len(clean), dtype=bool)
        total += np.where(hit, summed[at] if len(found) else 0.0, 0.0)
    # a pair that occurs several times in the graph shares its reference value evenly
    total = total[inverse] / multiplicity[inverse]
    return total / len(prompts)


@torch.no_grad()
def _edge_ablated_metric(ctx: AttributionContext, graph: AttributionGraph, metric: Metric, ablated: np.ndarray,
                         reference: np.ndarray | None = None) -> float:
    """The real model's metric with the edges ``ablated`` (indices into the graph's edge arrays)
    replaced at their readers by their ``reference`` values (0 when None): each reader's
    pre-activation shifted by the sum of ``reference - w`` (a neuron's at ``hook_mlp_pre``, or its
    activation for gated MLPs; a transcoder feature's pre-activation, its new activation spliced
    into the MLP output; a target's readout)."""
    a, tcs = ctx.adapter, ctx.transcoders
    tgt = np.asarray(graph.edge_target, dtype=np.int64)[ablated]
    w = np.asarray(graph.edge_weight, dtype=np.float64)[ablated]
    if reference is not None:
        w = w - reference[ablated]
    shift = np.bincount(tgt, weights=-w, minlength=graph.n_nodes)
    target_rows = [graph.index_of(t) for t, _ in graph.targets]
    T = ctx.linearisation.n_pos
    per_layer: dict[str, torch.Tensor] = {}
    features: dict[int, list[tuple[int, int, float]]] = {}
    for row in np.flatnonzero(shift).tolist():
        node = graph.nodes[row].id
        if row in target_rows:
            continue
        if node.kind == "neuron":
            name = a.hook_mlp_post(node.layer) if a.facts.gated_mlp else a.hook_mlp_pre(node.layer)
            d = per_layer.setdefault(name, torch.zeros(T, a.facts.d_mlp, dtype=torch.float64))
            d[node.position, node.index] += shift[row]
        elif node.kind == "feature" and tcs is not None and getattr(tcs, "kind", "per_layer") == "per_layer" \
                and (tcs[node.layer].activation_kind != "topk"):
            features.setdefault(node.layer, []).append((node.position, node.index, float(shift[row])))
        else:
            raise ValidationRunError(
                f"faithfulness_curve: unit: edges ablates edges at their readers; {node.kind} readers ({node}) "
                "are supported for neurons, targets and per-layer ReLU/JumpReLU transcoder features; use unit: nodes")
    need = metric.hook_names(a, tcs)
    captured: dict[str, torch.Tensor] = {}

    def add(delta: torch.Tensor):
        return lambda value, hook: value + delta.to(device=value.device, dtype=value.dtype)[None]

    def keep(value, hook):
        captured[hook.name] = value
        return value

    def splice(layer: int, items: list[tuple[int, int, float]]):
        dictionaries = require_dictionary(tcs, "a feature edge")
        tc = dictionaries[layer]
        pos = torch.tensor([p for p, _, _ in items])
        idx = torch.tensor([j for _, j, _ in items])
        delta = torch.tensor([d for _, _, d in items], dtype=torch.float64)

        def fn(value, hook):
            x = captured[tc.hook_in]  # the live input of this forward pass
            pre = tc.pre_activation(x)[:, pos, idx]  # (B, n)
            live = tc.activation(x)[:, pos, idx].to(pre.dtype)
            if not torch.allclose(_act_of_pre(tc, pre), live, rtol=1e-4, atol=1e-5):
                raise ValidationRunError(f"faithfulness_curve: layer {layer}'s dictionary is not a ReLU or JumpReLU "
                                         "of its pre-activation; use unit: nodes")
            new = _act_of_pre(tc, pre + delta.to(device=pre.device, dtype=pre.dtype)[None])
            dec = dictionaries.decoder_rows(layer, idx)[:, 0].to(device=value.device, dtype=value.dtype)  # (n, d_model)
            out = value.clone()
            out.index_add_(1, pos.to(value.device), (new - live).to(value.dtype)[..., None] * dec[None])
            return out

        return fn

    hooks = [(name, add(d)) for name, d in per_layer.items()]
    for layer in features:
        need = need | {require_dictionary(tcs, "a feature edge")[layer].hook_in}
    hooks += [(n, keep) for n in sorted(need)]
    hooks += [(dictionary_out_hook(a, require_dictionary(tcs, "a feature edge"), layer), splice(layer, items))
              for layer, items in features.items()]
    with a.hooks(hooks) as model:
        logits = model(torch.tensor([ctx.linearisation.tokens.tolist()], device=a.device))
    vals = metric.values(logits, captured, a, tcs)[0]
    if len(vals) != len(target_rows):
        raise ValidationRunError("faithfulness_curve: unit: edges needs the graph's own targets as the metric")
    vals = vals + torch.tensor([shift[r] for r in target_rows], dtype=vals.dtype, device=vals.device)
    return float(metric.combine(vals[None])[0])


def plot_faithfulness_curve(result: FaithfulnessCurveResult, path: str) -> str:
    """The recovery curve (log size axis) as an image (matplotlib, the optional ``plots`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - an optional extra
        raise ValidationRunError("faithfulness_curve plot needs matplotlib: pip install 'circuitgraph-lm[plots]'") from None
    fig, ax = plt.subplots(figsize=(5, 3.2))
    xs = [s for s, r in zip(result.sizes, result.recovery, strict=False) if r is not None and s > 0]
    ys = [r for s, r in zip(result.sizes, result.recovery, strict=False) if r is not None and s > 0]
    ax.plot(xs, ys, marker="o")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel(f"fraction of {result.unit} kept")
    ax.set_ylabel("recovery")
    ax.set_title(f"CPR {_f(result.cpr)}, CMD {_f(result.cmd)} ({result.ablation})")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.rsplit(".", 1)[-1] if "." in path else "png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return str(path)
