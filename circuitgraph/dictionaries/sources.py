"""The spec's dictionary sources: which key of ``transcoders:`` names the dictionary, and its loader.

``transcoders: {path | hf | release | builtin: ...}`` (:class:`circuitgraph.spec.model.TranscodersSpec`)
is resolved here, one loader per source in :data:`DICTIONARY_SOURCES`; a new source is one entry
and its key in ``spec/model.py``.  A new on-disk format is not a source: it is a record of
:data:`circuitgraph.spec.dictionaries.DICTIONARY_FORMATS` (any folder source reads it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from circuitgraph.adapters.files import existing_dictionary_folder
from circuitgraph.dictionaries.formats import load_dictionaries
from circuitgraph.dictionaries.hub import load_hf_dictionaries
from circuitgraph.dictionaries.registry import load_release
from circuitgraph.errors import LoadError, spec_field
from circuitgraph.spec.model import TranscodersSpec

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["DICTIONARY_SOURCES", "load_dictionary_spec", "dictionary_folder"]


def _layers(t: TranscodersSpec) -> list[int] | None:
    return list(t.layers) if t.layers else None


def _from_path(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype) -> Dictionary:
    return load_dictionaries(spec_field(t.path, "transcoders.path"), adapter, format=t.format, layers=_layers(t),
                             dtype=dtype)


def _from_hf(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype) -> Dictionary:
    return load_hf_dictionaries(spec_field(t.hf, "transcoders.hf"), adapter, format=t.format, layers=_layers(t),
                                dtype=dtype)


def _from_release(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype) -> Dictionary:
    ids = {int(k): v for k, v in t.ids.items() if t.layers is None or int(k) in t.layers} if t.ids else None
    return load_release(spec_field(t.release, "transcoders.release"), adapter, ids=ids, layers=_layers(t), dtype=dtype,
                        check_model=not t.allow_model_mismatch)


def _from_builtin(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype) -> Dictionary:
    tcs = load_dictionaries(dictionary_folder(t), adapter, layers=_layers(t), dtype=dtype)
    tcs.source = {"builtin": t.builtin}
    return tcs


#: the spec's ``transcoders.source`` -> its loader ``(transcoders spec, adapter, dtype) -> Dictionary``
DICTIONARY_SOURCES: dict[str, Callable[[TranscodersSpec, ModelAdapter, torch.dtype], Dictionary]] = {
    "path": _from_path, "hf": _from_hf, "release": _from_release, "builtin": _from_builtin}


def load_dictionary_spec(t: TranscodersSpec, adapter: ModelAdapter, *, dtype: torch.dtype) -> Dictionary:
    """The dictionary a spec's ``transcoders:`` section names, loaded for ``adapter`` in ``dtype``."""
    return DICTIONARY_SOURCES[t.source](t, adapter, dtype)


def dictionary_folder(t: TranscodersSpec) -> Path:
    """The local folder of a ``path`` or ``builtin`` dictionary (read before any weight is;
    :func:`~circuitgraph.adapters.files.existing_dictionary_folder`)."""
    folder = existing_dictionary_folder(t)
    if folder is None:
        raise LoadError(f"transcoders.{t.source} {getattr(t, t.source)!r} has no local folder before it is loaded"
                        if t.source != "builtin" else f"unknown built-in transcoders {t.builtin!r}")
    return folder
