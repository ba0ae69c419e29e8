"""The explorer opens a large graph at once at a node budget (issue 31, item 4): every view is
``prune_graph(..., top_k_nodes=K)`` with K the diagrams' budget unless the request says otherwise
(``top_k_nodes=N`` or ``all``), and the page draws the budgeted view at first instead of an empty
canvas (a view larger than the page draws used to be refused until a slider was moved).

The browser test is skipped without Chromium or Playwright unless CIRCUITGRAPH_REQUIRE_BROWSER is set."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from circuitgraph.export.dot import DEFAULT_MAX_NODES
from circuitgraph.queries.prune import prune_graph
from circuitgraph.serve import api as serve_api
from circuitgraph.serve import running_server
from tests.helpers.graphs import random_dag


def large_graph():
    """~500 nodes over 30 layers, ~10k edges: larger than the page draws once MAX_VIEW_EDGES is lowered."""
    return random_dag(3, n_layers=30, n_pos=4, feats_per_site=3, n_targets=1, density=0.08)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("large")
    graph = large_graph()
    graph.to_json(root / "large.json")
    with running_server(root) as server:
        yield server, graph


def get(server, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ids_of(graph) -> list[str]:
    return [str(i) for i in graph.node_ids()]


def test_the_default_view_is_the_budgeted_prune(served):
    server, graph = served
    assert serve_api.DEFAULT_TOP_K_NODES == DEFAULT_MAX_NODES == 40
    code, view = get(server, "/api/graph/large.json")
    assert code == 200
    expected = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98, top_k_nodes=40)
    assert [n["id"] for n in view["nodes"]] == ids_of(expected.graph)
    assert len(view["edges"]) == expected.graph.n_edges
    assert view["top_k_nodes"] == 40 and view["default_top_k_nodes"] == 40
    kept = expected.node_influence[expected.node_mask]
    assert view["influence_share"] == pytest.approx(kept.sum() / expected.node_influence.sum())
    non_target = [n for n in view["nodes"] if n["kind"] not in ("embedding", "remainder") and not n["is_target"]]
    assert len(non_target) <= 40
    assert view["n_rankable_nodes"] == sum(n.kind not in ("embedding", "remainder") for n in graph.nodes) - 1


@pytest.mark.parametrize("budget", ["7", "all"])
def test_a_request_sets_the_budget(served, budget):
    server, graph = served
    code, view = get(server, f"/api/graph/large.json?node_threshold=0.9&edge_threshold=0.95&top_k_nodes={budget}")
    assert code == 200
    top_k = None if budget == "all" else int(budget)
    expected = prune_graph(graph, node_threshold=0.9, edge_threshold=0.95, top_k_nodes=top_k)
    assert [n["id"] for n in view["nodes"]] == ids_of(expected.graph)
    assert view["top_k_nodes"] == top_k
    # the node panel and the proposals read the same view
    node = next(n for n in view["nodes"] if n["kind"] == "remainder") if any(
        n["kind"] == "remainder" for n in view["nodes"]) else view["nodes"][-1]
    code, answer = get(server, f"/api/node/large.json/{node['id']}?node_threshold=0.9&edge_threshold=0.95"
                               f"&top_k_nodes={budget}")
    assert code == 200 and answer["id"] == node["id"]


@pytest.mark.parametrize("bad", ["0", "-3", "x", "1.5"])
def test_bad_budgets_are_400(served, bad):
    code, answer = get(served[0], f"/api/graph/large.json?top_k_nodes={bad}")
    assert code == 400 and "top_k_nodes" in answer["error"]


def test_a_large_graph_opens_at_the_budget_in_chromium(served, monkeypatch):
    """With the page's edge limit below the whole view's edges (as for a real model's graph), the
    page draws the budgeted view at once; the budget slider's right end asks for every node."""
    from tests.helpers.peers import playwright_or_skip

    playwright_or_skip()
    from circuitgraph.testing.browser import playwright_chromium

    server, graph = served
    whole = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)
    budgeted = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98, top_k_nodes=40)
    assert budgeted.graph.n_edges < whole.graph.n_edges
    monkeypatch.setattr(serve_api, "MAX_VIEW_EDGES", (budgeted.graph.n_edges + whole.graph.n_edges) // 2)
    with playwright_chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "#graph=large.json")
        page.wait_for_function("['ready', 'error'].includes(document.body.dataset.state)")
        assert page.evaluate("document.body.dataset.state") == "ready", page.inner_text("#status")
        drawn = page.locator("#graph g.node").count()
        shown = [n for n in budgeted.graph.nodes if n.kind != "remainder"]
        assert drawn == len(shown) > 10
        assert page.input_value("#node-budget") == "40" and page.inner_text("#node-budget-value") == "40"
        assert "at most 40 nodes" in page.inner_text("#status")
        # legible at first (not shrunk to fit: labels of 8 px and up), scrolled to the targets
        assert float(page.get_attribute("#graph", "data-zoom")) >= 0.8
        seen = page.evaluate("""() => {
            const c = document.getElementById('canvas').getBoundingClientRect();
            const t = document.querySelector('#graph g.node.target').getBoundingClientRect();
            return t.left >= c.left && t.right <= c.right && t.top >= c.top && t.bottom <= c.bottom;
        }""")
        assert seen
        # the rest is behind the slider: its right end is every node (here more than the page draws)
        page.focus("#node-budget")
        page.keyboard.press("End")
        assert page.inner_text("#node-budget-value") == "all"
        page.wait_for_function("['ready', 'error'].includes(document.body.dataset.state)")
        assert "top_k_nodes=all" in page.inner_text("#status")  # refused, and it says how to draw it
        page.keyboard.press("Home")
        page.wait_for_function("document.body.dataset.state === 'ready'")
        assert page.locator("#graph g.node").count() < drawn
        assert not errors, errors
