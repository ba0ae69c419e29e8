"""Queries run on the finished graph.

Each list item has exactly one key naming the query; ``query.kind`` is that key and
``query.params`` the parameter block under it (``null`` means all defaults)::

    queries:
      - top_paths: {source: {kind: embedding}, k: 5}
      - influence: {top_k: 10}
      - scores:
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from circuitgraph.spec.base import (
    Bool,
    Fraction,
    InputPath,
    Int,
    Name,
    NodeIdStr,
    NonNegativeInt,
    PositiveInt,
    QueryItem,
    StrictModel,
    Token,
    UsageModel,
    keyed_union,
    query_item,
    rule_error,
    shaped_union,
    unused_rules,
)
from circuitgraph.spec.filters import NodeFilter, TargetSet
from circuitgraph.spec.kinds import ActivationKind, NodeKind

__all__ = [
    "TopPaths",
    "TopPathsQuery",
    "Influence",
    "InfluenceQuery",
    "DirectLogitAttribution",
    "DirectLogitAttributionQuery",
    "LogitLens",
    "LogitLensQuery",
    "Congruence",
    "CongruenceQuery",
    "Neighbours",
    "NeighboursQuery",
    "Subgraph",
    "SubgraphQuery",
    "Supernodes",
    "SupernodesQuery",
    "Scores",
    "ScoresQuery",
    "HeadSplit",
    "HeadSplitQuery",
    "VirtualWeights",
    "VirtualWeightsQuery",
    "UnitRef",
    "HeadRef",
    "DeEmbedding",
    "DeEmbeddingQuery",
    "QK",
    "QKQuery",
    "GroundTruth",
    "GroundTruthQuery",
    "Query",
]

_TOP_K = "How many results to report."


class TopPaths(UsageModel):
    """The k strongest paths from ``source`` nodes to ``target`` nodes.

    ``rank: exact`` ranks by the exact contribution (edge weights, each intermediate node divided by its pre-activation); ``normalized`` by the product
    of edge weights normalised by each target's total incoming weight; ``flow`` by the share of the
    target carried by the path's weakest edge (every path through an edge counted: long paths are not
    penalised for their length).  ``min_length`` skips the short paths.  ``method: auto``
    enumerates exactly when the graph is small and uses beam search otherwise.
    """

    source: NodeFilter = Field(description="Where paths start.")
    target: TargetSet = Field("targets", description="Where paths end: 'targets' or a node filter.")
    k: PositiveInt = Field(10, description="How many paths.")
    rank: Literal["exact", "normalized", "flow"] = Field(
        "exact", description="Path score: exact (the path's own contribution), normalized (a product of shares of "
        "each reader's absolute input), flow (the target share carried by the path's weakest edge).")
    method: Literal["auto", "exact", "beam"] = Field("auto", description="Search method.")
    beam_width: PositiveInt = Field(100, description="Beam width of the beam search.")
    max_length: PositiveInt | None = Field(None, description="At most this many edges per path (null = any).")
    min_length: PositiveInt | None = Field(
        None, description="At least this many edges per path (null = any): e.g. 3 skips embedding -> node -> target "
        "and finds the paths through the middle of the model.")
    through: tuple[NodeFilter, ...] = Field((), description="Paths must pass through a node of each filter.")
    avoid: tuple[NodeFilter, ...] = Field((), description="Paths must avoid the nodes of every filter.")
    expand_heads: Bool = Field(False, description="Split edges through frozen attention into per-head edges.")

    def field_usage(self) -> dict[str, tuple[bool, str]]:
        return {"beam_width": (self.method != "exact", "it is the width of the beam search, and method is exact")}

    @model_validator(mode="after")
    def _used(self) -> TopPaths:
        problems = unused_rules(self, self.field_usage())
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            problems.append(("min_length", f"min_length {self.min_length} is above max_length {self.max_length}; "
                                           "lower min_length or raise max_length"))
        if problems:
            raise rule_error(*problems)
        return self


TopPathsQuery = query_item("top_paths", TopPaths)


class Influence(StrictModel):
    """Total (direct + indirect) influence of every node on the targets."""

    top_k: PositiveInt = Field(20, description=_TOP_K)
    signed: Bool = Field(False, description="Signed influence instead of absolute.")


InfluenceQuery = query_item("influence", Influence)


class DirectLogitAttribution(StrictModel):
    """Direct edges into one target, by node."""

    target: NonNegativeInt = Field(0, description="Which target (index into targets).")
    top_k: PositiveInt = Field(20, description=_TOP_K)
    kinds: tuple[NodeKind, ...] | None = Field(None, min_length=1, description="Only these node kinds (null = all).")


DirectLogitAttributionQuery = query_item("direct_logit_attribution", DirectLogitAttribution)


class LogitLens(StrictModel):
    """The residual stream after each layer read through the unembedding."""

    tokens: tuple[Token, ...] | None = Field(
        None, min_length=1, description="Report these tokens (null = the top_k tokens)."
    )
    position: Int = Field(-1, description="Token position; negative counts from the end.")
    top_k: PositiveInt = Field(5, description=_TOP_K)


LogitLensQuery = query_item("logit_lens", LogitLens)


def _check_one_or_two(value: object) -> object:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return (value,)  # one token, written as itself (tokens: " an")
    if isinstance(value, (list, tuple)) and len(value) not in (1, 2):
        raise rule_error(
            ("", f"expected one token or two tokens [a, b] (the direction a - b), got {len(value)}: {list(value)!r}")
        )
    return value


class Congruence(StrictModel):
    """How well each neuron's or feature's output aligns with a token's unembedding."""

    tokens: Annotated[
        tuple[Token, ...],
        BeforeValidator(_check_one_or_two, json_schema_input_type=Token | list[Token]),
    ] = Field(
        min_length=1, max_length=2, description="One token, or [a, b] for the direction a - b."
    )
    kind: ActivationKind = Field("feature", description="Score neurons or features.")
    layer: NonNegativeInt | None = Field(None, description="Only this layer (null = all).")
    mode: Literal["dot", "cosine", "input_scaled"] = Field("dot", description="Score.")
    top_k: PositiveInt = Field(20, description=_TOP_K)


