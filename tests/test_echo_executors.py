"""sign_regimes on the dataset executors: the same result however the rows are split.

The per-neuron statistics and the per-row losses are computed by worker processes (the local
executor, 1 and 2 workers, shards of 1 and 4 rows) and merged in row order; every field must
equal the in-process run's exactly (one torch thread everywhere).
"""

from __future__ import annotations

import pytest
import torch

import circuitgraph
from circuitgraph.datasets.echo_runs import ExecutorRows
from circuitgraph.datasets.executors import LocalExecutor
from circuitgraph.errors import SpecError
from circuitgraph.spec import load_spec
from circuitgraph.validation.echo_stats import LayerStats, stream_stats
from tests.helpers.bundles import SHARED_FIXTURES
from tests.helpers.tiny_models import token_rows

MODEL = SHARED_FIXTURES / "example-llama" / "model"
pytestmark = pytest.mark.usefixtures("one_thread")


def rows(seed: int, n: int, length: int) -> list[list[int]]:
    return token_rows(seed, n, length, vocab=60)


SEL, EVAL = rows(11, 9, 14), rows(12, 6, 12)


def spec(executor=None, **extra):
    check = {"prompts": [{"tokens": t} for t in SEL], "eval_prompts": [{"tokens": t} for t in EVAL],
             "use_graph_prompt": False, "top_k": 5, "echo_threshold": 0.6, "n_controls": 2, "seed": 3, **extra}
    if executor is not None:
        check["executor"] = executor
    return {"format_version": 1, "model": {"path": str(MODEL)}, "prompt": {"tokens": SEL[0]},
            "graph": {"mlp": "neurons", "neuron_top_k": 4}, "validate": [{"sign_regimes": check}]}


def _same(a: LayerStats, b: LayerStats) -> None:
    for name in ("top_values", "top_echo", "regime_counts", "ever_open", "echo_mass", "echo_count", "max_echo",
                 "max_open"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.n_tokens == b.n_tokens


def test_statistics_merge_exactly_however_the_rows_are_split():
    s = load_spec(spec())
    adapter = circuitgraph.pipeline.inputs.load_inputs(s)[0]
    layers = list(range(adapter.facts.n_layers))
    here = stream_stats(adapter, SEL, layers, 5)
    for workers, shard_rows in ((1, 1), (2, 4)):
        there = ExecutorRows(s, LocalExecutor(workers=workers), adapter.facts.d_mlp, shard_rows).stats(SEL, layers, 5, 1)
        for l in layers:
            _same(here[l], there[l])
    # merging in memory, shards of 2 rows: the same as one fold
    merged = {l: LayerStats.empty(5, adapter.facts.d_mlp) for l in layers}
    for i in range(0, len(SEL), 2):
        part = stream_stats(adapter, SEL[i:i + 2], layers, 5, keep_rows=True)
        for l in layers:
            merged[l].merge(part[l])
    for l in layers:
        _same(here[l], merged[l])


def test_the_check_on_one_or_two_workers_equals_the_in_process_run():
    def result(executor):
        (entry,) = circuitgraph.run(spec(executor)).validation
        assert entry["status"] in ("ok", "uncontrolled"), entry["error"]
        d = entry["result"].to_dict()
        d.pop("seconds")
        return d

    here = result(None)
    assert here["n_echo_dominated"] > 0 and here["groups"][0]["loss_change"] is not None
    assert here["groups"][0]["controls"], "the test needs controls to compare"
    assert result({"kind": "local", "workers": 1}) == here
    assert result({"kind": "local", "workers": 2}) == here


def test_the_check_on_ray_equals_the_in_process_run():
    """Ray keeps one loaded model per worker for every pass (statistics, then losses)."""
    pytest.importorskip("ray", reason="the Ray executor needs ray (pip install '.[dataset]')")

    def result(executor):
        (entry,) = circuitgraph.run(spec(executor)).validation
        assert entry["status"] in ("ok", "uncontrolled"), entry["error"]
        d = entry["result"].to_dict()
        d.pop("seconds")
        return d

    assert result({"kind": "ray", "address": "local", "workers": 2}) == result(None)


def test_a_dataset_run_refuses_a_check_executor(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"tokens": [1, 2, 3]}\n', encoding="utf-8")
    s = spec({"kind": "local", "workers": 1})
    s.pop("prompt")
    s.update(dataset=str(data), export={"dataset": str(tmp_path / "out")})
    with pytest.raises(SpecError, match="sign_regimes.executor"):
        load_spec(s)


def test_the_executor_needs_the_spec():
    from circuitgraph.attribution import ResolvedTarget, attribute
    from circuitgraph.errors import ValidationRunError
    from circuitgraph.validation import run_check

    adapter = circuitgraph.pipeline.inputs.load_inputs(load_spec(spec()))[0]
    graph = attribute(adapter, SEL[0], None, [ResolvedTarget(kind="logit", position=13, tokens=(3,))], mlp="neurons")
    with pytest.raises(ValidationRunError, match="from a spec"):
        run_check(graph, {"sign_regimes": {"executor": {"workers": 1}, "prompts": [{"tokens": SEL[1]}]}})
