"""Activation patching between a clean and a corrupted prompt, with relative recovery.

The model runs on the *corrupted* prompt with one unit's activation copied from the *clean*
run (denoising), and each patch is scored by its relative recovery::

    recovery = (patched - corrupted) / (clean - corrupted)

so 1 means the patch alone restores the clean metric and 0 means it changes nothing
(the convention of the GPT-2 "a/an" neuron study).  Granularities, one sweep each:

* ``position``: the residual stream (``resid_pre`` of each layer, and the final
  ``resid_post``) at each position: a (layers + 1) x positions grid;
* ``layer``: each attention layer's and each MLP's output at each position (two
  layers x positions grids), and at every position at once;
* ``head``: each head's ``z`` at every position: a layers x heads grid;
* ``neuron``: each MLP neuron (``hook_post``) at every position, for the neurons whose
  activations differ between the prompts (the others recover exactly 0);
* ``feature``: each transcoder feature (spliced), at every position, for the features
  active on either prompt.

``layers`` limits the layer, head, neuron and feature sweeps to those layers (a neuron sweep
of a 30-layer model is ~46,000 patches; one layer ~1,500).  A neuron sweep also patches each
swept layer's whole MLP output (at every position), so every neuron row carries
``share_of_layer``: its recovery over its MLP layer's (the GPT-2 a/an neuron: one neuron
recovering about as much as its whole layer).  ``sets`` patch chosen units together (e.g. one
neuron, or a layer's top neurons), one row each (granularity ``set``).

Two sanity rows are always run: patching every position of the residual stream before
layer 0 recovers exactly 1, patching nothing exactly 0.  A heat map (layers x positions and
layers x heads panels) can be written as PNG/SVG/PDF, atomically.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from circuitgraph._io import atomic_write_bytes
from circuitgraph._results import Tabular
from circuitgraph.errors import ValidationRunError
from circuitgraph.validation._common import fmt, markdown_table, resolve_prompt
from circuitgraph.validation.interventions import Intervention, Unit, _cache_run, run_rows, site_values
from circuitgraph.validation.metrics import Metric

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.dictionaries.protocol import Dictionary
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["Granularity", "PatchRow", "PatchGrid", "PatchingResult", "patching", "patch_recovery", "write_heatmap"]

Granularity = Literal["layer", "head", "neuron", "feature", "position"]
GRANULARITIES: tuple[str, ...] = ("layer", "head", "neuron", "feature", "position")
#: the granularity of the rows of ``sets`` (units patched together)
SET = "set"


@dataclass
class PatchRow:
    """One patch: what was patched (a unit string, ``*`` = every position/index) and its recovery."""

    granularity: str
    unit: str
    layer: int
    position: int | None
    index: int | None
    patched: float
    recovery: float
    share_of_layer: float | None = None  # neuron rows: recovery / the whole MLP layer's

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PatchGrid:
    """A 2-D panel of recoveries: ``values[i][j]`` for row label ``rows[i]``, column ``columns[j]``."""

    name: str
    rows: list[str]
    columns: list[str]
    values: list[list[float]]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "columns": self.columns, "values": self.values}


@dataclass(repr=False)
class PatchingResult(Tabular):
    """Recoveries of every sweep, the grids behind the heat map, and the two sanity rows."""

    clean_tokens: list[int]
    corrupted_tokens: list[int]
    metric: str
    clean: float
    corrupted: float
    rows: list[PatchRow]
    grids: list[PatchGrid]
    recovery_everything: float
    recovery_nothing: float
    heatmap: str | None = None
    notes: list[str] = field(default_factory=list)

    def rows_of(self, granularity: str) -> list[PatchRow]:
        return [r for r in self.rows if r.granularity == granularity]

    def grid(self, name: str) -> PatchGrid:
        for g in self.grids:
            if g.name == name:
                return g
        raise KeyError(f"no grid {name!r}; grids: {[g.name for g in self.grids]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean_tokens": self.clean_tokens,
            "corrupted_tokens": self.corrupted_tokens,
            "metric": self.metric,
            "clean": self.clean,
            "corrupted": self.corrupted,
            "recovery_everything": self.recovery_everything,
            "recovery_nothing": self.recovery_nothing,
            "heatmap": self.heatmap,
            "notes": self.notes,
            "grids": [g.to_dict() for g in self.grids],
            "rows": [r.to_dict() for r in self.rows],
        }

    def table(self, max_rows: int = 10) -> str:
        head = (f"metric {self.metric}: clean {fmt(self.clean)}, corrupted {fmt(self.corrupted)}; sanity: patching "
                f"everything recovers {fmt(self.recovery_everything)}, nothing {fmt(self.recovery_nothing)}")
        parts = [head]
        for gran in GRANULARITIES + (SET,):
            rows = sorted(self.rows_of(gran), key=lambda r: -abs(r.recovery))
            if rows and gran == "neuron":
                parts.append(f"\n{gran} (ranked by |recovery|; share of layer = recovery / its MLP layer's):\n\n"
                             + markdown_table(["unit", "patched", "recovery", "share of layer"],
                                              [[r.unit, r.patched, r.recovery, r.share_of_layer] for r in rows],
                                              max_rows))
            elif rows:
                parts.append(f"\n{gran}:\n\n" + markdown_table(["unit", "patched", "recovery"],
                                                               [[r.unit, r.patched, r.recovery] for r in rows],
                                                               max_rows))
        return "\n".join(parts)


def _recovery(patched: torch.Tensor, clean: float, corrupted: float) -> list[float]:
    return ((patched - corrupted) / (clean - corrupted)).tolist()


def patch_recovery(adapter: ModelAdapter, clean: Sequence[int], corrupted: Sequence[int], units_sets: Sequence[Sequence[Unit]],
                   metric: Metric, *, transcoders: Dictionary | None = None, batch_size: int = 64) -> list[float]:
    """Relative recovery of each unit set patched from ``clean`` into ``corrupted`` at once."""
    clean, corrupted = list(clean), list(corrupted)
    _check_lengths(clean, corrupted)
    rows = [[]] + [([Intervention.patched(tuple(u), clean)] if u else []) for u in units_sets]
    c = run_rows(adapter, clean, [[]], metric, transcoders=transcoders).metric[0].item()
    out = run_rows(adapter, corrupted, rows, metric, transcoders=transcoders, batch_size=batch_size).metric
    x = out[0].item()
    _check_denominator(c, x)
    return _recovery(out[1:], c, x)


def _check_lengths(clean: list[int], corrupted: list[int]) -> None:
    if len(clean) != len(corrupted):
        raise ValidationRunError(
            f"patching: the corrupted prompt has {len(corrupted)} tokens and the clean prompt {len(clean)}; "
            "activations are patched position by position, so both prompts must have the same token length: "
            "change words that split into several tokens, or pad the shorter prompt"
        )


def _check_denominator(clean: float, corrupted: float) -> None:
    if clean == corrupted or abs(clean - corrupted) <= 1e-9 * max(abs(clean), abs(corrupted), 1.0):
        raise ValidationRunError(
            f"patching: the metric is {clean:.6g} on both the clean and the corrupted prompt, so relative recovery "
            "(patched - corrupted) / (clean - corrupted) is undefined; choose a corrupted prompt that changes the "
            "answer, or another metric"
        )


def patching(
    graph: AttributionGraph | None = None,
    *,
    corrupted: Any,
    clean: Any = None,
    metric: Metric | None = None,
    granularity: Sequence[Granularity] = ("layer", "head"),
    heatmap: str | Path | None = None,
    adapter: ModelAdapter | None = None,
    transcoders: Dictionary | None = None,
    tokenizer: Tokenizer | None = None,
    batch_size: int = 64,
    layers: Sequence[int] | None = None,
    sets: Sequence[Sequence[Unit]] = (),
    set_names: Sequence[str] | None = None,
) -> PatchingResult:
    """Patch clean activations into the corrupted run at each granularity (module docstring).

    ``clean`` defaults to the graph's prompt and ``metric`` to the graph's targets; without a
    graph give ``adapter`` (and ``transcoders`` for features), ``clean`` and ``metric``.
    """
    if graph is not None and graph.context is not None:
        ctx = graph.context
        adapter = adapter or ctx.adapter
        transcoders = transcoders if transcoders is not None else ctx.transcoders
        if clean is None:
            clean = ctx.linearisation.tokens.tolist()
        if metric is None:
            metric = Metric.from_graph(graph)
    if adapter is None or clean is None or metric is None:
        raise ValidationRunError("patching needs a graph with its model, or adapter=, clean= and metric=")
    for g in granularity:
        if g not in GRANULARITIES:
            raise ValidationRunError(f"unknown patching granularity {g!r}; expected one of {', '.join(GRANULARITIES)}")
    tokenizer = tokenizer if tokenizer is not None else adapter.tokenizer
    clean_t = resolve_prompt(clean, tokenizer, where="patching.clean")
    corrupt_t = resolve_prompt(corrupted, tokenizer, where="patching.corrupted")
    _check_lengths(clean_t, corrupt_t)
    f = adapter.facts
    L, T, H = f.n_layers, len(clean_t), f.n_heads
    swept = list(range(L)) if layers is None else sorted(set(layers))
    bad = [l for l in swept if not 0 <= l < L]
    if bad:
        raise ValidationRunError(f"patching layers {bad} requested, the model has {L} layers (0-{L - 1})")
    if set_names is not None and len(set_names) != len(sets):
        raise ValidationRunError(f"patching: {len(set_names)} set names for {len(sets)} sets; give one name per set")
    c_val = run_rows(adapter, clean_t, [[]], metric, transcoders=transcoders).metric[0].item()

    # every sweep is a list of (granularity, unit set, layer, position, index, label)
    jobs: list[tuple[str, tuple[Unit, ...], int, int | None, int | None, str]] = []
    sanity = [tuple(Unit("resid_pre", 0, t) for t in range(T)), ()]
    notes: list[str] = []
    if "position" in granularity:
        for layer in range(L + 1):
            for t in range(T):
                jobs.append(("position", (Unit("resid_pre", layer, t),), layer, t, None,
                             f"resid_pre/{layer}/{t}" if layer < L else f"resid_post/{L - 1}/{t}"))
    if "layer" in granularity:
        for site in ("attn", "mlp"):
            for layer in swept:
                for t in range(T):
                    jobs.append(("layer", (Unit(site, layer, t),), layer, t, None, f"{site}/{layer}/{t}"))
                jobs.append(("layer", (Unit(site, layer, None),), layer, None, None, f"{site}/{layer}/*"))
    if "head" in granularity:
        for layer in swept:
            for h in range(H):
                jobs.append(("head", (Unit("head", layer, None, h),), layer, None, h, f"head/{layer}/*/{h}"))
    if "neuron" in granularity or "feature" in granularity:
        names: set[str] = set()
        for layer in swept:
            names.add(adapter.hook_mlp_post(layer))
            if transcoders is not None and layer in transcoders:
                names.add(transcoders[layer].hook_in)
        cc, xc = _cache_run(adapter, clean_t, names), _cache_run(adapter, corrupt_t, names)
    if "neuron" in granularity:
        for layer in swept:
            if "layer" not in granularity:  # the whole layer, for each neuron's share of it
                jobs.append(("layer", (Unit("mlp", layer, None),), layer, None, None, f"mlp/{layer}/*"))
            a, b = cc[adapter.hook_mlp_post(layer)][0], xc[adapter.hook_mlp_post(layer)][0]
            differ = (a != b).any(0).nonzero().flatten().tolist()
            notes.append(f"layer {layer}: {len(differ)} of {f.d_mlp} neurons differ between the prompts "
                         "(the others recover exactly 0 and are not run)")
            for i in differ:
                jobs.append(("neuron", (Unit("neuron", layer, None, i),), layer, None, i, f"neuron/{layer}/*/{i}"))
    if "feature" in granularity:
        if transcoders is None or len(transcoders) == 0:
            raise ValidationRunError("patching granularity 'feature' needs transcoders; none are loaded")
        for layer in [l for l in sorted(transcoders.layers) if l in swept]:
            fa = site_values(adapter, "feature", layer, cc, transcoders)[0, :, :, 0]
            fb = site_values(adapter, "feature", layer, xc, transcoders)[0, :, :, 0]
            active = ((fa != 0) | (fb != 0)).any(0) & (fa != fb).any(0)
            for j in active.nonzero().flatten().tolist():
                jobs.append(("feature", (Unit("feature", layer, None, j),), layer, None, j, f"feature/{layer}/*/{j}"))

    names_of_sets = list(set_names) if set_names is not None else [" + ".join(str(u) for u in units) for units in sets]
    for name, units in zip(names_of_sets, sets, strict=False):
        units = tuple(units)
        if not units:
            raise ValidationRunError(f"patching set {name!r} is empty; give at least one unit")
        layer = min(u.layer for u in units)
        jobs.append((SET, units, layer, None, None, name))

    rows_iv = [[]] + [[Intervention.patched(u, clean_t)] if u else [] for u in sanity]
    rows_iv += [[Intervention.patched(units, clean_t)] for _, units, *_ in jobs]
    out = run_rows(adapter, corrupt_t, rows_iv, metric, transcoders=transcoders, batch_size=batch_size).metric
    x_val = out[0].item()
    _check_denominator(c_val, x_val)
    rec = _recovery(out, c_val, x_val)
    everything, nothing = rec[1], rec[2]
    rows = [PatchRow(g, label, layer, pos, idx, float(out[i + 3]), rec[i + 3])
            for i, (g, _, layer, pos, idx, label) in enumerate(jobs)]
    whole = {r.layer: r.recovery for r in rows if r.granularity == "layer" and r.unit == f"mlp/{r.layer}/*"}
    for r in rows:
        if r.granularity == "neuron" and whole.get(r.layer):
            r.share_of_layer = r.recovery / whole[r.layer]
    grids = _grids(rows, L, T, H, clean_t, corrupt_t, tokenizer, f.d_mlp)
    result = PatchingResult(clean_t, corrupt_t, metric.describe(tokenizer), c_val, x_val, rows, grids,
                            everything, nothing, None, notes)
    if heatmap is not None and grids:
        write_heatmap(result, heatmap, tokenizer=tokenizer)
        result.heatmap = str(heatmap)
    return result


def _tok_labels(clean: list[int], corrupted: list[int], tokenizer: Tokenizer | None) -> list[str]:
    show = (lambda i: tokenizer.token_str(i)) if tokenizer is not None else (lambda i: f"<{i}>")
    out = []
    for t, (a, b) in enumerate(zip(clean, corrupted, strict=False)):
        out.append(f"{t}:{show(a)}" if a == b else f"{t}:{show(a)}/{show(b)}")
    return out


def _grids(rows: list[PatchRow], L: int, T: int, H: int, clean: list[int], corrupted: list[int],
           tokenizer: Tokenizer | None, d_mlp: int = 0) -> list[PatchGrid]:
    cols = _tok_labels(clean, corrupted, tokenizer)
    grids = []
    pos_rows = [r for r in rows if r.granularity == "position"]
    if pos_rows:
        v = np.zeros((L + 1, T))
        for r in pos_rows:
            v[r.layer, r.position] = r.recovery
        grids.append(PatchGrid("residual stream", [f"resid_pre {l}" for l in range(L)] + [f"resid_post {L - 1}"],
                               cols, v.tolist()))
    for site in ("attn", "mlp"):  # one row per swept layer (patching: layers)
        sel = [r for r in rows if r.granularity == "layer" and r.unit.startswith(site + "/") and r.position is not None]
        if sel:
            layers = sorted({r.layer for r in sel})
            v = np.zeros((len(layers), T))
            for r in sel:
                v[layers.index(r.layer), r.position] = r.recovery
            grids.append(PatchGrid(f"{site} output", [f"{site} {l}" for l in layers], cols, v.tolist()))
    heads = [r for r in rows if r.granularity == "head"]
    if heads:
        layers = sorted({r.layer for r in heads})
        v = np.zeros((len(layers), H))
        for r in heads:
            v[layers.index(r.layer), r.index] = r.recovery
        grids.append(PatchGrid("heads (all positions)", [f"layer {l}" for l in layers], [f"H{h}" for h in range(H)],
                               v.tolist()))
    neurons = [r for r in rows if r.granularity == "neuron"]
    if neurons:  # one row per swept layer, every neuron a column (0: not different, not run)
        layers = sorted({r.layer for r in neurons})
        v = np.zeros((len(layers), d_mlp))
        for r in neurons:
            v[layers.index(r.layer), r.index] = r.recovery
        grids.append(PatchGrid("neurons (all positions)", [f"MLP {l}" for l in layers],
                               [f"N{i}" for i in range(d_mlp)], v.tolist()))
    return grids


def write_heatmap(result: PatchingResult, path: str | Path, *, tokenizer: Tokenizer | None = None,
                  title: str | None = None) -> Path:
    """Draw every grid of ``result`` as a panel (diverging colours, 0 white, +-1 saturated at least)
    and write the image atomically; the format follows the suffix (png, svg, pdf)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # the Agg canvas; no global backend switch
        from matplotlib.figure import Figure
    except ImportError:
        raise ValidationRunError(f"heat map {path}: matplotlib is not installed; install the plots extra "
                                 "(pip install 'circuitgraph-lm[plots]') or drop heatmap") from None

    path = Path(path)
    fmt_name = path.suffix.lstrip(".").lower() or "png"
    if fmt_name not in ("png", "svg", "pdf"):
        raise ValidationRunError(f"heat map {path}: unsupported image format {fmt_name!r}; use .png, .svg or .pdf")
    grids = result.grids
    if not grids:
        raise ValidationRunError("no grid to draw: the heat map needs the position, layer or head granularity")
    heights = [max(len(g.rows), 1) * 0.45 + 1.6 for g in grids]
    width = min(max(6.0, 0.9 * max(len(g.columns) for g in grids) + 2.5), 18.0)
    fig = Figure(figsize=(width, sum(heights)), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(grids), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    vmax = max(1.0, max(float(np.abs(np.array(g.values)).max()) for g in grids))
    for ax, g in zip(axes, grids, strict=False):
        v = np.array(g.values)
        im = ax.imshow(v, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_title(g.name, fontsize=10)
        ax.set_yticks(range(len(g.rows)), g.rows, fontsize=8)
        step = max(1, -(-len(g.columns) // 40))  # at most ~40 labelled columns (a neuron row has thousands)
        ax.set_xticks(range(0, len(g.columns), step), g.columns[::step], fontsize=8, rotation=45, ha="right")
        if v.size <= 400:
            for i in range(v.shape[0]):
                for j in range(v.shape[1]):
                    shown = v[i, j] if abs(v[i, j]) >= 0.005 else 0.0  # no "-0.00"
                    ax.text(j, i, f"{shown:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if abs(v[i, j]) > 0.6 * vmax else "black")
        fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="recovery")
    fig.suptitle(title or f"activation patching, recovery of {result.metric}", fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt_name, dpi=120)
    atomic_write_bytes(path, buf.getvalue())
    return path
