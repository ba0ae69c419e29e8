"""The explorer end to end in headless Chromium (Debian's, driven by Playwright): open a graph, move
the threshold sliders with the keyboard and count the drawn nodes against the API's pruned graph,
click a node and read its dashboard, search, pin two nodes, group them, save the subgraph and load
the saved file, show QK decompositions, walk a dataset run's aggregate and prompt graphs, read a
graph file's steering results, and compare two graphs (the diff view).

Skipped when Chromium or Playwright is missing, unless CIRCUITGRAPH_REQUIRE_BROWSER is set."""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
import urllib.request

import pytest

import circuitgraph
from circuitgraph.serve import running_server
from circuitgraph.testing.browser import playwright_chromium
from circuitgraph.testing.explorer_fixture import (
    DEMO_CORRUPTED_PROMPT,
    DEMO_STEER,
    demo_dataset_run,
    demo_graph_file,
    write_features_folder,
)
from tests.helpers.peers import playwright_or_skip


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the module (Playwright's sync API runs one at a time)."""
    playwright_or_skip()
    with playwright_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def explorer(tmp_path_factory, chromium):
    """The explorer over the demo graph (with QK), a two-prompt dataset run and a features folder,
    and a Chromium page; yields (server, page, written features, the served folder)."""
    root = tmp_path_factory.mktemp("explore")
    demo_graph_file(root / "demo" / "graph.json", qk=True)
    demo_graph_file(root / "heads" / "graph.json", qk=True, heads=True)
    demo_dataset_run(root / "ds")
    feats = {(n.layer, n.index) for n in circuitgraph.load_graph(str(root / "demo" / "graph.json")).nodes
             if n.kind == "feature"}
    written = write_features_folder(root / "features", feats)
    with running_server(root) as server:
        page = chromium.new_page(viewport={"width": 1500, "height": 950}, accept_downloads=True)
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "#graph=" + urllib.parse.quote("demo/graph.json", safe=""))
        wait_ready(page)
        yield server, page, written, root
        assert not errors, errors


def api(server, path: str):
    with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=60) as resp:
        return json.loads(resp.read())


def wait_ready(page, node_threshold: str | None = None, edge_threshold: str | None = None) -> None:
    cond = "document.body.dataset.state === 'ready'"
    if node_threshold is not None:
        cond += f" && document.getElementById('graph').dataset.nodeThreshold === '{node_threshold}'"
    if edge_threshold is not None:
        cond += f" && document.getElementById('graph').dataset.edgeThreshold === '{edge_threshold}'"
    page.wait_for_function(cond)


def view_of(server, name: str, nt: str, et: str, **extra: str):
    query = urllib.parse.urlencode({"node_threshold": nt, "edge_threshold": et, **extra})
    return api(server, f"/api/graph/{urllib.parse.quote(name, safe='')}?{query}")


def press(page, selector: str, key: str, times: int) -> None:
    page.focus(selector)
    for _ in range(times):
        page.keyboard.press(key)