CongruenceQuery = query_item("congruence", Congruence)


class Neighbours(StrictModel):
    """The strongest edges into and/or out of one node."""

    node: NodeIdStr = Field(description="Node id 'kind/layer/position/index'.")
    direction: Literal["in", "out", "both"] = Field("both", description="Incoming, outgoing or both.")
    top_k: PositiveInt = Field(10, description=_TOP_K)


NeighboursQuery = query_item("neighbours", Neighbours)


class Subgraph(StrictModel):
    """The subgraph induced by the nodes a filter selects."""

    filter: NodeFilter


SubgraphQuery = query_item("subgraph", Subgraph)


class Supernodes(StrictModel):
    """Merge groups of nodes into supernodes and report the edges between groups."""

    groups: dict[Name, NodeFilter] = Field(min_length=1, description="{group name: node filter}.")


SupernodesQuery = query_item("supernodes", Supernodes)


class Scores(StrictModel):
    """Replacement and completeness scores and the error nodes' share."""


ScoresQuery = query_item("scores", Scores)


class HeadSplit(StrictModel):
    """Split one edge through frozen attention into its per-head parts."""

    source: NodeIdStr = Field(description="Source node id.")
    target: NodeIdStr = Field(description="Target node id.")


HeadSplitQuery = query_item("head_split", HeadSplit)


class VirtualWeights(StrictModel):
    """Prompt-independent virtual weights between two sets of nodes."""

    source: NodeFilter
    target: NodeFilter
    top_k: PositiveInt = Field(20, description=_TOP_K)


