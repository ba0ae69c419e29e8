"""The graph files' pydantic model: one definition that reads (validates) a graph file and
generates its JSON Schema (schemas/graph.schema.json, :mod:`circuitgraph.export.graph_schema`).

:class:`GraphFile` is the ``circuitgraph.graph`` JSON document (docs/export.md);
:class:`BinaryGraphHeader` is the header of the binary ``.npz`` format (the same fields but the
edges, which the archive holds as arrays).  :func:`validate_graph_file` parses and checks a
document in one pass of pydantic's Rust core and turns the first problem into a one-line
:class:`~circuitgraph.errors.LoadError` naming the file, the field and what was wrong.

Speed: a graph file can hold millions of edges, so an edge is a ``TypedDict`` (checked in Rust,
read back as a plain dict), not a model instance; reading a 250,000-edge file through the model
costs what ``json.loads`` alone costs.  Nodes are models (a graph has far fewer nodes).

What the model checks beyond the types is what needs the whole document: every edge and target
names a node, no node appears twice (:func:`circuitgraph.export.json_graph.graph_from_dict`).

Versions: a file with a higher ``format_version`` than :data:`FORMAT_VERSION` is refused with
"upgrade circuitgraph".  A writer writes the lowest version that holds the file's content
(:func:`file_version`): 1 for every graph without ``linearised_edges``, 2 for one with them (a
reader of version 1 would drop them silently). Files written by earlier releases of version 1 may lack
the fields added since (``steering``) or that older writers left out (``edge_dtype``,
``metadata``, ``targets``, ``queries``, ``validation``, a node's ``label`` and ``attrs``); the
model gives them their defaults.  The schema lists as required what the writer always writes.
"""

from __future__ import annotations

import math
import reprlib
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from typing_extensions import TypedDict

from circuitgraph.errors import LoadError
from circuitgraph.graph.nodes import NODE_KINDS

__all__ = [
    "FORMAT",
    "BINARY_FORMAT",
    "FORMAT_VERSION",
    "VERSION_OF_FIELD",
    "file_version",
    "EDGE_DTYPES",
    "NodeRecord",
    "EdgeRecord",
    "TargetRecord",
    "GraphFile",
    "BinaryGraphHeader",
    "validate_graph_file",
]

FORMAT = "circuitgraph.graph"
BINARY_FORMAT = "circuitgraph.graph.npz"
FORMAT_VERSION = 2
#: the version that introduced each optional field: a file holding it is written at least at that version
VERSION_OF_FIELD = {"linearised_edges": 2}


def file_version(document: dict[str, Any]) -> int:
    """The lowest ``format_version`` that holds ``document``'s fields (1 where none needs more)."""
    return max([1] + [v for k, v in VERSION_OF_FIELD.items() if document.get(k)])
#: edge weight dtypes the formats record and restore
EDGE_DTYPES = ("float16", "float32", "float64")

#: node layers, positions and indices are within +-2**62 (token ids, feature indices)
_MAX_INT = 2**62


