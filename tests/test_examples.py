"""Every runnable spec in examples/ runs, and its outputs are what the README promises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import circuitgraph

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _spec_into(tmp_path: Path, name: str) -> dict:
    spec = yaml.safe_load((EXAMPLES / name).read_text())
    for key in ("json", "svg", "png", "dot", "neuronpedia", "graph"):
        if key in spec.get("export", {}):
            spec["export"][key] = str(tmp_path / Path(spec["export"][key]).name)
    for check in spec.get("validate", []):
        for params in check.values():
            if isinstance(params, dict) and params.get("heatmap"):
                params["heatmap"] = str(tmp_path / Path(params["heatmap"]).name)
    return spec


def test_demo_spec(tmp_path):
    spec = _spec_into(tmp_path, "demo.yaml")
    if shutil.which("dot") is None:
        spec["export"].pop("svg")
    result = circuitgraph.run(spec)
    assert not result.failures, result.failures
    doc = json.loads((tmp_path / "graph.json").read_text())
    assert doc["metadata"]["completeness"]["max_relative_violation"] < 1e-5
    assert [q["kind"] for q in doc["queries"]] == ["scores", "top_paths", "direct_logit_attribution", "congruence"]
    assert [v["kind"] for v in doc["validation"]] == ["predicted_vs_actual", "patching"]
    # the a/an circuit: the strongest path starts at the noun " owl" and ends at the target
    best = doc["queries"][1]["result"]["paths"][0]["nodes"]
    owl = circuitgraph.NodeId.parse(best[0])
    assert owl.kind == "embedding" and result.graph.node(owl).attrs["token_str"] == " owl"
    # the model predicts " an" over " a" by a wide margin
    target = result.graph.node(result.graph.target_ids[0])
    assert target.pre_activation > 5
    assert (tmp_path / "patching.png").read_bytes().startswith(b"\x89PNG")
    if "svg" in spec["export"]:
        assert "<svg" in (tmp_path / "graph.svg").read_text()
    # the Neuronpedia export: schema, influence everywhere, the logit difference on the output row
    from tests.helpers.neuronpedia import check_viewer_invariants

    np_doc = json.loads((tmp_path / "neuronpedia.json").read_text())
    check_viewer_invariants(np_doc, result.full_graph.metadata["n_layers"])
    assert [n["clerp"] for n in np_doc["nodes"] if n["is_target_logit"]] == ['Output " an -  a" (p=1.000)']


def test_demo_clt_spec(tmp_path):
    """The built-in cross-layer transcoder: exact, better replacement score than the per-layer
    transcoders on the demo prompt (the numbers in docs/demo.md), every query and check runs."""
    spec = _spec_into(tmp_path, "demo_clt.yaml")
    result = circuitgraph.run(spec)
    doc = json.loads((tmp_path / "graph.json").read_text())
    assert doc["metadata"]["completeness"]["max_relative_violation"] < 1e-5
    assert doc["metadata"]["transcoders"]["format"] == "circuit_tracer_clt"
    assert [q["kind"] for q in doc["queries"]] == ["scores", "top_paths", "virtual_weights"]
    assert all("error" not in q for q in doc["queries"])
    stats = json.loads((circuitgraph.builtin.demo_path() / "clt" / "stats.json").read_text())
    assert abs(result.graph.metadata["replacement_score"] - stats["graph_on_demo_prompt"]["replacement_score"]) < 1e-4
    assert stats["graph_on_demo_prompt"]["replacement_score"] > \
        stats["per_layer_transcoders_graph_on_demo_prompt"]["replacement_score"]
    np_doc = json.loads((tmp_path / "neuronpedia.json").read_text())
    assert "cross layer transcoder" in {n["feature_type"] for n in np_doc["nodes"]}


def test_demo_steer_spec(tmp_path):
    """docs/steering.md: the vowel-class features off leave " an" (the logit difference drops);
    with a consonant-class feature on as well, the continuation starts with " a"."""
    spec = _spec_into(tmp_path, "demo_steer.yaml")
    result = circuitgraph.run(spec)
    assert not result.failures, result.failures
    doc = json.loads((tmp_path / "graph.json").read_text())
    off, swap, reversed_ = (e["result"] for e in doc["steering"])
    assert [e["status"] for e in doc["steering"]] == ["ok", "ok", "ok"]
    for r in (off, swap, reversed_):
        assert r["baseline"]["steps"][0]["text"] == " an" and r["metric"]["baseline"] > 10
    assert off["intervened"]["steps"][0]["text"] == " an" and -4 < off["metric"]["actual"] < -2
    assert off["metric"]["predicted_direct"] < off["metric"]["actual"]
    assert swap["intervened"]["text"].startswith(" a ") and swap["intervened"]["steps"][0]["probability"] > 0.99
    assert swap["metric"]["intervened"] < 0
    assert reversed_["generate"]["seed"] == 1 and reversed_["freeze_attention"] is True


FIXTURE_SPECS = sorted(p.name for p in EXAMPLES.glob("fixture_*.yaml"))


def test_every_example_is_tested():
    assert set(p.name for p in EXAMPLES.glob("*.yaml")) == {"demo.yaml", "demo_clt.yaml", "qk_demo.yaml", "demo_dataset.yaml", "demo_steer.yaml",
                                                           "demo_features.yaml", "demo_features_clt.yaml",
                                                           "demo_features_neurons.yaml", "demo_features_heads.yaml",
                                                           *FIXTURE_SPECS}
    # qk_demo: tests/test_qk.py; demo_dataset: tests/test_datasets.py; demo_features(_clt): tests/test_features.py;
    # demo_features_neurons/_heads: tests/test_unit_dashboards.py
    assert len(FIXTURE_SPECS) >= 2


@pytest.mark.parametrize("name", FIXTURE_SPECS)
def test_fixture_example_runs(tmp_path, name):
    spec = _spec_into(tmp_path, name)
    spec = circuitgraph.load_spec(spec, base_dir=EXAMPLES)
    result = circuitgraph.run(spec)
    assert result.full_graph.check_completeness().max_violation < 1e-5
    doc = json.loads((tmp_path / "graph.json").read_text())
    assert len(doc["queries"]) == len(spec.queries)
    assert not result.failures, result.failures  # every query and check of an example succeeds
    # the Neuronpedia export of every fixture example (heads, neurons, biases, a neuron target...)
    from circuitgraph.export.neuronpedia import graph_to_neuronpedia
    from tests.helpers.neuronpedia import check_viewer_invariants

    np_doc = graph_to_neuronpedia(result.graph, full_graph=result.full_graph)
    check_viewer_invariants(np_doc, result.full_graph.metadata["n_layers"])
    assert sum(n["is_target_logit"] for n in np_doc["nodes"]) == len(result.graph.targets)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_validates(name):
    """`circuitgraph validate` passes on every shipped example (built-in CLT dictionaries included:
    their folder is the built-in dictionary's own, not the demo's per-layer transcoders)."""
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    result = CliRunner().invoke(app, ["validate", str(EXAMPLES / name)])
    assert result.exit_code == 0, result.output
    assert "spec OK" in result.output
