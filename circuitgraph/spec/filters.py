"""Node filters: which nodes a query or a validation check is about.

A filter matches a node when every key it sets matches (keys are ANDed; a list within
a key is ORed)::

    {kind: feature, layer: [1, 2], position: [3, 4]}   # features in layers 1-2 at positions 3 or 4
    {id: ["feature/1/4/17", "neuron/0/4/5"]}

Scalars are normalised to tuples: ``kind``, ``position``, ``index`` and ``id`` are tuples
of values and ``layer`` is an inclusive range ``(lo, hi)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from circuitgraph.spec.base import Int, NodeIdStr, NonNegativeInt, StrictModel, rule_error, shaped_union
from circuitgraph.spec.kinds import NodeKind

__all__ = ["NodeFilter", "TargetSet", "TopNodes"]

#: node layers: -1 for embedding/positional nodes, n_layers for logits, else the block
FilterLayer = Annotated[int, Field(ge=-1, strict=True)]


def _one_or_many(value: Any) -> Any:
    return [value] if not isinstance(value, (list, tuple)) else value


def _layer_range(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return value


def _many(tp: Any) -> Any:
    """``tp`` or a non-empty list of ``tp``, stored as a tuple."""
    return Annotated[
        tuple[tp, ...],
        BeforeValidator(_one_or_many, json_schema_input_type=tp | list[tp]),
        Field(min_length=1),
    ]


if TYPE_CHECKING:
    _Kinds = tuple[NodeKind, ...]
    _Positions = tuple[int, ...]
    _Indices = tuple[int, ...]
    _Ids = tuple[str, ...]
else:
    _Kinds, _Positions, _Indices, _Ids = _many(NodeKind), _many(Int), _many(NonNegativeInt), _many(NodeIdStr)


class NodeFilter(StrictModel):
    """Selects nodes by kind, layer, position, index or id; at least one key."""

    kind: _Kinds | None = Field(None, description="Node kind(s).")
    layer: Annotated[
        tuple[FilterLayer, FilterLayer],
        BeforeValidator(_layer_range, json_schema_input_type=FilterLayer | tuple[FilterLayer, FilterLayer]),
    ] | None = Field(None, description="A layer, or an inclusive range [lo, hi].")
    position: _Positions | None = Field(None, description="Token position(s); negative counts from the end.")
    index: _Indices | None = Field(None, description="Index or indices (feature, neuron, head...).")
    id: _Ids | None = Field(None, description="Node id(s) 'kind/layer/position/index'.")

    @model_validator(mode="after")
    def _check(self) -> NodeFilter:
        if all(getattr(self, k) is None for k in ("kind", "layer", "position", "index", "id")):
            raise rule_error(("", "an empty node filter; give at least one of kind, layer, position, index, id"))
        if self.layer is not None and self.layer[0] > self.layer[1]:
            lo, hi = self.layer
            raise rule_error(("layer", f"layer range [{lo}, {hi}] is empty; write [lo, hi] with lo <= hi"))
        return self

    def matches(self, kind: str, layer: int, position: int, index: int, *, n_positions: int | None = None) -> bool:
        """Whether a node ``(kind, layer, position, index)`` passes the filter.

        Negative filter positions count from the end and need ``n_positions``; without
        it they match nothing.
        """
        if self.kind is not None and kind not in self.kind:
            return False
        if self.layer is not None and not (self.layer[0] <= layer <= self.layer[1]):
            return False
        if self.position is not None:
            wanted = {p + n_positions if p < 0 and n_positions is not None else p for p in self.position}
            if position not in wanted:
                return False
        if self.index is not None and index not in self.index:
            return False
        if self.id is not None and f"{kind}/{layer}/{position}/{index}" not in self.id:
            return False
        return True


if TYPE_CHECKING:
    TargetSet = Literal["targets"] | NodeFilter
    TopNodes = Literal["top_nodes"] | NodeFilter
else:
    TargetSet = shaped_union(
        "target set",
        "'targets' or a node filter {kind, layer, position, index, id}",
        {"targets": Literal["targets"], "filter": NodeFilter},
        by_type={str: "targets", dict: "filter"},
    )
    TopNodes = shaped_union(
        "node set",
        "'top_nodes' or a node filter {kind, layer, position, index, id}",
        {"top_nodes": Literal["top_nodes"], "filter": NodeFilter},
        by_type={str: "top_nodes", dict: "filter"},
    )
