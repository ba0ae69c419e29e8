"""Built-in models shipped with circuitgraph.

``demo``: a 2-layer GPT-2-style model trained on a synthetic a/an
article-agreement task (see :mod:`circuitgraph.builtin.demo_task` and
docs/demo.md), with one sae-lens transcoder per layer. Its folder has the
local layout every model folder has::

    demo/model/config.json            HookedTransformerConfig fields (dtype as a string)
    demo/model/model.safetensors      HookedTransformer state_dict
    demo/model/tokenizer/             Hugging Face tokenizer files
    demo/transcoders/layer_<l>/       sae-lens cfg.json + sae_weights.safetensors
    demo/prompt.json                  {"text", "tokens"}: a prompt ending before " an"
    demo/stats.json                   the numbers recorded when it was trained

Importing this module imports nothing heavy (no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["BUILTIN_MODELS", "demo_path"]


def demo_path() -> Path:
    """Folder of the built-in demo model (recreate it with ``python scripts/train_demo.py``)."""
    return Path(__file__).resolve().parent / "demo"


BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"demo": demo_path}
