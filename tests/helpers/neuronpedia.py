"""The shipped fixtures' graphs as circuit-tracer computes them, and the Neuronpedia viewer's invariants."""

from __future__ import annotations

import functools
import json

from circuitgraph.export.neuronpedia import VIEWER_FEATURE_TYPES
from tests.helpers.bundles import REPO

FIXTURES = REPO / "examples" / "fixtures"

CT_REFERENCES = REPO / "tests" / "data" / "circuit_tracer"

SCHEMA = json.loads((REPO / "schemas" / "neuronpedia" / "graph-schema.json").read_text())


def fixture_spec(name: str, **overrides) -> dict:
    """circuit-tracer's default graph of a shipped fixture (what run_ct.py computes)."""
    prompt = json.loads((FIXTURES / name / "prompt.json").read_text())
    spec = {
        "format_version": 1,
        "model": {"path": str(FIXTURES / name / "model")},
        "transcoders": {"path": str(FIXTURES / name / "transcoders")},
        "prompt": {"tokens": prompt["tokens"]},
        "targets": [{"top_logits": {"max_n": 10, "cumulative_probability": 0.95}}],
        "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
    }
    spec.update(overrides)
    return spec


@functools.cache
def fixture_run(name: str, variant: str = "default"):
    from circuitgraph import run

    overrides = {
        "default": {},
        "logit_diff": {"targets": [{"logit_diff": ["t39", "t7"]}, {"logit": "t9"}]},
        "heads": {"graph": {"mlp": "neurons", "attention": "heads", "neuron_top_k": 4, "bias_nodes": True,
                            "positional_nodes": True}},
        "mixed": {"graph": {"mlp": {0: "transcoders", 1: "mlp"}, "attention": {0: "heads", 1: "frozen"}},
                  "targets": [{"top_logits": {"max_n": 2}}, {"feature": {"layer": 0, "position": -1, "index": 3}}]},
    }[variant]
    return run(fixture_spec(name, **overrides))


def validate_schema(doc: dict) -> None:
    import jsonschema

    jsonschema.Draft7Validator(SCHEMA).validate(doc)


def check_viewer_invariants(doc: dict, n_layers: int) -> None:
    """What the issue's 'Done when' asks of every export."""
    validate_schema(doc)
    nodes = doc["nodes"]
    assert {n["feature_type"] for n in nodes} <= set(VIEWER_FEATURE_TYPES)
    triples = [(n["layer"], n["ctx_idx"], n["feature"]) for n in nodes]
    assert len(set(triples)) == len(triples), "two nodes share (layer, position, feature)"
    assert len({n["node_id"] for n in nodes}) == len(nodes)
    for n in nodes:
        assert isinstance(n["influence"], float) and 0.0 <= n["influence"] <= 1.0 + 1e-9, n
    targets = [n for n in nodes if n["is_target_logit"]]
    assert targets
    for n in targets:
        assert n["feature_type"] == "logit" and n["layer"] == str(n_layers + 1), n
        assert "(p=" in n["clerp"] and n["clerp"].count('"') >= 2
    ids = {n["node_id"] for n in nodes}
    for link in doc["links"]:
        assert link["source"] in ids and link["target"] in ids
