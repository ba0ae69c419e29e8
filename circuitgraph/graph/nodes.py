"""Node identity and node records.

A node is identified by value, never by a row offset: ``NodeId(kind, layer, position, index)``.

Conventions (documented in docs/maths.md):

* ``layer``: -1 for ``embedding`` and ``positional`` nodes (they write before block 0);
  ``n_layers`` for ``logit`` nodes (they read after the last block); the block index
  for everything else (``bias`` nodes of the attention output use their block index
  and ``index`` tells which bias, see :data:`BIAS_INDEX`).
* ``index``: feature index for ``feature``, neuron index for ``neuron``, head index for
  ``attention_head``, token id for ``embedding`` and ``logit``, position-free ``0`` for
  ``error``/``mlp``/``positional``, the target's number in the spec for ``target``,
  and for ``remainder`` one of :data:`REMAINDER_INDEX`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from circuitgraph.spec.kinds import NODE_KINDS, NodeKind

__all__ = [
    "NodeKind",
    "NODE_KINDS",
    "READER_KINDS",
    "VECTOR_KINDS",
    "NodeId",
    "Node",
    "display_name",
    "REMAINDER_INDEX",
    "BIAS_INDEX",
]

# the node kinds are the spec's (spec/kinds.py): one list, re-exported here

#: kinds whose nodes read the residual stream (they have a pre-activation and a constant)
READER_KINDS = frozenset({"feature", "neuron", "logit", "target"})
#: kinds whose nodes are whole vectors written to the residual (activation 1)
VECTOR_KINDS = frozenset({"error", "attention_head", "mlp", "bias", "remainder", "positional"})

#: what a remainder node's index means
REMAINDER_INDEX = {"neurons": 0, "pruned": 1, "features": 2}
#: which constant writer a bias node is
BIAS_INDEX = {"attention": 0, "mlp": 1, "norm": 2}


@dataclass(frozen=True, order=True)
class NodeId:
    """The identity of a node: kind, layer, position and index (see module docstring)."""

    kind: str
    layer: int
    position: int
    index: int

    def __post_init__(self) -> None:
        if self.kind not in NODE_KINDS:
            raise ValueError(f"unknown node kind {self.kind!r}; expected one of {', '.join(NODE_KINDS)}")

    def __str__(self) -> str:
        return f"{self.kind}/{self.layer}/{self.position}/{self.index}"

    @classmethod
    def parse(cls, text: str) -> NodeId:
        """Inverse of ``str(node_id)``: ``"feature/1/4/17"`` -> ``NodeId("feature", 1, 4, 17)``."""
        parts = str(text).split("/")
        if len(parts) != 4:
            raise ValueError(f"node id {text!r} is not of the form kind/layer/position/index")
        kind, layer, position, index = parts
        return cls(kind, int(layer), int(position), int(index))

    @property
    def is_reader(self) -> bool:
        return self.kind in READER_KINDS


@dataclass
class Node:
    """A node record: identity plus the values measured on the prompt.

    ``activation`` is the writer's scale (feature/neuron activation; 1 for vector
    nodes; the logit value for logit readers).  Readers also carry ``pre_activation``
    (measured in the real forward pass) and ``constant`` (the part of the
    pre-activation that comes from no node), so that
    ``pre_activation == sum(incoming edges) + constant``.
    """

    id: NodeId
    activation: float
    pre_activation: float | None = None
    constant: float | None = None
    label: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.id.kind

    @property
    def layer(self) -> int:
        return self.id.layer

    @property
    def position(self) -> int:
        return self.id.position

    @property
    def index(self) -> int:
        return self.id.index


def display_name(node: Node) -> str:
    """What a reader calls a node besides its id: the token string of an embedding or logit, a
    feature's or neuron's description (``attrs["description"]``, from a labels file), a target's
    label; ``""`` when there is nothing more than the id."""
    if node.kind in ("embedding", "logit"):
        text = node.attrs.get("token_str")
        return text if isinstance(text, str) else node.label
    if node.kind == "target":
        return node.label
    text = node.attrs.get("description")
    return text if isinstance(text, str) else ""
