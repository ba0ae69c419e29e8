"""The metadata a run records on its graph, as a typed model (:class:`RunMetadata`).

``graph.metadata`` stays a plain JSON object in the graph files (readers of older files, and
other tools, see the same fields), but the run builds it from this model, so every field is
named and typed once, here:

========================  ===============================================================
``spec``                  the validated spec (``Spec.model_dump(mode="json")``)
``model``                 ``{name, n_layers, source, architecture}``
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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelRecord", "RunMetadata"]


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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n_layers": self.n_layers, "source": self.source,
                "architecture": self.architecture, "format": self.format, "backend": self.backend}


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
