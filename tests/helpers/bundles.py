"""Tiny bundles built natively (model + transcoders + prompt, never downloaded) and the repository's paths."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


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
