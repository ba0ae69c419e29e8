"""The metadata a run records on its graph, as a typed model (:class:`RunMetadata`).

``graph.metadata`` stays a plain JSON object in the graph files (readers of older files, and
other tools, see the same fields), but the run builds it from this model, so every field is
named and typed once, here:

========================  ===============================================================
``spec``                  the validated spec (``Spec.model_dump(mode="json")``)
``model``                 ``{name, n_layers, source, architecture, format, backend}``, and
                          ``quantisation`` for weights dequantised from a GGUF file
``n_layers``              the same ``model.n_layers``, kept at the top for older readers
                          (read it as :attr:`AttributionGraph.model_n_layers`)
``transcoders``           the dictionaries' ``describe()`` (None without dictionaries)
``prompt_tokens``         token ids; ``prompt_token_strs`` their strings; ``prompt`` the text
``graph_options``         what the graph was built with (per-layer MLP and attention modes...)
``versions``              the packages' versions
``warnings``              warnings raised while the prompt was resolved
========================  ===============================================================

The engine adds ``completeness`` and ``dtype``; scores, pruning and the run add
``replacement_score``, ``completeness_score``, ``scores``, ``pruning``.  Code that has a value
passes it on typed (the seed, ``max_dense_nodes``); nothing reads back out of the metadata what
the run already knows.

``graph.metadata`` is a :class:`GraphMetadata`: the JSON object itself (a ``dict``, so the files
and ``metadata["key"]`` are unchanged) with typed, read-only attributes for the fields code reads
(``graph.metadata.model_name``, ``.n_layers``, ``.prompt_tokens``...).  Each is ``None`` where a
graph does not record it (a hand-built graph, a file of another tool) or records something of
another type, so readers need no ``isinstance`` checks of their own.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GraphMetadata", "ModelRecord", "RunMetadata"]


@dataclass(frozen=True)
class ModelRecord:
    """``metadata["model"]``."""

    name: str
    n_layers: int
    source: Any
    architecture: dict[str, Any]
    #: where the model came from: ``transformer_lens`` or ``huggingface`` (docs/models.md)
    format: str = "transformer_lens"
    #: which implementation ran the forward: ``native`` (circuitgraph's torch-only HookedTransformer) or
    #: ``transformer_lens`` (docs/models.md)
    backend: str = "transformer_lens"
    #: the quantised checkpoint the weights were dequantised from (``{format: gguf, file, file_type,
    #: tensor_types, dequantised_to}``, docs/real_models.md); absent for weights as published
    quantisation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "n_layers": self.n_layers, "source": self.source,
               "architecture": self.architecture, "format": self.format, "backend": self.backend}
        if self.quantisation is not None:
            out["quantisation"] = self.quantisation
        return out


@dataclass(frozen=True)
class RunMetadata:
    """What a run records on its graph (see the module docstring); :meth:`to_dict` is the
    ``graph.metadata`` object, field for field as the graph files hold it."""

    spec: dict[str, Any]
    model: ModelRecord
    transcoders: dict[str, Any] | None
    prompt_tokens: list[int]
    prompt_token_strs: list[str]
    prompt: str
    graph_options: dict[str, Any]
    versions: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "model": self.model.to_dict(),
            "n_layers": self.model.n_layers,
            "transcoders": self.transcoders,
            "prompt_tokens": self.prompt_tokens,
            "prompt_token_strs": self.prompt_token_strs,
            "prompt": self.prompt,
            "graph_options": self.graph_options,
            "versions": self.versions,
            "warnings": self.warnings,
        }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A real number (numpy scalars included, bools not) as a float, else None."""
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


class GraphMetadata(dict):
    """``graph.metadata``: the graph's JSON metadata object (a ``dict``) with typed attributes
    for the fields code reads back (see the module docstring).

    >>> m = GraphMetadata({"model": {"name": "demo", "n_layers": 2}, "prompt_tokens": [1, 5]})
    >>> m.model_name, m.n_layers, m.prompt_tokens, m.prompt
    ('demo', 2, [1, 5], None)
    """

    __slots__ = ()

    @property
    def model(self) -> Mapping[str, Any] | None:
        """``model``: the :class:`ModelRecord` as a JSON object."""
        return _mapping(self.get("model"))

    @property
    def model_name(self) -> str | None:
        """The model's name (``model.name``; a bare string ``model`` from older hand-built graphs)."""
        model = self.get("model")
        name = model.get("name") if isinstance(model, Mapping) else model
        return name if isinstance(name, str) and name else None

    @property
    def quantisation(self) -> Mapping[str, Any] | None:
        """``model.quantisation``: the GGUF checkpoint's quantisation the weights were dequantised from
        (``file_type`` such as ``Q4_1``, ``tensor_types``); None for weights as published."""
        model = self.model
        return _mapping(model.get("quantisation")) if model is not None else None

    @property
    def n_layers(self) -> int | None:
        """The model's number of blocks, ``model.n_layers`` (the top-level ``n_layers`` is the
        same value, kept for older readers)."""
        model = self.model
        return _int(model.get("n_layers")) if model is not None else None

    @property
    def d_vocab(self) -> int | None:
        """The vocabulary size: ``model.architecture.d_vocab``, else ``model.d_vocab``."""
        model = self.model
        if model is None:
            return None
        arch = _mapping(model.get("architecture"))
        found = _int(arch.get("d_vocab")) if arch is not None else None
        return found if found is not None else _int(model.get("d_vocab"))

    @property
    def prompt(self) -> str | None:
        value = self.get("prompt")
        return value if isinstance(value, str) else None

    @property
    def prompt_tokens(self) -> list[int] | None:
        value = self.get("prompt_tokens")
        return value if isinstance(value, list) else None

    @property
    def prompt_token_strs(self) -> list[str] | None:
        value = self.get("prompt_token_strs")
        return value if isinstance(value, list) else None

    @property
    def spec(self) -> Mapping[str, Any] | None:
        """The spec of the run that built the graph, as JSON (``Spec.model_dump(mode="json")``)."""
        return _mapping(self.get("spec"))

    @property
    def transcoders(self) -> Mapping[str, Any] | None:
        return _mapping(self.get("transcoders"))

    @property
    def versions(self) -> Mapping[str, Any] | None:
        return _mapping(self.get("versions"))

    @property
    def completeness(self) -> Mapping[str, Any] | None:
        """The engine's completeness report (``CompletenessReport.to_dict()``)."""
        return _mapping(self.get("completeness"))

    @property
    def replacement_score(self) -> float | None:
        return _number(self.get("replacement_score"))

    @property
    def completeness_score(self) -> float | None:
        return _number(self.get("completeness_score"))

    @property
    def aggregate(self) -> Mapping[str, Any] | None:
        """What a dataset's aggregate graph records about its rows (None on a prompt's graph)."""
        return _mapping(self.get("aggregate"))
