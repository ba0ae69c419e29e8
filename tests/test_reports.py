"""Reports people read: the one-file HTML report (rendered in headless Chromium), notebook display,
networkx round trip, data frames of every query result, and paper diagrams (labels, supernodes,
hidden unreachable nodes, legend, large graphs without overlaps)."""

from __future__ import annotations

import functools
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from typer.testing import CliRunner

from circuitgraph.cli.main import app
from circuitgraph.errors import ExportError
from circuitgraph.export.dot import graph_to_dot, merge_supernodes, propose_supernodes, reaches_a_target
from circuitgraph.export.html import report_html
from circuitgraph.export.labels import load_feature_labels
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.queries import QueryResult, run_query
from circuitgraph.testing.browser import run_chromium
from tests.helpers.graphs import attributed, spec_items
from tests.helpers.neuronpedia import fixture_spec
from tests.helpers.peers import browser_or_skip

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot binary not installed")


@functools.cache
def report_run():
    """A run with queries and a validation check with controls (tiny fixture, fast)."""
    from circuitgraph import run

    spec = fixture_spec(
        "example-gpt2",
        queries=[{"scores": {}}, {"influence": {"top_k": 5}}, {"top_paths": {"source": {"kind": "embedding"}, "k": 3}}],
        validate=[{"ablate": {"nodes": "top_nodes", "k": 3, "controls": ["matched_magnitude"], "n_controls": 8}},
                  {"patching": {"corrupted": {"tokens": [1, 36, 37, 23, 55, 35, 37, 20, 36, 31]},
                                "granularity": ["layer"]}}],
    )
    return run(spec)




# ------------------------------------------------------------------ the HTML report
@needs_dot
def test_report_renders_in_chromium_with_diagram_and_tables(tmp_path):
    browser_or_skip()
    from PIL import Image, ImageStat

    result = report_run()
    path = Path(result.report(tmp_path / "report.html"))
    text = path.read_text(encoding="utf-8")
    # self-contained: nothing is fetched from the network
    assert not re.search(r"""(src|href)=["']https?://""", text)
    dom = run_chromium(path.as_uri(), dump_dom=True)
    for heading in ("Diagram", "Model and dictionaries", "Scores", "Exactness checks", "Queries", "Validation", "Spec"):
        assert f">{heading}</h2>" in dom, heading
    assert "query 0: scores" in dom and "query 2: top_paths" in dom and "validation 0: ablate" in dom
    assert dom.count('class="node"') >= 10  # the inline SVG diagram's nodes
    assert "influence" in dom and "activation" in dom  # node tooltips (hover)
    assert "tiny-gpt2-s100" in dom and "replacement_score" in dom
    assert 'alt="control distribution' in dom and 'alt="validation 1: patching heat map"' in dom  # inline images
    assert dom.count("data:image/png;base64,") >= 2
    shot = tmp_path / "report.png"
    run_chromium(path.as_uri(), screenshot=shot, window=(1280, 1600))
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 1600)
    top = image.crop((0, 0, 1280, 800))
    assert ImageStat.Stat(top).stddev[0] > 10  # text and the diagram, not a blank page
    # the diagram is drawn in colour near the top (node fills), not only text
    rgb = Image.open(shot).convert("RGB").crop((0, 0, 1280, 800))
    colours = {px for px in rgb.getdata() if max(px) - min(px) > 40}
    assert len(colours) > 20


@needs_dot
def test_report_command_from_a_graph_file_and_bad_output(tmp_path):
    result = report_run()
    graph_path = tmp_path / "g.json"
    result.graph.to_json(graph_path, queries=result.queries_json(), validation=result.validation_json())
    runner = CliRunner()
    out = tmp_path / "r.html"
    done = runner.invoke(app, ["report", str(graph_path), "-o", str(out)])
    assert done.exit_code == 0, done.output
    html = out.read_text(encoding="utf-8")
    assert "query 1: influence" in html and "<svg" in html and "validation 0: ablate" in html
    bad = runner.invoke(app, ["report", str(graph_path), "-o", str(tmp_path / "r.txt")])
    assert bad.exit_code == 2 and "should end in .html" in bad.output and not (tmp_path / "r.txt").exists()
    missing = runner.invoke(app, ["report", str(tmp_path / "nope.json"), "-o", str(tmp_path / "x.html")])
    assert missing.exit_code == 2 and not (tmp_path / "x.html").exists()


