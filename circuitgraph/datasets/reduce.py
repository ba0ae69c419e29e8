"""Exact, order-fixed aggregation of per-prompt graphs by stable node identity.

Each prompt's graph is first *reduced* to sums keyed by identity (a :class:`Part`):

* a node's identity is ``(kind, layer, index)``: a feature is its layer and feature
  index, an embedding or logit its token id, an error node its layer (index 0), a
  ``target`` node its number among the targets; with ``aggregate: {position: from_end}``
  the identity also holds ``position_from_end`` (0 = the last token);
* per node identity: ``activation``, ``influence`` (circuit-tracer's influence on the
  targets, :func:`circuitgraph.queries.influence.node_influence`) and ``direct_effect``
  (the node's direct edges into the targets, each times the target's weight), each summed
  over the positions where the identity occurs;
* per edge identity (source identity, target identity): ``weight`` and ``|weight|``
  summed over positions; edges of weight exactly 0 are dropped first, so a part holds an
  edge identity only where the edge is non-zero in that prompt.

Parts are then added into an :class:`Accumulator` one at a time, **in row order**: every
sum is a float64 ``((p1 + p2) + p3) + ...`` in that fixed order, so the aggregate does not
depend on how many workers ran the prompts or in what order they finished; the Parquet
files it writes are byte-identical for the same dataset.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from circuitgraph.graph.nodes import NODE_KINDS
from circuitgraph.queries._sparse import target_weight_vector
from circuitgraph.queries.influence import node_influence

if TYPE_CHECKING:
    from circuitgraph.graph.graph import AttributionGraph

__all__ = [
    "Part",
    "Accumulator",
    "reduce_graph",
    "NODE_VALUE_COLUMNS",
    "EDGE_VALUE_COLUMNS",
    "node_key_columns",
    "edge_key_columns",
    "KIND_CODE",
]

#: node kinds as small integers (their order in :data:`NODE_KINDS`); rows sort in this order
KIND_CODE = {kind: i for i, kind in enumerate(NODE_KINDS)}
NODE_VALUE_COLUMNS = ("sum_activation", "sum_influence", "sum_direct_effect")
EDGE_VALUE_COLUMNS = ("sum_weight", "sum_abs_weight")


def node_key_columns(position: str) -> tuple[str, ...]:
    """``kind, layer, index`` (+ ``position_from_end`` when aggregating by position)."""
    return ("kind", "layer", "index") + (("position_from_end",) if position == "from_end" else ())


def edge_key_columns(position: str) -> tuple[str, ...]:
    node = node_key_columns(position)
    return tuple(f"source_{c}" for c in node) + tuple(f"target_{c}" for c in node)


@dataclass
class Part:
    """One prompt's graph reduced by identity (rows sorted by key).

    ``node_keys`` (n, K) int64 (kind code, layer, index[, position_from_end]); ``node_values``
    (n, 3) float64 in the order of :data:`NODE_VALUE_COLUMNS`; ``edge_keys`` (m, 2K) int64
    (source key, target key); ``edge_values`` (m, 2) float64 (weight, |weight|).
    """

    node_keys: np.ndarray
    node_values: np.ndarray
    edge_keys: np.ndarray
    edge_values: np.ndarray

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, node_keys=self.node_keys, node_values=self.node_values, edge_keys=self.edge_keys,
                 edge_values=self.edge_values)
        return buf.getvalue()

    @classmethod
    def load(cls, path: str | Path) -> Part:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["node_keys"], z["node_values"], z["edge_keys"], z["edge_values"])


def _group(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique rows of ``keys`` (sorted) with ``values`` summed per row in array order, and counts."""
    if keys.shape[0] == 0:
        return keys, values, np.zeros(0, dtype=np.int64)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    sums = np.stack([np.bincount(inverse, weights=values[:, j], minlength=uniq.shape[0])
                     for j in range(values.shape[1])], axis=1)
    return uniq, sums, inverse


