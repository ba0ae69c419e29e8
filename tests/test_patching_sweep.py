"""The patching check's neuron sweep (chosen layers), patched sets and share of layer, against a
hand loop of single patches written with raw hooks."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch

from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.errors import ValidationRunError
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_config, tiny_model
from circuitgraph.validation import Metric, Unit, patching, run_check

CLEAN = [1, 5, 7, 2, 9, 4, 11, 3]
CORRUPTED = [1, 5, 8, 2, 9, 4, 11, 3]
A, B = 3, 4  # metric: logit(A) - logit(B) at the last position


@functools.cache
def model(mlp: str):
    cfg = tiny_config(norm="RMS" if mlp == "gated" else "LN", mlp=mlp,
                      positional="rotary" if mlp == "gated" else "learned", n_layers=3, d_mlp=24)
    m = tiny_model(cfg)
    with tempfile.TemporaryDirectory(prefix="cg-sweep-") as tmp:
        root = save_bundle(Path(tmp), m, random_transcoders(m))
        return load_model_dir(root / "model", dtype="float64")


def metric_of(adapter, tokens, hooks=()):
    with adapter.model.hooks(fwd_hooks=list(hooks)):
        logits = adapter.model(torch.tensor([tokens]))
    return float(logits[0, -1, A].detach() - logits[0, -1, B].detach())


def clean_values(adapter, names):
    _, cache = adapter.model.run_with_cache(torch.tensor([CLEAN]), names_filter=lambda n: n in names)
    return cache


def hand_recovery(adapter, patches):
    """``patches``: [(hook name, index or None)]: copied from the clean run at every position."""
    cache = clean_values(adapter, {n for n, _ in patches})

    def make(name, index):
        def fn(x, hook):
            x = x.clone()
            if index is None:
                x[:] = cache[name]
            else:
                x[..., index] = cache[name][..., index]
            return x
        return fn

    c, x = metric_of(adapter, CLEAN), metric_of(adapter, CORRUPTED)
    p = metric_of(adapter, CORRUPTED, [(n, make(n, i)) for n, i in patches])
    return (p - x) / (c - x)


@pytest.mark.parametrize("mlp", ["gelu", "gated"])
def test_neuron_sweep_equals_a_hand_loop_of_single_patches(mlp):
    a = model(mlp)
    res = patching(adapter=a, clean=CLEAN, corrupted=CORRUPTED, metric=Metric.logit_diff(A, B),
                   granularity=["neuron"], layers=[1], sets=[[Unit("neuron", 1, None, 2), Unit("neuron", 1, None, 5)]],
                   set_names=["two"])
    rows = res.rows_of("neuron")
    assert {r.layer for r in rows} == {1} and len(rows) == a.facts.d_mlp  # every neuron differs here
    whole = hand_recovery(a, [("blocks.1.hook_mlp_out", None)])
    (layer_row,) = [r for r in res.rows if r.unit == "mlp/1/*"]
    assert layer_row.recovery == pytest.approx(whole, abs=1e-9)
    for r in rows:
        want = hand_recovery(a, [("blocks.1.mlp.hook_post", r.index)])
        assert r.recovery == pytest.approx(want, abs=1e-9), r.unit
        assert r.share_of_layer == pytest.approx(want / whole, rel=1e-9, abs=1e-9)
    (two,) = res.rows_of("set")
    assert two.unit == "two"
    assert two.recovery == pytest.approx(hand_recovery(a, [("blocks.1.mlp.hook_post", [2, 5])]), abs=1e-9)
    grid = res.grid("neurons (all positions)")
    assert grid.rows == ["MLP 1"] and len(grid.columns) == a.facts.d_mlp
    assert grid.values[0][7] == pytest.approx(next(r.recovery for r in rows if r.index == 7))
    assert "share of layer" in res.table()


def test_spec_layers_and_sets(tmp_path):
    a = model("gated")
    g = attribute(a, CLEAN, None, [ResolvedTarget(kind="logit_diff", position=len(CLEAN) - 1, tokens=(A, B))],
                  dtype=torch.float64, mlp="neurons")
    item = {"patching": {"corrupted": {"tokens": CORRUPTED}, "metric": {"logit_diff": [A, B]},
                         "granularity": ["neuron", "head"], "layers": [2],
                         "sets": [{"name": "n", "neurons": [[2, 3]]}, {"mlps": [0], "heads": [[1, 1]]}],
                         "heatmap": str(tmp_path / "sweep.png")}}
    res = run_check(g, item).result
    assert {r.layer for r in res.rows_of("neuron")} == {2} and {r.layer for r in res.rows_of("head")} == {2}
    names = [r.unit for r in res.rows_of("set")]
    assert names == ["n", "head/1/*/1 + mlp/0/*/0"]
    assert res.rows_of("set")[0].recovery == pytest.approx(
        hand_recovery(a, [("blocks.2.mlp.hook_post", 3)]), abs=1e-9)
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert res.grid("heads (all positions)").rows == ["layer 2"]  # only the swept layers are drawn
    with pytest.raises(ValidationRunError, match="out of range"):
        run_check(g, {"patching": {"corrupted": {"tokens": CORRUPTED}, "sets": [{"neurons": [[2, 999]]}]}})
    with pytest.raises(ValidationRunError, match="layers"):
        run_check(g, {"patching": {"corrupted": {"tokens": CORRUPTED}, "layers": [7]}})
