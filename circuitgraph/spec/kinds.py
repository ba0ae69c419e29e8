"""Node kinds as the spec names them.

The same list as :data:`circuitgraph.graph.nodes.NodeKind` (a test keeps them equal);
repeated here so that the spec, the first stage of the pipeline, imports nothing from
later stages.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["NodeKind", "NODE_KINDS"]

NodeKind = Literal[
    "embedding",
    "positional",
    "feature",
    "error",
    "neuron",
    "attention_head",
    "mlp",
    "bias",
    "remainder",
    "logit",
    "target",
]
NODE_KINDS: tuple[str, ...] = get_args(NodeKind)
