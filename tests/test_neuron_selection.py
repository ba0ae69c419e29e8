"""``graph.max_neuron_nodes``: the neurons kept are the most influential on the targets, ranked by
circuit-tracer's ``max_feature_nodes`` rule, and the others fold exactly into remainders.

The reference selection is recomputed from the FULL neuron graph (every neuron a node, every
row computed) by a dense routine written here: no code of ``feature_selection.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.attribution import attribute
from circuitgraph.errors import AttributionError
from tests.helpers.bundles import load_bundle, make_bundle

#: a GELU model and a gated (SwiGLU) one with post-norms: every gated neuron is a candidate
MODELS = ["ln-gelu-learned", "rms-gated-postnorm-softcap"]


def _influence_through_known_rows(A: np.ndarray, known: np.ndarray, start: np.ndarray) -> np.ndarray:
    """circuit-tracer's influence on the targets through the rows computed so far: ``M`` holds the
    known rows of ``|A|`` (reader x writer), each divided by its sum (clamped at 1e-8); the
    influence is ``start^T (M + M^2 + ...) = start^T ((I - M)^-1 - I)``, solved densely."""
    M = np.where(known[:, None], A, 0.0)
    M /= np.maximum(M.sum(1, keepdims=True), 1e-8)
    n = A.shape[0]
    return np.linalg.solve((np.eye(n) - M).T, start) - start


def _reference_selection(full, limits: dict[str, int], per_round: int) -> dict[str, set]:
    """The rounds of the rule on the full graph's dense ``|A|``: rows known at first are every
    reader's not of a selected kind (the targets'); each round ranks the unexpanded readers of
    each kind by the influence through the known rows and expands the best ``per_round`` of each
    kind below its limit.  Asserts that no round's cut is a tie."""
    n = full.n_nodes
    A = np.zeros((n, n))
    A[full.edge_target, full.edge_source] = np.abs(full.edge_weight.astype(np.float64))
    start = np.zeros(n)
    for tid, w in full.targets:
        start[full.index_of(tid)] = w
    kinds = np.array([node.kind for node in full.nodes])
    known = ~np.isin(kinds, list(limits))
    chosen: dict[str, list[int]] = {kind: [] for kind in limits}
    while any(len(chosen[k]) < limits[k] for k in limits):
        infl = _influence_through_known_rows(A, known, start)
        for kind, limit in limits.items():
            todo = sorted((i for i in np.flatnonzero(kinds == kind) if not known[i]), key=lambda i: -infl[i])
            take = min(per_round, limit - len(chosen[kind]))
            if take <= 0:
                continue
            assert infl[todo[take - 1]] > infl[todo[take]] * (1 + 1e-6), "a tie at the cut: choose another k"
            chosen[kind] += todo[:take]
        for kind in limits:
            known[chosen[kind]] = True
    return {kind: {full.nodes[i].id for i in rows} for kind, rows in chosen.items()}


@pytest.fixture(scope="module", params=MODELS)
def neuron_model(request, tmp_path_factory):
    adapter, _, tokens = load_bundle(make_bundle(tmp_path_factory.mktemp("neurons"), request.param), "float64")
    full = attribute(adapter, tokens, dtype=torch.float64, mlp="neurons")
    return adapter, tokens, full


@pytest.mark.parametrize("k,batch_size", [(7, 2), (11, 1)], ids=["one-round", "three-rounds"])
def test_max_neuron_nodes_selects_the_most_influential_neurons(neuron_model, k, batch_size):
    """The kept neurons are the ones circuit-tracer's rule picks from the full graph; in one
    round (k <= 4 x batch_size) that is the top k of the influence through the target rows."""
    adapter, tokens, full = neuron_model
    expected = _reference_selection(full, {"neuron": k}, 4 * batch_size)["neuron"]
    g = attribute(adapter, tokens, dtype=torch.float64, mlp="neurons", max_neuron_nodes=k, batch_size=batch_size)
    assert {n.id for n in g.nodes if n.kind == "neuron"} == expected


def test_max_neuron_nodes_folds_exactly_into_remainders(neuron_model):
    """Completeness holds on the selected graph; every kept row is the full graph's row with the
    unselected neurons of each (layer, position) summed into that site's remainder; the
    remainders count every unselected neuron; kept neurons keep their values."""
    adapter, tokens, full = neuron_model
    k = 9
    g = attribute(adapter, tokens, dtype=torch.float64, mlp="neurons", max_neuron_nodes=k, batch_size=3)
    assert g.check_completeness().max_violation < 1e-10
    kept = [n for n in g.nodes if n.kind == "neuron"]
    remainders = {(n.layer, n.position): n for n in g.nodes if n.kind == "remainder"}
    n_neurons = sum(1 for n in full.nodes if n.kind == "neuron")
    assert len(kept) == k
    assert sum(n.attrs["n_neurons"] for n in remainders.values()) == n_neurons - k
    assert all(n.index == 0 and n.label.startswith("other neurons") for n in remainders.values())
    kept_ids = {n.id for n in kept}
    A = full.dense_adjacency()
    for reader in [n for n in g.nodes if n.id.is_reader]:
        r_full = full.index_of(reader.id)
        incoming = dict(g.in_edges(reader.id))
        expect: dict = {}
        for s, node in enumerate(full.nodes):
            w = A[r_full, s]
            if w == 0:
                continue
            if node.kind == "neuron" and node.id not in kept_ids:
                key = remainders[(node.layer, node.position)].id
            else:
                key = node.id
            expect[key] = expect.get(key, 0.0) + w
        expect = {key: w for key, w in expect.items() if w != 0}
        assert set(incoming) == set(expect), reader.id
        for key, w in expect.items():
            assert incoming[key] == pytest.approx(w, rel=1e-9, abs=1e-12)
        assert reader.constant == pytest.approx(full.nodes[r_full].constant, abs=1e-10)
    for n in kept:
        same = full.nodes[full.index_of(n.id)]
        assert (n.activation, n.pre_activation, n.attrs) == (same.activation, same.pre_activation, same.attrs)


