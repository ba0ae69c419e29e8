"""A tiny model (loaded like any local model) and its random transcoders, cached per variant."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.dictionaries import TranscoderSet
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model


@functools.cache
def _build(dtype: str, norm: str, mlp: str, positional: str):
    model = tiny_model(norm=norm, mlp=mlp, positional=positional)
    tcs = random_transcoders(model)
    with tempfile.TemporaryDirectory(prefix="cg-validation-") as tmp:
        root = save_bundle(Path(tmp), model, tcs)
        adapter = load_model_dir(root / "model", dtype=dtype)
        return adapter, TranscoderSet.from_dir(root / "transcoders", adapter, dtype=getattr(torch, dtype))


def build(*, dtype: torch.dtype = torch.float32, norm: str = "LN", mlp: str = "gelu", positional: str = "learned"):
    """A tiny model (loaded like any local model) and its random transcoders, cached per variant."""
    return _build(str(dtype).replace("torch.", ""), norm, mlp, positional)
