"""ablate with evaluation rows apart from the selection row (the graph's prompt), against an
independent computation with raw hooks: the change is the mean over the evaluation rows, the
controls are matched on what the units remove there, the graph's own predictions are left out,
and controls that cannot be drawn as asked make the check ``uncontrolled``, never ``ok``."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.errors import ValidationRunError
from circuitgraph.testing.synthetic import tiny_model
from circuitgraph.validation import ablate, run_check
from tests.helpers.tiny_models import loaded_model

SELECT = [1, 5, 7, 2, 9, 4]
EVAL = [[1, 6, 3, 8, 2, 5], [1, 9, 9, 4, 7, 3], [1, 2, 8, 6, 5, 7]]
NODES = {"kind": "neuron", "layer": 1, "position": 5}


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def graph():
    adapter = loaded_model(tiny_model(mlp="gelu"), "cg-ablate-eval-", "float64")
    target = ResolvedTarget(kind="logit_diff", position=5, tokens=(3, 4))
    return attribute(adapter, SELECT, None, [target], dtype=torch.float64, mlp="neurons")


def _metric(adapter, toks, zero=()):
    """logit 3 - logit 4 at the last position, with ``zero``'s (layer, position, index) outputs zeroed."""
    hooks = []
    for layer, pos, idx in zero:
        def edit(v, hook, pos=pos, idx=idx):
            v = v.clone()
            v[0, pos, idx] = 0.0
            return v
        hooks.append((f"blocks.{layer}.mlp.hook_post", edit))
    with torch.no_grad(), adapter.model.hooks(fwd_hooks=hooks):
        logits = adapter.model(torch.tensor([toks]))
    return float(logits[0, -1, 3] - logits[0, -1, 4])


def test_the_change_is_the_mean_over_the_evaluation_rows():
    g = graph()
    a = g.context.adapter
    res = ablate(g, NODES, eval_prompts=[{"tokens": t} for t in EVAL], n_controls=4, seed=2)
    chosen = [n for n in g.nodes if n.kind == "neuron" and n.layer == 1 and n.position == 5]
    units = [(1, 5, n.index) for n in chosen]
    assert len(units) == len(res.nodes) > 0
    before = np.mean([_metric(a, t) for t in EVAL])
    after = np.mean([_metric(a, t, units) for t in EVAL])
    assert res.before == pytest.approx(before, abs=1e-10) and res.after == pytest.approx(after, abs=1e-10)
    # the magnitude removed on the evaluation rows (|a| of each unit, summed over the rows), from a raw cache
    removed = 0.0
    for t in EVAL:
        _, cache = a.model.run_with_cache(torch.tensor([t]), names_filter="blocks.1.mlp.hook_post")
        removed += sum(abs(float(cache["blocks.1.mlp.hook_post"][0, 5, i])) for _, _, i in units)
    assert res.removed_magnitude == pytest.approx(removed, rel=1e-9)
    matched = res.controls[0]
    assert matched.kind == "matched_magnitude" and len(matched.effects) == 4
    for m in matched.magnitudes:
        assert abs(m - removed) <= 0.05 * removed + 1e-12
    # each control's effect is its own mean over the rows
    first = [(u.layer, u.position, u.index) for u in _units(matched.units[0])]
    effect = np.mean([_metric(a, t, first) - _metric(a, t) for t in EVAL])
    assert matched.effects[0] == pytest.approx(effect, abs=1e-10)
    assert res.predicted is None and res.predicted_total is None and res.frozen_change is None
    assert res.params["n_eval_rows"] == 3 and res.params["same_rows"] is False
    # without evaluation rows: the graph's prompt, as before
    own = ablate(g, NODES, n_controls=4, seed=2)
    assert own.before == pytest.approx(_metric(a, SELECT), abs=1e-10) and own.params["same_rows"] is True
    assert own.predicted is not None


def _units(names):
    from circuitgraph.validation.interventions import Unit

    out = []
    for s in names:  # "neuron/1/5/17"-style names of Unit.__str__
        site, layer, pos, idx = s.split("/")[:4]
        out.append(Unit(site, int(layer), int(pos), int(idx)))
    return out


def test_evaluation_rows_must_be_as_long_as_the_graph_prompt():
    with pytest.raises(ValidationRunError, match="eval_prompts\\[0\\]: 4 tokens"):
        ablate(graph(), NODES, eval_prompts=[{"tokens": [1, 2, 3, 4]}])


def test_spec_keys_reach_the_check(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"tokens": {t}}}\n' for t in EVAL), encoding="utf-8")
    item = {"ablate": {"nodes": NODES, "eval_prompts": [{"tokens": EVAL[0]}], "eval_dataset": str(data),
                       "max_rows": 2, "n_controls": 3}}
    res = run_check(graph(), item).result
    assert res.params["n_eval_rows"] == 3
    direct = ablate(graph(), NODES, eval_prompts=[{"tokens": t} for t in [EVAL[0]] + EVAL[:2]], n_controls=3)
    assert res.change == direct.change


def test_controls_short_of_what_was_asked_are_uncontrolled():
    # every neuron of layer 1 at the last position: no other unit of that stratum can stand in
    res = ablate(graph(), {"kind": "neuron", "position": 5}, eval_prompts=[{"tokens": t} for t in EVAL],
                 n_controls=3, match_layers=True, match_positions=True, controls=["count_matched"])
    assert res.status == "uncontrolled" and "0 of 3 sets drawn" in res.reason
    assert res.to_dict()["status"] == "uncontrolled"
