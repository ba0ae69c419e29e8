"""Inputs that used to give a confident result that was not what was asked (issue 20).

A parameter that the chosen mode or node set does not use is a spec error (it would be
recorded while changing nothing); dataset rows report every problem with its row number; a
single congruence token may be written as itself.
"""

from __future__ import annotations

import re

import pytest

import circuitgraph
from circuitgraph.errors import SpecError
from circuitgraph.spec.dataset import parse_rows


def _demo(**extra):
    spec = {
        "format_version": 1,
        "model": {"builtin": "demo"},
        "transcoders": {"builtin": "demo"},
        "prompt": "mia saw the owl . later she wants",
        "targets": [{"logit_diff": [" an", " a"]}],
    }
    spec.update(extra)
    return spec


@pytest.mark.parametrize("check, key, words", [
    ({"ablate": {"nodes": {"kind": "feature", "layer": 0}, "k": 3}}, "k", "node filter ablates every node"),
    ({"ablate": {"nodes": {"kind": "feature"}, "k": 10}}, "k", "top_nodes"),  # even the default value
    ({"ablate": {"controls": [], "n_controls": 4}}, "n_controls", "controls is []"),
    ({"ablate": {"controls": [], "seed": 3}}, "seed", "control sets"),
    ({"ablate": {"controls": [], "match_layers": True}}, "match_layers", "controls is []"),
    ({"ablate": {"controls": [], "match_positions": True}}, "match_positions", "controls is []"),
    ({"ablate": {"controls": ["count_matched"], "control_tolerance": 0.1}}, "control_tolerance", "matched_magnitude"),
    ({"ablate": {"controls": ["count_matched"], "max_draws": 10}}, "max_draws", "matched_magnitude"),
    ({"ablate": {"mode": "zero", "scale": 0.5}}, "scale", "mode: scale"),
])
def test_unused_check_parameters_are_errors(check, key, words):
    with pytest.raises(SpecError) as info:
        circuitgraph.load_spec(_demo(validate=[check]))
    text = str(info.value)
    assert f"validate[0].ablate.{key}" in text and words in text and "remove it" in text, text


def test_unused_query_parameter_is_an_error():
    with pytest.raises(SpecError, match=r"queries\[0\].top_paths.beam_width.*method is exact"):
        circuitgraph.load_spec(_demo(queries=[{"top_paths": {"source": {"kind": "embedding"}, "method": "exact",
                                                             "beam_width": 5}}]))


def test_used_parameters_still_pass():
    spec = circuitgraph.load_spec(_demo(validate=[
        {"ablate": {"nodes": {"kind": "feature", "layer": 0}, "controls": ["count_matched"], "n_controls": 2}},
        {"ablate": {"nodes": "top_nodes", "k": 3, "controls": ["matched_magnitude"], "max_draws": 10,
                    "control_tolerance": 0.1, "seed": 1, "match_layers": True}},
    ], queries=[{"top_paths": {"source": {"kind": "embedding"}, "method": "beam", "beam_width": 5}}]))
    assert spec.validate[0].params.k == 10 and spec.validate[1].params.k == 3
    dumped = spec.model_dump(mode="json")  # what the graph's metadata records: only what the run uses
    assert "k" not in dumped["validate"][0]["ablate"] and "max_draws" not in dumped["validate"][0]["ablate"]
    assert dumped["validate"][1]["ablate"]["k"] == 3
    assert circuitgraph.load_spec(dumped) == spec  # and it loads back unchanged


def test_every_row_problem_has_its_row_number():
    rows, problems = parse_rows([
        {"tokens": []},                                   # 1: empty token list (used to escape as a spec error)
        {"prompt": 5},                                    # 2: wrong type
        {"tokens": "abc"},                                # 3: wrong type
        {},                                               # 4: neither prompt nor tokens
        {"prompt": "x", "targets": "a"},                  # 5: targets not a list
        {"prompt": "x", "corrupted": {"tokens": []}},     # 6: empty corrupted prompt
        {"tokens": [1, -2]},                              # 7: negative id
        3,                                                # 8: not a mapping
        {"prompt": "a", "foo": 1},                        # 9: unknown key
        {"prompt": "fine"},                               # 10: ok
        {"tokens": [], "prompt": ""},                     # 11: two problems in one row
    ])
    locs = [loc for loc, _ in problems]
    assert [r.number for r in rows] == [10]
    for n in range(1, 10):
        assert any(loc == f"row {n}" or loc.startswith(f"row {n}.") for loc in locs), (n, problems)
    assert "row 1.tokens" in locs and "row 6.corrupted.tokens" in locs and "row 9.foo" in locs
    assert sum(loc.startswith("row 11") for loc in locs) == 2, problems


