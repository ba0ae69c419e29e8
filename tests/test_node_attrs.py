"""Node attributes have one vocabulary (graph.nodes.NODE_ATTRS): every key a graph built,
folded, pruned, merged or drawn by circuitgraph carries is registered there, with its meaning."""

from __future__ import annotations

import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.graph.nodes import NODE_ATTRS
from circuitgraph.queries import prune_graph
from circuitgraph.testing.synthetic import tiny_model

TOKENS = [1, 5, 7, 2, 9, 4, 11]


def _keys(graph) -> set[str]:
    return {k for node in graph.nodes for k in node.attrs}


def _adapter(mlp: str) -> ModelAdapter:
    return ModelAdapter(tiny_model(seed=2, n_layers=2, mlp=mlp).to(torch.float64))


def test_every_attribute_a_graph_carries_is_registered():
    seen: set[str] = set()
    diff = ResolvedTarget("logit_diff", position=len(TOKENS) - 1, tokens=(3, 8))
    for mlp in ("gelu", "gated"):
        adapter = _adapter(mlp)
        neurons = attribute(adapter, TOKENS, mlp="neurons", dtype=torch.float64, max_neuron_nodes=6)
        seen |= _keys(neurons) | _keys(prune_graph(neurons, node_threshold=0.5, edge_threshold=0.5).graph)
        seen |= _keys(attribute(adapter, TOKENS, targets=[diff], mlp="neurons", dtype=torch.float64, neuron_top_k=2))
        seen |= _keys(attribute(adapter, TOKENS, targets=[diff], mlp="mlp", attention="heads", dtype=torch.float64,
                                component_inputs=True, head_inputs=("value", "query", "key")))
    assert seen - set(NODE_ATTRS) == set(), "unregistered node attributes: add them to NODE_ATTRS with their meaning"
    # the test sees the attributes of every family of nodes it built
    assert {"token", "token_str", "hook_pre", "gate", "linear", "n_neurons", "pruned_edges_by_source_kind",
            "total_effect", "inputs", "query_total", "key_constant", "target_kind"} <= seen, seen


def test_every_registered_attribute_says_what_it_means():
    assert all(isinstance(text, str) and len(text) > 10 for text in NODE_ATTRS.values())
