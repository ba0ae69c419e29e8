"""End to end: specs run through the API and the CLI; bad input gives one line and no file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import circuitgraph
from circuitgraph.cli.main import app
from tests.helpers.bundles import SHARED_FIXTURES, make_bundle

GPT2 = SHARED_FIXTURES / "example-gpt2"
needs_fixtures = pytest.mark.skipif(not GPT2.is_dir(), reason="shared fixtures not present")


def _spec(tmp_path: Path, bundle: Path, **overrides) -> dict:
    spec = {
        "format_version": 1,
        "model": {"path": str(bundle / "model")},
        "transcoders": {"path": str(bundle / "transcoders")},
        "prompt": {"tokens": json.loads((bundle / "prompt.json").read_text())["tokens"]},
        "targets": [{"top_logits": {"max_n": 3}}],
        "export": {"json": str(tmp_path / "out" / "g.json"), "dot": str(tmp_path / "out" / "g.dot")},
    }
    spec.update(overrides)
    return spec


def _write(tmp_path: Path, spec: dict, name: str = "spec.yaml") -> Path:
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def test_public_api_is_pinned():
    assert sorted(circuitgraph.__all__) == [
        "AttributionGraph", "CircuitGraphError", "CompletenessReport", "Node", "NodeId", "ResultEntry", "RunOutcome", "RunResult",
        "Spec",
        "attribute", "build", "diff", "dry_run", "errors", "load_graph", "load_spec", "open_dataset", "open_features",
        "run", "steer",
    ]
    for name in circuitgraph.__all__:
        assert getattr(circuitgraph, name) is not None


def test_run_writes_schema_valid_json_and_round_trips(tmp_path):
    import jsonschema

    bundle = make_bundle(tmp_path, "rms-gated-rotary-gqa", kind="jumprelu")
    spec = _spec(tmp_path, bundle, prune={"node_threshold": 0.8, "edge_threshold": 0.98},
                 queries=[{"scores": {}}, {"influence": {"top_k": 5}}])
    result = circuitgraph.run(spec)
    out = tmp_path / "out" / "g.json"
    doc = json.loads(out.read_text())
    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "graph.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert [q["kind"] for q in doc["queries"]] == ["scores", "influence"]
    assert "replacement_score" in doc["metadata"] and "completeness_score" in doc["metadata"]
    assert doc["metadata"]["completeness"]["max_relative_violation"] < 1e-5
    assert any(n["kind"] == "remainder" for n in doc["nodes"])
    loaded = circuitgraph.load_graph(str(out))
    assert loaded.node_ids() == result.graph.node_ids()
    assert (loaded.edge_weight == result.graph.edge_weight).all()
    # the pruned graph keeps the exact bookkeeping
    assert loaded.check_completeness().max_violation < 1e-5
    assert (tmp_path / "out" / "g.dot").read_text().startswith("digraph")


def test_same_spec_gives_byte_identical_json(tmp_path):
    bundle = make_bundle(tmp_path, "ln-gelu-learned")
    spec = _spec(tmp_path, bundle)
    circuitgraph.run(spec)
    first = (tmp_path / "out" / "g.json").read_bytes()
    circuitgraph.run(spec)
    assert (tmp_path / "out" / "g.json").read_bytes() == first


@needs_fixtures
def test_cli_run_text_prompt_and_token_targets(tmp_path):
    spec = _spec(tmp_path, GPT2, prompt="t36 t37 t23 t55", targets=[{"logit_diff": [" t36", " t37"]}, {"logit": 5}])
    spec["export"]["svg"] = str(tmp_path / "out" / "g.svg")
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path, spec)), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "wrote json" in res.output and "completeness" in res.output
    assert (tmp_path / "out" / "g.svg").read_text().lstrip().startswith(("<?xml", "<svg"))


BAD = {
    "malformed yaml": ("text", "format_version: 1\nmodel: {path: [unclosed\n", "line"),
    "unknown key": ("spec", {"graph": {"mlp": "neurons", "colour": "red"}}, "colour"),
    "missing model dir": ("spec", {"model": {"path": "/nonexistent/model"}}, "does not exist"),
    "layer out of range": ("spec", {"targets": [{"neuron": {"layer": 7, "position": 1, "index": 0}}]}, "layer 7"),
    "prompt longer than n_ctx": ("spec", {"prompt": {"tokens": [1] * 40}}, "context"),
    "empty prompt": ("spec", {"prompt": ""}, "empty"),
    "token id outside vocab": ("spec", {"prompt": {"tokens": [1, 2, 999]}}, "vocabulary"),
    "target token not in vocab": ("spec", {"targets": [{"logit": 999}]}, "vocabulary"),
    "position out of range": ("spec", {"targets": [{"logit": 3, "position": 50}]}, "position 50"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_one_line_no_file(tmp_path, case):
    bundle = make_bundle(tmp_path, "ln-gelu-learned")
    how, value, needle = BAD[case]
    if how == "text":
        path = tmp_path / "spec.yaml"
        path.write_text(value)
    else:
        spec = _spec(tmp_path, bundle, transcoders=None, graph={"mlp": "neurons"})
        spec.pop("transcoders")
        spec.update(value)
        path = _write(tmp_path, spec)
    res = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert needle in lines[0], lines[0]
    assert "Traceback" not in res.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@needs_fixtures
def test_target_token_that_splits_is_named(tmp_path):
    spec = _spec(tmp_path, GPT2, targets=[{"logit": " t36 t37"}])
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path, spec)), "--quiet"])
    assert res.exit_code == 2
    assert "not a single token" in res.output and "'t36'" in res.output


def test_transcoder_shape_mismatch_is_named(tmp_path):
    a = make_bundle(tmp_path, "ln-gelu-learned")
    from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model

    other = tiny_model(d_model=24, n_heads=4)
    save_bundle(tmp_path / "other", other, random_transcoders(other))
    spec = _spec(tmp_path, a, transcoders={"path": str(tmp_path / "other" / "transcoders")})
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path, spec)), "--quiet"])
    assert res.exit_code == 2
    assert "d_in=24" in res.output and "d_model is 16" in res.output and "layer 0" in res.output


def test_pretrained_name_offline_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = {"format_version": 1, "model": {"name": "gpt2"}, "prompt": {"tokens": [1, 2]},
            "export": {"json": str(tmp_path / "g.json")}}
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path, spec)), "--quiet"])
    assert res.exit_code == 2
    assert "could not load pretrained model 'gpt2'" in res.output and "model: {path: DIR}" in res.output
    assert not (tmp_path / "g.json").exists()


def test_dry_run_estimates(tmp_path):
    bundle = make_bundle(tmp_path, "ln-gelu-learned")
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path, _spec(tmp_path, bundle))), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "estimated nodes" in res.output and "fits: yes" in res.output
    assert not (tmp_path / "out").exists()


def test_memory_refusal_is_clear(tmp_path):
    from circuitgraph.adapters import ModelAdapter
    from circuitgraph.attribution import attribute
    from circuitgraph.errors import ResourceError
    from circuitgraph.testing.synthetic import tiny_model

    with pytest.raises(ResourceError, match=r"could hold up to [\d,]+ edges.*more than the") as exc:
        attribute(ModelAdapter(tiny_model()), [1, 2, 3, 4], memory_limit=1000)
    # a neuron graph: advice about features would not help (tests/test_estimate.py checks advice that does)
    assert "max_feature_nodes" not in str(exc.value)
