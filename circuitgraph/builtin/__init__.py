"""Built-in models shipped with circuitgraph.

``demo``: a 2-layer GPT-2-style model trained on a synthetic a/an
article-agreement task (see :mod:`circuitgraph.builtin.demo_task` and
docs/demo.md), with one sae-lens transcoder per layer. Its folder has the
local layout every model folder has::

    demo/model/config.json            HookedTransformerConfig fields (dtype as a string)
    demo/model/model.safetensors      HookedTransformer state_dict
    demo/model/tokenizer/             Hugging Face tokenizer files
    demo/transcoders/layer_<l>/       sae-lens cfg.json + sae_weights.safetensors
    demo/clt/                         a cross-layer transcoder (circuit-tracer format: config.yaml,
                                      W_enc_<l>.safetensors, W_dec_<l>.safetensors, stats.json)
    demo/prompt.json                  {"text", "tokens"}: a prompt ending before " an"
    demo/stats.json                   the numbers recorded when it was trained

Importing this module imports nothing heavy (no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["BUILTIN_DICTIONARIES", "BUILTIN_MODELS", "builtin_dictionary_dir", "demo_path"]


def demo_path() -> Path:
    """Folder of the built-in demo model (recreate it with ``python scripts/train_demo.py``)."""
    return Path(__file__).resolve().parent / "demo"


BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"demo": demo_path}

#: built-in dictionaries: name -> (built-in model, sub-folder).  ``demo``: one sae-lens
#: transcoder per layer; ``demo_clt``: a cross-layer transcoder in circuit-tracer's format
#: (trained by scripts/train_demo_clt.py).
BUILTIN_DICTIONARIES: dict[str, tuple[str, str]] = {"demo": ("demo", "transcoders"), "demo_clt": ("demo", "clt")}


def builtin_dictionary_dir(name: str) -> Path:
    """Folder of the built-in dictionary ``name``."""
    model, sub = BUILTIN_DICTIONARIES[name]
    return Path(BUILTIN_MODELS[model]()) / sub