@needs_dot
def test_report_command_from_a_spec(tmp_path):
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(fixture_spec("example-gpt2", queries=[{"scores": {}}])))
    out = tmp_path / "r.html"
    done = CliRunner().invoke(app, ["report", str(spec), "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert "query 0: scores" in out.read_text(encoding="utf-8")


@needs_dot
def test_export_html_in_the_spec(tmp_path):
    from circuitgraph import run

    out = tmp_path / "report.html"
    result = run(fixture_spec("example-gpt2", export={"html": str(out)}, queries=[{"scores": {}}]))
    assert result.exports["html"] == out and "<svg" in out.read_text(encoding="utf-8")


# ------------------------------------------------------------------ notebooks
def test_reprs_are_one_short_line_and_html_displays():
    result = report_run()
    for obj in (result, result.graph, result.full_graph, *(q["result"] for q in result.queries),
                *(v["result"] for v in result.validation if hasattr(v["result"], "records"))):
        text = repr(obj)
        assert "\n" not in text and len(text) < 200, text
    assert repr(result.graph).startswith("<AttributionGraph (tiny-gpt2-s100)")
    html = result._repr_html_()
    assert "<table" in html and "query scores" in html
    for q in result.queries:
        assert "<table" in q["result"]._repr_html_()
    if shutil.which("dot"):
        assert result.graph._repr_svg_().startswith("<svg")
        assert "<svg" in result.graph._repr_html_()


def test_to_json_returns_the_path(tmp_path):
    result = report_run()
    g = result.graph
    path = tmp_path / "g.json"
    assert g.to_json(path) == str(path) and path.is_file()
    assert g.to_json().startswith("{")
    assert result.to_json(tmp_path / "run.json") == str(tmp_path / "run.json")
    assert len(json.loads((tmp_path / "run.json").read_text())["queries"]) == 3
    q = result.queries[0]["result"]
    assert q.to_json(tmp_path / "q.json") == str(tmp_path / "q.json")
    assert json.loads((tmp_path / "q.json").read_text()) == json.loads(q.to_json())


def test_every_query_result_has_a_dataframe():
    pd = pytest.importorskip("pandas", reason="pandas (the notebook extra) is not installed")
    g = attributed("ln-gelu", "transcoders")
    for item in spec_items(g):
        res = run_query(g, item)
        assert isinstance(res, QueryResult)
        frame = res.to_dataframe()
        assert isinstance(frame, pd.DataFrame) and len(frame) >= 1, item.kind
        assert len(frame) == len(res.records())
    paths = run_query(g, spec_items(g)[0])
    frame = paths.to_dataframe()
    assert {"contribution", "nodes"} <= set(frame.columns) and len(frame) == len(paths.to_dict()["paths"])


def test_networkx_round_trip_keeps_every_attribute():
    g = report_run().full_graph
    d = g.to_networkx()
    assert isinstance(d, nx.DiGraph) and d.number_of_nodes() == g.n_nodes
    some = next(n for n in g.nodes if n.kind == "feature")
    data = d.nodes[str(some.id)]
    assert data["activation"] == some.activation and data["pre_activation"] == some.pre_activation
    assert data["kind"] == "feature" and data["layer"] == some.layer and data["attrs"] == some.attrs
    assert all(isinstance(k, str) for k in d.nodes)
    # networkx algorithms work on it
    target = str(g.target_ids[0])
    assert nx.is_directed_acyclic_graph(d) and nx.ancestors(d, target)
    back = AttributionGraph.from_networkx(d)
    assert [n.id for n in back.nodes] == [n.id for n in g.nodes]
    assert back.nodes == g.nodes and back.targets == g.targets
    assert np.allclose(back.dense_adjacency(), g.dense_adjacency())
    assert back.check_completeness().ok()


# ------------------------------------------------------------------ diagrams for a paper
def test_labels_files(tmp_path):
    (tmp_path / "l.csv").write_text("layer,index,label\n0,3,says owl\n1,7,an-ness\n")
    assert load_feature_labels(tmp_path / "l.csv") == {(0, 3): "says owl", (1, 7): "an-ness"}
    np_style = [{"modelId": "gpt2-small", "layer": "6-res-jb", "index": "123", "description": "cats"}]
    (tmp_path / "np.json").write_text(json.dumps(np_style))
    assert load_feature_labels(tmp_path / "np.json") == {(6, 123): "cats"}
    (tmp_path / "bad.csv").write_text("layer,index,label\nx,3,oops\n")
    with pytest.raises(ExportError, match="row 1"):
        load_feature_labels(tmp_path / "bad.csv")
    (tmp_path / "latin1.csv").write_bytes("layer,index,label\n0,3,caf\xe9\n".encode("latin-1"))
    with pytest.raises(ExportError, match=r"latin1\.csv is not UTF-8 text"):  # one line naming the file
        load_feature_labels(tmp_path / "latin1.csv")


def test_diagram_labels_activations_axis_and_legend():
    g = report_run().graph
    feature = next(n for n in g.nodes if n.kind == "feature")
    dot = graph_to_dot(g, labels={(feature.layer, feature.index): "a described feature"})
    assert "a described feature" in dot
    assert f"a={feature.activation:.3g}" in dot  # activation on feature nodes
    assert '"axis layer 0"' in dot and "label=Emb" in dot and "label=Out" in dot  # the layer axis
    assert "edge width = |weight|" in dot  # the width scale in the legend
    assert "influence" in dot  # hover text


def _graph_with_a_dead_end() -> AttributionGraph:
    ids = [NodeId("embedding", -1, 0, 1), NodeId("feature", 0, 0, 1), NodeId("feature", 0, 0, 2),
           NodeId("logit", 1, 0, 5)]
    nodes = [Node(i, 1.0) for i in ids]
    # feature 2 reads the embedding but writes to nothing: no path to the target
    return AttributionGraph(nodes, [1, 2, 3], [0, 0, 1], np.array([1.0, 0.5, 2.0]), targets=[(ids[3], 1.0)])


def test_nodes_without_a_path_to_a_target_are_hidden_by_default():
    g = _graph_with_a_dead_end()
    assert reaches_a_target(g).tolist() == [True, True, False, True]
    assert "feature/0/0/2" not in graph_to_dot(g) and "1 node with no path to a target" in graph_to_dot(g)
    assert "feature/0/0/2" in graph_to_dot(g, show_unreachable=True)


def test_supernodes_named_and_proposed():
    g = report_run().full_graph
    layer0 = {"kind": "feature", "layer": 0}
    merged = merge_supernodes(g, {"early features": layer0})
    members = [n for n in g.nodes if n.kind == "feature" and n.layer == 0]
    assert merged.n_nodes == g.n_nodes - len(members) + 1
    box = next(n for n in merged.nodes if n.attrs.get("supernode") == "early features")
    # summed edges: the box's edges into each target equal the members' edges summed
    for t, _ in g.targets:
        expected = sum(g.edge_weight_between(m.id, t) for m in members)
        assert merged.edge_weight_between(box.id, t) == pytest.approx(expected)
    dot = graph_to_dot(g, supernodes={"early features": layer0}, max_nodes=None)
    assert "early features" in dot and f"({len(members)} nodes)" in dot
    proposed = propose_supernodes(g)
    assert proposed and all(len(v) >= 2 for v in proposed.values())
    assert "group" in graph_to_dot(g, supernodes="auto")
    with pytest.raises(ExportError, match="both supernodes"):
        merge_supernodes(g, {"a": layer0, "b": {"kind": "feature"}})


def _random_layered_graph(n_per_layer: int = 60, n_layers: int = 5, seed: int = 0) -> AttributionGraph:
    rng = np.random.default_rng(seed)
    nodes = [Node(NodeId("embedding", -1, p, 100 + p), 1.0) for p in range(8)]
    for layer in range(n_layers):
        nodes += [Node(NodeId("feature", layer, int(rng.integers(8)), i), float(rng.random())) for i in range(n_per_layer)]
    logit = NodeId("logit", n_layers, 7, 9)
    nodes.append(Node(logit, 1.0))
    src, tgt = [], []
    for t, node in enumerate(nodes):
        if node.kind == "embedding":
            continue
        earlier = [s for s, m in enumerate(nodes) if m.layer < node.layer]
        for s in rng.choice(earlier, size=min(3, len(earlier)), replace=False):
            src.append(int(s))
            tgt.append(t)
    return AttributionGraph(nodes, tgt, src, rng.standard_normal(len(src)), targets=[(logit, 1.0)])


@needs_dot
def test_hundreds_of_nodes_are_laid_out_without_overlaps():
    from circuitgraph.export.render import render_dot_bytes

    g = _random_layered_graph()
    dot = graph_to_dot(g, max_nodes=None, show_unreachable=True)
    svg = render_dot_bytes(dot, "svg").decode("utf-8")
    root = ET.fromstring(svg)
    ns = {"s": "http://www.w3.org/2000/svg"}
    boxes = []
    for group in root.iter("{http://www.w3.org/2000/svg}g"):
        if group.get("class") != "node":
            continue
        title = group.find("s:title", ns).text
        if not title or "/" not in title:  # legend and axis entries
            continue
        shape = next(el for el in group.iter() if el.tag.endswith(("}path", "}polygon")))
        coords = [float(x) for x in re.findall(r"-?\d+\.?\d*", shape.get("d") or shape.get("points"))]
        xs, ys = coords[0::2], coords[1::2]
        boxes.append((min(xs), min(ys), max(xs), max(ys)))
    assert len(boxes) == g.n_nodes >= 300
    boxes.sort()
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if b[0] >= a[2]:
                break
            overlap_x = min(a[2], b[2]) - max(a[0], b[0])
            overlap_y = min(a[3], b[3]) - max(a[1], b[1])
            assert overlap_x <= 0.5 or overlap_y <= 0.5, (a, b)


def test_report_html_of_a_graph_without_results():
    g = _graph_with_a_dead_end()
    html = report_html(g)
    assert "(no query in this run)" in html and "Exactness checks" in html