def test_inline_dataset_with_empty_tokens_is_reported_with_the_others(tmp_path):
    from circuitgraph.errors import DatasetError

    rows = [{"tokens": []}, {"prompt": "mia saw the owl . later she wants"}, {"tokens": [1, 99999]},
            {"prompt": 7}]
    spec = _demo(dataset=rows, export={"dataset": str(tmp_path / "out")})
    spec.pop("prompt")
    with pytest.raises(DatasetError) as info:
        circuitgraph.run(spec)
    text = str(info.value)
    assert "row 1.tokens" in text and "row 3" in text and "vocabulary" in text and "row 4.prompt" in text, text
    assert "row 2" not in text and not (tmp_path / "out").exists()


@pytest.mark.parametrize("tokens, n", [(" an", 1), ([" an"], 1), ([" an", " a"], 2), (5, 1)])
def test_congruence_takes_one_token_as_itself(tokens, n):
    spec = circuitgraph.load_spec(_demo(queries=[{"congruence": {"tokens": tokens}}]))
    assert len(spec.queries[0].params.tokens) == n


def test_congruence_single_token_runs_and_its_table_names_its_columns():
    from circuitgraph.queries import congruence

    res = circuitgraph.run(_demo(queries=[{"congruence": {"tokens": " an", "top_k": 3}}], prune="none"))
    (entry,) = res.queries
    assert entry["status"] == "ok", entry["error"]
    q = entry["result"]
    assert q.token_strs == (" an",) and len(q.rows) == 3
    header = q.table().splitlines()
    assert any("score (dot)" in line and "dot (output . direction)" in line for line in header), header
    same = congruence(res.graph, " an", top_k=3)  # the Python API takes one token as itself too
    assert same.rows == q.rows


@pytest.mark.parametrize("graph, transcoders, words", [
    ({"mlp": "transcoders", "neuron_top_k": 5}, True, "graph.neuron_top_k: neuron_top_k is not used here"),
    ({"mlp": "mlp", "neuron_top_k": 5}, True, "mlp: mlp makes no neuron nodes"),
    ({"max_feature_nodes": 50}, False, "there is no transcoders section"),
    ({"mlp": "neurons", "max_feature_nodes": 50}, True, "mlp: neurons makes no feature nodes"),
    ({"mlp": "transcoders", "max_neuron_nodes": 50}, True, "graph.max_neuron_nodes: max_neuron_nodes is not used here"),
    ({"mlp": "mlp", "max_neuron_nodes": 50}, False, "mlp: mlp makes none"),
    ({"mlp": "neurons", "max_neuron_nodes": 50, "neuron_top_k": 5}, False, "max_neuron_nodes and neuron_top_k both"),
])
def test_unused_graph_parameters_are_errors(graph, transcoders, words):
    spec = _demo(graph=graph)
    if not transcoders:
        spec.pop("transcoders")
    with pytest.raises(SpecError, match=re.escape(words)):
        circuitgraph.load_spec(spec)


def test_used_graph_parameters_pass():
    circuitgraph.load_spec(_demo(graph={"mlp": {0: "neurons"}, "neuron_top_k": 5, "max_feature_nodes": 50}))
    circuitgraph.load_spec(_demo(graph={"max_feature_nodes": 50}))
    # transcoders on some layers, neurons on the others: both limits apply
    circuitgraph.load_spec(_demo(graph={"mlp": {0: "neurons"}, "max_neuron_nodes": 5, "max_feature_nodes": 50}))


def test_unused_export_parameters_are_errors():
    with pytest.raises(SpecError, match=r"export.qk_inset: qk_inset is not used here"):
        circuitgraph.load_spec(_demo(export={"svg": "g.svg", "qk_inset": True}))
    with pytest.raises(SpecError, match=r"export.dataset_format: dataset_format is not used here"):
        circuitgraph.load_spec(_demo(export={"dataset_format": "json"}))
    circuitgraph.load_spec(_demo(export={"svg": "g.svg", "qk_inset": True},
                                 queries=[{"qk": {"layer": 1, "head": 0}}]))


def test_a_row_with_a_bad_prompt_still_reports_its_other_problems(tmp_path):
    from circuitgraph.errors import DatasetError

    rows = [{"tokens": [1, 99999], "targets": [{"logit": " aardvarkish"}]},
            {"prompt": "mia saw the owl . later she wants"}]
    spec = _demo(dataset=rows, export={"dataset": str(tmp_path / "out")})
    spec.pop("prompt")
    with pytest.raises(DatasetError) as info:
        circuitgraph.run(spec)
    text = str(info.value)
    assert "2 problems" in text and "row 1 (id 1) prompt" in text and "aardvarkish" in text, text
