"""Long prompts: what grows with the prompt is not held all at once (issue 12, item 3).

* attention patterns above a size are kept in a temporary file and read per layer
  (:class:`~circuitgraph.attribution.linearisation.OffloadedPatterns`): same edges, same frozen model;
* a transcoder feature's writer vector (activation x decoder row) and reader direction (encoder
  row through the frozen norm) are made when a sweep needs them, from tables shared by all
  positions: the engine holds no ``(features, d_model)`` table;
* with ``max_feature_nodes`` the computed rows stay in per-location parts that are ranked and
  folded one by one: the same selection and folded edges as one global fold.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import build as build_mod
from circuitgraph.attribution import engine as engine_mod
from circuitgraph.attribution import frozen_model as fm_mod
from circuitgraph.attribution import linearisation as lin_mod
from circuitgraph.attribution.dense_rows import DenseRows
from circuitgraph.attribution.engine import EdgeResult
from circuitgraph.attribution.feature_selection import fold_unselected, parts_influence, select_and_compute
from circuitgraph.attribution.linearisation import OffloadedPatterns, frozen, linearise
from circuitgraph.attribution.nodes_builder import GraphOptions, collect_nodes
from circuitgraph.attribution.targets import top_logit_targets
from circuitgraph.graph.nodes import REMAINDER_INDEX, NodeId
from circuitgraph.testing.synthetic import tiny_model
from tests.helpers.graphs import stub_transcoders

TOKENS = [1, 5, 7, 2, 9, 3, 11, 4, 8, 6, 10, 12, 13, 14]


def _inputs(seed: int = 3):
    model = tiny_model(seed=seed, n_layers=3, n_ctx=len(TOKENS))
    tcs = stub_transcoders(model, TOKENS, d_sae=48, active_frac=0.3)
    return ModelAdapter(model), tcs


def _graph(adapter, tcs, **opts):
    return build_mod.attribute(adapter, TOKENS, tcs, **opts)


def _edges(g) -> dict[tuple[str, str], float]:
    ids = [n.id for n in g.nodes]
    return {(str(ids[t]), str(ids[s])): float(w) for t, s, w in zip(g.edge_target, g.edge_source, g.edge_weight, strict=False)}


def _assert_same_edges(a, b, rtol=1e-6):
    ea, eb = _edges(a), _edges(b)
    assert ea.keys() == eb.keys()
    scale = max(abs(v) for v in ea.values())
    assert max(abs(ea[k] - eb[k]) for k in ea) <= rtol * scale


def test_offloaded_patterns_give_the_same_graph(monkeypatch):
    adapter, tcs = _inputs()
    in_memory = _graph(adapter, tcs)
    assert not isinstance(in_memory.context.linearisation.patterns, OffloadedPatterns)
    monkeypatch.setattr(lin_mod, "OFFLOAD_PATTERNS_BYTES", 0)
    offloaded = _graph(adapter, tcs)
    lin = offloaded.context.linearisation
    assert isinstance(lin.patterns, OffloadedPatterns) and len(lin.patterns) == 3
    ref = in_memory.context.linearisation.patterns
    for layer in range(3):
        assert torch.equal(lin.patterns[layer], ref[layer])
        assert torch.equal(lin.patterns.block(layer, 5), ref[layer][:, :5, :5])
    _assert_same_edges(in_memory, offloaded, rtol=0)
    assert offloaded.check_completeness().max_violation < 1e-5
    # the real model frozen on offloaded patterns computes what it computed on the originals
    toks = torch.tensor([TOKENS])
    with frozen(adapter, in_memory.context.linearisation) as m:
        a = m(toks)
    with frozen(adapter, lin) as m:
        b = m(toks)
    assert torch.equal(a, b)


@pytest.mark.parametrize("attention", ["frozen", {0: "heads", 1: "frozen", 2: "frozen"}])
def test_causal_blocks_give_the_same_graph(monkeypatch, attention):
    """Past CAUSAL_BLOCK positions the frozen pattern is applied block by block, skipping the
    destinations before each block (exact zeros): the same edges as one product, and exact."""
    adapter, tcs = _inputs()
    one_block = _graph(adapter, tcs, dtype=torch.float64, attention=attention)
    calls = []
    real_bmm = torch.bmm

    def counting_bmm(*args, **kwargs):
        calls.append(args[0].shape)
        return real_bmm(*args, **kwargs)

    monkeypatch.setattr(fm_mod, "CAUSAL_BLOCK", 3)  # 14 positions: 5 blocks, the last one short
    monkeypatch.setattr(fm_mod.torch, "bmm", counting_bmm)
    blocked = _graph(adapter, tcs, dtype=torch.float64, attention=attention)
    monkeypatch.undo()
    # the blocks were used: sources s0..s0+2 against destinations s0.. only
    assert any(shape[1] == 3 and shape[2] < len(TOKENS) for shape in calls)
    _assert_same_edges(one_block, blocked, rtol=1e-12)
    assert blocked.check_completeness().max_violation < 1e-10


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_writer_vectors_made_per_chunk_give_the_same_graph(monkeypatch, dtype):
    """Long prompts do not hold the writer vectors: each chunk of position groups gathers its
    decoder rows into a reused buffer and the activations scale the edge block. Same edges as the
    held vectors of short prompts, with chunks of one or a few position groups."""
    adapter, tcs = _inputs()
    held = _graph(adapter, tcs, dtype=dtype)
    gathers = []
    real = engine_mod.torch.index_select

    def counting(*args, **kwargs):
        gathers.append((args[0].shape, args[0].dtype))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "HELD_WRITERS_BYTES", 0)
    monkeypatch.setattr(engine_mod, "WRITER_CHUNK_BYTES", 1)  # one position group per chunk
    monkeypatch.setattr(engine_mod.torch, "index_select", counting)
    per_chunk = _graph(adapter, tcs, dtype=dtype)
    monkeypatch.undo()
    d_model = adapter.facts.d_model
    # basis rows (d_model wide, in the graph dtype) were gathered
    assert any(len(shape) == 2 and shape[1] == d_model and dt == dtype for shape, dt in gathers)
    _assert_same_edges(held, per_chunk, rtol=1e-12 if dtype == torch.float64 else 1e-6)
    assert per_chunk.check_completeness().max_violation < (1e-10 if dtype == torch.float64 else 1e-5)


def _collected(dtype=torch.float64):
    model = tiny_model(seed=1, n_layers=3, n_ctx=len(TOKENS))
    tcs = stub_transcoders(model, TOKENS, d_sae=48, active_frac=0.3)
    adapter = ModelAdapter(model.to(dtype))
    lin = linearise(adapter, torch.tensor(TOKENS), tcs)
    targets = top_logit_targets(lin.logits, position=len(TOKENS) - 1, max_n=3, cumulative_probability=0.95)
    options = GraphOptions(mlp={l: "transcoders" for l in range(3)}, attention={l: "frozen" for l in range(3)},
                           dtype=dtype)
    return collect_nodes(adapter, lin, tcs, targets, options), tcs


def test_feature_vectors_are_made_from_shared_tables():
    col, tcs = _collected()
    features = [n for n in col.nodes if n.kind == "feature"]
    n_positions = len({n.position for n in features})
    for layer in range(3):
        block = col.writers.blocks[2 * layer + 2]
        # one basis row per active decoder row and per other writer, not one vector per feature node
        n_feat = sum(1 for n in features if n.layer == layer)
        assert block.basis.shape[0] <= tcs[0].d_sae + n_positions < n_feat + n_positions
    # no feature reader holds a direction: they are made per sweep
    held = [i for i, r in enumerate(col.readers.rows) if col.nodes[r].kind == "feature"
            and col.readers._dir_source[i] < 0]  # -1: a held tensor
    assert not held and len(features) > 100

    adapter, tcs = _inputs()
    g = _graph(adapter, tcs)
    ctx = g.context
    features = [n for n in g.nodes if n.kind == "feature"]
    # what they make is the feature's activation x decoder row, and its encoder row through ln2
    lin = ctx.linearisation
    for node in features[:: max(1, len(features) // 25)]:
        (w,) = ctx.writes(node.id)
        dec = tcs.decoder_rows(node.layer, torch.tensor([node.index]))[0, 0]
        torch.testing.assert_close(w.vector, (node.activation * dec).to(w.vector.dtype), rtol=1e-5, atol=1e-6)
        r = ctx.reader(node.id)
        x = lin.tc_input[node.layer][node.position]
        # pre = direction . resid_mid + own constant, with ln2's sigma frozen
        resid = lin.resid_mid[node.layer][node.position].to(r.direction.dtype)
        assert float(r.direction @ resid + r.own_constant) == pytest.approx(node.pre_activation, rel=1e-4, abs=1e-5)
        assert float(tcs[node.layer].encoder_rows(torch.tensor([node.index]))[0] @ x.to(torch.float64)
                     + tcs[node.layer].b_enc[node.index]) == pytest.approx(node.pre_activation, rel=1e-4, abs=1e-5)


def _part_edges(p, slot_rows):
    """A part's (target, source, weight) arrays, squeezed edges or dense blocks alike (zeros dropped)."""
    if not isinstance(p, DenseRows):
        return p.target, p.source, p.weight
    t, s, w = [], [], []
    for loc, lo, hi, j, v in p.blocks:
        wi, ri = np.nonzero(v)
        t.append(p.reader_rows[j][ri]), s.append(slot_rows[loc][lo:hi][wi]), w.append(v[wi, ri])
    return np.concatenate(t), np.concatenate(s), np.concatenate(w)


