"""A completeness violation above what the dtype allows is said, with what it means (issue 20)."""

from __future__ import annotations

import pytest

import circuitgraph
from circuitgraph.pipeline.precision import EXACT_TOLERANCE, precision_warning


def _run(dtype: str):
    return circuitgraph.run({"format_version": 1, "model": {"builtin": "demo", "dtype": dtype},
                             "transcoders": {"builtin": "demo"}, "prompt": "mia saw the owl . later she wants",
                             "targets": [{"logit_diff": [" an", " a"]}]})


def test_bfloat16_run_says_its_graph_is_exact_only_to_its_rounding():
    res = _run("bfloat16")
    comp = res.full_graph.metadata["completeness"]
    assert comp["max_relative_violation"] > EXACT_TOLERANCE["float32"]
    note = comp["precision_warning"]
    assert "bfloat16" in note and "model: {dtype: float32}" in note and "exact only to about" in note
    assert note in res.warnings and note in res.graph.metadata["warnings"]
    lines = res.summary_lines()
    assert any(line.startswith("completeness:") and "above what the dtype allows" in line for line in lines)
    assert f"warning: {note}" in lines
    assert "targets: ' an' - ' a' (w=1)" in lines  # targets quoted: their spaces are visible
    from circuitgraph.export.html import report_html

    assert "precision (what the dtype allows)" in report_html(res)


def test_float32_run_has_no_warning():
    res = _run("float32")
    assert "precision_warning" not in res.full_graph.metadata["completeness"]
    assert not any("completeness" in w for w in res.warnings)


@pytest.mark.parametrize("worst, weights, graph, words", [
    (1e-6, "float32", "float32", None),
    (5e-4, "float32", "float32", "report it as a bug"),
    (1e-6, "float32", "float64", "report it as a bug"),
    (2e-3, "float16", "float32", "float16, whose rounding (eps 9.8e-04)"),
])
def test_precision_warning_rule(worst, weights, graph, words):
    note = precision_warning({"max_relative_violation": worst, "worst_node": "feature/0/1/2"},
                             weights_dtype=weights, graph_dtype=graph)
    if words is None:
        assert note is None
    else:
        assert words in note and "feature/0/1/2" in note


def test_top_paths_shares_say_what_they_are_relative_to_and_flag_cancelling_paths():
    """Two paths of 2.46 and -2.05 into a target of 0.41: shares 6.0 and -5.0, both cancelling."""
    from circuitgraph.graph.graph import AttributionGraph
    from circuitgraph.graph.nodes import Node, NodeId
    from circuitgraph.queries import top_paths

    a = Node(NodeId("embedding", -1, 0, 1), 1.0)
    b = Node(NodeId("embedding", -1, 1, 2), 1.0)
    c = Node(NodeId("embedding", -1, 2, 3), 1.0)
    t = Node(NodeId("logit", 1, 2, 3), 0.41, pre_activation=0.41, constant=0.0)
    g = AttributionGraph([a, b, c, t], [3, 3, 3], [0, 1, 2], [2.46, -2.1, 0.05], targets=[(t.id, 1.0)])
    res = top_paths(g, {"kind": "embedding"}, k=3)
    by_source = {p.nodes[0]: p for p in res.paths}
    assert by_source[a.id].share == pytest.approx(6.0) and by_source[a.id].cancelling
    assert by_source[b.id].share == pytest.approx(-2.1 / 0.41) and by_source[b.id].cancelling
    assert by_source[c.id].share == pytest.approx(0.05 / 0.41) and not by_source[c.id].cancelling
    assert sum(p.contribution for p in res.paths) == pytest.approx(t.pre_activation)  # what the shares add up to
    text = res.table()
    assert "share of target" in text and "logit/1/2/3 = 0.41" in text and "|share| > 1 marks a cancelling path" in text
    assert text.count("cancelling") == 3  # two rows and the footer
    d = res.to_dict()
    assert d["target_values"] == {"logit/1/2/3": 0.41} and [p["cancelling"] for p in d["paths"]] == [True, True, False]
