"""The one registry of on-disk dictionary formats: one :class:`DictionaryFormat` record per format.

A record names its format, describes the files it holds, and has the functions that handle it
(given as callables, or as ``"module:function"`` names resolved on first use for a format of
another package; a built-in format's functions register themselves from
:mod:`circuitgraph.dictionaries.formats` with :func:`implement_format`, so the spec imports
nothing heavy and the import graph sees every arrow):

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

__all__ = ["DictionaryFormat", "DICTIONARY_FORMATS", "register_format", "format_names", "implement_format"]

Role = Literal["detect", "load", "layer_files"]
#: (format name, role) -> the function a package registered for it (:func:`implement_format`)
_IMPLEMENTATIONS: dict[tuple[str, str], Callable[..., Any]] = {}


@dataclass(frozen=True)
class DictionaryFormat:
    """One on-disk dictionary format (see the module docstring)."""

    name: str
    #: the files the folder holds (docs, and the error when no format is recognised)
    layout: str
    detect: str | Callable[..., Any] | None = None
    load: str | Callable[..., Any] | None = None
    layer_files: str | Callable[..., Any] | None = None
    footprint: Literal["whole", "rows"] = "rows"
    #: one dictionary for every layer (cross-layer transcoder): ``transcoders.layers`` does not apply
    cross_layer: bool = False

    def function(self, role: Role) -> Callable[..., Any]:
        """The function this record has for ``role``: its own (a callable, or a ``"module:function"``
        name of another package), else the one registered with :func:`implement_format`."""
        given = getattr(self, role)
        if callable(given):
            return given
        if isinstance(given, str):
            module, _, name = given.partition(":")
            return getattr(importlib.import_module(module), name)
        try:
            return _IMPLEMENTATIONS[(self.name, role)]
        except KeyError:
            raise LookupError(f"dictionary format {self.name!r} has no {role} function; a built-in format's "
                              "functions register when circuitgraph.dictionaries is imported") from None


def implement_format(name: str, **functions: Callable[..., Any]) -> None:
    """Register the functions (``detect``, ``load``, ``layer_files``) of the format ``name``; a
    package that implements a registered format calls it when it is imported."""
    if name not in DICTIONARY_FORMATS:
        raise ValueError(f"dictionary format {name!r} is not registered")
    for role, fn in functions.items():
        if role not in ("detect", "load", "layer_files"):
            raise ValueError(f"unknown role {role!r} of a dictionary format")
        _IMPLEMENTATIONS[(name, role)] = fn


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


#: the built-in formats, in detection order (their functions: circuitgraph.dictionaries.formats)
for _record in (
    DictionaryFormat("saelens", "layer_<i>/cfg.json + sae_weights.safetensors (sae-lens)", footprint="whole"),
    DictionaryFormat("circuit_tracer_clt", "config.yaml + W_enc_<i>/W_dec_<i>.safetensors (circuit-tracer CLT)",
                     cross_layer=True),
    DictionaryFormat("circuit_tracer_transcoder_set",
                     "config.yaml + layer_<i>.safetensors (circuit-tracer transcoder_set)"),
    DictionaryFormat("gemmascope", "layer_<i>/.../params.npz (GemmaScope)", footprint="whole"),
    DictionaryFormat("gemmascope2", "layer_<i>_width_<w>_l0_<s>/params.safetensors (GemmaScope-2)"),
    DictionaryFormat("gemmascope2_clt", "config.json + params_layer_<i>.safetensors (GemmaScope-2 CLT)",
                     cross_layer=True),
    DictionaryFormat("eleuther_topk", "<hookpoint>/cfg.json + sae.safetensors (EleutherAI sparsify)"),
):
    register_format(_record)
del _record