def reduce_graph(graph: AttributionGraph, position: str = "free") -> Part:
    """Reduce one graph to sums keyed by node identity (see the module docstring)."""
    n = graph.n_nodes
    n_pos = len(graph.metadata.prompt_tokens or []) or (max((nd.position for nd in graph.nodes), default=0) + 1)
    cols = [np.fromiter((KIND_CODE[nd.kind] for nd in graph.nodes), dtype=np.int64, count=n),
            np.fromiter((nd.layer for nd in graph.nodes), dtype=np.int64, count=n),
            np.fromiter((nd.index for nd in graph.nodes), dtype=np.int64, count=n)]
    if position == "from_end":
        cols.append(n_pos - 1 - np.fromiter((nd.position for nd in graph.nodes), dtype=np.int64, count=n))
    keys = np.stack(cols, axis=1) if n else np.zeros((0, len(cols)), dtype=np.int64)

    activation = np.fromiter((nd.activation for nd in graph.nodes), dtype=np.float64, count=n)
    influence = node_influence(graph) if graph.targets and n else np.zeros(n)
    src = np.asarray(graph.edge_source, dtype=np.int64)
    tgt = np.asarray(graph.edge_target, dtype=np.int64)
    w = np.asarray(graph.edge_weight, dtype=np.float64)
    tw = target_weight_vector(graph) if graph.targets else np.zeros(n)
    direct = np.bincount(src, weights=w * tw[tgt], minlength=n) if n else np.zeros(0)
    node_keys, node_values, _ = _group(keys, np.stack([activation, influence, direct], axis=1))

    nz = w != 0
    edge_keys_raw = np.concatenate([keys[src[nz]], keys[tgt[nz]]], axis=1)
    edge_keys, edge_values, _ = _group(edge_keys_raw, np.stack([w[nz], np.abs(w[nz])], axis=1))
    return Part(node_keys, node_values, edge_keys, edge_values)


class Accumulator:
    """The aggregate: sums over parts added one at a time, in a fixed (row) order.

    Memory holds the aggregate only; each part is merged and can be dropped.
    """

    def __init__(self, position: str = "free"):
        k = len(node_key_columns(position))
        self.position = position
        self.n_parts = 0
        self.node_keys = np.zeros((0, k), dtype=np.int64)
        self.node_values = np.zeros((0, len(NODE_VALUE_COLUMNS)))
        self.node_counts = np.zeros(0, dtype=np.int64)
        self.edge_keys = np.zeros((0, 2 * k), dtype=np.int64)
        self.edge_values = np.zeros((0, len(EDGE_VALUE_COLUMNS)))
        self.edge_counts = np.zeros(0, dtype=np.int64)

    @staticmethod
    def _merge(keys: np.ndarray, values: np.ndarray, counts: np.ndarray, part_keys: np.ndarray,
               part_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if part_keys.shape[0] == 0:
            return keys, values, counts
        all_keys = np.concatenate([keys, part_keys])
        # the aggregate's rows come first: each sum is (aggregate so far) + (this part), exactly
        uniq, sums, inverse = _group(all_keys, np.concatenate([values, part_values]))
        n = np.bincount(inverse, weights=np.concatenate([counts, np.ones(part_keys.shape[0], dtype=np.int64)]),
                        minlength=uniq.shape[0]).astype(np.int64)
        return uniq, sums, n

    def add(self, part: Part) -> None:
        self.node_keys, self.node_values, self.node_counts = self._merge(
            self.node_keys, self.node_values, self.node_counts, part.node_keys, part.node_values)
        self.edge_keys, self.edge_values, self.edge_counts = self._merge(
            self.edge_keys, self.edge_values, self.edge_counts, part.edge_keys, part.edge_values)
        self.n_parts += 1

    # ------------------------------------------------------------------ tables
    def _columns(self, keys: np.ndarray, names: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for j, name in enumerate(names):
            col = keys[:, j]
            if name.endswith("kind"):
                out[name] = [NODE_KINDS[int(c)] for c in col]
            else:
                out[name] = col.astype(np.int64)
        return out

    def nodes_table(self) -> Any:
        import pyarrow as pa

        cols = self._columns(self.node_keys, node_key_columns(self.position))
        cols["n_prompts"] = self.node_counts
        for j, name in enumerate(NODE_VALUE_COLUMNS):
            cols[name] = self.node_values[:, j].astype(np.float64)
        return pa.table({k: pa.array(v, type=_arrow_type(k)) for k, v in cols.items()})

    def edges_table(self) -> Any:
        import pyarrow as pa

        cols = self._columns(self.edge_keys, edge_key_columns(self.position))
        cols["n_prompts"] = self.edge_counts
        for j, name in enumerate(EDGE_VALUE_COLUMNS):
            cols[name] = self.edge_values[:, j].astype(np.float64)
        return pa.table({k: pa.array(v, type=_arrow_type(k)) for k, v in cols.items()})


def _arrow_type(name: str) -> Any:
    import pyarrow as pa

    if name.endswith("kind"):
        return pa.string()
    if name.startswith("sum_"):
        return pa.float64()
    return pa.int64()


def parquet_bytes(table: Any) -> bytes:
    """A table as Parquet bytes, written the same way every time (no timestamps, fixed options)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(None), sink, compression="zstd", use_dictionary=True,
                   write_statistics=True, row_group_size=1 << 20)
    return sink.getvalue().to_pybytes()
