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
