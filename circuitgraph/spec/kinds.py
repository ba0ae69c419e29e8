"""Node kinds: the one list (the spec names them; :mod:`circuitgraph.graph.nodes` re-exports it).

It lives in the spec, the first stage of the pipeline, so that the spec imports nothing from
later stages and the graph imports it from below.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["NodeKind", "NODE_KINDS", "OUTPUT_KINDS", "TOKEN_KINDS", "ActivationKind", "ACTIVATION_KINDS"]

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

#: the output nodes an analysis reads (a logit, or a target: a logit difference, a direction, a
#: feature's or a neuron's pre-activation)
OUTPUT_KINDS: frozenset[str] = frozenset({"logit", "target"})
#: the nodes that stand for a token (their ``index`` is a token id): embeddings and logits
TOKEN_KINDS: frozenset[str] = frozenset({"embedding", "logit"})
#: the units with an activation of their own (a nonlinearity's output the graph keeps as a node,
#: read at its MLP's input): dictionary features and MLP neurons; a target or a readout of one of
#: these kinds is a unit's pre-activation
ActivationKind = Literal["feature", "neuron"]
ACTIVATION_KINDS: frozenset[str] = frozenset(get_args(ActivationKind))
