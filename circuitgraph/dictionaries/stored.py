"""Dictionary matrices left on disk: read by feature, from memory-mapped safetensors files.

A dictionary of ``d_sae`` features needs, per prompt, the encoder once (every feature's
pre-activation) and the decoder rows of the *active* features only.  :class:`StoredRows`
names one matrix in a safetensors file and which stored dimension indexes the features; it
reads any set of features (sorted, one contiguous slice per run of consecutive ids) or the
whole matrix, in feature-major orientation ``(n, ...)``, checking the values it reads for NaN
and inf.  Every lazily read dictionary (cross-layer transcoders in circuit-tracer's and
GemmaScope-2's layouts, per-layer transcoder sets, GemmaScope-2 and EleutherAI per-layer
files) goes through it, and :attr:`StoredRows.bytes_read` counts what it materialised.

Example::

    enc = StoredRows(path, "w_enc", feature_dim=1)   # stored (d_model, d_sae)
    enc.rows(torch.tensor([7, 3]))                    # (2, d_model): features 7 and 3
    dec = StoredRows(path, "w_dec", tail=(slice(2, None),))  # stored (d_sae, n_layers, d_model)
    dec.rows(torch.tensor([5]))                       # (1, n_layers - 2, d_model)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from circuitgraph._finite import first_nonfinite
from circuitgraph.errors import LoadError, NumericalError

__all__ = ["LAZY_ENCODER_BYTES", "StoredRows", "check_finite"]

#: per-layer dictionaries whose encoders together exceed this are read lazily by default (as CLTs):
#: each layer's encoder is read when its activations are computed and not kept
LAZY_ENCODER_BYTES = 2**30

#: a column-stored matrix read by more runs of consecutive features than this is read whole
_MAX_STRIDED_RUNS = 64


def check_finite(t: torch.Tensor, where: str, name: str) -> None:
    """One-line NumericalError naming the file and tensor when ``t`` holds NaN or inf."""
    bad = first_nonfinite(t)
    if bad is not None:
        raise NumericalError(f"{where}: {name} holds NaN or inf (first at index {bad}); "
                             "re-export the dictionary with finite weights")


@dataclass
class StoredRows:
    """Matrix ``key`` of safetensors file ``path``, read by feature.

    ``feature_dim``: the stored dimension that indexes features (0, or 1 for an encoder stored
    ``(d_model, d_sae)``); ``tail``: slices applied to the remaining dimensions (e.g. the output
    layers ``l..`` of a decoder stored ``(d_sae, n_layers, d_model)``); results are cast to
    ``dtype``."""

    path: Path
    key: str
    feature_dim: int = 0
    tail: tuple[slice, ...] = ()
    dtype: torch.dtype = torch.float32
    #: bytes materialised by reads so far (what the lazy path costs; the tests read it)
    bytes_read: int = field(default=0, compare=False)

    def _open(self) -> Any:
        try:
            return safe_open(str(self.path), framework="pt")
        except Exception as exc:  # noqa: BLE001
            raise LoadError(f"{self.path}: not a readable safetensors file ({type(exc).__name__}); "
                            "re-export it") from None

    @property
    def stored_shape(self) -> tuple[int, ...]:
        with self._open() as f:
            return tuple(f.get_slice(self.key).get_shape())

    @property
    def n_features(self) -> int:
        return self.stored_shape[self.feature_dim]

    def shape(self) -> tuple[int, ...]:
        """Feature-major shape of the whole matrix (after ``tail``)."""
        s = list(self.stored_shape)
        n = s.pop(self.feature_dim)
        rest = [len(range(*sl.indices(d))) for sl, d in zip(self.tail, s, strict=False)] + s[len(self.tail):]
        return (n, *rest)

    def nbytes_per_feature(self) -> int:
        out = 1
        for d in self.shape()[1:]:
            out *= d
        return out * torch.tensor([], dtype=self.dtype).element_size()

    def _index(self, a: int, b: int) -> tuple[slice, ...]:
        feature = slice(a, b)
        if self.feature_dim == 0:
            return (feature, *self.tail)
        return (*self.tail, feature) if self.tail else (slice(None), feature)

    def _finish(self, t: torch.Tensor) -> torch.Tensor:
        if self.feature_dim == 1:
            t = t.transpose(0, 1)
        check_finite(t, str(self.path), self.key)
        t = t.to(self.dtype).contiguous()
        self.bytes_read += t.numel() * t.element_size()
        return t

    def rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Features ``idx`` (any order, repeats allowed): ``(len(idx), ...)``."""
        idx = torch.as_tensor(idx, dtype=torch.long).cpu().reshape(-1)
        if idx.numel() == 0:
            return torch.zeros((0, *self.shape()[1:]), dtype=self.dtype)
        uniq, inv = idx.unique(return_inverse=True)  # sorted: one contiguous read per run
        ids = uniq.tolist()
        if ids[0] < 0 or ids[-1] >= self.n_features:
            raise IndexError(f"{self.path}: {self.key} has {self.n_features} features, asked for {ids[-1]}")
        n_runs = 1 + sum(1 for a, b in zip(ids, ids[1:], strict=False) if b != a + 1)
        if self.feature_dim == 1 and not self.tail and n_runs > _MAX_STRIDED_RUNS:
            # features stored as columns: each run is a strided read of every stored row; past a few
            # runs one read of the whole matrix (then a gather) is far faster, and gives the same values
            whole = self.stored_matrix_raw()
            self.bytes_read += whole.numel() * whole.element_size()
            return self._finish(whole[:, uniq])[inv]
        parts, start = [], 0
        with self._open() as f:
            sl = f.get_slice(self.key)
            for i in range(1, len(ids) + 1):
                if i == len(ids) or ids[i] != ids[i - 1] + 1:
                    parts.append(sl[self._index(ids[start], ids[i - 1] + 1)])
                    start = i
        whole = torch.cat(parts, dim=self.feature_dim) if len(parts) > 1 else parts[0]
        return self._finish(whole)[inv]

    def stored_matrix_raw(self) -> torch.Tensor:
        """The whole matrix as stored (no ``tail``, no cast, no check, not counted)."""
        with self._open() as f:
            return f.get_slice(self.key)[:]

    def stored_matrix(self) -> torch.Tensor:
        """The whole matrix in its stored orientation (``feature_dim`` 1: ``(d_in, d_sae)``), contiguous,
        checked and cast like :meth:`rows` -- for an encoder stored ``(d_in, d_sae)``, ``x @ W`` on it is
        the same computation as on the in-memory matrix (no transposed copy)."""
        if self.tail:
            raise ValueError(f"{self.path}: {self.key}: stored_matrix() of a sliced matrix (tail {self.tail})")
        t = self.stored_matrix_raw()
        check_finite(t, str(self.path), self.key)
        t = t.to(self.dtype).contiguous()
        self.bytes_read += t.numel() * t.element_size()
        return t

    def all(self) -> torch.Tensor:
        """The whole matrix, feature-major ``(n_features, ...)``."""
        with self._open() as f:
            t = f.get_slice(self.key)[self._index(0, self.n_features)]
        return self._finish(t)
