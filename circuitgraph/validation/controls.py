"""Random control sets for an ablation: units that can affect the metric, matched on removed
magnitude or on count.

The *removed magnitude* of a unit under an intervention is ``|a - a'|`` for a scalar unit
(feature, neuron, gate, value) and ``||v - v'||_2`` for a vector unit (head ``z``, error,
MLP/attention output, embedding), measured on the clean prompt; a set's magnitude is the sum
over its units.

**Which units are candidates.**  Controls are drawn among the units of the selected units'
site (feature, neuron, head...) that are not selected, that remove something (magnitude > 0:
units inactive on the prompt are never drawn), and that *can affect the metric*: a unit
writing into the residual stream at location ``w`` and position ``p`` reaches a readout at
location ``r`` and position ``t`` only if ``w <= r`` and either ``p == t``, or ``p < t`` and an
attention layer lies between them (``w <= 2m`` and ``2m + 1 <= r``) to carry it across
positions (residual locations: ``resid_pre`` of layer ``l`` is ``2l``, ``resid_mid`` ``2l + 1``).
Without this rule most random units of a late layer sit at positions whose writes no later
attention moves to the metric's position, and a control set of them can only measure zero.
The first position is left out unless the selection uses it.

**Strata.**  By default the candidates of every layer form one pool per site; with
``match_layers`` a pool per ``(site, layer)`` and with ``match_positions`` per position as
well, each matched to the selected units of that stratum:

* ``count_matched``: as many random candidates per stratum as the selection has;
* ``matched_magnitude``: candidates in random order are added while the sum stays at most
  ``(1 + tolerance)`` times the stratum's selected magnitude, until it reaches at least
  ``(1 - tolerance)`` times it.  A draw that runs out of candidates is retried with a new
  order, up to ``max_draws`` times.

**Degenerate distributions.**  When fewer than the requested sets can be drawn (too few
candidates, no draw within the tolerance), when fewer distinct sets exist than were asked
for, or when every control set has the same effect, the control distribution cannot say
whether the selection matters: :class:`ControlSummary` reports it as ``degenerate`` (with the
reason) and gives no empirical p-value (``share_as_large`` is ``None``), never ``0``.

Draws use ``numpy.random.default_rng(seed)``; masks are boolean (no ``inf`` arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from circuitgraph.residual import ResidualLocation
from circuitgraph.spec.kinds import ACTIVATION_KINDS
from circuitgraph.validation._common import markdown_table
from circuitgraph.validation.interventions import (
    Intervention,
    Unit,
    _cache_run,
    _compile,
    _needed_hooks,
    site_values,
)

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.sites import Site
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = [
    "ControlKind",
    "ControlDraw",
    "ControlSummary",
    "unit_magnitudes",
    "draw_controls",
    "reachable_positions",
    "write_location",
    "summarise_controls",
]

ControlKind = Literal["matched_magnitude", "count_matched"]


@torch.no_grad()
def unit_magnitudes(adapter: ModelAdapter, tokens: Sequence[int], template: Intervention,
                    sites: Sequence[tuple[Site, int]],
                    transcoders: Dictionary | None = None) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per ``(site, layer)``: ``(magnitude (pos, n), old values (pos, n, e), new values (pos, n, e))``
    for every unit of the site, under ``template``'s mode (its units are ignored)."""
    T = len(tokens)
    out = {}
    names: set[str] = set()
    for site, layer in sites:
        names |= _needed_hooks(adapter, site, layer, transcoders)
    cache = _cache_run(adapter, tokens, names)
    for site, layer in sites:
        every = Intervention((Unit(site, layer, None, None),), template.mode, template.scale, template.value,
                             template.reference, template.patch, (), template.pooling)
        plan = _compile(adapter, [[every]], T, transcoders, broadcast=True)
        (edit,) = plan.edits[(site, layer)]
        old = site_values(adapter, site, layer, cache, transcoders)  # (1, T, n, e)
        new = edit.apply(old)
        mag = (new.double() - old.double()).norm(dim=-1)[0]
        out[(site, layer)] = (mag.cpu(), old[0].double().cpu(), new[0].double().cpu())
    return out


def write_location(site: str, layer: int) -> int:
    """Residual location a unit of ``site`` at ``layer`` writes into (:meth:`ResidualLocation.written_by`)."""
    return int(ResidualLocation.written_by(site, layer))


