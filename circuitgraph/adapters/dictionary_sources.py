"""The spec's dictionary sources: one :class:`DictionarySourceRecord` per key of ``transcoders:``.

``transcoders: {path | hf | release | builtin: ...}`` (:class:`circuitgraph.spec.model.TranscodersSpec`)
is resolved through the record of its key in :data:`DICTIONARY_SOURCES`: the folder it is read
from before anything is loaded or fetched (``validate``, the dry run and the model-fit check read
it), how its errors name it, and its loader.  A new dictionary source is one record here (its
loader registered by :mod:`circuitgraph.dictionaries.sources` with
:func:`implement_dictionary_source`, as the formats' loaders are) and its key in ``spec/model.py``.
A new on-disk format is not a source: it is a record of
:data:`circuitgraph.spec.dictionaries.DICTIONARY_FORMATS` (any folder source reads it).

This module imports no torch: ``circuitgraph validate`` reads the records without loading anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitgraph.builtin import BUILTIN_DICTIONARIES, builtin_dictionary_dir
from circuitgraph.errors import spec_field
from circuitgraph.spec.model import TranscoderSource, TranscodersSpec

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["DictionarySourceRecord", "DICTIONARY_SOURCES", "FitCheck", "implement_dictionary_source",
           "dictionary_source", "existing_dictionary_folder"]

#: the model-fit check of a dictionary folder (its files against the spec's model): the model
#: mismatch the spec allows (recorded in the dictionary's source), or None; raises on a misfit
FitCheck = Callable[[Path], "str | None"]
#: a source's loader: ``(transcoders spec, adapter, dtype, fit check) -> dictionary`` made with its
#: final source record; it runs the check on its folder before any weight is read (where it has one)
DictionaryLoader = Callable[[TranscodersSpec, "ModelAdapter", Any, FitCheck], "Dictionary"]


@dataclass(frozen=True)
class DictionarySourceRecord:
    """One key of the spec's ``transcoders:`` section (see the module docstring)."""

    key: TranscoderSource
    #: the folder the dictionary is read from when it is known before anything is loaded or
    #: fetched; None for hub and release sources (their folder is known once the cache has it)
    local_folder: Callable[[TranscodersSpec], Path | None]
    #: errors name its folder (``parent/name``) rather than the spec's value
    shows_folder: bool = False
    #: ``transcoders.ids`` applies (the sae-lens id of each layer's dictionary)
    takes_ids: bool = False

    def load(self, t: TranscodersSpec, adapter: ModelAdapter, *, dtype: Any,
             check: FitCheck = lambda folder: None) -> Dictionary:
        """The dictionary ``t`` names, loaded for ``adapter`` in ``dtype`` (a ``torch.dtype``);
        ``check`` is run on its folder before its weights are read (a source whose folder is
        known then), and a mismatch it allows is recorded in the dictionary's source."""
        return self.loader()(t, adapter, dtype, check)

    def loader(self) -> DictionaryLoader:
        """The loader registered for this source (:func:`implement_dictionary_source`)."""
        try:
            return _LOADERS[self.key]
        except KeyError:
            raise LookupError(f"dictionary source {self.key!r} has no loader; the built-in sources' loaders register "
                              "when circuitgraph.dictionaries.sources is imported") from None

    def shown(self, t: TranscodersSpec, folder: Path) -> str:
        """How errors name the dictionary of ``t`` read from ``folder``."""
        return f"{folder.parent.name}/{folder.name}" if self.shows_folder else str(getattr(t, self.key))


#: key -> the loader registered for it (:func:`implement_dictionary_source`)
_LOADERS: dict[str, DictionaryLoader] = {}


def implement_dictionary_source(key: str, load: DictionaryLoader) -> None:
    """Register the loader of the dictionary source ``key`` (the module that loads dictionaries
    calls it when imported)."""
    if key not in DICTIONARY_SOURCES:
        raise ValueError(f"dictionary source {key!r} has no record in DICTIONARY_SOURCES")
    _LOADERS[key] = load


def _path_folder(t: TranscodersSpec) -> Path:
    return Path(spec_field(t.path, "transcoders.path"))


def _builtin_folder(t: TranscodersSpec) -> Path | None:
    name = spec_field(t.builtin, "transcoders.builtin")
    return builtin_dictionary_dir(name) if name in BUILTIN_DICTIONARIES else None


#: every dictionary source by its key in the spec's ``transcoders:`` section
DICTIONARY_SOURCES: dict[str, DictionarySourceRecord] = {r.key: r for r in (
    DictionarySourceRecord("path", _path_folder, shows_folder=True),
    DictionarySourceRecord("hf", lambda t: None),
    DictionarySourceRecord("release", lambda t: None, takes_ids=True),
    DictionarySourceRecord("builtin", _builtin_folder),
)}


def dictionary_source(t: TranscodersSpec) -> DictionarySourceRecord:
    """The record of the source the spec's transcoders section ``t`` names."""
    return DICTIONARY_SOURCES[t.source]


def existing_dictionary_folder(t: TranscodersSpec | None) -> Path | None:
    """The folder the spec's transcoders section ``t`` (or None) is read from when it is known
    before anything is loaded or fetched (the record's :attr:`~DictionarySourceRecord.local_folder`);
    None without a dictionary.  The twin of
    :func:`circuitgraph.adapters.model_sources.existing_model_folder`."""
    return None if t is None else dictionary_source(t).local_folder(t)
