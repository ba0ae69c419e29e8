"""The worker side of a features run: shards of rows through the model and its dictionaries.

A worker loads the model and dictionaries once (:meth:`ShardJob.load`), then for each shard
(:class:`Shard`, consecutive rows of the dataset) runs every row alone (batch of one, so a
row's activations never depend on which rows share its shard), reads each selected
dictionary layer's input with TransformerLens hooks (``hook_resid_mid`` or
``ln2.hook_normalized``, as the graph's feature nodes read it:
:func:`~circuitgraph.attribution.linearisation.dictionary_input`) and the dictionary's own
activation function, and folds every active (feature, position) into a
:class:`~circuitgraph.features.topk.FeatureState`.  The shard's state is written atomically
to ``DIR/shards/<first>-<last>.npz`` (its completeness marker), then its record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from circuitgraph._io import atomic_write_bytes, atomic_write_text
from circuitgraph.attribution.linearisation import dictionary_input
from circuitgraph.datasets.prompt import PromptOutput, one_line
from circuitgraph.errors import SpecError
from circuitgraph.export.html import read_graph_file
from circuitgraph.features.topk import FeatureState
from circuitgraph.pipeline.inputs import load_inputs, resolve_prompt_like
from circuitgraph.spec.dataset import Row
from circuitgraph.spec.root import Spec

__all__ = ["Selection", "Shard", "ShardJob", "make_shards", "row_activations", "shard_path"]

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


@dataclass(frozen=True)
class Selection:
    """The features of a run: per dictionary layer, the sorted feature indices (``None``: all
    ``d_sae`` of them); a feature's global number ``g`` is its row in ``features.parquet``."""

    layers: tuple[int, ...]
    sizes: tuple[int, ...]
    indices: tuple[np.ndarray | None, ...]

    @property
    def counts(self) -> list[int]:
        return [size if idx is None else int(idx.size) for size, idx in zip(self.sizes, self.indices)]

    @property
    def offsets(self) -> list[int]:
        return [int(x) for x in np.r_[0, np.cumsum(self.counts)][:-1]]

    @property
    def n_features(self) -> int:
        return int(sum(self.counts))

    def layer_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(layer, index)`` of every feature, in ``g`` order."""
        layers, indices = [], []
        for layer, size, idx in zip(self.layers, self.sizes, self.indices):
            ids = np.arange(size, dtype=np.int64) if idx is None else idx.astype(np.int64)
            layers.append(np.full(ids.size, layer, dtype=np.int64))
            indices.append(ids)
        return np.concatenate(layers), np.concatenate(indices)


def select_features(spec: Spec, dictionaries: Any) -> Selection:
    """The run's :class:`Selection` from ``features.layers`` / ``features.features``; one-line
    errors for layers without a dictionary and graph files with no feature of them."""
    f = spec.features
    available = sorted(dictionaries.layers) if dictionaries is not None else []
    if not available:
        raise SpecError([("transcoders", "features: needs dictionaries (transcoders or a CLT); add transcoders:")])
    layers = available if f.layers == "all" else list(f.layers)
    missing = [layer for layer in layers if layer not in available]
    if missing:
        raise SpecError([("features.layers", f"layers {missing} have no dictionary; the dictionaries have layers "
                                            f"{available}")])
    wanted: dict[int, set[int]] | None = None
    if f.features != "all":
        path = f.features.from_graph
        try:
            graph = read_graph_file(path).graph
        except Exception as exc:  # noqa: BLE001 - any unreadable graph file is one line
            raise SpecError([("features.features.from_graph", f"cannot read the graph file {path}: {one_line(exc)}")])
        wanted = {}
        for node in graph.nodes:
            if node.kind == "feature" and node.layer in layers:
                wanted.setdefault(node.layer, set()).add(int(node.index))
        if not wanted:
            raise SpecError([("features.features.from_graph", f"{path} has no feature node in layers {layers}")])
        layers = sorted(wanted)
    sizes, indices = [], []
    for layer in layers:
        size = int(dictionaries[layer].d_sae)
        sizes.append(size)
        if wanted is None:
            indices.append(None)
            continue
        idx = np.array(sorted(wanted[layer]), dtype=np.int64)
        if idx.size and (idx[-1] >= size or idx[0] < 0):
            raise SpecError([("features.features.from_graph", f"feature {int(idx[-1])} of layer {layer} is out of "
                             f"range: the dictionary has {size} features (0-{size - 1})")])
        indices.append(idx)
    return Selection(tuple(layers), tuple(sizes), tuple(indices))


def row_activations(adapter: Any, dictionaries: Any, layers: tuple[int, ...], tokens: list[int]) -> dict[int, torch.Tensor]:
    """``{layer: activations (pos, d_sae) float32}`` of one row: the dictionaries' own
    activation functions on the inputs TransformerLens's hooks record."""
    names = set()
    for layer in layers:
        site = dictionaries[layer].input_site
        names.add(adapter.hook_resid_mid(layer) if site == "raw" else adapter.hook_norm_normalized("ln2", layer))
    toks = torch.tensor([tokens], device=adapter.device)
    with torch.no_grad():
        _, cache = adapter.model.run_with_cache(toks, names_filter=lambda n: n in names,
                                                stop_at_layer=max(layers) + 1)
        out = {}
        for layer in layers:
            d = dictionaries[layer]
            mid = cache[adapter.hook_resid_mid(layer)][0] if d.input_site == "raw" else None
            ln2 = cache[adapter.hook_norm_normalized("ln2", layer)][0] if d.input_site != "raw" else None
            x = dictionary_input(adapter, d.input_site, layer, mid, ln2)
            out[layer] = d.activation(x).detach().to(device="cpu", dtype=torch.float32)
    return out


