"""Agreement with circuit-tracer 0.5.0, run in its own virtualenv on the same bundles.

Every entry of circuit-tracer's adjacency (features, errors, token embeddings, logits) equals
circuitgraph's edge between the same nodes, on the same prompt and logit targets, to within 1e-5
of the largest edge (float32 on both sides; the recorded differences are ~3e-7). circuit-tracer's
node set is the same: every node circuitgraph builds is one of its nodes.
"""

from __future__ import annotations

import pytest
import torch

from circuitgraph.attribution import ResolvedTarget, attribute
from tests.conftest import CT_CASES, load_bundle


@pytest.mark.parametrize("name", CT_CASES)
def test_edges_equal_circuit_tracers(circuit_tracer_graphs, name):
    from circuitgraph.testing.circuit_tracer import compare_with_circuit_tracer

    bundle, ct = circuit_tracer_graphs[name]
    adapter, tcs, _ = load_bundle(bundle)
    last = len(ct.input_tokens) - 1
    targets = [ResolvedTarget("logit", last, p, (v,), True, probability=p)
               for v, p in zip(ct.logit_tokens, ct.logit_probabilities)]
    g = attribute(adapter, ct.input_tokens, tcs, targets, dtype=torch.float32)
    report = compare_with_circuit_tracer(g, ct)
    assert report["our_nodes_not_in_ct"] == [] and report["largest_dropped_edge"] == 0.0, report
    assert report["nonzero_ct"] > 1000, report
    assert report["max_difference_relative_to_largest_edge"] < 1e-5, report
    # the same active features, with the same activations
    ours = {n.id: n.activation for n in g.nodes if n.kind == "feature"}
    theirs = dict(zip(ct.node_ids, ct.activation_values.tolist()))
    assert set(ours) == {nid for nid in theirs if nid.kind == "feature"}
    assert max(abs(ours[k] - theirs[k]) for k in ours) < 1e-4 * max(abs(v) for v in ours.values())
