"""The worker side of a features run: shards of rows through the model and its dictionaries.

A worker loads the model and dictionaries once (:meth:`ShardJob.load`), then for each shard
(:class:`Shard`, consecutive rows of the dataset) runs every row alone (batch of one, so a
row's activations never depend on which rows share its shard), reads the values of the
selected units with TransformerLens hooks (:mod:`circuitgraph.features.units`: transcoder
features through their dictionaries, neurons' ``mlp.hook_post``, heads' (query, key) pairs),
and folds every active (unit, position[, key]) into a
:class:`~circuitgraph.features.topk.FeatureState`.  The shard's state is written atomically
to ``DIR/shards/<first>-<last>.npz`` (its completeness marker), then its record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitgraph._io import atomic_write_bytes, atomic_write_text
from circuitgraph.datasets.prompt import PromptOutput, one_line
from circuitgraph.features.topk import FeatureState
from circuitgraph.features.units import Selection, head_values, neuron_values, row_activations, select_units
from circuitgraph.pipeline.inputs import load_inputs, resolve_prompt_like
from circuitgraph.spec.dataset import Row
from circuitgraph.spec.root import Spec

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["HEAD_EXTRA", "Shard", "ShardJob", "make_shards", "shard_path", "shard_state"]

#: reduce a shard's buffered entries to their top-k when they exceed this many
_FLUSH_ENTRIES = 1 << 20


@dataclass(frozen=True)
class Shard:
    """Consecutive rows of the dataset: the unit handed to a worker and of resuming."""

    rows: tuple[Row, ...]

    @property
    def id(self) -> str:
        return f"{self.rows[0].number:08d}-{self.rows[-1].number:08d}"

    @property
    def number(self) -> int:
        return self.rows[0].number


def make_shards(rows: list[Row], size: int) -> list[Shard]:
    return [Shard(tuple(rows[i:i + size])) for i in range(0, len(rows), size)]


def shard_path(out_dir: Path, shard_id: str) -> Path:
    return out_dir / "shards" / f"{shard_id}.npz"


#: what a features worker loads once (:meth:`ShardJob.load`): the adapter, the dictionaries and the units
FeatureInputs = tuple["ModelAdapter", "Dictionary | None", Selection]


class ShardJob:
    """The executors' job of a features run (see :mod:`circuitgraph.datasets.executors`)."""

    def load(self, spec: Spec) -> FeatureInputs:
        adapter, dictionaries = load_inputs(spec)
        return adapter, dictionaries, select_units(spec, adapter, dictionaries)

    def run(self, spec: Spec, task: Shard, inputs: FeatureInputs) -> PromptOutput:
        record: dict[str, Any] = {"id": task.id, "row": task.number, "status": "ok", "error": None,
                                  "n_rows": len(task.rows)}
        try:
            state = shard_state(spec, task, *inputs)
        except Exception as exc:  # noqa: BLE001 - recorded; the driver reports failed shards
            record.update({"status": "failed", "error": one_line(exc)})
            return PromptOutput(record)
        record["shard"] = f"shards/{task.id}.npz"
        return PromptOutput(record, {record["shard"]: state.to_bytes()})

    def commit(self, out_dir: Path, output: PromptOutput, attempts: int = 1) -> dict[str, Any]:
        for rel, data in output.files.items():
            atomic_write_bytes(out_dir / rel, data)
        record = dict(output.record, attempts=attempts)
        atomic_write_text(out_dir / "shards" / f"{record['id']}.json", json.dumps(record, indent=1) + "\n")
        return record

    def failed(self, task: Shard, error: str) -> PromptOutput:
        return PromptOutput({"id": task.id, "row": task.number, "status": "failed", "error": error,
                             "n_rows": len(task.rows)})


def shard_state(spec: Spec, shard: Shard, adapter: ModelAdapter, dictionaries: Dictionary | None,
                selection: Selection, *,
                flush_entries: int = _FLUSH_ENTRIES) -> FeatureState:
    """The :class:`FeatureState` of one shard's rows.

    Every active value of every unit feeds the statistics; only the candidates that beat the
    shard's current k-th activation of their unit (:meth:`FeatureState.thresholds`, exact since
    rows come in order and a later row loses ties) get a context window."""
    f = spec.features
    k, c = f.top_k, f.context
    heads = selection.units == "heads"
    width = (2 if heads else 1) * (2 * c + 1)
    n_extra = len(HEAD_EXTRA) if heads else 0
    offsets = dict(zip(selection.layers, selection.offsets, strict=False))
    index_of = dict(zip(selection.layers, selection.indices, strict=False))
    bos = adapter.tokenizer.bos_id if adapter.tokenizer is not None else None
    state = FeatureState.empty(k, width, n_extra)
    thr = state.thresholds(selection.n_features)
    buffer: list[dict[str, np.ndarray]] = []
    buffered = 0
    n_seen = 0

    def flush() -> None:
        nonlocal state, buffer, buffered, thr
        if buffer:
            cols = {name: np.concatenate([b[name] for b in buffer]) for name in buffer[0]}
            state = state.merge(FeatureState.from_entries(k, width, 0, **cols))
            thr = state.thresholds(selection.n_features)
        buffer, buffered = [], 0

    for row in shard.rows:
        tokens = resolve_prompt_like(row.prompt, adapter, where=f"row {row.number} (id {row.id}) prompt")
        n = len(tokens)
        first = 1 if (not f.include_bos and bos is not None and tokens[0] == bos) else 0
        tok = np.asarray(tokens, dtype=np.int32)
        if heads:
            n_seen += _pair_count(n, first, adapter.facts.causal)
            values = head_values(adapter, selection.layers, selection.metrics, tokens)
            for layer in selection.layers:
                entries = _head_entries(values[layer], index_of[layer], offsets[layer], selection.metrics, thr,
                                        row.number, first, tok, c, adapter.facts.causal)
                if entries is not None:
                    buffer.append(entries)
                    buffered += entries["all_g"].size
        else:
            n_seen += n - first
            acts = row_activations(adapter, dictionaries, selection.layers, tokens) \
                if selection.units == "features" else neuron_values(adapter, selection.layers, tokens)
            for layer in selection.layers:
                a = acts[layer]
                idx = index_of[layer]
                if idx is not None:
                    a = a[:, torch.as_tensor(idx)]
                entries = _token_entries(a.numpy(), offsets[layer], thr, row.number, first, tok, c)
                if entries is not None:
                    buffer.append(entries)
                    buffered += entries["all_g"].size
        if buffered > flush_entries:
            flush()
    flush()
    state.n_tokens = n_seen
    return state


