"""Tiny models saved to a folder (natively, never downloaded) and random token rows: the set-ups the
validation, echo, ablate, estimate and training tests share."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from tests.helpers.bundles import run_tmpdir


def token_rows(seed: int, n: int, length: int, vocab: int) -> list[list[int]]:
    """``n`` rows of ``length`` tokens: BOS (1), then tokens drawn uniformly from ``[2, vocab)``
    (numpy's generator seeded with ``seed``, the rows drawn one after another)."""
    g = np.random.default_rng(seed)
    return [[1] + g.integers(2, vocab, size=length - 1).tolist() for _ in range(n)]


def saved_model(model, prefix: str, transcoders=None) -> Path:
    """The model folder of ``model`` (and its ``transcoders``) saved as a bundle in a temporary folder
    that lives until the test run ends."""
    from circuitgraph.testing.synthetic import save_bundle

    return save_bundle(run_tmpdir(prefix), model, transcoders) / "model"


def loaded_model(model, prefix: str, dtype: str = "float64", transcoders=None):
    """``model`` saved (:func:`saved_model`) and loaded back through circuitgraph's loader."""
    from circuitgraph.adapters.loading import load_model_dir

    return load_model_dir(saved_model(model, prefix, transcoders), dtype=dtype)


def training_folder(root: Path):
    """``(root, adapter)``: a tiny Llama-style Hugging Face checkpoint in ``root/model`` and 120 short
    documents of words ``t3``..``t95`` in ``root/text.txt`` (documents separated by ``%`` lines)."""
    from circuitgraph.adapters.loading import load_model_dir
    from circuitgraph.testing.hf_checkpoints import save_checkpoint, tiny_checkpoint

    save_checkpoint(tiny_checkpoint("llama"), root / "model")
    r = random.Random(0)
    docs = [" ".join(f"t{r.randrange(3, 96)}" for _ in range(r.randrange(5, 30))) for _ in range(120)]
    (root / "text.txt").write_text("\n%\n".join(docs))
    return root, load_model_dir(root / "model")


def train_spec(root: Path, out: Path, **train):
    """A ``circuitgraph train`` spec on :func:`training_folder`'s model and text (width 16, context 12,
    batch 4, 100 evaluation tokens), ``train`` overriding or adding keys."""
    from circuitgraph.spec.train import load_train_spec

    t = {"text": [str(root / "text.txt")], "output": str(out), "width": 16, "context": 12, "batch": 4,
         "eval_tokens": 100, **train}
    return load_train_spec({"format_version": 1, "model": {"path": str(root / "model")}, "train": t})
