"""The units of a dashboards run and what they read on one row (``features.units``).

* ``features``: transcoder / CLT features; a row's activations are the dictionaries' own
  activation functions on the inputs TransformerLens's hooks record (as the graph's feature
  nodes read them, :func:`~circuitgraph.attribution.linearisation.dictionary_input`);
* ``neurons``: the MLP's hidden activation ``mlp.hook_post`` per token (GELU/ReLU:
  ``act(pre)``; gated: ``act(gate) * value``), the graph's neuron node activation;
* ``heads``: attention heads, whose "activations" are (query, key) position pairs, one
  ranking per ``head_metrics`` entry: ``attention`` the pattern weight ``A[q, k]``
  (``attn.hook_pattern``), ``score`` the pre-softmax score (``attn.hook_attn_scores``),
  ``norm`` the norm of what the head writes at ``q`` from key ``k``:
  ``A[q, k] * ||v_k W_O^h||`` (``v_k`` from ``attn.hook_v``, a grouped-query head reading its
  key-value head's values; ``b_O`` is the layer's, not a head's, and is left out).

A unit's global number ``g`` (its row in ``features.parquet``) follows the :class:`Selection`:
layers in order, indices ascending, and for heads each head's metrics in ``head_metrics``
order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from circuitgraph.attribution.linearisation import dictionary_input
from circuitgraph.datasets.prompt import one_line
from circuitgraph.dictionaries.protocol import require_dictionary
from circuitgraph.errors import SpecError
from circuitgraph.export.html import read_graph_file
from circuitgraph.spec.root import Spec

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["Selection", "head_values", "neuron_values", "row_activations", "select_units"]


@dataclass(frozen=True)
class Selection:
    """The units of a run: per layer, the sorted unit indices (``None``: all ``size`` of them),
    and for heads the metrics each head is ranked by (``()`` otherwise); unit ``g``'s row in
    ``features.parquet`` is ``g``."""

    layers: tuple[int, ...]
    sizes: tuple[int, ...]
    indices: tuple[np.ndarray | None, ...]
    units: str = "features"
    metrics: tuple[str, ...] = ()

    @property
    def per_unit(self) -> int:
        """Rankings per unit: one per head metric for heads, else 1."""
        return max(1, len(self.metrics))

    @property
    def counts(self) -> list[int]:
        return [(size if idx is None else int(idx.size)) * self.per_unit for size, idx in zip(self.sizes, self.indices, strict=False)]

    @property
    def offsets(self) -> list[int]:
        return [int(x) for x in np.r_[0, np.cumsum(self.counts)][:-1]]

    @property
    def n_features(self) -> int:
        return int(sum(self.counts))

    def layer_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(layer, index)`` of every unit, in ``g`` order (a head repeated once per metric)."""
        layers, indices = [], []
        for layer, size, idx in zip(self.layers, self.sizes, self.indices, strict=False):
            ids = np.arange(size, dtype=np.int64) if idx is None else idx.astype(np.int64)
            ids = np.repeat(ids, self.per_unit)
            layers.append(np.full(ids.size, layer, dtype=np.int64))
            indices.append(ids)
        return np.concatenate(layers), np.concatenate(indices)

    def metric_names(self) -> list[str]:
        """Each unit's metric in ``g`` order (heads only)."""
        return [self.metrics[g % self.per_unit] for g in range(self.n_features)] if self.metrics else []


def _wanted(spec: Spec, layers: list[int]) -> dict[int, set[int]] | None:
    """``{layer: indices}`` of the graph file's nodes of the run's unit kind (``None``: all units)."""
    f = spec.features
    if f.features == "all":
        return None
    path = f.features.from_graph
    try:
        graph = read_graph_file(path).graph
    except Exception as exc:  # any unreadable graph file is one line
        raise SpecError([("features.features.from_graph", f"cannot read the graph file {path}: {one_line(exc)}")]) from exc
    wanted: dict[int, set[int]] = {}
    for node in graph.nodes:
        if node.kind == f.node_kind and node.layer in layers:
            wanted.setdefault(node.layer, set()).add(int(node.index))
    if not wanted:
        how = {"features": "", "neurons": "; build the graph with graph: {mlp: neurons}",
               "heads": "; build the graph with graph: {attention: heads}"}[f.units]
        raise SpecError([("features.features.from_graph", f"{path} has no {f.node_kind} node in layers {layers}{how}")])
    return wanted


