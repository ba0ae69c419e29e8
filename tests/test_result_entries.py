"""RunResult's queries, checks and steering items are typed entries (ResultEntry), which still read
as the mappings they were."""

from __future__ import annotations

import pytest

import circuitgraph
from circuitgraph._results import ResultEntry
from circuitgraph.testing.synthetic import save_bundle, tiny_model


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    folder = save_bundle(tmp_path_factory.mktemp("entries") / "bundle", tiny_model(seed=5, n_layers=2, d_model=16,
                                                                                     d_mlp=32, d_vocab=40, n_ctx=8))
    spec = {"format_version": 1, "model": {"path": str(folder / "model")}, "prompt": {"tokens": [1, 5, 9, 12, 3]},
            "targets": [{"top_logits": {"max_n": 2}}], "graph": {"mlp": "neurons"},
            "queries": [{"scores": {}}, {"neighbours": {"node": "neuron/9/0/0"}}],
            "steer": [{"name": "off", "interventions": [{"node": "neuron/0/4/1", "mode": "zero"}],
                       "generate": {"max_new_tokens": 2}}]}
    return circuitgraph.run(spec)


def test_entries_are_typed_and_read_as_mappings(result):
    ok, failed = result.queries
    (steer,) = result.steering
    for e in (ok, failed, steer):
        assert isinstance(e, ResultEntry)
        assert set(e) == {"kind", "params", "on", "status", "error", "result"}
        assert all(e[k] == getattr(e, k) for k in e) and e == dict(e)
    assert ok.ok and ok.kind == "scores" and ok.error is None and ok.result.to_dict()
    assert not failed.ok and failed.status == "failed" and failed.result is None and failed.error
    assert steer.kind == "steer" and steer.ok and steer.result.name == "off"
    assert result.failures == [f"queries[1] neighbours: {failed.error}"]
    assert failed.get("result") is None and "error" in failed and "missing" not in failed
    with pytest.raises(KeyError):
        failed["missing"]


def test_entries_json_is_what_it_was(result):
    doc = result.queries_json()
    assert [d["kind"] for d in doc] == ["scores", "neighbours"]
    assert doc[0]["status"] == "ok" and "error" not in doc[0] and isinstance(doc[0]["result"], dict)
    assert doc[1]["status"] == "failed" and doc[1]["error"] == result.queries[1].error and doc[1]["result"] is None


def test_run_returns_one_type(result):
    """circuitgraph.run's one return type: every outcome is a RunOutcome with the shared face."""
    assert isinstance(result, circuitgraph.RunOutcome) and isinstance(result, circuitgraph.RunResult)
    assert result.ok is (not result.failures) and result.ok is False
    assert result.summary_lines() and result.timings and result.spec is not None
    from circuitgraph.datasets import DatasetRunResult
    from circuitgraph.features.driver import FeaturesRunResult

    assert issubclass(DatasetRunResult, circuitgraph.RunOutcome) and issubclass(FeaturesRunResult, circuitgraph.RunOutcome)
    assert circuitgraph.ResultEntry is ResultEntry
