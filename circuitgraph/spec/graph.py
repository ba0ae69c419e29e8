"""How the graph is built (``graph:``) and pruned (``prune:``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from circuitgraph.spec.base import Bool, Fraction, LayerKey, PositiveInt, StrictModel, shaped_union

__all__ = ["MlpMode", "AttentionMode", "GraphSpec", "PruneSpec", "Prune"]

MlpMode = Literal["transcoders", "neurons", "mlp"]
AttentionMode = Literal["frozen", "heads"]
HeadInput = Literal["value", "query", "key"]

if TYPE_CHECKING:
    _MlpSetting = MlpMode | dict[int, MlpMode]
    _AttentionSetting = AttentionMode | dict[int, AttentionMode]
else:
    _MlpSetting = shaped_union(
        "mlp setting",
        "'transcoders', 'neurons', 'mlp' or a mapping {layer: mode}",
        {"all": MlpMode, "per_layer": dict[LayerKey, MlpMode]},
        by_type={str: "all", dict: "per_layer"},
    )
    _AttentionSetting = shaped_union(
        "attention setting",
        "'frozen', 'heads' or a mapping {layer: mode}",
        {"all": AttentionMode, "per_layer": dict[LayerKey, AttentionMode]},
        by_type={str: "all", dict: "per_layer"},
    )


class GraphSpec(StrictModel):
    """What the nodes are and how edges are computed.

    ``mlp`` and ``attention`` take one mode for every layer or a mapping
    ``{layer: mode}``; layers missing from a mapping get the default.  Use
    :meth:`mlp_for` and :meth:`attention_for` rather than reading the fields.
    """

    mlp: _MlpSetting | None = Field(
        None,
        description="MLP nodes: transcoders (features + error nodes), neurons, or mlp (one node per MLP "
        "output); default: transcoders if transcoders are given, else neurons.",
    )
    attention: _AttentionSetting = Field(
        "frozen", description="Attention: frozen (patterns fixed, no nodes) or heads (one node per head)."
    )
    positional_nodes: Bool = Field(False, description="Add nodes for positional embeddings.")
    bias_nodes: Bool = Field(False, description="Add nodes for bias terms.")
    bos_nodes: Bool = Field(False, description="Keep nodes at the BOS position.")
    neuron_top_k: PositiveInt | None = Field(None, description="Keep the top k neurons per position (null = all).")
    max_feature_nodes: PositiveInt | None = Field(None, description="Keep at most this many feature nodes.")
    component_inputs: Bool = Field(
        False,
        description="Head nodes (attention: heads) and whole-MLP nodes (mlp: mlp) get incoming edges: each one's "
        "scalar is its total effect on the targets in the frozen model, and the edge from a writer is that "
        "writer's share of it through the component's input (for a head, its value input: exactly path "
        "patching of the frozen model). Needs mlp: mlp or neurons on every layer.",
    )
    head_inputs: list[HeadInput] = Field(
        ["value"],
        description="With component_inputs: the edge kinds into head nodes. value (always; exact path patching "
        "through the head's value input), query and key (each a separate, linearised edge kind: the first-order "
        "effect of the writer on the targets through the head's query or key input at the prompt, kept apart "
        "from the exact edges; docs/maths.md section 11).",
    )
    max_neuron_nodes: PositiveInt | None = Field(
        None, description="Keep the K neurons (over all layers and positions) with the largest influence "
        "on the targets, ranked as max_feature_nodes ranks features; the others fold into one remainder per "
        "(layer, position) (null = all; not with neuron_top_k).")
    dtype: Literal["float32", "float64"] = Field("float32", description="Dtype in which edges are accumulated.")
    batch_size: PositiveInt = Field(256, description="Readers per backward batch.")
    max_dense_nodes: PositiveInt = Field(20000, description="Never build a dense N x N matrix above this N.")

    @model_validator(mode="after")
    def _head_inputs_need_value_and_component_inputs(self) -> GraphSpec:
        kinds = list(self.head_inputs)
        if "value" not in kinds:
            raise ValueError(f"graph.head_inputs {kinds} must include 'value' (the exact edges that a head's total "
                             "effect splits into); add 'query' and/or 'key' to it, e.g. [value, query, key]")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"graph.head_inputs {kinds} names a kind twice")
        if kinds != ["value"] and not self.component_inputs:
            raise ValueError(f"graph.head_inputs {kinds} needs graph.component_inputs: true (edges into heads)")
        return self

    def mlp_for(self, layer: int, *, has_transcoders: bool) -> MlpMode:
        """The MLP mode of ``layer``."""
        default: MlpMode = "transcoders" if has_transcoders else "neurons"
        if self.mlp is None:
            return default
        if isinstance(self.mlp, str):
            return self.mlp
        return self.mlp.get(layer, default)

    def attention_for(self, layer: int) -> AttentionMode:
        """The attention mode of ``layer``."""
        if isinstance(self.attention, str):
            return self.attention
        return self.attention.get(layer, "frozen")

    def transcoder_layers_named(self) -> tuple[int, ...] | Literal["all"] | None:
        """Layers that ``mlp`` explicitly sets to transcoders (``"all"``: every layer)."""
        if self.mlp == "transcoders":
            return "all"
        if isinstance(self.mlp, dict):
            return tuple(sorted(layer for layer, mode in self.mlp.items() if mode == "transcoders"))
        return None


def _none_is_none(value: Any) -> Any:
    return "none" if value is None else value


class PruneSpec(StrictModel):
    """Pruning as in circuit-tracer: keep the nodes (edges) that carry this share of the
    influence on the targets; optional hard caps by count."""

    node_threshold: Fraction = Field(0.8, description="Keep nodes carrying this share of the influence.")
    edge_threshold: Fraction = Field(0.98, description="Keep edges carrying this share of the influence.")
    top_k_nodes: PositiveInt | None = Field(None, description="Keep at most this many nodes.")
    top_k_edges: PositiveInt | None = Field(None, description="Keep at most this many edges.")
    target_share: Fraction | None = Field(
        None, description="Keep nodes until they explain this share of each target (null = off)."
    )


if TYPE_CHECKING:
    Prune = Literal["none"] | PruneSpec
else:
    Prune = Annotated[
        shaped_union(
            "prune setting",
            "'none' or a mapping {node_threshold: ..., edge_threshold: ...}",
            {"none": Literal["none"], "thresholds": PruneSpec},
            by_type={str: "none", dict: "thresholds"},
        ),
        BeforeValidator(_none_is_none),
    ]
"""``prune: none`` (keep everything) or a :class:`PruneSpec`."""
