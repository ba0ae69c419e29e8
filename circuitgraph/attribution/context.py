"""The engine's public face: residual locations, writers, readers and propagation.

A graph built from a model keeps its :class:`AttributionContext` (``graph.context``): the
model adapter, the linearisation, the dictionaries, the options and the engine's tables.
Queries, validation checks and anything new read the engine through the methods here, never
through its tables (a test checks that no module outside ``circuitgraph/attribution/`` does):

* :class:`ResidualLocation`: where in the residual stream a node writes or reads;
* :meth:`AttributionContext.writer`: a writer's output vector (already scaled by its activation);
* :meth:`AttributionContext.reader`: a reader's direction ``g`` and own constant, so that
  ``pre = g . x(location, position) + own_constant`` with the residual ``x`` of the frozen model;
* :attr:`AttributionContext.frozen_model`: the transpose of the frozen linear model, which carries
  a reader's gradient from one location down to the one below
  (:meth:`~circuitgraph.attribution.frozen_model.FrozenLinearModel.step_down`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

from circuitgraph.graph.nodes import Node, NodeId

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.attribution.frozen_model import FrozenLinearModel
    from circuitgraph.attribution.linearisation import Linearisation
    from circuitgraph.attribution.nodes_builder import Collected, GraphOptions
    from circuitgraph.attribution.targets import ResolvedTarget
    from circuitgraph.dictionaries import TranscoderSet

__all__ = ["ResidualLocation", "WriterVector", "ReaderDirection", "AttributionContext"]

Sublayer = Literal["embed", "attn", "mlp"]


class ResidualLocation(int):
    """A point of the residual stream, numbered bottom-up: ``resid_pre(0)`` is 0, then after each
    block's attention (``resid_mid(l)``) and after its MLP (``resid_post(l) == resid_pre(l + 1)``).

    An ``int`` (so the engine indexes and compares locations at no cost), built and read through
    names: ``ResidualLocation.resid_mid(2)``, ``loc.sublayer``, ``loc.layer``.
    """

    __slots__ = ()

    @classmethod
    def resid_pre(cls, layer: int) -> ResidualLocation:
        """Before block ``layer`` (after block ``layer - 1``'s MLP; the embeddings for layer 0)."""
        return cls(2 * layer)

    @classmethod
    def resid_mid(cls, layer: int) -> ResidualLocation:
        """After block ``layer``'s attention, before its MLP."""
        return cls(2 * layer + 1)

    @classmethod
    def resid_post(cls, layer: int) -> ResidualLocation:
        """After block ``layer``'s MLP."""
        return cls(2 * layer + 2)

    @property
    def sublayer(self) -> Sublayer:
        """What writes here: the embeddings, a block's attention or a block's MLP."""
        if self == 0:
            return "embed"
        return "attn" if self % 2 == 1 else "mlp"

    @property
    def layer(self) -> int:
        """The block whose sublayer writes here (-1 for the embeddings)."""
        return -1 if self == 0 else (self - 1) // 2

    def below(self) -> ResidualLocation:
        """The location before this one's sublayer."""
        if self == 0:
            raise ValueError("resid_pre(0) is the bottom of the residual stream")
        return ResidualLocation(self - 1)

    def __repr__(self) -> str:
        if self == 0:
            return "ResidualLocation.resid_pre(0)"
        return f"ResidualLocation.resid_{'mid' if self.sublayer == 'attn' else 'post'}({self.layer})"


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
    transcoders: TranscoderSet | None
    options: GraphOptions
    _tables: Collected = field(repr=False)
    targets: list[ResolvedTarget]
    #: node id -> (writer table entry), built on first use
    _writer_index: dict[NodeId, WriterVector] | None = field(default=None, init=False, repr=False)
    _reader_index: dict[NodeId, ReaderDirection] | None = field(default=None, init=False, repr=False)

    # ------------------------------------------------------------------ sizes
    @property
    def n_pos(self) -> int:
        return self.linearisation.n_pos

    @property
    def n_layers(self) -> int:
        return self.adapter.facts.n_layers

    @property
    def attributed_nodes(self) -> list[Node]:
        """Every node the engine built (before ``max_feature_nodes`` folded unselected features)."""
        return self._tables.nodes

    # ------------------------------------------------------------------ writers and readers
    def writers(self) -> Iterator[tuple[NodeId, WriterVector]]:
        """Every writer node of the attributed graph with its output vector."""
        return iter(self._writers().items())

    def readers(self) -> Iterator[tuple[NodeId, ReaderDirection]]:
        """Every reader node of the attributed graph with its direction."""
        return iter(self._readers().items())

    def writer(self, node: NodeId) -> WriterVector | None:
        """The output vector of ``node``, or None if it writes nothing (or was added after
        attribution, e.g. a remainder node of pruning)."""
        return self._writers().get(node)

    def reader(self, node: NodeId) -> ReaderDirection | None:
        """The read direction of ``node``, or None if it reads nothing."""
        return self._readers().get(node)

    @property
    def frozen_model(self) -> FrozenLinearModel:
        """Propagation between residual locations in the frozen linear model (transposed)."""
        return self._tables.frozen

    def _writers(self) -> dict[NodeId, WriterVector]:
        if self._writer_index is None:
            nodes, index = self._tables.nodes, {}
            for loc, groups in self._tables.writers.groups.items():
                loc = ResidualLocation(loc)
                for pos, rows, vecs in groups:
                    for r, v in zip(rows.tolist(), vecs):
                        index[nodes[r].id] = WriterVector(loc, int(pos), v)
            self._writer_index = index
        return self._writer_index

    def _readers(self) -> dict[NodeId, ReaderDirection]:
        if self._reader_index is None:
            rd, nodes = self._tables.readers, self._tables.nodes
            self._reader_index = {
                nodes[row].id: ReaderDirection(ResidualLocation(loc), pos, g, own)
                for row, loc, pos, g, own in zip(rd.rows, rd.locs, rd.positions, rd.directions, rd.own_constants)
            }
        return self._reader_index
