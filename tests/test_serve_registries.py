"""The explorer's page is built from circuitgraph's registries, not from lists written in it: the
"save pinned" links are the export kinds with ``explorer`` set (``GET /api/registries``), so a kind
registered with ``explorer`` and its download is offered, and saved, with no other edit; the page
(index.html, explorer.js) names no export kind, no link label and no node kind."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from pathlib import Path

import pytest

from circuitgraph.export.json_graph import graph_from_json
from circuitgraph.graph.nodes import NODE_KINDS
from circuitgraph.serve import running_server
from circuitgraph.serve.api import DOWNLOADS, VIEWS, SavedSubgraph, explorer_kinds
from circuitgraph.spec.export import EXPORT_KINDS, ExportKind
from circuitgraph.testing.explorer_fixture import demo_graph_file
from tests.helpers.serve import get_json, request

STATIC = Path(__file__).resolve().parents[1] / "circuitgraph" / "serve" / "static"
GRAPH = "demo/graph.json"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    demo_graph_file(root / "demo" / "graph.json")
    with running_server(root) as srv:
        yield srv


def _edges_csv(s: SavedSubgraph) -> tuple[bytes, str]:
    """An extra download for the test: the saved subgraph's edges as ``source,target,weight`` lines."""
    ids = [str(i) for i in s.sub.node_ids()]
    rows = ["source,target,weight"] + [f"{ids[a]},{ids[b]},{w!r}" for a, b, w in zip(
        s.sub.edge_source.tolist(), s.sub.edge_target.tolist(), s.sub.edge_weight.tolist(), strict=True)]
    return ("\n".join(rows) + "\n").encode(), "text/csv"


EXTRA = ExportKind("edges", (".csv",), kept_edge_bytes=64, explorer=".edges.csv", explorer_label="edge list CSV")


@pytest.fixture
def extra_kind(monkeypatch):
    """An export kind registered as a new one is: its record (with ``explorer``) and its download."""
    monkeypatch.setitem(EXPORT_KINDS, EXTRA.key, EXTRA)
    monkeypatch.setitem(DOWNLOADS, EXTRA.key, _edges_csv)
    return EXTRA


def _pinned(server) -> tuple[list[str], dict]:
    """Two nodes to pin: the ends of the default view's strongest edge into a feature; and that view."""
    view = get_json(server, f"/api/graph/{urllib.parse.quote(GRAPH, safe='')}")
    kinds = {v["id"]: v["kind"] for v in view["nodes"]}
    edge = max((e for e in view["edges"] if kinds[e["target"]] == "feature"), key=lambda e: abs(e["weight"]))
    return [edge["source"], edge["target"]], view


def _export(server, fmt: str, ids: list[str]) -> tuple[int, bytes, dict[str, str]]:
    query = urllib.parse.urlencode({"format": fmt, "nodes": ",".join(ids)})
    return request(server, f"/api/export/{urllib.parse.quote(GRAPH, safe='')}?{query}")


def test_registries_lists_the_kinds_the_explorer_offers(server):
    answer = get_json(server, "/api/registries")
    offered = [k for k in EXPORT_KINDS.values() if k.explorer is not None]
    assert answer["downloads"] == [{"format": k.key, "label": k.explorer_label, "suffix": k.explorer}
                                   for k in offered]
    assert [d["format"] for d in answer["downloads"]] == ["json", "svg", "neuronpedia"]  # the registry's order
    assert answer["node_kinds"] == list(NODE_KINDS)
    assert VIEWS["registries"].panel == "loadRegistries"
    code, body, _ = request(server, "/api/registries?format=json")
    assert code == 400 and "unknown parameter 'format'" in json.loads(body)["error"]


