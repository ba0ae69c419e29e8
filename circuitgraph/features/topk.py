"""The exact, mergeable state of a features run: top-k heaps, counts, sums and histograms.

Every feature of the run has a global number ``g`` (its row in ``features.parquet``).  A
:class:`FeatureState` holds, for a set of rows of the dataset:

* ``n_tokens``: positions seen (the same for every feature);
* the top-k entries of every feature: activation, row number, position, key position (an
  attention head's pairs; -1 for other units), the context window (token ids and the
  feature's activations there) and ``extra`` values of the entry (a head's attention weight,
  score and output norm at the pair), ordered by activation (descending), then row number,
  then position, then key position -- a total order, so the top k of a union is the top k
  of the tops of its parts, whatever the parts;
* ``hist``: counts of the active activations per ``(g, bin)``, a bin being the top 20 bits of
  the float32 in an order-preserving encoding (sign, exponent and 11 mantissa bits);
* ``sums``: the exact sum of the active activations per ``(g, exponent)``, as the integer sum
  of their signed 24-bit significands (exact in int64 up to 5e11 values per bin);
* ``mins``: the smallest active activation per feature.

:meth:`FeatureState.merge` adds two states: integer sums, integer counts, minima, and the
top k of the union -- every operation exact and associative, so the result does not depend
on how the dataset was split into shards nor on the order shards finish.  Memory is bounded
by the number of features times (k + the bins their activations fall in), never by the
dataset's size.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = ["HIST_SHIFT", "FeatureState", "exact_means", "float_keys", "quantiles"]

#: low bits of the order-preserving float32 key dropped by the histogram (bins of 2**12 ulp:
#: 2**-11 relative width; a quantile read from a bin is within 2**-12 relative of the value)
HIST_SHIFT = 12
_BIN_BITS = 32 - HIST_SHIFT
_FIELDS = ("g", "act", "row", "pos", "key", "start", "win_tokens", "win_acts", "extra")


def float_keys(values: np.ndarray) -> np.ndarray:
    """An order-preserving uint32 encoding of float32 values (larger value, larger key)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000)).astype(np.uint32)


def _key_value(keys: np.ndarray) -> np.ndarray:
    """The float32 values of order-preserving keys (inverse of :func:`float_keys`)."""
    keys = keys.astype(np.uint32)
    u = np.where(keys & np.uint32(0x80000000), keys ^ np.uint32(0x80000000), ~keys).astype(np.uint32)
    return u.view(np.float32)


