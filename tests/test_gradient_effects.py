"""First-order removal effects by autograd (``circuitgraph.validation.gradient_effects``).

Independent checks, on tiny models: in the graph's frozen linear model the gradient x activation
of every node equals the graph's total effect (the back-substitution over the edges) when the
graph keeps every neuron; in the real model it is the derivative of the measured effect of
scaling the node (a finite difference of real interventions); ``predicted_vs_actual`` reports it.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.testing.synthetic import save_bundle, tiny_model
from circuitgraph.validation import Intervention, Metric, Unit, predicted_vs_actual, run_rows, total_effects
from circuitgraph.validation.gradient_effects import gradient_effects

TOKENS = [1, 5, 7, 2, 9, 4]
VARIANTS = [("LN", "gelu", "learned"), ("RMS", "gated", "rotary"), ("LN", "gated", "learned"), ("RMS", "gelu", "rotary")]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@functools.cache
def _adapter(norm: str, mlp: str, positional: str):
    model = tiny_model(norm=norm, mlp=mlp, positional=positional)
    with tempfile.TemporaryDirectory(prefix="cg-gradient-") as tmp:
        root = save_bundle(Path(tmp), model, None)
        return load_model_dir(root / "model", dtype="float64")


def _graph(adapter, **kwargs):
    target = ResolvedTarget(kind="logit_diff", position=len(TOKENS) - 1, tokens=(3, 4))
    return attribute(adapter, TOKENS, None, [target], mlp="neurons", dtype=torch.float64, **kwargs)


def _units(g):
    nodes = [n for n in g.nodes if n.kind in ("neuron", "embedding")]
    return nodes, [Unit.from_node(n.id) for n in nodes]


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
def test_linearised_gradient_is_the_graphs_total_effect(variant):
    """Every neuron kept (the BOS position's too): -(removal effect) in the frozen linear model,
    by autograd, equals the graph's total effect V of every neuron and embedding."""
    adapter = _adapter(*variant)
    g = _graph(adapter, bos_nodes=True)
    nodes, units = _units(g)
    V = total_effects(g)
    lin = gradient_effects(adapter, TOKENS, Metric.from_graph(g), units, linearised=True,
                           linearisation=g.context.linearisation)
    want = np.array([V[g.index_of(n.id)] for n in nodes])
    got = np.array(lin)
    scale = np.abs(want).max()
    assert scale > 1e-3
    assert np.abs(got - want).max() <= 1e-5 * scale, np.abs(got - want).max() / scale
    # the real model's gradient is a different number (norms, patterns and gates respond)
    real = np.array(gradient_effects(adapter, TOKENS, Metric.from_graph(g), units))
    assert np.abs(real - want).max() > 1e-3 * scale


def test_a_folded_graph_misses_the_paths_through_folded_neurons():
    """max_neuron_nodes folds neurons into remainders, which have no incoming edges: the graph's
    total effect of a kept node no longer counts paths through folded neurons, the linear
    model's gradient still does."""
    adapter = _adapter("RMS", "gated", "rotary")
    g = _graph(adapter, max_neuron_nodes=6)
    nodes, units = _units(g)
    V = total_effects(g)
    want = np.array([V[g.index_of(n.id)] for n in nodes])
    lin = np.array(gradient_effects(adapter, TOKENS, Metric.from_graph(g), units, linearised=True,
                                    linearisation=g.context.linearisation))
    assert np.abs(lin - want).max() > 1e-3 * np.abs(want).max()


@pytest.mark.parametrize("variant", VARIANTS[:2], ids=["-".join(v) for v in VARIANTS[:2]])
def test_real_gradient_is_the_derivative_of_the_measured_effect(variant):
    """The real model's a . dM/da is the slope of the measured effect of scaling the unit by c
    near c = 1 (central finite difference of real interventions)."""
    adapter = _adapter(*variant)
    g = _graph(adapter)
    metric = Metric.from_graph(g)
    nodes, units = _units(g)
    units = units[::3]
    grad = gradient_effects(adapter, TOKENS, metric, units)
    h = 1e-4
    rows = [[]] + [[Intervention((u,), "scale", scale=1 + s)] for u in units for s in (h, -h)]
    out = run_rows(adapter, TOKENS, rows, metric).metric
    fd = [(float(out[1 + 2 * j]) - float(out[2 + 2 * j])) / (2 * h) for j in range(len(units))]
    assert np.allclose(grad, fd, rtol=1e-5, atol=1e-7 * max(abs(x) for x in fd))


def test_predicted_vs_actual_reports_the_gradient_prediction():
    adapter = _adapter("RMS", "gated", "rotary")
    g = _graph(adapter)
    res = predicted_vs_actual(g, k=6)
    units = [Unit.from_node(r.node) for r in res.rows]
    grad = gradient_effects(adapter, TOKENS, Metric.from_graph(g), units)
    for row, gr in zip(res.rows, grad, strict=True):
        assert row.predicted_gradient == pytest.approx(-gr, rel=1e-9, abs=1e-12)
    assert res.correlation_gradient is not None and res.sign_agreement_gradient is not None
    d = res.to_dict()
    assert "correlation_gradient" in d and "predicted_gradient" in d["rows"][0]
    assert "gradient" in res.table()


@pytest.mark.parametrize("family", ["qwen2", "gpt2", "gemma2"])
def test_linearised_gradient_on_other_families(family, tmp_path):
    """The same identity on tiny transformers checkpoints of three families (GQA and q/k/v biases;
    LayerNorm, GELU and learned positions; post-norms, soft caps, GeGLU, a scaled embedding),
    and the real-model gradient reported by predicted_vs_actual there."""
    from tests.helpers.hf_checkpoints import hf_checkpoint as _checkpoint

    adapter = load_model_dir(_checkpoint(family, tmp_path / "model"), dtype="float64")
    g = _graph(adapter, bos_nodes=True)
    nodes, units = _units(g)
    V = total_effects(g)
    want = np.array([V[g.index_of(n.id)] for n in nodes])
    got = np.array(gradient_effects(adapter, TOKENS, Metric.from_graph(g), units, linearised=True,
                                    linearisation=g.context.linearisation))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    res = predicted_vs_actual(g, k=5)
    assert all(r.predicted_gradient is not None for r in res.rows)


def test_units_without_a_gradient_and_bad_units():
    from circuitgraph.errors import ValidationRunError

    adapter = _adapter("RMS", "gated", "rotary")
    g = _graph(adapter)
    metric = Metric.from_graph(g)
    assert gradient_effects(adapter, TOKENS, metric, [Unit("attn", 0, 2, 0)]) == [None]
    with pytest.raises(ValidationRunError, match="one position and one index"):
        gradient_effects(adapter, TOKENS, metric, [Unit("neuron", 0, None, 3)])
    with pytest.raises(ValidationRunError, match="needs the graph's linearisation"):
        gradient_effects(adapter, TOKENS, metric, [Unit("neuron", 0, 2, 3)], linearised=True)
