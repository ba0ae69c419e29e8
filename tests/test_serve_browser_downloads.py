"""The explorer's "save pinned" links in headless Chromium (Debian's, driven by Playwright), as a
user meets them: one link per export kind the registry offers (an extra kind registered for the
test included), disabled until nodes are pinned; pin two nodes, every link gets its address, and
each downloads the pinned subgraph in its format.  A screenshot of the page is kept in the test's
folder (``save-links.png``).

Skipped when Chromium or Playwright is missing, unless CIRCUITGRAPH_REQUIRE_BROWSER is set."""

from __future__ import annotations

import html
import json
import re
import shutil
import urllib.parse
import urllib.request

import pytest

import circuitgraph
from circuitgraph.serve import running_server
from circuitgraph.serve.api import DOWNLOADS, SavedSubgraph
from circuitgraph.spec.export import EXPORT_KINDS, ExportKind
from circuitgraph.testing.browser import playwright_chromium
from circuitgraph.testing.explorer_fixture import demo_graph_file
from tests.helpers.peers import playwright_or_skip

GRAPH = "demo/graph.json"
EXTRA = ExportKind("edges", (".csv",), kept_edge_bytes=64, explorer=".edges.csv", explorer_label="edge list CSV")


def _edges_csv(s: SavedSubgraph) -> tuple[bytes, str]:
    """The extra kind's download: the saved subgraph's edges as ``source,target,weight`` lines."""
    ids = [str(i) for i in s.sub.node_ids()]
    rows = ["source,target,weight"] + [f"{ids[a]},{ids[b]},{w!r}" for a, b, w in zip(
        s.sub.edge_source.tolist(), s.sub.edge_target.tolist(), s.sub.edge_weight.tolist(), strict=True)]
    return ("\n".join(rows) + "\n").encode(), "text/csv"


@pytest.fixture
def page_with_extra_kind(tmp_path, monkeypatch):
    """The explorer over the demo graph, an extra export kind registered (its record with
    ``explorer`` and its download) before the page opens, and a Chromium page on it."""
    playwright_or_skip()
    demo_graph_file(tmp_path / "served" / "demo" / "graph.json")  # a run: its spec's outputs are the real kinds
    monkeypatch.setitem(EXPORT_KINDS, EXTRA.key, EXTRA)
    monkeypatch.setitem(DOWNLOADS, EXTRA.key, _edges_csv)
    with running_server(tmp_path / "served") as server, playwright_chromium() as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 950}, accept_downloads=True)
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "#graph=" + urllib.parse.quote(GRAPH, safe=""))
        page.wait_for_function("document.body.dataset.state === 'ready'")
        yield server, page
        assert not errors, errors


def _api(server, path: str):
    with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=60) as resp:
        return json.loads(resp.read())


def _links(page) -> list[dict[str, str | None]]:
    return page.eval_on_selector_all("#save-links a", "els => els.map(e => ({id: e.id, text: e.textContent, "
                                     "href: e.getAttribute('href'), cls: e.className, download: e.hasAttribute('download')}))")


def test_pin_two_nodes_and_save_them_in_every_offered_kind(page_with_extra_kind, tmp_path):
    server, page = page_with_extra_kind
    offered = [k for k in EXPORT_KINDS.values() if k.explorer is not None]
    assert offered[-1] is EXTRA and len(offered) == 4
    links = _links(page)
    assert [(x["id"], x["text"]) for x in links] == [(f"save-{k.key}", k.explorer_label) for k in offered]
    assert all(x["href"] is None and x["cls"] == "disabled" and x["download"] for x in links)  # nothing pinned
    assert set(page.eval_on_selector_all("#save-links a", "els => els.map(e => getComputedStyle(e).color)")) == \
        {"rgb(170, 170, 170)"}

    # pin the ends of the view's strongest edge into a feature, by clicking them and their pin button
    nt, et = page.input_value("#node-threshold"), page.input_value("#edge-threshold")
    view = _api(server, f"/api/graph/{urllib.parse.quote(GRAPH, safe='')}?node_threshold={nt}&edge_threshold={et}")
    kinds = {n["id"]: n["kind"] for n in view["nodes"]}
    edge = max((e for e in view["edges"] if kinds[e["target"]] == "feature"), key=lambda e: abs(e["weight"]))
    pinned = [edge["source"], edge["target"]]
    for node_id in pinned:
        page.click(f'#graph g.node[data-id="{node_id}"]')
        page.wait_for_function(f"document.getElementById('details').dataset.node === '{node_id}' && "
                               "document.getElementById('details').dataset.state === 'ready'")
        page.click("#pin-button")
    assert page.text_content("#pinned-count") == "2"
    assert page.locator("#graph g.node.pinned").count() == 2

    links = _links(page)
    assert all(x["cls"] == "" and x["href"] for x in links)
    for link, kind in zip(links, offered, strict=True):
        url = urllib.parse.urlsplit(link["href"])
        assert url.path == "/api/export/" + urllib.parse.quote(GRAPH, safe="")
        query = urllib.parse.parse_qs(url.query)
        assert query["format"] == [kind.key] and query["nodes"] == [",".join(pinned)]
        assert query["node_threshold"] == [nt] and query["edge_threshold"] == [et]

    # as drawn: each link visible, on one line, in the registry's reading order, none overlapping, no
    # longer greyed out
    boxes = [page.locator(f"#save-{k.key}").bounding_box() for k in offered]
    assert all(b is not None and b["width"] > 10 and 5 < b["height"] < 25 for b in boxes), boxes
    for a, b in zip(boxes, boxes[1:], strict=False):
        assert a["x"] + a["width"] <= b["x"] if abs(a["y"] - b["y"]) < 1 else a["y"] + a["height"] <= b["y"], boxes
    assert all(page.is_visible(f"#save-{k.key}") for k in offered)
    colors = page.eval_on_selector_all("#save-links a", "els => els.map(e => getComputedStyle(e).color)")
    assert "rgb(170, 170, 170)" not in colors, colors  # a.disabled's grey

    page.screenshot(path=str(tmp_path / "save-links.png"), full_page=True)
    page.locator(".save").screenshot(path=str(tmp_path / "save-links-row.png"))
    assert (tmp_path / "save-links.png").stat().st_size > 10_000

    saved = {}
    for kind in offered:
        if kind.key == "svg" and not shutil.which("dot"):
            continue  # the SVG is rendered by Graphviz's dot
        with page.expect_download() as download:
            page.click(f"#save-{kind.key}")
        assert download.value.suggested_filename == f"demo_graph.json-subgraph{kind.explorer}"
        saved[kind.key] = tmp_path / download.value.suggested_filename
        download.value.save_as(saved[kind.key])

    sub = circuitgraph.load_graph(str(saved["json"]))
    assert sorted(str(i) for i in sub.node_ids()) == sorted(pinned)
    assert sub.metadata["explorer"]["pinned"] == sorted(pinned)
    doc = json.loads(saved["neuronpedia"].read_text())
    assert len(doc["qParams"]["pinnedIds"]) == 2 and len(doc["nodes"]) == 2 and len(doc["links"]) == 1
    if "svg" in saved:
        text = html.unescape(saved["svg"].read_text())
        titles = re.findall(r"<title>([a-z_]+/-?\d+/\d+/\d+)</title>", text)
        assert sorted(titles) == sorted(pinned)  # the diagram's nodes: the pinned ones, and their edge
        assert f"<title>{edge['source']}->{edge['target']}</title>" in text
    rows = saved["edges"].read_text().splitlines()
    assert rows == ["source,target,weight", f"{edge['source']},{edge['target']},{edge['weight']!r}"]