def _part_rows(p):
    return p.rows() if isinstance(p, DenseRows) else np.unique(p.target)


def _global_fold(col, rows, selected):
    """The reference: every computed edge at once, one global sort of (target, new source)."""
    parts = [_part_edges(p, rows.slot_rows) for _, p in rows.parts]
    t, s, w = (np.concatenate(x) for x in zip(*parts, strict=False))
    nodes, rd = col.nodes, col.readers
    keep = {rd.rows[i] for i in selected}
    dropped = [r for r in rd.rows if nodes[r].kind == "feature" and r not in keep]
    kept = [r for r in range(len(nodes)) if r not in set(dropped)]
    rem = sorted({(nodes[r].layer, nodes[r].position) for r in dropped})
    new_ids = [nodes[r].id for r in kept] + [NodeId("remainder", l, p, REMAINDER_INDEX["features"]) for l, p in rem]
    src = {r: i for i, r in enumerate(kept)}
    src.update({r: len(kept) + rem.index((nodes[r].layer, nodes[r].position)) for r in dropped})
    out: dict[tuple[NodeId, NodeId], float] = {}
    for a, b, c in zip(t.tolist(), s.tolist(), w.tolist(), strict=False):
        key = (new_ids[src[a]], new_ids[src[b]])
        out[key] = out.get(key, 0.0) + c
    return {k: v for k, v in out.items() if v != 0}


