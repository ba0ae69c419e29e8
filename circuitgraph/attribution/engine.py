"""The edge computation: one backward sweep of the frozen linear model per batch of readers.

For a batch of readers we keep ``G (batch, pos, d_model)``, the gradient of each reader's
pre-activation with respect to the residual stream at the current location, and walk the
residual locations from the top down:

1. readers that read this location inject their direction ``g`` at their position;
2. every writer at this location gets the edge ``G[:, s] . out_w`` (its output vector is
   already scaled by its activation), and the constant writers add ``G . c`` to the readers'
   constants;
3. ``G`` is propagated to the location below through the transpose of the frozen model
   (:class:`~circuitgraph.attribution.frozen_model.FrozenLinearModel`).

No autograd, no per-edge work: the cost is one transposed pass per batch, and edges are
stored sparsely (exact zeros dropped), never as a dense N x N matrix.

The code is in four parts:

* the **batch planner** (:func:`plan_sweep` and its steps :func:`sort_readers`,
  :func:`split_batches`, :func:`batch_spans`, :func:`group_waves`): pure functions of the
  reader table that decide which readers go down together;
* the **slot tables** of the writer blocks
  (:meth:`~circuitgraph.attribution.nodes_builder.WriterBlock.slot_table`), made once per block
  and kept with it, so that the several calls of one prompt (``max_feature_nodes``' rounds, QK
  attribution) reuse them;
* the **sweep** (:func:`_sweep`): the walk above, which hands every ``(writers, readers)`` block
  of edges to a sink;
* two **sinks**: :class:`_SparseSink` squeezes the blocks into ``(target, source, weight)``
  arrays (:func:`compute_edges` -> :class:`EdgeResult`), :class:`_DenseSink` keeps them as they
  are (:func:`compute_dense_rows` -> :class:`~circuitgraph.attribution.dense_rows.DenseRows`).

The batches of one location go down together in *waves* (their gradients up to
:data:`WAVE_BYTES`): at each location a chunk of writer vectors is made once for all of them,
and each layer's attention pattern is read (from its file, on long prompts) once per wave.
Dense rows (:func:`compute_dense_rows`) mix locations in a wave: each batch joins it at the
location its readers read, and small batches met at a location share one GEMM per position
(:data:`STACKED_READERS`).
The writer vectors are kept one row per real writer (no padding to the busiest position); a
position's writers meet the batch's gradients at that position in one GEMM, written straight
into the sink's buffer.  On short prompts the vectors are made once and kept for all the engine
calls of a ``max_feature_nodes`` selection (``keep_writer_vectors``).
As it writes them the engine sums every row (signed and absolute) and records the ranges of
the edge arrays per reader location (top down), which the graph adopts instead of passing over
the edges again.  Each batch's constants and sums come to the host once, when it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from circuitgraph.attribution.dense_rows import DenseRows
from circuitgraph.attribution.nodes_builder import Collected, ReaderTable, SlotTable, WriterBlock
from circuitgraph.errors import AttributionError
from circuitgraph.graph.dag import add_segment
from circuitgraph.graph.edges import merge_edges
from circuitgraph.residual import ResidualLocation

if TYPE_CHECKING:  # shapes for readers and the type checker (docs/architecture.md, "Tooling"); not checked at run time
    from jaxtyping import Float, Int

__all__ = ["EdgeResult", "compute_edges", "compute_dense_rows", "dense_rows_supported", "DirectionEdges",
           "attribute_directions", "BatchSpan", "SweepPlan", "plan_sweep", "sort_readers", "split_batches",
           "batch_spans", "group_waves", "WRITER_CHUNK_BYTES", "HELD_WRITERS_BYTES", "WAVE_BYTES",
           "STACKED_READERS", "held_writer_bytes", "split_by_location"]

#: bytes of writer vectors (and of their edge block) made at once per location in the sweep
WRITER_CHUNK_BYTES = 1 << 28
#: while every writer vector of the graph fits in this many bytes (short prompts), the vectors are
#: made once and reused by every batch of readers (by every engine call of a ``max_feature_nodes``
#: selection: gathering them per call was a fifth of a GPT-2-size run); above it (long prompts)
#: they are made per chunk of position groups for each batch and never held all at once
HELD_WRITERS_BYTES = 1 << 31
#: while the batches met at a location hold at most this many readers in all, their gradients are
#: stacked and each position's writers meet all of them in one GEMM (a GEMM against a few
#: readers runs at a fraction of the speed of one against a few hundred)
STACKED_READERS = 256
#: bytes of the gradients ``G (batch, positions, d_model)`` of the batches that go down together
#: (one wave: the batches of one location, or of several for dense rows; the writer gathers and
#: pattern reads shared)
WAVE_BYTES = 1 << 30
#: how far apart in position a batch's readers may be (last position + 1 over the first's) once
#: the batch holds a quarter of ``batch_size``: squeezed edges, and dense blocks (which store the
#: structural zeros of readers before a writer's position, so want tighter bands)
SPREAD_SPARSE = 2.0
SPREAD_DENSE = 1.25


def held_writer_bytes(col: Collected) -> int:
    """The bytes :func:`compute_edges` holds for writer vectors (0 when they are made per chunk)."""
    fm = col.frozen
    elt = torch.empty((), dtype=fm.dtype).element_size()
    total = sum(block.n_writers() for block in col.writers.blocks.values()) * fm.adapter.facts.d_model * elt
    return total if total <= HELD_WRITERS_BYTES else 0


@dataclass
class EdgeResult:
    target: Int[np.ndarray, " edges"]  # reader rows
    source: Int[np.ndarray, " edges"]  # writer rows
    weight: Float[np.ndarray, " edges"]
    constants: dict[int, float]  # reader row -> constant
    #: reader row -> sum of the absolute weights of its edges (float64), when the engine summed them
    #: as it made them (None: not known, e.g. after coalescing a cross-layer transcoder's parts)
    abs_sums: dict[int, float] | np.ndarray | None = None
    #: reader row -> sum of the weights of its edges (float64), made with ``abs_sums`` (after
    #: ``max_feature_nodes`` folding both are arrays with one value per node of the folded graph)
    sums: dict[int, float] | np.ndarray | None = None
    #: ``(location, start, end)``: the ranges of the edge arrays whose readers read one residual
    #: location, highest first (the engine's order; None when the edges were reordered)
    segments: list[tuple[int, int, int]] | None = None


# ---------------------------------------------------------------------------- the batch planner
@dataclass(frozen=True)
class BatchSpan:
    """What a batch's gradient covers: positions ``0..n_positions-1`` (the last reader position
    + 1 under causal attention, the whole prompt otherwise) from ``location`` (the one residual
    location all its readers read) down."""

    n_positions: int
    location: int


@dataclass(frozen=True)
class SweepPlan:
    """The readers of one engine call in the order they go down.

    ``batches[j]``: batch ``j``'s readers (indices into the reader table); ``spans[j]``: its
    :class:`BatchSpan`; ``waves``: consecutive batch numbers that go down together."""

    batches: list[list[int]]
    spans: list[BatchSpan]
    waves: list[list[int]]


def sort_readers(readers: ReaderTable, subset: Sequence[int] | None = None) -> list[int]:
    """The readers (all, or ``subset``: indices into ``readers``) top-down by location, then by
    position (stable): a batch never mixes locations, so no reader rides along (as zeros)
    through layers above the one it reads, and its prefix of positions is short."""
    order = list(range(len(readers.rows))) if subset is None else list(subset)
    order.sort(key=lambda i: (-readers.locs[i], readers.positions[i]))
    return order


def split_batches(readers: ReaderTable, order: Sequence[int], batch_size: int, spread: float) -> list[list[int]]:
    """Consecutive runs of ``order`` (from :func:`sort_readers`) as batches: a batch ends at a new
    location, at ``batch_size`` readers, or -- once it holds ``batch_size // 4`` readers -- at a
    reader whose position + 1 exceeds ``spread`` times the batch's first one (a batch costs its
    size times its last position, squared through attention: readers far apart in position,
    such as ``max_feature_nodes``' ranked rows, go in separate batches)."""
    batches: list[list[int]] = []
    locs, positions = readers.locs, readers.positions
    min_split = max(1, batch_size // 4)
    first = 0
    for end in range(1, len(order) + 1):
        if end == len(order):
            batches.append(list(order[first:end]))
            break
        size = end - first
        reader, head = order[end], order[first]
        if (locs[reader] != locs[head] or size >= batch_size
                or (size >= min_split and positions[reader] + 1 > spread * (positions[head] + 1))):
            batches.append(list(order[first:end]))
            first = end
    return batches


def batch_spans(readers: ReaderTable, batches: Sequence[Sequence[int]], *, causal: bool,
                n_pos: int) -> list[BatchSpan]:
    """Each batch's :class:`BatchSpan`.  Causal attention: a reader at ``t`` sees writers at
    positions ``<= t`` only, so the gradient spans the batch's last position + 1; bidirectional
    attention: writers at every position, so every batch spans the whole prompt."""
    return [BatchSpan(max(readers.positions[i] for i in batch) + 1 if causal else n_pos,
                      max(readers.locs[i] for i in batch)) for batch in batches]


def group_waves(batches: Sequence[Sequence[int]], spans: Sequence[BatchSpan], row_bytes: int,
                wave_bytes: int | None = None, mixed: bool = False) -> list[list[int]]:
    """Consecutive batches of one location (``mixed``: of any locations, top down) grouped while
    their gradients (``len(batch) * n_positions * row_bytes`` each) fit in ``wave_bytes``
    (default :data:`WAVE_BYTES`); a wave holds at least one batch."""
    limit = WAVE_BYTES if wave_bytes is None else wave_bytes
    waves: list[list[int]] = []
    size = 0
    for j, batch in enumerate(batches):
        span = spans[j]
        nbytes = len(batch) * span.n_positions * row_bytes
        if waves and (mixed or spans[waves[-1][0]].location == span.location) and size + nbytes <= limit:
            waves[-1].append(j)
            size += nbytes
        else:
            waves.append([j])
            size = nbytes
    return waves


def plan_sweep(readers: ReaderTable, *, batch_size: int, subset: Sequence[int] | None = None,
               spread: float = SPREAD_SPARSE, causal: bool = True, n_pos: int, row_bytes: int,
               mixed: bool = False) -> SweepPlan:
    """Readers sorted, split into batches, their spans and waves (``row_bytes``: one gradient row,
    ``d_model`` times the element size; ``mixed``: waves may hold batches of several locations)."""
    batches = split_batches(readers, sort_readers(readers, subset), batch_size, spread)
    spans = batch_spans(readers, batches, causal=causal, n_pos=n_pos)
    return SweepPlan(batches, spans, group_waves(batches, spans, row_bytes, mixed=mixed))


# ---------------------------------------------------------------------------- batches on their way down
@dataclass
class _BatchState:
    """One batch of readers on its way down: its gradient ``G``, constants and row sums."""

    number: int
    readers: list[int]
    span: BatchSpan
    first_position: int
    G: torch.Tensor
    constants: torch.Tensor
    abs_sums: torch.Tensor
    sums: torch.Tensor
    #: node rows of the readers (int32: the edges' target column)
    node_rows: torch.Tensor
    #: (batch rows, positions, directions): what is added to ``G`` at the batch's location
    inject: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    #: each row's position while ``G`` is non-zero there only (before it crosses attention)
    single: torch.Tensor | None

    @property
    def size(self) -> int:
        return len(self.readers)

    @property
    def n_positions(self) -> int:
        return self.span.n_positions

    @classmethod
    def start(cls, col: Collected, number: int, readers: list[int], span: BatchSpan, device: torch.device,
              sums_device: torch.device) -> _BatchState:
        table, fm = col.readers, col.frozen
        size = len(readers)
        positions = [table.positions[i] for i in readers]
        directions = table.directions_of(readers)
        return cls(
            number=number, readers=readers, span=span, first_position=min(positions),
            G=torch.zeros(size, span.n_positions, fm.adapter.facts.d_model, dtype=fm.dtype, device=device),
            constants=torch.tensor([table.own_constants[i] for i in readers], dtype=torch.float64, device=device),
            abs_sums=torch.zeros(size, dtype=torch.float64, device=sums_device),
            sums=torch.zeros(size, dtype=torch.float64, device=sums_device),
            node_rows=torch.tensor([table.rows[i] for i in readers], dtype=torch.int32, device=device),
            inject=(torch.arange(size, device=device), torch.tensor(positions, device=device),
                    torch.stack(list(directions)).to(device=device, dtype=fm.dtype)),
            single=torch.tensor(positions, device=device),
        )

    def add_sums(self, weights: torch.Tensor) -> None:
        """Per reader: a block's sum and sum of |w| (float32 within the block, by one GEMV each;
        float64 across blocks)."""
        ones = torch.ones(weights.shape[0], dtype=weights.dtype, device=weights.device)
        self.sums += ones @ weights
        self.abs_sums += ones @ weights.abs()


# ---------------------------------------------------------------------------- sinks
class _SparseSink:
    """Squeezed edges: every block written straight into three buffers sized for every (writer,
    reader) pair the sweep can meet, exact zeros squeezed out as they come.  The untouched tail of
    the buffers is never written, so it takes no memory (no per-batch pieces, no final
    concatenation).  Also records the ranges of the buffers per reader location (``segments``)."""

    def __init__(self, capacity: int, dtype: torch.dtype):
        self.target = torch.empty(capacity, dtype=torch.int32)
        self.source = torch.empty(capacity, dtype=torch.int32)
        self.weight = torch.empty(capacity, dtype=dtype)
        self.n_edges = 0
        self.segments: list[tuple[int, int, int]] = []
        self._wave_start = 0

    @property
    def device(self) -> torch.device:
        """Where the edges (and the batches' row sums) are kept."""
        return self.weight.device

    def start_wave(self) -> None:
        self._wave_start = self.n_edges

    def end_wave(self, location: int) -> None:
        add_segment(self.segments, location, self._wave_start, self.n_edges)

    def scratch(self, batch: _BatchState, n_writers: int, like: torch.Tensor) -> torch.Tensor:
        """Where the engine writes the next ``(n_writers, B)`` block: this sink's own weight buffer
        when it is on the engine's device (no copy), else a fresh block."""
        n_new = n_writers * batch.size
        if like.device == self.weight.device and like.dtype == self.weight.dtype:
            return self.weight[self.n_edges:self.n_edges + n_new].view(n_writers, batch.size)
        return torch.empty(n_writers, batch.size, dtype=like.dtype, device=like.device)

    def add(self, batch: _BatchState, location: int, slot_lo: int, slot_hi: int, values: torch.Tensor,
            sources: torch.Tensor) -> None:
        """The block ``values (writers, B)`` of slots ``slot_lo..slot_hi-1`` of ``location``'s table
        (sources ``sources``) written in (writer, reader) order, exact zeros squeezed out in place."""
        size = batch.size
        n_writers = values.shape[0]
        n_new = n_writers * size
        at = self.n_edges
        weight = self.weight[at:at + n_new]
        if values.data_ptr() != weight.data_ptr() or values.device != weight.device:
            weight.copy_(values.reshape(-1))
        source = self.source[at:at + n_new]
        target = self.target[at:at + n_new]
        batch.add_sums(weight.view(n_writers, size))
        kept = int(torch.count_nonzero(weight))  # exact zeros are not edges
        if kept == n_new:
            source.view(n_writers, size).copy_(sources[:, None].expand(-1, size))
            target.view(n_writers, size).copy_(batch.node_rows[None, :].expand(n_writers, -1))
        else:  # squeezed in place: the kept (writer, reader) entries' flat indices, found once
            keep = (weight != 0).nonzero().squeeze(1)
            weight[:kept] = weight[keep]
            writer = keep // size
            torch.index_select(sources, 0, writer, out=source[:kept])
            torch.index_select(batch.node_rows, 0, keep.sub_(writer.mul_(size)), out=target[:kept])
        self.n_edges += kept

    def result(self, col: Collected, constants: dict[int, float], abs_sums: dict[int, float],
               sums: dict[int, float]) -> EdgeResult:
        t = self.target[:self.n_edges].numpy()
        s = self.source[:self.n_edges].numpy()
        w = self.weight[:self.n_edges].numpy()
        if col.multi_location_writers and len(t):
            # a writer met at several locations: its edge is the sum of its parts, whose absolute
            # values do not add up to the edge's
            t, s, w = _coalesce(t, s, w, len(col.nodes))
            return EdgeResult(t, s, w, constants)
        return EdgeResult(t, s, w, constants, abs_sums, sums, self.segments)


class _DenseSink:
    """Dense rows: each block kept as it is, ``(slots, readers)``, on the host, with its
    location, slot range and batch number (exact zeros kept)."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.blocks: list[tuple[int, int, int, int, np.ndarray]] = []

    def start_wave(self) -> None:
        pass

    def end_wave(self, location: int) -> None:
        pass

    def scratch(self, batch: _BatchState, n_writers: int, like: torch.Tensor) -> torch.Tensor:
        """A fresh ``(n_writers, B)`` block for the engine to write (kept as it is)."""
        return torch.empty(n_writers, batch.size, dtype=like.dtype, device=like.device)

    def add(self, batch: _BatchState, location: int, slot_lo: int, slot_hi: int, values: torch.Tensor,
            sources: torch.Tensor) -> None:
        values = values.cpu()
        batch.add_sums(values)
        self.blocks.append((location, slot_lo, slot_hi, batch.number, values.numpy()))

    def result(self, col: Collected, plan: SweepPlan, constants: dict[int, float], abs_sums: dict[int, float],
               sums: dict[int, float]) -> DenseRows:
        rows = col.readers.rows
        return DenseRows(
            reader_rows=[np.array([rows[i] for i in batch], dtype=np.int64) for batch in plan.batches],
            blocks=self.blocks, constants=constants, abs_sums=abs_sums, sums=sums)


# ---------------------------------------------------------------------------- entry points
@torch.no_grad()
def compute_edges(
    col: Collected,
    *,
    batch_size: int = 256,
    reader_subset: list[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    constant_parts: dict[int, dict[int, float]] | None = None,
    keep_writer_vectors: bool = False,
) -> EdgeResult:
    """All edges into the readers (or into ``reader_subset``, indices into ``col.readers``), as
    squeezed ``(target, source, weight)`` arrays with each reader's constant and row sums.

    When ``constant_parts`` is a dict it receives, per reader row, the reader's constant split
    by origin: ``{row: {loc: value}}`` with ``loc`` the residual location of the constant
    writers (``-1`` for the reader's own constant); the parts sum to the reader's constant.
    The same rows as blocks: :func:`compute_dense_rows`.

    ``keep_writer_vectors``: leave the writer vectors a short prompt's sweep made on their blocks
    for the next call (a ``max_feature_nodes`` selection's many calls), until
    ``col.writers.release_vectors()``; by default they are dropped when the call returns."""
    plan = _plan(col, batch_size, reader_subset, SPREAD_SPARSE)
    sink = _SparseSink(_sparse_capacity(col, plan), col.frozen.dtype)
    try:
        constants, abs_sums, sums = _sweep(col, plan, sink, constant_parts, progress)
    finally:
        if not keep_writer_vectors:
            col.writers.release_vectors()
    return sink.result(col, constants, abs_sums, sums)


def dense_rows_supported(col: Collected) -> bool:
    """Whether :func:`compute_dense_rows` can keep ``col``'s rows as blocks: not with writers met
    at several locations (cross-layer transcoders), whose parts must be summed into one edge."""
    return not col.multi_location_writers


@torch.no_grad()
def compute_dense_rows(
    col: Collected,
    *,
    batch_size: int = 256,
    reader_subset: list[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    constant_parts: dict[int, dict[int, float]] | None = None,
    keep_writer_vectors: bool = False,
) -> DenseRows:
    """The edges of :func:`compute_edges`, kept as the sweep's ``(writers, readers)`` blocks
    (:class:`~circuitgraph.attribution.dense_rows.DenseRows`: 4 bytes per entry and no indices;
    exact zeros kept), for ``max_feature_nodes``' rows.  Batches keep tighter position bands
    (:data:`SPREAD_DENSE`), as a block stores the zeros of readers before a writer's position.
    ``keep_writer_vectors``: as for :func:`compute_edges`."""
    if not dense_rows_supported(col):
        raise AttributionError("dense rows need one location per writer; this graph has writers at several "
                               "locations (a cross-layer transcoder): use compute_edges")
    plan = _plan(col, batch_size, reader_subset, SPREAD_DENSE, mixed=True)
    sink = _DenseSink()
    try:
        constants, abs_sums, sums = _sweep(col, plan, sink, constant_parts, progress)
    finally:
        if not keep_writer_vectors:
            col.writers.release_vectors()
    return sink.result(col, plan, constants, abs_sums, sums)


def split_by_location(col: Collected, rows: DenseRows) -> list[tuple[int, DenseRows]]:
    """``rows`` (one :func:`compute_dense_rows` call, whose readers may read several residual
    locations) as one :class:`DenseRows` per reader location, top down: what a back-substitution
    over the levels visits (each with its own readers' constants and sums)."""
    loc_of = col.readers.location_by_row()
    by_loc: dict[int, list[int]] = {}
    for j, readers in enumerate(rows.reader_rows):
        if len(readers):
            by_loc.setdefault(loc_of[int(readers[0])], []).append(j)
    if len(by_loc) <= 1:
        return [(next(iter(by_loc), -1), rows)]
    out = []
    for loc in sorted(by_loc, reverse=True):
        batches = by_loc[loc]
        new = {j: k for k, j in enumerate(batches)}
        keep = {int(r) for j in batches for r in rows.reader_rows[j]}
        pick = lambda d, keep=keep: {r: v for r, v in d.items() if r in keep}  # noqa: E731
        out.append((loc, DenseRows(
            reader_rows=[rows.reader_rows[j] for j in batches],
            blocks=[(wl, lo, hi, new[j], v) for wl, lo, hi, j, v in rows.blocks if j in new],
            constants=pick(rows.constants), abs_sums=pick(rows.abs_sums), sums=pick(rows.sums))))
    return out


def _plan(col: Collected, batch_size: int, reader_subset: Sequence[int] | None, spread: float,
          mixed: bool = False) -> SweepPlan:
    fm = col.frozen
    elt = torch.empty((), dtype=fm.dtype).element_size()
    return plan_sweep(col.readers, batch_size=batch_size, subset=reader_subset, spread=spread, causal=fm.causal,
                      n_pos=fm.n_pos, row_bytes=fm.adapter.facts.d_model * elt, mixed=mixed)


def _sparse_capacity(col: Collected, plan: SweepPlan) -> int:
    """Every (writer slot, reader) pair the sweep can meet: per batch, the slots of the locations
    at or below its own at positions before its span's end."""
    device = col.frozen.device
    tables = [(loc, block.slot_table(device)) for loc, block in col.writers.blocks.items()]
    return sum(table.group_starts[table.groups_before(span.n_positions)] * len(batch)
               for batch, span in zip(plan.batches, plan.spans, strict=False)
               for loc, table in tables if loc <= span.location)


# ---------------------------------------------------------------------------- the sweep
class _WriterVectors:
    """Writer output vectors per chunk of position groups, one row per real slot (no padding):
    held for the whole sweep while they all fit (:data:`HELD_WRITERS_BYTES`), else made per chunk
    (the decoder rows gathered into one reused buffer when the basis is in the compute dtype and
    device)."""

    def __init__(self, col: Collected):
        fm = col.frozen
        self.dtype, self.device = fm.dtype, fm.device
        self.held = held_writer_bytes(col) > 0
        self._gather_buffer: torch.Tensor | None = None

    def chunk(self, block: WriterBlock, slots: SlotTable, start: int, end: int,
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(vectors, scale)`` of the real slots of groups ``start:end``: ``(n, d_model)`` output
        vectors, or (long prompts) the unscaled basis rows and the ``scale (n, 1)`` to apply to
        the edge rows (one pass over the vectors instead of two, and no fresh allocation per chunk)."""
        lo, hi = slots.group_starts[start], slots.group_starts[end]
        if self.held:
            return block.held_vectors(slots)[lo:hi], None
        if block.basis.dtype == self.dtype and block.basis.device == self.device:
            d = block.basis.shape[1]
            n_el = (hi - lo) * d
            if self._gather_buffer is None or self._gather_buffer.numel() < n_el:
                self._gather_buffer = torch.empty(n_el, dtype=self.dtype, device=self.device)
            rows = torch.index_select(block.basis, 0, slots.basis_index[lo:hi],
                                      out=self._gather_buffer[:n_el].view(hi - lo, d))
            return rows, slots.scale[lo:hi].unsqueeze(-1)
        return block.slot_vectors(slots, lo, hi).to(device=self.device, dtype=self.dtype), None


def _sweep(col: Collected, plan: SweepPlan, sink: _SparseSink | _DenseSink,
           constant_parts: dict[int, dict[int, float]] | None,
           progress: Callable[[int, int], None] | None) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Send every wave of ``plan`` down the frozen model, handing each block of edges to ``sink``;
    returns the readers' ``(constants, abs_sums, sums)`` by node row."""
    fm = col.frozen
    table = col.readers
    device = fm.device
    writer_vectors = _WriterVectors(col)
    constants: dict[int, float] = {}
    abs_sums: dict[int, float] = {}
    sums: dict[int, float] = {}
    n_done = 0
    for wave in plan.waves:
        # the batches of one wave go down together: each writer chunk is gathered once and each
        # attention pattern read once for all of them
        batches = [_BatchState.start(col, j, plan.batches[j], plan.spans[j], device, sink.device) for j in wave]
        top = max(b.span.location for b in batches)
        sink.start_wave()
        for location in range(top, -1, -1):
            # a batch joins the wave at the location its readers read (a mixed wave's lower
            # batches never go through the layers above their own)
            for batch in batches:
                if batch.span.location == location:
                    rows, positions, directions = batch.inject
                    batch.G.index_put_((rows, positions), directions, accumulate=True)
            active = [b for b in batches if b.span.location >= location]
            block = col.writers.blocks.get(location)
            if block is not None:
                _write_location(location, block, active, writer_vectors, sink, fm.causal, fm.adapter.facts.d_model)
            constant = col.constants.get(location)
            if constant is not None:
                _add_constants(location, constant, active, table, constant_parts)
            if location > 0:
                # the widest batch first: the pattern block read for it serves the narrower ones
                for batch in sorted(active, key=lambda b: -b.n_positions):
                    batch.G = fm.step_down(location, batch.G, batch.single)
                    if ResidualLocation(location).sublayer == "attn":
                        batch.single = None
        for batch in batches:
            rows = [table.rows[i] for i in batch.readers]
            # to the host once per batch
            constants.update(zip(rows, batch.constants.tolist(), strict=False))
            abs_sums.update(zip(rows, batch.abs_sums.tolist(), strict=False))
            sums.update(zip(rows, batch.sums.tolist(), strict=False))
            n_done += 1
            if progress is not None:
                progress(n_done, len(plan.batches))
        sink.end_wave(top)
    fm.release_pattern_cache()
    return constants, abs_sums, sums


def _write_location(location: int, block: WriterBlock, batches: list[_BatchState], writer_vectors: _WriterVectors,
                    sink: _SparseSink | _DenseSink, causal: bool, d_model: int) -> None:
    """The edges from ``location``'s writers into every batch of the wave, chunk by chunk of
    position groups, handed to ``sink``."""
    slots = block.slot_table(writer_vectors.device)
    # per batch: the groups at positions before its span's end, and (causal) the groups at or
    # before its first reader position, which feed every reader of the batch; later groups feed
    # only the readers at or after them (the rest are exact zeros to squeeze out): the two
    # ranges are written separately, the first as it comes
    ends = [slots.groups_before(b.n_positions) for b in batches]
    shared_ends = [min(end, slots.groups_up_to(b.first_position)) if causal else end
                   for b, end in zip(batches, ends, strict=False)]
    n_groups = max(ends)
    n_readers = sum(b.size for b in batches)
    stacked = (len(batches) > 1 and n_readers <= STACKED_READERS
               and n_readers * max(b.n_positions for b in batches) * d_model * batches[0].G.element_size()
               <= WRITER_CHUNK_BYTES)
    widest = n_readers if stacked else max(b.size for b in batches)
    elt = torch.empty((), dtype=writer_vectors.dtype).element_size()
    step = max(1, WRITER_CHUNK_BYTES // max(1, block.rows.shape[1] * (d_model + widest) * elt))
    G_all = _stacked_gradients(batches, writer_vectors) if stacked else None
    for chunk_start in range(0, n_groups, step):
        chunk_end = min(n_groups, chunk_start + step)
        vectors, scale = writer_vectors.chunk(block, slots, chunk_start, chunk_end)
        if G_all is not None:
            _write_stacked(location, slots, batches, ends, G_all, vectors, scale, chunk_start, chunk_end, sink)
            continue
        for batch, end, shared_end in zip(batches, ends, shared_ends, strict=False):
            for lo, hi in ((chunk_start, min(chunk_end, shared_end)), (max(chunk_start, shared_end), min(chunk_end, end))):
                if hi > lo:
                    _write_groups(location, slots, batch, vectors, scale, slots.group_starts[chunk_start], lo, hi, sink)


def _write_groups(location: int, slots: SlotTable, batch: _BatchState, vectors: torch.Tensor,
                  scale: torch.Tensor | None, chunk_slot: int, lo: int, hi: int,
                  sink: _SparseSink | _DenseSink) -> None:
    """The edges from the writers of position groups ``lo..hi-1`` into ``batch``: ``(slots, B)``,
    every real writer slot (row-major, ``vectors`` and ``scale`` starting at slot ``chunk_slot``)
    against every reader, one GEMM per group (its writers against the gradients at its position:
    no padding multiplied, no gather of the gradients)."""
    starts, positions = slots.group_starts, slots.positions
    slot_lo, slot_hi = starts[lo], starts[hi]
    out = sink.scratch(batch, slot_hi - slot_lo, vectors)
    G = batch.G
    for g in range(lo, hi):
        a, b = starts[g], starts[g + 1]
        torch.mm(vectors[a - chunk_slot:b - chunk_slot], G[:, positions[g]].T, out=out[a - slot_lo:b - slot_lo])
    if scale is not None:
        out.mul_(scale[slot_lo - chunk_slot:slot_hi - chunk_slot])
    sink.add(batch, location, slot_lo, slot_hi, out, slots.node_rows[slot_lo:slot_hi])


def _stacked_gradients(batches: list[_BatchState], writer_vectors: _WriterVectors) -> torch.Tensor:
    """The batches' gradients side by side, position-major: ``(positions, readers, d_model)``
    (zeros past a batch's span), so that a position's writers meet every batch in one GEMM."""
    T = max(b.n_positions for b in batches)
    G0 = batches[0].G
    out = torch.zeros(T, sum(b.size for b in batches), G0.shape[2], dtype=G0.dtype, device=G0.device)
    col = 0
    for b in batches:
        out[:b.n_positions, col:col + b.size].copy_(b.G.transpose(0, 1))
        col += b.size
    return out


def _write_stacked(location: int, slots: SlotTable, batches: list[_BatchState], ends: list[int],
                   G_all: torch.Tensor, vectors: torch.Tensor, scale: torch.Tensor | None, chunk_start: int,
                   chunk_end: int, sink: _SparseSink | _DenseSink) -> None:
    """:func:`_write_groups` for several small batches at once: one GEMM per position group
    against every batch's readers (``G_all``, :func:`_stacked_gradients`), then each batch's
    columns, up to its span, handed to the sink."""
    hi = min(chunk_end, max(ends))
    if hi <= chunk_start:
        return
    starts, positions = slots.group_starts, slots.positions
    chunk_slot = starts[chunk_start]
    out = torch.empty(starts[hi] - chunk_slot, G_all.shape[1], dtype=vectors.dtype, device=vectors.device)
    for g in range(chunk_start, hi):
        a, b = starts[g] - chunk_slot, starts[g + 1] - chunk_slot
        torch.mm(vectors[a:b], G_all[positions[g]].T, out=out[a:b])
    if scale is not None:
        out.mul_(scale[:out.shape[0]])
    col = 0
    for batch, end in zip(batches, ends, strict=False):
        e = min(chunk_end, end)
        if e > chunk_start:
            n = starts[e] - chunk_slot
            values = sink.scratch(batch, n, vectors)
            values.copy_(out[:n, col:col + batch.size])
            sink.add(batch, location, chunk_slot, starts[e], values, slots.node_rows[chunk_slot:starts[e]])
        col += batch.size


def _add_constants(location: int, constant: torch.Tensor, batches: list[_BatchState], table: ReaderTable,
                   constant_parts: dict[int, dict[int, float]] | None) -> None:
    """``G . c`` added to each batch's constants for ``location``'s constant writers ``c (pos,
    d_model)`` (and recorded per origin in ``constant_parts`` when asked)."""
    for batch in batches:
        T, D = batch.n_positions, constant.shape[-1]
        part = (batch.G.reshape(batch.size, T * D) @ constant[:T].reshape(T * D)).to(torch.float64)
        batch.constants += part
        if constant_parts is not None:
            for i, value in zip(batch.readers, part.tolist(), strict=False):
                constant_parts.setdefault(table.rows[i], {-1: table.own_constants[i]})[location] = value


def _coalesce(t: np.ndarray, s: np.ndarray, w: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One edge per (reader, writer): a writer met at several locations (a cross-layer
    transcoder feature writing into several MLP outputs) gets the sum of its parts."""
    mt, ms, mw, _ = merge_edges(t, s, w, n, drop_zeros=True)
    return mt.astype(t.dtype), ms.astype(s.dtype), mw.astype(w.dtype)


# ---------------------------------------------------------------------------- ad-hoc readers
@dataclass
class DirectionEdges:
    """Edges from every writer node into ad-hoc readers (see :func:`attribute_directions`).

    ``reader[e]`` indexes the directions, ``writer[e]`` indexes ``writer_ids`` (node ids as
    attributed: before ``max_feature_nodes`` folding), ``weight[e]`` is the edge; ``constants[i]``
    splits reader ``i``'s constant by origin: ``{location: value}`` with ``-1`` for its own constant.
    """

    reader: Int[np.ndarray, " edges"]
    writer: Int[np.ndarray, " edges"]
    writer_ids: list
    weight: Float[np.ndarray, " edges"]
    constants: list[dict[int, float]]


@torch.no_grad()
def attribute_directions(
    col: Collected,
    location: int,
    positions: Sequence[int],
    directions: Float[torch.Tensor, "readers d_model"],
    own_constants: Sequence[float],
    *,
    batch_size: int = 256,
) -> DirectionEdges:
    """Every writer's contribution to readers that are not nodes: reader ``i`` reads
    ``directions[i] . x(location, positions[i]) + own_constants[i]`` in the frozen model.

    One transposed sweep for all of them (the edges of :func:`compute_edges`); used by QK
    attribution, whose readers are a head's query and key dimensions.
    """
    table = ReaderTable()
    for i, (t, g, c) in enumerate(zip(positions, directions, own_constants, strict=False)):
        table.add(i, int(location), int(t), g, float(c))
    n = len(table.rows)
    parts: dict[int, dict[int, float]] = {}
    edges = compute_edges(replace(col, readers=table), batch_size=batch_size, constant_parts=parts)
    constants = [parts.get(i, {-1: float(own_constants[i])}) for i in range(n)]
    rows, writer = np.unique(edges.source, return_inverse=True)
    return DirectionEdges(edges.target.astype(np.int64), writer.astype(np.int64).reshape(-1),
                          [col.nodes[r].id for r in rows.tolist()], edges.weight, constants)