VirtualWeightsQuery = query_item("virtual_weights", VirtualWeights)


class UnitRef(StrictModel):
    """A feature or neuron independent of position: ``{kind, layer, index}``."""

    kind: ActivationKind = Field("feature", description="Feature or neuron.")
    layer: NonNegativeInt
    index: NonNegativeInt


class HeadRef(StrictModel):
    """An attention head: ``{layer, head}``."""

    layer: NonNegativeInt
    head: NonNegativeInt


if TYPE_CHECKING:
    _UnitOrId = str | UnitRef
else:
    _UnitOrId = shaped_union(
        "unit",
        "a node id 'kind/layer/position/index' or {kind, layer, index}",
        {"id": NodeIdStr, "unit": UnitRef},
        by_type={str: "id", dict: "unit"},
    )


class DeEmbedding(StrictModel):
    """The tokens whose embeddings drive a feature or neuron most (optionally through one head's OV)."""

    node: _UnitOrId = Field(description="A node id, or {kind, layer, index}.")
    top_k: PositiveInt = Field(10, description=_TOP_K)
    head: HeadRef | None = Field(None, description="Read the embeddings through this head's OV circuit.")


DeEmbeddingQuery = query_item("de_embedding", DeEmbedding)


if TYPE_CHECKING:
    _HeadOrHeads = int | tuple[int, ...]
    _KeyPosition = int | Literal["top"]
else:
    _HeadOrHeads = shaped_union(
        "head",
        "a head index or a list of head indices",
        {"one": NonNegativeInt, "list": Annotated[tuple[NonNegativeInt, ...], Field(min_length=1)]},
        by_type={int: "one", list: "list", tuple: "list"},
    )
    _KeyPosition = shaped_union(
        "key position",
        "an integer position (negative counts from the end) or 'top'",
        {"position": Int, "top": Literal["top"]},
        by_type={int: "position", str: "top"},
    )


class QK(StrictModel):
    """QK attribution: a head's pre-softmax score from ``query_position`` to ``key_position``
    split exactly over pairs of (query-side node, key-side node) of the graph."""

    layer: NonNegativeInt = Field(description="The head's layer.")
    head: _HeadOrHeads = Field(description="A head index, or a list of them.")
    query_position: Int = Field(-1, description="Query position; negative counts from the end.")
    key_position: _KeyPosition = Field(
        "top", description="Key position (negative counts from the end), or 'top': the key the head attends to most."
    )
    top_k: PositiveInt = Field(10, description="How many pairs and marginals to report per head.")


QKQuery = query_item("qk", QK)


class GroundTruth(StrictModel):
    """Score the graph against a known circuit (a tracr model's ``circuit.json``): edge and node
    ROC AUC, precision and recall of the pruned circuit, the true edges ranked below false ones.
    Needs heads as nodes (``graph: {attention: heads}``; ``mlp: mlp`` or neurons)."""

    circuit: InputPath = Field(description="The ground-truth circuit.json (compile_program writes it).")
    edge_threshold: Fraction = Field(
        0.98, description="The pruned circuit keeps, per reader component, the fewest incoming edges carrying "
                          "this share of its |weight|.")
    max_disagreements: PositiveInt = Field(20, description="How many disagreements to report.")


GroundTruthQuery = query_item("ground_truth", GroundTruth)


#: every query kind, in the order the schema and the error messages list them
QUERY_TYPES: tuple[type[QueryItem], ...] = (
    TopPathsQuery, InfluenceQuery, DirectLogitAttributionQuery, LogitLensQuery, CongruenceQuery, NeighboursQuery,
    SubgraphQuery, SupernodesQuery, ScoresQuery, HeadSplitQuery, VirtualWeightsQuery, DeEmbeddingQuery, QKQuery,
    GroundTruthQuery,
)

if TYPE_CHECKING:
    Query = QueryItem
else:
    Query = keyed_union("query", *QUERY_TYPES, list_item=True)