@pytest.mark.parametrize("dense", [True, False])
def test_max_feature_nodes_parts_fold_like_one_global_fold(dense):
    col, _ = _collected()
    rows, selected = select_and_compute(col, 20, batch_size=8, dense=dense)
    assert any(isinstance(p, DenseRows) for _, p in rows.parts) == dense
    # every part holds the rows of one residual location, each reader row in one part only
    seen = set()
    for loc, p in rows.parts:
        locs = {col.readers.locs[col.readers.rows.index(r)] for r in _part_rows(p).tolist()}
        assert locs == {loc}
        assert not seen & set(_part_rows(p).tolist())
        seen |= set(_part_rows(p).tolist())
    ref = _global_fold(col, rows, selected)
    nodes, edges, _ = fold_unselected(col, rows, selected)
    ids = [n.id for n in nodes]
    got = {(ids[t], ids[s]): float(w) for t, s, w in zip(edges.target, edges.source, edges.weight, strict=False)}
    assert got.keys() == ref.keys()
    assert max(abs(got[k] - ref[k]) for k in ref) <= 1e-12 * max(abs(v) for v in ref.values())
    assert rows.parts == []  # released while folding


def test_parts_influence_is_the_power_series_over_the_rows():
    from circuitgraph.attribution.feature_selection import RowParts

    rng = np.random.default_rng(0)
    # a small layered graph: level k nodes read from levels < k
    n, level = 12, np.repeat(np.arange(4), 3)
    rows = RowParts(n)
    t, s, w = [], [], []
    for lvl in (3, 2, 1):
        tt, ss = np.meshgrid(np.flatnonzero(level == lvl), np.flatnonzero(level < lvl), indexing="ij")
        keep = rng.random(tt.size) < 0.7
        part = EdgeResult(tt.ravel()[keep].astype(np.int32), ss.ravel()[keep].astype(np.int32),
                          rng.normal(size=int(keep.sum())).astype(np.float32), {})
        rows.add(int(lvl), part)
        t.append(part.target), s.append(part.source), w.append(part.weight)
    t, s, w = np.concatenate(t), np.concatenate(s), np.concatenate(w).astype(np.float64)
    start = np.zeros(n)
    start[9:] = [0.5, 0.3, 0.2]
    A = np.zeros((n, n))
    A[t, s] = np.abs(w)
    A /= np.maximum(A.sum(1, keepdims=True), 1e-8)
    ref, x = np.zeros(n), start.copy()
    for _ in range(n):
        x = A.T @ x
        ref += x
    np.testing.assert_allclose(parts_influence(rows, start), ref, rtol=1e-6, atol=1e-12)


