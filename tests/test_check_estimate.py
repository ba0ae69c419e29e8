"""The dry run estimates the checks that run the model many times (sign_regimes, patching):
forward passes counted, the working set of the largest one measured on a probe, compared here
with the check's measured peak and its counted forward passes on a tiny model whose logits
dominate (vocabulary 20,000, rows of 96 tokens)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest

import circuitgraph
from circuitgraph.errors import ValidationRunError
from circuitgraph.pipeline.check_estimate import PER_EDGE_CHECKS, PROBES, PeakWatch, release_free_memory
from circuitgraph.pipeline.estimate import _LAST_RESORT, estimate_run
from circuitgraph.spec.validation import CHECK_TYPES
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_config, tiny_model
from circuitgraph.validation import run_check
from circuitgraph.validation.dispatch import CheckCall
from tests.helpers.tiny_models import token_rows

MB = 1 << 20
pytestmark = [pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                 reason="the peak is measured through /proc/self (Linux)"),
              pytest.mark.usefixtures("one_thread")]


@functools.cache
def bundle() -> Path:
    cfg = tiny_config(norm="RMS", mlp="gated", positional="rotary", n_layers=2, d_mlp=64, n_ctx=128, d_vocab=20000)
    root = Path(tempfile.mkdtemp(prefix="cg-check-estimate-"))
    model = tiny_model(cfg)
    save_bundle(root, model, random_transcoders(model, d_sae=64))
    return root


def model_dir() -> Path:
    return bundle() / "model"


def rows(seed: int, n: int, length: int) -> list[list[int]]:
    return token_rows(seed, n, length, vocab=20000)


def spec(check: dict, length: int = 24) -> dict:
    s = {"format_version": 1, "model": {"path": str(model_dir())}, "prompt": {"tokens": rows(0, 1, length)[0]},
         "targets": [{"logit": 3}], "graph": {"mlp": "neurons", "neuron_top_k": 2}, "validate": [check]}
    if "replacement_fidelity" in check:
        s["transcoders"] = {"path": str(bundle() / "transcoders")}
        s["graph"] = {"mlp": "transcoders"}
    return s


CHECKS = {
    "sign_regimes": {"sign_regimes": {"prompts": [{"tokens": t} for t in rows(1, 3, 96)],
                                      "eval_prompts": [{"tokens": t} for t in rows(2, 2, 96)], "top_k": 4,
                                      "echo_threshold": 0.5, "n_controls": 2, "groups": False, "batch_size": 8}},
    "patching": {"patching": {"corrupted": {"tokens": rows(3, 1, 24)[0]}, "granularity": ["layer", "neuron"]}},
}


#: the checks that run the model once per node or set on the graph's prompt (96 tokens: their
#: logits, 4 to 21 runs of 96 x 20,000, dominate), with their prompt's length
PROMPT_CHECKS = {
    "predicted_vs_actual": {"predicted_vs_actual": {"k": 20, "mode": "zero"}},
    "ablate": {"ablate": {"k": 3, "n_controls": 8}},
    "faithfulness": {"faithfulness": {"mode": "zero"}},
    "faithfulness_curve": {"faithfulness_curve": {"unit": "nodes", "sizes": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]}},
    "replacement_fidelity": {"replacement_fidelity": {"prompts": [{"tokens": rows(4, 1, 120)[0]}]}},
}
LENGTHS = {**{k: 24 for k in CHECKS}, **{k: 96 for k in PROMPT_CHECKS}}


def test_every_check_is_probed_or_costed_per_edge():
    assert set(PROBES) | PER_EDGE_CHECKS == {t.key for t in CHECK_TYPES}
    assert not set(PROBES) & PER_EDGE_CHECKS


@pytest.mark.parametrize("kind", sorted(CHECKS) + sorted(PROMPT_CHECKS))
def test_the_estimate_matches_the_measured_check(kind):
    s = circuitgraph.spec.load_spec(spec({**CHECKS, **PROMPT_CHECKS}[kind], LENGTHS[kind]))
    (est,) = estimate_run(s).checks
    assert est.kind == kind and est.forward_passes > 0 and est.seconds > 0, est
    assert "fits:" in "\n".join(estimate_run(s).lines())

    graph = circuitgraph.build(s)
    passes = []
    adapter = graph.context.adapter
    counter = ("hook_embed", lambda x, hook: passes.append(x.shape[0]) or x)
    release_free_memory()  # the probes' freed pages would hide the check's allocations
    with PeakWatch() as watch, adapter.model.hooks(fwd_hooks=[counter]):
        run_check(graph, s.validate[0], spec=s)
    measured = watch.added
    # every forward pass the check runs is counted (the estimate is an upper bound: empty groups,
    # neurons that do not differ, controls that cannot be drawn run nothing)
    assert len(passes) <= est.forward_passes
    assert est.working_set > 8 * MB  # the logits of the largest pass
    assert measured <= est.working_set, (measured, est.working_set)  # an upper bound
    assert est.working_set <= 3 * measured, (measured, est.working_set)


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


def test_a_prompt_check_that_does_not_fit_is_refused_with_its_advice():
    """predicted_vs_actual's 21 runs of 96 tokens alone do not fit: the dry run refuses it whatever
    the graph, names the check and says what lowers it (k)."""
    s = circuitgraph.spec.load_spec(spec(PROMPT_CHECKS["predicted_vs_actual"], 96))
    first = estimate_run(s)
    (c,) = first.checks
    assert first.fits and c.working_set > 64 * MB, first.lines()
    # the estimate counts the check's stage: the graph held and its forward passes
    assert first.bytes_peak >= first.check_peak(c) >= first.plan.bytes_fixed + c.working_set
    est = estimate_run(s, memory_limit=first.plan.bytes_fixed + c.working_set // 2)
    lines = "\n".join(est.lines())
    assert not est.checks_fit and not est.fits, lines
    assert "fits: NO - a check's forward passes do not fit" in lines and "validate[0] predicted_vs_actual" in lines \
        and "lower validate[0].k" in lines, lines
    # where the node tables are too large for the check (a real model's every neuron), the plan's
    # advice for a smaller graph comes first: it counts the check's forward passes (its later stages)
    p = est.plan
    p.base, p.advice = 4 * p.limit, ["set graph.max_neuron_nodes: 7 (or less)"]
    fits = [line for line in est.lines() if line.startswith("fits:")]
    assert not est.checks_fit and fits == ["fits: NO - set graph.max_neuron_nodes: 7 (or less)"], fits
    p.advice = [_LAST_RESORT]  # no smaller graph fits: the check's own advice
    assert "lower validate[0].k" in "\n".join(est.lines())


def test_a_probe_call_has_no_graph_and_says_so():
    """The dry run's probes call the checks' runners with no graph (``CheckCall.graph`` is None);
    a runner that reads the graph gets a ValidationRunError, not an AttributeError on None."""
    call = CheckCall(None, None, None)  # only the graph is read
    with pytest.raises(ValidationRunError, match="runs on the built graph"):
        call.built_graph()