def test_sliders_prune_through_the_api(explorer):
    server, page, *_ = explorer
    first = view_of(server, "demo/graph.json", "1", "1")
    n_rem = sum(n["kind"] == "remainder" for n in first["nodes"])
    assert n_rem > 0
    # remainder nodes (what pruning left out) are hidden at first, as in the diagrams
    assert page.locator("#graph g.node").count() == len(first["nodes"]) - n_rem
    page.check("#show-remainders")
    assert page.locator("#graph g.node").count() == len(first["nodes"])
    assert page.locator("#graph path.edge").count() == len(first["edges"])

    press(page, "#node-threshold", "ArrowLeft", 35)  # 1.00 -> 0.65
    nt = page.input_value("#node-threshold")
    assert nt == "0.65"
    wait_ready(page, nt, "1")
    view = view_of(server, "demo/graph.json", nt, "1")
    assert page.locator("#graph g.node").count() == len(view["nodes"]) < len(first["nodes"])
    drawn = sorted(page.eval_on_selector_all("#graph g.node", "els => els.map(e => e.dataset.id)"))
    assert drawn == sorted(n["id"] for n in view["nodes"])

    press(page, "#edge-threshold", "ArrowLeft", 20)  # 1.00 -> 0.80
    et = page.input_value("#edge-threshold")
    wait_ready(page, nt, et)
    view = view_of(server, "demo/graph.json", nt, et)
    assert page.locator("#graph g.node").count() == len(view["nodes"])
    assert page.locator("#graph path.edge").count() == len(view["edges"])
    assert page.text_content("#node-threshold-value") == "0.65"

    n_rem = sum(n["kind"] == "remainder" for n in view["nodes"])
    assert n_rem > 0
    page.uncheck("#show-remainders")
    assert page.locator("#graph g.node").count() == len(view["nodes"]) - n_rem
    page.check("#show-remainders")
    assert page.locator("#graph g.node").count() == len(view["nodes"])


def test_the_status_line_counts_what_is_drawn(explorer):
    """The status line's node and edge counts are those drawn: remainder nodes hidden by the
    box (and their edges) are not counted as shown, and are counted again once shown."""
    server, page, *_ = explorer
    nt, et = page.input_value("#node-threshold"), page.input_value("#edge-threshold")
    view = view_of(server, "demo/graph.json", nt, et)
    n_rem = sum(n["kind"] == "remainder" for n in view["nodes"])
    assert n_rem > 0

    def status_and_drawn():
        m = re.match(r"(\d+) of \d+ nodes.*?, (\d+) of \d+ edges", page.text_content("#status"))
        assert m, page.text_content("#status")
        drawn = (page.locator("#graph g.node").count(), page.locator("#graph path.edge").count())
        return (int(m.group(1)), int(m.group(2))), drawn

    was_checked = page.is_checked("#show-remainders")
    page.uncheck("#show-remainders")
    counted, drawn = status_and_drawn()
    assert counted == drawn and drawn[0] == len(view["nodes"]) - n_rem
    assert f"({n_rem} remainder nodes hidden)" in page.text_content("#status")
    page.check("#show-remainders")
    counted, drawn = status_and_drawn()
    assert counted == drawn == (len(view["nodes"]), len(view["edges"]))
    page.set_checked("#show-remainders", was_checked)