def _finite_tree(value: Any, where: str = "") -> Any:
    """Refuse NaN and infinities anywhere in a free-form JSON value (the JSON parser accepts the
    non-standard ``NaN``/``Infinity`` tokens; a graph file holds finite numbers only)."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{at or 'the value'} is {item}; a graph holds finite numbers only")
        elif isinstance(item, dict):
            stack.extend((v, f"{at}[{k!r}]") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
    return value


#: a JSON object of free-form data (no NaN or infinities inside)
JsonObject = Annotated[dict[str, Any], AfterValidator(_finite_tree)]
#: a finite JSON number (not a bool, not a string)
FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]
#: a node id as text, ``kind/layer/position/index``
NodeIdText = Annotated[str, Field(
    strict=True, pattern=rf"^({'|'.join(NODE_KINDS)})/-?[0-9]+/-?[0-9]+/-?[0-9]+$",
    description="NodeId as kind/layer/position/index, e.g. feature/1/4/17")]
_Integer = Annotated[int, Field(strict=True, ge=-_MAX_INT, le=_MAX_INT)]

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


def _strict(json_schema_extra: Any) -> ConfigDict:
    """:data:`_STRICT` with a ``json_schema_extra``."""
    return ConfigDict(extra="forbid", strict=True, frozen=True, json_schema_extra=json_schema_extra)


def _required(*names: str) -> Any:
    """A ``json_schema_extra`` that states the schema's ``required`` list: what the writer always
    writes (the reader gives files of earlier releases defaults for some of them)."""
    def extra(schema: dict[str, Any]) -> None:
        schema["required"] = list(names)
    return extra


class NodeRecord(BaseModel):
    """One node. Readers (feature, neuron, logit, target) also carry pre_activation and constant,
    with pre_activation == sum(incoming edge weights) + constant."""

    model_config = _strict(
        lambda schema: schema.update(
            required=["id", "kind", "layer", "position", "index", "activation", "label", "attrs"],
            dependentRequired={"pre_activation": ["constant"], "constant": ["pre_activation"]}),
    )

    id: NodeIdText
    kind: Literal[NODE_KINDS]  # type: ignore[valid-type]
    layer: Annotated[_Integer, Field(description="-1 for embedding/positional, n_layers for logit")]
    position: Annotated[_Integer, Field(description="token position (0-based)")]
    index: Annotated[_Integer, Field(description="feature/neuron/head index, token id for embedding/logit")]
    activation: Annotated[FiniteNumber, Field(description="the writer's scale (1 for vector nodes)")]
    pre_activation: Annotated[FiniteNumber | None, Field(description="measured pre-activation (readers)")] = None
    constant: Annotated[FiniteNumber | None, Field(
        description="part of the pre-activation that comes from no node (readers)")] = None
    label: Annotated[str, Field(strict=True)] = ""
    attrs: Annotated[JsonObject, Field(description="free-form per-node data (token_str, influence, ...)")] = {}

    @model_validator(mode="after")
    def _id_matches(self) -> NodeRecord:
        expected = f"{self.kind}/{self.layer}/{self.position}/{self.index}"
        if self.id != expected:
            raise ValueError(f"id {_brief(self.id)} does not match kind/layer/position/index ({expected})")
        return self


class EdgeRecord(TypedDict):
    """A direct effect source -> target; weight is the stored value at full precision."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    source: NodeIdText
    target: NodeIdText
    weight: FiniteNumber


class LinearisedEdgeRecord(TypedDict):
    """A linearised edge into a head (``graph.head_inputs``): the first-order effect of ``source`` on
    the targets through ``target``'s query or key input at the prompt; never part of completeness."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    source: NodeIdText
    target: NodeIdText
    weight: FiniteNumber
    kind: Literal["query", "key"]
    linearised: Literal[True]


class TargetRecord(TypedDict):
    """An attribution target: a node and its weight in the target's combination."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    node: NodeIdText
    weight: FiniteNumber


class _Header(BaseModel):
    """The fields both formats share (everything but the edges)."""

    model_config = _STRICT
    #: the value ``format`` must have
    FORMAT: ClassVar[str] = FORMAT

    format: str
    format_version: Annotated[int, Field(strict=True, ge=1, json_schema_extra={"maximum": FORMAT_VERSION}, description=(
        "1, or 2 when the file holds linearised_edges (the lowest version that holds the content)"))]
    edge_dtype: Annotated[Literal[EDGE_DTYPES], Field(  # type: ignore[valid-type]
        description="dtype of the edge weights, restored on loading")] = "float32"
    metadata: Annotated[JsonObject, Field(
        description="spec, model and transcoder identity, prompt, versions, exactness checks "
                    "(graph/metadata.py, RunMetadata)")] = {}
    nodes: list[NodeRecord]
    targets: list[TargetRecord] = []
    queries: Annotated[list[JsonObject], Field(description="query results")] = []
    validation: Annotated[list[JsonObject], Field(description="validation results")] = []
    steering: Annotated[list[JsonObject], Field(
        description="steering results (the spec's steer: items; docs/steering.md); absent without them")] = []
    linearised_edges: Annotated[list[LinearisedEdgeRecord], Field(
        description="the linearised query and key edges into heads (graph.head_inputs; docs/maths.md "
                    "section 11), apart from the exact edges; absent without them")] = []

    @field_validator("format_version")
    @classmethod
    def _readable_version(cls, version: int) -> int:
        if version > FORMAT_VERSION:
            raise ValueError(f"format_version {version}: this circuitgraph reads up to {FORMAT_VERSION}: "
                             "upgrade circuitgraph")
        return version


