"""The explorer never shows a state it was not asked for (issue 35), in headless Chromium:

* every panel (each drawn node's panel, QK, steering, the diff, a dataset's rows, a feature's
  dashboard) on graphs whose heads and MLP nodes have no labels, a failed load, and a graph too
  large to draw, without the text ``null``, ``undefined`` or ``NaN`` anywhere on the page (tooltips
  included);
* the threshold controls read the thresholds of the last answer (the view's, or those a refused
  view was asked at), never the page's built-in 0.80 / 0.98;
* a failed load (a corrupt graph file, a file deleted after the server started) clears the previous
  graph, its prompt and scores and its node panel, and says why.

Skipped when Chromium or Playwright is missing, unless CIRCUITGRAPH_REQUIRE_BROWSER is set."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import urllib.request

import pytest

import circuitgraph
import circuitgraph.serve.api as serve_api
from circuitgraph.serve import running_server
from circuitgraph.testing.browser import playwright_chromium, playwright_unavailable
from circuitgraph.testing.explorer_fixture import (
    DEMO_CORRUPTED_PROMPT,
    DEMO_STEER,
    demo_dataset_run,
    demo_graph_file,
    write_features_folder,
)

BAD = re.compile(r"\b(null|undefined|NaN)\b")
#: the page's text, tooltips (SVG titles, title attributes) and form values included
PAGE_TEXT = """() => {
  const parts = [];  // text node by text node: textContent would run "@14" and "null" together
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) parts.push(walker.currentNode.data);
  for (const e of document.querySelectorAll('[title]')) parts.push(e.getAttribute('title'));
  for (const e of document.querySelectorAll('input, select')) parts.push(e.value);
  return parts.join('\\n');
}"""


def playwright_or_skip() -> None:
    reason = playwright_unavailable()
    if reason:
        if os.environ.get("CIRCUITGRAPH_REQUIRE_BROWSER"):
            pytest.fail(reason + " (CIRCUITGRAPH_REQUIRE_BROWSER is set)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Graphs with unlabeled heads and MLP nodes, a steered graph and its corrupted twin, a dataset
    run, a features folder, a corrupt graph file and one deleted after the server started."""
    playwright_or_skip()
    root = tmp_path_factory.mktemp("states")
    demo_graph_file(root / "heads.json", qk=True, heads=True)
    demo_graph_file(root / "clean.json", steer=DEMO_STEER)
    demo_graph_file(root / "corrupted.json", prompt=DEMO_CORRUPTED_PROMPT)
    demo_dataset_run(root / "ds")
    feats = {(n.layer, n.index) for n in circuitgraph.load_graph(str(root / "clean.json")).nodes if n.kind == "feature"}
    write_features_folder(root / "features", feats)
    text = (root / "clean.json").read_text()
    (root / "broken.json").write_text(text[: len(text) // 2])  # listed (its header is ours), unreadable
    (root / "gone.json").write_text(text)
    with playwright_chromium() as browser, running_server(root) as server:
        (root / "gone.json").unlink()
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield server, page, root
        assert not errors, errors


def api(server, path: str):
    try:
        with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def settled(page) -> str:
    page.wait_for_function("['ready', 'error'].includes(document.body.dataset.state)")
    return page.evaluate("document.body.dataset.state")


def no_bad_text(page, where: str) -> None:
    text = page.evaluate(PAGE_TEXT)
    found = [text[max(0, m.start() - 50): m.end() + 20] for m in BAD.finditer(text)]
    assert not found, (where, found[:3])


def open_graph(page, server, name: str) -> str:
    page.goto("about:blank")  # a new document: the page starts afresh (a hash change alone does not reload)
    page.goto(server.url + "#graph=" + urllib.parse.quote(name, safe=""))
    page.wait_for_function("document.body.dataset.state !== 'starting'")
    return settled(page)


def readouts(page) -> tuple[str, str]:
    return page.text_content("#node-threshold-value"), page.text_content("#edge-threshold-value")


def expected_readouts(answer: dict) -> tuple[str, str]:
    """The read-outs for an answer's thresholds: the exact value, at least two decimals."""
    def show(v):
        exact = repr(round(float(v), 4)).removesuffix(".0")
        return exact if "." in exact and len(exact.split(".")[1]) >= 2 else f"{v:.2f}"
    return show(answer["node_threshold"]), show(answer["edge_threshold"])


def walk_nodes(page, where: str, limit: int = 40) -> int:
    ids = page.eval_on_selector_all("#graph g.node", "els => els.map(e => e.dataset.id)")
    for node_id in ids[:limit]:
        page.click(f'#graph g.node[data-id="{node_id}"]')
        page.wait_for_function(f"document.getElementById('details').dataset.node === {json.dumps(node_id)} && "
                               "document.getElementById('details').dataset.state !== 'loading'")
        no_bad_text(page, f"{where}: node {node_id}")
    return len(ids)


def test_every_panel_on_unlabeled_nodes_has_no_null_text(served, tmp_path):
    server, page, _ = served
    assert open_graph(page, server, "heads.json") == "ready"
    view = api(server, "/api/graph/heads.json")
    unlabeled = [n for n in view["nodes"] if n["kind"] in ("attention_head", "mlp", "neuron") and not n["label"]]
    assert unlabeled, "the fixture should have heads or MLP nodes without labels"
    assert readouts(page) == expected_readouts(view)
    no_bad_text(page, "heads.json")
    page.check("#show-remainders")
    assert walk_nodes(page, "heads.json") > 5
    page.screenshot(path=str(tmp_path / "unlabeled.png"))
    for i in range(page.locator("#qk-list .item").count()):
        page.locator("#qk-list .item").nth(i).click()
        no_bad_text(page, f"qk {i}")
    # steering, the diff (every sort), a dataset and its aggregate, a feature's dashboard
    assert open_graph(page, server, "clean.json") == "ready"
    walk_nodes(page, "clean.json", limit=15)
    for i in range(page.locator("#steering-list .item").count()):
        page.locator("#steering-list .item").nth(i).click()
        no_bad_text(page, f"steer {i}")
    page.select_option("#diff-b", "corrupted.json")
    for match in ("position", "from_end", "identity"):
        page.select_option("#diff-match", match)
        page.click("#diff-button")
        page.wait_for_function("document.getElementById('details').dataset.node === 'diff' && "
                               "document.getElementById('details').dataset.state === 'ready'")
        for header in ("flip", "change", "node"):
            page.click(f"#diff-top th:has-text('{header}')")
            no_bad_text(page, f"diff {match} sorted by {header}")
    page.screenshot(path=str(tmp_path / "diff.png"))
    graphs = [g["name"] for g in api(server, "/api/graphs")["graphs"]]
    for name in [g for g in graphs if g.startswith("ds/")][:3]:
        assert open_graph(page, server, name) == "ready", name
        no_bad_text(page, name)
        walk_nodes(page, name, limit=8)
    page.select_option("#feature-layer", index=0)
    page.wait_for_selector("#feature-list .item")
    page.locator("#feature-list .item").first.click()
    page.wait_for_function("document.getElementById('details').dataset.state === 'ready'")
    no_bad_text(page, "a feature's dashboard")


@pytest.mark.parametrize("name,why", [("broken.json", "cannot read graph 'broken.json'"),
                                      ("gone.json", "cannot read graph 'gone.json'")])
def test_a_failed_load_clears_the_previous_graph_and_says_why(served, name, why, tmp_path):
    server, page, _ = served
    assert open_graph(page, server, "clean.json") == "ready"
    page.locator("#graph g.node").first.click()
    page.wait_for_function("document.getElementById('details').dataset.state === 'ready'")
    assert page.text_content("#prompt") and "replacement_score" in page.text_content("#prompt")
    page.select_option("#graph-select", name)
    assert settled(page) == "error"
    assert page.locator("#graph g.node").count() == 0 and page.locator("#graph path.edge").count() == 0
    assert page.text_content("#prompt") == ""                 # no prompt, no scores of the previous graph
    assert why in page.text_content("#status") and why in page.text_content("#load-error")
    assert "inputs" not in page.text_content("#details")      # the previous node panel is gone
    assert readouts(page) == ("—", "—")                       # no thresholds were used: none is shown
    assert page.get_attribute("#graph", "data-node-threshold") is None
    no_bad_text(page, f"failed load of {name}")
    page.screenshot(path=str(tmp_path / f"failed-{name}.png"))
    # the remainders box, zoom and search on an empty page do nothing (and raise nothing)
    page.check("#show-remainders")
    page.click("#zoom-in")
    page.fill("#search", "feature")
    # back to a good graph: it is drawn again
    page.select_option("#graph-select", "clean.json")
    assert settled(page) == "ready" and page.locator("#graph g.node").count() > 0


def test_a_view_too_large_to_draw_shows_the_thresholds_it_was_asked_at(served, monkeypatch, tmp_path):
    """A graph whose first view has more edges than the page draws: the answer is an error that
    carries the thresholds it was asked at, and the controls show them (not the page's 0.80 /
    0.98); a smaller view asked with the sliders is drawn, and the read-outs follow it."""
    server, page, _ = served
    full = api(server, "/api/graph/clean.json")
    monkeypatch.setattr(serve_api, "MAX_VIEW_EDGES", max(1, len(full["edges"]) // 3))
    answer = api(server, "/api/graph/clean.json")
    state = open_graph(page, server, "clean.json")
    if "error" in answer:
        assert state == "error" and answer["error"] in page.text_content("#status")
        assert "node_threshold" in answer and "edge_threshold" in answer
        assert page.locator("#graph g.node").count() == 0
    else:  # a first view that fits by itself (the server chose smaller thresholds)
        assert state == "ready"
    assert readouts(page) == expected_readouts(answer)
    no_bad_text(page, "a large graph")
    page.screenshot(path=str(tmp_path / "large.png"))
    page.focus("#node-threshold")
    for _ in range(60):
        page.keyboard.press("ArrowLeft")
    nt = page.input_value("#node-threshold")
    settled(page)
    page.wait_for_function("document.body.dataset.state !== 'loading'")
    answer = api(server, f"/api/graph/clean.json?node_threshold={nt}&edge_threshold="
                         f"{page.input_value('#edge-threshold')}")
    assert readouts(page)[0] == expected_readouts(answer)[0]
    if "error" not in answer:
        assert page.locator("#graph g.node").count() == len(
            [n for n in answer["nodes"] if n["kind"] != "remainder" or page.is_checked("#show-remainders")])
    no_bad_text(page, "a large graph after the slider")
