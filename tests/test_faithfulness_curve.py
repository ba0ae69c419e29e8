"""The ``faithfulness_curve`` check: recovery 1 at size 1, the fully ablated model at size 0
(computed independently with TransformerLens hooks), CPR/CMD by the trapezoid rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.errors import ValidationRunError
from circuitgraph.validation import curve_areas, faithfulness_curve, run_check
from tests.helpers.bundles import load_bundle, make_bundle


def test_curve_areas_by_hand():
    # points (0, 0), (0.5, 0.5), (1, 1): CPR = 0.5; CMD = 0.5
    assert curve_areas([0.5], [0.5]) == pytest.approx((0.5, 0.5))
    # (0, 0), (0.25, 1), (1, 1): CPR = 0.125 + 0.75 = 0.875, CMD = 0.125
    assert curve_areas([0.25, 1.0], [1.0, 1.0]) == pytest.approx((0.875, 0.125))
    # overshoot counts in CMD by its absolute gap: (0,0) (0.5, 1.5) (1, 1): CPR 0.375+0.625, CMD 0.25+0.125
    assert curve_areas([0.0, 0.5, 1.0], [0.0, 1.5, 1.0]) == pytest.approx((1.0, 0.5))


def _component_graph():
    from circuitgraph.adapters import ModelAdapter
    from circuitgraph.testing.synthetic import tiny_model

    a = ModelAdapter(tiny_model(norm="LN", mlp="gelu", n_layers=2, seed=2))
    tokens = [1, 5, 7, 2, 9, 4]
    g = attribute(a, tokens, None, [ResolvedTarget(kind="logit_diff", position=5, tokens=(3, 8))],
                  dtype=torch.float64, mlp="mlp", attention="heads", positional_nodes=True)
    return a, tokens, g


def _fully_ablated_by_hooks(a, tokens, positional=True):
    """Zero every embedding, positional embedding, head (hook_z) and MLP output (from position 1:
    the graph has no MLP node at BOS) with TransformerLens hooks only."""
    m = a.model

    def zero(value, hook):
        return torch.zeros_like(value)

    def zero_mlp(value, hook):
        value = value.clone()
        value[:, 1:] = 0
        return value

    hooks = [("hook_embed", zero)] + ([("hook_pos_embed", zero)] if positional else [])
    for l in range(m.cfg.n_layers):
        hooks += [(f"blocks.{l}.attn.hook_z", zero), (f"blocks.{l}.hook_mlp_out", zero_mlp)]
    with torch.no_grad():
        logits = m.run_with_hooks(torch.tensor([tokens]), fwd_hooks=hooks)[0]
    return float(logits[5, 3] - logits[5, 8])


@pytest.mark.parametrize("unit", ["nodes", "edges"])
def test_size_one_recovers_exactly_and_size_zero_is_the_ablated_model(unit):
    a, tokens, g = _component_graph()
    res = faithfulness_curve(g, sizes=[0.0, 0.1, 0.5, 1.0], ablation="zero", unit=unit)
    with torch.no_grad():
        logits = a.model(torch.tensor([tokens]))[0]
    clean = float(logits[5, 3] - logits[5, 8])
    assert res.full == pytest.approx(clean, abs=1e-10)
    assert res.recovery[-1] == 1.0 and res.values[-1] == pytest.approx(clean, abs=1e-10)
    assert res.recovery[0] == 0.0
    if unit == "nodes":
        assert res.empty == pytest.approx(_fully_ablated_by_hooks(a, tokens), abs=1e-9)
    else:  # every edge into the target removed: the readout minus all direct contributions = its constant
        const = g.node(g.target_ids[0]).pre_activation - sum(w for _, w in g.in_edges(g.target_ids[0]))
        assert res.empty == pytest.approx(const, abs=1e-9)
    assert res.cpr == pytest.approx(curve_areas(res.sizes, res.recovery)[0])


def test_feature_graph_nodes_curve_and_spec_dispatch(tmp_path):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned"), "float64")
    g = attribute(adapter, tokens, tcs, [ResolvedTarget(kind="logit", position=len(tokens) - 1, tokens=(4,))],
                  dtype=torch.float64)
    out = run_check(g, {"faithfulness_curve": {"sizes": [0.05, 0.2, 1.0], "unit": "nodes", "ablation": "mean",
                                               "plot": str(tmp_path / "curve.png")}})
    r = out.result
    assert r.recovery[-1] == 1.0 and len(r.values) == 3 and r.cpr is not None and 0 <= r.cmd
    assert (tmp_path / "curve.png").stat().st_size > 1000
    assert np.isfinite(r.empty)
    edges = faithfulness_curve(g, sizes=[0.0, 0.1, 1.0], unit="edges")
    assert edges.recovery[0] == 0.0 and edges.recovery[-1] == 1.0 and edges.n_total == g.n_edges


def test_edge_ablation_at_a_feature_reader_equals_a_hook_computation(tmp_path):
    """Removing one edge into a last-layer transcoder feature: the feature's pre-activation drops by
    the edge, its new ReLU activation minus the old times its decoder row (sae-lens's W_dec) is
    added to the MLP output, and the logit is read off the real model (TransformerLens hooks)."""
    from circuitgraph.validation.faithfulness_curves import _edge_ablated_metric
    from circuitgraph.validation.metrics import Metric

    path = make_bundle(tmp_path, "ln-gelu-learned")
    adapter, tcs, tokens = load_bundle(path, "float64")
    T = len(tokens)
    g = attribute(adapter, tokens, tcs, [ResolvedTarget(kind="logit", position=T - 1, tokens=(4,))],
                  dtype=torch.float64)
    e = max((i for i in range(g.n_edges) if g.nodes[g.edge_target[i]].kind == "feature"
             and g.nodes[g.edge_target[i]].layer == 1 and g.nodes[g.edge_target[i]].position == T - 1),
            key=lambda i: abs(g.edge_weight[i]))
    feat, w = g.nodes[g.edge_target[e]].id, float(g.edge_weight[e])
    got = _edge_ablated_metric(g.context, g, Metric.from_graph(g), np.array([e]))
    from sae_lens import SAE

    sae = SAE.load_from_disk(str(path / "transcoders" / "layer_1"), device="cpu").to(torch.float64)
    m = adapter.model
    seen = {}

    def grab(value, hook):
        seen["x"] = value
        return value

    def splice(value, hook):
        pre = seen["x"][0, feat.position] @ sae.W_enc[:, feat.index] + sae.b_enc[feat.index]
        new, old = torch.relu(pre - w), torch.relu(pre)
        value = value.clone()
        value[0, feat.position] += (new - old) * sae.W_dec[feat.index]
        return value

    with torch.no_grad():
        logits = m.run_with_hooks(torch.tensor([tokens]), fwd_hooks=[
            ("blocks.1.ln2.hook_normalized", grab), ("blocks.1.hook_mlp_out", splice)])[0]
    assert got == pytest.approx(float(logits[T - 1, 4]), abs=1e-10)
    assert got != pytest.approx(g.node(g.target_ids[0]).pre_activation, abs=1e-6)  # the edge mattered


def test_control_positions_reach_later_positions_when_bidirectional():
    """Random controls for ablate come from positions that can affect the metric: through attention,
    earlier positions under causal attention, every position under bidirectional attention."""
    from circuitgraph.validation.controls import reachable_positions
    from circuitgraph.validation.metrics import Metric

    metric = Metric.logit(3, position=2)
    causal = reachable_positions(metric, 2, 5)("embed", -1)
    both = reachable_positions(metric, 2, 5, causal=False)("embed", -1)
    assert causal.tolist() == [True, True, True, False, False] and both.all()
    # the last MLP writes after every attention layer: its own position only, either way
    assert reachable_positions(metric, 2, 5, causal=False)("mlp", 1).tolist() == [False, False, True, False, False]


# ---------------------------------------------------------------- edges with mean and patch ablation
_PATCH = [1, 3, 2, 8, 6, 4]
_MEAN = ([1, 9, 9, 3, 2, 4], [1, 2, 6, 6, 5, 7])


def _edge_key(node_id):
    return (node_id.kind, node_id.layer, node_id.position, -1 if node_id.kind == "embedding" else node_id.index)


def _edges_by_pair(g):
    return {(_edge_key(g.nodes[s].id), _edge_key(g.nodes[t].id)): float(w)
            for s, t, w in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False)}


@pytest.mark.parametrize("ablation", ["mean", "patch"])
def test_edge_mean_and_patch_recover_exactly_at_size_one(ablation):
    a, tokens, g = _component_graph()
    kw = {"patch_prompt": _PATCH} if ablation == "patch" else {"reference_prompts": list(_MEAN)}
    res = faithfulness_curve(g, sizes=[0.0, 0.2, 1.0], ablation=ablation, unit="edges", **kw)
    with torch.no_grad():
        logits = a.model(torch.tensor([tokens]))[0]
    assert res.full == pytest.approx(float(logits[5, 3] - logits[5, 8]), abs=1e-10)
    assert res.recovery[-1] == 1.0 and res.values[-1] == res.full
    assert res.recovery[0] == 0.0 and res.empty != pytest.approx(res.full, abs=1e-6)


def test_edge_patch_from_the_clean_prompt_changes_nothing_at_any_size():
    """Patching every edge with its own value: the metric is the clean one at every size (so the
    recovery's denominator is 0 and it is reported undefined, with a note)."""
    _, tokens, g = _component_graph()
    res = faithfulness_curve(g, sizes=[0.0, 0.1, 0.5, 1.0], ablation="patch", unit="edges", patch_prompt=tokens)
    assert res.empty == pytest.approx(res.full, abs=1e-12)
    assert all(v == pytest.approx(res.full, abs=1e-12) for v in res.values)
    assert res.recovery == [None, None, None, None]
    assert any("undefined" in n for n in res.notes)
    zero = faithfulness_curve(g, sizes=[0.0, 0.1], ablation="zero", unit="edges")
    assert zero.empty != pytest.approx(res.full, abs=1e-6)  # the patch, not a no-op, made them equal


def _neuron_graph():
    from circuitgraph.adapters import ModelAdapter
    from circuitgraph.testing.synthetic import tiny_model

    a = ModelAdapter(tiny_model(norm="LN", mlp="gelu", n_layers=2, seed=3))
    tokens = [1, 5, 7, 2, 9, 4]
    g = attribute(a, tokens, None, [ResolvedTarget(kind="logit_diff", position=5, tokens=(3, 8))],
                  dtype=torch.float64, mlp="neurons", bias_nodes=True, positional_nodes=True)
    return a, tokens, g


def test_edge_patch_at_neuron_readers_and_size_zero_equal_hook_computations():
    """Layer-0 neurons read only embeddings, positional and bias nodes, so with bias nodes their
    constant is prompt independent and replacing every edge into them by its patch-prompt value
    moves their pre-activation by (pre on the patch prompt - pre on the clean prompt), added to the
    live input as the real model runs on: TransformerLens only (both runs' hook_mlp_pre).  Later
    readers' constants carry folded writers through frozen norms (prompt dependent), so for them
    the shift is the sum over their in-edges of (patch graph's weight - clean weight), summed by
    hand from the two graphs' edge lists, and added by TransformerLens hooks."""
    from circuitgraph.validation.faithfulness_curves import _edge_ablated_metric, _edge_reference_values
    from circuitgraph.validation.metrics import Metric

    a, tokens, g = _neuron_graph()
    m = a.model
    L = m.cfg.n_layers
    runs = []
    for prompt in (tokens, _PATCH):
        seen = {}

        def grab(value, hook, seen=seen):
            seen[hook.name] = value.clone()
            return value

        with torch.no_grad():
            logits = m.run_with_hooks(torch.tensor([prompt]), fwd_hooks=[
                (f"blocks.{l}.mlp.hook_pre", grab) for l in range(L)])[0]
        seen["metric"] = float(logits[5, 3] - logits[5, 8])
        runs.append(seen)
    clean, ref = runs

    patch_graph = attribute(a, _PATCH, None, [ResolvedTarget(kind="logit_diff", position=5, tokens=(3, 8))],
                            dtype=torch.float64, mlp="neurons", bias_nodes=True, positional_nodes=True)
    by_pair, clean_pairs = _edges_by_pair(patch_graph), _edges_by_pair(g)
    by_hand: dict = {}
    for (src, dst), w in clean_pairs.items():
        by_hand[dst] = by_hand.get(dst, 0.0) + by_pair.get((src, dst), 0.0) - w

    def by_hooks(layers, targets):
        readers = [n.id for n in g.nodes if n.kind == "neuron" and n.layer in layers]

        def shift(value, hook):
            value = value.clone()
            for r in readers:
                if hook.name == f"blocks.{r.layer}.mlp.hook_pre":
                    d = (ref[hook.name] - clean[hook.name])[0, r.position, r.index] if r.layer == 0 \
                        else by_hand[_edge_key(r)]
                    value[0, r.position, r.index] += d
            return value

        with torch.no_grad():
            logits = m.run_with_hooks(torch.tensor([tokens]), fwd_hooks=[
                (f"blocks.{l}.mlp.hook_pre", shift) for l in range(L)])[0]
        return float(logits[5, 3] - logits[5, 8]) + (by_hand[_edge_key(g.target_ids[0])] if targets else 0.0)

    values = _edge_reference_values(g.context, g, [_PATCH])
    for layers in ([0], [1], [0, 1]):
        into = np.array([i for i in range(g.n_edges) if g.nodes[g.edge_target[i]].kind == "neuron"
                         and g.nodes[g.edge_target[i]].layer in layers])
        got = _edge_ablated_metric(g.context, g, Metric.from_graph(g), into, values)
        assert got == pytest.approx(by_hooks(layers, False), abs=1e-9)
        assert got != pytest.approx(clean["metric"], abs=1e-6)  # the patch mattered
    res = faithfulness_curve(g, sizes=[0.0, 1.0], ablation="patch", unit="edges", patch_prompt=_PATCH)
    assert res.empty == pytest.approx(by_hooks([0, 1], True), abs=1e-9)
    assert res.empty != pytest.approx(ref["metric"], abs=1e-6)  # live inputs: not the patch prompt's metric


def test_edge_mean_over_two_prompts_equals_the_average_by_hand():
    """Component graph (the targets are the only readers): with a fraction of the edges kept, the
    metric is the clean readout minus the ablated edges plus, per ablated edge, the mean of the
    same edge's weight in the two reference prompts' graphs (0 where a graph lacks it)."""
    from circuitgraph.validation.faithfulness_curves import _edge_ranking

    a, tokens, g = _component_graph()
    refs = [_edges_by_pair(attribute(a, p, None, [ResolvedTarget(kind="logit_diff", position=5, tokens=(3, 8))],
                                     dtype=torch.float64, mlp="mlp", attention="heads", positional_nodes=True))
            for p in _MEAN]
    res = faithfulness_curve(g, sizes=[0.0, 0.3], ablation="mean", unit="edges", reference_prompts=list(_MEAN))
    order = _edge_ranking(g)
    for k, value in zip(res.n_kept, res.values, strict=False):
        expected = res.full
        for e in order[k:]:
            pair = (_edge_key(g.nodes[g.edge_source[e]].id), _edge_key(g.nodes[g.edge_target[e]].id))
            expected += -float(g.edge_weight[e]) + sum(r.get(pair, 0.0) for r in refs) / 2
        assert value == pytest.approx(expected, abs=1e-10)
    assert res.values[1] != pytest.approx(res.full, abs=1e-6)


def test_edge_mean_needs_reference_prompts():
    from circuitgraph.spec.validation import FaithfulnessCurve

    _, _, g = _component_graph()
    with pytest.raises(ValidationRunError, match="reference_prompts"):
        faithfulness_curve(g, sizes=[0.5], ablation="mean", unit="edges")
    with pytest.raises(Exception, match="reference_prompts"):
        FaithfulnessCurve(unit="edges", ablation="mean")
    assert FaithfulnessCurve(unit="edges", ablation="patch", patch_prompt={"tokens": [1, 2]}).ablation == "patch"
    with pytest.raises(ValidationRunError, match="at least 6 tokens"):
        faithfulness_curve(g, sizes=[0.5], ablation="patch", unit="edges", patch_prompt=[1, 2, 3])
    out = run_check(g, {"faithfulness_curve": {"sizes": [0.0, 0.5, 1.0], "unit": "edges", "ablation": "patch",
                                               "patch_prompt": {"tokens": _PATCH}}})
    direct = faithfulness_curve(g, sizes=[0.0, 0.5, 1.0], ablation="patch", unit="edges", patch_prompt=_PATCH)
    assert out.result.values == direct.values and out.result.recovery[-1] == 1.0
