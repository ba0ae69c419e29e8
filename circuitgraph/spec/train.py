"""The spec of ``circuitgraph train``: a model and a ``train:`` section (dictionaries to train).

A training spec is its own file (``format_version``, ``model``, ``train``); it shares the
model section with the run spec.  ``load_train_spec`` reads one (YAML, JSON or a mapping);
``python -m circuitgraph.spec.train_schema`` regenerates ``schemas/train.schema.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from circuitgraph.errors import SpecError
from circuitgraph.spec.base import Bool, InputPath, OutputPath, PositiveInt, StrictModel, rule_error
from circuitgraph.spec.load import check_plain_data, read_spec_file
from circuitgraph.spec.messages import format_validation_error
from circuitgraph.spec.model import ModelSpec
from circuitgraph.spec.root import FORMAT_VERSION, Seed, _exact_version

__all__ = ["TrainSpec", "TrainRunSpec", "load_train_spec", "train_schema_text", "TRAIN_SCHEMA_PATH",
           "DictionaryKind", "TrainActivation", "TrainBackend"]

DictionaryKind = Literal["transcoder", "skip_transcoder", "cross_layer_transcoder"]
TrainActivation = Literal["relu", "jump_relu", "topk"]
TrainBackend = Literal["circuitgraph", "sparsify"]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]

#: where the committed schema lives in a source checkout
TRAIN_SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "train.schema.json"


class TrainSpec(StrictModel):
    """What to train: the text, the layers, the kind of dictionary and the optimisation."""

    text: tuple[InputPath, ...] = Field(min_length=1, description="Text files: plain text (.txt and anything "
                                        "else; a line holding only % separates documents, as in fortune files), "
                                        "JSON Lines (.jsonl, the text_field of each row) or Parquet (.parquet, "
                                        "the text_field column; needs pyarrow).")
    text_field: str = Field("text", min_length=1, description="The field of a JSONL row / Parquet column holding the text.")
    output: OutputPath = Field(description="The output folder: the dictionaries (circuit-tracer layout), "
                               "metrics.json, report.html and the checkpoint.")
    kind: DictionaryKind = Field("transcoder", description="transcoder (per layer), skip_transcoder (per layer, "
                                 "with a linear skip path W_skip) or cross_layer_transcoder (every layer).")
    activation: TrainActivation = Field("relu", description="relu, jump_relu (a learned threshold per feature) or "
                                        "topk (the k largest of max(h, 0) per token; sparsity is then unused).")
    k: PositiveInt = Field(32, description="Active features per token of activation topk (at most width).")
    backend: TrainBackend = Field("circuitgraph", description="circuitgraph (its own trainer: every kind and "
                                  "activation) or sparsify (EleutherAI's eai-sparsify, pip install "
                                  "'circuitgraph-lm[train-sparsify]': transcoder / skip_transcoder with activation "
                                  "topk, model given by path or pretrained).")
    layers: tuple[Annotated[int, Field(ge=0)], ...] | None = Field(
        None, description="Layers to train (per-layer kinds); default every layer. circuit-tracer reads a "
        "transcoder set of layers 0..n only.")
    width: PositiveInt = Field(512, description="Features per layer (d_transcoder).")
    context: Annotated[int, Field(strict=True, ge=2)] = Field(
        64, description="Tokens per window, the BOS token included when the model's tokenizer has one.")
    tokens: PositiveInt = Field(100_000, description="Training tokens (windows x context; BOS positions are not trained on).")
    batch: PositiveInt = Field(16, description="Windows per optimisation step.")
    lr: PositiveFloat = Field(5e-3, description="Adam learning rate (normalised units).")
    sparsity: NonNegativeFloat = Field(3e-3, description="Sparsity coefficient: the loss adds sparsity x "
                                       "sum_j a_j ||W_dec_j|| (normalised units).")
    eval_tokens: PositiveInt = Field(4096, description="Held-out tokens (windows set aside before training) "
                                     "for metrics.json: explained variance, L0, dead/dense features, spliced CE.")
    checkpoint_every: PositiveInt = Field(50, description="Steps between checkpoints (output/checkpoint.pt); a "
                                          "rerun resumes from the last one.")
    resume: Bool = Field(True, description="Resume from output/checkpoint.pt when it exists.")
    seed: Seed = Field(0, description="Seed of the initialisation and of the window order.")

    @model_validator(mode="after")
    def _check(self) -> TrainSpec:
        if self.kind == "cross_layer_transcoder" and self.layers is not None:
            raise rule_error(("layers", "a cross-layer transcoder covers every layer of the model; remove layers"))
        if self.activation == "topk" and self.k > self.width:
            raise rule_error(("k", f"k {self.k} is more than width {self.width}; give k <= width"))
        if self.backend == "sparsify":
            if self.kind == "cross_layer_transcoder":
                raise rule_error(("backend", "sparsify trains per-layer and skip transcoders only; use backend "
                                  "circuitgraph for a cross-layer transcoder"))
            if self.activation != "topk":
                raise rule_error(("activation", f"backend sparsify trains TopK transcoders only, got activation "
                                  f"{self.activation}; set activation: topk or use backend circuitgraph"))
        if self.layers is not None and len(set(self.layers)) != len(self.layers):
            raise rule_error(("layers", f"layers {list(self.layers)} repeat a layer; list each once"))
        return self


class TrainRunSpec(StrictModel):
    """A ``circuitgraph train`` spec file."""

    format_version: Annotated[Literal[1], BeforeValidator(_exact_version)] = Field(
        description=f"Version of the spec format; this is version {FORMAT_VERSION}.")
    model: ModelSpec = Field(description="The model: exactly one of path, name, builtin or pretrained.")
    train: TrainSpec = Field(description="What to train.")


def load_train_spec(source: str | os.PathLike[str] | Mapping[str, Any]) -> TrainRunSpec:
    """Read a training spec (a YAML/JSON file or a mapping); bad input raises SpecError listing every problem."""
    base_dir = None
    if isinstance(source, Mapping):
        data = dict(source)
    else:
        data = read_spec_file(source)
        base_dir = Path(source).resolve().parent
    check_plain_data(data)
    try:
        return TrainRunSpec.model_validate(data, context={"base_dir": base_dir} if base_dir else None)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, TrainRunSpec, data)) from None


def train_schema_text() -> str:
    """The training spec's JSON Schema as deterministic text."""
    schema = TrainRunSpec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://circuitgraph.dev/schemas/train.schema.json"
    schema["title"] = "circuitgraph train spec"
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # python -m circuitgraph.spec.train
    TRAIN_SCHEMA_PATH.write_text(train_schema_text(), encoding="utf-8")
    print(f"wrote {TRAIN_SCHEMA_PATH}")
