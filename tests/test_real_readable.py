"""Readable by default on the real model (issue 31, item 4): SmolLM2-135M (30 layers) with neurons
as nodes on the IOI prompt.  The diagram draws the budget with legible labels at a bounded width,
the explorer's first view is drawable, and top_paths with ``min_length`` passes through the middle
of the model.  Marked ``real`` (the model folder from the ``smollm2_dir`` fixture)."""

from __future__ import annotations

import re
import shutil

import pytest

import circuitgraph
from circuitgraph.export.dot import graph_to_dot
from circuitgraph.queries import top_paths
from circuitgraph.queries.prune import prune_graph
from circuitgraph.serve.api import MAX_VIEW_EDGES

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def ioi(smollm2_dir):
    return circuitgraph.run({
        "format_version": 1, "model": {"path": str(smollm2_dir)},
        "prompt": "When Mary and John went to the store, John gave a drink to",
        "targets": [{"logit_diff": [" Mary", " John"]}],
        "graph": {"mlp": "neurons", "neuron_top_k": 4},
        "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
    }).graph


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot binary not installed")
def test_the_diagram_is_legible(ioi):
    from circuitgraph.export.render import render_dot_bytes

    dot = graph_to_dot(ioi)
    assert "weaker nodes left out (ranked by influence; they hold" in dot
    svg = render_dot_bytes(dot, "svg").decode()
    width = float(re.search(r'<svg width="([\d.]+)pt"', svg).group(1))
    assert width <= 3000 and min(float(f) for f in re.findall(r'font-size="([\d.]+)"', svg)) >= 9


def test_the_explorer_first_view_is_drawable(ioi):
    view = prune_graph(ioi, node_threshold=1.0, edge_threshold=1.0, top_k_nodes=40).graph
    assert 0 < view.n_edges <= MAX_VIEW_EDGES


def test_paths_through_the_middle(ioi):
    res = top_paths(ioi, {"kind": "embedding"}, k=5, min_length=4)
    assert res.method == "exact" and len(res.paths) == 5
    assert all(p.length >= 4 for p in res.paths)
    assert any(10 <= n.layer < 25 for p in res.paths for n in p.nodes if n.kind == "neuron")