def select_units(spec: Spec, adapter: ModelAdapter, dictionaries: Dictionary | None) -> Selection:
    """The run's :class:`Selection` from ``features.units`` / ``layers`` / ``features``; one-line
    errors for layers the model or the dictionaries lack and graph files with no such node."""
    f = spec.features
    facts = adapter.facts
    if f.units == "features":
        available = sorted(dictionaries.layers) if dictionaries is not None else []
        if not available:
            raise SpecError([("transcoders", "features: {units: features} needs dictionaries (transcoders or a "
                                             "CLT); add transcoders:, or give units: neurons or units: heads")])
        what = f"have no dictionary; the dictionaries have layers {available}"
    else:
        if f.units == "neurons" and (facts.attn_only or facts.num_experts):
            why = "has no MLP layers" if facts.attn_only else "routes its MLP neurons through experts"
            raise SpecError([("features.units", f"units: neurons: the model {why}; neuron dashboards read "
                                                "dense MLPs (give units: heads, or units: features with transcoders)")])
        available = list(range(facts.n_layers))
        what = f"are beyond the last layer, the model has {facts.n_layers} layers (0-{facts.n_layers - 1})"
    layers = available if f.layers == "all" else list(f.layers)
    missing = [layer for layer in layers if layer not in available]
    if missing:
        raise SpecError([("features.layers", f"layers {missing} {what}")])
    wanted = _wanted(spec, layers)
    if wanted is not None:
        layers = sorted(wanted)
    sizes, indices = [], []
    for layer in layers:
        size = int(dictionaries[layer].d_sae) if f.units == "features" else \
            (facts.d_mlp if f.units == "neurons" else facts.n_heads)
        sizes.append(size)
        if wanted is None:
            indices.append(None)
            continue
        idx = np.array(sorted(wanted[layer]), dtype=np.int64)
        if idx.size and (idx[-1] >= size or idx[0] < 0):
            raise SpecError([("features.features.from_graph", f"{f.node_kind} {int(idx[-1])} of layer {layer} is "
                             f"out of range: the layer has {size} (0-{size - 1})")])
        indices.append(idx)
    return Selection(tuple(layers), tuple(sizes), tuple(indices), f.units,
                     tuple(f.head_metrics) if f.units == "heads" else ())


def row_activations(adapter: ModelAdapter, dictionaries: Dictionary | None, layers: tuple[int, ...],
                    tokens: list[int]) -> dict[int, torch.Tensor]:
    """``{layer: activations (pos, d_sae) float32}`` of one row: the dictionaries' own
    activation functions on the inputs TransformerLens's hooks record."""
    names = set()
    for layer in layers:
        site = require_dictionary(dictionaries, "a feature dashboard")[layer].input_site
        names.add(adapter.hook_resid_mid(layer) if site == "raw" else adapter.hook_norm_normalized("ln2", layer))
    toks = torch.tensor([tokens], device=adapter.device)
    with torch.no_grad():
        _, cache = adapter.model.run_with_cache(toks, names_filter=lambda n: n in names,
                                                stop_at_layer=max(layers) + 1)
        out = {}
        for layer in layers:
            d = require_dictionary(dictionaries, "a feature dashboard")[layer]
            mid = cache[adapter.hook_resid_mid(layer)][0] if d.input_site == "raw" else None
            ln2 = cache[adapter.hook_norm_normalized("ln2", layer)][0] if d.input_site != "raw" else None
            x = dictionary_input(adapter, d.input_site, layer, mid, ln2)
            out[layer] = d.activation(x).detach().to(device="cpu", dtype=torch.float32)
    return out


def neuron_values(adapter: ModelAdapter, layers: tuple[int, ...], tokens: list[int]) -> dict[int, torch.Tensor]:
    """``{layer: mlp.hook_post (pos, d_mlp) float32}`` of one row (a batch of one)."""
    names = {adapter.hook_mlp_post(layer) for layer in layers}
    toks = torch.tensor([tokens], device=adapter.device)
    with torch.no_grad():
        _, cache = adapter.model.run_with_cache(toks, names_filter=lambda n: n in names,
                                                stop_at_layer=max(layers) + 1)
        return {layer: cache[adapter.hook_mlp_post(layer)][0].detach().to(device="cpu", dtype=torch.float32)
                for layer in layers}


def head_values(adapter: ModelAdapter, layers: tuple[int, ...], metrics: tuple[str, ...],
                tokens: list[int]) -> dict[int, torch.Tensor]:
    """``{layer: (len(metrics), n_heads, query, key) float32}`` of one row: each metric of
    every head at every (query, key) pair (see the module docstring); pairs a causal head
    cannot attend (key after query) hold whatever the hooks hold and are never read."""
    names = set()
    for layer in layers:
        names.add(adapter.hook_pattern(layer))
        if "score" in metrics:
            names.add(adapter.hook_attn_scores(layer))
        if "norm" in metrics:
            names.add(adapter.hook_v(layer))
    toks = torch.tensor([tokens], device=adapter.device)
    out = {}
    with torch.no_grad():
        _, cache = adapter.model.run_with_cache(toks, names_filter=lambda n: n in names,
                                                stop_at_layer=max(layers) + 1)
        for layer in layers:
            pattern = cache[adapter.hook_pattern(layer)][0]  # (heads, query, key)
            parts = []
            for metric in metrics:
                if metric == "attention":
                    parts.append(pattern)
                elif metric == "score":
                    parts.append(cache[adapter.hook_attn_scores(layer)][0])
                else:
                    v = cache[adapter.hook_v(layer)][0]  # (pos, kv_heads, d_head)
                    n_heads = pattern.shape[0]
                    if v.shape[1] != n_heads:  # grouped-query: query head h reads kv head h // group
                        v = v.repeat_interleave(n_heads // v.shape[1], dim=1)
                    W_O = adapter.attn_weights(layer)["W_O"]  # (heads, d_head, d_model)
                    written = torch.einsum("khd,hdm->hkm", v.to(W_O.dtype), W_O).norm(dim=-1)  # (heads, key)
                    parts.append(pattern * written[:, None, :].to(pattern.dtype))
            out[layer] = torch.stack(parts).detach().to(device="cpu", dtype=torch.float32)
    return out
