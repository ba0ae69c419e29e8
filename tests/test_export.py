"""Export: JSON (own schema) and binary round trips, Neuronpedia JSON, DOT text, rendering.

Graphs are built by hand (no model): a few embeddings, features, errors and a logit whose
edges satisfy completeness exactly, plus a graph with every node kind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import circuitgraph.export as export
from circuitgraph._io import atomic_write_bytes, atomic_write_text, atomic_writer
from circuitgraph.errors import ExportError, LoadError, RenderError
from circuitgraph.export import render as render_module
from circuitgraph.export.binary import load_graph_binary, read_graph_binary, save_graph_binary
from circuitgraph.export.dot import NEGATIVE_COLOR, POSITIVE_COLOR, dot_quote, graph_to_dot
from circuitgraph.export.graph_schema import SCHEMA_PATH, graph_json_schema, graph_schema_text
from circuitgraph.export.json_graph import graph_from_json, graph_to_json, read_graph_json
from circuitgraph.export.neuronpedia import FEATURE_TYPES, graph_to_neuronpedia
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NODE_KINDS, Node, NodeId

TRICKY = 'say "hi" \\ bye'

# --------------------------------------------------------------------------- fixtures


def make_graph(dtype=np.float32) -> AttributionGraph:
    """Two layers, three positions; every reader's pre-activation = edges + constant exactly."""
    emb = [
        Node(NodeId("embedding", -1, 0, 50256), 1.0, label="<bos>", attrs={"token_str": "<bos>"}),
        Node(NodeId("embedding", -1, 1, 3797), 1.0, attrs={"token_str": TRICKY}),
        Node(NodeId("embedding", -1, 2, 198), 1.0, attrs={"token_str": "\n猫"}),
    ]
    f0 = NodeId("feature", 0, 1, 17)
    f1 = NodeId("feature", 1, 2, 5)
    e0 = NodeId("error", 0, 1, 0)
    e1 = NodeId("error", 1, 2, 0)
    logit = NodeId("logit", 2, 2, 42)
    ids = [n.id for n in emb] + [f0, e0, f1, e1, logit]
    row = {nid: i for i, nid in enumerate(ids)}
    edges = [
        (emb[0].id, f0, 0.5), (emb[1].id, f0, -0.25), (f0, f1, 1.5), (e0, f1, -0.3), (emb[2].id, f1, 0.1),
        (f1, logit, 2.0), (e1, logit, -0.7), (f0, logit, 0.3), (emb[2].id, logit, 0.05),
    ]
    weights = np.array([w for _, _, w in edges], dtype=dtype)
    sums = {nid: 0.0 for nid in ids}
    for (_s, t, _), w in zip(edges, weights, strict=False):
        sums[t] += float(w)
    constants = {f0: 0.125, f1: -0.0625, logit: 1.0 / 3.0}
    readers = {}
    for nid, const in constants.items():
        readers[nid] = dict(pre_activation=sums[nid] + const, constant=const)
    nodes = list(emb) + [
        Node(f0, 0.8, label="cat-ish", attrs={"influence": 0.6, "nested": {"a": [1, 2.5, None, True]}},
             **readers[f0]),
        Node(e0, 1.0, attrs={"influence": 0.1}),
        Node(f1, 3.0, attrs={"influence": 0.3}, **readers[f1]),
        Node(e1, 1.0, attrs={"influence": 0.05}),
        Node(logit, 4.2, attrs={"token_str": " dog", "token_prob": 0.4321}, **readers[logit]),
    ]
    return AttributionGraph(
        nodes=nodes,
        edge_target=[row[t] for _, t, _ in edges],
        edge_source=[row[s] for s, _, _ in edges],
        edge_weight=weights,
        targets=[(logit, 1.0)],
        metadata={
            "prompt": "<bos>" + TRICKY + "\n猫",
            "prompt_tokens": [50256, 3797, 198],
            "prompt_token_strs": ["<bos>", TRICKY, "\n猫"],
            "model": {"name": "toy-2l", "n_layers": 2},
            "versions": {"circuitgraph": "0.1.0"},
            "checks": {"completeness": {"max_relative_violation": 1.5e-8}},
        },
    )