def test_click_a_node_shows_its_dashboard_then_pin_group_and_save(explorer, tmp_path):
    server, page, written, _ = explorer
    nt, et = page.input_value("#node-threshold"), page.input_value("#edge-threshold")
    view = view_of(server, "demo/graph.json", nt, et)
    features = sorted((n for n in view["nodes"] if n["kind"] == "feature"), key=lambda n: -n["influence"])
    a, b = features[0], features[1]
    info = written[(a["layer"], a["index"])]

    page.click(f'#graph g.node[data-id="{a["id"]}"]')
    page.wait_for_function(f"document.getElementById('details').dataset.node === '{a['id']}' && "
                           "document.getElementById('details').dataset.state === 'ready'")
    details = page.text_content("#details")
    assert info["label"] in details
    assert info["top_text"].replace("«", "").replace("»", "") in details
    assert page.text_content("#details .example mark") == info["top_token"]  # the activating token, highlighted
    node = api(server, f"/api/node/demo/graph.json/{a['id']}?node_threshold={nt}&edge_threshold={et}")
    assert f"inputs ({min(node['n_inputs'], 30)} of {node['n_inputs']}" in details
    assert "density" in details and "promotes" in details
    page.click("#pin-button")

    page.click(f'#graph g.node[data-id="{b["id"]}"]')
    page.wait_for_function(f"document.getElementById('details').dataset.node === '{b['id']}' && "
                           "document.getElementById('details').dataset.state === 'ready'")
    page.click("#pin-button")
    assert page.text_content("#pinned-count") == "2"
    assert page.locator("#graph g.node.pinned").count() == 2

    with page.expect_download() as download:
        page.click("#save-json")
    saved = tmp_path / "pinned.json"
    download.value.save_as(saved)
    sub = circuitgraph.load_graph(str(saved))
    assert sorted(str(i) for i in sub.node_ids()) == sorted([a["id"], b["id"]])
    with page.expect_download() as download:
        page.click("#save-neuronpedia")
    download.value.save_as(tmp_path / "np.json")
    assert json.loads((tmp_path / "np.json").read_text())["qParams"]["pinnedIds"] is not None
    if shutil.which("dot"):
        with page.expect_download() as download:
            page.click("#save-svg")
        download.value.save_as(tmp_path / "pinned.svg")
        titles = re.findall(r"<title>([a-z_]+/-?\d+/\d+/\d+)</title>", (tmp_path / "pinned.svg").read_text())
        assert sorted(titles) == sorted([a["id"], b["id"]])  # the diagram's nodes: the pinned ones

    # group the pinned pair into one supernode: the server merges it
    page.fill("#group-name", "pair")
    page.click("#group-button")
    wait_ready(page, nt, et)
    merged = view_of(server, "demo/graph.json", nt, et, supernodes=json.dumps({"pair": [a["id"], b["id"]]}))
    assert page.locator("#graph g.node").count() == len(merged["nodes"]) == len(view["nodes"]) - 1
    assert page.locator("#graph g.node.supernode").count() == 1
    with page.expect_download() as download:
        page.click("#save-json")
    download.value.save_as(tmp_path / "grouped.json")
    grouped = circuitgraph.load_graph(str(tmp_path / "grouped.json"))
    assert sorted(str(i) for i in grouped.node_ids()) == sorted([a["id"], b["id"]])
    assert grouped.metadata["explorer"]["supernodes"] == {"pair": [a["id"], b["id"]]}

    # the automatic proposals of the diagrams
    page.click("#propose-button")
    page.wait_for_selector("#proposals .item, #proposals .tag")


def test_search_by_label_kind_and_layer(explorer):
    server, page, *_ = explorer
    nt, et = page.input_value("#node-threshold"), page.input_value("#edge-threshold")
    view = view_of(server, "demo/graph.json", nt, et)
    page.fill("#search", "test feature 1/")
    expected = [n for n in view["nodes"] if "test feature 1/" in (n["label"] or "")]
    assert expected
    assert page.locator("#search-results .item").count() == len(expected)
    assert page.locator("#graph g.node.match").count() == len(expected)
    page.fill("#search", "")
    page.select_option("#search-kind", "embedding")
    assert page.locator("#search-results .item").count() == sum(n["kind"] == "embedding" for n in view["nodes"])
    page.select_option("#search-kind", "")
    page.select_option("#search-layer", "1")
    assert page.locator("#search-results .item").count() == sum(n["layer"] == 1 for n in view["nodes"])
    page.select_option("#search-layer", "")
    page.fill("#search", '"owl"'.strip('"'))
    assert page.locator("#search-results .item").count() >= 1  # the token " owl"


def test_qk_decompositions_are_shown(explorer):
    server, page, *_ = explorer
    answer = api(server, "/api/qk/demo/graph.json")
    heads = answer["heads"]
    assert page.locator("#qk-list .item").count() == len(heads) > 0
    page.click("#qk-list .item >> nth=0")
    text = page.text_content("#details")
    assert f"QK L{heads[0]['layer']}H{heads[0]['head']}" in text
    query_node = heads[0]["pairs"][0]["query_node"]
    assert answer["names"][query_node].startswith("emb ") and answer["names"][query_node] in text


