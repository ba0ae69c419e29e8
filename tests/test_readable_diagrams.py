"""Readable by default (issue 31, item 4): diagrams draw a node budget stated once in the spec,
say what they hide and its share of the influence, wrap a crowded layer so a deep model's diagram
stays legible, and the HTML report shows the diagram at its own size (zoomable, not shrunk)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from circuitgraph.export.dot import DEFAULT_MAX_NODES, DEFAULT_MAX_ROW_NODES, graph_to_dot
from circuitgraph.export.html import report_html
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.spec.export import ExportSpec
from tests.helpers.graphs import random_dag

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot binary not installed")


def deep_graph(seed: int = 0) -> AttributionGraph:
    """30 layers, 4 positions, 3 features a site: ~500 nodes shaped like a real model's graph."""
    return random_dag(seed, n_layers=30, n_pos=4, feats_per_site=3, n_targets=1, density=0.08)


def independent_influence(g: AttributionGraph) -> np.ndarray:
    """circuit-tracer's influence ``w (A + A^2 + ...)`` from the dense matrix: ``w ((I - A)^-1 - I)``."""
    E = np.abs(g.dense_adjacency())
    A = E / np.maximum(E.sum(1, keepdims=True), 1e-10)
    w = np.zeros(g.n_nodes)
    for t, wt in g.target_ids and g.targets:
        w[g.index_of(t)] += wt
    return w @ (np.linalg.inv(np.eye(g.n_nodes) - A) - np.eye(g.n_nodes))


def drawn_nodes(dot: str) -> set[str]:
    """Ids of the graph's nodes drawn in DOT text (not axis, legend or width-scale nodes)."""
    return set(re.findall(r'^\t+"?([a-z_]+/-?\d+/\d+/\d+)"? \[label=', dot, flags=re.M))


def test_the_budget_is_stated_once_in_the_spec_and_is_40():
    assert DEFAULT_MAX_NODES == ExportSpec().max_render_nodes == 40
    g = deep_graph()
    assert g.n_nodes > 400
    drawn = drawn_nodes(graph_to_dot(g))
    assert len(drawn) == DEFAULT_MAX_NODES
    assert str(g.target_ids[0]) in drawn


@pytest.mark.parametrize("budget", [10, 40])
def test_the_hidden_nodes_and_their_share_of_the_influence_are_said(budget):
    g = deep_graph(1)
    influence = independent_influence(g)
    target = g.index_of(g.target_ids[0])
    others = [r for r in range(g.n_nodes) if r != target]
    best = sorted(others, key=lambda r: (-influence[r], r))[: budget - 1]
    expected_share = 1 - influence[best].sum() / influence[others].sum()
    dot = graph_to_dot(g, max_nodes=budget, show_unreachable=True)
    assert drawn_nodes(dot) == {str(g.nodes[r].id) for r in best} | {str(g.target_ids[0])}
    n_hidden = g.n_nodes - budget
    m = re.search(rf"{n_hidden:,} weaker nodes left out \(ranked by influence; they hold (\d+)% of the influence\)", dot)
    assert m, dot[:600]
    assert int(m.group(1)) == round(100 * expected_share)
    assert f"showing {budget} of {g.n_nodes:,} nodes" in dot


def _rows(dot: str) -> list[list[str]]:
    """The graph nodes of each rank (``rank=same`` subgraph) of the DOT text."""
    rows = []
    for block in re.split(r"subgraph \"rank ", dot)[1:]:
        body = block.split("}", 1)[0]
        rows.append(re.findall(r'^\t+"?([a-z_]+/-?\d+/\d+/\d+)"? \[label=', body, flags=re.M))
    return rows


def wide_layer_graph(n_wide: int = 30) -> AttributionGraph:
    """30 layers; layer 0 holds ``n_wide`` strong neurons (the busiest row), one neuron a layer above."""
    nodes = [Node(NodeId("embedding", -1, p, 100 + p), 1.0, attrs={"token_str": f"tok{p}"}) for p in range(8)]
    edges: list[tuple[int, int, float]] = []
    for i in range(n_wide):
        nodes.append(Node(NodeId("neuron", 0, i % 8, 1000 + i), 1.0, 1.0))
        edges.append((len(nodes) - 1, i % 8, 1.0))
    prev = list(range(8, len(nodes)))
    for layer in range(1, 30):
        nodes.append(Node(NodeId("neuron", layer, 7, layer), 1.0, 1.0))
        row = len(nodes) - 1
        edges += [(row, s, 1.0 / len(prev)) for s in prev]
        prev = [row]
    nodes.append(Node(NodeId("logit", 30, 7, 5), 1.0, 1.0, attrs={"token_str": " x"}))
    edges.append((len(nodes) - 1, prev[0], 1.0))
    return AttributionGraph(nodes, [t for t, _, _ in edges], [s for _, s, _ in edges], [w for _, _, w in edges],
                            targets=[(nodes[-1].id, 1.0)])


