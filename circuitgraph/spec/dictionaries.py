"""The one registry of on-disk dictionary formats: one :class:`DictionaryFormat` record per format.

A record names its format, describes the files it holds, and names (``"module:function"``,
resolved on first use, as the query registry names its implementations, so the spec imports
nothing heavy) the four functions that handle it:

* ``detect(path) -> bool``: the folder holds this format (records are tried in registry order);
* ``load(path, adapter, *, layers, dtype, lazy, config) -> Dictionary``: load it for a model;
* ``layer_files(path) -> list[Path]``: its weight files, for the dry run's footprint;
* ``footprint``: ``"whole"`` (read into memory whole: sae-lens folders, ``.npz`` files) or
  ``"rows"`` (safetensors kept on disk, the decoder rows of the active features read on use).

The spec's ``transcoders.format`` accepts exactly the registered names (the committed JSON
Schema lists the built-in ones), :func:`circuitgraph.dictionaries.detect_format` tries the
records' ``detect`` in order and :func:`circuitgraph.dictionaries.load_dictionaries` calls the
record's ``load``.  A new format is one :func:`register_format` call plus its loader (see
docs/architecture.md):

>>> sorted(DICTIONARY_FORMATS)[:2]
['circuit_tracer_clt', 'circuit_tracer_transcoder_set']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["DictionaryFormat", "DICTIONARY_FORMATS", "register_format", "format_names"]


@dataclass(frozen=True)
class DictionaryFormat:
    """One on-disk dictionary format (see the module docstring)."""

    name: str
    #: the files the folder holds (docs, and the error when no format is recognised)
    layout: str
    detect: str
    load: str
    layer_files: str
    footprint: Literal["whole", "rows"] = "rows"
    #: one dictionary for every layer (cross-layer transcoder): ``transcoders.layers`` does not apply
    cross_layer: bool = False

    def function(self, role: Literal["detect", "load", "layer_files"]) -> Callable[..., Any]:
        """The function this record names for ``role``."""
        module, _, name = getattr(self, role).partition(":")
        return getattr(importlib.import_module(module), name)


#: every registered format by name, in detection order
DICTIONARY_FORMATS: dict[str, DictionaryFormat] = {}


def register_format(record: DictionaryFormat, *, before: str | None = None) -> DictionaryFormat:
    """Add a format to the registry (last in detection order, or just ``before`` another)."""
    if record.name in DICTIONARY_FORMATS:
        raise ValueError(f"dictionary format {record.name!r} is registered already")
    if before is None:
        DICTIONARY_FORMATS[record.name] = record
    else:
        items = list(DICTIONARY_FORMATS.items())
        at = [k for k, _ in items].index(before)
        DICTIONARY_FORMATS.clear()
        DICTIONARY_FORMATS.update(items[:at] + [(record.name, record)] + items[at:])
    return record


def format_names() -> tuple[str, ...]:
    """The registered format names, in registration order."""
    return tuple(DICTIONARY_FORMATS)


_F = "circuitgraph.dictionaries.formats"
for _record in (
    DictionaryFormat("saelens", "layer_<i>/cfg.json + sae_weights.safetensors (sae-lens)",
                     f"{_F}:detect_saelens", f"{_F}:load_saelens", f"{_F}:files_saelens", footprint="whole"),
    DictionaryFormat("circuit_tracer_clt", "config.yaml + W_enc_<i>/W_dec_<i>.safetensors (circuit-tracer CLT)",
                     f"{_F}:detect_circuit_tracer_clt", f"{_F}:load_circuit_tracer_clt",
                     f"{_F}:files_circuit_tracer_clt", cross_layer=True),
    DictionaryFormat("circuit_tracer_transcoder_set",
                     "config.yaml + layer_<i>.safetensors (circuit-tracer transcoder_set)",
                     f"{_F}:detect_circuit_tracer_transcoder_set", f"{_F}:load_circuit_tracer_transcoder_set",
                     f"{_F}:files_circuit_tracer_transcoder_set"),
    DictionaryFormat("gemmascope", "layer_<i>/.../params.npz (GemmaScope)",
                     f"{_F}:detect_gemmascope", f"{_F}:load_gemmascope", f"{_F}:files_gemmascope", footprint="whole"),
    DictionaryFormat("gemmascope2", "layer_<i>_width_<w>_l0_<s>/params.safetensors (GemmaScope-2)",
                     f"{_F}:detect_gemmascope2", f"{_F}:load_gemmascope2", f"{_F}:files_gemmascope2"),
    DictionaryFormat("gemmascope2_clt", "config.json + params_layer_<i>.safetensors (GemmaScope-2 CLT)",
                     f"{_F}:detect_gemmascope2_clt", f"{_F}:load_gemmascope2_clt", f"{_F}:files_gemmascope2_clt",
                     cross_layer=True),
    DictionaryFormat("eleuther_topk", "<hookpoint>/cfg.json + sae.safetensors (EleutherAI sparsify)",
                     f"{_F}:detect_eleuther_topk", f"{_F}:load_eleuther_topk", f"{_F}:files_eleuther_topk"),
):
    register_format(_record)
del _record
