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

The batches of one location go down together in *waves* (their gradients up to
:data:`WAVE_BYTES`): at each location a chunk of writer vectors is made once for all of them,
and each layer's attention pattern is read (from its file, on long prompts) once per wave.
As it writes them the engine sums every row (signed and absolute) and records the ranges of
the edge arrays per reader location (top down), which the graph adopts instead of passing over
the edges again.  ``dense=True`` (``max_feature_nodes``) keeps the ``(writers, readers)`` blocks
as they are (:mod:`~circuitgraph.attribution.dense_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from circuitgraph.attribution.dense_rows import DenseRows
from circuitgraph.attribution.locations import ResidualLocation
from circuitgraph.attribution.nodes_builder import Collected, ReaderTable
from circuitgraph.graph.dag import add_segment
from circuitgraph.graph.edges import merge_edges

__all__ = ["EdgeResult", "compute_edges", "DirectionEdges", "attribute_directions", "WRITER_CHUNK_BYTES",
           "HELD_WRITERS_BYTES", "held_writer_bytes"]

#: bytes of writer vectors (and of their edge block) made at once per location in the sweep
WRITER_CHUNK_BYTES = 1 << 28
#: while every writer vector of the graph fits in this many bytes (short prompts), the vectors are
#: made once per sweep and reused by every batch of readers; above it (long prompts) they are made
#: per chunk of position groups for each batch and never held all at once
HELD_WRITERS_BYTES = 1 << 28


def held_writer_bytes(col: Collected) -> int:
    """The bytes :func:`compute_edges` holds for writer vectors (0 when they are made per chunk)."""
    fm = col.frozen
    elt = torch.empty((), dtype=fm.dtype).element_size()
    total = sum(block.n_slots() for block in col.writers.blocks.values()) * fm.adapter.facts.d_model * elt
    return total if total <= HELD_WRITERS_BYTES else 0


@dataclass
class EdgeResult:
    target: np.ndarray
    source: np.ndarray
    weight: np.ndarray
    constants: dict[int, float]  # reader row -> constant
    #: reader row -> sum of the absolute weights of its edges (float64), when the engine summed them
    #: as it made them (None: not known, e.g. after coalescing a cross-layer transcoder's parts)
    abs_sums: "dict[int, float] | np.ndarray | None" = None
    #: reader row -> sum of the weights of its edges (float64), made with ``abs_sums`` (after
    #: ``max_feature_nodes`` folding both are arrays with one value per node of the folded graph)
    sums: "dict[int, float] | np.ndarray | None" = None
    #: ``(location, start, end)``: the ranges of the edge arrays whose readers read one residual
    #: location, highest first (the engine's order; None when the edges were reordered)
    segments: list[tuple[int, int, int]] | None = None


@torch.no_grad()
def compute_edges(
    col: Collected,
    *,
    batch_size: int = 256,
    reader_subset: list[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    constant_parts: dict[int, dict[int, float]] | None = None,
    dense: bool = False,
) -> "EdgeResult | DenseRows":
    """All edges into the readers (or into ``reader_subset``, indices into ``col.readers``).

    ``dense``: return the edges as :class:`~circuitgraph.attribution.dense_rows.DenseRows` (one
    ``(writers, readers)`` block per writer chunk, 4 bytes per entry and no indices; exact zeros
    kept) instead of squeezed ``(target, source, weight)`` arrays; not with writers met at several
    locations (cross-layer transcoders), which get the arrays.

    When ``constant_parts`` is a dict it receives, per reader row, the reader's constant split
    by origin: ``{row: {loc: value}}`` with ``loc`` the residual location of the constant
    writers (``-1`` for the reader's own constant); the parts sum to the reader's constant."""
    fm = col.frozen
    rd = col.readers
    idx = list(range(len(rd.rows))) if reader_subset is None else list(reader_subset)
    # top-down, then by position; a batch never mixes locations, so no reader rides along
    # (as zeros) through layers above the one it reads, and its prefix of positions is short
    idx.sort(key=lambda i: (-rd.locs[i], rd.positions[i]))
    dense = dense and not col.multi_location_writers
    # dense blocks store a batch's structural zeros (readers before a writer's position): tighter
    # position bands per batch keep them few
    spread = 1.25 if dense else 2.0
    constants: dict[int, float] = {}
    dtype, device = fm.dtype, fm.device
    D = fm.adapter.facts.d_model
    batches: list[list[int]] = []
    start = 0
    for end in range(1, len(idx) + 1):
        if end == len(idx) or rd.locs[idx[end]] != rd.locs[idx[start]] or end - start >= batch_size or (
                # a batch costs its size times its last position (squared through attention): readers
                # far apart in position (max_feature_nodes' ranked rows) go in separate batches
                end - start >= max(1, batch_size // 4) and rd.positions[idx[end]] + 1 > spread * (rd.positions[idx[start]] + 1)):
            batches.append(idx[start:end])
            start = end
    # per location: the real slots (group, writer) of the padded writer block, their row ids
    # (int32, the edges' source column) and how many of them lie in the first k groups
    slots, n_slots = {}, {}
    for loc, block in col.writers.blocks.items():
        g_i, w_i, node_rows = block.slots()
        slots[loc] = (g_i.to(device), w_i.to(device), node_rows.to(device=device, dtype=torch.int32))
        n_slots[loc] = torch.cat([torch.zeros(1, dtype=torch.long), (block.rows >= 0).sum(1).cumsum(0)]).tolist()
    held: dict[int, torch.Tensor] | None = {} if held_writer_bytes(col) else None
    # the edges are written straight into three buffers sized for every (writer, reader) pair the
    # sweep can meet; exact zeros are squeezed out as they come, and the untouched tail of the
    # buffers is never written, so it takes no memory (no per-batch pieces, no final concatenation)
    # per batch: its positions' prefix (the last position + 1) and its highest location
    # (causal attention: a reader at t sees writers at positions <= t only; bidirectional attention:
    # writers at every position, so every batch's gradient spans the whole prompt)
    causal = fm.causal
    spans = [(max(rd.positions[i] for i in batch) + 1 if causal else fm.n_pos, max(rd.locs[i] for i in batch))
             for batch in batches]
    bound = 0 if dense else sum(int(n_slots[loc][int(torch.searchsorted(block.positions, T))]) * len(batch)
                                for batch, (T, top) in zip(batches, spans)
                                for loc, block in col.writers.blocks.items() if loc <= top)
    dense_blocks: list = []
    out_t = torch.empty(bound, dtype=torch.int32)
    out_s = torch.empty(bound, dtype=torch.int32)
    out_w = torch.empty(bound, dtype=dtype)
    n_out = 0
    w_dev = out_w.device
    abs_sums: dict[int, float] = {}
    sums: dict[int, float] = {}
    segments: list[tuple[int, int, int]] = []
    gather_buf: torch.Tensor | None = None
    elt = torch.empty((), dtype=dtype).element_size()
    n_done = 0
    for wave in _waves(batches, spans, D * elt):
        # the batches of one wave read one location and go down together: each writer chunk is
        # gathered once and each attention pattern read once for all of them
        sts = [_BatchState.start(col, j, batches[j], spans[j], device, w_dev) for j in wave]
        top = sts[0].top
        wave_first = n_out
        for loc in range(top, -1, -1):
            if loc == top:  # every reader of the wave reads this location
                for st in sts:
                    js, ps, dirs = st.inject
                    st.G.index_put_((js, ps), dirs, accumulate=True)
            block = col.writers.blocks.get(loc)
            if block is not None:
                g_all, w_all, src = slots[loc]
                ks = [int(torch.searchsorted(block.positions, st.T)) for st in sts]  # groups at positions < T
                # causal: writer groups at or before a batch's first reader position feed every reader
                # of the batch; later ones only the readers at or after them (the rest are exact zeros to
                # squeeze out): the two ranges are written separately, the first as it comes
                k0s = [min(k, int(torch.searchsorted(block.positions, st.p_first, right=True))) if causal else k
                       for st, k in zip(sts, ks)]
                k_max = max(ks)
                B_max = max(st.B for st in sts)
                # the writers' vectors are made per chunk of position groups (they are not held)
                step = max(1, WRITER_CHUNK_BYTES // max(1, block.rows.shape[1] * (D + B_max) * elt))
                for a in range(0, k_max, step):
                    e = min(k_max, a + step)
                    scale = None
                    if held is not None:
                        if loc not in held:
                            held[loc] = block.vectors()
                        V = held[loc][a:e]
                    elif block.basis.dtype == dtype and block.basis.device == device:
                        # long prompts: the basis rows (decoder rows) gathered into one reused buffer
                        # and the activations applied to the (smaller) edge blocks: one pass over the
                        # vectors instead of two, and no fresh allocation per chunk
                        n_el = (e - a) * block.index.shape[1] * D
                        if gather_buf is None or gather_buf.numel() < n_el:
                            gather_buf = torch.empty(n_el, dtype=dtype, device=device)
                        V = block.basis_rows(a, e, out=gather_buf[:n_el])
                        scale = block.scale[a:e].unsqueeze(-1)
                    else:
                        V = block.vectors(a, e)
                    for st, k, k0 in zip(sts, ks, k0s):
                        for a2, e2 in ((a, min(e, k0)), (max(a, k0), min(e, k))):
                            if e2 <= a2:
                                continue
                            # (groups, max_n, B): every writer against every reader, one batched GEMM
                            p0, p1 = int(block.positions[a2]), int(block.positions[e2 - 1]) + 1
                            # positions a2..e2-1 are usually a run of consecutive positions: a view of G
                            Gs = st.G[:, p0:p1] if p1 - p0 == e2 - a2 else st.G[:, block.positions[a2:e2], :]
                            E = torch.bmm(V[a2 - a:e2 - a], Gs.permute(1, 2, 0))
                            if scale is not None:
                                E.mul_(scale[a2 - a:e2 - a])
                            # the real (group, writer) slots, row-major: those of groups a2..e2-1 are a range
                            lo, hi = int(n_slots[loc][a2]), int(n_slots[loc][e2])
                            rows = (g_all[lo:hi] - a2) * E.shape[1] + w_all[lo:hi]
                            if dense:
                                block_w = E.view(-1, st.B).index_select(0, rows).cpu()
                                del E
                                st.add_sums(block_w)
                                dense_blocks.append((loc, lo, hi, st.j, block_w.numpy()))
                                continue
                            n_out += _write_squeezed(E, rows, st, src[lo:hi], out_t, out_s, out_w, n_out)
                            del E
            c = col.constants.get(loc)
            if c is not None:
                for st in sts:
                    part = (st.G.reshape(st.B, st.T * D) @ c[:st.T].reshape(st.T * D)).to(torch.float64)
                    st.const += part
                    if constant_parts is not None:
                        for jj, i in enumerate(st.batch):
                            constant_parts.setdefault(rd.rows[i], {-1: rd.own_constants[i]})[loc] = float(part[jj])
            if loc > 0:
                # the widest batch first: the pattern block read for it serves the narrower ones
                for st in sorted(sts, key=lambda x: -x.T):
                    st.G = fm.step_down(loc, st.G, st.single)
                    if ResidualLocation(loc).sublayer == "attn":
                        st.single = None
        for st in sts:
            for jj, i in enumerate(st.batch):
                constants[rd.rows[i]] = float(st.const[jj])
                abs_sums[rd.rows[i]] = float(st.abs_b[jj])
                sums[rd.rows[i]] = float(st.sum_b[jj])
            n_done += 1
            if progress is not None:
                progress(n_done, len(batches))
        add_segment(segments, top, wave_first, n_out)
    fm.release_pattern_cache()
    if dense:
        return DenseRows(
            reader_rows=[np.array([rd.rows[i] for i in batch], dtype=np.int64) for batch in batches],
            blocks=dense_blocks, constants=constants, abs_sums=abs_sums, sums=sums)
    t = out_t[:n_out].numpy()
    s = out_s[:n_out].numpy()
    w = out_w[:n_out].numpy()
    if col.multi_location_writers and len(t):
        # a writer met at several locations: its edge is the sum of its parts, whose absolute
        # values do not add up to the edge's
        t, s, w = _coalesce(t, s, w, len(col.nodes))
        return EdgeResult(t, s, w, constants)
    return EdgeResult(t, s, w, constants, abs_sums, sums, segments)


#: bytes of the gradients ``G (batch, positions, d_model)`` of the batches that go down together
#: (one wave: the batches of one location, the writer gathers and pattern reads shared)
WAVE_BYTES = 1 << 30


def _waves(batches: list[list[int]], spans: list[tuple[int, int]], row_bytes: int) -> list[list[int]]:
    """Consecutive batches of one location (``spans[j] = (T, loc)``) grouped while their
    gradients fit in :data:`WAVE_BYTES` (a wave holds at least one batch)."""
    waves: list[list[int]] = []
    size = 0
    for j, batch in enumerate(batches):
        T, loc = spans[j]
        b = len(batch) * T * row_bytes
        if waves and spans[waves[-1][0]][1] == loc and size + b <= WAVE_BYTES:
            waves[-1].append(j)
            size += b
        else:
            waves.append([j])
            size = b
    return waves


@dataclass
class _BatchState:
    """One batch of readers on its way down: its gradient ``G``, constants and row sums."""

    j: int
    batch: list[int]
    T: int
    top: int
    p_first: int
    G: torch.Tensor
    const: torch.Tensor
    abs_b: torch.Tensor
    sum_b: torch.Tensor
    batch_rows: torch.Tensor
    inject: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    #: each row's position while ``G`` is non-zero there only (before it crosses attention)
    single: torch.Tensor | None

    @property
    def B(self) -> int:
        return len(self.batch)

    @classmethod
    def start(cls, col: Collected, j: int, batch: list[int], span: tuple[int, int], device: torch.device,
              sums_device: torch.device) -> "_BatchState":
        rd, fm = col.readers, col.frozen
        T, top = span
        B = len(batch)
        positions = [rd.positions[i] for i in batch]
        directions = rd.directions_of(batch)
        return cls(
            j=j, batch=batch, T=T, top=top, p_first=min(positions),
            G=torch.zeros(B, T, fm.adapter.facts.d_model, dtype=fm.dtype, device=device),
            const=torch.tensor([rd.own_constants[i] for i in batch], dtype=torch.float64, device=device),
            abs_b=torch.zeros(B, dtype=torch.float64, device=sums_device),
            sum_b=torch.zeros(B, dtype=torch.float64, device=sums_device),
            batch_rows=torch.tensor([rd.rows[i] for i in batch], dtype=torch.int32, device=device),
            inject=(torch.arange(B, device=device), torch.tensor(positions, device=device),
                    torch.stack(list(directions)).to(device=device, dtype=fm.dtype)),
            single=torch.tensor(positions, device=device),
        )

    def add_sums(self, w: torch.Tensor) -> None:
        """Per reader: a block's sum and sum of |w| (float32 within the block, by one GEMV each;
        float64 across blocks)."""
        ones = torch.ones(w.shape[0], dtype=w.dtype, device=w.device)
        self.sum_b += ones @ w
        self.abs_b += ones @ w.abs()


def _write_squeezed(E: torch.Tensor, rows: torch.Tensor, st: _BatchState, src: torch.Tensor, out_t: torch.Tensor,
                    out_s: torch.Tensor, out_w: torch.Tensor, n_out: int) -> int:
    """The block's real slots written at ``n_out`` in (writer, reader) order, exact zeros squeezed
    out in place; returns how many edges were kept."""
    B = st.B
    n_w = rows.shape[0]
    m = n_w * B
    w = out_w[n_out:n_out + m]
    if E.device == w.device:
        torch.index_select(E.view(-1, B), 0, rows, out=w.view(n_w, B))
    else:
        w.copy_(E.view(-1, B).index_select(0, rows).view(-1))
    s = out_s[n_out:n_out + m]
    t = out_t[n_out:n_out + m]
    st.add_sums(w.view(n_w, B))
    nz = w != 0  # exact zeros are not edges
    kept = int(nz.sum())
    if kept == m:
        s.view(n_w, B).copy_(src[:, None].expand(-1, B))
        t.view(n_w, B).copy_(st.batch_rows[None, :].expand(n_w, -1))
    else:  # squeezed in place: the kept (writer, reader) entries' flat indices, found once
        keep = nz.nonzero().squeeze(1)
        w[:kept] = w[keep]
        writer = keep // B
        torch.index_select(src, 0, writer, out=s[:kept])
        torch.index_select(st.batch_rows, 0, keep.sub_(writer.mul_(B)), out=t[:kept])
    return kept


def _coalesce(t: np.ndarray, s: np.ndarray, w: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One edge per (reader, writer): a writer met at several locations (a cross-layer
    transcoder feature writing into several MLP outputs) gets the sum of its parts."""
    mt, ms, mw, _ = merge_edges(t, s, w, n, drop_zeros=True)
    return mt.astype(t.dtype), ms.astype(s.dtype), mw.astype(w.dtype)


@dataclass
class DirectionEdges:
    """Edges from every writer node into ad-hoc readers (see :func:`attribute_directions`).

    ``reader[e]`` indexes the directions, ``writer[e]`` indexes ``writer_ids`` (node ids as
    attributed: before ``max_feature_nodes`` folding), ``weight[e]`` is the edge; ``constants[i]``
    splits reader ``i``'s constant by origin: ``{location: value}`` with ``-1`` for its own constant.
    """

    reader: np.ndarray
    writer: np.ndarray
    writer_ids: list
    weight: np.ndarray
    constants: list[dict[int, float]]


@torch.no_grad()
def attribute_directions(
    col: Collected,
    location: int,
    positions: Sequence[int],
    directions: torch.Tensor,
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
    for i, (t, g, c) in enumerate(zip(positions, directions, own_constants)):
        table.add(i, int(location), int(t), g, float(c))
    n = len(table.rows)
    parts: dict[int, dict[int, float]] = {}
    edges = compute_edges(replace(col, readers=table), batch_size=batch_size, constant_parts=parts)
    constants = [parts.get(i, {-1: float(own_constants[i])}) for i in range(n)]
    rows, writer = np.unique(edges.source, return_inverse=True)
    return DirectionEdges(edges.target.astype(np.int64), writer.astype(np.int64).reshape(-1),
                          [col.nodes[r].id for r in rows.tolist()], edges.weight, constants)
