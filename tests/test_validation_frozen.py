"""Ablation in the frozen model reproduces the graph's edges exactly, on every tiny architecture.

LayerNorm/RMSNorm x GELU/gated x learned/rotary positions, float64: the built-in self-test of
:func:`predicted_vs_actual` (frozen change == -edge into the targets, node by node) and of
:func:`ablate` (a set of nodes: the frozen change is the sum of their edges).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.validation import ablate, direct_effects, predicted_vs_actual
from tests.helpers.validation import build

ARCHS = [dict(norm=n, mlp=m, positional=p) for n, m, p in itertools.product(("LN", "RMS"), ("gelu", "gated"),
                                                                             ("learned", "rotary"))]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: intra-op threads only add overhead


def _id(arch: dict) -> str:
    return "-".join(arch.values())


@pytest.mark.parametrize("arch", ARCHS, ids=_id)
def test_frozen_ablation_reproduces_edges(arch):
    adapter, tcs = build(dtype=torch.float64, **arch)
    tokens = [1, 5, 7, 2, 9, 4]
    targets = [ResolvedTarget(kind="logit_diff", position=5, tokens=(3, 4), weight=1.0),
               ResolvedTarget(kind="logit", position=5, tokens=(6,), relative_to_mean=True, weight=0.5)]
    g = attribute(adapter, tokens, tcs, targets, dtype=torch.float64,
                  mlp={0: "transcoders", 1: "neurons"}, attention={0: "heads", 1: "frozen"})
    res = predicted_vs_actual(g, k=12)
    assert res.frozen_ok, res.table()
    assert res.frozen_max_deviation < 1e-10
    D = direct_effects(g)
    kinds = set()
    for row in res.rows:
        edge = sum(w * g.edge_weight_between(row.node, t) for t, w in g.targets)
        assert row.predicted == pytest.approx(-edge, abs=1e-12)
        assert row.actual_frozen == pytest.approx(-edge, abs=1e-10 * max(1.0, abs(D).max()))
        kinds.add(row.node.split("/")[0])
    assert len(kinds) >= 2  # several node kinds were checked
    # a set of nodes: frozen removal is additive and equals the summed prediction
    both = ablate(g, "top_nodes", k=6, controls=())
    assert both.frozen_change == pytest.approx(both.predicted, abs=1e-10)
