"""Model adapters: the only place that knows TransformerLens names and architecture facts.

The re-exports are resolved lazily, so the torch-free parts (``files``, ``model_config``,
``tokenizer``) can be used by ``circuitgraph validate`` without importing torch.
"""

import importlib
from typing import Any

__all__ = ["ArchitectureFacts", "ModelAdapter", "NormWeights", "Tokenizer"]

_LAZY = {
    "ArchitectureFacts": "circuitgraph.adapters.architecture",
    "ModelAdapter": "circuitgraph.adapters.architecture",
    "NormWeights": "circuitgraph.adapters.architecture",
    "Tokenizer": "circuitgraph.adapters.tokenizer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'circuitgraph.adapters' has no attribute {name!r}")