class GraphFile(_Header):
    """An exact attribution graph written by circuitgraph (docs/export.md)."""

    model_config = _strict(_required(
        "format", "format_version", "edge_dtype", "metadata", "nodes", "edges", "targets", "queries",
        "validation"))

    format: Annotated[Literal[FORMAT], Field(json_schema_extra={"const": FORMAT})]  # type: ignore[valid-type]
    edges: list[EdgeRecord]


class BinaryGraphHeader(_Header):
    """The JSON header of a binary ``.npz`` graph (its edges are the archive's arrays)."""

    model_config = _strict(_required(
        "format", "format_version", "edge_dtype", "metadata", "nodes", "targets", "queries", "validation"))
    FORMAT: ClassVar[str] = BINARY_FORMAT

    format: Literal[BINARY_FORMAT]  # type: ignore[valid-type]


def validate_graph_file(source: str | bytes | Any, model: type[_Header] = GraphFile, *,
                        where: str = "graph file") -> Any:
    """Validate a graph document against ``model``: JSON text or bytes (parsed and checked in one
    pass) or parsed Python objects.  Raises a one-line :class:`LoadError` naming ``where``, the
    field and what was wrong (and how many other problems there are)."""
    try:
        if isinstance(source, (str, bytes, bytearray)):
            return model.model_validate_json(source)
        return model.model_validate(source)
    except ValidationError as exc:
        raise LoadError(_error_line(exc, model, where)) from None


def _error_line(exc: ValidationError, model: type[_Header], where: str) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"{where} is not valid JSON: {first['msg'].removeprefix('Invalid JSON: ')}"
    if first["type"] == "model_type" and not first["loc"]:
        return f"a circuitgraph {where} holds a JSON object, got {_json_type(first['input'])}"
    by_loc = {tuple(e["loc"]): e for e in errors}
    if ("format",) in by_loc:
        fmt = by_loc[("format",)]
        if fmt["type"] == "missing" and ("links",) in by_loc:
            # circuit-tracer / Neuronpedia's attribution-graph format (what export: {neuronpedia: ...} writes)
            return ("this is an attribution graph in Neuronpedia's format (nodes and links, for Neuronpedia's "
                    "graph viewer), not a circuitgraph graph file: open it in that viewer, or render the "
                    "circuitgraph graph written with it (export: {json: PATH.json} or {graph: PATH.npz})")
        got = "missing" if fmt["type"] == "missing" else _brief(fmt["input"])
        return f"not a circuitgraph {where}: format is {got}, expected {model.FORMAT!r}"
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    message = _message(first)
    sep = "" if message.startswith("[") else ": "  # a path inside a free-form value continues the field's
    return f"{where}: {_location(first['loc'])}{sep}{message}{more}"


def _location(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in ("function-after[_finite_tree()]",) or str(part).startswith(("function-", "literal[")):
            continue
        else:
            text += f".{part}" if text else str(part)
    return text or "the document"


def _message(error: Any) -> str:
    msg = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        return "missing (a required field)"
    if error["type"] in ("value_error", "assertion_error"):
        return msg
    if error["type"] in _EXPECTED:
        return f"expected {_EXPECTED[error['type']]}, got {_brief(error.get('input'))}"
    return f"{msg[:1].lower()}{msg[1:]}, got {_brief(error.get('input'))}"


#: pydantic's error types whose own wording names Python types: what the JSON should hold
_EXPECTED = {"model_type": "an object", "model_attributes_type": "an object", "dict_type": "an object",
             "list_type": "an array", "string_type": "a string", "int_type": "an integer",
             "float_type": "a number", "bool_type": "a boolean"}


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def _brief(value: Any, limit: int = 60) -> str:
    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxdict, short.maxstring, short.maxother = 2, 4, 3, limit, limit
    text = short.repr(value) if not isinstance(value, BaseException) else " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
