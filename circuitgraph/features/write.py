"""``features.parquet`` and ``examples.parquet`` from a merged :class:`FeatureState`.

Both tables are sorted (features by ``(layer, index)``, examples by ``(layer, index, rank)``),
built from exact values only, and written with fixed Parquet options and no timestamps
(:func:`circuitgraph.datasets.reduce.parquet_bytes`), so the same dataset and spec give the
same bytes however the run was split.

Output and input tokens (weight-only, the same on every prompt):

* ``top_output_tokens`` / ``bottom_output_tokens``: the feature's decoder direction read by
  the unembedding through the final norm, ``v . P(gamma_f * W_U[:, t])`` (the direct effect on
  logit ``t`` per unit activation, before the prompt's ``1/sigma``); for a cross-layer
  transcoder ``v`` is the **sum** of its decoder rows over the layers it writes (each write
  reaches the unembedding directly, so the sum is its total direct effect);
* ``top_input_tokens``: the de-embedding ``W_E[t] . g``, ``g`` the feature's encoder direction
  through its input norm (:func:`circuitgraph.queries.weights.feature_reader_directions`).

Each is a list of ``{token, token_id, value}`` structs, strongest first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from circuitgraph.datasets.reduce import parquet_bytes
from circuitgraph.features.stream import Selection
from circuitgraph.features.topk import FeatureState, exact_means, quantiles
from circuitgraph.queries.weights import (
    feature_reader_directions,
    feature_writer_directions,
)
from circuitgraph.spec.features import quantile_column

__all__ = ["MARK_CLOSE", "MARK_OPEN", "TOKEN_STRUCT", "examples_table", "features_table", "token_lists"]

#: the marks around the activating token in ``examples.parquet``'s ``text``
MARK_OPEN, MARK_CLOSE = "\u00ab", "\u00bb"
TOKEN_STRUCT = pa.struct([("token", pa.string()), ("token_id", pa.int64()), ("value", pa.float64())])
#: output logits computed at once: features x vocabulary entries (float64)
_CHUNK_ENTRIES = 1 << 24


def token_lists(adapter: Any, dictionaries: Any, selection: Selection, top: int,
                token_str: Callable[[int], str]) -> dict[str, list[list[dict[str, Any]]]]:
    """``{column: one list of {token, token_id, value} per feature}`` for the three token columns."""
    W_U = adapter.W_U.double()  # (d_model, d_vocab)
    G = adapter.norm("ln_final").reader_direction(W_U.T.contiguous())  # (d_vocab, d_model)
    W_E = adapter.W_E.double()  # (d_vocab, d_model)
    top = min(top, G.shape[0])
    out: dict[str, list[list[dict[str, Any]]]] = {"top_output_tokens": [], "bottom_output_tokens": [],
                                                  "top_input_tokens": []}
    for layer, size, idx in zip(selection.layers, selection.sizes, selection.indices):
        ids = torch.arange(size) if idx is None else torch.as_tensor(idx)
        chunk = max(1, _CHUNK_ENTRIES // G.shape[0])
        for lo in range(0, ids.numel(), chunk):
            part = ids[lo:lo + chunk]
            v = sum(d for d, _ in feature_writer_directions(adapter, dictionaries, layer, part))
            logits = v @ G.T
            g = feature_reader_directions(adapter, dictionaries, layer, part)
            inputs = g @ W_E.T
            for column, values, largest in (("top_output_tokens", logits, True),
                                            ("bottom_output_tokens", logits, False),
                                            ("top_input_tokens", inputs, True)):
                vals, toks = torch.topk(values, top, dim=-1, largest=largest, sorted=True)
                for vs, ts in zip(vals.tolist(), toks.tolist()):
                    out[column].append([{"token": token_str(t), "token_id": int(t), "value": float(x)}
                                        for t, x in zip(ts, vs)])
    return out


def features_table(state: FeatureState, selection: Selection, qs: tuple[float, ...],
                   tokens: dict[str, list[list[dict[str, Any]]]]) -> pa.Table:
    """One row per feature: identity, counts, density, max, mean, quantiles, token lists."""
    n = selection.n_features
    layer, index = selection.layer_index()
    n_active = state.n_active(n)
    max_act = np.full(n, np.nan)
    bounds = np.searchsorted(state.g, np.arange(n + 1))
    has = bounds[1:] > bounds[:-1]
    max_act[has] = state.act[bounds[:-1][has]]
    means = exact_means(state, n)
    qv = quantiles(state, n, qs)
    density = n_active / state.n_tokens if state.n_tokens else np.full(n, np.nan)

    def floats(values: np.ndarray) -> pa.Array:
        return pa.array(values.astype(np.float64), type=pa.float64(), mask=np.isnan(values))

    columns: dict[str, pa.Array] = {
        "layer": pa.array(layer, type=pa.int64()),
        "index": pa.array(index, type=pa.int64()),
        "n_tokens": pa.array(np.full(n, state.n_tokens, dtype=np.int64), type=pa.int64()),
        "n_active": pa.array(n_active, type=pa.int64()),
        "density": floats(np.asarray(density, dtype=np.float64)),
        "max_activation": floats(max_act),
        "mean_active_activation": floats(means),
    }
    for j, q in enumerate(qs):
        columns[quantile_column(q)] = floats(qv[:, j])
    for name in ("top_output_tokens", "bottom_output_tokens", "top_input_tokens"):
        columns[name] = pa.array(tokens[name], type=pa.list_(TOKEN_STRUCT))
    return pa.table(columns)


def examples_table(state: FeatureState, selection: Selection, row_ids: dict[int, str],
                   decode: Callable[[list[int]], str]) -> pa.Table:
    """One row per kept example: ``layer, index, rank, row_id, row, position, activation,
    tokens, start, activations, text``."""
    layer, index = selection.layer_index()
    g = state.g
    starts = np.searchsorted(g, g, side="left")
    rank = np.arange(g.size) - starts
    tokens, acts, texts = [], [], []
    for i in range(g.size):
        valid = state.win_tokens[i] >= 0
        toks = state.win_tokens[i][valid].astype(np.int64).tolist()
        tokens.append(toks)
        acts.append(state.win_acts[i][valid].tolist())
        at = int(state.pos[i] - state.start[i])
        texts.append(decode(toks[:at]) + MARK_OPEN + decode(toks[at:at + 1]) + MARK_CLOSE + decode(toks[at + 1:]))
    return pa.table({
        "layer": pa.array(layer[g], type=pa.int64()),
        "index": pa.array(index[g], type=pa.int64()),
        "rank": pa.array(rank + 1, type=pa.int64()),
        "row_id": pa.array([row_ids[int(r)] for r in state.row.tolist()], type=pa.string()),
        "row": pa.array(state.row, type=pa.int64()),
        "position": pa.array(state.pos, type=pa.int64()),
        "activation": pa.array(state.act, type=pa.float32()),
        "tokens": pa.array(tokens, type=pa.list_(pa.int64())),
        "start": pa.array(state.start, type=pa.int64()),
        "activations": pa.array(acts, type=pa.list_(pa.float32())),
        "text": pa.array(texts, type=pa.string()),
    })


def table_bytes(table: pa.Table) -> bytes:
    return parquet_bytes(table)
