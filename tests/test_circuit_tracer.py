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
from tests.helpers.bundles import load_bundle
from tests.helpers.peers import CT_CASES


@pytest.mark.parametrize("name", CT_CASES)
def test_edges_equal_circuit_tracers(circuit_tracer_graphs, name):
    from circuitgraph.testing.circuit_tracer import compare_with_circuit_tracer

    bundle, ct = circuit_tracer_graphs[name]
    adapter, tcs, _ = load_bundle(bundle)
    last = len(ct.input_tokens) - 1
    targets = [ResolvedTarget("logit", last, p, (v,), True, probability=p)
               for v, p in zip(ct.logit_tokens, ct.logit_probabilities, strict=False)]
    g = attribute(adapter, ct.input_tokens, tcs, targets, dtype=torch.float32)
    report = compare_with_circuit_tracer(g, ct)
    assert report["our_nodes_not_in_ct"] == [] and report["largest_dropped_edge"] == 0.0, report
    assert report["nonzero_ct"] > 1000, report
    assert report["max_difference_relative_to_largest_edge"] < 1e-5, report
    # the same active features, with the same activations
    ours = {n.id: n.activation for n in g.nodes if n.kind == "feature"}
    theirs = dict(zip(ct.node_ids, ct.activation_values.tolist(), strict=False))
    assert set(ours) == {nid for nid in theirs if nid.kind == "feature"}
    assert max(abs(ours[k] - theirs[k]) for k in ours) < 1e-4 * max(abs(v) for v in ours.values())


#: max_feature_nodes compared with circuit-tracer's own selection: (case, max_feature_nodes, batch_size);
#: the second needs several ranking rounds (4 x batch_size features a round, circuit-tracer's update_interval)
MFN_CASES = [("example-gpt2", 12, 8), ("tiny-llama-skip-jr", 10, 1)]


@pytest.mark.parametrize("name,k,batch_size", MFN_CASES)
def test_max_feature_nodes_selects_circuit_tracers_features(circuit_tracer_graphs, tmp_path, name, k, batch_size):
    """circuit-tracer run with the same max_feature_nodes and batch_size keeps the same features,
    and the same edges between the kept nodes (a reversed or different ranking keeps others)."""
    from circuitgraph.testing.circuit_tracer import compare_with_circuit_tracer, run_circuit_tracer

    bundle, _ = circuit_tracer_graphs[name]
    ct = run_circuit_tracer({name: bundle}, tmp_path, prune=False,
                            extra_args=["--max-feature-nodes", str(k), "--batch-size", str(batch_size)])[name]
    adapter, tcs, _ = load_bundle(bundle)
    last = len(ct.input_tokens) - 1
    targets = [ResolvedTarget("logit", last, p, (v,), True, probability=p)
               for v, p in zip(ct.logit_tokens, ct.logit_probabilities, strict=False)]
    g = attribute(adapter, ct.input_tokens, tcs, targets, dtype=torch.float32, max_feature_nodes=k,
                  batch_size=batch_size)
    ours = {n.id for n in g.nodes if n.kind == "feature"}
    theirs = {nid for nid in ct.node_ids if nid.kind == "feature"}
    assert len(ours) == k and ours == theirs, (sorted(ours - theirs), sorted(theirs - ours))
    report = compare_with_circuit_tracer(g, ct)
    assert report["max_difference_relative_to_largest_edge"] < 1e-5, report
