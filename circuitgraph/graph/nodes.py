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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from typing_extensions import TypedDict

from circuitgraph.spec.kinds import NODE_KINDS, TOKEN_KINDS, NodeKind

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
    "NODE_ATTRS",
    "NodeAttrs",
    "file_attrs",
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


#: a node's attributes: every key a graph built, pruned, merged, aggregated or labelled by
#: circuitgraph may write, with its value's type (each key optional: a node carries those of its
#: kind); :data:`NODE_ATTRS` says what each means, and tests/test_node_attrs.py checks that the two
#: name the same keys and that the graphs write no other key and no other type.  The functional
#: syntax because one key, ``from``, is a Python keyword.  Graph files written by other tools may
#: carry more keys: :func:`file_attrs` keeps them (at run time ``attrs`` is a plain ``dict``).
NodeAttrs = TypedDict(
    "NodeAttrs",
    {
        # embeddings, logits and targets
        "token": int,
        "token_str": str,
        "tokens": list[int],
        "target_kind": str,
        "relative_to_mean": bool,
        "probability": float,
        "site": str,
        "from": list[str],
        # neurons
        "hook_pre": float,
        "gate": float,
        "linear": float,
        "expert": int,
        "neuron": int,
        "routing_weight": float,
        # remainders
        "n_neurons": int,
        "n_features": int,
        "pruned_edges_by_source_kind": dict[str, int],
        "n_pruned_nodes": int,
        # component circuits
        "total_effect": float,
        "inputs": str,
        "query_total": float,
        "query_constant": float,
        "key_total": float,
        "key_constant": float,
        # labels, drawings, supernodes and dataset aggregates
        "description": str,
        "href": str,
        "influence": float,
        "supernode": str,
        "members": list[str],
        "n_prompts": int,
        "sum_activation": float,
        "sum_influence": float,
        "sum_direct_effect": float,
    },
    total=False,
)

#: every key of :data:`NodeAttrs` and what it means: the one vocabulary of node attributes
#: (a graph built, pruned, merged, aggregated or labelled by circuitgraph writes no other key;
#: tests/test_node_attrs.py checks it, and that it names the keys of :data:`NodeAttrs`).
NODE_ATTRS: dict[str, str] = {
    # embeddings, logits and targets
    "token": "embedding: the token id",
    "token_str": "embedding, logit, target: the token's text",
    "tokens": "target: the token ids it reads",
    "target_kind": "target: logit, logit_diff, feature, neuron or direction",
    "relative_to_mean": "logit target: read relative to the mean logit",
    "probability": "logit target: the token's probability on the prompt",
    "site": "direction target: the residual location it reads (resid_pre, resid_mid, resid_post)",
    "from": "logit_diff target merged from two logits (queries.neighbours): their node ids",
    # neurons
    "hook_pre": "GELU/ReLU neuron: the pre-activation (mlp.hook_pre)",
    "gate": "gated neuron: the gate's pre-activation (mlp.hook_pre)",
    "linear": "gated neuron: the linear branch's value (mlp.hook_pre_linear)",
    "expert": "mixture-of-experts neuron: its expert",
    "neuron": "mixture-of-experts neuron: its index within the expert",
    "routing_weight": "mixture-of-experts neuron: its expert's routing weight at the position",
    # remainders
    "n_neurons": "remainder: how many neurons it folds",
    "n_features": "remainder: how many features it folds",
    "pruned_edges_by_source_kind": "pruned remainder: the pruned edges it stands for, by their source's kind",
    "n_pruned_nodes": "pruned remainder: how many nodes pruning dropped into it",
    # component circuits (graph.component_inputs, graph.head_inputs)
    "total_effect": "head or MLP with component inputs: its total effect on the targets (its pre_activation)",
    "inputs": "head or MLP with component inputs: which inputs its incoming edges are (value,query,key or input)",
    "query_total": "head: the query side's linearised total (graph.head_inputs)",
    "query_constant": "head: the query side's constant",
    "key_total": "head: the key side's linearised total",
    "key_constant": "head: the key side's constant",
    # labels, drawings, supernodes and dataset aggregates
    "description": "feature or neuron: its description from a labels file",
    "href": "feature in the HTML report: the link to its dashboard",
    "influence": "the node's influence (drawings; a dataset aggregate's mean influence)",
    "supernode": "supernode: its name",
    "members": "supernode: its members' node ids",
    "n_prompts": "dataset aggregate: the prompts the node appears in",
    "sum_activation": "dataset aggregate: its activation summed over the prompts",
    "sum_influence": "dataset aggregate: its influence summed over the prompts",
    "sum_direct_effect": "dataset aggregate: its direct effect summed over the prompts",
}


def file_attrs(data: Mapping[str, object] | None) -> NodeAttrs:
    """A node's ``attrs`` as a graph file or a networkx graph holds them: every key kept, those
    of other tools too (a copy; the file's reader has checked that they are JSON values)."""
    return cast(NodeAttrs, dict(data or {}))


@dataclass(frozen=True, order=True)
class NodeId:
    """The identity of a node: kind, layer, position and index (see module docstring)."""

    kind: NodeKind
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
        return cls(cast(NodeKind, kind), int(layer), int(position), int(index))  # checked in __post_init__

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
    #: keys, types and meanings: :data:`NodeAttrs`, :data:`NODE_ATTRS`
    attrs: NodeAttrs = field(default_factory=NodeAttrs)

    @property
    def kind(self) -> NodeKind:
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
    if node.kind in TOKEN_KINDS:
        text = node.attrs.get("token_str")
        return text if isinstance(text, str) else node.label
    if node.kind == "target":
        return node.label
    text = node.attrs.get("description")
    return text if isinstance(text, str) else ""
