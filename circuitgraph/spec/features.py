"""Feature dashboards: the ``features:`` section (no torch here).

A spec with ``dataset:``, ``features:`` and ``export: {features: DIR}`` streams the dataset once
through the model and its dictionaries and writes, in ``DIR``, every selected feature's
statistics (``features.parquet``) and its exact top-k activating tokens with their context
(``examples.parquet``); see :mod:`circuitgraph.features` and docs/features.md.

    features: {top_k: 20, context: 8, layers: all, features: all, quantiles: [0.5, 0.9, 0.99]}
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, field_validator

from circuitgraph.spec.base import Bool, Float, InputPath, NonNegativeInt, PositiveInt, StrictModel, rule_error

__all__ = ["FeaturesSpec", "FromGraph", "quantile_column"]


class FromGraph(StrictModel):
    """Only the features that are nodes of a graph file (graph JSON or ``.npz``)."""

    from_graph: InputPath = Field(description="A graph file written by circuitgraph (.json or .npz): its feature "
                                              "nodes' (layer, index) are the features computed.")


def quantile_column(q: float) -> str:
    """The ``features.parquet`` column of quantile ``q``: ``q`` followed by Python's shortest
    ``repr`` of the number (``0.5 -> "q0.5"``, ``0.99 -> "q0.99"``, ``1 -> "q1.0"``)."""
    return f"q{float(q)!r}"


class FeaturesSpec(StrictModel):
    """What a features run computes (``features:``)."""

    top_k: PositiveInt = Field(20, description="Top activating tokens kept per feature (exact, ties broken by "
                                               "row then position).")
    context: NonNegativeInt = Field(8, description="Tokens of context kept before and after each example's token "
                                                   "(clipped at the prompt's ends).")
    layers: Union[Literal["all"], tuple[NonNegativeInt, ...]] = Field(
        "all", description="The dictionary layers to compute: 'all' or a list of layers.")
    features: Union[Literal["all"], FromGraph] = Field(
        "all", description="'all' features of the selected layers, or {from_graph: PATH}: the feature nodes of a "
        "graph file.")
    quantiles: tuple[Float, ...] = Field(
        (0.5, 0.9, 0.99), description="Quantiles of each feature's active (non-zero) activations, each in [0, 1]; "
        "column q<value> of features.parquet.")
    top_tokens: PositiveInt = Field(10, description="Output tokens (promoted and suppressed) and input tokens "
                                                    "(de-embeddings) listed per feature.")
    include_bos: Bool = Field(False, description="Also count and rank position 0 when it holds the tokenizer's "
                                                 "BOS token (skipped by default: it is where attention sinks).")
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

    @field_validator("layers")
    @classmethod
    def _layers(cls, value: object) -> object:
        if isinstance(value, tuple):
            if not value:
                raise rule_error(("", "layers is empty; give 'all' or at least one layer"))
            if len(set(value)) != len(value):
                raise rule_error(("", f"layers {list(value)} repeat a layer; give each once"))
        return value
