"""Interventions, patching, controls, faithfulness, sign regimes, fidelity and the dispatcher.

Known answers rather than snapshots: an intervention equals the same edit written as a raw
TransformerLens hook; patching everything recovers 1 and nothing 0; control sets match
their target within the stated tolerance; keeping the whole graph keeps the whole target.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.errors import ValidationRunError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.validation import (
    CheckResult,
    Intervention,
    Metric,
    Unit,
    ablate,
    draw_controls,
    echo_removed,
    faithfulness,
    intervene,
    measure_intervention,
    patch_recovery,
    patching,
    predicted_vs_actual,
    replacement_fidelity,
    replacement_model,
    run_check,
    run_rows,
    sign_regimes,
)
from circuitgraph.validation.controls import summarise_controls
from circuitgraph.validation.metrics import Readout
from tests.helpers.validation import build

REPO = Path(__file__).resolve().parents[1]
CLEAN = [1, 5, 7, 2, 9, 4]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: intra-op threads only add overhead
CORRUPTED = [1, 5, 8, 2, 9, 4]






def graph_of(adapter, tcs, *, dtype=torch.float32, **kwargs):
    target = ResolvedTarget(kind="logit_diff", position=len(CLEAN) - 1, tokens=(3, 4))
    return attribute(adapter, CLEAN, tcs, [target], dtype=dtype, **kwargs)


def logits_with(adapter, tokens, hooks):
    with adapter.model.hooks(fwd_hooks=hooks):
        return adapter.model(torch.tensor([tokens]))


def logits_under(adapter, tokens, iv, tcs=None):
    with intervene(adapter, iv, n_pos=len(tokens), transcoders=tcs) as model:
        return model(torch.tensor([tokens]))


# --------------------------------------------------------------------------- interventions
def test_interventions_equal_raw_hooks():
    adapter, tcs = build(dtype=torch.float64, mlp="gated", positional="rotary")
    a = adapter

    def set_at(index, value):
        def fn(x, hook):
            x = x.clone()
            x[index] = value(x[index])
            return x
        return fn

    cases = [
        (Intervention.zero([Unit("neuron", 0, 3, 5)]),
         [(a.hook_mlp_post(0), set_at((slice(None), 3, 5), lambda v: 0 * v))]),
        (Intervention.scaled([Unit("head", 1, None, 2)], 0.5),
         [(a.hook_z(1), set_at((slice(None), slice(None), 2), lambda v: 0.5 * v))]),
        (Intervention.set_to([Unit("gate", 1, 4, 7)], 1.5),
         [(a.hook_mlp_pre(1), set_at((slice(None), 4, 7), lambda v: 0 * v + 1.5))]),
        (Intervention.zero([Unit("value", 0, 2, 1)]),
         [(a.hook_mlp_pre_linear(0), set_at((slice(None), 2, 1), lambda v: 0 * v))]),
        (Intervention.set_to([Unit("attn", 0, 4)], 2.0),
         [(a.hook_attn_out(0), set_at((slice(None), 4), lambda v: 2 * v))]),
        (Intervention.zero([Unit("mlp", 1, None)]), [(a.hook_mlp_out(1), set_at((slice(None),), lambda v: 0 * v))]),
        (Intervention.zero([Unit("embed", -1, 2)]), [(a.hook_embed(), set_at((slice(None), 2), lambda v: 0 * v))]),
    ]
    for iv, hooks in cases:
        got = logits_under(adapter, CLEAN, iv, tcs)
        want = logits_with(adapter, CLEAN, hooks)
        assert torch.allclose(got, want, atol=1e-12), iv
        assert not torch.allclose(got, adapter.model(torch.tensor([CLEAN])), atol=1e-9), iv


def test_feature_splice_known_answers():
    adapter, tcs = build(dtype=torch.float64)
    tc = tcs[0]
    base = adapter.model(torch.tensor([CLEAN]))
    # scaling every feature by 1 changes nothing
    same = logits_under(adapter, CLEAN, Intervention.scaled([Unit("feature", 0, None, None)], 1.0), tcs)
    assert torch.allclose(same, base, atol=1e-12)
    # removing every feature and the error leaves b_dec as the MLP output
    everything = Intervention.zero([Unit("feature", 0, None, None), Unit("error", 0, None)])
    gone = logits_under(adapter, CLEAN, everything, tcs)
    want = logits_with(adapter, CLEAN, [(adapter.hook_mlp_out(0), lambda x, hook: tc.b_dec.expand_as(x).clone())])
    assert torch.allclose(gone, want, atol=1e-10)
    # removing only the error is the replacement model at that layer
    no_err = logits_under(adapter, CLEAN, Intervention.zero([Unit("error", 0, None)]), tcs)
    with replacement_model(adapter, tcs, layers=[0]) as model:
        repl = model(torch.tensor([CLEAN]))
    assert torch.allclose(no_err, repl, atol=1e-10)
    # one feature: the MLP output loses exactly a_j W_dec[j]
    x = {}
    with adapter.model.hooks(fwd_hooks=[(tc.hook_in, lambda v, hook: x.setdefault("in", v))]):
        adapter.model(torch.tensor([CLEAN]))
    acts = tc.activation(x["in"])[0]
    j = int(acts[3].argmax())
    one = logits_under(adapter, CLEAN, Intervention.zero([Unit("feature", 0, 3, j)]), tcs)
    delta = torch.zeros(1, len(CLEAN), adapter.facts.d_model, dtype=torch.float64)
    delta[0, 3] = acts[3, j] * tc.W_dec[j]
    want = logits_with(adapter, CLEAN, [(adapter.hook_mlp_out(0), lambda v, hook: v - delta)])
    assert torch.allclose(one, want, atol=1e-10)


def test_mean_and_patch_modes():
    adapter, tcs = build(dtype=torch.float64)
    units = [Unit("neuron", 0, None, 3), Unit("head", 1, 4, 0)]
    # patching from the prompt itself, or the per-position mean of itself, changes nothing
    base = adapter.model(torch.tensor([CLEAN]))
    for iv in (Intervention.patched(units, CLEAN), Intervention.mean(units, [CLEAN])):
        assert torch.allclose(logits_under(adapter, CLEAN, iv), base, atol=1e-12)
    # mean over two reference prompts of the same length: per position
    refs = [[1, 3, 3, 4, 5, 6], [1, 7, 8, 9, 10, 11]]
    cache = [adapter.model.run_with_cache(torch.tensor([r]))[1][adapter.hook_mlp_post(0)][0, :, 3] for r in refs]
    mean = (cache[0] + cache[1]) / 2
    got = logits_under(adapter, CLEAN, Intervention.mean([Unit("neuron", 0, None, 3)], refs))

    def fix(x, hook):
        x = x.clone()
        x[0, :, 3] = mean
        return x

    assert torch.allclose(got, logits_with(adapter, CLEAN, [(adapter.hook_mlp_post(0), fix)]), atol=1e-12)
    # references of other lengths: pooled over every position but the first
    pooled = Intervention.mean([Unit("neuron", 0, None, 3)], [[1, 3, 4], [1, 5]])
    all_vals = torch.cat([adapter.model.run_with_cache(torch.tensor([r]))[1][adapter.hook_mlp_post(0)][0, 1:, 3]
                          for r in ([1, 3, 4], [1, 5])])

    def fix2(x, hook):
        x = x.clone()
        x[0, :, 3] = all_vals.mean()
        return x

    want = logits_with(adapter, CLEAN, [(adapter.hook_mlp_post(0), fix2)])
    assert torch.allclose(logits_under(adapter, CLEAN, pooled), want, atol=1e-12)


def test_hooks_always_removed():
    adapter, tcs = build()
    model = adapter.model
    count = lambda: sum(len(hp.fwd_hooks) for hp in model.hook_dict.values())  # noqa: E731
    with pytest.raises(RuntimeError):
        with intervene(adapter, Intervention.zero([Unit("feature", 1, 2, 0)]), n_pos=6, transcoders=tcs):
            assert count() > 0
            raise RuntimeError("boom")
    assert count() == 0
    measure_intervention(adapter, CLEAN, Intervention.zero([Unit("mlp", 0, 3)]), Metric.logit_diff(3, 4))
    assert count() == 0


def test_bad_intervention_input():
    adapter, tcs = build()
    with pytest.raises(ValidationRunError, match="gated MLPs"):
        logits_under(adapter, CLEAN, Intervention.zero([Unit("gate", 0, 1, 1)]))
    with pytest.raises(ValidationRunError, match="2 layers"):
        logits_under(adapter, CLEAN, Intervention.zero([Unit("mlp", 5, 1)]))
    with pytest.raises(ValidationRunError, match="same token length"):
        logits_under(adapter, CLEAN, Intervention.patched([Unit("mlp", 0, 1)], CLEAN[:-1]))
    with pytest.raises(ValidationRunError, match="needs scale"):
        Intervention([Unit("mlp", 0, 1)], "scale")
    with pytest.raises(ValidationRunError, match="cannot be intervened"):
        Unit.from_node(NodeId("logit", 2, 5, 3))


def test_batched_rows_match_single_runs():
    adapter, tcs = build(dtype=torch.float64)
    metric = Metric.logit_diff(3, 4)
    ivs = [Intervention.zero([Unit("neuron", 0, 2, i)]) for i in range(5)]
    ivs.append(Intervention.scaled([Unit("feature", 1, None, None)], 0.3))
    out = run_rows(adapter, CLEAN, [[iv] for iv in ivs], metric, transcoders=tcs, batch_size=4)
    for iv, value in zip(ivs, out.metric.tolist(), strict=False):
        single = measure_intervention(adapter, CLEAN, iv, metric, transcoders=tcs).after
        assert value == pytest.approx(single, abs=1e-12)


# --------------------------------------------------------------------------- predicted vs actual, ablate
def test_total_effect_agrees_with_queries():
    from circuitgraph.queries import total_effects as query_total_effects
    from circuitgraph.validation import direct_effects, total_effects

    adapter, tcs = build(dtype=torch.float64, mlp="gated", positional="rotary")
    g = graph_of(adapter, tcs, dtype=torch.float64, mlp={0: "neurons", 1: "transcoders"})
    w = np.array([w for _, w in g.targets])
    assert np.allclose(total_effects(g), w @ query_total_effects(g), atol=1e-12)
    assert not np.allclose(total_effects(g), direct_effects(g))


def test_predicted_vs_actual_rows_and_json():
    adapter, tcs = build()
    g = graph_of(adapter, tcs)
    res = predicted_vs_actual(g, k=5)
    assert res.frozen_ok
    d = json.loads(json.dumps(res.to_dict()))
    assert len(d["rows"]) == 5
    for row in d["rows"]:
        assert {"node", "predicted", "actual_frozen", "actual"} <= set(row)
    assert "frozen self-test passed" in res.table()
    # transcoders: no real-model gradient of a spliced dictionary, and a note that says so
    assert all(r.predicted_gradient is None for r in res.rows) and res.correlation_gradient is None
    assert any("no gradient predictions" in n for n in res.notes)
    mean = predicted_vs_actual(g, k=4, mode="mean", reference_prompts=[CORRUPTED, [1, 2, 3, 4]])
    assert len(mean.rows) == 4


def test_empty_node_set_is_an_error():
    adapter, tcs = build()
    g = graph_of(adapter, tcs)
    with pytest.raises(ValidationRunError, match="node set is empty"):
        ablate(g, {"kind": "attention_head"}, controls=())
    with pytest.raises(ValidationRunError, match="node set is empty"):
        ablate(g, {"kind": "feature"}, positions=[0], controls=())


# --------------------------------------------------------------------------- controls
def test_controls_known_answers():
    adapter, tcs = build(dtype=torch.float64)
    g = graph_of(adapter, tcs, dtype=torch.float64)
    res = ablate(g, {"kind": "feature", "position": 5}, n_controls=6, seed=7, control_tolerance=0.05)
    matched, counted = res.controls
    assert matched.kind == "matched_magnitude" and counted.kind == "count_matched"
    for m in matched.magnitudes:
        assert abs(m - res.removed_magnitude) <= 0.05 * res.removed_magnitude + 1e-12
    assert counted.sizes == [len(res.nodes)] * 6
    assert all(np.isfinite(matched.effects)) and all(np.isfinite(counted.effects))
    again = ablate(g, {"kind": "feature", "position": 5}, n_controls=6, seed=7)
    assert again.controls[0].units == matched.units  # the seed fixes the draws
    other = ablate(g, {"kind": "feature", "position": 5}, n_controls=6, seed=8)
    assert other.controls[0].units != matched.units
    assert res.to_dict()["seed"] == 7


def test_control_draws_on_synthetic_magnitudes():
    mags = {("neuron", 0): (torch.tensor([[5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]]), None, None)}
    selected = [Unit("neuron", 0, None, 0)]
    sets = draw_controls(selected, mags, "matched_magnitude", 20, seed=0, tolerance=0.0)
    assert len(sets) == 20 and sets.shortfall is None
    for units, mass in sets:
        assert mass == 5.0 and len(units) == 5  # never the zero-mass units
        assert Unit("neuron", 0, None, 0) not in units
    # too little mass: no set can be drawn, and the draw says why (never an error, never p = 0)
    short = {("neuron", 0): (torch.tensor([[6.0, 1.0, 1.0, 1.0, 1.0, 1.0]]), None, None)}
    draw = draw_controls([Unit("neuron", 0, None, 0)], short, "matched_magnitude", 3, tolerance=0.05)
    assert len(draw) == 0 and "only 5" in draw.shortfall and "short of the 95%" in draw.shortfall
    draw = draw_controls([Unit("neuron", 0, None, 0)], {("neuron", 0): (torch.tensor([[5.0, 3.0, 3.0]]), None, None)},
                         "matched_magnitude", 1, tolerance=0.1, max_draws=5)
    assert len(draw) == 0 and re.search(r"closest removed 3 \(60.0%\)", draw.shortfall)
    # count-matched controls skip inactive units; 5 active others, 1 needed: 5 distinct sets exist
    draw = draw_controls(selected, mags, "count_matched", 8, seed=0)
    assert all(u[0].index in range(1, 6) for u, _ in draw)
    summary = summarise_controls("count_matched", 0, None, -1.0, 5.0, draw, [0.1 * i for i in range(8)])
    assert summary.degenerate.startswith("only") and summary.share_as_large is None
    assert summary.to_dict()["share_as_large"] is None and "degenerate" in summary.table()


def test_controls_only_from_units_that_can_reach_the_metric():
    from circuitgraph.validation.controls import reachable_positions

    # a logit readout at the last of 6 positions of a 2-layer model (resid locations 0..4)
    reach = reachable_positions(Metric.logit(3, position=-1), n_layers=2, n_pos=6)
    assert reach("feature", 1).tolist() == [False] * 5 + [True]  # no attention after the last MLP
    assert reach("feature", 0).all() and reach("head", 0).all() and reach("embed", -1).all()
    assert reach("head", 1).tolist() == [False] * 5 + [True]  # a head's unit sits at its destination position
    # a feature readout at layer 1, position 3: layer-1 features cannot reach it, layer 0 up to position 3
    reach = reachable_positions(Metric((Readout("feature", 3, layer=1, index=0),)), n_layers=2, n_pos=6)
    assert not reach("feature", 1).any() and reach("feature", 0).tolist() == [True] * 4 + [False] * 2
    ones = torch.ones(6, 4)
    mags = {("feature", 0): (ones, None, None), ("feature", 1): (ones, None, None)}
    sel = [Unit("feature", 1, 5, 0)]
    reach = reachable_positions(Metric.logit(3, position=-1), n_layers=2, n_pos=6)
    draw = draw_controls(sel, mags, "count_matched", 30, seed=1, reach=reach)
    picked = {u for units, _ in draw for u in units}
    assert all(u.position == 5 or u.layer == 0 for u in picked) and any(u.layer == 0 for u in picked)
    layered = draw_controls(sel, mags, "count_matched", 30, seed=1, reach=reach, match_layers=True)
    assert {(u.layer, u.position) for units, _ in layered for u in units} == {(1, 5)}


def test_degenerate_controls_report_no_p_value():
    adapter, tcs = build(dtype=torch.float64)
    g = graph_of(adapter, tcs, dtype=torch.float64)
    # every active feature of layer 1 at the last position is selected: no other can stand in for them there
    res = ablate(g, {"kind": "feature", "layer": 1, "position": 5}, controls=["count_matched", "matched_magnitude"],
                 n_controls=3, match_layers=True, match_positions=True)
    for c in res.controls:
        assert c.degenerate.startswith("only 0 of 3 control sets could be drawn") and c.share_as_large is None
    assert "degenerate (no p-value)" in res.table()
    # without matching, features of layer 0 at earlier positions can stand in
    res = ablate(g, {"kind": "feature", "layer": 1, "position": 5}, controls=["count_matched"], n_controls=3)
    assert res.controls[0].degenerate is None and res.controls[0].share_as_large is not None
    # every control set with the same effect
    draw = [([Unit("neuron", 0, 1, i)], 1.0) for i in range(4)]
    same = summarise_controls("count_matched", 0, None, -2.0, 1.0, draw, [0.0, 0.0, 1e-9, 0.0])
    assert "same effect" in same.degenerate and same.share_as_large is None


# --------------------------------------------------------------------------- patching
def test_patching_known_answers(tmp_path):
    adapter, tcs = build(dtype=torch.float64)
    g = graph_of(adapter, tcs, dtype=torch.float64)
    heat = tmp_path / "out" / "patch.png"
    res = patching(g, corrupted=CORRUPTED, granularity=("position", "layer", "head", "neuron", "feature"), heatmap=heat)
    assert res.recovery_everything == pytest.approx(1.0, abs=1e-12)
    assert res.recovery_nothing == 0.0
    resid = np.array(res.grid("residual stream").values)
    assert resid.shape == (3, len(CLEAN))
    assert resid[-1, -1] == pytest.approx(1.0, abs=1e-12)  # the final residual at the metric's position
    assert np.allclose(resid[0, [0, 1, 3, 4, 5]], 0.0) and resid[0, 2] == pytest.approx(1.0)  # only token 2 differs
    assert np.array(res.grid("heads (all positions)").values).shape == (2, adapter.facts.n_heads)
    assert res.rows_of("neuron") and res.rows_of("feature")
    assert heat.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in heat.parent.iterdir()] == ["patch.png"]  # written atomically, nothing left over
    json.dumps(res.to_dict())
    # unit sets: everything -> 1, nothing -> 0, a position after the metric's -> 0
    metric = Metric.logit_diff(3, 4, position=4)
    every = [Unit("embed", -1, t) for t in range(6)] + [Unit("pos_embed", -1, t) for t in range(6)]
    rec = patch_recovery(adapter, CLEAN, [1, 5, 8, 2, 9, 4], [every, [], [Unit("resid_pre", 1, 5)]], metric)
    assert rec == pytest.approx([1.0, 0.0, 0.0], abs=1e-12)


def test_patching_bad_input():
    adapter, tcs = build()
    g = graph_of(adapter, tcs)
    with pytest.raises(ValidationRunError, match="corrupted prompt has 5 tokens and the clean prompt 6.*same token"):
        patching(g, corrupted=CORRUPTED[:-1])
    with pytest.raises(ValidationRunError, match="undefined"):
        patching(g, corrupted=CLEAN, granularity=("layer",))


# --------------------------------------------------------------------------- faithfulness
def test_faithfulness_known_answers():
    adapter, tcs = build(dtype=torch.float64)
    g = graph_of(adapter, tcs, dtype=torch.float64)
    full = faithfulness(g, mode="zero")
    assert full.circuit_only == pytest.approx(full.full, abs=1e-12)  # the whole graph keeps everything
    assert full.share_kept == pytest.approx(1.0, abs=1e-9)
    emb = g.subgraph([n.id for n in g.nodes if n.kind in ("embedding", "target", "logit")])
    part = faithfulness(emb, mode="zero")
    assert part.empty == pytest.approx(full.empty)  # same universe
    assert part.full == pytest.approx(full.full)
    assert part.n_circuit_units == len(CLEAN) and part.share_kept is not None
    mean = faithfulness(g, mode="mean", reference_prompts=[CORRUPTED])
    assert mean.share_kept is not None and json.dumps(mean.to_dict())


# --------------------------------------------------------------------------- sign regimes
def test_sign_regimes_and_echo_removal():
    adapter, tcs = build(dtype=torch.float64, mlp="gated", positional="rotary")
    g = graph_of(adapter, tcs, dtype=torch.float64, mlp="neurons")
    res = sign_regimes(g, prompts=[[1, 2, 3, 4, 5, 6, 7, 8], [1, 9, 8, 7, 6, 5]], top_k=4, echo_threshold=0.5,
                       n_controls=3)
    for shares in res.regime_shares.values():
        assert sum(shares.values()) == pytest.approx(1.0)
    assert res.echo_dominated and all(n.echo_share >= 0.5 for n in res.echo_dominated)
    assert res.loss_change is not None and res.controls
    json.dumps(res.to_dict())
    # removing the echo of a neuron sets hook_post to b_in exactly at its echo activations
    a = adapter
    mask = {0: torch.ones(1, a.facts.d_mlp, dtype=torch.bool)}
    seen = {}
    grab = lambda v, hook: seen.setdefault(hook.name, v.clone())  # noqa: E731
    with echo_removed(a, mask, first_position=0) as model, model.hooks(
            fwd_hooks=[(a.hook_mlp_pre(0), grab), (a.hook_mlp_pre_linear(0), grab), (a.hook_mlp_post(0), grab)]):
        model(torch.tensor([CLEAN]))
    gate, value, post = seen[a.hook_mlp_pre(0)], seen[a.hook_mlp_pre_linear(0)], seen[a.hook_mlp_post(0)]
    echo = (gate <= 0) & (value < 0)
    b_in = a.mlp_weights(0)["b_in"]
    assert echo.any()
    assert torch.allclose(post[echo], b_in.expand_as(post)[echo])
    want = a.mlp_act_fn(0)(gate) * value + b_in
    assert torch.allclose(post[~echo], want[~echo])


def test_sign_regimes_needs_gated_mlp():
    adapter, tcs = build()
    with pytest.raises(ValidationRunError, match="gated"):
        sign_regimes(adapter=adapter, prompts=[CLEAN])


# --------------------------------------------------------------------------- replacement fidelity
def test_replacement_fidelity():
    adapter, tcs = build(dtype=torch.float64)
    g = graph_of(adapter, tcs, dtype=torch.float64)
    res = replacement_fidelity(g, prompts=[[1, 2, 3, 4, 5, 6, 7]])
    assert len(res.rows) == 2 and 0 <= res.agreement <= 1 and res.kl >= 0
    # the replacement model is every error removed
    every_error = Intervention.zero([Unit("error", l, None) for l in (0, 1)])
    metric = Metric.logit_diff(3, 4)
    out = run_rows(adapter, CLEAN, [[every_error]], metric, transcoders=tcs, with_loss=True)
    assert out.metric[0].item() == pytest.approx(res.metric_replacement, abs=1e-10)
    assert out.loss[0].item() == pytest.approx(res.rows[0].loss_replacement, abs=1e-10)
    assert res.task_loss is not None and "agreement" in res.table()


# --------------------------------------------------------------------------- dispatcher
def test_run_check_every_kind(tmp_path):
    from pydantic import TypeAdapter

    from circuitgraph.spec.validation import Check

    adapter, tcs = build(mlp="gated", positional="rotary")
    g = graph_of(adapter, tcs)
    items = [
        {"ablate": {"nodes": {"kind": "feature", "position": 5}, "n_controls": 2}},
        {"predicted_vs_actual": {"k": 3}},
        {"patching": {"corrupted": {"tokens": CORRUPTED}, "metric": {"logit_diff": [3, 4]},
                      "granularity": ["position", "layer"], "heatmap": str(tmp_path / "h.png")}},
        {"faithfulness": {"mode": "zero"}},
        {"sign_regimes": {"top_k": 3, "prompts": [{"tokens": [1, 2, 3, 4, 5]}]}},
        {"replacement_fidelity": {}},
    ]
    parser = TypeAdapter(Check)
    for item in items:
        for spec in (item, parser.validate_python(item)):
            res = run_check(g, spec)
            assert isinstance(res, CheckResult)
            d = json.loads(json.dumps(res.to_dict()))
            assert set(d) == {"kind", "params", "result"} and d["kind"] == next(iter(item))
            assert res.table().startswith(f"### {d['kind']}")
    assert (tmp_path / "h.png").is_file()
    with pytest.raises(ValidationRunError, match="unknown validation check"):
        run_check(g, {"nonsense": {}})
    with pytest.raises(ValidationRunError, match="same token length"):
        run_check(g, {"patching": {"corrupted": {"tokens": CORRUPTED[:3]}}})


# --------------------------------------------------------------------------- the demo example
def test_validate_demo_example(tmp_path):
    import importlib.util

    from circuitgraph.builtin import demo_path

    if not (demo_path() / "model" / "config.json").is_file():
        pytest.skip("the built-in demo model is not in the package yet (python scripts/train_demo.py)")
    spec = importlib.util.spec_from_file_location("validate_demo", REPO / "examples" / "validate_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entries = module.main(tmp_path)
    by_kind = {e["kind"]: e["result"] for e in entries}
    assert by_kind["predicted_vs_actual"]["frozen_ok"] is True
    assert by_kind["patching"]["recovery_everything"] == pytest.approx(1.0)
    assert by_kind["patching"]["recovery_nothing"] == 0.0
    ablations = [e["result"] for e in entries if e["kind"] == "ablate"]
    assert ablations[0]["controls"][0]["kind"] == "matched_magnitude"
    for c in ablations[0]["controls"]:  # the default controls measure something on the demo
        assert c["degenerate"] is None and c["std_effect"] > 1e-3 and c["share_as_large"] is not None
    for name in ("validate_demo.md", "patching_heatmap.png", "validation.json"):
        assert (tmp_path / name).is_file()
