"""Computed rows kept densely: one ``(writers, readers)`` block per engine chunk, no indices.

With ``max_feature_nodes`` on long prompts the rows of the ranked features are each as wide as
the writers they can see (a 2,048-token prompt: ~10^6 writers per row), and they are kept until
the selection ends (every ranking round reads them again, then they are folded).  As squeezed
``(target, source, weight)`` arrays that is 12 bytes per edge; as the engine's own blocks --
the writers of one location chunk (their slots in that location's writer table, a contiguous
range) against the readers of one batch -- it is 4 bytes per entry, the readers' rows and the
slot range being stored once per block.  The blocks also keep the (few) structural zeros of
readers placed before some of the block's writers; they add nothing to an influence and are
dropped when a block is folded into edges.

* :func:`dense_influence`: one ranking round's back-substitution step over a part,
  ``acc[slot] += |V| @ (z / divisor)[readers]`` per block (a matrix-vector product);
* :func:`fold_dense`: a part's edges after the unselected features are summed into their
  (layer, position) remainder: per block the columns are summed by their new source, exact
  zeros dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # shapes for readers and the type checker (docs/architecture.md, "Tooling"); not checked at run time
    from jaxtyping import Float, Int

__all__ = ["DenseRows", "writer_slot_rows", "dense_influence", "fold_dense"]


@dataclass
class DenseRows:
    """The rows of one engine call, as blocks.

    ``reader_rows[j]``: node rows of batch ``j``'s readers (``B_j``); ``blocks``: ``(location,
    lo, hi, j, values)`` with ``values (hi - lo, B_j)`` float: the edges from the writers in slots
    ``lo..hi-1`` of ``location``'s writer table (see :func:`writer_slot_rows`) into batch ``j``'s
    readers; ``constants`` / ``abs_sums`` / ``sums``: per reader row, as in
    :class:`~circuitgraph.attribution.engine.EdgeResult`."""

    reader_rows: list[Int[np.ndarray, " readers"]]
    blocks: list[tuple[int, int, int, int, Float[np.ndarray, "writers readers"]]]
    constants: dict[int, float]
    abs_sums: dict[int, float]
    sums: dict[int, float] = field(default_factory=dict)

    @property
    def n_entries(self) -> int:
        return sum(int(v.size) for *_, v in self.blocks)

    @property
    def nbytes(self) -> int:
        return sum(int(v.nbytes) for *_, v in self.blocks) + sum(int(r.nbytes) for r in self.reader_rows)

    def rows(self) -> np.ndarray:
        return np.concatenate(self.reader_rows) if self.reader_rows else np.zeros(0, dtype=np.int64)


def writer_slot_rows(col) -> dict[int, np.ndarray]:  # Collected
    """Per writer location: the node row of each slot, in the engine's slot order (the real
    ``(group, writer)`` entries of the padded writer block, row-major)."""
    return {loc: block.slots()[2].cpu().numpy().astype(np.int64) for loc, block in col.writers.blocks.items()}


def dense_influence(part: DenseRows, slot_rows: dict[int, Int[np.ndarray, " slots"]], factor: Float[np.ndarray, " nodes"],
                    acc: Float[np.ndarray, " nodes"]) -> None:
    """``acc[s] += sum_r factor[r] |E[r, s]|`` over the part's blocks (``factor = z / divisor``,
    final for the part's readers)."""
    for loc, lo, hi, j, values in part.blocks:
        f = factor[part.reader_rows[j]]
        if not f.any():
            continue
        acc[slot_rows[loc][lo:hi]] += np.abs(values, dtype=np.float64) @ f  # one pass: |.| and the cast


def fold_dense(part: DenseRows, slot_rows: dict[int, Int[np.ndarray, " slots"]], tgt_map: Int[np.ndarray, " nodes"],
               src_map: Int[np.ndarray, " nodes"]) -> tuple[Int[np.ndarray, " edges"], Int[np.ndarray, " edges"],
                                                            Float[np.ndarray, " edges"]]:
    """The part's edges renumbered by ``tgt_map`` / ``src_map`` (several writers mapped to one new
    source are summed), exact zeros dropped: ``(target, source, weight)``."""
    ts, ss, ws = [], [], []
    for loc, lo, hi, j, values in part.blocks:
        new_src = src_map[slot_rows[loc][lo:hi]]
        uniq, inv, counts = np.unique(new_src, return_inverse=True, return_counts=True)
        order = np.argsort(inv, kind="stable")  # the columns grouped by their new source
        if uniq.size < new_src.size:  # columns summed by their new source
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            summed = np.add.reduceat(values[order].astype(np.float64), starts, axis=0).astype(values.dtype)
        else:
            summed = values[order]
        w_idx, r_idx = np.nonzero(summed)
        tgt = tgt_map[part.reader_rows[j]]
        ts.append(tgt[r_idx])
        ss.append(uniq[w_idx])
        ws.append(summed[w_idx, r_idx])
    if not ts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    return np.concatenate(ts), np.concatenate(ss), np.concatenate(ws)