def test_computed_rows_past_the_memory_budget_go_to_files(monkeypatch):
    """max_feature_nodes' computed rows beyond ROWS_IN_MEMORY_BYTES are written to temporary files
    and read back part by part: the same graph as with every row in memory."""
    from circuitgraph.attribution import feature_selection

    adapter, tcs = _inputs()
    in_memory = _graph(adapter, tcs, max_feature_nodes=25, batch_size=8)
    monkeypatch.setattr(feature_selection, "ROWS_IN_MEMORY_BYTES", 0)
    # the parts here are kilobytes: the 1 GB disk reserve is for real runs, and CI's /tmp may be small
    monkeypatch.setattr(feature_selection, "DISK_RESERVE_BYTES", 0)
    col, _ = _collected(torch.float32)
    rows, _ = select_and_compute(col, 25, batch_size=8)
    assert rows.bytes_in_memory == 0 and all(isinstance(p, feature_selection._SpilledPart)
                                             for _, p in rows.parts if rows.n_edges)
    spilled = _graph(adapter, tcs, max_feature_nodes=25, batch_size=8)
    _assert_same_edges(in_memory, spilled, rtol=0)
    assert spilled.check_completeness().max_violation < 1e-5


def test_engine_row_abs_sums_equal_the_sums_over_the_stored_edges(monkeypatch):
    """The engine sums each row's absolute weights as it makes them (the ranking's row
    normalisation): equal to summing the stored edges, held vectors or per-chunk gathers."""
    from circuitgraph.attribution.engine import compute_edges

    col, _ = _collected()
    for held in (True, False):
        if not held:
            monkeypatch.setattr(engine_mod, "HELD_WRITERS_BYTES", 0)
            monkeypatch.setattr(engine_mod, "WRITER_CHUNK_BYTES", 1)
        res = compute_edges(col, batch_size=7)
        expected = np.bincount(res.target, weights=np.abs(res.weight), minlength=len(col.nodes))
        assert res.abs_sums is not None and set(res.abs_sums) == set(res.constants)
        got = np.zeros(len(col.nodes))
        for row, v in res.abs_sums.items():
            got[row] = v
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
        assert expected.max() > 0


