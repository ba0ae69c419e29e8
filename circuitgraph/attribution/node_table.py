"""The node records of a graph being built: :class:`~circuitgraph.graph.nodes.Node` objects, and
the candidate neurons of ``graph.max_neuron_nodes`` held as arrays.

A real model's neuron graph has millions of candidate neurons (SmolLM2-135M at 256 tokens:
30 x 1536 x 255 = 11.7 M), of which ``max_neuron_nodes`` (about a thousand) stay nodes; a
``Node`` record each (its id, label, attrs dict and an index entry) cost ~0.65 KB, 7.6 GB at 256
tokens.  :class:`NeuronCandidates` holds one layer's candidates as arrays (~44 bytes each) and
makes a candidate's ``Node`` only when it is asked for (the selected ones, when the graph is
folded), equal to the record the plain neuron collector makes.  :class:`NodeTable` is the
sequence of rows both kinds of records make up (``len``, ``table[row]``, iteration), with
vectorised kinds and sites for the selection and the fold.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from circuitgraph.graph.nodes import Node, NodeAttrs, NodeId

__all__ = ["NeuronCandidates", "NeuronAttr", "NodeTable", "node_kinds", "node_sites", "find_row"]

#: the neuron attributes a candidate carries (keys of :data:`~circuitgraph.graph.nodes.NodeAttrs`):
#: ``gate`` and ``linear`` for gated MLPs, ``hook_pre`` otherwise
NeuronAttr = Literal["hook_pre", "gate", "linear"]


@dataclass
class NeuronCandidates:
    """One layer's candidate neurons, one entry per (position, neuron): activation, measured
    pre-activation and the neuron's attrs (``gate`` and ``linear`` for gated MLPs, ``hook_pre``
    otherwise), as float64 holding the compute dtype's values exactly."""

    layer: int
    positions: np.ndarray
    indices: np.ndarray
    activation: np.ndarray
    pre_activation: np.ndarray
    attrs: dict[NeuronAttr, np.ndarray]

    def __len__(self) -> int:
        return int(self.positions.size)

    def node_id(self, j: int) -> NodeId:
        return NodeId("neuron", self.layer, int(self.positions[j]), int(self.indices[j]))

    def node(self, j: int) -> Node:
        """Candidate ``j``'s record, as :func:`~circuitgraph.attribution.nodes_builder._collect_neuron_layer`
        makes a neuron's."""
        t, i = int(self.positions[j]), int(self.indices[j])
        attrs: NodeAttrs = {}
        for key, values in self.attrs.items():
            attrs[key] = float(values[j])
        return Node(NodeId("neuron", self.layer, t, i), activation=float(self.activation[j]),
                    pre_activation=float(self.pre_activation[j]), label=f"N{i} L{self.layer}@{t}", attrs=attrs)

    def find(self, position: int, index: int) -> int | None:
        hit = np.flatnonzero((self.positions == position) & (self.indices == index))
        return int(hit[0]) if hit.size else None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.positions, self.indices, self.activation, self.pre_activation,
                                      *self.attrs.values()))


