"""Attribution targets: what the graph explains.

Each list item has exactly one key naming its kind; ``target.kind`` is that key and
``target.params`` its value.  Siblings (``position``, ``weight``...) sit next to it::

    targets:
      - logit: " an"                  # LogitTarget
      - logit_diff: [" an", " a"]     # LogitDiffTarget
      - top_logits: 5                 # TopLogitsTarget (max_n: 5)
      - feature: {layer: 1, position: 3, index: 17}
      - direction: {site: resid_post, layer: 1, vector: [0.1, 0.2]}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, get_args

from pydantic import BeforeValidator, Field, model_validator

from circuitgraph.spec.base import (
    Bool,
    Float,
    Fraction,
    InputPath,
    Int,
    KeyedModel,
    NonNegativeInt,
    PositiveInt,
    StrictModel,
    Token,
    TokenPair,
    keyed_union,
    rule_error,
)

__all__ = [
    "LogitTarget",
    "LogitDiffTarget",
    "TopLogits",
    "TopLogitsTarget",
    "UnitLocation",
    "FeatureTarget",
    "NeuronTarget",
    "Direction",
    "DirectionTarget",
    "Target",
    "DIRECTION_FILE_SUFFIXES",
]

_POSITION = "Token position; negative counts from the end (-1 = last)."
_WEIGHT = "Optional weight of this target in the combined target (None = 1)."


class LogitTarget(KeyedModel):
    """The logit of one token."""

    key: ClassVar[str] = "logit"
    logit: Token = Field(description="A token string (one token) or a token id.")
    position: Int = Field(-1, description=_POSITION)
    relative_to_mean: Bool = Field(False, description="Subtract the mean logit over the vocabulary.")
    weight: Float | None = Field(None, description=_WEIGHT)


class LogitDiffTarget(KeyedModel):
    """The logit of token a minus the logit of token b."""

    key: ClassVar[str] = "logit_diff"
    logit_diff: TokenPair = Field(description="Two tokens [a, b]: logit(a) - logit(b).")
    position: Int = Field(-1, description=_POSITION)
    weight: Float | None = Field(None, description=_WEIGHT)


class TopLogits(StrictModel):
    """The most likely next tokens, as in circuit-tracer: up to ``max_n`` tokens,
    stopping once their probabilities add up to ``cumulative_probability``."""

    max_n: PositiveInt = Field(10, description="At most this many tokens.")
    cumulative_probability: Fraction = Field(0.95, description="Stop once the probabilities sum to this.")
    relative_to_mean: Bool = Field(True, description="Subtract the mean logit over the vocabulary.")


def _top_logits_shorthand(value: Any) -> Any:
    if value is None:
        return {}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"max_n": value}
    return value


class TopLogitsTarget(KeyedModel):
    """The top logits; ``top_logits: 5`` is short for ``top_logits: {max_n: 5}``."""

    key: ClassVar[str] = "top_logits"
    top_logits: Annotated[
        TopLogits,
        BeforeValidator(_top_logits_shorthand, json_schema_input_type=PositiveInt | TopLogits | None),
    ] = Field(default_factory=TopLogits, description="Options, or max_n as a plain integer.")
    position: Int = Field(-1, description=_POSITION)


class UnitLocation(StrictModel):
    """A feature or neuron at one position: ``{layer, position, index}``."""

    layer: NonNegativeInt = Field(description="Block index.")
    position: Int = Field(description=_POSITION)
    index: NonNegativeInt = Field(description="Feature or neuron index.")


class FeatureTarget(KeyedModel):
    """The pre-activation of one transcoder feature."""

    key: ClassVar[str] = "feature"
    feature: UnitLocation
    weight: Float | None = Field(None, description=_WEIGHT)


class NeuronTarget(KeyedModel):
    """The pre-activation of one MLP neuron."""

    key: ClassVar[str] = "neuron"
    neuron: UnitLocation
    weight: Float | None = Field(None, description=_WEIGHT)


DIRECTION_FILE_SUFFIXES = (".npy", ".pt", ".safetensors", ".json")


class Direction(StrictModel):
    """A direction in the residual stream; the target is the dot product with it.

    Exactly one of ``vector`` (inline) or ``file`` (.npy, .pt, .safetensors, .json).
    """

    site: Literal["resid_pre", "resid_mid", "resid_post"] = Field(description="Residual stream site.")
    layer: NonNegativeInt = Field(description="Block index of the site.")
    position: Int = Field(-1, description=_POSITION)
    vector: tuple[Float, ...] | None = Field(None, min_length=1, description="The direction, d_model numbers.")
    file: InputPath | None = Field(None, description="A file holding the direction (.npy, .pt, .safetensors, .json).")
    name: str | None = Field(None, description="A label for the target.")

    @model_validator(mode="after")
    def _one_source(self) -> Direction:
        if (self.vector is None) == (self.file is None):
            got = "both" if self.vector is not None else "neither"
            raise rule_error(("", f"give exactly one of vector or file, got {got}"))
        if self.file is not None and self.file.suffix.lower() not in DIRECTION_FILE_SUFFIXES:
            raise rule_error(
                ("file", f"unsupported file type {self.file.suffix!r} ({self.file}); "
                 f"use one of {', '.join(DIRECTION_FILE_SUFFIXES)}")
            )
        return self


class DirectionTarget(KeyedModel):
    """The projection of the residual stream onto a direction."""

    key: ClassVar[str] = "direction"
    direction: Direction
    weight: Float | None = Field(None, description=_WEIGHT)


#: every target item, the one list of target kinds
AnyTarget = LogitTarget | LogitDiffTarget | TopLogitsTarget | FeatureTarget | NeuronTarget | DirectionTarget

if TYPE_CHECKING:
    Target = AnyTarget
else:
    Target = keyed_union("target", *get_args(AnyTarget), list_item=True)
