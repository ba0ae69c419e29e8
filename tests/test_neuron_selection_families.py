"""``graph.max_neuron_nodes`` and the dry run's neuron advice on other model families than Llama:
tiny Qwen2, GPT-2 and Gemma-2 checkpoints made with transformers (``from_config`` and
``save_pretrained``) and loaded as a user's folder.  On each: the candidates held as arrays give
the same records as the plain neuron collector, the selected graph is complete, the plan the
dry run makes of ``max_neuron_nodes: K`` from the activations alone (before any candidate is
collected) equals the plan of the collected candidates, and the advice, followed, fits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import circuitgraph
from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.attribution import attribute, plan
from circuitgraph.attribution.linearisation import linearise
from circuitgraph.attribution.nodes_builder import GraphOptions, collect_nodes
from circuitgraph.attribution.targets import top_logit_targets
from tests.helpers.hf_checkpoints import hf_checkpoint as _checkpoint

TOKENS = [1, 5, 7, 9, 4, 3, 11, 6, 8, 12, 10, 2]


@pytest.fixture(scope="module", params=["qwen2", "gpt2", "gemma2"])
def family_model(request, tmp_path_factory):
    return request.param, _checkpoint(request.param, tmp_path_factory.mktemp(request.param) / "model")


def _collected(adapter, **opts):
    lin = linearise(adapter, torch.tensor(TOKENS), None)
    targets = top_logit_targets(lin.logits, position=len(TOKENS) - 1, max_n=2, cumulative_probability=0.95)
    L = adapter.facts.n_layers
    options = GraphOptions(mlp=dict.fromkeys(range(L), "neurons"), attention=dict.fromkeys(range(L), "frozen"),
                           dtype=torch.float64, **opts)
    return collect_nodes(adapter, lin, None, targets, options), options, 2 * L + 1


def test_candidates_selection_and_plan_on_other_families(family_model):
    family, folder = family_model
    adapter = load_model_dir(folder, dtype="float64")
    n_pos = len(TOKENS)
    full = attribute(adapter, TOKENS, dtype=torch.float64, mlp="neurons")
    k = 9
    g = attribute(adapter, TOKENS, dtype=torch.float64, mlp="neurons", max_neuron_nodes=k, batch_size=2)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-9
    kept = [n for n in g.nodes if n.kind == "neuron"]
    assert len(kept) == k
    for n in kept:  # a candidate's record, made from its arrays, is the plain collector's
        ref = full.nodes[full.index_of(n.id)]
        assert (n.activation, n.pre_activation, n.label, n.attrs) == (ref.activation, ref.pre_activation,
                                                                       ref.label, ref.attrs)
    n_neurons = sum(n.kind == "neuron" for n in full.nodes)
    assert sum(n.attrs.get("n_neurons", 0) for n in g.nodes if n.kind == "remainder") == n_neurons - k

    # the dry run's plan of max_neuron_nodes from the activations = the plan of the collected candidates
    col, options, n_locs = _collected(adapter)
    counts, locs, positions, kinds = col.count_tables(n_locs, n_pos)
    reach = plan._reach(options, n_locs, adapter.facts.causal)
    virtual = plan._neuron_candidates(col, options, counts, locs, positions, kinds, reach, n_locs, n_pos)
    assert virtual is not None and virtual.n == n_neurons
    col_k, options_k, _ = _collected(adapter, max_neuron_nodes=k)
    real = plan.plan_edges(col_k, options_k, n_locs, n_pos, limit=10**15, base=0)
    assert real.max_neuron_nodes == k
    assert real.n_edges_upper == int(virtual.other_bound.sum()) + plan._top_weighted(virtual.bound, virtual.weight, k)
    assert real.n_edges_folded_upper == (int(np.minimum(virtual.other_bound, virtual.other_cap + k).sum())
                                         + plan._top_weighted(np.minimum(virtual.bound, virtual.cap + k),
                                                              virtual.weight, k))


def test_the_advice_on_other_families_fits_when_followed(family_model, monkeypatch):
    """Under a budget the full neuron graph passes (the edges made 10^5 times dearer), the dry run
    advises max_neuron_nodes; the spec with it fits the same budget and runs complete."""
    family, folder = family_model
    from circuitgraph.attribution import plan as plan_mod

    monkeypatch.setattr(plan_mod, "EDGE_PEAK_BYTES", 10**5)
    monkeypatch.setattr(plan_mod, "MFN_EDGE_PEAK_BYTES", 10**4)
    spec = {"format_version": 1, "model": {"path": str(folder)}, "prompt": {"tokens": TOKENS},
            "targets": [{"top_logits": {"max_n": 2}}], "graph": {"mlp": "neurons"}}
    lines = circuitgraph.dry_run(spec)
    base = next(line for line in lines if line.startswith("memory:"))
    held = float(base.split("memory: ")[1].split(" GB")[0]) * 1024**3
    budget = int(held * 1.6 + 2 * 1024**3)  # room for some rows at 10 KB an edge, not for the full graph
    lines = circuitgraph.dry_run(spec, memory_limit=budget)
    fits = next(line for line in lines if line.startswith("fits:"))
    assert fits.startswith("fits: NO") and "max_neuron_nodes: " in fits, lines
    k = int(fits.split("max_neuron_nodes: ")[1].split()[0])
    assert 1 <= k < 2 * 24 * (len(TOKENS) - 1)
    followed = {**spec, "graph": {"mlp": "neurons", "max_neuron_nodes": k}}
    lines = circuitgraph.dry_run(followed, memory_limit=budget)
    assert "fits: yes" in lines, (family, k, lines)
    result = circuitgraph.run(followed, memory_limit=budget)
    assert sum(n.kind == "neuron" for n in result.full_graph.nodes) == k
    assert result.full_graph.metadata["completeness"]["max_relative_violation"] < 1e-5