def _read_location(readout: Any, n_layers: int) -> int:
    R = ResidualLocation
    if readout.kind in ("logit", "logit_diff"):
        return int(R.resid_pre(n_layers))
    layer = int(readout.layer)
    if readout.kind in ACTIVATION_KINDS:
        return int(R.read_by(readout.kind, layer))
    return int({"resid_pre": R.resid_pre, "resid_mid": R.resid_mid}.get(readout.site or "", R.resid_post)(layer))


def reachable_positions(metric: Any, n_layers: int, n_pos: int, causal: bool = True) -> Callable[[str, int], np.ndarray]:
    """``reach(site, layer)``: a boolean ``(n_pos,)`` mask of the positions at which a unit of
    ``site`` at ``layer`` can affect ``metric`` (see the module docstring); through an attention
    layer, earlier positions (every position when attention is bidirectional, ``causal=False``)."""
    reads = []
    for r in metric.readouts:
        t = r.position + n_pos if r.position < 0 else r.position
        reads.append((_read_location(r, n_layers), t))

    def reach(site: str, layer: int) -> np.ndarray:
        w = write_location(site, layer)
        mask = np.zeros(n_pos, dtype=bool)
        for loc_r, t in reads:
            if w > loc_r or not 0 <= t < n_pos:
                continue
            mask[t] = True
            if any(w <= ResidualLocation.resid_pre(m) and ResidualLocation.resid_mid(m) <= loc_r for m in range(n_layers)):
                mask[:t] = True
                if not causal:
                    mask[t:] = True
        return mask

    return reach


class ControlDraw(list):
    """The control sets drawn, ``[(units, removed magnitude), ...]``, with ``shortfall`` (why
    fewer than the requested sets could be drawn, or None), ``requested`` and ``pool_size``
    (candidates per stratum)."""

    def __init__(self, sets: list[tuple[list[Unit], float]], requested: int, shortfall: str | None,
                 pool_size: list[int], distinct_possible: int | None = None):
        super().__init__(sets)
        self.requested = requested
        self.shortfall = shortfall
        self.pool_size = pool_size
        self.distinct_possible = distinct_possible


@dataclass
class _Stratum:
    key: tuple
    selected: list[Unit]
    target: float
    units: list[Unit]  # candidates
    masses: np.ndarray


def _strata(units: Sequence[Unit], match_layers: bool, match_positions: bool) -> dict[tuple, list[Unit]]:
    out: dict[tuple, list[Unit]] = {}
    for u in units:
        key = (u.site, u.layer if match_layers else None, u.position if match_positions else None)
        out.setdefault(key, []).append(u)
    return out


def _candidates(key: tuple, selected: list[Unit], magnitudes: dict, reach: Callable[[str, int], np.ndarray] | None,
                use_first: bool, active_only: bool, exclude: Sequence[Unit] = ()) -> tuple[list[Unit], np.ndarray]:
    """Candidate units of a stratum and their removed magnitudes (reachable, not selected, and
    with ``active_only`` removing something)."""
    site, layer, position = key
    all_positions = any(u.position is None for u in selected)
    chosen = set(selected) | set(exclude)
    units: list[Unit] = []
    masses: list[np.ndarray] = []
    for (s, lyr), (mag, *_rest) in sorted(magnitudes.items()):
        if s != site or (layer is not None and lyr != layer):
            continue
        mag = np.asarray(mag.detach().cpu().double() if hasattr(mag, "detach") else mag, dtype=np.float64)
        T, n = mag.shape
        ok = reach(s, lyr) if reach is not None else np.ones(T, dtype=bool)
        if all_positions:
            totals = mag.sum(0)
            if not ok.any():
                continue
            idx = np.flatnonzero(totals > 0) if active_only else np.arange(n)
            units += [Unit(s, lyr, None, int(i)) for i in idx]
            masses.append(totals[idx])
            continue
        pos_ok = ok.copy()
        if position is not None:
            pos_ok &= np.arange(T) == position
        elif not use_first and T > 1:
            pos_ok[0] = False
        keep = ((mag > 0) if active_only else np.ones_like(mag, dtype=bool)) & pos_ok[:, None]
        ts, idx = np.nonzero(keep)
        units += [Unit(s, lyr, int(t), int(i)) for t, i in zip(ts, idx, strict=False)]
        masses.append(mag[ts, idx])
    m = np.concatenate(masses) if masses else np.zeros(0)
    pairs = [(u, float(x)) for u, x in zip(units, m, strict=False) if u not in chosen]
    return [u for u, _ in pairs], np.array([x for _, x in pairs], dtype=np.float64)