#: the values an attention head's example records at its pair, whatever it is ranked by
HEAD_EXTRA = ("attention", "score", "norm")


def _windows(centre: np.ndarray, n: int, c: int, tok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(positions clipped, valid, token ids or -1)`` of the ``2c+1`` windows around ``centre``."""
    window = centre[:, None] + np.arange(-c, c + 1)[None, :]
    valid = (window >= 0) & (window < n)
    clipped = np.clip(window, 0, n - 1)
    return clipped, valid, np.where(valid, tok[clipped], -1).astype(np.int32)


def _token_entries(a: np.ndarray, offset: int, thr: np.ndarray, row: int, first: int, tok: np.ndarray,
                   c: int) -> dict[str, np.ndarray] | None:
    """One layer's entries of a row for features and neurons: ``a`` ``(pos, units)``."""
    n = a.shape[0]
    pos, col = np.nonzero(a[first:])
    if pos.size == 0:
        return None
    pos = pos + first
    act = a[pos, col]
    g = offset + col.astype(np.int64)
    cand = act > thr[g]
    cp, cc = pos[cand], col[cand]
    clipped, valid, win_tokens = _windows(cp, n, c, tok)
    win_acts = np.where(valid, a[clipped, cc[:, None]], 0.0).astype(np.float32)
    return {"g": g[cand], "act": act[cand], "row": np.full(cp.size, row, np.int64), "pos": cp,
            "start": np.maximum(cp - c, 0), "win_tokens": win_tokens, "win_acts": win_acts, "all_g": g,
            "all_act": act}


def _pair_count(n: int, first: int, causal: bool) -> int:
    m = n - first
    return m * (m + 1) // 2 if causal else m * m


def _head_entries(v: torch.Tensor, idx: np.ndarray | None, offset: int, metrics: tuple[str, ...], thr: np.ndarray,
                  row: int, first: int, tok: np.ndarray, c: int, causal: bool) -> dict[str, np.ndarray] | None:
    """One layer's entries of a row for heads: ``v`` ``(metrics, heads, query, key)``; each
    entry is a (head, metric, query, key) with a non-zero value, its windows around the query
    and around the key (the head's metric from the query to each token there; 0 where it cannot
    attend) and the pair's attention, score and norm (NaN for a metric not computed)."""
    if idx is not None:
        v = v[:, torch.as_tensor(idx)]
    a = v.numpy()
    M, H, n, _ = a.shape
    if first >= n:
        return None
    allowed = np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)
    allowed[:first, :] = False
    allowed[:, :first] = False
    masked = np.where(allowed[None, None], a, np.float32(0))  # a score is -inf where a head cannot attend
    m_i, h_i, q_i, k_i = np.nonzero(masked)
    if q_i.size == 0:
        return None
    act = a[m_i, h_i, q_i, k_i]
    g = offset + h_i.astype(np.int64) * M + m_i
    cand = act > thr[g]
    cm, ch, cq, ck = m_i[cand], h_i[cand], q_i[cand], k_i[cand]
    qc, qvalid, qtok = _windows(cq, n, c, tok)
    kc, kvalid, ktok = _windows(ck, n, c, tok)
    qacts = np.where(qvalid, masked[cm[:, None], ch[:, None], cq[:, None], qc], 0.0)
    kacts = np.where(kvalid, masked[cm[:, None], ch[:, None], cq[:, None], kc], 0.0)
    extra = np.full((cq.size, len(HEAD_EXTRA)), np.nan, dtype=np.float32)
    for j, name in enumerate(HEAD_EXTRA):
        if name in metrics:
            extra[:, j] = a[metrics.index(name), ch, cq, ck]
    # the key window's start rides in the row of key positions' context: start + (2c+1) columns
    return {"g": g[cand], "act": act[cand], "row": np.full(cq.size, row, np.int64), "pos": cq, "key": ck,
            "start": np.maximum(cq - c, 0), "win_tokens": np.concatenate([qtok, ktok], axis=1),
            "win_acts": np.concatenate([qacts, kacts], axis=1).astype(np.float32), "extra": extra,
            "all_g": g, "all_act": act}
