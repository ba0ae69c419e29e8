"""The graph files' pydantic model (circuitgraph/export/graph_model.py): every graph file the
pipeline writes validates against it and against the committed JSON Schema generated from it;
files of earlier releases still read; problems are one line naming the file and the field."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import circuitgraph
from circuitgraph.errors import LoadError
from circuitgraph.export.binary import read_graph_binary, save_graph_binary
from circuitgraph.export.graph_model import BinaryGraphHeader, GraphFile, validate_graph_file
from circuitgraph.export.graph_schema import SCHEMA_PATH, graph_json_schema
from circuitgraph.export.json_graph import graph_to_json, read_graph_json
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.metadata import FOREIGN_KEYS, METADATA_KEYS, GraphMetadata, RunMetadata
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model

PROMPT = [1, 5, 7, 9, 4, 3, 11]


def _schema_validator(model: type = GraphFile) -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text()) if model is GraphFile else model.model_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """One pipeline run that writes every graph file a run writes: JSON and .npz, with queries,
    validation results and steering results."""
    tmp = tmp_path_factory.mktemp("run")
    model = tiny_model(norm="LN", mlp="gelu", positional="learned", n_layers=2, n_ctx=16)
    root = save_bundle(tmp / "b", model, random_transcoders(model, active_frac=0.3))
    spec = {"format_version": 1, "model": {"path": str(root / "model")},
            "transcoders": {"path": str(root / "transcoders")},
            "prompt": {"tokens": PROMPT}, "targets": [{"logit_diff": [3, 4]}],
            "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
            "queries": [{"scores": {}}, {"influence": {"top_k": 5}}, {"top_paths": {"source": {"kind": "embedding"}, "k": 3}}],
            "validate": [{"predicted_vs_actual": {"k": 3}}],
            "steer": [{"name": "off", "interventions": [{"nodes": {"kind": "feature", "position": -1}, "mode": "zero"}],
                       "generate": {"max_new_tokens": 2}}],
            "export": {"json": str(tmp / "g.json"), "graph": str(tmp / "g.npz")}}
    result = circuitgraph.run(spec)
    return result, tmp / "g.json", tmp / "g.npz"


def test_every_graph_file_of_a_run_validates_and_round_trips(run_files):
    result, json_path, npz_path = run_files
    doc = json.loads(json_path.read_text())
    assert doc["queries"] and doc["validation"] and doc["steering"]
    _schema_validator().validate(doc)
    model = validate_graph_file(json_path.read_text())
    assert isinstance(model, GraphFile) and len(model.edges) == result.graph.n_edges
    with np.load(npz_path, allow_pickle=False) as archive:
        header = json.loads(archive["header"].tobytes().decode())
    _schema_validator(BinaryGraphHeader).validate(header)
    for read in (read_graph_json(json_path), read_graph_binary(npz_path)):
        g = read.graph
        assert g.node_ids() == result.graph.node_ids() and g.nodes == result.graph.nodes
        assert (g.edge_weight == result.graph.edge_weight).all() and g.edge_weight.dtype == result.graph.edge_weight.dtype
        assert (g.edge_source == result.graph.edge_source).all() and (g.edge_target == result.graph.edge_target).all()
        assert g.targets == result.graph.targets and g.metadata == doc["metadata"]
        assert read.queries == doc["queries"] and read.validation == doc["validation"]
        assert read.steering == doc["steering"]
        # writing the read graph back gives the same bytes
        assert graph_to_json(g, queries=read.queries, validation=read.validation,
                             steering=read.steering) == json_path.read_text()


def test_explorer_subgraph_download_validates(run_files):
    """The explorer's saved subgraph is the JSON writer's output (serve/api.py)."""
    result, _, _ = run_files
    sub = result.graph.subgraph(result.graph.node_ids()[: max(2, result.graph.n_nodes // 2)])
    sub.metadata.set_explorer(source="g", node_threshold=0.5, edge_threshold=0.9, top_k_nodes=None, pinned=[],
                              supernodes={})
    text = graph_to_json(sub)
    _schema_validator().validate(json.loads(text))
    assert read_graph_json(text).graph.n_edges == sub.n_edges


def _old_file() -> dict:
    """A version-1 file as an earlier release wrote it: no steering, edge_dtype, targets, queries,
    validation or metadata, nodes without label and attrs."""
    return {"format": "circuitgraph.graph", "format_version": 1,
            "nodes": [{"id": "embedding/-1/0/7", "kind": "embedding", "layer": -1, "position": 0, "index": 7,
                       "activation": 1.0},
                      {"id": "logit/1/0/5", "kind": "logit", "layer": 1, "position": 0, "index": 5,
                       "activation": 2, "pre_activation": 2.0, "constant": 0.5}],
            "edges": [{"source": "embedding/-1/0/7", "target": "logit/1/0/5", "weight": 1.5}]}


def test_files_of_earlier_releases_still_read():
    read = read_graph_json(json.dumps(_old_file()))
    g = read.graph
    assert g.n_edges == 1 and g.edge_weight.dtype == np.float32 and g.targets == [] and g.metadata == {}
    assert read.queries == read.validation == read.steering == [] and read.format_version == 1
    assert g.nodes[0].label == "" and g.nodes[0].attrs == {} and g.nodes[1].activation == 2.0
    assert g.check_completeness().max_violation == 0.0
    # the schema describes what the writer writes: the old file lacks required fields
    assert {e.validator for e in _schema_validator().iter_errors(_old_file())} == {"required"}


def test_a_newer_format_version_is_refused():
    with pytest.raises(LoadError, match="format_version: format_version 3: this circuitgraph reads up to 2: "
                                        "upgrade circuitgraph"):
        read_graph_json(json.dumps({**_old_file(), "format_version": 3}))


def test_errors_name_the_file_and_the_field(tmp_path):
    doc = _old_file()
    doc["edges"][0]["weight"] = "1.5"
    doc["nodes"][1]["attrs"] = {"score": [0.5, float("nan")]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(LoadError) as info:
        circuitgraph.load_graph(path)
    text = str(info.value)
    assert "\n" not in text and repr(str(path)) in text
    assert "nodes[1].attrs['score'][1] is nan" in text and "(and 1 more problem)" in text
    doc["nodes"][1]["attrs"] = {}
    path.write_text(json.dumps(doc))
    with pytest.raises(LoadError, match=r"edges\[0\]\.weight: expected a number, got '1.5'$"):
        circuitgraph.load_graph(path)
    del doc["nodes"][0]["kind"]
    with pytest.raises(LoadError, match=r"^graph file: nodes\[0\]\.kind: missing"):
        read_graph_json(json.dumps(doc))


def test_the_npz_header_is_read_through_the_model(tmp_path):
    g = AttributionGraph([Node(NodeId("embedding", -1, 0, 7), 1.0)], [], [], np.zeros(0, np.float32))
    save_graph_binary(g, tmp_path / "g.npz")
    arrays = dict(np.load(tmp_path / "g.npz"))
    header = json.loads(arrays["header"].tobytes())
    header["nodes"][0]["layer"] = "x"
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(LoadError, match=r"bad\.npz' \(its header\): nodes\[0\]\.layer: expected an integer"):
        read_graph_binary(tmp_path / "bad.npz")
    header["format"] = "circuitgraph.graph"  # a JSON file's format in an .npz
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(LoadError, match="expected 'circuitgraph.graph.npz'"):
        read_graph_binary(tmp_path / "bad.npz")


def test_the_schema_is_the_models():
    assert graph_json_schema()["properties"] == GraphFile.model_json_schema()["properties"]
    assert json.loads(Path(SCHEMA_PATH).read_text())["$defs"] == GraphFile.model_json_schema()["$defs"]


def test_graph_metadata_is_the_json_object_with_typed_attributes(run_files):
    result, json_path, _ = run_files
    for g in (result.graph, result.full_graph, read_graph_json(json_path).graph):
        m = g.metadata
        assert isinstance(m, GraphMetadata) and isinstance(m, dict)
        assert m.n_layers == 2 == m["model"]["n_layers"] == m["n_layers"] == g.model_n_layers
        assert m.prompt_tokens == PROMPT and m.model_name == m["model"]["name"]
        assert m.completeness is m["completeness"] and m.spec == m["spec"]
    assert result.graph.metadata.replacement_score == result.full_graph.metadata["replacement_score"]
    # a hand-built graph: a plain dict is wrapped; absent or mistyped fields read as None
    g = AttributionGraph([Node(NodeId("embedding", -1, 0, 7), 1.0)], [], [], np.zeros(0, np.float32),
                         metadata={"model": {"n_layers": True, "name": 3}, "prompt": ["x"]})
    assert isinstance(g.metadata, GraphMetadata)
    assert (g.metadata.n_layers, g.metadata.model_name, g.metadata.prompt, g.metadata.d_vocab) == (None,) * 4
    assert json.loads(graph_to_json(g))["metadata"] == {"model": {"n_layers": True, "name": 3}, "prompt": ["x"]}


def test_a_run_writes_only_declared_metadata_keys(run_files):
    """Every top-level metadata key a run writes (on its graphs and in its files) is declared once,
    in METADATA_KEYS, and the run writes the engine's, the scores' and pruning's keys."""
    result, json_path, npz_path = run_files
    metas = {"full graph": result.full_graph.metadata, "pruned graph": result.graph.metadata,
             "json file": json.loads(json_path.read_text())["metadata"],
             "npz file": read_graph_binary(npz_path).graph.metadata}
    for where, meta in metas.items():
        undeclared = sorted(set(meta) - set(METADATA_KEYS))
        assert not undeclared, f"{where} carries undeclared metadata keys {undeclared}"
    run_keys = {f.name for f in dataclasses.fields(RunMetadata)} | {"n_layers"}
    engine_keys = {"completeness", "dtype", "replacement_score", "completeness_score"}
    assert run_keys | engine_keys <= set(result.full_graph.metadata)
    assert "pruning" in result.graph.metadata and "pruning" not in result.full_graph.metadata
    assert result.graph.metadata.pruning is not None and result.graph.metadata.dtype == "float32"
    assert not set(METADATA_KEYS) & set(FOREIGN_KEYS)


