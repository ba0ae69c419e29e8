"""``graph.max_neuron_nodes`` on SmolLM2-135M-Instruct (the ``real`` tier): the 15-token IOI
prompt, every one of its 645 k neurons a candidate.

Independent check of the ranking (one round: K <= 4 x batch_size, so the rule ranks by the
direct edges into the one target): a neuron's direct edge into the target is the change of the
target when that neuron alone is removed in the frozen model (a forward pass with hooks, no
code of the engine), so every kept neuron's removal effect is at least that of any unselected
neuron sampled at random.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.real

PROMPT = "When Mary and John went to the store, John gave a drink to"


def test_kept_neurons_outweigh_the_folded_ones_on_smollm2(smollm2_dir):
    import circuitgraph
    from circuitgraph.validation.frozen import frozen_reader_values

    k = 32
    res = circuitgraph.run({
        "format_version": 1, "model": {"path": str(smollm2_dir)}, "prompt": PROMPT,
        "targets": [{"logit_diff": [" Mary", " John"]}], "prune": "none",
        "graph": {"mlp": "neurons", "attention": "frozen", "max_neuron_nodes": k, "batch_size": 16}})
    g = res.full_graph
    kept = [n.id for n in g.nodes if n.kind == "neuron"]
    remainders = [n for n in g.nodes if n.kind == "remainder"]
    assert len(kept) == k
    assert sum(n.attrs["n_neurons"] for n in remainders) == 30 * 1536 * 14 - k
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-4
    ctx = g.context
    ((target, _),) = g.targets
    base = frozen_reader_values(ctx, readers=[target])[target]

    def effect(node):
        return abs(base - frozen_reader_values(ctx, [node], readers=[target])[target])

    kept_ids = set(kept)
    candidates = [n.id for n in ctx.attributed_nodes if n.kind == "neuron" and n.id not in kept_ids]
    rng = np.random.default_rng(0)
    sample = [candidates[i] for i in rng.choice(len(candidates), size=40, replace=False)]
    weakest_kept = min(effect(n) for n in kept)
    strongest_other = max(effect(n) for n in sample)
    assert weakest_kept >= strongest_other, (weakest_kept, strongest_other)
    # each kept neuron's edge into the target is its frozen removal effect
    for node in kept[:5]:
        edge = dict(g.in_edges(target))[node]
        assert abs(edge) == pytest.approx(effect(node), rel=2e-3, abs=1e-5)


def test_first_order_prediction_tracks_real_removals_where_the_frozen_graph_does_not(smollm2_dir):
    """A single top logit (relative to the mean) of a short text: removing a late neuron changes
    the final norm's sigma, which the frozen graph holds fixed; the real model's first-order
    prediction (predicted_gradient, autograd) follows the real removals (docs/validation.md)."""
    import circuitgraph

    res = circuitgraph.run({
        "format_version": 1, "model": {"path": str(smollm2_dir)},
        "prompt": "A day for firm decisions!!!!!  Or is it? A few hours",
        "targets": [{"top_logits": {"max_n": 1}}], "prune": "none",
        "graph": {"mlp": "neurons", "attention": "frozen", "max_neuron_nodes": 256},
        "validate": [{"predicted_vs_actual": {"k": 20, "mode": "zero"}}]})
    (check,) = res.validation
    r = check["result"]
    assert r.frozen_ok
    assert r.correlation_gradient >= 0.9 and r.sign_agreement_gradient >= 0.8, r.table()
    assert r.correlation_total < r.correlation_gradient
