"""Graphs shared by the query tests (cached per session) and checks of the helpers themselves.

* hand-built DAGs with features, error nodes, embeddings and logit targets whose
  pre-activations satisfy completeness (so identities can be checked exactly);
* graphs built by ``attribute`` from tiny models (LayerNorm/GELU and RMSNorm/gated), in
  float64, with neurons, or with small ReLU transcoders given as plain tensors (no sae-lens
  import: the engine's own tests cover sae-lens loading);
* circuit-tracer's graphs (the session fixture ``circuit_tracer_graphs`` in conftest.py).
"""

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