def test_a_head_node_shows_its_qk_decomposition(explorer):
    server, page, *_ = explorer
    page.select_option("#graph-select", "heads/graph.json")
    wait_ready(page)
    head = api(server, "/api/qk/heads/graph.json")["heads"][0]
    node_id = f"attention_head/{head['layer']}/{head['query_position']}/{head['head']}"
    page.click(f'#graph g.node[data-id="{node_id}"]')
    page.wait_for_function(f"document.getElementById('details').dataset.node === '{node_id}' && "
                           "document.getElementById('details').dataset.state === 'ready'")
    text = page.text_content("#details")
    assert f"QK L{head['layer']}H{head['head']}: query {head['query_position']} → key {head['key_position']}" in text
    assert "query marginals" in text and "key marginals" in text


def test_dataset_run_aggregate_scores_and_prompt_graphs(explorer):
    server, page, *_ = explorer
    page.select_option("#graph-select", "ds/aggregate")
    wait_ready(page)
    page.wait_for_selector("#dataset-section:not([hidden]) #dataset-rows .item")
    view = view_of(server, "ds/aggregate", page.input_value("#node-threshold"), page.input_value("#edge-threshold"))
    assert page.locator("#graph g.node").count() == len(view["nodes"]) > 0
    ds = api(server, "/api/dataset/ds")
    assert page.locator("#dataset-rows .item").count() == 1 + len(ds["rows"])
    scores = page.text_content("#dataset-scores")
    assert f"{ds['scores']['replacement_score']['mean']:.3f}"[:4] in scores
    page.click('#dataset-rows .item[data-row="2"]')
    page.wait_for_function("document.getElementById('graph-select').value === 'ds/graphs/2.npz'")
    wait_ready(page)
    view = view_of(server, "ds/graphs/2.npz", page.input_value("#node-threshold"), page.input_value("#edge-threshold"))
    assert page.locator("#graph g.node").count() == len(view["nodes"]) > 0
    assert "ben saw the dog" in page.text_content("#prompt")


def test_a_features_folder_alone(explorer):
    _, page, written, root = explorer
    (layer, index), info = sorted(written.items())[-1]
    with running_server(root / "features") as server:
        page.goto(server.url)
        wait_ready(page)
        page.wait_for_selector("#features-section:not([hidden]) #feature-list .item")
        assert page.locator("#graph g.node").count() == 0
        page.select_option("#feature-layer", str(layer))
        page.wait_for_selector(f'#feature-list .item[data-feature="{index}"]')
        n_layer = sum(1 for k in written if k[0] == layer)
        assert page.locator("#feature-list .item").count() == n_layer
        page.fill("#feature-index", str(index))
        page.click("#feature-show")
        page.wait_for_function("document.getElementById('details').dataset.state === 'ready'")
        assert page.text_content("#details .example mark") == info["top_token"]
        assert info["label"] in page.text_content("#details")


@pytest.fixture(scope="module")
def steer_diff(tmp_path_factory, chromium):
    """The demo graph with `steer:` results and the corrupted prompt's graph, served, and a page."""
    root = tmp_path_factory.mktemp("steerdiff")
    demo_graph_file(root / "clean.json", steer=DEMO_STEER)
    demo_graph_file(root / "corrupted.json", prompt=DEMO_CORRUPTED_PROMPT)
    with running_server(root) as server:
        page = chromium.new_page(viewport={"width": 1500, "height": 950})
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "#graph=clean.json")
        wait_ready(page)
        yield server, page
        assert not errors, errors


