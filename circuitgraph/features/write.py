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

Each is a list of ``{token, token_id, value}`` structs, strongest first.  A neuron's are the
same with ``W_out[i]`` for the decoder row and ``W_in[:, i]`` through ``ln2`` for the encoder
direction (its value for a gated MLP), and, for gated MLPs, ``top_gate_tokens``: the same for
the gate's column of ``W_gate``.  Heads have no token lists.

Heads (``units: heads``): ``features.parquet`` has a row per (head, metric) with column
``metric`` and ``n_pairs`` (the (query, key) pairs seen) in place of ``n_tokens``;
``examples.parquet`` adds ``metric``, ``key_position``, the pair's ``attention``, ``score``
and ``norm`` (null where not computed), and the key's window (``key_tokens``, ``key_start``,
``key_activations``: the head's metric from the query to each of those tokens, ``key_text``);
in ``text`` and ``key_text`` the query token is between ``«`` and ``»``, the key token between
``⟦`` and ``⟧``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from circuitgraph.datasets.reduce import parquet_bytes
from circuitgraph.features.stream import HEAD_EXTRA
from circuitgraph.features.topk import FeatureState, exact_means, quantiles
from circuitgraph.features.units import Selection
from circuitgraph.queries.weights import (
    feature_reader_directions,
    feature_writer_directions,
    neuron_reader_directions,
    neuron_writer_directions,
)
from circuitgraph.spec.features import quantile_column

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["KEY_CLOSE", "KEY_OPEN", "MARK_CLOSE", "MARK_OPEN", "TOKEN_STRUCT", "examples_table", "features_table",
           "token_lists"]

#: the marks around the activating token (a head's query token) in ``examples.parquet``'s ``text``
MARK_OPEN, MARK_CLOSE = "\u00ab", "\u00bb"
#: the marks around a head's key token
KEY_OPEN, KEY_CLOSE = "\u27e6", "\u27e7"
TOKEN_STRUCT = pa.struct([("token", pa.string()), ("token_id", pa.int64()), ("value", pa.float64())])
#: output logits computed at once: features x vocabulary entries (float64)
_CHUNK_ENTRIES = 1 << 24


def token_lists(adapter: ModelAdapter, dictionaries: Dictionary | None, selection: Selection, top: int,
                token_str: Callable[[int], str]) -> dict[str, list[list[dict[str, Any]]]]:
    """``{column: one list of {token, token_id, value} per unit}`` for the token columns
    (``{}`` for heads)."""
    if selection.units == "heads":
        return {}
    W_U = adapter.W_U.double()  # (d_model, d_vocab)
    G = adapter.norm("ln_final").reader_direction(W_U.T.contiguous())  # (d_vocab, d_model)
    W_E = adapter.W_E.double()  # (d_vocab, d_model)
    top = min(top, G.shape[0])
    gate = selection.units == "neurons" and adapter.facts.gated_mlp
    out: dict[str, list[list[dict[str, Any]]]] = {"top_output_tokens": [], "bottom_output_tokens": [],
                                                  "top_input_tokens": [], **({"top_gate_tokens": []} if gate else {})}
    for layer, size, idx in zip(selection.layers, selection.sizes, selection.indices, strict=False):
        ids = torch.arange(size) if idx is None else torch.as_tensor(idx)
        chunk = max(1, _CHUNK_ENTRIES // G.shape[0])
        for lo in range(0, ids.numel(), chunk):
            part = ids[lo:lo + chunk]
            if selection.units == "neurons":
                v = neuron_writer_directions(adapter, layer, part)
                g = neuron_reader_directions(adapter, layer, part)
            else:
                v = sum(d for d, _ in feature_writer_directions(adapter, dictionaries, layer, part))
                g = feature_reader_directions(adapter, dictionaries, layer, part)
            logits = v @ G.T
            inputs = g @ W_E.T
            lists = [("top_output_tokens", logits, True), ("bottom_output_tokens", logits, False),
                     ("top_input_tokens", inputs, True)]
            if gate:
                lists.append(("top_gate_tokens", neuron_reader_directions(adapter, layer, part, "W_gate") @ W_E.T,
                              True))
            for column, values, largest in lists:
                vals, toks = torch.topk(values, top, dim=-1, largest=largest, sorted=True)
                for vs, ts in zip(vals.tolist(), toks.tolist(), strict=False):
                    out[column].append([{"token": token_str(t), "token_id": int(t), "value": float(x)}
                                        for t, x in zip(ts, vs, strict=False)])
    return out


def features_table(state: FeatureState, selection: Selection, qs: tuple[float, ...],
                   tokens: dict[str, list[list[dict[str, Any]]]]) -> pa.Table:
    """One row per unit: identity (and a head's metric), counts, density, max, mean, quantiles,
    token lists."""
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
        **({"metric": pa.array(selection.metric_names(), type=pa.string())} if selection.metrics else {}),
        ("n_pairs" if selection.units == "heads" else "n_tokens"):
            pa.array(np.full(n, state.n_tokens, dtype=np.int64), type=pa.int64()),
        "n_active": pa.array(n_active, type=pa.int64()),
        "density": floats(np.asarray(density, dtype=np.float64)),
        "max_activation": floats(max_act),
        "mean_active_activation": floats(means),
    }
    for j, q in enumerate(qs):
        columns[quantile_column(q)] = floats(qv[:, j])
    for name, lists in tokens.items():
        columns[name] = pa.array(lists, type=pa.list_(TOKEN_STRUCT))
    return pa.table(columns)


