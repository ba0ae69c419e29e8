"""The engine's parts: the batch planner (pure functions of the reader table), the slot tables
kept with their writer block, and the two entry points (squeezed edges, dense rows), which must
give the same edges.  The edges themselves are checked against the libraries' own removals in
tests/test_edges_independent.py and against circuit-tracer in tests/test_circuit_tracer*.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from circuitgraph.attribution.engine import (
    BatchSpan,
    DenseRows,
    EdgeResult,
    SweepPlan,
    batch_spans,
    compute_dense_rows,
    compute_edges,
    dense_rows_supported,
    group_waves,
    plan_sweep,
    sort_readers,
    split_batches,
)
from circuitgraph.attribution.linearisation import linearise
from circuitgraph.attribution.nodes_builder import GraphOptions, ReaderTable, collect_nodes
from circuitgraph.attribution.targets import top_logit_targets
from circuitgraph.errors import AttributionError
from tests.helpers.bundles import load_bundle, make_bundle


def _table(locs_positions: list[tuple[int, int]]) -> ReaderTable:
    table = ReaderTable()
    for i, (loc, pos) in enumerate(locs_positions):
        table.add(100 + i, loc, pos, torch.zeros(4), 0.0)
    return table


def test_location_by_row_is_made_once_and_follows_the_table():
    """node row -> reader location, kept between calls (split_by_location asks it per engine call)
    and made again when readers are added."""
    table = _table([(1, 5), (3, 2)])
    first = table.location_by_row()
    assert first == {100: 1, 101: 3} and table.location_by_row() is first
    table.add(102, 7, 0, torch.zeros(4), 0.0)
    assert table.location_by_row() == {100: 1, 101: 3, 102: 7}


# ----------------------------------------------------------------------------- the planner
def test_readers_sorted_top_down_then_by_position():
    table = _table([(1, 5), (3, 2), (1, 0), (3, 7), (3, 2)])
    assert sort_readers(table) == [1, 4, 3, 2, 0]
    assert sort_readers(table, [0, 2]) == [2, 0]


def test_batches_end_at_a_new_location_at_batch_size_and_at_a_wide_position_band():
    table = _table([(5, 0)] * 3 + [(3, t) for t in range(10)])
    order = sort_readers(table)
    # location 5 alone; then batch_size 4 cuts location 3's readers into runs of 4
    assert split_batches(table, order, 4, spread=100.0) == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9, 10], [11, 12]]
    # a batch of >= batch_size // 4 readers ends before a reader whose position + 1 is more than
    # spread times the batch's first one's: positions 0-1 (2 + 1 > 2 * 1), 2-5 (6 + 1 > 2 * 3), 6-9
    assert split_batches(table, order, 8, spread=2.0) == [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert split_batches(table, [], 8, spread=2.0) == []


def test_spans_causal_and_bidirectional():
    table = _table([(3, 2), (3, 6), (1, 4)])
    batches = [[0, 1], [2]]
    assert [(s.n_positions, s.location) for s in batch_spans(table, batches, causal=True, n_pos=9)] == [(7, 3), (5, 1)]
    # bidirectional attention: every reader sees writers at every position
    assert [s.n_positions for s in batch_spans(table, batches, causal=False, n_pos=9)] == [9, 9]


def test_waves_group_one_location_within_the_byte_limit():
    table = _table([(3, 0)] * 6 + [(1, 0)] * 2)
    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    spans = batch_spans(table, batches, causal=True, n_pos=1)
    assert group_waves(batches, spans, row_bytes=10, wave_bytes=40) == [[0, 1], [2], [3]]
    assert group_waves(batches, spans, row_bytes=10, wave_bytes=10) == [[0], [1], [2], [3]]  # at least one
    plan = plan_sweep(table, batch_size=2, n_pos=1, row_bytes=10)
    assert isinstance(plan, SweepPlan) and plan.batches == batches and plan.waves == [[0, 1, 2], [3]]


# ----------------------------------------------------------------------------- the entry points
def test_mixed_waves_group_consecutive_batches_of_any_location():
    spans = [BatchSpan(4, 5), BatchSpan(4, 5), BatchSpan(4, 3), BatchSpan(4, 1)]
    batches = [[0, 1], [2], [3, 4], [5]]
    assert group_waves(batches, spans, row_bytes=1, wave_bytes=100) == [[0, 1], [2], [3]]
    assert group_waves(batches, spans, row_bytes=1, wave_bytes=100, mixed=True) == [[0, 1, 2, 3]]
    assert group_waves(batches, spans, row_bytes=1, wave_bytes=12, mixed=True) == [[0, 1], [2, 3]]


def _collected(tmp_path, variant: str = "ln-gelu-learned", **options):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant))
    lin = linearise(adapter, torch.tensor(tokens), tcs)
    targets = top_logit_targets(lin.logits, position=len(tokens) - 1, max_n=3, cumulative_probability=0.95)
    L = adapter.facts.n_layers
    opts = GraphOptions(mlp={l: "transcoders" for l in range(L)}, attention={l: "frozen" for l in range(L)}, **options)
    return collect_nodes(adapter, lin, tcs, targets, opts)


def _dense_edges(rows: DenseRows, col) -> dict[tuple[int, int], float]:
    slot_rows = {loc: block.slots()[2].numpy() for loc, block in col.writers.blocks.items()}
    out: dict[tuple[int, int], float] = {}
    for loc, lo, _hi, j, values in rows.blocks:
        for w, r in zip(*np.nonzero(values), strict=False):
            key = (int(rows.reader_rows[j][r]), int(slot_rows[loc][lo + w]))
            assert key not in out
            out[key] = float(values[w, r])
    return out


@pytest.mark.parametrize("variant", ["ln-gelu-learned", "none-relu-bidirectional"])
def test_dense_rows_hold_the_same_edges_as_compute_edges(tmp_path, variant):
    col = _collected(tmp_path, variant)
    subset = list(range(0, len(col.readers.rows), 2))
    sparse = compute_edges(col, batch_size=3, reader_subset=subset)
    dense = compute_dense_rows(col, batch_size=3, reader_subset=subset)
    assert isinstance(sparse, EdgeResult) and isinstance(dense, DenseRows)
    got = _dense_edges(dense, col)
    expected = {(int(t), int(s)): float(w) for t, s, w in zip(sparse.target, sparse.source, sparse.weight, strict=False)}
    assert len(expected) == len(sparse.target) > 0 and set(got) == set(expected)
    scale = max(abs(w) for w in expected.values())
    assert max(abs(got[k] - expected[k]) for k in expected) <= 1e-6 * scale
    assert set(dense.constants) == set(sparse.constants) == {col.readers.rows[i] for i in subset}
    for row in sparse.constants:
        assert dense.constants[row] == pytest.approx(sparse.constants[row], rel=1e-6, abs=1e-6)
        assert dense.sums[row] == pytest.approx(sparse.sums[row], rel=1e-5, abs=1e-6)
        assert dense.abs_sums[row] == pytest.approx(sparse.abs_sums[row], rel=1e-5, abs=1e-6)


def test_dense_rows_mix_locations_in_a_wave_and_stack_small_batches(tmp_path, monkeypatch):
    """compute_dense_rows sends readers of several locations down in one wave (each batch joins
    at its own location) and meets small batches with one GEMM per position (stacked): the
    same edges as per-location squeezed calls; split_by_location gives each location its own
    readers' blocks, constants and sums."""
    from circuitgraph.attribution import engine

    col = _collected(tmp_path)
    calls = {"stacked": 0, "mixed_waves": 0}
    real_stacked, real_sweep = engine._write_stacked, engine._sweep

    def stacked(*args, **kwargs):
        calls["stacked"] += 1
        return real_stacked(*args, **kwargs)

    def sweep(col_, plan, *args, **kwargs):
        calls["mixed_waves"] += sum(len({plan.spans[j].location for j in w}) > 1 for w in plan.waves)
        return real_sweep(col_, plan, *args, **kwargs)

    monkeypatch.setattr(engine, "_write_stacked", stacked)
    monkeypatch.setattr(engine, "_sweep", sweep)
    subset = list(range(len(col.readers.rows)))
    dense = compute_dense_rows(col, batch_size=2, reader_subset=subset)
    assert calls["stacked"] > 0 and calls["mixed_waves"] > 0
    sparse = compute_edges(col, batch_size=2, reader_subset=subset)
    expected = {(int(t), int(s)): float(w) for t, s, w in zip(sparse.target, sparse.source, sparse.weight, strict=False)}
    got = _dense_edges(dense, col)
    assert set(got) == set(expected)
    scale = max(abs(w) for w in expected.values())
    assert max(abs(got[k] - expected[k]) for k in expected) <= 1e-6 * scale
    parts = engine.split_by_location(col, dense)
    loc_of = dict(zip(col.readers.rows, col.readers.locs, strict=False))
    assert [loc for loc, _ in parts] == sorted({loc_of[r] for r in dense.constants}, reverse=True)
    merged: dict[tuple[int, int], float] = {}
    for loc, part in parts:
        rows = {int(r) for r in part.rows()}
        assert {loc_of[r] for r in rows} == {loc}
        assert set(part.constants) == set(part.sums) == set(part.abs_sums) == rows
        edges = _dense_edges(part, col)
        assert not set(edges) & set(merged)
        merged.update(edges)
    assert merged == got