def make_all_kinds_graph() -> AttributionGraph:
    """One node of every kind (completeness not needed here)."""
    ids = [
        NodeId("embedding", -1, 0, 1), NodeId("positional", -1, 0, 0), NodeId("attention_head", 0, 1, 3),
        NodeId("bias", 0, 1, 0), NodeId("neuron", 0, 1, 7), NodeId("mlp", 1, 1, 0), NodeId("bias", 1, 1, 1),
        NodeId("feature", 1, 1, 7), NodeId("error", 1, 1, 0), NodeId("remainder", 1, 1, 1),
        NodeId("logit", 2, 1, 9), NodeId("target", 2, 1, 0),
    ]
    assert {i.kind for i in ids} == set(NODE_KINDS)
    nodes = [Node(i, 1.0, pre_activation=0.0 if i.is_reader else None, constant=0.0 if i.is_reader else None)
             for i in ids]
    src = list(range(10)) + [7, 8]
    tgt = [10] * 10 + [11, 11]
    w = np.linspace(-1.0, 1.0, len(src))
    return AttributionGraph(nodes, tgt, src, w, targets=[(ids[10], 1.0), (ids[11], 0.5)],
                            metadata={"model": {"name": "toy", "n_layers": 2}})


def assert_graphs_equal(a: AttributionGraph, b: AttributionGraph) -> None:
    assert len(a.nodes) == len(b.nodes)
    for x, y in zip(a.nodes, b.nodes, strict=False):
        assert x.id == y.id
        assert x.activation == y.activation
        assert x.pre_activation == y.pre_activation
        assert x.constant == y.constant
        assert x.label == y.label
        assert x.attrs == y.attrs
    assert a.nodes == b.nodes
    assert a.edge_weight.dtype == b.edge_weight.dtype
    assert np.array_equal(a.edge_weight, b.edge_weight)
    assert np.array_equal(a.edge_source, b.edge_source)
    assert np.array_equal(a.edge_target, b.edge_target)
    assert a.targets == b.targets
    assert a.metadata == b.metadata


def test_fixture_is_complete():
    assert make_graph().check_completeness().ok(1e-12)


# --------------------------------------------------------------------------- atomic writes