def _marked(decode: Callable[[list[int]], str], toks: list[int], start: int,
            marks: list[tuple[int, str, str]]) -> str:
    """The window ``toks`` (``toks[0]`` at position ``start``) decoded, each marked position
    between its two marks (positions outside the window are left out)."""
    merged: dict[int, tuple[str, str]] = {}
    for p, o, c in marks:  # a head's query and key at one position: «⟦token⟧»
        if 0 <= p - start < len(toks):
            o0, c0 = merged.get(p - start, ("", ""))
            merged[p - start] = (o0 + o, c + c0)
    cuts = sorted((i, o, c) for i, (o, c) in merged.items())
    parts, at = [], 0
    for i, o, c in cuts:
        parts += [decode(toks[at:i]), o, decode(toks[i:i + 1]), c]
        at = i + 1
    parts.append(decode(toks[at:]))
    return "".join(parts)


def examples_table(state: FeatureState, selection: Selection, row_ids: dict[int, str],
                   decode: Callable[[list[int]], str]) -> pa.Table:
    """One row per kept example: ``layer, index, rank, row_id, row, position, activation,
    tokens, start, activations, text`` (and a head's columns, see the module docstring)."""
    layer, index = selection.layer_index()
    heads = selection.units == "heads"
    g = state.g
    starts = np.searchsorted(g, g, side="left")
    rank = np.arange(g.size) - starts
    w = state.width // 2 if heads else state.width
    c = (w - 1) // 2
    tokens, acts, texts, ktokens, kacts, ktexts = [], [], [], [], [], []
    for i in range(g.size):
        wt, wa = state.win_tokens[i], state.win_acts[i]
        valid = wt[:w] >= 0
        toks = wt[:w][valid].astype(np.int64).tolist()
        tokens.append(toks)
        acts.append(wa[:w][valid].tolist())
        p, start = int(state.pos[i]), int(state.start[i])
        if not heads:
            texts.append(_marked(decode, toks, start, [(p, MARK_OPEN, MARK_CLOSE)]))
            continue
        key = int(state.key[i])
        marks = [(p, MARK_OPEN, MARK_CLOSE), (key, KEY_OPEN, KEY_CLOSE)]
        texts.append(_marked(decode, toks, start, marks))
        kvalid = wt[w:] >= 0
        ktoks = wt[w:][kvalid].astype(np.int64).tolist()
        ktokens.append(ktoks)
        kacts.append(wa[w:][kvalid].tolist())
        ktexts.append(_marked(decode, ktoks, max(key - c, 0), marks))
    columns: dict[str, pa.Array] = {
        "layer": pa.array(layer[g], type=pa.int64()),
        "index": pa.array(index[g], type=pa.int64()),
        **({"metric": pa.array([selection.metrics[int(x) % selection.per_unit] for x in g.tolist()],
                               type=pa.string())} if heads else {}),
        "rank": pa.array(rank + 1, type=pa.int64()),
        "row_id": pa.array([row_ids[int(r)] for r in state.row.tolist()], type=pa.string()),
        "row": pa.array(state.row, type=pa.int64()),
        "position": pa.array(state.pos, type=pa.int64()),
    }
    if heads:
        columns["key_position"] = pa.array(state.key, type=pa.int64())
    columns["activation"] = pa.array(state.act, type=pa.float32())
    if heads:
        for j, name in enumerate(HEAD_EXTRA):
            values = state.extra[:, j]
            columns[name] = pa.array(values, type=pa.float32(), mask=np.isnan(values))
    columns.update({
        "tokens": pa.array(tokens, type=pa.list_(pa.int64())),
        "start": pa.array(state.start, type=pa.int64()),
        "activations": pa.array(acts, type=pa.list_(pa.float32())),
        "text": pa.array(texts, type=pa.string()),
    })
    if heads:
        columns.update({
            "key_tokens": pa.array(ktokens, type=pa.list_(pa.int64())),
            "key_start": pa.array(np.maximum(state.key - c, 0), type=pa.int64()),
            "key_activations": pa.array(kacts, type=pa.list_(pa.float32())),
            "key_text": pa.array(ktexts, type=pa.string()),
        })
    return pa.table(columns)


def table_bytes(table: pa.Table) -> bytes:
    return parquet_bytes(table)
