"""Hand-edited or hostile graph files: ``load_graph`` and ``circuitgraph render`` answer with a
LoadError (one line, exit 2) or a valid graph; never a traceback, NaN, or an unbounded read.

Includes a property-based fuzz test (hypothesis) that mutates a valid graph document.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from circuitgraph.cli.main import app
from circuitgraph.errors import CircuitGraphError, LoadError
from circuitgraph.export.json_graph import graph_from_dict, graph_to_dict
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId
from tests.helpers.fuzz import document_paths, edited


def _small_graph() -> AttributionGraph:
    nodes = [
        Node(NodeId("embedding", -1, 0, 7), 1.0, label="tok"),
        Node(NodeId("feature", 0, 0, 3), 0.5, pre_activation=0.7, constant=0.1),
        Node(NodeId("error", 0, 0, 0), 1.0),
        Node(NodeId("logit", 2, 0, 5), 1.5, pre_activation=1.5, constant=0.2),
    ]
    return AttributionGraph(nodes, edge_target=[1, 3, 3], edge_source=[0, 1, 2],
                            edge_weight=np.array([0.6, 1.0, 0.3], dtype=np.float32),
                            targets=[(nodes[3].id, 1.0)], metadata={"n_layers": 2})


VALID = graph_to_dict(_small_graph())


def _edited(path: tuple, value) -> dict:
    doc = copy.deepcopy(VALID)
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


#: (case, document) - each a class of hand edit found by probing
BAD_DOCS = [
    ("weight NaN", _edited(("edges", 0, "weight"), float("nan"))),
    ("weight inf", _edited(("edges", 0, "weight"), float("inf"))),
    ("weight string", _edited(("edges", 0, "weight"), "0.5")),
    ("weight bool", _edited(("edges", 0, "weight"), True)),
    ("weight huge int", _edited(("edges", 0, "weight"), 10**400)),
    ("edge source a list", _edited(("edges", 0, "source"), ["feature/0/0/3"])),
    ("edge source a dict", _edited(("edges", 0, "source"), {"a": 1})),
    ("edge unknown node", _edited(("edges", 0, "source"), "feature/9/9/9")),
    ("edges a dict", _edited(("edges",), {"a": 1})),
    ("layer a string", _edited(("nodes", 1, "layer"), "0")),
    ("layer a float", _edited(("nodes", 1, "layer"), 0.0)),
    ("layer a bool", _edited(("nodes", 1, "layer"), False)),
    ("layer huge", _edited(("nodes", 1, "layer"), 10**30)),
    ("kind unknown", _edited(("nodes", 1, "kind"), "banana")),
    ("kind a list", _edited(("nodes", 1, "kind"), ["feature"])),
    ("activation NaN", _edited(("nodes", 1, "activation"), float("nan"))),
    ("activation string", _edited(("nodes", 1, "activation"), "nan")),
    ("pre_activation inf", _edited(("nodes", 1, "pre_activation"), float("-inf"))),
    ("label a number", _edited(("nodes", 1, "label"), 5)),
    ("attrs a list", _edited(("nodes", 1, "attrs"), [1])),
    ("id mismatch", _edited(("nodes", 1, "id"), "feature/0/0/4")),
    ("id a dict", _edited(("nodes", 1, "id"), {})),
    ("node a string", _edited(("nodes", 1), "feature/0/0/3")),
    ("target weight NaN", _edited(("targets", 0, "weight"), float("nan"))),
    ("target node a list", _edited(("targets", 0, "node"), [1])),
    ("targets a string", _edited(("targets",), "logit/2/0/5")),
    ("queries a string", _edited(("queries",), "abc")),
    ("validation a dict", _edited(("validation",), {"a": 1})),
    ("metadata a list", _edited(("metadata",), [1])),
    ("format_version true", _edited(("format_version",), True)),
    ("format_version 1.0", _edited(("format_version",), 1.0)),
    ("format a list", _edited(("format",), ["circuitgraph.graph"])),
    ("edge_dtype a list", _edited(("edge_dtype",), ["float32"])),
    ("edge_dtype object", _edited(("edge_dtype",), "object")),
]


def test_valid_document_loads():
    graph = graph_from_dict(VALID).graph
    assert graph.n_nodes == 4 and graph.n_edges == 3


@pytest.mark.parametrize("case,doc", BAD_DOCS, ids=[c[0] for c in BAD_DOCS])
def test_hand_edited_graph_is_a_load_error(tmp_path, case, doc):
    with pytest.raises(LoadError):
        graph_from_dict(doc)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))  # NaN/Infinity are written as the non-JSON tokens
    import circuitgraph

    with pytest.raises(LoadError):
        circuitgraph.load_graph(str(path))
    res = CliRunner().invoke(app, ["render", str(path), "-o", str(tmp_path / "g.svg")])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and res.output.startswith("error: ")
    assert not (tmp_path / "g.svg").exists()


@pytest.mark.parametrize("text", ["", "nul\x00", "[1, 2]", "{", "[" * 100_000, '{"format": NaN}', "\udc80"])
def test_garbage_graph_text(tmp_path, text):
    path = tmp_path / "g.json"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    res = CliRunner().invoke(app, ["render", str(path), "-o", str(tmp_path / "g.svg")])
    assert res.exit_code == 2 and res.output.startswith("error: "), res.output


def test_render_refuses_non_regular_files(tmp_path):
    res = CliRunner().invoke(app, ["render", str(tmp_path), "-o", str(tmp_path / "g.svg")])
    assert res.exit_code == 2 and "not a regular file" in res.output
    if os.path.exists("/dev/zero"):  # a device would be read forever
        res = CliRunner().invoke(app, ["render", "/dev/zero", "-o", str(tmp_path / "g.svg")])
        assert res.exit_code == 2 and "not a regular file" in res.output
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    res = CliRunner().invoke(app, ["render", str(fifo), "-o", str(tmp_path / "g.svg")])
    assert res.exit_code == 2 and "not a regular file" in res.output


def test_graph_file_size_is_capped(tmp_path):
    from circuitgraph.export.json_graph import check_graph_file

    path = tmp_path / "g.json"
    path.write_text(json.dumps(VALID))
    check_graph_file(path)
    with pytest.raises(LoadError, match="more than"):
        check_graph_file(path, max_bytes=10)


def test_binary_graph_refuses_nan(tmp_path):
    from circuitgraph.export import load_graph_binary, save_graph_binary

    g = _small_graph()
    save_graph_binary(g, tmp_path / "g.npz")
    assert load_graph_binary(tmp_path / "g.npz").n_edges == 3
    arrays = dict(np.load(tmp_path / "g.npz"))
    arrays["edge_weight"] = arrays["edge_weight"].copy()
    arrays["edge_weight"][0] = np.nan
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(LoadError, match="NaN"):
        load_graph_binary(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04" + os.urandom(200))
    with pytest.raises(LoadError):
        load_graph_binary(tmp_path / "junk.npz")


# --------------------------------------------------------------------------- fuzz

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


ALL_PATHS = [p for p in document_paths(VALID) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.sampled_from(ALL_PATHS), JSON_VALUES, st.booleans()), min_size=1, max_size=3))
def test_fuzzed_graph_documents_load_or_fail_cleanly(edits):
    doc = edited(VALID, edits)
    try:
        graph = graph_from_dict(doc).graph
    except CircuitGraphError as exc:
        assert "\n" not in str(exc)
        return
    # a document that loads is a valid graph: finite numbers, known nodes, and it draws
    assert np.isfinite(graph.edge_weight).all()
    assert all(np.isfinite(n.activation) for n in graph.nodes)
    assert all(t in graph for t, _ in graph.targets)
    graph.to_dot()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(ALL_PATHS), JSON_VALUES, st.booleans()), min_size=1, max_size=2))
def test_fuzzed_graph_files_through_render(tmp_path, edits):
    """The same mutations through `circuitgraph render`: exit 0 with a diagram, or exit 2 with one line."""
    doc = edited(VALID, edits)
    graph_file = tmp_path / "g.json"
    graph_file.write_text(json.dumps(doc))
    out = tmp_path / "g.svg"
    if out.exists():
        out.unlink()
    res = CliRunner().invoke(app, ["render", str(graph_file), "-o", str(out)])
    if res.exit_code == 0:
        assert out.is_file()
    else:
        assert res.exit_code == 2, (res.output, repr(res.exception))
        assert len(res.output.strip().splitlines()) == 1 and res.output.startswith("error: ")


def test_is_graph_file_tells_graph_files_from_specs_and_other_json(tmp_path):
    """The one sniffer (export/graph_files.py, used by the CLI and the explorer's catalog): by the
    name and the first bytes, whichever order the keys are in."""
    from circuitgraph.export.graph_files import is_graph_file
    from circuitgraph.export.json_graph import graph_to_json

    graph = _small_graph()
    cases = {
        "written.json": (graph_to_json(graph), True),  # the writer's sorted keys: edge_dtype first
        "unsorted.JSON": (json.dumps(graph_to_dict(graph), indent=2), True),  # format first
        "spec.json": (json.dumps({"format_version": 1, "model": {"builtin": "demo"}, "format": "x"}), False),
        "other.json": (json.dumps({"nodes": [], "edges": [], "format": "circuit-tracer"}), False),
        "spec.yaml": ("format: circuitgraph.graph\n", False),
        "empty.json": ("", False),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        assert is_graph_file(tmp_path / name) is expected, name
    (tmp_path / "any.NPZ").write_bytes(b"")
    (tmp_path / "folder.json").mkdir()
    assert is_graph_file(tmp_path / "any.NPZ") and not is_graph_file(tmp_path / "folder.json")
    assert not is_graph_file(tmp_path / "missing.json")


def test_stored_entries_are_read_by_one_typed_reader():
    """_results.stored_entry / stored_results: the reader of a graph file's result lists (the export
    writers' qk results, the report, steering and the explorer)."""
    from circuitgraph._results import ResultEntry, stored_entry, stored_results

    qk = {"heads": [{"layer": 1}]}
    items = [{"kind": "qk", "params": {}, "on": "full", "status": "ok", "error": None, "result": qk},
             {"kind": "qk", "status": "failed", "error": "boom", "result": None},
             {"kind": "influence", "result": {"heads": []}},
             "not an entry", None,
             {"kind": "qk", "result": {"heads": []}}]
    assert stored_results(items, "qk") == [qk, {"heads": []}]
    assert stored_results(items, "influence") == [{"heads": []}]
    failed = stored_entry(items[1])
    assert isinstance(failed, ResultEntry) and (failed.kind, failed.status, failed.error, failed.ok) == (
        "qk", "failed", "boom", False)
    bare = stored_entry({"result": [1]})
    assert bare is not None and (bare.kind, bare.status, bare.on, bare.params, bare.result) == ("", "ok", "full", {}, [1])
    assert stored_entry("x") is None and stored_entry(None) is None
