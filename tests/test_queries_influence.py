"""Influence, total effects and scores: hand-computed values, dense-matrix references,
the exact decomposition identity, and circuit-tracer's scores on its own graphs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.queries import compute_scores, influence, node_influence, record_scores, total_effects
from circuitgraph.queries.influence import reader_gradients
from tests.helpers.graphs import (
    ARCHS,
    attributed,
    chain_graph,
    dense_influence,
    dense_total_effect,
    load_ct_graph,
    random_dag,
)
from tests.helpers.peers import CT_CASES


def input_rows(g: AttributionGraph) -> np.ndarray:
    """Pure writers (no pre-activation): embeddings, errors, ..."""
    return np.array([n.pre_activation is None for n in g.nodes])


# ------------------------------------------------------------------ hand-computed
def test_chain_by_hand():
    g = chain_graph()
    e, f, t = g.node_ids()
    # A: row T = (e .25, f .75), row f = (e 1); influence = wA + wA^2
    np.testing.assert_allclose(node_influence(g), [0.25 + 0.75, 0.75, 0.0])
    # e -> T directly 1, through f: 2 * 3 / 4 = 1.5
    np.testing.assert_allclose(total_effects(g), [[2.5, 3.0, 0.0]])
    res = influence(g, top_k=2)
    assert [n for n, _, _ in res.top()] == [e, f]
    assert res.of(f) == (0.75, 3.0)
    assert influence(g, signed=True).top(1)[0][0] == f
    # pre_T = TE(e) + y_f c_f + c_T = 2.5 + 0.75 * 2 + 0.5
    y = reader_gradients(g)[:, 0]
    np.testing.assert_allclose(y, [2.5, 0.75, 1.0])  # e's divisor is 1: y_e = TE(e)


def test_gelu_like_gain_divides_by_pre_activation():
    """A neuron whose activation (1) differs from its pre-activation (2): the pass-through gain
    is edge / pre-activation."""
    e = Node(NodeId("embedding", -1, 0, 1), 1.0)
    n = Node(NodeId("neuron", 0, 0, 3), 1.0, pre_activation=2.0, constant=0.0)
    t = Node(NodeId("logit", 1, 0, 3), 5.0, pre_activation=5.0, constant=0.0)
    g = AttributionGraph([e, n, t], [1, 2], [0, 1], [2.0, 5.0], targets=[(t.id, 1.0)])
    np.testing.assert_allclose(total_effects(g), [[5.0, 5.0, 0.0]])


@pytest.mark.parametrize("seed", range(4))
def test_influence_and_total_effect_match_dense(seed):
    g = random_dag(seed, n_targets=3)
    np.testing.assert_allclose(node_influence(g), dense_influence(g), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(total_effects(g), dense_total_effect(g), rtol=1e-9, atol=1e-10)
    res = influence(g)
    w = np.array([wt for _, wt in g.targets])
    np.testing.assert_allclose(res.total_effect, w @ dense_total_effect(g), rtol=1e-9, atol=1e-10)


def _check_decomposition(g: AttributionGraph, tol: float) -> None:
    """pre_T = sum over pure writers of TE + sum over readers of y_T[r] c_r, for every target."""
    te, y = total_effects(g), reader_gradients(g)
    inputs = input_rows(g)
    const = np.array([n.constant or 0.0 for n in g.nodes])
    for j, t in enumerate(g.target_ids):
        pre = g.node(t).pre_activation
        rebuilt = te[j, inputs].sum() + y[:, j] @ const
        assert abs(rebuilt - pre) <= tol * max(1.0, abs(pre)), (t, rebuilt, pre)


@pytest.mark.parametrize("seed", range(3))
def test_total_effects_decompose_targets_exactly_hand_built(seed):
    _check_decomposition(random_dag(seed), 1e-12)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("granularity", ["neurons", "transcoders"])
def test_total_effects_decompose_targets_exactly_attributed(arch, granularity):
    g = attributed(arch, granularity)
    _check_decomposition(g, 1e-10)
    np.testing.assert_allclose(node_influence(g), dense_influence(g), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(total_effects(g), dense_total_effect(g), rtol=1e-8, atol=1e-10)


def test_cycle_is_reported():
    a = Node(NodeId("feature", 0, 0, 0), 1.0, pre_activation=1.0, constant=0.0)
    b = Node(NodeId("feature", 1, 0, 0), 1.0, pre_activation=1.0, constant=0.0)
    g = AttributionGraph([a, b], [0, 1], [1, 0], [1.0, 1.0], targets=[(b.id, 1.0)])
    with pytest.raises(QueryError, match="cycle"):
        node_influence(g)


def test_no_targets_is_an_error():
    g = chain_graph()
    g.targets = []
    with pytest.raises(QueryError, match="no targets"):
        influence(g)


def test_influence_bad_top_k():
    for k in (0, -1, True, 1.5):
        with pytest.raises(QueryError, match=f"top_k must be a positive integer, got {k!r}"):
            influence(chain_graph(), top_k=k)


def test_influence_result_serialises():
    d = influence(random_dag(0), top_k=3).to_dict()
    json.dumps(d)
    assert len(d["top"]) == 3 and d["ranked_by"] == "influence"
    assert "influence" in influence(random_dag(0)).table()


# ------------------------------------------------------------------ scores
def test_scores_by_hand():
    e = Node(NodeId("embedding", -1, 0, 1), 1.0)
    x = Node(NodeId("error", 0, 0, 0), 1.0)
    f = Node(NodeId("feature", 0, 0, 5), 2.0, pre_activation=2.0, constant=0.0)
    t = Node(NodeId("logit", 1, 0, 3), 2.0, pre_activation=2.0, constant=0.0)
    # e->f 1, x->f 1, f->T 2, e->T -1, x->T 1
    g = AttributionGraph([e, x, f, t], [2, 2, 3, 3, 3], [0, 1, 2, 0, 1], [1.0, 1.0, 2.0, -1.0, 1.0],
                         targets=[(t.id, 1.0)])
    s = compute_scores(g)
    # influence: e .5, x .5, f .5 -> replacement .5
    assert s.replacement_score == pytest.approx(0.5)
    # rows T (.75, weight 1), f (.5, .5), e (1, .5), x (1, .5): 2.0 / 2.5
    assert s.completeness_score == pytest.approx(0.8)
    (tgt,) = s.per_target
    assert tgt.error_share == pytest.approx(0.5)
    # TE(x -> T) = 1 + 1 * 2 / 2
    assert tgt.error_effect == pytest.approx(2.0)
    assert tgt.error_effect_fraction == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(3))
def test_scores_match_direct_formula(seed):
    g = random_dag(seed, n_targets=2)
    infl = dense_influence(g)
    A = np.abs(g.dense_adjacency())
    A = A / np.maximum(A.sum(1, keepdims=True), 1e-10)
    kinds = np.array([n.kind for n in g.nodes])
    err, tok = kinds == "error", kinds == "embedding"
    w = np.zeros(g.n_nodes)
    for t, wt in g.targets:
        w[g.index_of(t)] = wt
    replacement = infl[tok].sum() / (infl[tok].sum() + infl[err].sum())
    out = infl + w
    completeness = ((1 - A[:, err].sum(1)) * out).sum() / out.sum()
    s = compute_scores(g)
    assert s.replacement_score == pytest.approx(replacement, rel=1e-12)
    assert s.completeness_score == pytest.approx(completeness, rel=1e-12)
    te = dense_total_effect(g)
    for j, row in enumerate(s.per_target):
        assert row.error_effect == pytest.approx(te[j, err].sum(), rel=1e-9, abs=1e-12)


def test_record_scores_writes_metadata():
    g = random_dag(1)
    s = record_scores(g)
    assert g.metadata["replacement_score"] == s.replacement_score
    assert g.metadata["completeness_score"] == s.completeness_score
    json.dumps(g.metadata["scores"])
    assert "replacement_score" in s.table()


@pytest.mark.parametrize("name", CT_CASES)
def test_scores_equal_circuit_tracers_on_its_graphs(circuit_tracer_graphs, name):
    g, ct = load_ct_graph(circuit_tracer_graphs, name)
    ref = ct.scores
    s = compute_scores(g)
    # circuit-tracer computes in float32; we compute in float64 from its float32 adjacency
    assert s.replacement_score == pytest.approx(ref["replacement_score"], abs=1e-6)
    assert s.completeness_score == pytest.approx(ref["completeness_score"], abs=1e-6)
