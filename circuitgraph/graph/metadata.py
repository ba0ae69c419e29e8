"""The metadata of a graph (``graph.metadata``): every key declared once (:data:`METADATA_KEYS`),
one typed writer per key and typed readers (:class:`GraphMetadata`, :class:`RunMetadata`).

``graph.metadata`` stays a plain JSON object in the graph files (readers of older files, and
other tools, see the same fields).  Every top-level key circuitgraph writes is declared in
:data:`METADATA_KEYS` (what it holds and its one writer); the keys other tools' files carry and
circuitgraph reads are in :data:`FOREIGN_KEYS`.  The run's fields (``spec``, ``model``,
``prompt_tokens``...) are :class:`RunMetadata`'s; every later key has a writer method on
:class:`GraphMetadata` (``set_completeness`` in the engine, ``set_scores`` in the run,
``set_pruning`` in pruning, ``set_explorer`` in the explorer...), which refuses a key not
declared here, and the readers are its typed attributes.  A new key: its line in
:data:`METADATA_KEYS`, its writer and its reader here (docs/architecture.md).

Code that has a value passes it on typed (the seed, ``max_dense_nodes``); nothing reads back out
of the metadata what the run already knows.

``graph.metadata`` is a :class:`GraphMetadata`: the JSON object itself (a ``dict``, so the files
and ``metadata["key"]`` are unchanged, and a file's undeclared keys round-trip) with typed,
read-only attributes for the fields code reads (``graph.metadata.model_name``, ``.n_layers``,
``.prompt_tokens``...).  Each is ``None`` where a graph does not record it (a hand-built graph, a
file of another tool) or records something of another type, so readers need no ``isinstance``
checks of their own.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from circuitgraph.graph.graph import CompletenessReport
    from circuitgraph.graph.linearised_edges import LinearisedEdges

__all__ = ["GraphMetadata", "ModelRecord", "RunMetadata", "METADATA_KEYS", "FOREIGN_KEYS"]

#: every top-level key of ``graph.metadata`` circuitgraph writes: what it holds, and its one writer
#: (a :class:`RunMetadata` field, or a :class:`GraphMetadata` method and who calls it)
METADATA_KEYS: Mapping[str, str] = MappingProxyType({
    "spec": "the validated spec, Spec.model_dump(mode='json') (RunMetadata)",
    "model": "{name, n_layers, source, architecture, format, backend[, quantisation]} (RunMetadata.model, "
             "a ModelRecord)",
    "n_layers": "model.n_layers again, kept at the top for older readers (RunMetadata; an aggregate's "
                "for_aggregate)",
    "transcoders": "the dictionaries' describe(), None without dictionaries (RunMetadata)",
    "prompt_tokens": "the prompt's token ids (RunMetadata)",
    "prompt_token_strs": "their strings (RunMetadata)",
    "prompt": "the prompt's text (RunMetadata; an aggregate's for_aggregate)",
    "graph_options": "what the graph was built with: per-layer MLP and attention modes... (RunMetadata)",
    "versions": "the packages' versions (RunMetadata)",
    "warnings": "warnings of the run: the prompt's tokens, precision, pruning, checks (RunMetadata; "
                "add_warning, run_warnings, set_warnings)",
    "completeness": "the completeness report, CompletenessReport.to_dict() (set_completeness: the engine, "
                    "pruning), with precision_warning (set_precision_warning: the run)",
    "linearised_edges": "the component inputs' linearised edges: kinds, n_edges per kind, "
                        "max_relative_violation (set_linearised_edges: the engine)",
    "dtype": "the graph's dtype, float32 or float64 (set_dtype: the engine)",
    "replacement_score": "circuit-tracer's replacement score of the unpruned graph (set_scores: the run, "
                         "record_scores)",
    "completeness_score": "circuit-tracer's completeness score of the unpruned graph (set_scores)",
    "scores": "the scores with per-target error shares, ScoresResult.to_dict() (set_score_report: "
              "record_scores)",
    "pruning": "the pruning's parameters and the sizes before it (set_pruning: queries/prune.py)",
    "explorer": "what the explorer saved a subgraph from: source, thresholds, pinned nodes, supernodes "
                "(set_explorer: serve/api.py)",
    "dataset": "a dataset aggregate's run folder (for_aggregate: datasets/store.py)",
    "aggregate": "a dataset aggregate's graph, position and n_aggregated (for_aggregate)",
})
#: keys other tools' graph files carry that circuitgraph reads but never writes
FOREIGN_KEYS: Mapping[str, str] = MappingProxyType({
    "checks": "further exactness checks, shown in the HTML report's table (GraphMetadata.checks)",
    "source_urls": "the dictionaries' addresses, passed on to the Neuronpedia export (GraphMetadata.source_urls)",
    "prompt_str_tokens": "the prompt's token strings under another name (GraphMetadata.prompt_str_tokens)",
})


def _declared(key: str) -> str:
    if key not in METADATA_KEYS:
        raise KeyError(f"graph metadata key {key!r} is not declared in circuitgraph.graph.metadata.METADATA_KEYS")
    return key


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
        fields = {
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
        return {_declared(k): v for k, v in fields.items()}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A real number (numpy scalars included, bools not) as a float, else None."""
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: Any) -> list[Any] | None:
    return value if isinstance(value, list) else None