def _unique_sum(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ``keys`` and the int64 sums of ``values`` per key (exact)."""
    if keys.size == 0:
        return keys.astype(np.int64), values.astype(np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    out = np.zeros(uniq.size, dtype=np.int64)
    np.add.at(out, inverse.reshape(-1), values.astype(np.int64))
    return uniq, out


@dataclass
class FeatureState:
    """See the module docstring.  Arrays of the top-k entries are parallel, sorted by
    ``(g, -act, row, pos, key)`` with at most ``k`` entries per ``g``; ``extra`` is
    ``(entries, n_extra)``."""

    k: int
    width: int
    n_tokens: int
    g: np.ndarray
    act: np.ndarray
    row: np.ndarray
    pos: np.ndarray
    key: np.ndarray
    start: np.ndarray
    win_tokens: np.ndarray
    win_acts: np.ndarray
    extra: np.ndarray
    hist_keys: np.ndarray
    hist_counts: np.ndarray
    sum_keys: np.ndarray
    sum_values: np.ndarray
    min_g: np.ndarray
    min_value: np.ndarray

    @classmethod
    def empty(cls, k: int, width: int, n_extra: int = 0) -> FeatureState:
        i64, f32 = np.zeros(0, np.int64), np.zeros(0, np.float32)
        return cls(k, width, 0, i64, f32, i64, i64, i64, i64, np.zeros((0, width), np.int32),
                   np.zeros((0, width), np.float32), np.zeros((0, n_extra), np.float32), i64, i64, i64, i64, i64, f32)

    @property
    def n_extra(self) -> int:
        return int(self.extra.shape[1])

    def thresholds(self, n_features: int) -> np.ndarray:
        """Per feature, the activation an entry of a *later* row must exceed to enter the top
        k (``-inf`` while a feature has fewer than ``k`` entries): an equal activation loses the
        tie on the row number.  Candidates below it need no context window."""
        out = np.full(n_features, -np.inf, dtype=np.float32)
        if self.g.size:
            bounds = np.searchsorted(self.g, np.arange(n_features + 1))
            full = np.flatnonzero(bounds[1:] - bounds[:-1] >= self.k)
            out[full] = self.act[bounds[full] + self.k - 1]
        return out

    # ------------------------------------------------------------------ building
    @classmethod
    def from_entries(cls, k: int, width: int, n_tokens: int, g: np.ndarray, act: np.ndarray, row: np.ndarray,
                     pos: np.ndarray, start: np.ndarray, win_tokens: np.ndarray,
                     win_acts: np.ndarray, *, key: np.ndarray | None = None, extra: np.ndarray | None = None,
                     all_g: np.ndarray | None = None, all_act: np.ndarray | None = None) -> FeatureState:
        """The state of a set of active entries (every active (feature, row, position)).

        With ``all_g``/``all_act`` the statistics (counts, sums, histogram, minima) are those
        of every active entry given there, and ``g, act, ...`` need only hold the candidates
        for the top k (a superset of each feature's top k among them): their context windows
        are all that must be built."""
        act = act.astype(np.float32)
        g = g.astype(np.int64)
        sg = g if all_g is None else all_g.astype(np.int64)
        sa = act if all_act is None else all_act.astype(np.float32)
        keys = float_keys(sa).astype(np.int64)
        hist_keys, hist_counts = _unique_sum((sg << _BIN_BITS) | (keys >> HIST_SHIFT), np.ones(sg.size, np.int64))
        bits = sa.view(np.uint32).astype(np.int64)
        exponent = (bits >> 23) & 0xFF
        significand = np.where(exponent > 0, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
        signed = np.where(bits >> 31, -significand, significand)
        sum_keys, sum_values = _unique_sum((sg << 8) | exponent, signed)
        if sg.size:
            order = np.lexsort((sa, sg))  # per g, smallest first
            first = np.ones(order.size, dtype=bool)
            first[1:] = sg[order][1:] != sg[order][:-1]
            min_g, min_value = sg[order][first], sa[order][first]
        else:
            min_g, min_value = np.zeros(0, np.int64), np.zeros(0, np.float32)
        key = np.full(g.size, -1, np.int64) if key is None else key.astype(np.int64)
        extra = np.zeros((g.size, 0), np.float32) if extra is None else extra.astype(np.float32)
        state = cls(k, width, int(n_tokens), g, act, row.astype(np.int64), pos.astype(np.int64), key,
                    start.astype(np.int64), win_tokens.astype(np.int32), win_acts.astype(np.float32), extra,
                    hist_keys, hist_counts, sum_keys, sum_values, min_g, min_value)
        return state._cut()

    def _cut(self) -> FeatureState:
        """Keep the top ``k`` entries per feature, in ``(g, -act, row, pos, key)`` order."""
        if self.g.size == 0:
            return self
        order = np.lexsort((self.key, self.pos, self.row, -self.act.astype(np.float64), self.g))
        g = self.g[order]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        rank = np.arange(g.size) - np.repeat(starts, np.diff(np.r_[starts, g.size]))
        keep = order[rank < self.k]
        for name in _FIELDS:
            setattr(self, name, getattr(self, name)[keep])
        return self

    def merge(self, other: FeatureState) -> FeatureState:
        """The state of the union of the two sets of rows (exact; see the module docstring)."""
        if (other.k, other.width, other.n_extra) != (self.k, self.width, self.n_extra):
            raise ValueError(f"cannot merge states of top_k/width/extra {(self.k, self.width, self.n_extra)} and "
                             f"{(other.k, other.width, other.n_extra)}")
        parts = {name: np.concatenate([getattr(self, name), getattr(other, name)]) for name in _FIELDS}
        hist = _unique_sum(np.concatenate([self.hist_keys, other.hist_keys]),
                           np.concatenate([self.hist_counts, other.hist_counts]))
        sums = _unique_sum(np.concatenate([self.sum_keys, other.sum_keys]),
                           np.concatenate([self.sum_values, other.sum_values]))
        mg = np.concatenate([self.min_g, other.min_g])
        mv = np.concatenate([self.min_value, other.min_value])
        if mg.size:
            order = np.lexsort((mv, mg))
            first = np.ones(order.size, dtype=bool)
            first[1:] = mg[order][1:] != mg[order][:-1]
            mg, mv = mg[order][first], mv[order][first]
        state = FeatureState(self.k, self.width, self.n_tokens + other.n_tokens, hist_keys=hist[0],
                             hist_counts=hist[1], sum_keys=sums[0], sum_values=sums[1], min_g=mg, min_value=mv,
                             **parts)
        return state._cut()

    # ------------------------------------------------------------------ files
    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        arrays = {name: getattr(self, name) for name in _FIELDS + ("hist_keys", "hist_counts", "sum_keys",
                                                                     "sum_values", "min_g", "min_value")}
        np.savez(buf, meta=np.array([self.k, self.width, self.n_tokens], dtype=np.int64), **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> FeatureState:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            k, width, n_tokens = (int(x) for x in z["meta"])
            return cls(k, width, n_tokens, **{name: z[name] for name in z.files if name != "meta"})

    # ------------------------------------------------------------------ statistics
    def n_active(self, n_features: int) -> np.ndarray:
        """Active entries per feature ``(n_features,)``."""
        out = np.zeros(n_features, dtype=np.int64)
        np.add.at(out, self.hist_keys >> _BIN_BITS, self.hist_counts)
        return out


def exact_means(state: FeatureState, n_features: int) -> np.ndarray:
    """Mean active activation per feature, from the exact integer sums, rounded once to
    float64 (NaN where a feature is never active)."""
    n_active = state.n_active(n_features)
    totals: dict[int, int] = {}
    for key, value in zip(state.sum_keys.tolist(), state.sum_values.tolist(), strict=False):
        g, exponent = key >> 8, key & 0xFF
        # significand * 2**(max(e, 1) - 150) == (significand << (max(e, 1) - 1)) * 2**-149
        totals[g] = totals.get(g, 0) + (int(value) << (max(exponent, 1) - 1))
    out = np.full(n_features, np.nan)
    for g, total in totals.items():
        if n_active[g]:
            out[g] = float(Fraction(total, int(n_active[g]) << 149))
    return out


def quantiles(state: FeatureState, n_features: int, qs: tuple[float, ...]) -> np.ndarray:
    """``(n_features, len(qs))`` quantiles of the active activations (NaN where never active).

    The ``q``-quantile is the value of nearest rank ``r = max(1, ceil(q * n))`` among the ``n``
    active activations sorted ascending (``q`` read as the decimal it is written as).  It is
    exact when rank ``r`` is the smallest value or among the kept top-k; otherwise it is the
    middle of the histogram bin holding rank ``r``, clamped to the feature's exact minimum
    and maximum: within ``2**-12`` relative of the exact value.
    """
    n_active = state.n_active(n_features)
    out = np.full((n_features, len(qs)), np.nan)
    hg = state.hist_keys >> _BIN_BITS
    bins = state.hist_keys & ((1 << _BIN_BITS) - 1)
    bounds = np.searchsorted(hg, np.arange(n_features + 1))
    top_bounds = np.searchsorted(state.g, np.arange(n_features + 1))
    mins = dict(zip(state.min_g.tolist(), state.min_value.tolist(), strict=False))
    fractions = [Fraction(repr(float(q))) for q in qs]
    for g in np.flatnonzero(n_active).tolist():
        n = int(n_active[g])
        top = state.act[top_bounds[g]:top_bounds[g + 1]]  # descending
        lo, hi = bounds[g], bounds[g + 1]
        cum = np.cumsum(state.hist_counts[lo:hi])
        for j, f in enumerate(fractions):
            r = max(1, math.ceil(f * n))
            if r == 1:
                value = mins[g]
            elif n - r < top.size:
                value = float(top[n - r])
            else:
                b = int(bins[lo + int(np.searchsorted(cum, r))])
                mid = _key_value(np.array([(b << HIST_SHIFT) | (1 << (HIST_SHIFT - 1))], dtype=np.uint64))[0]
                value = float(min(max(float(mid), mins[g]), float(top[0])))
            out[g, j] = value
    return out
