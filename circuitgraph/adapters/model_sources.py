"""The spec's model sources: one :class:`ModelSourceRecord` per key of ``model:``.

``model: {path | name | pretrained | builtin: ...}`` (:class:`circuitgraph.spec.model.ModelSpec`)
is resolved through the record of its key in :data:`MODEL_SOURCES`: the folder it is read from
before anything is converted or fetched (``validate``, the dry run and ``train.backend: sparsify``
read it), whether loading it always imports TransformerLens, what the dry run says when its files
are not there yet, and its loader.  A new model source is one record here (its loader registered
by :mod:`circuitgraph.adapters.loading` with :func:`implement_model_source`, as the dictionary
formats' loaders are) and its key in ``spec/model.py``; nothing else names a source.

This module imports no torch: ``circuitgraph validate`` reads the records without building a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from circuitgraph.adapters.gguf import RECORD_FILE, gguf_cache_folder, is_gguf_file, read_gguf_summary
from circuitgraph.adapters.pretrained import is_fetched, pretrained_dir
from circuitgraph.builtin import BUILTIN_MODELS
from circuitgraph.errors import spec_field
from circuitgraph.spec.model import ModelSource, ModelSpec

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["ModelSourceRecord", "MODEL_SOURCES", "PendingModel", "implement_model_source", "model_source",
           "existing_model_folder"]

#: a source's loader: ``(model spec, dtype name, weights dtype name or None) -> adapter`` whose
#: ``source`` record is final (it says ``weights_dtype`` when one is given)
ModelLoader = Callable[[ModelSpec, str, "str | None"], "ModelAdapter"]


class PendingModel(NamedTuple):
    """What the dry run knows of a model whose folder is not there yet (a GGUF file not converted,
    a pretrained model not fetched): its sizes when a header gives them (else 0) and a note (the
    dry run adds the size in memory when it is known)."""

    n_layers: int
    d_model: int
    bytes: int
    note: str


@dataclass(frozen=True)
class ModelSourceRecord:
    """One key of the spec's ``model:`` section (see the module docstring)."""

    key: ModelSource
    #: the model folder the source is read from when it is there without converting or fetching
    #: anything; None when it is not (yet), or never (a hub name)
    local_folder: Callable[[ModelSpec], Path | None]
    #: whether its files are on this machine before the run (a hub name's are not: its size, config
    #: and dictionary are known only once it is loaded)
    local: bool
    #: whether loading it always imports TransformerLens (a hub name, a Hugging Face conversion);
    #: otherwise its folder's backend says (``adapters.loading.folder_backend``)
    always_transformer_lens: bool
    #: why ``validate`` read no config of a model given this way (``run_time_notes``)
    unread_config: str
    #: the spec's value names the model without its config (a dictionary's declared model can be
    #: compared with it before the config is read; a folder's name alone is not enough)
    named_without_config: bool = True
    #: the dry run's sizes and note when :attr:`local_folder` is None (None: nothing to say)
    pending: Callable[[ModelSpec], PendingModel | None] = lambda m: None

    def loader(self) -> ModelLoader:
        """The loader registered for this source (:func:`implement_model_source`)."""
        try:
            return _LOADERS[self.key]
        except KeyError:
            raise LookupError(f"model source {self.key!r} has no loader; the built-in sources' loaders register "
                              "when circuitgraph.adapters.loading is imported") from None

    def load(self, m: ModelSpec, dtype: str, weights_dtype: str | None = None) -> ModelAdapter:
        """Load ``m`` in ``dtype``; its adapter's source record says ``weights_dtype`` (when given)."""
        return self.loader()(m, dtype, weights_dtype)


#: key -> the loader registered for it (:func:`implement_model_source`)
_LOADERS: dict[str, ModelLoader] = {}


def implement_model_source(key: str, load: ModelLoader) -> None:
    """Register the loader of the model source ``key`` (the module that loads models calls it when imported)."""
    if key not in MODEL_SOURCES:
        raise ValueError(f"model source {key!r} has no record in MODEL_SOURCES")
    _LOADERS[key] = load


# ------------------------------------------------------------------ the built-in sources' folders
def _path_folder(m: ModelSpec) -> Path | None:
    path = spec_field(m.path, "model.path")
    if is_gguf_file(path):  # its converted folder, once cached
        folder = gguf_cache_folder(path) if Path(path).is_file() else None
        return folder if folder is not None and (folder / RECORD_FILE).is_file() else None
    return Path(path)


def _path_pending(m: ModelSpec) -> PendingModel:
    path = spec_field(m.path, "model.path")  # a GGUF file not converted yet: its header
    g = read_gguf_summary(path)
    return PendingModel(g.n_layers, g.d_model, 4 * g.n_params, f"{Path(path).name}: dequantised to float32 on first use")


def _builtin_folder(m: ModelSpec) -> Path | None:
    name = spec_field(m.builtin, "model.builtin")
    return Path(BUILTIN_MODELS[name]()) / "model" if name in BUILTIN_MODELS else None


def _pretrained_folder(m: ModelSpec) -> Path | None:
    name = spec_field(m.pretrained, "model.pretrained")
    return pretrained_dir(name) if is_fetched(name) else None


def _pretrained_pending(m: ModelSpec) -> PendingModel:
    return PendingModel(0, 0, 0, f"pretrained model {m.pretrained}: not fetched yet (`circuitgraph fetch "
                        f"{m.pretrained}`); its size is known once it is")


#: every model source by its key in the spec's ``model:`` section
MODEL_SOURCES: dict[str, ModelSourceRecord] = {r.key: r for r in (
    ModelSourceRecord("path", _path_folder, local=True, always_transformer_lens=False,
                      unread_config="no config.json was read", named_without_config=False, pending=_path_pending),
    ModelSourceRecord("name", lambda m: None, local=False, always_transformer_lens=True,
                      unread_config="a hub name (its config is not downloaded)"),
    ModelSourceRecord("pretrained", _pretrained_folder, local=True, always_transformer_lens=True,
                      unread_config="model source pretrained", pending=_pretrained_pending),
    ModelSourceRecord("builtin", _builtin_folder, local=True, always_transformer_lens=False,
                      unread_config="model source builtin"),
)}


def model_source(m: ModelSpec) -> ModelSourceRecord:
    """The record of the source the spec's model section ``m`` names."""
    return MODEL_SOURCES[m.source]


def existing_model_folder(m: ModelSpec) -> Path | None:
    """The model folder the spec's model section ``m`` is read from, when it is there without
    converting or fetching anything: a ``path`` folder, the built-in model's folder, a GGUF file's
    converted folder once cached, a pretrained model's folder once fetched; None for hub names and
    for what is not converted or fetched yet (the record's :attr:`~ModelSourceRecord.local_folder`)."""
    return model_source(m).local_folder(m)
