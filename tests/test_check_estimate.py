"""The dry run estimates the checks that run the model many times (sign_regimes, patching):
forward passes counted, the working set of the largest one measured on a probe, compared here
with the check's measured peak and its counted forward passes on a tiny model whose logits
dominate (vocabulary 20,000, rows of 96 tokens)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import circuitgraph
from circuitgraph.pipeline.check_estimate import PeakWatch
from circuitgraph.pipeline.estimate import estimate_run
from circuitgraph.testing.synthetic import tiny_config, tiny_model
from circuitgraph.validation import run_check
from tests.helpers.tiny_models import saved_model, token_rows

MB = 1 << 20
pytestmark = [pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                 reason="the peak is measured through /proc/self (Linux)"),
              pytest.mark.usefixtures("one_thread")]


@functools.cache
def model_dir() -> Path:
    cfg = tiny_config(norm="RMS", mlp="gated", positional="rotary", n_layers=2, d_mlp=64, n_ctx=128, d_vocab=20000)
    return saved_model(tiny_model(cfg), "cg-check-estimate-")


def rows(seed: int, n: int, length: int) -> list[list[int]]:
    return token_rows(seed, n, length, vocab=20000)


def spec(check: dict) -> dict:
    return {"format_version": 1, "model": {"path": str(model_dir())}, "prompt": {"tokens": rows(0, 1, 24)[0]},
            "targets": [{"logit": 3}], "graph": {"mlp": "neurons", "neuron_top_k": 2}, "validate": [check]}


CHECKS = {
    "sign_regimes": {"sign_regimes": {"prompts": [{"tokens": t} for t in rows(1, 3, 96)],
                                      "eval_prompts": [{"tokens": t} for t in rows(2, 2, 96)], "top_k": 4,
                                      "echo_threshold": 0.5, "n_controls": 2, "groups": False, "batch_size": 8}},
    "patching": {"patching": {"corrupted": {"tokens": rows(3, 1, 24)[0]}, "granularity": ["layer", "neuron"]}},
}


@pytest.mark.parametrize("kind", sorted(CHECKS))
def test_the_estimate_matches_the_measured_check(kind):
    s = circuitgraph.spec.load_spec(spec(CHECKS[kind]))
    (est,) = estimate_run(s).checks
    assert est.kind == kind and est.forward_passes > 0 and est.seconds > 0, est
    assert "fits:" in "\n".join(estimate_run(s).lines())

    graph = circuitgraph.build(s)
    passes = []
    adapter = graph.context.adapter
    counter = ("hook_embed", lambda x, hook: passes.append(x.shape[0]) or x)
    with PeakWatch() as watch, adapter.model.hooks(fwd_hooks=[counter]):
        run_check(graph, s.validate[0], spec=s)
    measured = watch.added
    # every forward pass the check runs is counted (the estimate is an upper bound: empty groups,
    # neurons that do not differ, controls that cannot be drawn run nothing)
    assert len(passes) <= est.forward_passes
    assert est.working_set > 8 * MB  # the logits of the largest pass
    assert measured <= 1.5 * est.working_set + 16 * MB, (measured, est.working_set)
    assert est.working_set <= 3 * measured + 16 * MB, (measured, est.working_set)


def test_a_check_that_does_not_fit_says_so():
    s = circuitgraph.spec.load_spec(spec(CHECKS["sign_regimes"]))
    first = estimate_run(s)
    assert first.fits and first.checks[0].working_set > 64 * MB
    # room for the model and the forward pass, not for the check's forward passes
    est = estimate_run(s, memory_limit=first.plan.base + first.checks[0].working_set // 2)
    lines = "\n".join(est.lines())
    assert not est.checks_fit and not est.fits and "fits: NO" in lines, lines
    if est.plan.fits:  # the check alone does not fit: the advice says so
        assert "a check's forward passes do not fit" in lines, lines