def test_a_crowded_layer_is_wrapped_onto_rows_of_at_most_max_row_nodes():
    g = wide_layer_graph(30)
    dot = graph_to_dot(g, max_nodes=None)
    rows = _rows(dot)
    assert max(len(r) for r in rows) <= DEFAULT_MAX_ROW_NODES
    layer0 = [r for r in rows if r and r[0].startswith("neuron/0/")]
    assert [len(r) for r in layer0] == [8, 8, 7, 7]  # balanced: 30 at 8 a row
    assert "L0 cont." in dot
    unwrapped = _rows(graph_to_dot(g, max_nodes=None, max_row_nodes=None))
    assert max(len(r) for r in unwrapped) == 30  # the option is what bounds the rows


def _svg_size(svg: str) -> tuple[float, float]:
    w, h = re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups()
    return float(w), float(h)


@needs_dot
@pytest.mark.parametrize("seed", range(2))
def test_a_30_layer_diagram_stays_legible(seed):
    """At the default budget a 30-layer graph's SVG is at most 2,500 pt wide with labels at 9 pt
    (12 px at 100%); 100 nodes (the old default) are over twice as wide."""
    from circuitgraph.export.render import render_dot_bytes

    g = deep_graph(seed)
    svg = render_dot_bytes(graph_to_dot(g), "svg").decode()
    width, _ = _svg_size(svg)
    fonts = {float(f) for f in re.findall(r'font-size="([\d.]+)"', svg)}
    assert min(fonts) >= 9 and width <= 2500, (width, fonts)
    assert _svg_size(render_dot_bytes(graph_to_dot(g, max_nodes=100), "svg").decode())[0] > 2 * width


@needs_dot
def test_wrapping_a_crowded_layer_narrows_the_diagram():
    from circuitgraph.export.render import render_dot_bytes

    g = wide_layer_graph(36)
    wrapped = _svg_size(render_dot_bytes(graph_to_dot(g, max_nodes=None), "svg").decode())[0]
    one_row = _svg_size(render_dot_bytes(graph_to_dot(g, max_nodes=None, max_row_nodes=None), "svg").decode())[0]
    assert wrapped < 0.9 * one_row, (wrapped, one_row)


@needs_dot
def test_the_report_shows_the_diagram_at_its_own_size():
    g = deep_graph(2)
    html = report_html(g)
    start = html.index('<div class="cg-diagram" id="diagram">')
    svg = html[start:html.index("</svg>", start)]
    assert '<svg width="' in svg and "max-width:100%" not in svg  # not scaled down to the column
    assert "#diagram svg{max-width:none}" in html and 'data-zoom="fit"' in html and "<script>" in html
    # what the diagram hides, said above it (the SVG's own title may be scrolled out of view)
    summary = html[html.index('id="diagram-summary">'):html.index("</p>", html.index('id="diagram-summary">'))]
    assert f"showing 40 of {g.n_nodes:,} nodes" in summary and "weaker nodes left out (ranked by influence; they hold" \
        in summary


@needs_dot
def test_the_report_diagram_is_legible_and_pannable_in_chromium(tmp_path):
    from tests.helpers.peers import browser_or_skip

    browser_or_skip()
    from circuitgraph.testing.browser import playwright_chromium, playwright_unavailable

    if playwright_unavailable():
        pytest.skip(playwright_unavailable())
    path = tmp_path / "report.html"
    path.write_text(report_html(wide_layer_graph(36), max_nodes=None), encoding="utf-8")
    with playwright_chromium() as browser:
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(path.as_uri())
        info = page.evaluate("""() => {
            const box = document.getElementById('diagram');
            const text = [...box.querySelectorAll('g.node text')].map(t => t.getBoundingClientRect().height);
            return {text: Math.min(...text), scroll: box.scrollWidth > box.clientWidth,
                    zoom: document.getElementById('diagram-zoom').textContent};
        }""")
        assert info["text"] >= 10 and info["scroll"] and info["zoom"] == "100%", info
        page.click('button[data-zoom="fit"]')
        fitted = page.evaluate("() => document.getElementById('diagram').scrollWidth"
                               " <= document.getElementById('diagram').clientWidth + 1")
        assert fitted