class ShardJob:
    """The executors' job of a features run (see :mod:`circuitgraph.datasets.executors`)."""

    def load(self, spec: Spec) -> Any:
        adapter, dictionaries = load_inputs(spec)
        return adapter, dictionaries, select_features(spec, dictionaries)

    def run(self, spec: Spec, task: Shard, inputs: Any) -> PromptOutput:
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


def shard_state(spec: Spec, shard: Shard, adapter: Any, dictionaries: Any, selection: Selection) -> FeatureState:
    """The :class:`FeatureState` of one shard's rows."""
    f = spec.features
    k, c = f.top_k, f.context
    width = 2 * c + 1
    offsets = dict(zip(selection.layers, selection.offsets))
    index_of = dict(zip(selection.layers, selection.indices))
    bos = adapter.tokenizer.bos_id if adapter.tokenizer is not None else None
    state = FeatureState.empty(k, width)
    buffer: list[tuple[np.ndarray, ...]] = []
    buffered = 0
    n_tokens = 0

    def flush() -> None:
        nonlocal state, buffer, buffered
        if buffer:
            cols = [np.concatenate(parts) for parts in zip(*buffer)]
            state = state.merge(FeatureState.from_entries(k, width, 0, *cols))
        buffer, buffered = [], 0

    for row in shard.rows:
        tokens = resolve_prompt_like(row.prompt, adapter, where=f"row {row.number} (id {row.id}) prompt")
        n = len(tokens)
        first = 1 if (not f.include_bos and bos is not None and tokens[0] == bos) else 0
        n_tokens += n - first
        tok = np.asarray(tokens, dtype=np.int32)
        acts = row_activations(adapter, dictionaries, selection.layers, tokens)
        for layer in selection.layers:
            a = acts[layer]
            idx = index_of[layer]
            if idx is not None:
                a = a[:, torch.as_tensor(idx)]
            a = a.numpy()
            pos, col = np.nonzero(a[first:])
            if pos.size == 0:
                continue
            pos = pos + first
            window = pos[:, None] + np.arange(-c, c + 1)[None, :]
            valid = (window >= 0) & (window < n)
            clipped = np.clip(window, 0, n - 1)
            win_acts = np.where(valid, a[clipped, col[:, None]], 0.0).astype(np.float32)
            win_tokens = np.where(valid, tok[clipped], -1).astype(np.int32)
            buffer.append((offsets[layer] + col.astype(np.int64), a[pos, col], np.full(pos.size, row.number),
                           pos, np.maximum(pos - c, 0), win_tokens, win_acts))
            buffered += pos.size
        if buffered > _FLUSH_ENTRIES:
            flush()
    flush()
    state.n_tokens = n_tokens
    return state
