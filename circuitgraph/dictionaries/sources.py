"""The spec's dictionary sources' loaders: ``transcoders: {path | hf | release | builtin: ...}``.

Each source is one record of :data:`circuitgraph.adapters.dictionary_sources.DICTIONARY_SOURCES`
(its local folder, how errors name it); its loader is here, registered on the record when this
module is imported (:func:`~circuitgraph.adapters.dictionary_sources.implement_dictionary_source`).
Every loader makes the dictionary with its final source record: the built-in dictionaries' name,
a hub reference, a release, and the model mismatch the spec allowed (the fit check runs on the
folder before any weight is read).  A new on-disk format is not a source: it is a record of
:data:`circuitgraph.spec.dictionaries.DICTIONARY_FORMATS` (any folder source reads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from circuitgraph.adapters.dictionary_sources import (
    DICTIONARY_SOURCES,
    FitCheck,
    dictionary_source,
    existing_dictionary_folder,
    implement_dictionary_source,
)
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


def _from_path(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype, check: FitCheck) -> Dictionary:
    folder = dictionary_folder(t)
    return load_dictionaries(folder, adapter, format=t.format, layers=_layers(t), dtype=dtype,
                             model_mismatch=check(folder))


def _from_hf(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype, check: FitCheck) -> Dictionary:
    return load_hf_dictionaries(spec_field(t.hf, "transcoders.hf"), adapter, format=t.format, layers=_layers(t),
                                dtype=dtype, check=check)


def _from_release(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype, check: FitCheck) -> Dictionary:
    # a release names its model in sae-lens's registry: load_release checks it (not the folder's files)
    ids = {int(k): v for k, v in t.ids.items() if t.layers is None or int(k) in t.layers} if t.ids else None
    return load_release(spec_field(t.release, "transcoders.release"), adapter, ids=ids, layers=_layers(t), dtype=dtype,
                        check_model=not t.allow_model_mismatch)


def _from_builtin(t: TranscodersSpec, adapter: ModelAdapter, dtype: torch.dtype, check: FitCheck) -> Dictionary:
    folder = dictionary_folder(t)
    return load_dictionaries(folder, adapter, layers=_layers(t), dtype=dtype,
                             source={"builtin": spec_field(t.builtin, "transcoders.builtin")},
                             model_mismatch=check(folder))


implement_dictionary_source("path", _from_path)
implement_dictionary_source("hf", _from_hf)
implement_dictionary_source("release", _from_release)
implement_dictionary_source("builtin", _from_builtin)


def load_dictionary_spec(t: TranscodersSpec, adapter: ModelAdapter, *, dtype: torch.dtype,
                         check: FitCheck = lambda folder: None) -> Dictionary:
    """The dictionary a spec's ``transcoders:`` section names, loaded for ``adapter`` in ``dtype``
    by its source's record; ``check``: the model-fit check of its folder (see
    :meth:`~circuitgraph.adapters.dictionary_sources.DictionarySourceRecord.load`)."""
    return dictionary_source(t).load(t, adapter, dtype=dtype, check=check)


def dictionary_folder(t: TranscodersSpec) -> Path:
    """The local folder of a ``path`` or ``builtin`` dictionary (read before any weight is;
    :func:`~circuitgraph.adapters.dictionary_sources.existing_dictionary_folder`)."""
    folder = existing_dictionary_folder(t)
    if folder is None:
        raise LoadError(f"transcoders.{t.source} {getattr(t, t.source)!r} has no local folder (an unknown built-in "
                        "dictionary, or a source whose folder is known only once it is fetched)")
    return folder
