"""Random control sets for an ablation: same kind and layers, matched on count or on removed mass.

The *removed magnitude* of a unit under an intervention is ``|a - a'|`` for a scalar unit
(feature, neuron, gate, value) and ``||v - v'||_2`` for a vector unit (head ``z``, error,
MLP/attention output, embedding), measured on the clean prompt; a set's magnitude is the sum
over its units.  Controls are drawn per stratum ``(site, layer)`` from the units of that site
and layer that are not selected (at every position but the first, unless the selection uses
position 0; with ``match_positions`` at the selected positions only):

* ``count_matched``: as many random units per stratum as the selection has;
* ``matched_magnitude``: units in random order are added while the sum stays at most
  ``(1 + tolerance)`` times the stratum's selected magnitude, until it reaches at least
  ``(1 - tolerance)`` times it; units that remove nothing are never drawn.  A draw that
  runs out of units is retried with a new order, up to ``max_draws`` times; then
  :class:`~circuitgraph.errors.ValidationRunError` says how close the best draw came.

Draws use ``numpy.random.default_rng(seed)``; masks are boolean (no ``inf`` arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np
import torch

from circuitgraph.errors import ValidationRunError
from circuitgraph.validation._common import markdown_table
from circuitgraph.validation.interventions import (
    Intervention,
    Unit,
    _cache_run,
    _compile,
    _needed_hooks,
    site_values,
)

if TYPE_CHECKING:  # pragma: no cover
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["ControlKind", "ControlSummary", "unit_magnitudes", "draw_controls", "summarise_controls"]

ControlKind = Literal["matched_magnitude", "count_matched"]


@torch.no_grad()
def unit_magnitudes(adapter: ModelAdapter, tokens: Sequence[int], template: Intervention, sites: Sequence[tuple[str, int]],
                    transcoders: Any = None) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
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


def _strata(units: Sequence[Unit], match_positions: bool) -> dict[tuple, list[Unit]]:
    out: dict[tuple, list[Unit]] = {}
    for u in units:
        key = (u.site, u.layer, u.position) if match_positions else (u.site, u.layer)
        out.setdefault(key, []).append(u)
    return out


def _pool(stratum: tuple, selected: list[Unit], mag: torch.Tensor, all_positions: bool,
          use_first: bool) -> list[tuple[Unit, float]]:
    site, layer = stratum[0], stratum[1]
    T, n = mag.shape
    chosen = set(selected)
    if all_positions:
        totals = mag.sum(0)
        cands = [(Unit(site, layer, None, i), float(totals[i])) for i in range(n)]
    else:
        positions = [stratum[2]] if len(stratum) == 3 else range(0 if use_first else min(1, T - 1), T)
        cands = [(Unit(site, layer, t, i), float(mag[t, i])) for t in positions for i in range(n)]
    return [(u, m) for u, m in cands if u not in chosen]


@dataclass
class _Stratum:
    key: tuple
    selected: list[Unit]
    target: float
    pool: list[tuple[Unit, float]]


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
) -> list[tuple[list[Unit], float]]:
    """``n_sets`` random control sets, each ``(units, removed magnitude)`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    use_first = any(u.position == 0 for u in selected)
    strata = []
    for key, units in _strata(selected, match_positions).items():
        mag = magnitudes[(key[0], key[1])][0]
        all_positions = any(u.position is None for u in units)
        target = 0.0
        for u in units:
            row = mag.sum(0) if u.position is None else mag[u.position]
            target += float(row.sum() if u.index is None else row[u.index])
        strata.append(_Stratum(key, units, target, _pool(key, units, mag, all_positions, use_first)))
    sets = []
    for _ in range(n_sets):
        units: list[Unit] = []
        total = 0.0
        for st in strata:
            if kind == "count_matched":
                need = len(st.selected)
                if len(st.pool) < need:
                    raise ValidationRunError(
                        f"count-matched control for {_name(st.key)}: {need} units needed, only {len(st.pool)} "
                        "others exist; select fewer units there or drop count_matched"
                    )
                pick = rng.choice(len(st.pool), size=need, replace=False)
                units += [st.pool[i][0] for i in pick]
                total += sum(st.pool[i][1] for i in pick)
            else:
                got, mass = _match(st, rng, tolerance, max_draws)
                units += got
                total += mass
        sets.append((units, total))
    return sets


def _name(key: tuple) -> str:
    text = f"{key[0]} units of layer {key[1]}"
    return text + (f" at position {key[2]}" if len(key) == 3 else "")


def _match(st: _Stratum, rng: np.random.Generator, tol: float, max_draws: int) -> tuple[list[Unit], float]:
    if st.target <= 0:
        return [], 0.0
    lo, hi = (1 - tol) * st.target, (1 + tol) * st.target
    masses = np.array([m for _, m in st.pool], dtype=np.float64)
    positive = masses > 0  # boolean selection: units that remove nothing are never drawn
    idx = np.flatnonzero(positive)
    pool_total = float(masses[positive].sum())
    if pool_total < lo:
        raise ValidationRunError(
            f"matched-magnitude control for {_name(st.key)}: the selected units remove {st.target:.4g} and all "
            f"{idx.size} other units together only {pool_total:.4g} ({pool_total / st.target:.0%}), short of the "
            f"{1 - tol:.0%} needed (tolerance {tol:g}); use count_matched controls, a larger tolerance, or "
            "a selection that is not the bulk of its layer"
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
                    return [st.pool[j][0] for j in chosen], acc
        if abs(acc - st.target) < abs(best - st.target):
            best = acc
    raise ValidationRunError(
        f"matched-magnitude control for {_name(st.key)}: no draw of {max_draws} removed within ±{tol:g} of the "
        f"selected {st.target:.4g}; the closest removed {best:.4g} ({best / st.target:.1%}); raise the tolerance "
        "or max_draws, or use count_matched controls"
    )


@dataclass
class ControlSummary:
    """The effects of one kind of control sets next to the selected set's effect."""

    kind: ControlKind
    seed: int
    tolerance: float | None
    selected_effect: float
    selected_magnitude: float
    effects: list[float]
    magnitudes: list[float]
    sizes: list[int]
    units: list[list[str]] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.effects)) if self.effects else float("nan")

    @property
    def std(self) -> float:
        return float(np.std(self.effects)) if self.effects else float("nan")

    @property
    def share_as_large(self) -> float:
        """Share of control sets whose |effect| is at least the selected set's (an empirical p-value)."""
        if not self.effects:
            return float("nan")
        return float(np.mean([abs(e) >= abs(self.selected_effect) for e in self.effects]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "seed": self.seed,
            "tolerance": self.tolerance,
            "selected_effect": self.selected_effect,
            "selected_magnitude": self.selected_magnitude,
            "mean_effect": self.mean,
            "std_effect": self.std,
            "share_as_large": self.share_as_large,
            "effects": self.effects,
            "magnitudes": self.magnitudes,
            "sizes": self.sizes,
            "units": self.units,
        }

    def row(self) -> list[Any]:
        return [self.kind, len(self.effects), self.mean, self.std, float(np.mean(self.magnitudes)),
                float(np.mean(self.sizes)), self.share_as_large]

    HEADERS = ["control", "sets", "mean effect", "std", "mean magnitude", "mean size", "share |effect| >= selected"]

    def table(self, max_rows: int = 10) -> str:
        return markdown_table(self.HEADERS, [self.row()], max_rows)


def summarise_controls(kind: ControlKind, seed: int, tolerance: float | None, selected_effect: float,
                       selected_magnitude: float, sets: list[tuple[list[Unit], float]],
                       effects: Sequence[float]) -> ControlSummary:
    return ControlSummary(kind, seed, tolerance if kind == "matched_magnitude" else None, float(selected_effect),
                          float(selected_magnitude), [float(e) for e in effects], [float(m) for _, m in sets],
                          [len(u) for u, _ in sets], [[str(x) for x in u] for u, _ in sets])