class GraphMetadata(dict):
    """``graph.metadata``: the graph's JSON metadata object (a ``dict``) with typed attributes
    for the fields code reads back and one writer method per key written after the run's
    :class:`RunMetadata` (see the module docstring).

    >>> m = GraphMetadata({"model": {"name": "demo", "n_layers": 2}, "prompt_tokens": [1, 5]})
    >>> m.model_name, m.n_layers, m.prompt_tokens, m.prompt
    ('demo', 2, [1, 5], None)
    """

    __slots__ = ()

    def _get(self, key: str) -> Any:
        """The value of a declared key (:data:`METADATA_KEYS` or :data:`FOREIGN_KEYS`), None when absent."""
        if key not in METADATA_KEYS and key not in FOREIGN_KEYS:
            raise KeyError(f"graph metadata key {key!r} is not declared in circuitgraph.graph.metadata")
        return self.get(key)

    def _set(self, key: str, value: Any) -> None:
        self[_declared(key)] = value

    # ------------------------------------------------------------------ readers
    @property
    def model(self) -> Mapping[str, Any] | None:
        """``model``: the :class:`ModelRecord` as a JSON object."""
        return _mapping(self._get("model"))

    @property
    def model_name(self) -> str | None:
        """The model's name (``model.name``; a bare string ``model`` from older hand-built graphs)."""
        model = self._get("model")
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
    def top_n_layers(self) -> int | None:
        """The top-level ``n_layers`` (an aggregate graph records only this one)."""
        return _int(self._get("n_layers"))

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
        return _str(self._get("prompt"))

    @property
    def prompt_tokens(self) -> list[int] | None:
        return _list(self._get("prompt_tokens"))

    @property
    def prompt_token_strs(self) -> list[str] | None:
        return _list(self._get("prompt_token_strs"))

    @property
    def prompt_str_tokens(self) -> list[Any] | None:
        """Another tool's name for the prompt's token strings (:data:`FOREIGN_KEYS`)."""
        return _list(self._get("prompt_str_tokens"))

    @property
    def spec(self) -> Mapping[str, Any] | None:
        """The spec of the run that built the graph, as JSON (``Spec.model_dump(mode="json")``)."""
        return _mapping(self._get("spec"))

    @property
    def max_dense_nodes(self) -> int | None:
        """The dense limit of the run that wrote the graph, its spec's ``graph.max_dense_nodes`` (read
        from a file, the one place this value is not already known to the code)."""
        spec = self.spec
        graph = _mapping(spec.get("graph")) if spec is not None else None
        value = _int(graph.get("max_dense_nodes")) if graph is not None else None
        return value if value is not None and value > 0 else None

    @property
    def transcoders(self) -> Mapping[str, Any] | None:
        return _mapping(self._get("transcoders"))

    @property
    def graph_options(self) -> Mapping[str, Any] | None:
        return _mapping(self._get("graph_options"))

    @property
    def versions(self) -> Mapping[str, Any] | None:
        return _mapping(self._get("versions"))

    @property
    def warnings(self) -> list[str] | None:
        """The run's warnings (:meth:`run_warnings` to append to them)."""
        return _list(self._get("warnings"))

    @property
    def completeness(self) -> Mapping[str, Any] | None:
        """The engine's completeness report (``CompletenessReport.to_dict()``)."""
        return _mapping(self._get("completeness"))

    @property
    def precision_warning(self) -> str | None:
        """``completeness.precision_warning``: what the graph's dtype allows (a bfloat16 model's rounding)."""
        completeness = self.completeness
        value = completeness.get("precision_warning") if completeness is not None else None
        return value if isinstance(value, str) and value else None

    @property
    def linearised_edges(self) -> Mapping[str, Any] | None:
        return _mapping(self._get("linearised_edges"))

    @property
    def dtype(self) -> str | None:
        return _str(self._get("dtype"))

    @property
    def replacement_score(self) -> float | None:
        return _number(self._get("replacement_score"))

    @property
    def completeness_score(self) -> float | None:
        return _number(self._get("completeness_score"))

    @property
    def scores(self) -> Mapping[str, Any] | None:
        """The scores with per-target error shares (``ScoresResult.to_dict()``, :func:`record_scores`)."""
        return _mapping(self._get("scores"))

    @property
    def pruning(self) -> Mapping[str, Any] | None:
        return _mapping(self._get("pruning"))

    @property
    def explorer(self) -> Mapping[str, Any] | None:
        return _mapping(self._get("explorer"))

    @property
    def dataset(self) -> str | None:
        return _str(self._get("dataset"))

    @property
    def aggregate(self) -> Mapping[str, Any] | None:
        """What a dataset's aggregate graph records about its rows (None on a prompt's graph)."""
        return _mapping(self._get("aggregate"))

    @property
    def checks(self) -> Mapping[str, Any] | None:
        """Another tool's further exactness checks (:data:`FOREIGN_KEYS`)."""
        return _mapping(self._get("checks"))

    @property
    def source_urls(self) -> list[str] | None:
        """Another tool's addresses of the dictionaries (:data:`FOREIGN_KEYS`), when a list of strings."""
        value = self._get("source_urls")
        return list(value) if isinstance(value, list) and all(isinstance(u, str) for u in value) else None

    # ------------------------------------------------------------------ writers (one per key)
    def set_completeness(self, report: CompletenessReport) -> None:
        """``completeness``: the graph's completeness report (the engine, and pruning for its graph)."""
        self._set("completeness", report.to_dict())

    def set_precision_warning(self, text: str) -> None:
        """``completeness.precision_warning`` (the run, for a graph exact only to its dtype's rounding),
        also added to ``warnings``."""
        completeness = self._get("completeness")
        if not isinstance(completeness, dict):
            raise KeyError("graph metadata has no completeness report to add a precision warning to")
        completeness["precision_warning"] = text
        self.add_warning(text)

    def set_linearised_edges(self, linearised: LinearisedEdges) -> None:
        """``linearised_edges``: the component inputs' linearised edges, per kind (the engine)."""
        names = linearised.kind_names()
        self._set("linearised_edges", {
            "kinds": linearised.kinds, "n_edges": {k: int((names == k).sum()) for k in linearised.kinds},
            "max_relative_violation": float(linearised.max_violation())})

    def set_dtype(self, dtype: str) -> None:
        """``dtype``: the graph's float type, ``float32`` or ``float64`` (the engine)."""
        self._set("dtype", dtype)

    def run_warnings(self) -> list[str]:
        """The ``warnings`` list itself, made empty when absent: the run appends to it as it goes."""
        value = self.get("warnings")
        if not isinstance(value, list):
            value = []
            self._set("warnings", value)
        return value

    def add_warning(self, text: str) -> None:
        """Append one line to ``warnings``."""
        self.run_warnings().append(text)

    def set_warnings(self, warnings: Sequence[str]) -> None:
        """``warnings``: a copy of ``warnings`` (a pruned graph carries its full graph's)."""
        self._set("warnings", list(warnings))

    def set_scores(self, replacement_score: float | None, completeness_score: float | None) -> None:
        """``replacement_score`` and ``completeness_score`` of the unpruned graph."""
        self._set("replacement_score", replacement_score)
        self._set("completeness_score", completeness_score)

    def set_score_report(self, report: Mapping[str, Any]) -> None:
        """``scores``: the scores with per-target error shares (``ScoresResult.to_dict()``)."""
        self._set("scores", dict(report))

    def set_pruning(self, params: Mapping[str, Any], *, n_nodes_before: int, n_edges_before: int,
                    n_remainder_nodes: int) -> None:
        """``pruning``: the pruning's parameters and the graph's size before it."""
        self._set("pruning", {**params, "n_nodes_before": n_nodes_before, "n_edges_before": n_edges_before,
                              "n_remainder_nodes": n_remainder_nodes})

    def set_explorer(self, *, source: str, node_threshold: float, edge_threshold: float, top_k_nodes: int | None,
                     pinned: Sequence[str], supernodes: Mapping[str, Any]) -> None:
        """``explorer``: the graph and view a subgraph was saved from in the explorer."""
        self._set("explorer", {"source": source, "node_threshold": node_threshold, "edge_threshold": edge_threshold,
                               "top_k_nodes": top_k_nodes, "pinned": list(pinned), "supernodes": supernodes})

    @classmethod
    def for_aggregate(cls, *, dataset: str, aggregate: Mapping[str, Any], n_layers: int | None,
                      prompt: str) -> GraphMetadata:
        """A dataset aggregate graph's metadata: ``dataset``, ``aggregate``, ``n_layers``, ``prompt``."""
        meta = cls()
        meta._set("dataset", dataset)
        meta._set("aggregate", dict(aggregate))
        meta._set("n_layers", n_layers)
        meta._set("prompt", prompt)
        return meta