def test_steering_results_are_shown(steer_diff):
    server, page = steer_diff
    entries = api(server, "/api/steering/clean.json")["steering"]
    page.wait_for_selector("#steering-section:not([hidden]) #steering-list .item")
    assert page.locator("#steering-list .item").count() == len(entries) == 2
    page.click('#steering-list .item[data-steer="0"]')
    page.wait_for_function("document.getElementById('details').dataset.node === 'steer 0'")
    result = entries[0]["result"]
    assert page.text_content("#details .steer-intervened") == result["intervened"]["text"] == " a key"
    assert page.text_content("#details .steer-baseline") == result["baseline"]["text"]
    text = page.text_content("#details")
    assert "feature/0/11/292" in text and "predicted (total)" in text
    assert page.locator("#details .steer-steps-intervened tr").count() == len(result["intervened"]["steps"])
    page.click('#steering-list .item[data-steer="1"]')
    page.wait_for_function("document.getElementById('details').dataset.node === 'steer 1'")
    assert page.text_content("#details .steer-error") == entries[1]["error"]
    page.select_option("#graph-select", "corrupted.json")
    wait_ready(page)
    assert page.locator("#steering-section").is_hidden()


def test_diff_view_shows_the_top_changes(steer_diff):
    server, page = steer_diff
    page.select_option("#graph-select", "clean.json")
    wait_ready(page)
    page.select_option("#diff-b", "corrupted.json")
    page.select_option("#diff-match", "position")
    page.click("#diff-button")
    page.wait_for_function("document.getElementById('details').dataset.node === 'diff' && "
                           "document.getElementById('details').dataset.state === 'ready'")
    d = api(server, "/api/diff?a=clean.json&b=corrupted.json&match=position")
    top = page.eval_on_selector_all("#diff-top tr.diff-top", "rows => rows.map(r => r.dataset.node)")
    assert top == [r["node"] for r in d["top_changes"]]
    assert top[0] == "embedding/-1/4/134"
    # signed: effect a -> b side by side, the signed change, sign flips flagged; headers sort
    flips = [r["node"] for r in d["top_changes"] if r["sign_flip"]]
    assert flips and page.eval_on_selector_all("#diff-top tr.flipped", "rows => rows.map(r => r.dataset.node)") == flips
    first = page.locator("#diff-top tr.diff-top").first.text_content()
    t0 = d["top_changes"][0]
    shown = [re.sub(r"\.0+$", "", f"{v:+.3f}") for v in (t0["effect_a"], t0["effect_b"], t0["effect_difference"])]
    assert f"{shown[0]} → {shown[1]}" in first and shown[2] in first
    page.click("#diff-top th:has-text('flip')")
    sorted_top = page.eval_on_selector_all("#diff-top tr.diff-top", "rows => rows.map(r => r.dataset.node)")
    assert sorted_top[:len(flips)] == flips and page.get_attribute("#diff-top", "data-sorted-by") == "flip"
    page.click("#diff-top th:has-text('change')")
    assert page.eval_on_selector_all("#diff-top tr.diff-top", "rows => rows.map(r => r.dataset.node)") == top
    only_a = [r["node"] for r in d["nodes"] if r["present"] == "a"]
    assert page.locator("#diff-only-a tr.diff-only").count() == min(100, len(only_a)) > 0
    # the drawn graph (a) marks the top changes and the nodes only in a
    drawn = set(page.eval_on_selector_all("#graph g.node", "els => els.map(e => e.dataset.id)"))
    changed = set(page.eval_on_selector_all("#graph g.node.changed", "els => els.map(e => e.dataset.id)"))
    assert changed == drawn & set(top) and "feature/0/11/292" in changed
    only = set(page.eval_on_selector_all("#graph g.node.only", "els => els.map(e => e.dataset.id)"))
    assert only == drawn & set(only_a) and only
    # another match: the table follows the API's
    page.select_option("#diff-match", "identity")
    page.click("#diff-button")
    page.wait_for_function("document.querySelector('#diff-top tr.diff-top') && "
                           "document.querySelector('#diff-top tr.diff-top').dataset.node.includes('/*/')")
    d = api(server, "/api/diff?a=clean.json&b=corrupted.json&match=identity")
    assert page.eval_on_selector_all("#diff-top tr.diff-top", "rows => rows.map(r => r.dataset.node)") == \
        [r["node"] for r in d["top_changes"]]
    page.click("#diff-clear")
    assert page.locator("#graph g.node.changed").count() == 0