def test_max_neuron_nodes_at_least_every_neuron_is_the_full_graph(neuron_model):
    """With a limit above the neuron count nothing is selected: the same nodes and edges as the
    plain neuron graph (the candidates' lazy directions and shared output rows are exact)."""
    adapter, tokens, full = neuron_model
    g = attribute(adapter, tokens, dtype=torch.float64, mlp="neurons", max_neuron_nodes=10**6)
    assert [n.id for n in g.nodes] == [n.id for n in full.nodes]
    np.testing.assert_allclose(g.dense_adjacency(), full.dense_adjacency(), rtol=0, atol=1e-12)


def test_transcoders_and_neurons_both_limits_apply(tmp_path):
    """Transcoders on layer 0, neurons on layer 1: max_feature_nodes caps the features and
    max_neuron_nodes the neurons, both ranked in the same rounds by the same influence."""
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gated-rotary"), "float64")
    mlp = {0: "transcoders", 1: "neurons"}
    full = attribute(adapter, tokens, tcs, dtype=torch.float64, mlp=mlp)
    expected = _reference_selection(full, {"feature": 5, "neuron": 6}, 4)
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, mlp=mlp, max_feature_nodes=5, max_neuron_nodes=6,
                  batch_size=1)
    assert {n.id for n in g.nodes if n.kind == "feature"} == expected["feature"]
    assert {n.id for n in g.nodes if n.kind == "neuron"} == expected["neuron"]
    assert g.check_completeness().max_violation < 1e-10
    indices = {n.index for n in g.nodes if n.kind == "remainder"}
    assert indices == {0, 2}  # neurons' and features' remainders


def test_max_neuron_nodes_with_neuron_top_k_is_refused(neuron_model):
    adapter, tokens, _ = neuron_model
    with pytest.raises(AttributionError, match="max_neuron_nodes .* and neuron_top_k .* set only one"):
        attribute(adapter, tokens, mlp="neurons", max_neuron_nodes=5, neuron_top_k=3)


def test_the_plan_counts_only_the_selected_neuron_rows(neuron_model):
    """The memory plan of a max_neuron_nodes run counts the target rows and K neuron rows."""
    from circuitgraph.attribution.linearisation import linearise
    from circuitgraph.attribution.nodes_builder import GraphOptions, collect_nodes
    from circuitgraph.attribution.plan import plan_edges
    from circuitgraph.attribution.targets import top_logit_targets

    adapter, tokens, full = neuron_model
    L = adapter.facts.n_layers
    lin = linearise(adapter, torch.tensor(tokens), None)
    targets = top_logit_targets(lin.logits, position=len(tokens) - 1, max_n=10, cumulative_probability=0.95)
    options = GraphOptions(mlp=dict.fromkeys(range(L), "neurons"), attention=dict.fromkeys(range(L), "frozen"),
                           dtype=torch.float64, max_neuron_nodes=9)
    col = collect_nodes(adapter, lin, None, targets, options)
    plan = plan_edges(col, options, 2 * L + 1, lin.n_pos)
    n_targets = sum(1 for n in col.nodes if n.kind in ("logit", "target"))
    assert plan.selecting and plan.max_neuron_nodes == 9 and plan.max_feature_nodes is None
    assert plan.n_rows == n_targets + 9
    assert plan.n_edges_lower <= plan.n_edges_upper < full.n_edges


def test_a_spec_run_with_max_neuron_nodes_validates_its_predictions():
    """The whole pipeline on the built-in demo: K neurons kept, the remainders recorded, and
    predicted_vs_actual's frozen self-test passes (the frozen model reads only the targets)."""
    import circuitgraph

    res = circuitgraph.run({
        "format_version": 1, "model": {"builtin": "demo"}, "prompt": "mia saw the owl . later she wants",
        "targets": [{"logit_diff": [" an", " a"]}], "graph": {"mlp": "neurons", "max_neuron_nodes": 12},
        "validate": [{"predicted_vs_actual": {"k": 5, "mode": "zero"}}], "prune": "none"})
    g = res.full_graph
    assert sum(1 for n in g.nodes if n.kind == "neuron") == 12
    assert any(n.kind == "remainder" for n in g.nodes)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-4
    assert res.spec.graph.max_neuron_nodes == 12
    (check,) = res.validation
    assert check["status"] == "ok", check["error"]
    assert check["result"].frozen_max_deviation <= check["result"].frozen_tolerance
