"""Node kinds: the one list (the spec names them; :mod:`circuitgraph.graph.nodes` re-exports it).

It lives in the spec, the first stage of the pipeline, so that the spec imports nothing from
later stages and the graph imports it from below.
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
