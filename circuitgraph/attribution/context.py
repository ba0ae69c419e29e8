"""The engine's public face: residual locations, writers, readers and propagation.

A graph built from a model keeps its :class:`AttributionContext` (``graph.context``): the
model adapter, the linearisation, the dictionaries, the options and the engine's tables.
Queries, validation checks and anything new read the engine through the methods here, never
through its tables (a test checks that no module outside ``circuitgraph/attribution/`` does):

* :class:`ResidualLocation`: where in the residual stream a node writes or reads;
* :meth:`AttributionContext.writes`: a writer's output vectors (already scaled by its activation;
  one per location it writes at: several for a cross-layer transcoder feature);
* :meth:`AttributionContext.reader`: a reader's direction ``g`` and own constant, so that
  ``pre = g . x(location, position) + own_constant`` with the residual ``x`` of the frozen model;
* :attr:`AttributionContext.frozen_model`: the transpose of the frozen linear model, which carries
  a reader's gradient from one location down to the one below
  (:meth:`~circuitgraph.attribution.frozen_model.FrozenLinearModel.step_down`);
* :meth:`AttributionContext.attribute_directions`: the edges from every writer into extra readers
  that are not nodes of the graph (one engine sweep), e.g. a head's query and key dimensions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from circuitgraph.attribution.component_inputs import ComponentInputs, component_inputs
from circuitgraph.attribution.engine import attribute_directions
from circuitgraph.attribution.node_table import NodeTable, find_row
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.residual import ResidualLocation

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.attribution.engine import DirectionEdges
    from circuitgraph.attribution.frozen_model import FrozenLinearModel
    from circuitgraph.attribution.linearisation import Linearisation
    from circuitgraph.attribution.nodes_builder import Collected, GraphOptions
    from circuitgraph.attribution.targets import ResolvedTarget
    from circuitgraph.dictionaries import Dictionary

__all__ = ["ResidualLocation", "WriterVector", "ReaderDirection", "AttributionContext"]

@dataclass(frozen=True)
class WriterVector:
    """A writer node: what it adds to the residual stream at ``location``, ``position``."""

    location: ResidualLocation
    position: int
    vector: torch.Tensor  # (d_model,), in the compute dtype, scaled by the node's activation


@dataclass(frozen=True)
class ReaderDirection:
    """A reader node: ``pre = direction . x(location, position) + own_constant`` in the frozen model
    (the direction includes its norm's ``P(gamma * w) / sigma``, and a gated neuron's frozen gate)."""

    location: ResidualLocation
    position: int
    direction: torch.Tensor  # (d_model,), in the compute dtype
    own_constant: float


@dataclass
class AttributionContext:
    """The live objects behind a graph, kept for queries and validation that need the model."""

    adapter: ModelAdapter
    linearisation: Linearisation
    transcoders: Dictionary | None
    options: GraphOptions
    _tables: Collected = field(repr=False)
    targets: list[ResolvedTarget]
    #: node id -> its row in the engine's reader table, built on first use
    _reader_index: dict[NodeId, int] | None = field(default=None, init=False, repr=False)

    # ------------------------------------------------------------------ sizes
    @property
    def n_pos(self) -> int:
        return self.linearisation.n_pos

    @property
    def n_layers(self) -> int:
        return self.adapter.facts.n_layers

    @property
    def attributed_nodes(self) -> Sequence[Node]:
        """Every node the engine built (before ``max_feature_nodes`` folded unselected features)."""
        return self._tables.nodes

    # ------------------------------------------------------------------ writers and readers
    def writers(self) -> Iterator[tuple[NodeId, list[WriterVector]]]:
        """Every writer node of the attributed graph with its writes."""
        for node_id in self._tables.writer_index():
            yield node_id, self.writes(node_id)

    def readers(self) -> Iterator[tuple[NodeId, ReaderDirection]]:
        """Every reader node of the attributed graph with its direction."""
        for node_id in self._readers():
            direction = self.reader(node_id)
            if direction is not None:  # always: _readers() lists the nodes that read
                yield node_id, direction

    def reader_ids(self) -> list[NodeId]:
        """Every reader node of the attributed graph (without making their directions)."""
        return list(self._readers())

    def attributed_node(self, node: NodeId) -> Node | None:
        """The record of reader ``node`` as attributed (None if it reads nothing)."""
        i = self._reader_of(node)
        return None if i is None else self._tables.nodes[self._tables.readers.rows[i]]

    def writes(self, node: NodeId) -> list[WriterVector]:
        """Where ``node`` writes and what: one entry for most nodes, one per downstream MLP output
        for a cross-layer transcoder feature; empty if it writes nothing (or was added after
        attribution, e.g. a remainder node of pruning)."""
        return [WriterVector(ResidualLocation(loc), int(pos), v) for loc, pos, v in self._tables.writer_locations(node)]

    def reader(self, node: NodeId) -> ReaderDirection | None:
        """The read direction of ``node``, or None if it reads nothing."""
        i = self._reader_of(node)
        if i is None:
            return None
        rd = self._tables.readers
        return ReaderDirection(ResidualLocation(rd.locs[i]), rd.positions[i], rd.direction(i), rd.own_constants[i])

    @property
    def frozen_model(self) -> FrozenLinearModel:
        """Propagation between residual locations in the frozen linear model (transposed)."""
        return self._tables.frozen

    def attribute_directions(self, location: int, positions: Sequence[int], directions: torch.Tensor,
                             own_constants: Sequence[float]) -> DirectionEdges:
        """Edges from every writer into ad-hoc readers that are not nodes of the graph (e.g. a head's
        query and key dimensions), in one sweep of the engine; see
        :func:`circuitgraph.attribution.engine.attribute_directions`."""
        return attribute_directions(self._tables, location, positions, directions, own_constants,
                                    batch_size=self.options.batch_size)

    def component_inputs(self, *, position_local: bool | None = None) -> ComponentInputs:
        """The edges into every head and whole-MLP node of the attributed graph (rows of
        :attr:`attributed_nodes`), their total effects and constants
        (:func:`circuitgraph.attribution.component_inputs.component_inputs`)."""
        index = {n.id: i for i, n in enumerate(self._tables.nodes)}
        return component_inputs(self._tables, index, min_mlp_pos=0 if self.options.bos_nodes else 1,
                                batch_size=self.options.batch_size, position_local=position_local,
                                head_inputs=tuple(self.options.head_inputs))

    def _reader_of(self, node: NodeId) -> int | None:
        """``node``'s index in the engine's reader table (None: it reads nothing).  A table of
        ``max_neuron_nodes`` candidates (millions of rows on a real model) is searched as arrays:
        the id -> index map of every reader took ~300 bytes a candidate, 3.5 GB at 256 tokens on
        SmolLM2-135M, kept for the graph's lifetime after one validation check."""
        if self._reader_index is not None or not _has_candidates(self._tables.nodes):
            return self._readers().get(node)
        row = find_row(self._tables.nodes, node)
        if row is None:
            return None
        hit = np.flatnonzero(np.frombuffer(self._tables.readers.rows, dtype=np.int64) == row)
        return int(hit[-1]) if hit.size else None  # the last, as the map's

    def _readers(self) -> dict[NodeId, int]:
        """node id -> its index in the engine's reader table (directions are made on request)."""
        if self._reader_index is None:
            nodes = self._tables.nodes
            self._reader_index = {nodes[row].id: i for i, row in enumerate(self._tables.readers.rows)}
        return self._reader_index


def _has_candidates(nodes: object) -> bool:
    """Whether ``nodes`` holds ``max_neuron_nodes`` candidates as arrays (:class:`NodeTable`)."""
    return isinstance(nodes, NodeTable) and nodes.has_candidates