def test_a_kind_registered_with_explorer_is_listed_and_saved(server, extra_kind):
    listed = get_json(server, "/api/registries")["downloads"]
    assert listed[-1] == {"format": "edges", "label": "edge list CSV", "suffix": ".edges.csv"}
    assert [d["format"] for d in listed] == [k.key for k in explorer_kinds()] == ["json", "svg", "neuronpedia", "edges"]
    ids, view = _pinned(server)
    code, body, headers = _export(server, "edges", ids)
    assert code == 200, body[:300]
    assert headers["content-type"] == "text/csv"
    assert headers["content-disposition"] == 'attachment; filename="demo_graph.json-subgraph.edges.csv"'
    # the rows are the view's edges between the pinned nodes (read from /api/graph, not the writer's graph)
    lines = body.decode().splitlines()
    assert lines[0] == "source,target,weight"
    got = sorted((a, b, float(w)) for a, b, w in (line.split(",") for line in lines[1:]))
    want = sorted((e["source"], e["target"], e["weight"]) for e in view["edges"]
                  if e["source"] in ids and e["target"] in ids)
    assert got == want and want
    # the kinds offered before still save as they did
    code, body, _ = _export(server, "json", ids)
    assert code == 200 and sorted(str(i) for i in graph_from_json(body.decode()).node_ids()) == sorted(ids)


def test_a_kind_without_explorer_is_neither_listed_nor_saved(server, monkeypatch):
    # the dot kind is a run's output, not offered by the explorer
    assert EXPORT_KINDS["dot"].explorer is None
    assert "dot" not in [d["format"] for d in get_json(server, "/api/registries")["downloads"]]
    ids, _ = _pinned(server)
    code, body, _ = _export(server, "dot", ids)
    assert code == 400 and "format must be one of json, svg, neuronpedia, got 'dot'" in json.loads(body)["error"]
    # withdrawn from the explorer (its record without explorer), json is refused at once
    monkeypatch.setitem(EXPORT_KINDS, "json", dataclasses.replace(EXPORT_KINDS["json"], explorer=None,
                                                                  explorer_label=None))
    assert [d["format"] for d in get_json(server, "/api/registries")["downloads"]] == ["svg", "neuronpedia"]
    assert _export(server, "json", ids)[0] == 400


def test_an_explorer_suffix_needs_its_label():
    with pytest.raises(ValueError, match="explorer_label"):
        ExportKind("x", (".x",), kept_edge_bytes=8, explorer=".x")
    with pytest.raises(ValueError, match="explorer_label"):
        ExportKind("x", (".x",), kept_edge_bytes=8, explorer_label="X file")


def test_the_page_lists_no_export_kind_or_node_kind_by_hand():
    """index.html and explorer.js hold no export kind's key, link label or link id, and no list of
    node kinds: the page reads them from ``GET /api/registries``."""
    html = (STATIC / "index.html").read_text()
    script = (STATIC / "explorer.js").read_text()
    page = html + script
    for kind in EXPORT_KINDS.values():
        assert f"save-{kind.key}" not in page, f"the link save-{kind.key} is written in the page"
        if kind.explorer is None:  # keys such as "graph" or "html" are words of the page too
            continue
        for literal in (f'"{kind.key}"', f"'{kind.key}'", f"`{kind.key}`"):
            assert literal not in page, f"{literal} is written in the page"
        assert kind.explorer_label not in html, f"{kind.explorer_label!r} is written in index.html"
        for quote in "\"'`":
            assert f"{quote}{kind.explorer_label}{quote}" not in script, kind.explorer_label
    save = html.split('class="save"', 1)[1].split("</div>", 1)[0]
    assert "<a" not in save and 'id="save-links"' in save  # the links are built by the script
    for array in re.findall(r"\[[^\[\]]*\]", script):
        named = set(re.findall(r"""["'`](\w+)["'`]""", array)) & set(NODE_KINDS)
        assert len(named) < 3, f"a list of node kinds is written in explorer.js: {array[:120]}"
    assert "/api/registries" in script and "state.downloads" in script and "state.kindOrder" in script
