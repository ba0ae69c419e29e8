"""Checks of the graphs the query tests share (tests/helpers/graphs.py): the hand-built DAGs are
complete, the attributed graphs too."""

from __future__ import annotations

import pytest

from tests.helpers.graphs import ARCHS, attributed, chain_graph, random_dag


# ------------------------------------------------------------------ checks of the helpers
def test_hand_built_graphs_are_complete():
    for seed in range(3):
        assert random_dag(seed).check_completeness().max_violation < 1e-12
    assert chain_graph().check_completeness().max_violation == 0.0


@pytest.mark.parametrize("arch", list(ARCHS))
def test_stub_transcoder_graph_is_complete(arch):
    g = attributed(arch, "transcoders")
    assert {n.kind for n in g.nodes} >= {"feature", "error", "embedding", "logit"}
    assert g.check_completeness().max_violation < 1e-10