def test_atomic_write_creates_parents_and_replaces(tmp_path):
    target = tmp_path / "a" / "b" / "out.txt"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second ✓")
    assert target.read_text(encoding="utf-8") == "second ✓"
    atomic_write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_atomic_write_failure_leaves_nothing(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_writer(target) as handle:
            handle.write(b"partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    atomic_write_text(target, "kept")
    with pytest.raises(RuntimeError):
        with atomic_writer(target) as handle:
            handle.write(b"partial")
            raise RuntimeError("boom")
    assert target.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_json_round_trip_is_lossless(dtype, tmp_path):
    graph = make_graph(dtype)
    path = tmp_path / "g.json"
    text = graph_to_json(graph, path)
    assert path.read_text(encoding="utf-8") == text
    loaded = graph_from_json(path)
    assert_graphs_equal(graph, loaded)
    assert loaded.check_completeness().ok(1e-12)
    # also from the JSON text itself, and through the graph's own methods
    assert_graphs_equal(graph, graph_from_json(text))
    assert_graphs_equal(graph, AttributionGraph.from_json(graph.to_json()))


def test_json_weights_written_at_full_precision():
    graph = make_graph(np.float32)
    doc = json.loads(graph_to_json(graph))
    assert doc["edge_dtype"] == "float32"
    assert [e["weight"] for e in doc["edges"]] == [float(w) for w in graph.edge_weight]
    assert doc["edges"][3]["weight"] == float(np.float32(-0.3)) != -0.3
    assert [e["source"] for e in doc["edges"]][:2] == ["embedding/-1/0/50256", "embedding/-1/1/3797"]


def test_compact_json_writes_edges_directly_with_the_encoders_bytes():
    """The compact writer puts the edges in as text (each id encoded once, ``repr`` floats): the
    same bytes as the json module's encoding of the edge dicts, ids with quotes and non-ASCII
    text included, and the general path still names a non-finite weight."""
    from circuitgraph.export import json_graph

    graph = make_all_kinds_graph()
    graph.metadata["note"] = 'an "edges": [] lookalike, caf\u00e9'
    for kind in ("", "positive"):
        text = graph_to_json(graph)
        general = json_graph._dumps(json_graph.graph_to_dict(graph), None)
        assert text == general, kind
        graph.edge_weight = np.abs(graph.edge_weight) + np.float32(1e-30)
    assert json_graph._compact_text(graph, None, None, None, None) == text
    graph.edge_weight[0] = np.nan
    assert json_graph._compact_text(graph, None, None, None, None) is None
    with pytest.raises(ExportError):
        graph_to_json(graph)


def test_json_is_byte_identical(tmp_path):
    a = graph_to_json(make_graph(), tmp_path / "a.json")
    b = graph_to_json(make_graph(), tmp_path / "b.json")
    assert a == b
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert graph_to_json(graph_from_json(a)) == a
    assert graph_to_json(make_graph(), indent=2) == graph_to_json(make_graph(), indent=2)
    assert "T" not in json.loads(a)["metadata"].get("created", "")  # no timestamps are added


def test_json_fields(tmp_path):
    doc = json.loads(graph_to_json(make_graph()))
    assert doc["format"] == "circuitgraph.graph" and doc["format_version"] == 1
    assert set(doc) == {"format", "format_version", "edge_dtype", "metadata", "nodes", "edges", "targets",
                        "queries", "validation"}
    by_id = {n["id"]: n for n in doc["nodes"]}
    assert len(by_id) == len(doc["nodes"])
    feat = by_id["feature/0/1/17"]
    assert feat["kind"] == "feature" and (feat["layer"], feat["position"], feat["index"]) == (0, 1, 17)
    assert {"pre_activation", "constant"} <= set(feat)
    assert "pre_activation" not in by_id["embedding/-1/0/50256"]
    assert doc["targets"] == [{"node": "logit/2/2/42", "weight": 1.0}]
    assert doc["queries"] == [] and doc["validation"] == []


def test_queries_and_validation_round_trip():
    queries = [{"top_paths": {"k": 2, "paths": [["embedding/-1/0/50256", "feature/0/1/17"]]}}]
    validation = [{"ablate": "top_nodes", "recovery": 0.93}]
    text = graph_to_json(make_graph(), queries=queries, validation=validation)
    doc = read_graph_json(text)
    assert doc.queries == queries and doc.validation == validation and doc.format_version == 1
    assert_graphs_equal(make_graph(), doc.graph)


def test_schema_validates_export():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(graph_json_schema())
    jsonschema.Draft202012Validator.check_schema(graph_json_schema())
    for graph in (make_graph(), make_all_kinds_graph()):
        doc = json.loads(graph_to_json(graph, queries=[{"q": 1}], validation=[{"v": 2}]))
        validator.validate(doc)
    bad = json.loads(graph_to_json(make_graph()))
    bad["nodes"][0]["kind"] = "gizmo"
    bad["edges"][0]["source"] = "feature/x/1/2"
    del bad["nodes"][3]["constant"]
    assert len(list(validator.iter_errors(bad))) == 3


def test_schema_file_is_up_to_date():
    assert SCHEMA_PATH.read_text(encoding="utf-8") == graph_schema_text(), (
        "schemas/graph.schema.json is stale: run `python -m circuitgraph.export.graph_schema`"
    )


def test_max_edges_refusal_leaves_no_file(tmp_path):
    path = tmp_path / "big.json"
    with pytest.raises(ExportError, match="prune") as info:
        graph_to_json(make_graph(), path, max_edges=3)
    assert "export: {graph:" in str(info.value) and "9 edges" in str(info.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_bad_values_are_refused_with_their_location(tmp_path):
    graph = make_graph()
    graph.edge_weight[2] = np.nan
    with pytest.raises(ExportError, match=r"edge 2 \(feature/0/1/17 -> feature/1/2/5\)"):
        graph_to_json(graph, tmp_path / "x.json")
    graph = make_graph()
    graph.metadata["model"]["handle"] = object()
    with pytest.raises(ExportError, match=r"metadata\['model'\]\['handle'\] is a object"):
        graph_to_json(graph, tmp_path / "x.json")
    graph = make_graph()
    graph.nodes[3].attrs["score"] = float("inf")
    with pytest.raises(ExportError, match=r"node feature/0/1/17: attrs\['score'\] is inf"):
        graph_to_json(graph, tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []


def test_numpy_values_in_metadata_become_json():
    graph = make_graph()
    graph.metadata["arr"] = np.arange(3)
    graph.metadata["scalar"] = np.float32(0.5)
    loaded = graph_from_json(graph_to_json(graph))
    assert loaded.metadata["arr"] == [0, 1, 2] and loaded.metadata["scalar"] == 0.5


def test_loading_rejects_broken_files(tmp_path):
    doc = json.loads(graph_to_json(make_graph()))
    cases = {
        "format": ({**doc, "format": "something"}, "not a circuitgraph graph file"),
        "version": ({**doc, "format_version": 99}, "upgrade circuitgraph"),
        "edge": ({**doc, "edges": doc["edges"] + [{"source": "feature/9/9/9", "target": "logit/2/2/42",
                                                   "weight": 1.0}]}, r"edges\[9\] refers to node"),
        "dup": ({**doc, "nodes": doc["nodes"] + doc["nodes"][:1]}, "appears twice"),
    }
    for bad, message in cases.values():
        with pytest.raises(LoadError, match=message):
            graph_from_json(json.dumps(bad))
    with pytest.raises(LoadError, match="does not exist"):
        graph_from_json(tmp_path / "missing.json")


# --------------------------------------------------------------------------- binary


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_round_trip_is_lossless(tmp_path, compressed, dtype):
    graph = make_graph(dtype)
    path = tmp_path / "sub" / "g.npz"
    assert save_graph_binary(graph, path, queries=[{"q": 1}], compressed=compressed) == str(path)
    assert_graphs_equal(graph, load_graph_binary(path))
    doc = read_graph_binary(path)
    assert doc.queries == [{"q": 1}] and doc.validation == []
    with np.load(path, allow_pickle=False) as archive:
        assert archive["edge_weight"].dtype == dtype
    assert [p.name for p in path.parent.iterdir()] == ["g.npz"]


def test_binary_has_no_edge_limit_and_rejects_foreign_files(tmp_path):
    path = tmp_path / "g.npz"
    save_graph_binary(make_graph(), path)
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(LoadError, match="missing"):
        load_graph_binary(tmp_path / "other.npz")


# --------------------------------------------------------------------------- Neuronpedia


def test_neuronpedia_fields(tmp_path):
    path = tmp_path / "np.json"
    doc = graph_to_neuronpedia(make_graph(), path, slug="toy-graph", node_threshold=0.7)
    assert json.loads(path.read_text(encoding="utf-8")) == doc
    meta = doc["metadata"]
    assert {"slug", "scan", "prompt_tokens", "prompt", "node_threshold", "schema_version", "info"} <= set(meta)
    assert meta["slug"] == "toy-graph" and meta["scan"] == "toy-2l" and meta["node_threshold"] == 0.7
    assert meta["prompt_tokens"] == ["<bos>", TRICKY, "\n猫"]
    assert meta["info"]["generator"]["name"] == "circuitgraph"
    assert doc["qParams"] == {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    required = {"node_id", "feature", "layer", "ctx_idx", "feature_type", "jsNodeId", "clerp", "influence",
                "activation", "is_target_logit", "token_prob"}
    for node in doc["nodes"]:
        assert required <= set(node)
        assert isinstance(node["layer"], str) and isinstance(node["feature"], int)
    ids = {n["node_id"] for n in doc["nodes"]}
    assert len(ids) == len(doc["nodes"])
    assert len(doc["links"]) == 9
    for link in doc["links"]:
        assert link["source"] in ids and link["target"] in ids and isinstance(link["weight"], float)


def test_neuronpedia_follows_circuit_tracer_conventions():
    doc = graph_to_neuronpedia(make_graph())
    by_id = {n["node_id"]: n for n in doc["nodes"]}
    feat = by_id["0_17_1"]
    assert feat["feature_type"] == "cross layer transcoder" and feat["jsNodeId"] == "0_17-0"
    assert feat["feature"] == (0 + 17) * (0 + 17 + 1) // 2 + 17 and feat["layer"] == "0"
    assert feat["activation"] == pytest.approx(0.8) and feat["clerp"] == "cat-ish"
    err = by_id["0_-1_1"]
    assert err["feature_type"] == "mlp reconstruction error" and err["feature"] == -1
    assert err["jsNodeId"] == "0_-1-1" and err["activation"] is None
    emb = by_id["E_50256_0"]
    assert emb["feature_type"] == "embedding" and emb["layer"] == "E" and emb["jsNodeId"] == "E_50256-0"
    logit = by_id["3_42_2"]  # circuit-tracer puts logits at layer n_layers + 1
    assert logit["feature_type"] == "logit" and logit["is_target_logit"] is True
    assert logit["jsNodeId"] == "L_42-2" and logit["clerp"] == 'Output " dog" (p=0.432)'
    assert logit["token_prob"] == 1.0  # the target weight: what the viewers' scores weight it by
    # circuit-tracer's cumulative influence, computed from the graph's edges: every node has one
    assert all(isinstance(n["influence"], float) for n in doc["nodes"])
    ranked = sorted(doc["nodes"], key=lambda n: n["influence"])
    assert ranked[0]["node_id"] == "1_5_2"  # the feature feeding the logit most
    assert ranked[-1]["influence"] == pytest.approx(1.0)


def test_neuronpedia_all_kinds_and_scan():
    doc = graph_to_neuronpedia(make_all_kinds_graph(), scan=["tc-a", "tc-b"], keep_remainders=True)
    assert doc["metadata"]["scan"].startswith("custom-")
    assert doc["metadata"]["transcoder_list"] == ["tc-a", "tc-b"]
    types = {n["feature_type"] for n in doc["nodes"]}
    assert types == set(FEATURE_TYPES.values())
    assert len({n["node_id"] for n in doc["nodes"]}) == len(doc["nodes"])
    assert len({(n["layer"], n["feature"], n["ctx_idx"]) for n in doc["nodes"]}) == len(doc["nodes"])
    assert len(graph_to_neuronpedia(make_all_kinds_graph())["nodes"]) == len(doc["nodes"]) - 1  # no remainder
    graph = make_graph()
    del graph.metadata["model"]
    with pytest.raises(ExportError, match="scan="):
        graph_to_neuronpedia(graph)
    assert graph_to_neuronpedia(graph, scan="gpt2-small")["metadata"]["scan"] == "gpt2-small"


# --------------------------------------------------------------------------- DOT


def test_dot_layout_colours_and_labels():
    dot = graph_to_dot(make_graph())
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert "rankdir=BT" in dot
    assert dot.count("rank=same") >= 4  # embeddings, layer 0, layer 1, logits (+ legend)
    assert f'color="{POSITIVE_COLOR}"' in dot and f'color="{NEGATIVE_COLOR}"' in dot
    assert "F17 L0 @1" in dot and "F5 L1 @2" in dot and "Err L0 @1" in dot
    assert 'logit \\" dog\\"' in dot
    assert "cluster_legend" in dot and '"legend feature"' in dot
    # the strongest edge has the widest pen
    assert "penwidth=5.00" in dot
    # ordering within the embedding rank is by position
    emb_rank = dot[dot.index('"rank layer -1"'):]
    emb_rank = emb_rank[: emb_rank.index("}")]
    assert emb_rank.index("embedding/-1/0/") < emb_rank.index("embedding/-1/1/") < emb_rank.index("embedding/-1/2/")
    assert "showing" not in dot  # nothing left out


def test_dot_escapes_labels():
    dot = graph_to_dot(make_graph(), title='A "quoted" \\ title')
    assert '\\"<bos>\\"' in dot
    assert '\\"say \\\\\\"hi\\\\\\" \\\\\\\\ bye\\"' not in dot  # not double-escaped
    assert '\\"say \\"hi\\" \\\\ bye\\"' in dot
    assert "\\\\n猫" in dot  # a newline inside a token is shown as a visible \n
    assert 'A \\"quoted\\" \\\\ title' in dot
    for line in dot.splitlines():
        # every double quote in the text is either a delimiter or escaped: quotes balance
        unescaped = line.replace("\\\\", "").replace('\\"', "")
        assert unescaped.count('"') % 2 == 0, line
    assert dot_quote("a\nb") == '"a\\nb"'


def test_labels_that_restate_the_id_are_not_repeated():
    graph = make_graph()
    graph.nodes[5].label = "F5 L1@2"  # the attribution builder's structural label
    graph.nodes[4].label = "err L0@1"
    dot = graph_to_dot(graph)
    assert "F5 L1@2" not in dot and "err L0@1" not in dot and "cat-ish" in dot
    graph.nodes[-1].attrs = {"token_str": " dog", "probability": 0.25}  # builder's key for a logit's probability
    doc = graph_to_neuronpedia(graph)
    by_id = {n["node_id"]: n for n in doc["nodes"]}
    assert by_id["1_5_2"]["clerp"] == "" and by_id["0_17_1"]["clerp"] == "cat-ish"
    assert by_id["3_42_2"]["token_prob"] == 1.0 and by_id["3_42_2"]["clerp"].endswith("(p=0.250)")


def test_dot_truncation_keeps_targets_and_notes_what_was_left_out():
    graph = make_graph()
    dot = graph_to_dot(graph, max_nodes=3)
    assert '"logit/2/2/42"' in dot
    # ranked by circuit-tracer's influence on the targets, computed from the edges
    assert "showing 3 of 8 nodes" in dot and "5 weaker nodes left out (ranked by influence; they hold" in dot
    assert "feature/0/1/17" in dot and "feature/1/2/5" in dot
    assert "error/0/1/0" not in dot
    for node in graph.nodes:
        node.attrs["influence"] = {"error/1/2/0": 9.0, "feature/0/1/17": 8.0}.get(str(node.id), 0.0)
    dot = graph_to_dot(graph, max_nodes=3)
    assert "ranked by influence" in dot and "error/1/2/0" in dot and "feature/1/2/5" not in dot
    assert "they hold 0% of the influence" in dot  # every node with influence is drawn


def test_dot_min_edge_fraction_drops_weak_edges():
    dot = graph_to_dot(make_graph(), min_edge_fraction=0.5)
    assert "showing 8 of 8 nodes and 2 of 9 edges" in dot
    drawn = [line for line in dot.splitlines() if " penwidth=" in line and "->" in line and "width " not in line]
    assert len(drawn) == 2 and all("feature/1/2/5" in line for line in drawn)


def test_dot_all_kinds():
    hidden = graph_to_dot(make_all_kinds_graph())
    assert "rest (pruned)" not in hidden and "1 remainder node (pruned-away contributions) not drawn" in hidden  # singular
    dot = graph_to_dot(make_all_kinds_graph(), show_remainders=True)
    for text in ("pos @0", "L0H3 @1", "N7 L0 @1", "MLP L1 @1", "attention bias L0 @1", "mlp bias L1 @1",
                 "rest (pruned) L1 @1", "target 0 @1", "peripheries=2", "dashed"):
        assert text in dot, text
    assert '"rank layer 0 attention"' in dot


# --------------------------------------------------------------------------- rendering


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot binary not installed")
def test_render_svg(tmp_path):
    path = tmp_path / "out" / "graph.svg"
    assert make_graph().render(str(path)) == str(path)
    svg = path.read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "F17 L0 @1" in svg
    assert "say &quot;hi&quot; \\ bye" in svg  # escaping survived Graphviz
    assert "&lt;bos&gt;" in svg and "猫" in svg
    assert render_module.render_dot_text("digraph { a -> b }", tmp_path / "t.png").endswith("t.png")
    assert (tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot binary not installed")
def test_render_failure_leaves_no_file(tmp_path):
    with pytest.raises(RenderError, match="dot failed"):
        render_module.render_dot_text("digraph { a -> }", tmp_path / "bad.svg")
    assert list(tmp_path.iterdir()) == []


def test_render_without_dot_binary(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RenderError, match="apt-get install graphviz") as info:
        render_module.render_graph(make_graph(), tmp_path / "g.svg")
    assert "brew install graphviz" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_render_rejects_unknown_format(tmp_path):
    with pytest.raises(RenderError, match=r"\.svg, \.png, \.pdf"):
        render_module.render_graph(make_graph(), tmp_path / "g.bmp")


# --------------------------------------------------------------------------- API


def test_public_api_is_pinned():
    assert sorted(export.__all__) == sorted([
        "GraphDocument", "graph_to_json", "graph_from_json", "read_graph_json", "save_graph_binary",
        "load_graph_binary", "read_graph_binary", "graph_json_schema", "graph_to_neuronpedia",
        "graph_to_dot", "render_graph", "render_dot_text",
    ])
    for name in export.__all__:
        assert getattr(export, name) is not None
    assert os.fspath(SCHEMA_PATH).endswith(os.path.join("schemas", "graph.schema.json"))
    assert Path(SCHEMA_PATH).exists()