class NodeTable(Sequence):
    """Node rows in order: runs of :class:`Node` objects and :class:`NeuronCandidates` blocks.
    ``table[row]`` returns the row's record (a candidate's is made on each request: change a
    candidate's record through the folded graph's nodes, not through this table)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._segments: list[list[Node] | NeuronCandidates] = []
        self._n = 0

    def append(self, node: Node) -> None:
        if not self._segments or not isinstance(self._segments[-1], list):
            self._starts.append(self._n)
            self._segments.append([])
        self._segments[-1].append(node)
        self._n += 1

    def add_candidates(self, block: NeuronCandidates) -> int:
        """Append ``block``'s candidates as rows; returns the first one's row."""
        start = self._n
        if len(block):
            self._starts.append(start)
            self._segments.append(block)
            self._n += len(block)
        return start

    def __len__(self) -> int:
        return self._n

    def _locate(self, row: int) -> tuple[list[Node] | NeuronCandidates, int]:
        r = int(row)
        if r < 0:
            r += self._n
        if not 0 <= r < self._n:
            raise IndexError(f"node row {row} out of range ({self._n} nodes)")
        k = bisect.bisect_right(self._starts, r) - 1
        return self._segments[k], r - self._starts[k]

    def __getitem__(self, row):  # type: ignore[override]
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(self._n))]
        seg, j = self._locate(row)
        return seg[j] if isinstance(seg, list) else seg.node(j)

    def __iter__(self) -> Iterator[Node]:
        for seg in self._segments:
            if isinstance(seg, list):
                yield from seg
            else:
                for j in range(len(seg)):
                    yield seg.node(j)

    def node_id(self, row: int) -> NodeId:
        seg, j = self._locate(row)
        return seg[j].id if isinstance(seg, list) else seg.node_id(j)

    @property
    def has_candidates(self) -> bool:
        return any(not isinstance(seg, list) for seg in self._segments)

    def candidate_bytes(self) -> int:
        return sum(seg.nbytes for seg in self._segments if not isinstance(seg, list))

    def kinds(self) -> np.ndarray:
        """Every row's node kind (object array)."""
        out = np.empty(self._n, dtype=object)
        for start, seg in zip(self._starts, self._segments, strict=True):
            if isinstance(seg, list):
                out[start : start + len(seg)] = [n.kind for n in seg]
            else:
                out[start : start + len(seg)] = "neuron"
        return out

    def sites(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(kinds, layers, positions)`` of ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        kinds = np.empty(rows.size, dtype=object)
        layers = np.zeros(rows.size, dtype=np.int64)
        positions = np.zeros(rows.size, dtype=np.int64)
        seg_of = np.searchsorted(np.asarray(self._starts, dtype=np.int64), rows, side="right") - 1
        for k in np.unique(seg_of).tolist():
            at = np.flatnonzero(seg_of == k)
            seg, local = self._segments[k], rows[at] - self._starts[k]
            if isinstance(seg, list):
                nodes = [seg[j] for j in local.tolist()]
                kinds[at] = [n.kind for n in nodes]
                layers[at] = [n.layer for n in nodes]
                positions[at] = [n.position for n in nodes]
            else:
                kinds[at] = "neuron"
                layers[at] = seg.layer
                positions[at] = seg.positions[local]
        return kinds, layers, positions

    def find(self, node_id: NodeId) -> int | None:
        """The row of ``node_id`` (None if it is not a node)."""
        for start, seg in zip(self._starts, self._segments, strict=True):
            if isinstance(seg, list):
                for j, n in enumerate(seg):
                    if n.id == node_id:
                        return start + j
            elif node_id.kind == "neuron" and node_id.layer == seg.layer:
                j = seg.find(node_id.position, node_id.index)
                if j is not None:
                    return start + j
        return None


def node_kinds(nodes: Sequence[Node]) -> np.ndarray:
    """Every node's kind (object array), from a :class:`NodeTable` without making its records."""
    if isinstance(nodes, NodeTable):
        return nodes.kinds()
    return np.array([n.kind for n in nodes], dtype=object)


def node_sites(nodes: Sequence[Node], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(kinds, layers, positions)`` of ``rows`` of ``nodes``."""
    if isinstance(nodes, NodeTable):
        return nodes.sites(rows)
    picked = [nodes[r] for r in np.asarray(rows, dtype=np.int64).tolist()]
    return (np.array([n.kind for n in picked], dtype=object), np.array([n.layer for n in picked], dtype=np.int64),
            np.array([n.position for n in picked], dtype=np.int64))


def find_row(nodes: Sequence[Node], node_id: NodeId) -> int | None:
    """The row of ``node_id`` in ``nodes`` (None if absent)."""
    if isinstance(nodes, NodeTable):
        return nodes.find(node_id)
    return next((r for r, n in enumerate(nodes) if n.id == node_id), None)
