"""Back-substitution over the graph's levels (circuitgraph.graph.dag): equal to dense
references (matrix inverses) whatever the node and edge order, one read of each edge per
sweep, the engine's edge order used as is, cycles reported, and max_feature_nodes' partial
influence equal to its power-series definition."""

from __future__ import annotations

import numpy as np
import pytest

from circuitgraph.errors import QueryError
from circuitgraph.graph import dag as dagmod
from circuitgraph.graph.dag import dag_order, graph_dag, sweep
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.queries import compute_scores, node_influence, prune_graph, total_effects
from tests.helpers.graphs import attributed, dense_influence, dense_total_effect, random_dag


def shuffled(g: AttributionGraph, seed: int) -> AttributionGraph:
    """The same graph with its node rows and its edges in random orders."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(g.n_nodes)  # new row i holds old row perm[i]
    new_row = np.empty_like(perm)
    new_row[perm] = np.arange(g.n_nodes)
    eorder = rng.permutation(g.n_edges)
    return AttributionGraph([g.nodes[i] for i in perm], new_row[g.edge_target[eorder]],
                            new_row[g.edge_source[eorder]], g.edge_weight[eorder], targets=list(g.targets))


def _by_id(g: AttributionGraph, values: np.ndarray) -> dict:
    return {n.id: v for n, v in zip(g.nodes, values, strict=False)}


@pytest.mark.parametrize("seed", range(4))
def test_any_node_and_edge_order_matches_dense_reference(seed):
    g = shuffled(random_dag(seed, n_layers=4, n_pos=4, n_targets=3), seed)
    assert graph_dag(g).dag.order is not None  # shuffled edges: one sort of the level keys
    np.testing.assert_allclose(node_influence(g), dense_influence(g), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(total_effects(g), dense_total_effect(g), rtol=1e-10, atol=1e-12)


def test_levels_from_a_topological_sort_when_identities_do_not_order_the_edges():
    """A hand-built graph whose layers say nothing about the order (all layer 0): the levels
    come from Kahn's algorithm, and the results are still exact."""
    g = random_dag(3, n_layers=3, n_pos=3)
    nodes = [Node(NodeId(n.kind, 0 if n.kind == "feature" else n.layer, n.position, i), n.activation,
                  pre_activation=n.pre_activation, constant=n.constant) for i, n in enumerate(g.nodes)]
    flat = AttributionGraph(nodes, g.edge_target, g.edge_source, g.edge_weight,
                            targets=[(nodes[g.index_of(t)].id, w) for t, w in g.targets])
    lv = graph_dag(flat).dag.level
    assert (lv[flat.edge_source] < lv[flat.edge_target]).all()
    np.testing.assert_allclose(node_influence(flat), dense_influence(flat), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(total_effects(flat), dense_total_effect(flat), rtol=1e-10, atol=1e-12)


def test_each_edge_is_read_once_per_sweep(monkeypatch):
    g = random_dag(1, n_layers=4, n_pos=5, n_targets=2)
    monkeypatch.setattr(dagmod, "CHUNK", 7)  # many chunks per level
    d = dag_order(g.n_nodes, g.edge_target, g.edge_source, g.edge_weight, dagmod.graph_levels(g))
    seen = np.concatenate([t * g.n_nodes + s for _, t, s, _ in d.chunks()])
    assert sorted(seen.tolist()) == sorted((g.edge_target.astype(np.int64) * g.n_nodes + g.edge_source).tolist())
    levels = [lvl for lvl, *_ in d.chunks()]
    assert levels == sorted(levels, reverse=True)  # top down, each level once
    w = np.zeros(g.n_nodes)
    w[g.index_of(g.target_ids[0])] = 1.0
    out = sweep(d, abs_start=w, row_divisor=np.maximum(g.incoming_abs_sums(), 1e-10))["abs"][:, 0]
    ref = dense_influence(AttributionGraph(g.nodes, g.edge_target, g.edge_source, g.edge_weight,
                                           targets=[(g.target_ids[0], 1.0)]))
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("granularity", ["neurons", "transcoders", "heads"])
def test_engine_graphs_are_visited_in_stored_order(granularity):
    """The engine writes edges top down by residual location: no permutation is needed, and the
    results equal the dense references."""
    g = attributed("ln-gelu", granularity)
    d = graph_dag(g).dag
    assert d.order is None and not d.reverse
    np.testing.assert_allclose(node_influence(g), dense_influence(g), rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(total_effects(g), dense_total_effect(g), rtol=1e-9, atol=1e-12)
    # the pruned graph (edges sorted by target row) is visited back to front or sorted once
    p = prune_graph(g, 0.9, 0.99).graph
    np.testing.assert_allclose(node_influence(p), dense_influence(p), rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("arch", ["ln-gelu", "rms-gated"])
@pytest.mark.parametrize("granularity", ["neurons", "transcoders", "heads"])
def test_engine_sums_and_order_equal_a_pass_over_the_stored_edges(arch, granularity):
    """The engine hands the graph its per-row sums and its location segments (no pass over the
    edges at build time); they must equal what a pass over the stored arrays gives."""
    g = attributed(arch, granularity)
    sums, abs_sums = g.incoming_sums(), g.incoming_abs_sums()
    assert g.derived("dag") is not None  # adopted from the engine, not derived yet
    ref_sums = np.bincount(g.edge_target, weights=g.edge_weight, minlength=g.n_nodes)
    ref_abs = np.bincount(g.edge_target, weights=np.abs(g.edge_weight), minlength=g.n_nodes)
    np.testing.assert_allclose(sums, ref_sums, rtol=1e-6, atol=1e-9 * np.abs(ref_abs).max())
    np.testing.assert_allclose(abs_sums, ref_abs, rtol=1e-6, atol=0)
    adopted = graph_dag(g).dag
    derived = dag_order(g.n_nodes, g.edge_target, g.edge_source, g.edge_weight, dagmod.graph_levels(g))
    assert derived.order is None and not derived.reverse
    np.testing.assert_array_equal(adopted.level, derived.level)
    assert adopted.segments == derived.segments
    # a graph whose arrays were replaced forgets both
    h = AttributionGraph(g.nodes, g.edge_target.copy(), g.edge_source, g.edge_weight.copy(), targets=list(g.targets))
    assert h.derived("dag") is None


def test_duplicate_edges_are_summed_before_the_absolute_value():
    e = Node(NodeId("embedding", -1, 0, 1), 1.0)
    x = Node(NodeId("error", 0, 0, 0), 1.0)
    t = Node(NodeId("logit", 1, 0, 3), 1.0, pre_activation=1.0, constant=0.0)
    # e -> T twice (+2 and -1: one edge of weight 1), x -> T 1
    g = AttributionGraph([e, x, t], [2, 2, 2], [0, 0, 1], [2.0, -1.0, 1.0], targets=[(t.id, 1.0)])
    np.testing.assert_allclose(node_influence(g), [0.5, 0.5, 0.0])
    np.testing.assert_allclose(total_effects(g), [[1.0, 1.0, 0.0]])
    assert prune_graph(g, 1.0, 1.0).edge_mask.tolist() == [True, True, True]


def test_cycle_is_reported_by_the_topological_sort():
    a = Node(NodeId("feature", 0, 0, 0), 1.0, pre_activation=1.0, constant=0.0)
    b = Node(NodeId("feature", 1, 0, 0), 1.0, pre_activation=1.0, constant=0.0)
    c = Node(NodeId("logit", 2, 0, 0), 1.0, pre_activation=1.0, constant=0.0)
    g = AttributionGraph([a, b, c], [0, 1, 2], [1, 0, 1], [1.0, 1.0, 1.0], targets=[(c.id, 1.0)])
    for fn in (node_influence, total_effects, compute_scores, prune_graph):
        with pytest.raises(QueryError, match="cycle"):
            fn(g)


def test_partial_influence_equals_its_power_series():
    """max_feature_nodes ranks features by the influence over the rows computed so far."""
    from circuitgraph.attribution.feature_selection import partial_influence

    g = random_dag(2, n_layers=4, n_pos=4)
    rng = np.random.default_rng(0)
    # only some readers' rows are known; the others have no incoming edges yet
    readers = np.unique(g.edge_target)
    known = set(rng.choice(readers, size=readers.size // 2, replace=False).tolist()) | {
        g.index_of(t) for t in g.target_ids}
    sel = np.array([t in known for t in g.edge_target.tolist()])
    t, s, w = g.edge_target[sel], g.edge_source[sel], g.edge_weight[sel]
    start = np.zeros(g.n_nodes)
    for tid, wt in g.targets:
        start[g.index_of(tid)] = wt
    A = np.zeros((g.n_nodes, g.n_nodes))
    A[t, s] = np.abs(w)
    A /= np.maximum(A.sum(1, keepdims=True), 1e-8)
    ref, x = np.zeros(g.n_nodes), start.copy()
    for _ in range(g.n_nodes):
        x = A.T @ x
        ref += x
    level = dagmod.graph_levels(g)
    np.testing.assert_allclose(partial_influence(t, s, w, level, start), ref, rtol=1e-12, atol=1e-14)