def draw_controls(
    selected: Sequence[Unit],
    magnitudes: dict[tuple[str, int], tuple[torch.Tensor, Any, Any]],
    kind: ControlKind,
    n_sets: int,
    *,
    seed: int = 0,
    tolerance: float = 0.05,
    max_draws: int = 1000,
    match_positions: bool = False,
    match_layers: bool = False,
    reach: Callable[[str, int], np.ndarray] | None = None,
    active_only: bool = True,
    exclude: Sequence[Unit] = (),
) -> ControlDraw:
    """Up to ``n_sets`` random control sets, each ``(units, removed magnitude)`` (see the module
    docstring).  ``magnitudes``: per ``(site, layer)``, ``(magnitude (pos, n), ...)`` as from
    :func:`unit_magnitudes`, for every layer the controls may come from; ``reach``: which
    positions of a ``(site, layer)`` can affect the metric (default: all); ``active_only``:
    count-matched controls skip units that remove nothing (matched-magnitude ones always do);
    ``exclude``: units never drawn besides the selected ones (a subgroup's controls avoid the
    whole selection)."""
    rng = np.random.default_rng(seed)
    use_first = any(u.position == 0 for u in selected)
    strata = []
    for key, units in _strata(selected, match_layers, match_positions).items():
        target = 0.0
        for u in units:
            mag = magnitudes[(u.site, u.layer)][0]
            row = mag.sum(0) if u.position is None else mag[u.position]
            target += float(row.sum() if u.index is None else row[u.index])
        cands, masses = _candidates(key, units, magnitudes, reach, use_first, active_only or kind != "count_matched",
                                    exclude)
        strata.append(_Stratum(key, units, target, cands, masses))
    pool_size = [len(st.units) for st in strata]
    distinct = None
    if kind == "count_matched":
        distinct = 1
        for st in strata:
            distinct *= math.comb(len(st.units), len(st.selected))
    sets: list[tuple[list[Unit], float]] = []
    shortfall = None
    for _ in range(n_sets):
        units_out: list[Unit] = []
        total = 0.0
        for st in strata:
            if kind == "count_matched":
                need = len(st.selected)
                if len(st.units) < need:
                    shortfall = (f"count-matched controls for {_name(st.key)}: {need} units needed, only "
                                 f"{len(st.units)} other {'active ' if active_only else ''}units are candidates "
                                 "(units that can affect the metric)")
                    break
                pick = rng.choice(len(st.units), size=need, replace=False)
                units_out += [st.units[i] for i in pick]
                total += float(st.masses[pick].sum())
            else:
                got, why = _match(st, rng, tolerance, max_draws)
                if got is None:
                    shortfall = why
                    break
                units_out += [st.units[i] for i in got]
                total += float(st.masses[got].sum())
        if shortfall is not None:
            break
        sets.append((units_out, total))
    return ControlDraw(sets, n_sets, shortfall, pool_size, distinct)


def _name(key: tuple) -> str:
    site, layer, position = key
    text = f"{site} units" + (f" of layer {layer}" if layer is not None else "")
    return text + (f" at position {position}" if position is not None else "")


def _match(st: _Stratum, rng: np.random.Generator, tol: float, max_draws: int) -> tuple[np.ndarray | None, str]:
    if st.target <= 0:
        return np.zeros(0, dtype=np.int64), ""
    lo, hi = (1 - tol) * st.target, (1 + tol) * st.target
    masses = st.masses
    idx = np.arange(masses.size)
    pool_total = float(masses.sum())
    if pool_total < lo:
        return None, (
            f"matched-magnitude controls for {_name(st.key)}: the selected units remove {st.target:.4g} and all "
            f"{idx.size} other active units that can affect the metric together only {pool_total:.4g} "
            f"({pool_total / st.target:.0%}), short of the {1 - tol:.0%} needed (tolerance {tol:g}); use count_matched "
            "controls, a larger control_tolerance, or a selection that is not the bulk of its units"
        )
    best = 0.0
    for _ in range(max_draws):
        order = rng.permutation(idx)
        acc, chosen = 0.0, []
        for i in order:
            m = masses[i]
            if acc + m <= hi:
                acc += m
                chosen.append(i)
                if acc >= lo:
                    return np.array(chosen, dtype=np.int64), ""
        if abs(acc - st.target) < abs(best - st.target):
            best = acc
    return None, (
        f"matched-magnitude controls for {_name(st.key)}: no draw of {max_draws} removed within ±{tol:g} of the "
        f"selected {st.target:.4g}; the closest removed {best:.4g} ({best / st.target:.1%}); raise control_tolerance "
        "or max_draws, or use count_matched controls"
    )


