"""Shared fixtures: tiny models and transcoders built natively, never downloaded."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

# OpenMP threads sleep instead of spinning while they wait (set before torch is imported):
# on shared cores spinning makes small tensor work many times slower
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

warnings.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
#: copies of the two example bundles (GPT-2 and Llama style), shipped in the repository
SHARED_FIXTURES = REPO / "examples" / "fixtures"

#: architecture variants: LayerNorm/RMSNorm x GELU/gated x learned/rotary, plus GQA,
#: folded norms, post-norms and soft-caps
VARIANTS = {
    "ln-gelu-learned": dict(norm="LN", mlp="gelu", positional="learned"),
    "ln-gated-rotary": dict(norm="LN", mlp="gated", positional="rotary"),
    "rms-gelu-learned": dict(norm="RMS", mlp="gelu", positional="learned"),
    "rms-gated-rotary-gqa": dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2),
    "lnpre-relu-rotary": dict(norm="LNPre", mlp="relu", positional="rotary"),
    "rms-gated-postnorm-softcap": dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True,
                                       attn_soft_cap=30.0, logit_soft_cap=20.0),
}


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
    tcs = TranscoderSet.from_dir(path / "transcoders", adapter, dtype=torch_dtype(dtype))
    tokens = json.loads((path / "prompt.json").read_text())["tokens"]
    return adapter, tcs, tokens


@pytest.fixture(params=sorted(VARIANTS))
def variant(request):
    return request.param