def test_other_tools_metadata_keys_round_trip(tmp_path):
    """Keys circuitgraph does not declare (another tool's file) are kept as they are, in both formats;
    the foreign keys circuitgraph reads have typed readers."""
    meta = {"their_tool": {"run": 3, "notes": ["a", None]}, "checks": {"their check": {"ok": True}},
            "source_urls": ["https://example.org/tc"], "prompt": "x"}
    g = AttributionGraph([Node(NodeId("embedding", -1, 0, 7), 1.0)], [], [], np.zeros(0, np.float32),
                         metadata=json.loads(json.dumps(meta)))
    assert g.metadata.checks == meta["checks"] and g.metadata.source_urls == meta["source_urls"]
    assert read_graph_json(graph_to_json(g)).graph.metadata == meta
    save_graph_binary(g, tmp_path / "g.npz")
    assert read_graph_binary(tmp_path / "g.npz").graph.metadata == meta


def test_metadata_writers_refuse_an_undeclared_key():
    m = GraphMetadata()
    with pytest.raises(KeyError, match="not declared"):
        m._set("graph_dtype", "float32")
    with pytest.raises(KeyError, match="not declared"):
        m._get("graph_dtype")
    m.set_dtype("float64")
    assert m == {"dtype": "float64"} and m.dtype == "float64"


#: a metadata key written by hand: an item assignment, a dict method that writes, or a dict literal
#: given as a graph's metadata
_HAND_WRITTEN = re.compile(r"\bmeta(?:data)?\s*\[[^\]]*\]\s*=[^=]"
                           r"|\bmeta(?:data)?\.(?:setdefault|update|pop|popitem|clear|__setitem__)\("
                           r"|\bmetadata\s*=\s*\{")


def test_no_module_writes_a_metadata_key_by_hand():
    """graph/metadata.py holds the one writer of every key (its setters and RunMetadata): no other
    module of the package writes graph.metadata by key."""
    package = Path(circuitgraph.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "graph" / "metadata.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _HAND_WRITTEN.search(line.split("#")[0]):
                found.append(f"{path.relative_to(package)}:{n}: {line.strip()}")
    assert not found, "metadata written by key outside graph/metadata.py:\n" + "\n".join(found)
