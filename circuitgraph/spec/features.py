"""Dashboards: the ``features:`` section (no torch here).

A spec with ``dataset:``, ``features:`` and ``export: {features: DIR}`` streams the dataset once
through the model (and its dictionaries) and writes, in ``DIR``, every selected unit's
statistics (``features.parquet``) and its exact top-k activations with their context
(``examples.parquet``); see :mod:`circuitgraph.features` and docs/features.md.  The units
(``units:``) are transcoder features (the default), the MLP's neurons, or attention heads::

    features: {top_k: 20, context: 8, layers: all, features: all, quantiles: [0.5, 0.9, 0.99]}
    features: {units: neurons, layers: [25]}
    features: {units: heads, layers: [3, 4], head_metrics: [attention, norm]}
    features: {units: neurons, features: {from_graph: graph.json}}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from circuitgraph.spec.base import (
    Bool,
    Float,
    InputPath,
    NonNegativeInt,
    PositiveInt,
    StrictModel,
    UsageModel,
    rule_error,
    unused_rules,
)

__all__ = ["HEAD_METRICS", "UNIT_NODE_KINDS", "FeaturesSpec", "FromGraph", "HeadMetric", "Units", "quantile_column"]

#: what a dashboard is made of: transcoder features (per-layer or cross-layer), the MLP's
#: neurons (``mlp.hook_post``: the activation, for gated MLPs ``act(gate) * value``), or
#: attention heads (ranked over (query, key) position pairs)
Units = Literal["features", "neurons", "heads"]
#: the graph node kind of each unit kind (``features: {from_graph: PATH}`` reads these nodes)
UNIT_NODE_KINDS: dict[str, str] = {"features": "feature", "neurons": "neuron", "heads": "attention_head"}
#: how a head's (query, key) pairs are ranked: ``attention`` the pattern weight ``A[q, k]``,
#: ``score`` the pre-softmax score, ``norm`` the norm of what the head writes from key ``k``
#: at query ``q``: ``A[q, k] * ||v_k W_O||``
HeadMetric = Literal["attention", "score", "norm"]
HEAD_METRICS: tuple[str, ...] = ("attention", "score", "norm")


class FromGraph(StrictModel):
    """Only the units that are nodes of a graph file (graph JSON or ``.npz``)."""

    from_graph: InputPath = Field(description="A graph file written by circuitgraph (.json or .npz): its nodes of "
                                              "the run's unit kind (feature, neuron or attention_head nodes) are "
                                              "the units computed.")


def quantile_column(q: float) -> str:
    """The ``features.parquet`` column of quantile ``q``: ``q`` followed by Python's shortest
    ``repr`` of the number (``0.5 -> "q0.5"``, ``0.99 -> "q0.99"``, ``1 -> "q1.0"``)."""
    return f"q{float(q)!r}"


class FeaturesSpec(UsageModel):
    """What a features run computes (``features:``)."""

    units: Units = Field("features", description="What the dashboards are of: 'features' (the transcoders' or "
                         "CLT's features; needs transcoders:), 'neurons' (the MLP neurons' activations, "
                         "mlp.hook_post) or 'heads' (attention heads, ranked over (query, key) position pairs).")
    top_k: PositiveInt = Field(20, description="Top activations kept per unit (exact, ties broken by row, "
                                               "then position, then key position).")
    context: NonNegativeInt = Field(8, description="Tokens of context kept before and after each example's token "
                                                   "(clipped at the prompt's ends).")
    layers: Literal["all"] | tuple[NonNegativeInt, ...] = Field(
        "all", description="The layers to compute: 'all' (every dictionary layer for features, every model layer "
        "for neurons and heads) or a list of layers.")
    features: Literal["all"] | FromGraph = Field(
        "all", description="'all' units of the selected layers, or {from_graph: PATH}: the graph file's nodes of "
        "the unit kind (feature, neuron or attention_head nodes).")
    head_metrics: tuple[HeadMetric, ...] = Field(
        ("attention", "norm"), description="units: heads only: the rankings of each head's (query, key) pairs, "
        "each its own top-k: 'attention' (pattern weight), 'score' (pre-softmax score), 'norm' "
        "(A[q,k] * ||v_k W_O||, the size of what the head writes from that key).")
    quantiles: tuple[Float, ...] = Field(
        (0.5, 0.9, 0.99), description="Quantiles of each feature's active (non-zero) activations, each in [0, 1]; "
        "column q<value> of features.parquet.")
    top_tokens: PositiveInt = Field(10, description="Output tokens (promoted and suppressed) and input tokens "
                                                    "(de-embeddings) listed per feature.")
    include_bos: Bool = Field(False, description="Also count and rank position 0 when it holds the tokenizer's "
                                                 "BOS token (skipped by default: it is where attention sinks); for "
                                                 "heads, the pairs whose query or key is that position.")
    shard_size: PositiveInt = Field(16, description="Rows per task handed to a worker (and per resumable shard); "
                                                    "the files do not depend on it.")

    @field_validator("quantiles")
    @classmethod
    def _quantiles(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        bad = [q for q in value if not (0.0 <= float(q) <= 1.0)]
        if bad:
            raise rule_error(("", f"quantiles {bad} are outside [0, 1]; give fractions such as 0.5, 0.9, 0.99"))
        if len({quantile_column(q) for q in value}) != len(value):
            raise rule_error(("", f"quantiles {list(value)} repeat a value; give each once"))
        return tuple(float(q) for q in value)

    @field_validator("head_metrics")
    @classmethod
    def _head_metrics(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise rule_error(("", f"head_metrics is empty; give at least one of {', '.join(HEAD_METRICS)}"))
        if len(set(value)) != len(value):
            raise rule_error(("", f"head_metrics {list(value)} repeat a metric; give each once"))
        return value

    def field_usage(self) -> dict[str, tuple[bool, str]]:
        return {"head_metrics": (self.units == "heads", f"it ranks attention heads' pairs, and units is "
                                                        f"{self.units}")}

    @model_validator(mode="after")
    def _used(self) -> FeaturesSpec:
        problems = unused_rules(self, self.field_usage())
        if problems:
            raise rule_error(*problems)
        return self

    @property
    def node_kind(self) -> str:
        """The graph node kind of the run's units (``feature``, ``neuron``, ``attention_head``)."""
        return UNIT_NODE_KINDS[self.units]

    @field_validator("layers")
    @classmethod
    def _layers(cls, value: object) -> object:
        if isinstance(value, tuple):
            if not value:
                raise rule_error(("", "layers is empty; give 'all' or at least one layer"))
            if len(set(value)) != len(value):
                raise rule_error(("", f"layers {list(value)} repeat a layer; give each once"))
        return value
