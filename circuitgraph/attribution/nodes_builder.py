"""Writers and readers of the linearised model on one prompt.

A *writer* adds a vector to the residual stream at a location and position (its output,
already scaled by its activation).  A *reader* reads ``pre = g . x(loc, t) + own_constant``
where ``g`` already includes its norm's ``P(gamma * w) / sigma`` (and, for gated neurons, the
frozen gate).  Constant writers (biases, folded positional embeddings, the BOS-position MLP
output by default) are summed per location into ``constants[loc] (pos, d_model)``.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitgraph.adapters.architecture import ModelAdapter, NormWeights
from circuitgraph.attribution.frozen_model import (
    FrozenLinearModel,
)
from circuitgraph.attribution.later_stages import LaterStages
from circuitgraph.attribution.linearisation import Linearisation
from circuitgraph.attribution.node_table import NeuronAttr, NeuronCandidates, NodeTable, find_row, node_kinds
from circuitgraph.attribution.targets import ResolvedTarget
from circuitgraph.errors import AttributionError
from circuitgraph.graph.nodes import BIAS_INDEX, REMAINDER_INDEX, Node, NodeAttrs, NodeId
from circuitgraph.residual import ResidualLocation

if TYPE_CHECKING:
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["GraphOptions", "SlotTable", "WriterBlock", "WriterTable", "ReaderTable", "collect_nodes"]


@dataclass
class GraphOptions:
    """Granularity and switches (see the ``graph:`` section of the spec)."""

    mlp: dict[int, str]  # layer -> transcoders | neurons | mlp
    attention: dict[int, str]  # layer -> frozen | heads
    positional_nodes: bool = False
    bias_nodes: bool = False
    bos_nodes: bool = False
    neuron_top_k: int | None = None
    max_feature_nodes: int | None = None
    #: head and whole-MLP nodes get incoming edges (their total effects split over their inputs,
    #: :mod:`circuitgraph.attribution.component_inputs`)
    component_inputs: bool = False
    #: the edge kinds into head nodes with component inputs: "value" (exact path patching) and
    #: "query" / "key" (linearised at the prompt, :mod:`circuitgraph.attribution.component_inputs`)
    head_inputs: tuple[str, ...] = ("value",)
    #: keep this many neurons, chosen by influence (every neuron is a candidate; not with neuron_top_k)
    max_neuron_nodes: int | None = None
    dtype: torch.dtype = torch.float32
    batch_size: int = 256
    memory_limit: int | None = None  # bytes; None = the memory available
    stages: LaterStages | None = None  # what queries, pruning and exports add (None: the sweep alone)


@dataclass(frozen=True)
class SlotTable:
    """A :class:`WriterBlock`'s real (non-padding) slots, row-major, as the engine indexes them.

    Slot ``i`` (the ``i``-th real ``(group, writer)`` entry, :meth:`WriterBlock.slots`) is node row
    ``node_rows[i]`` (int32: the edges' source column), output vector ``scale[i] * basis[basis_index[i]]``; the slots of groups ``g0..g1-1`` are the range
    ``group_starts[g0]:group_starts[g1]``; ``positions`` are the block's group positions (host ints)."""

    node_rows: torch.Tensor  # (n_slots,) int32
    basis_index: torch.Tensor  # (n_slots,) long: the slot's row of the block's basis
    scale: torch.Tensor  # (n_slots,) compute dtype: the slot's scale of that row
    group_starts: list[int]  # (k + 1,)
    positions: list[int]  # (k,) increasing

    def groups_before(self, position: int) -> int:
        """How many position groups lie at positions ``< position``."""
        return bisect.bisect_left(self.positions, position)

    def groups_up_to(self, position: int) -> int:
        """How many position groups lie at positions ``<= position``."""
        return bisect.bisect_right(self.positions, position)


@dataclass
class WriterBlock:
    """One residual location's writers, padded per position: slot ``(g, j)`` is node ``rows[g, j]``
    at ``positions[g]``, and its output vector is ``scale[g, j] * basis[index[g, j]]`` (padding:
    row -1, scale 0).  Transcoder features share their decoder rows as the basis (a feature's
    vector is its activation times its decoder row), so the vectors, ``(positions, writers,
    d_model)`` in all, are only made for the positions a sweep needs (:meth:`vectors`)."""

    positions: torch.Tensor  # (k,) increasing
    rows: torch.Tensor  # (k, max_n) long, -1 = padding
    scale: torch.Tensor  # (k, max_n) compute dtype
    index: torch.Tensor  # (k, max_n) long, into basis
    basis: torch.Tensor  # (m, d_model)

    def slot_vectors(self, table: SlotTable, lo: int, hi: int) -> torch.Tensor:
        """The output vectors of real slots ``lo..hi-1`` of ``table`` (this block's
        :meth:`slot_table`): ``(hi - lo, d_model)``, no padding."""
        return table.scale[lo:hi].unsqueeze(-1) * self.basis[table.basis_index[lo:hi]]

    #: device -> the block's :class:`SlotTable` there (made once, see :meth:`slot_table`)
    _slot_tables: dict[str, SlotTable] = field(default_factory=dict, repr=False, compare=False)

    def slots(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The real (non-padding) slots, row-major: ``(group, writer, node row)`` per slot; the
        slots of groups ``a..e-1`` are a contiguous range (the engine's edge blocks)."""
        g_i, w_i = (self.rows >= 0).nonzero(as_tuple=True)
        return g_i, w_i, self.rows[g_i, w_i]

    def slot_table(self, device: torch.device | str) -> SlotTable:
        """The block's real slots on ``device`` (:class:`SlotTable`), made on first use and kept
        with the block: every engine call on the prompt reuses it."""
        key = str(device)
        table = self._slot_tables.get(key)
        if table is None:
            group, writer, node_rows = self.slots()
            table = SlotTable(
                node_rows=node_rows.to(device=device, dtype=torch.int32),
                basis_index=self.index[group, writer].to(device), scale=self.scale[group, writer].to(device),
                group_starts=torch.cat([torch.zeros(1, dtype=torch.long),
                                        (self.rows >= 0).sum(1).cumsum(0)]).tolist(),
                positions=self.positions.tolist())
            self._slot_tables[key] = table
        return table

    #: the whole block's output vectors while a caller holds them (:meth:`held_vectors`)
    _held: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def held_vectors(self, table: SlotTable) -> torch.Tensor:
        """Every real slot's output vector (:meth:`slot_vectors` of the whole ``table``), made on
        first use and kept until :meth:`release_vectors`: the engine calls of one
        ``max_feature_nodes`` selection share them."""
        if self._held is None:
            self._held = self.slot_vectors(table, 0, table.group_starts[-1])
        return self._held

    def release_vectors(self) -> None:
        """Drop the vectors kept by :meth:`held_vectors`."""
        self._held = None

    def vector(self, g: int, j: int) -> torch.Tensor:
        return self.scale[g, j] * self.basis[self.index[g, j]]

    def n_slots(self) -> int:
        """Slots with padding: ``groups * max_n``."""
        return int(self.rows.shape[0]) * int(self.rows.shape[1])

    def n_writers(self) -> int:
        """Real (non-padding) slots."""
        return int((self.rows >= 0).sum())


@dataclass
class WriterTable:
    """Writer nodes by residual location and position (:class:`WriterBlock` per location after
    :meth:`finalise`).  A writer is added with its vector (:meth:`add`) or as a scale of a row of
    a shared basis (:meth:`add_scaled`, e.g. a feature's activation and decoder row)."""

    #: loc -> list of (position, rows, scales, basis id or None, index into it or the vectors)
    _items: dict[int, list[tuple[int, torch.Tensor, torch.Tensor | None, int | None, torch.Tensor]]] = field(
        default_factory=dict, repr=False)
    _bases: list[torch.Tensor] = field(default_factory=list, repr=False)
    blocks: dict[int, WriterBlock] = field(default_factory=dict)

    def add(self, loc: int, position: int, rows: list[int], vectors: torch.Tensor) -> None:
        if not rows:
            return
        self._items.setdefault(loc, []).append((position, torch.tensor(rows, dtype=torch.long), None, None, vectors))

    def add_basis(self, basis: torch.Tensor) -> int:
        """Register ``basis (m, d_model)``; returns its id for :meth:`add_scaled`."""
        self._bases.append(basis)
        return len(self._bases) - 1

    def add_scaled(self, loc: int, position: int, rows: list[int] | torch.Tensor, scales: torch.Tensor, basis: int,
                   index: torch.Tensor) -> None:
        """Writers whose vectors are ``scales[i] * basis[index[i]]``."""
        if len(rows) == 0:
            return
        self._items.setdefault(loc, []).append((position, torch.as_tensor(rows, dtype=torch.long), scales, basis,
                                                index.to(torch.long)))

    def finalise(self) -> None:
        """Merge the writers that share (loc, position) and build each location's padded block."""
        for loc, items in self._items.items():
            # this location's basis: the registered bases it uses, then its plain vectors
            used = sorted({b for _, _, _, b, _ in items if b is not None})
            parts, offset = [], {}
            n = 0
            for b in used:
                offset[b] = n
                parts.append(self._bases[b])
                n += self._bases[b].shape[0]
            merged: dict[int, tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]] = {}
            for pos, rows, scales, b, idx in items:
                r, s, i = merged.setdefault(pos, ([], [], []))
                r.append(rows)
                if b is None:  # plain vectors: appended to the basis, scale 1
                    parts.append(idx)
                    i.append(torch.arange(n, n + idx.shape[0]))
                    s.append(torch.ones(idx.shape[0], dtype=idx.dtype, device=idx.device))
                    n += idx.shape[0]
                else:
                    i.append(idx.cpu() + offset[b])
                    s.append(scales)
            basis = torch.cat(parts) if len(parts) > 1 else parts[0]
            order = sorted(merged)
            k = len(order)
            max_n = max(sum(len(x) for x in merged[p][0]) for p in order)
            rows = torch.full((k, max_n), -1, dtype=torch.long)
            scale = torch.zeros(k, max_n, dtype=basis.dtype, device=basis.device)
            index = torch.zeros(k, max_n, dtype=torch.long)
            for g, p in enumerate(order):
                r, s, i = (torch.cat(x) for x in merged[p])
                rows[g, : len(r)] = r
                scale[g, : len(r)] = s
                index[g, : len(r)] = i
            self.blocks[loc] = WriterBlock(torch.tensor(order, dtype=torch.long), rows, scale,
                                           index.to(basis.device), basis)
        self._items = {}
        self._bases = []

    def release_vectors(self) -> None:
        """Drop every block's kept output vectors (:meth:`WriterBlock.held_vectors`)."""
        for block in self.blocks.values():
            block.release_vectors()


@dataclass
class ReaderTable:
    """Readers: node row, residual location, position, direction and own constant.

    A direction is held as a tensor (:meth:`add`), or made when a sweep needs it from a shared
    source (:meth:`add_lazy`: a transcoder feature's encoder row through its frozen norm), so
    that long prompts do not hold one ``d_model`` vector per active feature.  The per-reader
    values are typed arrays (``array.array``: indexing gives Python ints and floats, as lists
    would), 48 bytes a reader: a real model's ``max_neuron_nodes`` run has millions of candidate
    readers."""

    rows: array = field(default_factory=lambda: array("q"))
    locs: array = field(default_factory=lambda: array("q"))
    positions: array = field(default_factory=lambda: array("q"))
    own_constants: array = field(default_factory=lambda: array("d"))
    #: per reader: its direction source id (:meth:`add_lazy`), or -1 for a held tensor; and the
    #: source's key, or the tensor's index in ``_tensors``
    _dir_source: array = field(default_factory=lambda: array("q"), repr=False)
    _dir_key: array = field(default_factory=lambda: array("q"), repr=False)
    _tensors: list[torch.Tensor] = field(default_factory=list, repr=False)
    #: source id -> fn(keys LongTensor (n,), positions LongTensor (n,)) -> directions (n, d_model)
    _sources: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = field(default_factory=list, repr=False)
    #: (table length when made, node row -> location): :meth:`location_by_row`'s map
    _loc_by_row: tuple[int, dict[int, int]] | None = field(default=None, repr=False, compare=False)

    def add(self, row: int, loc: int, position: int, g: torch.Tensor, own_constant: float) -> None:
        self._append(row, loc, position, -1, len(self._tensors), own_constant)
        self._tensors.append(g)

    def add_source(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> int:
        """Register a direction source for :meth:`add_lazy`; returns its id."""
        self._sources.append(fn)
        return len(self._sources) - 1

    def add_lazy(self, row: int, loc: int, position: int, source: int, key: int, own_constant: float) -> None:
        """A reader whose direction is ``source(key, position)``, made when needed."""
        self._append(row, loc, position, source, int(key), own_constant)

    def add_lazy_many(self, rows: torch.Tensor, loc: int, position: int, source: int, keys: torch.Tensor,
                      own_constants: torch.Tensor) -> None:
        """:meth:`add_lazy` of several readers at one location and position."""
        n = len(rows)
        self.rows.extend(rows.tolist())
        self.locs.extend([int(loc)] * n)
        self.positions.extend([int(position)] * n)
        self._dir_source.extend([source] * n)
        self._dir_key.extend(keys.tolist())
        self.own_constants.extend(own_constants.double().tolist())

    def _append(self, row: int, loc: int, position: int, source: int, key: int, own_constant: float) -> None:
        self.rows.append(row)
        self.locs.append(int(loc))
        self.positions.append(int(position))
        self._dir_source.append(source)
        self._dir_key.append(key)
        self.own_constants.append(float(own_constant))

    def location_by_row(self) -> dict[int, int]:
        """node row -> the residual location its reader reads, made once per table size (a long
        prompt's table holds millions of readers: made per engine call, it was 3.6% of a run)."""
        if self._loc_by_row is None or self._loc_by_row[0] != len(self.rows):
            self._loc_by_row = (len(self.rows), dict(zip(self.rows, self.locs, strict=False)))
        return self._loc_by_row[1]

    def direction(self, i: int) -> torch.Tensor:
        """The direction of reader ``i`` (an index into this table)."""
        return self.directions_of([i])[0]

    def directions_of(self, indices: list[int]) -> list[torch.Tensor]:
        """The directions of readers ``indices``, one call per lazy source."""
        out: list[Any] = [None] * len(indices)
        lazy: dict[int, list[tuple[int, int, int]]] = {}
        for j, i in enumerate(indices):
            src, key = self._dir_source[i], self._dir_key[i]
            if src < 0:
                out[j] = self._tensors[key]
            else:
                lazy.setdefault(src, []).append((j, key, self.positions[i]))
        for src, items in lazy.items():
            js, keys, pos = zip(*items, strict=False)
            g = self._sources[src](torch.tensor(keys, dtype=torch.long), torch.tensor(pos, dtype=torch.long))
            for n, j in enumerate(js):
                out[j] = g[n]
        return out


@dataclass
class Collected:
    #: the node rows (a :class:`~circuitgraph.attribution.node_table.NodeTable` from collect_nodes)
    nodes: Sequence[Node]
    writers: WriterTable
    readers: ReaderTable
    constants: dict[int, torch.Tensor]  # loc -> (pos, d_model)
    targets: list[tuple[NodeId, float]]
    frozen: FrozenLinearModel
    # True when a node writes at several residual locations (cross-layer transcoder features):
    # the engine then sums its per-location edges into one edge per (reader, writer)
    multi_location_writers: bool = False

    #: node id -> its writer slots (location, position group, slot), built on first use
    _writer_index: dict[NodeId, list[tuple[int, int, int]]] | None = field(default=None, repr=False)

    def writer_index(self) -> dict[NodeId, list[tuple[int, int, int]]]:
        """node id -> every ``(location, group, slot)`` of its writes in the writer blocks (one for
        most nodes; one per downstream MLP output for a CLT feature)."""
        if self._writer_index is None:
            idx: dict[NodeId, list[tuple[int, int, int]]] = {}
            for loc, block in sorted(self.writers.blocks.items()):
                g_i, j_i = (block.rows >= 0).nonzero(as_tuple=True)
                node_id = self.nodes.node_id if isinstance(self.nodes, NodeTable) else (lambda r: self.nodes[r].id)
                for g, j, r in zip(g_i.tolist(), j_i.tolist(), block.rows[g_i, j_i].tolist(), strict=False):
                    idx.setdefault(node_id(r), []).append((loc, g, j))
            self._writer_index = idx
        return self._writer_index

    def writer_slots(self, node: NodeId) -> list[tuple[int, int, int]]:
        """``node``'s ``(location, group, slot)`` writes, as :meth:`writer_index` has them.  A table of
        ``max_neuron_nodes`` candidates (millions of writers on a real model) is searched per
        node, block by block: the index of every writer took ~350 bytes a candidate (4 GB at 256
        tokens on SmolLM2-135M), kept for the graph's lifetime after one validation check."""
        if self._writer_index is not None or not (isinstance(self.nodes, NodeTable) and self.nodes.has_candidates):
            return self.writer_index().get(node, [])
        row = find_row(self.nodes, node)
        if row is None:
            return []
        out = []
        for loc, block in sorted(self.writers.blocks.items()):
            g_i, j_i = (block.rows == row).nonzero(as_tuple=True)
            out += [(loc, g, j) for g, j in zip(g_i.tolist(), j_i.tolist(), strict=True)]
        return out

    def count_tables(self, n_locs: int, n_pos: int) -> tuple[Any, Any, Any, Any]:
        """What the memory estimate needs (numpy): writers per (location, position)
        ``(n_locs, n_pos)``, and per reader its location, position and node kind."""
        counts = np.zeros((n_locs, n_pos), dtype=np.int64)
        for loc, block in self.writers.blocks.items():
            np.add.at(counts[loc], block.positions.numpy(), (block.rows >= 0).sum(1).numpy())
        locs = np.asarray(self.readers.locs, dtype=np.int64)
        positions = np.asarray(self.readers.positions, dtype=np.int64)
        kinds = node_kinds(self.nodes)[np.asarray(self.readers.rows, dtype=np.int64)]
        return counts, locs, positions, kinds

    def feature_writer_counts(self, n_locs: int, n_pos: int, kinds: tuple[str, ...] = ("feature",)) -> Any:
        """Transcoder feature writers (nodes of ``kinds``) per (location, position) ``(n_locs, n_pos)`` (numpy)."""
        counts = np.zeros((n_locs, n_pos), dtype=np.int64)
        is_feature = np.append(np.isin(node_kinds(self.nodes), list(kinds)), False)  # row -1: padding
        for loc, block in self.writers.blocks.items():
            counts[loc, block.positions.numpy()] += is_feature[block.rows.numpy()].sum(1)
        return counts

    def largest_writer_block(self) -> int:
        """The most (position, writer) slots of one residual location's padded writer block."""
        return max((block.n_slots() for block in self.writers.blocks.values()), default=0)

    def writer_locations(self, node: NodeId) -> list[tuple[int, int, torch.Tensor]]:
        """Every ``(location, position, output vector)`` at which ``node`` writes; empty for non-writers."""
        out = []
        for loc, g, j in self.writer_slots(node):
            block = self.writers.blocks[loc]
            out.append((loc, int(block.positions[g]), block.vector(g, j)))
        return out


class _Builder:
    def __init__(self, adapter: ModelAdapter, lin: Linearisation, transcoders: Dictionary | None,
                 options: GraphOptions):
        self.adapter = adapter
        self.lin = lin
        self.transcoders = transcoders
        self.options = options
        self.dtype = options.dtype
        self.device = adapter.device
        self.nodes = NodeTable()
        #: node id -> row of the nodes held as records (the candidates of max_neuron_nodes are
        #: found through :meth:`row_of`)
        self.index: dict[NodeId, int] = {}
        self.multi_location = False
        #: per-prompt dictionary values shared by the MLP layers (see _dictionary_state)
        self.dictionary_state: dict[str, Any] = {"acts": {}, "rows": {}, "dec": {}}
        self.writers = WriterTable()
        self.readers = ReaderTable()
        T, D = lin.n_pos, adapter.facts.d_model
        self.constants: dict[int, torch.Tensor] = {
            loc: torch.zeros(T, D, dtype=self.dtype, device=self.device) for loc in range(ResidualLocation.count(adapter.facts.n_layers))
        }
        self.tok_str = (
            (lambda i: adapter.tokenizer.token_str(i)) if adapter.tokenizer is not None else (lambda i: f"<{i}>")
        )

    def cast(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the model's device, in the compute dtype."""
        return t.to(device=self.device, dtype=self.dtype)

    def add_node(self, node: Node) -> int:
        if node.id in self.index:
            raise AttributionError(f"duplicate node {node.id}")
        self.index[node.id] = len(self.nodes)
        self.nodes.append(node)
        return self.index[node.id]

    def row_of(self, node_id: NodeId) -> int | None:
        """The row of ``node_id``, a record or a max_neuron_nodes candidate (None: not a node yet)."""
        row = self.index.get(node_id)
        if row is None and node_id.kind == "neuron" and self.options.max_neuron_nodes is not None:
            row = self.nodes.find(node_id)
        return row

    def min_mlp_pos(self) -> int:
        return 0 if self.options.bos_nodes else 1


def _post_norm_forward(fm: FrozenLinearModel, norms: list | None, layer: int, vecs: torch.Tensor,
                       positions: torch.Tensor | slice) -> torch.Tensor:
    """Writers of a block with post-norms pass through the frozen post-norm's linear part."""
    if norms is None:
        return vecs
    return norms[layer].forward_linear(vecs, positions)


def _without_sigma(norm: Any, vecs: torch.Tensor) -> torch.Tensor:
    """``gamma * P(v)``: a frozen post-norm's linear part before its division by sigma."""
    if norm.center:
        vecs = vecs - vecs.mean(-1, keepdim=True)
    return vecs * norm.gamma if norm.gamma is not None else vecs


def collect_nodes(
    adapter: ModelAdapter,
    lin: Linearisation,
    transcoders: Dictionary | None,
    targets: list[ResolvedTarget],
    options: GraphOptions,
) -> Collected:
    """Build the node table, writers, readers and constants for one prompt."""
    if options.max_neuron_nodes is not None and options.neuron_top_k is not None:
        raise AttributionError(
            f"max_neuron_nodes ({options.max_neuron_nodes}) and neuron_top_k ({options.neuron_top_k}) both choose "
            "which neurons stay nodes (by influence on the targets, by activation); set only one")
    b = _Builder(adapter, lin, transcoders, options)
    f = adapter.facts
    L, T = f.n_layers, lin.n_pos
    skip_layers = {}
    if transcoders is not None:
        for layer, tc in transcoders.layers.items():
            W_skip = transcoders.skip_weight(layer)
            if options.mlp.get(layer) == "transcoders" and W_skip is not None:
                if f.parallel_attn_mlp and any(t.kind == "direction" and t.site == "resid_mid" and t.layer == layer
                                               for t in targets):
                    raise AttributionError(
                        f"a direction target at resid_mid of layer {layer}: in a parallel block the skip "
                        "transcoder's path starts at resid_pre, below it; read the direction at resid_pre or "
                        "resid_post of that layer")
                skip_layers[layer] = (W_skip, tc.input_site, transcoders.output_site(layer) == "before_post_norm")
        if getattr(transcoders, "kind", "per_layer") == "cross_layer":
            other = sorted(l for l in range(L) if options.mlp.get(l) != "transcoders")
            if other:
                raise AttributionError(
                    f"graph.mlp: layers {other} are not analysed with transcoders, but a cross-layer transcoder "
                    "writes into every MLP output; set graph.mlp: transcoders (or use per-layer transcoders)")
    fm = FrozenLinearModel(adapter, lin, attention_modes=options.attention, skip_layers=skip_layers,
                           dtype=b.dtype, device=b.device)
    tokens = lin.tokens.tolist()

    # ---------------------------------------------------------------- embeddings (loc 0)
    emb = b.cast(lin.embed)
    for t, tok in enumerate(tokens):
        row = b.add_node(Node(NodeId("embedding", -1, t, int(tok)), activation=1.0,
                              label=b.tok_str(tok), attrs={"token": int(tok), "token_str": b.tok_str(tok)}))
        b.writers.add(0, t, [row], emb[t : t + 1])
    if lin.pos_embed is not None:
        pe = b.cast(lin.pos_embed)
        if options.positional_nodes:
            for t in range(T):
                row = b.add_node(Node(NodeId("positional", -1, t, 0), activation=1.0, label=f"pos {t}"))
                b.writers.add(0, t, [row], pe[t : t + 1])
        else:
            b.constants[0] += pe

    # ---------------------------------------------------------------- blocks
    for layer in range(L):
        _collect_attention(b, fm, layer)
        _collect_mlp(b, fm, layer)

    # ---------------------------------------------------------------- targets
    target_ids = [_collect_target(b, fm, i, tgt) for i, tgt in enumerate(targets)]
    b.writers.finalise()
    b.dictionary_state = {}  # the activations and decoder rows are not needed any more
    return Collected(b.nodes, b.writers, b.readers, b.constants,
                     [(tid, tgt.weight) for tid, tgt in zip(target_ids, targets, strict=False)], fm,
                     multi_location_writers=b.multi_location)


# -------------------------------------------------------------------- attention
def _collect_attention(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    lin, T = b.lin, b.lin.n_pos
    loc = ResidualLocation.resid_mid(layer)
    w = fm.attn[layer]
    posts = fm.ln1_post
    A = fm.pattern(layer)  # (H, T, T)
    ln1 = fm.ln1[layer]
    bias_raw = w["b_O"].expand(T, -1).clone()
    if b.options.attention[layer] == "frozen":
        # the constant part of frozen attention: sum_s A[h,t,s] (beta1 W_V^h + b_V^h) W_O^h
        beta = ln1.beta if ln1.beta is not None else torch.zeros_like(w["b_O"])
        per_head = torch.einsum("d,hdk->hk", beta, w["W_V"]) + w["b_V"]  # (H, d_head)
        per_head_out = torch.einsum("hk,hkd->hd", per_head, w["W_O"])  # (H, d_model)
        bias_raw = bias_raw + torch.einsum("ht,hd->td", A.sum(-1), per_head_out)
    else:
        z = b.cast(lin.z[layer])  # (T, H, d_head) includes b_V and beta1 through the frozen pattern
        heads = torch.einsum("thk,hkd->thd", z, w["W_O"])  # (T, H, d_model)
        for t in range(T):
            vecs = _post_norm_forward(fm, posts, layer, heads[t], slice(t, t + 1))
            rows = [
                b.add_node(Node(NodeId("attention_head", layer, t, h), activation=1.0, label=f"L{layer}H{h}@{t}"))
                for h in range(heads.shape[1])
            ]
            b.writers.add(loc, t, rows, vecs)
    bias = _post_norm_forward(fm, posts, layer, bias_raw, slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        bias = bias + posts[layer].beta
    _add_bias(b, loc, layer, "attention", bias)


def _add_bias(b: _Builder, loc: int, layer: int, which: str, vectors: torch.Tensor) -> None:
    """Constant writers: bias nodes when asked, else folded into readers' constants."""
    if not b.options.bias_nodes:
        b.constants[loc] += vectors
        return
    for t in range(vectors.shape[0]):
        row = b.add_node(Node(NodeId("bias", layer, t, BIAS_INDEX[which]), activation=1.0,
                              label=f"{which} bias L{layer}@{t}"))
        b.writers.add(loc, t, [row], vectors[t : t + 1])


# -------------------------------------------------------------------- MLP
def _collect_mlp(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    if b.adapter.facts.attn_only:  # no MLP: nothing is written at resid_post(layer)
        return
    mode = b.options.mlp[layer]
    if mode == "transcoders":
        _collect_transcoder_layer(b, fm, layer)
    elif mode == "neurons" and b.adapter.facts.num_experts:
        _collect_expert_layer(b, fm, layer)
    elif mode == "neurons" and b.options.max_neuron_nodes is not None:
        _collect_neuron_candidates(b, fm, layer)
    elif mode == "neurons":
        _collect_neuron_layer(b, fm, layer)
    elif mode == "mlp":
        _collect_mlp_vector_layer(b, fm, layer)
    else:  # the spec forbids it
        raise AttributionError(f"graph.mlp for layer {layer}: unknown granularity {mode!r}")


def _feature_reader(b: _Builder, fm: FrozenLinearModel, layer: int, t: int, idx: torch.Tensor,
                    direction: bool = True, W: torch.Tensor | None = None):
    """Reader directions, own constants and measured pre-activations of features ``idx`` at (layer, t)
    (directions None when ``direction`` is false: see :func:`_feature_directions`); ``W``: their
    encoder rows when the caller has them."""
    tc = b.transcoders[layer]
    if W is None:
        W = b.cast(tc.encoder_rows(idx))  # (n, d_model)
    own = b.cast(tc.b_enc[idx])
    x = b.cast(b.lin.tc_input[layer][t])
    pre = W @ x + own
    if tc.input_site == "mlp_input" and fm.ln2[layer].beta is not None:
        own = own + fm.ln2[layer].reader_constant(W)
    g = _feature_directions(fm.ln2[layer], tc.input_site, W, torch.full((W.shape[0],), t)) if direction else None
    return g, own, pre


def _feature_directions(norm: NormWeights, site: str, W: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The read directions of encoder rows ``W (n, d_model)`` at ``positions (n,)``.

    The dictionary's input site decides the norm: ``normalized`` reads ``P(x)/sigma2`` (ln2
    before gamma/beta), ``mlp_input`` the MLP's input ``gamma2 * P(x)/sigma2 + beta2``, ``raw``
    the residual stream at resid_mid itself."""
    if site not in ("normalized", "mlp_input"):
        return W
    if site == "mlp_input":
        g = norm.reader_direction(W)
    else:  # P(x)/sigma2: the centring without gamma
        g = NormWeights(None, None, norm.center).reader_direction(W)
    return g / norm.sigma[positions.to(norm.sigma.device)].unsqueeze(-1)


def _feature_direction_source(b: _Builder, fm: FrozenLinearModel, layer: int):
    """fn(features, positions) -> read directions of ``layer``'s features (made when a sweep needs them)."""
    tc, norm, device, dtype = b.transcoders[layer], fm.ln2[layer], b.device, b.dtype

    def directions(features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        W = tc.encoder_rows(features).to(device=device, dtype=dtype)
        return _feature_directions(norm, tc.input_site, W, positions)

    return directions


def _dictionary_state(b: _Builder) -> dict[str, Any]:
    """Per-prompt dictionary values shared by the MLP layers: activations of every encoder
    layer (computed once), the feature rows created so far and the decoder rows of the
    active features (read once per source layer, lazily for large dictionaries)."""
    return b.dictionary_state


def _acts(b: _Builder, layer: int) -> torch.Tensor:
    st = _dictionary_state(b)
    if layer not in st["acts"]:
        st["acts"][layer] = b.transcoders[layer].activation(b.lin.tc_input[layer]).to(device=b.device, dtype=b.dtype)
    return st["acts"][layer]


def _decoder(b: _Builder, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted active feature ids of ``layer`` at node positions, their decoder rows (n, n_out, d))."""
    st = _dictionary_state(b)
    if layer not in st["dec"]:
        acts = _acts(b, layer)[b.min_mlp_pos():]
        active = (acts != 0).any(0).nonzero().flatten()
        st["dec"][layer] = (active, b.cast(b.transcoders.decoder_rows(layer, active.cpu())))
    return st["dec"][layer]


def _collect_transcoder_layer(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    """Features of encoder layer ``layer`` (readers), then every write into MLP output ``layer``:
    from the features of each source layer ``l <= layer`` whose decoder reaches it (only
    ``l = layer`` for per-layer transcoders; every ``l <= layer`` for a CLT) and the error node
    ``mlp_out - sum of reconstructions - b_dec - skip``."""
    if b.transcoders is None or layer not in b.transcoders:
        raise AttributionError(
            f"graph.mlp: layer {layer} is analysed with transcoders but no transcoder was loaded for it; "
            "load one or set graph.mlp for that layer to neurons or mlp"
        )
    tc = b.transcoders
    lin, T = b.lin, b.lin.n_pos
    loc = ResidualLocation.resid_post(layer)
    st = _dictionary_state(b)
    acts = _acts(b, layer)
    # ---- feature nodes of this encoder layer
    rows_at: dict[int, tuple[list[int], torch.Tensor]] = {}
    source = b.readers.add_source(_feature_direction_source(b, fm, layer))
    read_at = fm.mlp_input_location(layer)
    # the encoder rows of every feature active somewhere, read once (a gather per position of a
    # column-major encoder was ~2.5 ms); each position takes its rows from them (the same values)
    active_any = (acts[b.min_mlp_pos():] != 0).any(0).nonzero().flatten()
    enc = b.cast(tc[layer].encoder_rows(active_any.cpu())) if active_any.numel() else None
    for t in range(b.min_mlp_pos(), T):
        active = acts[t].nonzero().flatten()
        if not active.numel():
            continue
        W = enc[torch.searchsorted(active_any, active).to(enc.device)]
        _, own, pre = _feature_reader(b, fm, layer, t, active, direction=False, W=W)
        rows = []
        for i, a, o, p in zip(active.tolist(), acts[t, active].tolist(), own.tolist(), pre.tolist(), strict=False):
            row = b.add_node(Node(NodeId("feature", layer, t, i), activation=a, pre_activation=p,
                                  label=f"F{i} L{layer}@{t}"))
            rows.append(row)
            b.readers.add_lazy(row, read_at, t, source, i, o)
        rows_at[t] = (rows, active)
    st["rows"][layer] = rows_at
    # ---- writes into MLP output `layer`; a dictionary writing before the post-MLP norm
    # (mlp.hook_out on Gemma-2-style models) writes through the frozen norm: v -> gamma P(v) / sigma(t)
    posts = fm.ln2_post if tc.output_site(layer) == "before_post_norm" else None
    sources = [l for l in sorted(st["rows"]) if l <= layer and layer in tc.output_layers(l)]
    out = b.cast(lin.mlp_out[layer])  # hook_mlp_out: after any post-norm, what the block adds
    constant = b.cast(tc.decoder_bias(layer)).expand(T, -1).clone()
    W_skip = tc.skip_weight(layer)
    error = out - _post_norm_forward(fm, posts, layer, constant, slice(0, T))
    if W_skip is not None:
        error = error - _post_norm_forward(fm, posts, layer, b.cast(lin.tc_input[layer]) @ b.cast(W_skip).T, slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        error = error - posts[layer].beta
    for l in sources:
        ids, dec = _decoder(b, l)
        j_out = layer - l
        a_l = _acts(b, l)
        # a feature writes activation * decoder row: the rows are shared, the vectors made per sweep;
        # through a frozen post-norm, (activation / sigma(t)) * gamma P(decoder row)
        dec_out = dec[:, j_out] if posts is None else _without_sigma(posts[layer], dec[:, j_out])
        basis = b.writers.add_basis(dec_out)
        for t, (rows, active) in st["rows"][l].items():
            at = torch.searchsorted(ids, active)
            scales = a_l[t, active] if posts is None else a_l[t, active] / posts[layer].sigma[t]
            b.writers.add_scaled(loc, t, rows, scales, basis, at)
            error[t] -= (scales.unsqueeze(-1) * dec_out[at]).sum(0)
    bias = _post_norm_forward(fm, posts, layer, constant, slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        bias = bias + posts[layer].beta
    _add_bias(b, loc, layer, "mlp", bias)
    for t in range(T):
        if t < b.min_mlp_pos():
            # BOS convention: features and error at position 0 are constants
            b.constants[loc][t] += error[t]
            continue
        row = b.add_node(Node(NodeId("error", layer, t, 0), activation=1.0, label=f"err L{layer}@{t}"))
        b.writers.add(loc, t, [row], error[t : t + 1])
    if getattr(tc, "kind", "per_layer") == "cross_layer":
        b.multi_location = True


def _neuron_reader(b: _Builder, fm: FrozenLinearModel, layer: int, t: int, idx: torch.Tensor):
    """Reader directions, own constants and measured values of neurons ``idx`` at (layer, t).

    GELU/ReLU: the pre-activation (hook_pre).  Gated: with the gate frozen, the activation
    itself (hook_post = act(gate) * (W_in . N2(x)) + b_in).  MoE layers: :func:`_expert_neuron_reader`."""
    adapter, lin = b.adapter, b.lin
    if adapter.facts.num_experts:
        return _expert_neuron_reader(b, fm, layer, t, idx)
    w = adapter.mlp_weights(layer)
    W_in = b.cast(w["W_in"][:, idx]).T  # (n, d_model)
    b_in = b.cast(w["b_in"][idx])
    norm = adapter.norm("ln2", layer)
    gamma = None if norm.gamma is None else b.cast(norm.gamma)
    beta = None if norm.beta is None else b.cast(norm.beta)
    g = NormWeights(gamma, beta, norm.center).reader_direction(W_in)
    g = g / fm.ln2[layer].sigma[t]
    lin_const = W_in @ beta if beta is not None else torch.zeros_like(b_in)
    if adapter.facts.gated_mlp:
        gate = adapter.mlp_act_fn(layer)(lin.mlp_pre[layer][t, idx]).to(device=b.device, dtype=b.dtype)
        g = g * gate.unsqueeze(-1)
        own = gate * lin_const + b_in
        measured = b.cast(lin.mlp_post[layer][t, idx])
    else:
        own = lin_const + b_in
        measured = b.cast(lin.mlp_pre[layer][t, idx])
    return g, own, measured


def _neuron_layer_start(b: _Builder, fm: FrozenLinearModel, layer: int) -> tuple[Any, torch.Tensor, Any, torch.Tensor]:
    """A neuron layer's shared start: its MLP bias added as a bias node (through a frozen post-norm),
    and ``(location, W_out, post-norms, neuron activations (T, d_mlp))``."""
    T = b.lin.n_pos
    loc = ResidualLocation.resid_post(layer)
    w = b.adapter.mlp_weights(layer)
    W_out, b_out = b.cast(w["W_out"]), b.cast(w["b_out"])
    posts = fm.ln2_post
    post = b.cast(b.lin.mlp_post[layer])  # (T, d_mlp)
    bias = _post_norm_forward(fm, posts, layer, b_out.expand(T, -1).clone(), slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        bias = bias + posts[layer].beta
    _add_bias(b, loc, layer, "mlp", bias)
    return loc, W_out, posts, post


def _collect_neuron_layer(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    adapter, lin, T = b.adapter, b.lin, b.lin.n_pos
    loc, W_out, posts, post = _neuron_layer_start(b, fm, layer)
    gated = adapter.facts.gated_mlp
    for t in range(T):
        if t < b.min_mlp_pos():
            b.constants[loc][t] += _post_norm_forward(fm, posts, layer, (post[t] @ W_out)[None], slice(t, t + 1))[0]
            continue
        active = post[t].nonzero().flatten()
        rest = None
        k = b.options.neuron_top_k
        if k is not None and active.numel() > k:
            order = post[t, active].abs().argsort(descending=True, stable=True)
            rest = active[order[k:]]
            active = active[order[:k]].sort().values
        if active.numel():
            g, own, measured = _neuron_reader(b, fm, layer, t, active)
            rows = []
            for j, i in enumerate(active.tolist()):
                attrs: NodeAttrs
                if gated:
                    attrs = {"gate": float(lin.mlp_pre[layer][t, i]), "linear": float(lin.mlp_pre_linear[layer][t, i])}
                else:
                    attrs = {"hook_pre": float(lin.mlp_pre[layer][t, i])}
                row = b.add_node(Node(NodeId("neuron", layer, t, i), activation=float(post[t, i]),
                                      label=f"N{i} L{layer}@{t}", attrs=attrs))
                rows.append(row)
                b.readers.add(row, fm.mlp_input_location(layer), t, g[j], float(own[j]))
                b.nodes[row].pre_activation = float(measured[j])
            vecs = post[t, active].unsqueeze(-1) * W_out[active]
            b.writers.add(loc, t, rows, _post_norm_forward(fm, posts, layer, vecs, slice(t, t + 1)))
        if rest is not None and rest.numel():
            vec = (post[t, rest].unsqueeze(-1) * W_out[rest]).sum(0, keepdim=True)
            row = b.add_node(Node(NodeId("remainder", layer, t, REMAINDER_INDEX["neurons"]), activation=1.0,
                                  label=f"other neurons L{layer}@{t}", attrs={"n_neurons": int(rest.numel())}))
            b.writers.add(loc, t, [row], _post_norm_forward(fm, posts, layer, vec, slice(t, t + 1)))


def _neuron_direction_source(b: _Builder, fm: FrozenLinearModel, layer: int):
    """fn(neurons, positions) -> read directions of ``layer``'s neurons, as :func:`_neuron_reader`
    makes them (``P(gamma2 * W_in[:, i]) / sigma2(t)``, times the frozen gate for gated MLPs),
    made when a sweep needs them."""
    adapter, lin, device, dtype = b.adapter, b.lin, b.device, b.dtype
    W_in = adapter.mlp_weights(layer)["W_in"]
    norm = adapter.norm("ln2", layer)
    weights = NormWeights(None if norm.gamma is None else b.cast(norm.gamma),
                          None if norm.beta is None else b.cast(norm.beta), norm.center)
    sigma = fm.ln2[layer].sigma
    act = adapter.mlp_act_fn(layer) if adapter.facts.gated_mlp else None

    def directions(neurons: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        W = W_in[:, neurons.to(W_in.device)].T.to(device=device, dtype=dtype)
        g = weights.reader_direction(W) / sigma[positions.to(sigma.device)].unsqueeze(-1)
        if act is not None:
            pre = lin.mlp_pre[layer][positions.to(lin.mlp_pre[layer].device), neurons.to(lin.mlp_pre[layer].device)]
            g = g * act(pre).to(device=device, dtype=dtype).unsqueeze(-1)
        return g

    return directions


def _collect_neuron_candidates(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    """``graph.max_neuron_nodes``: every active neuron of ``layer`` at every node position is a
    candidate node; the selection (:mod:`~circuitgraph.attribution.feature_selection`) keeps the
    most influential ones and folds the others into one remainder per (layer, position).

    The same nodes, readers and writers as :func:`_collect_neuron_layer` without ``neuron_top_k``,
    held compactly: a real model has millions of candidates (SmolLM2, 64 tokens: 30 x 1536 x 63),
    so their read directions are made when a sweep needs them (a lazy source) and their output
    vectors are ``activation x W_out`` row (a shared basis; through a frozen post-norm,
    ``(activation / sigma(t)) x gamma P(W_out row)``)."""
    adapter, lin, T = b.adapter, b.lin, b.lin.n_pos
    loc, W_out, posts, post = _neuron_layer_start(b, fm, layer)
    basis = b.writers.add_basis(W_out if posts is None else _without_sigma(posts[layer], W_out))
    # own constants: gate * (W_in[:, i] . beta2) + b_in[i] (gated), W_in[:, i] . beta2 + b_in[i] (GELU/ReLU)
    norm, w = adapter.norm("ln2", layer), adapter.mlp_weights(layer)
    b_in = b.cast(w["b_in"])
    lin_const = (b.cast(norm.beta) @ b.cast(w["W_in"]) if norm.beta is not None else torch.zeros_like(b_in))
    gated = adapter.facts.gated_mlp
    source = b.readers.add_source(_neuron_direction_source(b, fm, layer))
    read_at = fm.mlp_input_location(layer)
    start = len(b.nodes)  # the candidates' rows: start, start + 1, ... (no other node comes between)
    n = 0
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("positions", "indices", "activation", "pre", "a", "b")}
    for t in range(T):
        if t < b.min_mlp_pos():
            b.constants[loc][t] += _post_norm_forward(fm, posts, layer, (post[t] @ W_out)[None], slice(t, t + 1))[0]
            continue
        active = post[t].nonzero().flatten()
        if not active.numel():
            continue
        pre = lin.mlp_pre[layer][t, active.to(lin.mlp_pre[layer].device)]
        if gated:
            own = b.cast(adapter.mlp_act_fn(layer)(pre)) * lin_const[active] + b_in[active]
            measured = post[t, active]
            parts["b"].append(lin.mlp_pre_linear[layer][t, active.to(lin.mlp_pre[layer].device)].cpu().double())
        else:
            own = lin_const[active] + b_in[active]
            measured = b.cast(pre)
        parts["a"].append(pre.cpu().double())
        rows = torch.arange(start + n, start + n + active.numel(), dtype=torch.long)
        n += active.numel()
        parts["positions"].append(torch.full((active.numel(),), t, dtype=torch.long))
        parts["indices"].append(active.cpu())
        parts["activation"].append(post[t, active].cpu().double())
        parts["pre"].append(measured.cpu().double())
        b.readers.add_lazy_many(rows, read_at, t, source, active, own)
        scales = post[t, active] if posts is None else post[t, active] / posts[layer].sigma[t]
        b.writers.add_scaled(loc, t, rows, scales, basis, active)
    if n:
        cat = {k: torch.cat(v).numpy() for k, v in parts.items() if v}
        attrs: dict[NeuronAttr, np.ndarray] = {"gate": cat["a"], "linear": cat["b"]} if gated else {"hook_pre": cat["a"]}
        block = NeuronCandidates(layer, cat["positions"], cat["indices"], cat["activation"], cat["pre"], attrs)
        assert b.nodes.add_candidates(block) == start and len(b.nodes) == start + n


# -------------------------------------------------------------------- mixture of experts
def _expert_neuron_reader(b: _Builder, fm: FrozenLinearModel, layer: int, t: int, idx: torch.Tensor):
    """Expert neurons ``idx`` (flat: ``expert * d_mlp + neuron``) of MoE layer ``layer`` at ``t``.

    With the routing weight ``r_e(t)`` and the gate frozen, a neuron's activation
    ``r_e(t) * act(gate_i) * (W_in^e[:, i] . N2(x))`` is a reader of ln2's output (no ``b_in``:
    the experts have none); its value is the activation itself, as for a dense gated neuron.
    GPT-OSS's clamped SwiGLU: ``ModelAdapter.expert_value_map`` (its value bias is an own constant)."""
    adapter, lin = b.adapter, b.lin
    w = adapter.expert_neuron_weights(layer, idx)
    W_in = b.cast(w["W_in"]).T  # (n, d_model)
    norm = fm.ln2[layer]
    g = norm.reader_direction(W_in) / norm.sigma[t]
    lin_const = norm.reader_constant(W_in)
    route = b.cast(lin.routing[layer][t, idx // adapter.facts.d_mlp])
    scale, offset = adapter.expert_value_map(layer, b.cast(lin.mlp_pre[layer][t, idx]), b.cast(lin.mlp_pre_linear[layer][t, idx]),
                                       b.cast(w["b_in"]))
    gate = scale * route
    return g * gate.unsqueeze(-1), gate * lin_const + offset * route, b.cast(lin.mlp_post[layer][t, idx])


def _collect_expert_layer(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    """``graph.mlp: neurons`` on a MoE layer: the neurons of the experts routed at each position,
    kind ``neuron``, index ``expert * d_mlp + neuron``; each writes ``r_e(t) * act * W_out^e[i]``
    (its activation includes the routing weight), so they sum to the layer's output."""
    adapter, lin, T = b.adapter, b.lin, b.lin.n_pos
    loc, d = ResidualLocation.resid_post(layer), adapter.facts.d_mlp
    posts = fm.ln2_post
    post = b.cast(lin.mlp_post[layer])  # (T, E * d_mlp): routing weight * act(gate) * linear
    # the experts' output biases (GPT-OSS) write routing_weight * b_out^e: a constant writer
    b_out = torch.stack([b.cast(adapter.expert_weights(layer, e)["b_out"]) for e in range(adapter.facts.num_experts)])
    bias = _post_norm_forward(fm, posts, layer, b.cast(lin.routing[layer]) @ b_out, slice(0, T))
    if bool(b_out.any()):
        _add_bias(b, loc, layer, "mlp", bias)
    for t in range(T):
        active = post[t].nonzero().flatten()
        W_out = b.cast(adapter.expert_neuron_weights(layer, active)["W_out"])
        if t < b.min_mlp_pos():
            out = (post[t, active].unsqueeze(-1) * W_out).sum(0, keepdim=True)
            b.constants[loc][t] += _post_norm_forward(fm, posts, layer, out, slice(t, t + 1))[0]
            continue
        keep = torch.arange(active.numel())
        rest = None
        k = b.options.neuron_top_k
        if k is not None and active.numel() > k:
            order = post[t, active].abs().argsort(descending=True, stable=True)
            rest, keep = order[k:], order[:k].sort().values
        if keep.numel():
            idx = active[keep]
            g, own, measured = _expert_neuron_reader(b, fm, layer, t, idx)
            rows = []
            for j, i in enumerate(idx.tolist()):
                e = i // d
                attrs: NodeAttrs = {
                    "expert": e, "neuron": i - e * d, "routing_weight": float(lin.routing[layer][t, e]),
                    "gate": float(lin.mlp_pre[layer][t, i]), "linear": float(lin.mlp_pre_linear[layer][t, i])}
                row = b.add_node(Node(NodeId("neuron", layer, t, i), activation=float(post[t, i]),
                                      pre_activation=float(measured[j]), label=f"E{e}N{i - e * d} L{layer}@{t}",
                                      attrs=attrs))
                rows.append(row)
                b.readers.add(row, ResidualLocation.resid_mid(layer), t, g[j], float(own[j]))
            vecs = post[t, idx].unsqueeze(-1) * W_out[keep]
            b.writers.add(loc, t, rows, _post_norm_forward(fm, posts, layer, vecs, slice(t, t + 1)))
        if rest is not None and rest.numel():
            vec = (post[t, active[rest]].unsqueeze(-1) * W_out[rest]).sum(0, keepdim=True)
            row = b.add_node(Node(NodeId("remainder", layer, t, REMAINDER_INDEX["neurons"]), activation=1.0,
                                  label=f"other neurons L{layer}@{t}", attrs={"n_neurons": int(rest.numel())}))
            b.writers.add(loc, t, [row], _post_norm_forward(fm, posts, layer, vec, slice(t, t + 1)))


def _collect_mlp_vector_layer(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    lin, T = b.lin, b.lin.n_pos
    loc = ResidualLocation.resid_post(layer)
    out = b.cast(lin.mlp_out[layer])
    for t in range(T):
        if t < b.min_mlp_pos():
            b.constants[loc][t] += out[t]
            continue
        row = b.add_node(Node(NodeId("mlp", layer, t, 0), activation=1.0, label=f"MLP L{layer}@{t}"))
        b.writers.add(loc, t, [row], out[t : t + 1])


# -------------------------------------------------------------------- targets
def _collect_target(b: _Builder, fm: FrozenLinearModel, number: int, tgt: ResolvedTarget) -> NodeId:
    adapter, lin = b.adapter, b.lin
    L = adapter.facts.n_layers
    t = tgt.position
    if tgt.kind in ("logit", "logit_diff"):
        W_U, b_U = b.cast(adapter.W_U), b.cast(adapter.b_U)
        if tgt.kind == "logit":
            (v,) = tgt.tokens
            w, bias = W_U[:, v], b_U[v]
            if tgt.relative_to_mean:
                w, bias = w - W_U.mean(-1), bias - b_U.mean()
            label = token_str = b.tok_str(v)
            node_id = NodeId("logit", L, t, v)
            if node_id in b.index:  # the same token asked twice (e.g. plain and relative)
                node_id = NodeId("target", L, t, number)
        else:
            va, vb = tgt.tokens
            w, bias = W_U[:, va] - W_U[:, vb], b_U[va] - b_U[vb]
            token_str = f"{b.tok_str(va)} - {b.tok_str(vb)}"  # as circuit-tracer's viewers show it
            label = f"{b.tok_str(va)!r} - {b.tok_str(vb)!r}"  # quoted for readers: ' an' - ' a', spaces visible
            node_id = NodeId("target", L, t, number)
        norm = fm.ln_final
        g = norm.reader_direction(w) / norm.sigma[t]
        own = (w @ norm.beta if norm.beta is not None else 0.0) + bias
        normalized = b.cast(lin.extra["ln_final_normalized"][t])
        resid_in = normalized * norm.gamma if norm.gamma is not None else normalized
        if norm.beta is not None:
            resid_in = resid_in + norm.beta
        pre = float(resid_in @ w + bias)
        attrs: NodeAttrs = {"relative_to_mean": tgt.relative_to_mean, "tokens": list(tgt.tokens),
                 "token_str": token_str, "target_kind": tgt.kind}
        if tgt.probability is not None:
            attrs["probability"] = tgt.probability
        row = b.add_node(Node(node_id, activation=pre, pre_activation=pre, label=label, attrs=attrs))
        b.readers.add(row, ResidualLocation.resid_post(L - 1), t, g, float(own))
        return node_id
    if tgt.kind == "feature":
        node_id = NodeId("feature", tgt.layer, t, tgt.index)
        if node_id in b.index and b.nodes[b.index[node_id]].pre_activation is not None:
            return node_id
        if b.transcoders is None or tgt.layer not in b.transcoders:
            raise AttributionError(f"target feature at layer {tgt.layer}: no transcoder is loaded for that layer")
        g, own, pre = _feature_reader(b, fm, tgt.layer, t, torch.tensor([tgt.index]))
        act = float(b.transcoders[tgt.layer].activation(b.lin.tc_input[tgt.layer][t : t + 1])[0, tgt.index])
        row = _add_or_get(b, node_id, act, f"F{tgt.index} L{tgt.layer}@{t}")
        b.nodes[row].pre_activation = float(pre[0])
        b.readers.add(row, fm.mlp_input_location(tgt.layer), t, g[0], float(own[0]))
        return node_id
    if tgt.kind == "neuron":
        node_id = NodeId("neuron", tgt.layer, t, tgt.index)
        row = b.row_of(node_id)
        if row is not None and b.nodes[row].pre_activation is not None:
            return node_id
        g, own, measured = _neuron_reader(b, fm, tgt.layer, t, torch.tensor([tgt.index]))
        act = float(lin.mlp_post[tgt.layer][t, tgt.index])
        row = _add_or_get(b, node_id, act, f"N{tgt.index} L{tgt.layer}@{t}")
        b.nodes[row].pre_activation = float(measured[0])
        b.readers.add(row, fm.mlp_input_location(tgt.layer), t, g[0], float(own[0]))
        return node_id
    if tgt.kind == "direction":
        site_loc = {"resid_pre": ResidualLocation.resid_pre, "resid_mid": ResidualLocation.resid_mid,
                    "resid_post": ResidualLocation.resid_post}
        loc = site_loc[tgt.site](tgt.layer)
        resid = {"resid_pre": lin.resid_pre, "resid_mid": lin.resid_mid}.get(tgt.site)
        if resid is not None:
            x = resid[tgt.layer][t]
        else:
            x = lin.resid_pre[tgt.layer + 1][t] if tgt.layer + 1 < L else lin.resid_final[t]
        g = b.cast(tgt.vector)
        pre = float(g @ b.cast(x))
        node_id = NodeId("target", tgt.layer, t, number)
        assert tgt.site is not None  # a direction target reads a residual site (site_loc above)
        row = b.add_node(Node(node_id, activation=pre, pre_activation=pre, label=tgt.name or f"direction {number}",
                              attrs={"site": tgt.site, "target_kind": "direction"}))
        b.readers.add(row, loc, t, g, 0.0)
        return node_id
    raise AttributionError(f"unknown target kind {tgt.kind!r}")


def _add_or_get(b: _Builder, node_id: NodeId, activation: float, label: str) -> int:
    row = b.row_of(node_id)
    if row is not None:
        return row
    return b.add_node(Node(node_id, activation=activation, label=label))
