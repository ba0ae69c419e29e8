"""The ``steer:`` section: interventions on the real model, watched through generation.

Each item intervenes on graph nodes (or a residual-stream direction) and generates a
continuation with and without the intervention::

    steer:
      - interventions:
          - {node: feature/1/11/3, mode: zero}
          - {nodes: {kind: feature, layer: 0, position: -1}, mode: scale, value: 2.0, positions: all}
          - {direction: [0.1, 0.2, ...], site: resid_post, layer: 1, position: -1, mode: add, value: 4.0}
        generate: {max_new_tokens: 8, temperature: 0}
        freeze_attention: false

``mode``: ``zero`` (activation 0), ``set`` (activation ``value``), ``scale`` (activation times
``value``), ``add`` (activation plus ``value``).  A vector node (attention head, error) has
activation 1: ``set: v`` scales its output by ``v``, ``add: v`` by ``1 + v``.  A direction's
activation is the residual's coordinate along it, ``c = x . d / (d . d)``.

``positions``: ``prompt`` (the node's own position), ``all`` (that position and every
generated token), ``new`` (generated tokens only) or a list of absolute positions of the
sequence (prompt positions ``0..T-1``, generated tokens ``T, T+1, ...``).

A parameter that the chosen mode or intervention kind does not use is an error.
See docs/steering.md and :mod:`circuitgraph.validation.steering`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from circuitgraph.spec.base import (
    Bool,
    Float,
    InputPath,
    Int,
    NodeIdStr,
    NonNegativeInt,
    PositiveInt,
    StrictModel,
    rule_error,
)
from circuitgraph.spec.filters import NodeFilter

__all__ = ["SteerMode", "SteerIntervention", "Generate", "SteerItem", "STEER_MODES"]

SteerMode = Literal["zero", "set", "scale", "add"]
STEER_MODES: tuple[str, ...] = ("zero", "set", "scale", "add")
SteerPositions = Literal["prompt", "all", "new"] | Annotated[tuple[NonNegativeInt, ...], Field(min_length=1)]


class SteerIntervention(StrictModel):
    """One intervention: exactly one of ``node`` (a node id), ``nodes`` (a node filter, resolved
    on the graph) or ``direction`` (a residual-stream direction at ``site``, ``layer``,
    ``position``)."""

    node: NodeIdStr | None = Field(None, description="A node id 'kind/layer/position/index' (feature, neuron, "
                                   "attention_head, error, mlp, embedding).")
    nodes: NodeFilter | None = Field(None, description="A node filter {kind, layer, position, index, id}: every "
                                     "intervenable node of the graph it matches.")
    direction: Annotated[tuple[Float, ...], Field(min_length=1)] | InputPath | None = Field(
        None, description="A residual-stream direction: d_model numbers, or a file (.npy, .pt, .safetensors, .json).")
    site: Literal["resid_pre", "resid_mid", "resid_post"] = Field(
        "resid_post", description="With direction: the residual site.")
    layer: NonNegativeInt | None = Field(None, description="With direction: the block index of the site.")
    position: Int = Field(-1, description="With direction: its own position (negative counts from the prompt's end).")
    mode: SteerMode = Field("zero", description="zero, set (to value), scale (by value) or add (value).")
    value: Float | None = Field(None, description="With mode set, scale or add: the value.")
    positions: SteerPositions = Field(
        "prompt", description="prompt (the node's own position), all (it and every generated token), new (generated "
        "tokens only) or a list of absolute positions.")

    @model_validator(mode="after")
    def _rules(self) -> SteerIntervention:
        problems: list[tuple[str, str]] = []
        given = [k for k in ("node", "nodes", "direction") if getattr(self, k) is not None]
        if len(given) != 1:
            got = "neither" if not given else " and ".join(given)
            problems.append(("", f"give exactly one of node, nodes or direction, got {got}"))
        if self.direction is None:
            for key in ("site", "layer", "position"):
                if key in self.model_fields_set:
                    problems.append((key, f"{key} is only used with direction (a node has its own); remove it"))
        elif self.layer is None:
            problems.append(("layer", "a direction needs layer: the block index of its residual site"))
        if self.mode == "zero" and self.value is not None:
            problems.append(("value", "value is only used with mode: set, scale or add, mode is zero; remove it"))
        if self.mode != "zero" and self.value is None:
            problems.append(("value", f"mode: {self.mode} needs value; add it or choose mode: zero"))
        if isinstance(self.positions, tuple) and len(set(self.positions)) != len(self.positions):
            problems.append(("positions", f"positions has repeated values: {list(self.positions)}"))
        if problems:
            raise rule_error(*problems)
        return self


class Generate(StrictModel):
    """How the continuation is generated (the same for the baseline and the intervened run)."""

    max_new_tokens: PositiveInt = Field(8, description="How many tokens to generate.")
    temperature: Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)] = Field(
        0.0, description="0: greedy (the most probable token); T > 0: sample from softmax(logits / T).")
    top_p: Annotated[float, Field(gt=0, le=1, strict=True)] = Field(
        1.0, description="With temperature > 0: sample from the smallest set of tokens whose probability reaches "
        "top_p (nucleus sampling).")
    seed: NonNegativeInt | None = Field(None, description="With temperature > 0: the sampling seed (null = the "
                                        "spec's seed); baseline and intervened runs use the same one.")
    top_k: PositiveInt = Field(5, description="How many of the most probable tokens each step reports.")

    @model_validator(mode="after")
    def _rules(self) -> Generate:
        problems = []
        if self.temperature == 0:
            if self.top_p != 1.0:
                problems.append(("top_p", "top_p is only used when sampling (temperature > 0); remove it"))
            if self.seed is not None:
                problems.append(("seed", "seed is only used when sampling (temperature > 0); remove it"))
        if problems:
            raise rule_error(*problems)
        return self


class SteerItem(StrictModel):
    """One steering experiment: interventions applied together, and a generation."""

    interventions: Annotated[tuple[SteerIntervention, ...], Field(min_length=1)] = Field(
        description="The interventions, applied together.")
    generate: Generate = Field(default_factory=Generate, description="How to generate.")
    freeze_attention: Bool = Field(
        False, description="Keep the prompt's attention patterns (of the run without interventions) at prompt "
        "positions; generated positions attend as the model computes.")
    name: str | None = Field(None, description="A label for this item.")