def test_dense_rows_select_and_fold_like_squeezed_edges():
    """max_feature_nodes' rows kept as the engine's dense blocks rank, select and fold exactly as
    the squeezed (target, source, weight) rows do; the dense blocks hold the values only."""
    col, _ = _collected()
    dense_rows, dense_sel = select_and_compute(col, 20, batch_size=8, dense=True)
    sparse_rows, sparse_sel = select_and_compute(col, 20, batch_size=8, dense=False)
    assert dense_sel == sparse_sel
    np.testing.assert_allclose(dense_rows.abs_sums, sparse_rows.abs_sums, rtol=1e-12, atol=0)
    n_dense = sum(p.n_entries for _, p in dense_rows.parts)
    item = next(v for _, p in dense_rows.parts for *_, v in p.blocks).itemsize
    assert sum(v.nbytes for _, p in dense_rows.parts for *_, v in p.blocks) == item * n_dense  # no indices
    # the dense blocks hold every edge and a few structural zeros
    assert sparse_rows.n_edges <= n_dense <= 1.5 * sparse_rows.n_edges
    a = fold_unselected(col, dense_rows, dense_sel)
    b = fold_unselected(col, sparse_rows, sparse_sel)
    assert [n.id for n in a[0]] == [n.id for n in b[0]]
    got = {(int(t), int(s)): float(w) for t, s, w in zip(a[1].target, a[1].source, a[1].weight, strict=False)}
    ref = {(int(t), int(s)): float(w) for t, s, w in zip(b[1].target, b[1].source, b[1].weight, strict=False)}
    assert got.keys() == ref.keys()
    assert max(abs(got[k] - ref[k]) for k in ref) <= 1e-12 * max(abs(v) for v in ref.values())
    assert a[1].constants.keys() == b[1].constants.keys()
    for k, v in b[1].constants.items():  # batches differ (dense mode bands positions tighter): rounding only
        assert a[1].constants[k] == pytest.approx(v, rel=1e-12, abs=1e-12)


def test_folded_graph_adopts_its_sums_and_order():
    """After max_feature_nodes folding the graph takes the fold's per-row sums and top-down
    location segments (no pass over the edges): equal to a pass over the stored arrays."""
    from circuitgraph.graph import dag as dagmod

    adapter, tcs = _inputs()
    g = _graph(adapter, tcs, max_feature_nodes=25, batch_size=8)
    assert g.derived("dag") is not None
    ref_abs = np.bincount(g.edge_target, weights=np.abs(g.edge_weight.astype(np.float64)), minlength=g.n_nodes)
    ref_sum = np.bincount(g.edge_target, weights=g.edge_weight.astype(np.float64), minlength=g.n_nodes)
    np.testing.assert_allclose(g.incoming_abs_sums(), ref_abs, rtol=1e-12, atol=0)
    np.testing.assert_allclose(g.incoming_sums(), ref_sum, rtol=1e-12, atol=1e-12 * ref_abs.max())
    adopted = g.derived("dag").dag
    derived = dagmod.dag_order(g.n_nodes, g.edge_target, g.edge_source, g.edge_weight, dagmod.graph_levels(g))
    np.testing.assert_array_equal(adopted.level, derived.level)
    assert adopted.segments == derived.segments and derived.order is None
    assert g.check_completeness().max_violation < 1e-5


def test_selection_makes_each_blocks_vectors_once_and_releases_them(monkeypatch):
    """Short prompts: the writer vectors are made once per block for all the engine calls of a
    ``max_feature_nodes`` selection (they were gathered again per call), and dropped when it
    ends; a plain engine call drops them when it returns. The rows are those of a selection
    that makes them per chunk."""
    from circuitgraph.attribution import nodes_builder as nb

    col, _ = _collected(torch.float32)
    made: list[int] = []
    real = nb.WriterBlock.slot_vectors

    def counting(self, table, lo, hi):
        made.append(id(self))
        return real(self, table, lo, hi)

    monkeypatch.setattr(nb.WriterBlock, "slot_vectors", counting)
    n_features = sum(n.kind == "feature" for n in col.nodes)
    rows, selected = select_and_compute(col, n_features // 3, batch_size=4, update_interval=1)
    assert len(rows.parts) > len(col.writers.blocks)  # many engine calls
    assert sorted(made) == sorted(id(b) for b in col.writers.blocks.values())  # each block once
    assert all(b._held is None for b in col.writers.blocks.values())
    engine_mod.compute_edges(col, batch_size=4)
    assert all(b._held is None for b in col.writers.blocks.values())
    monkeypatch.setattr(engine_mod, "HELD_WRITERS_BYTES", 0)  # vectors made per chunk instead
    rows2, selected2 = select_and_compute(col, n_features // 3, batch_size=4, update_interval=1)
    assert selected2 == selected
    for (l1, p1), (l2, p2) in zip(rows.edges(), rows2.edges(), strict=False):
        assert l1 == l2
        for b1, b2 in zip(p1.blocks, p2.blocks, strict=False):
            assert b1[:4] == b2[:4]
            np.testing.assert_allclose(b1[4], b2[4], rtol=1e-5, atol=1e-6)
