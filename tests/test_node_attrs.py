"""Node attributes have one vocabulary (graph.nodes.NODE_ATTRS, typed by graph.nodes.NodeAttrs):
every key a graph built, folded, pruned, merged or drawn by circuitgraph carries is registered
there, with its meaning and its value's type; graph files keep the keys of other tools."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.export import load_graph_binary, save_graph_binary
from circuitgraph.export.json_graph import graph_from_dict, graph_to_dict
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NODE_ATTRS, Node, NodeAttrs, NodeId
from circuitgraph.queries import prune_graph
from circuitgraph.queries.neighbours import logit_difference, merge_supernodes
from circuitgraph.testing.synthetic import tiny_model

TOKENS = [1, 5, 7, 2, 9, 4, 11]


#: NodeAttrs's value types, checked strictly (an int is no bool, a numpy scalar no int; floats take ints)
_TYPES = TypeAdapter(NodeAttrs)


def _keys(graph) -> set[str]:
    for node in graph.nodes:
        _TYPES.validate_python(node.attrs, strict=True)  # every value of the declared type
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
        logits = [n.id for n in neurons.nodes if n.kind == "logit"]
        seen |= _keys(logit_difference(neurons, logits[0], logits[1])[0])
        seen |= _keys(merge_supernodes(neurons, {"first": {"kind": "neuron", "layer": 0}}))
        seen |= _keys(attribute(adapter, TOKENS, targets=[diff], mlp="neurons", dtype=torch.float64, neuron_top_k=2))
        seen |= _keys(attribute(adapter, TOKENS, targets=[diff], mlp="mlp", attention="heads", dtype=torch.float64,
                                component_inputs=True, head_inputs=("value", "query", "key")))
    assert seen - set(NODE_ATTRS) == set(), "unregistered node attributes: add them to NODE_ATTRS with their meaning"
    # the test sees the attributes of every family of nodes it built
    assert {"token", "token_str", "hook_pre", "gate", "linear", "n_neurons", "pruned_edges_by_source_kind",
            "total_effect", "inputs", "query_total", "key_constant", "target_kind", "from", "supernode",
            "members", "tokens", "relative_to_mean"} <= seen, seen


def test_every_registered_attribute_says_what_it_means():
    assert all(isinstance(text, str) and len(text) > 10 for text in NODE_ATTRS.values())


def test_the_typed_attributes_and_the_vocabulary_name_the_same_keys():
    assert NodeAttrs.__required_keys__ == frozenset()  # a node carries the keys of its kind only
    assert set(NodeAttrs.__optional_keys__) == set(NODE_ATTRS), (
        "NodeAttrs (the types) and NODE_ATTRS (the meanings) must name the same keys: "
        f"only typed {sorted(set(NodeAttrs.__optional_keys__) - set(NODE_ATTRS))}, "
        f"only described {sorted(set(NODE_ATTRS) - set(NodeAttrs.__optional_keys__))}")


@pytest.mark.parametrize("attrs", [{"token": True}, {"token": np.int64(3)}, {"members": "feature/0/0/1"},
                                   {"pruned_edges_by_source_kind": {"feature": 1.5}}, {"from": ("a", "b")}])
def test_the_type_check_fails_on_a_wrong_value(attrs):
    with pytest.raises(ValidationError):
        _TYPES.validate_python(attrs, strict=True)


def _graph_with_foreign_attrs() -> AttributionGraph:
    foreign = {"token_prob": 0.25, "clerp": "another tool's label", "nested": {"a": [1, 2.5, None]}}
    nodes = [
        Node(NodeId("embedding", -1, 0, 7), 1.0, label="tok", attrs={"token": 7, "token_str": "tok", **foreign}),
        Node(NodeId("feature", 0, 0, 3), 0.5, pre_activation=0.7, constant=0.1,
             attrs={"description": "a feature", "influence": 0.5}),
        Node(NodeId("logit", 2, 0, 5), 1.5, pre_activation=1.5, constant=0.2,
             attrs={"token_str": "x", "probability": 0.75, "token_prob": 0.5}),
    ]
    return AttributionGraph(nodes, edge_target=[1, 2], edge_source=[0, 1],
                            edge_weight=np.array([0.6, 1.0], dtype=np.float32),
                            targets=[(nodes[2].id, 1.0)], metadata={"n_layers": 2})


def test_graph_files_keep_the_attributes_of_other_tools(tmp_path):
    graph = _graph_with_foreign_attrs()
    want = [dict(n.attrs) for n in graph.nodes]
    assert "clerp" in want[0] and "token_prob" in want[2]  # keys of no circuitgraph graph
    from_json = graph_from_dict(graph_to_dict(graph)).graph
    assert [dict(n.attrs) for n in from_json.nodes] == want
    assert list(from_json.nodes[0].attrs) == list(want[0])  # in their order
    save_graph_binary(graph, tmp_path / "g.npz")
    assert [dict(n.attrs) for n in load_graph_binary(tmp_path / "g.npz").nodes] == want
    pytest.importorskip("networkx", reason="the networkx round trip needs the networkx extra")
    assert [dict(n.attrs) for n in AttributionGraph.from_networkx(graph.to_networkx()).nodes] == want
    # a copy: editing the loaded graph's attrs leaves the document's alone
    doc = graph_to_dict(graph)
    loaded = graph_from_dict(doc).graph
    loaded.nodes[0].attrs["token_str"] = "changed"
    assert doc["nodes"][0]["attrs"]["token_str"] == "tok"