@dataclass
class ControlSummary:
    """The effects of one kind of control sets next to the selected set's effect.

    ``degenerate`` says why the distribution cannot measure anything (fewer sets than
    ``requested``, fewer distinct sets, or one effect for all); then ``share_as_large`` is None."""

    kind: ControlKind
    seed: int
    tolerance: float | None
    selected_effect: float
    selected_magnitude: float
    effects: list[float]
    magnitudes: list[float]
    sizes: list[int]
    units: list[list[str]] = field(default_factory=list)
    requested: int | None = None
    degenerate: str | None = None

    @property
    def mean(self) -> float:
        return float(np.mean(self.effects)) if self.effects else float("nan")

    @property
    def std(self) -> float:
        return float(np.std(self.effects)) if self.effects else float("nan")

    @property
    def share_as_large(self) -> float | None:
        """Share of control sets whose |effect| is at least the selected set's (an empirical
        p-value); ``None`` when the distribution is degenerate."""
        if not self.effects or self.degenerate is not None:
            return None
        return float(np.mean([abs(e) >= abs(self.selected_effect) for e in self.effects]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "seed": self.seed,
            "tolerance": self.tolerance,
            "requested": self.requested,
            "degenerate": self.degenerate,
            "selected_effect": self.selected_effect,
            "selected_magnitude": self.selected_magnitude,
            "mean_effect": self.mean if self.effects else None,
            "std_effect": self.std if self.effects else None,
            "share_as_large": self.share_as_large,
            "effects": self.effects,
            "magnitudes": self.magnitudes,
            "sizes": self.sizes,
            "units": self.units,
        }

    def row(self) -> list[Any]:
        share = self.share_as_large if self.degenerate is None else "n/a (degenerate)"
        return [self.kind, len(self.effects), self.mean, self.std,
                float(np.mean(self.magnitudes)) if self.magnitudes else None,
                float(np.mean(self.sizes)) if self.sizes else None, share]

    HEADERS = ["control", "sets", "mean effect", "std", "mean magnitude", "mean size", "share |effect| >= selected"]

    def table(self, max_rows: int = 10) -> str:
        text = markdown_table(self.HEADERS, [self.row()], max_rows)
        return text + (f"\n\n{self.kind} degenerate: {self.degenerate}" if self.degenerate else "")


#: effects closer than this (relative to the largest effect in play) count as equal
EQUAL_EFFECTS_RTOL = 1e-6


def degenerate_reason(draw: Sequence[tuple[list[Unit], float]], effects: Sequence[float],
                      selected_effect: float) -> str | None:
    """Why a control distribution cannot measure anything, or None (see the module docstring)."""
    shortfall = getattr(draw, "shortfall", None)
    requested = getattr(draw, "requested", len(draw))
    if shortfall is not None or len(draw) < requested:
        return f"only {len(draw)} of {requested} control sets could be drawn: {shortfall}"
    distinct = len({frozenset(u) for u, _ in draw})
    possible = getattr(draw, "distinct_possible", None)
    if distinct < len(draw):
        more = f" (only {possible} exist)" if possible is not None and possible < len(draw) else ""
        return f"only {distinct} distinct control sets among the {len(draw)} drawn{more}"
    if len(effects) >= 2:
        e = np.asarray(effects, dtype=np.float64)
        scale = max(float(np.abs(e).max()), abs(float(selected_effect)), 1e-300)
        if float(e.max() - e.min()) <= EQUAL_EFFECTS_RTOL * scale:
            return (f"every control set has the same effect ({float(e.mean()):.3g}): these controls cannot measure "
                    "anything here")
    return None


def summarise_controls(kind: ControlKind, seed: int, tolerance: float | None, selected_effect: float,
                       selected_magnitude: float, sets: Sequence[tuple[list[Unit], float]],
                       effects: Sequence[float]) -> ControlSummary:
    return ControlSummary(kind, seed, tolerance if kind == "matched_magnitude" else None, float(selected_effect),
                          float(selected_magnitude), [float(e) for e in effects], [float(m) for _, m in sets],
                          [len(u) for u, _ in sets], [[str(x) for x in u] for u, _ in sets],
                          getattr(sets, "requested", len(sets)), degenerate_reason(sets, effects, selected_effect))