def test_row_sums_and_segments_describe_the_edges(tmp_path):
    col = _collected(tmp_path)
    edges = compute_edges(col, batch_size=4)
    sums = np.zeros(len(col.nodes))
    abs_sums = np.zeros(len(col.nodes))
    np.add.at(sums, edges.target, edges.weight.astype(np.float64))
    np.add.at(abs_sums, edges.target, np.abs(edges.weight).astype(np.float64))
    for row in edges.constants:
        assert edges.sums[row] == pytest.approx(sums[row], rel=1e-5, abs=1e-6)
        assert edges.abs_sums[row] == pytest.approx(abs_sums[row], rel=1e-5, abs=1e-6)
    # the segments cover the edges in order, highest reader location first, each range's
    # targets reading that location
    loc_of = dict(zip(col.readers.rows, col.readers.locs, strict=False))
    assert edges.segments[0][1] == 0 and edges.segments[-1][2] == len(edges.target)
    assert [s[0] for s in edges.segments] == sorted({s[0] for s in edges.segments}, reverse=True)
    for loc, start, end in edges.segments:
        assert {loc_of[int(t)] for t in edges.target[start:end]} <= {loc}


def test_slot_tables_are_made_once_and_calls_repeat_exactly(tmp_path):
    col = _collected(tmp_path)
    block = next(iter(col.writers.blocks.values()))
    first = compute_edges(col, batch_size=5)
    table = block.slot_table(col.frozen.device)
    assert block.slot_table(col.frozen.device) is table
    group, writer, node_rows = block.slots()
    assert torch.equal(table.basis_index, block.index[group, writer]) and torch.equal(table.scale, block.scale[group, writer])
    assert torch.equal(table.node_rows, node_rows.to(torch.int32))
    assert table.group_starts[-1] == len(node_rows)
    again = compute_edges(col, batch_size=5)
    for name in ("target", "source", "weight"):
        assert np.array_equal(getattr(first, name), getattr(again, name))
    assert first.constants == again.constants and first.sums == again.sums


def test_cross_layer_writers_refuse_dense_rows(tmp_path):
    col = _collected(tmp_path)
    with pytest.raises(TypeError):
        compute_edges(col, batch_size=4, dense=True)  # one return type: dense rows have their own entry point
    clt_like = replace(col, multi_location_writers=True)
    assert not dense_rows_supported(clt_like)
    with pytest.raises(AttributionError, match="use compute_edges"):
        compute_dense_rows(clt_like)
