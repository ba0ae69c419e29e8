"""Reports and outputs a reader can trust (issue 20): the HTML report says a result's summary
once and lists its rows, with images inline and no local paths; ``report`` writes only the
report; notebook diagrams fit their cell; every result has records() and to_dataframe();
diagram headers count and pluralise right, targets are quoted, supernode boxes list their
members, labels are cut at words, position-free aggregates show no position; ``render`` of a
Neuronpedia file says what it is."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import circuitgraph
from circuitgraph._results import Tabular
from circuitgraph.cli.main import app
from circuitgraph.export.dot import graph_to_dot
from circuitgraph.export.html import report_html
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot binary not installed")
PROMPT = "mia saw the owl . later she wants"
CORRUPTED = "mia saw the dog . later she wants"


def _spec(tmp: Path, **extra) -> dict:
    spec = {"format_version": 1, "model": {"builtin": "demo"}, "transcoders": {"builtin": "demo"},
            "prompt": PROMPT, "targets": [{"logit_diff": [" an", " a"]}],
            "queries": [{"top_paths": {"source": {"kind": "embedding"}, "k": 3}}, {"influence": {"top_k": 5}},
                        {"congruence": {"tokens": " an", "top_k": 3}}, {"scores": None}],
            "validate": [{"patching": {"corrupted": CORRUPTED, "granularity": ["layer", "head"],
                                       "heatmap": str(tmp / "heat.png")}},
                         {"predicted_vs_actual": {"k": 4}},
                         {"ablate": {"k": 3, "controls": ["count_matched"], "n_controls": 3}},
                         {"faithfulness": {"mode": "zero"}},
                         {"replacement_fidelity": None}]}
    spec.update(extra)
    return spec


@functools.cache
def _run(tmp: str):
    return circuitgraph.run(_spec(Path(tmp)))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _run(str(tmp_path_factory.mktemp("run")))


def _block(html: str, title: str) -> str:
    start = html.index(f"<h3>{title}")
    end = html.find('<div class="cg-result">', start + 1)
    return html[start:end if end > 0 else len(html)]


def test_report_says_the_summary_once_and_lists_the_rows(run, tmp_path):
    html = report_html(run)
    patching = _block(html, "validation 0: patching")
    n_rows = len(run.validation[0]["result"].rows)
    assert n_rows > 5
    assert patching.count("recovery_everything") == 1, "the summary is said once, not in every row"
    assert patching.count("<tr>") >= n_rows and 'class="cg-table-wrap"' in patching
    pva = _block(html, "validation 1: predicted_vs_actual")
    assert pva.count("frozen_ok") == 1 and pva.count("<tr>") >= 4 + 1
    assert "data:image/png;base64," in html  # the heat map, inline
    assert str(tmp_path.anchor + "tmp") not in html and str(Path.home()) not in html
    heat = str(run.validation[0]["result"].heatmap)
    assert Path(heat).is_absolute() and heat not in html and "heat.png (drawn below)" in patching


def test_every_result_has_records_and_a_dataframe(run):
    pd = pytest.importorskip("pandas")
    entries = run.queries + run.validation
    assert all(e["status"] == "ok" for e in entries), [e["error"] for e in entries]
    kinds = set()
    for e in entries:
        result = e["result"]
        assert isinstance(result, Tabular), type(result)
        records = result.records()
        assert records and all(isinstance(r, dict) for r in records)
        frame = result.to_dataframe()
        assert isinstance(frame, pd.DataFrame) and len(frame) == len(records)
        assert "\n" not in repr(result) and len(repr(result)) < 120
        assert "<table" in result._repr_html_()
        kinds.add(type(result).__name__)
    assert {"PatchingResult", "PredictedVsActualResult", "AblationResult", "FaithfulnessResult",
            "ReplacementFidelityResult", "PathsResult"} <= kinds
    assert len(run.validation[1]["result"].records()) == 4  # one row per node


@needs_dot
def test_notebook_diagrams_fit_the_cell(run):
    html = run.graph._repr_html_()
    assert '<svg style="max-width:100%;height:auto"' in html and 'style="max-width:100%;overflow:auto"' in html


def test_report_writes_only_the_report(tmp_path):
    spec = _spec(tmp_path, export={"json": "out/g.json", "svg": "out/g.svg"}, queries=[],
                 validate=[{"patching": {"corrupted": CORRUPTED, "granularity": ["layer"], "heatmap": "out/h.png"}}])
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["report", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.html").is_file() and not (tmp_path / "out").exists()
    assert "only the report" in res.output and "json export" in res.output and "heat map" in res.output


def _dead_end_graph(**metadata) -> AttributionGraph:
    ids = [NodeId("embedding", -1, 0, 3), NodeId("feature", 0, 0, 1), NodeId("feature", 0, 0, 2),
           NodeId("target", 2, 0, 0)]
    nodes = [Node(ids[0], 1.0, attrs={"token_str": "a"}), Node(ids[1], 1.0, 1.0),
             Node(ids[2], 0.5, 0.5, label="a very long feature description that goes on and on"),
             Node(ids[3], 2.0, 2.0, label="' an' - ' a'")]
    return AttributionGraph(nodes, [1, 2, 3], [0, 0, 1], np.array([1.0, 0.5, 2.0]), targets=[(ids[3], 1.0)],
                            metadata=metadata)


def test_diagram_header_counts_against_the_whole_graph_and_pluralises():
    dot = graph_to_dot(_dead_end_graph())
    assert "showing 3 of 4 nodes and 2 of 3 edges" in dot  # was "3 of 3": counted after hiding
    assert "1 node with no path to a target not drawn" in dot and "1 edge left out" in dot
    assert "' an' - ' a'" in dot.replace("\\'", "'")


def test_labels_are_cut_at_a_word():
    dot = graph_to_dot(_dead_end_graph(), show_unreachable=True)
    (line,) = [ln for ln in dot.splitlines() if '"feature/0/0/2" [label=' in ln]
    label = line.split('label="')[1].split('"')[0]
    assert label.endswith("\\na very long feature…"), label  # was "...feature descri…"


def test_position_free_aggregate_shows_no_position():
    dot = graph_to_dot(_dead_end_graph(aggregate={"position": "free", "n_aggregated": 3}), show_unreachable=True)
    assert "@0" not in dot and "F1 L0 a=" in dot
    assert "@0" in graph_to_dot(_dead_end_graph(), show_unreachable=True)


def test_automatic_supernode_boxes_list_their_members():
    from tests.helpers.graphs import attributed

    g = attributed("ln-gelu")
    dot = graph_to_dot(g, supernodes="auto", max_nodes=None, show_unreachable=True)
    groups = circuitgraph.export.dot.propose_supernodes(g)
    assert groups
    members = sorted(next(iter(groups.values())), key=g.index_of)  # the box lists them in graph order
    first = g.node(members[0])
    caption = circuitgraph.export.dot.node_caption(first)
    assert f"({len(members)} nodes)" in dot and caption in dot
    assert "drawn inside supernode boxes" in dot


def test_render_of_a_neuronpedia_file_says_what_it_is(tmp_path):
    from circuitgraph.export.neuronpedia import graph_to_neuronpedia

    g = _dead_end_graph(prompt="a", prompt_tokens=[3], prompt_token_strs=["a"])
    path = tmp_path / "np.json"
    try:
        graph_to_neuronpedia(g, path)
    except Exception:  # noqa: BLE001 - a hand-made graph may lack what the exporter needs
        path.write_text(json.dumps({"metadata": {"slug": "x"}, "nodes": [], "links": [], "qParams": {}}))
    res = CliRunner().invoke(app, ["render", str(path), "-o", str(tmp_path / "x.svg")])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "Neuronpedia's format" in res.output and "export: {json: PATH.json}" in res.output
    assert not (tmp_path / "x.svg").exists()
