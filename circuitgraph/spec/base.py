"""The strict base model, shared field types and the tagged-union helpers of the spec.

Every spec model derives from :class:`StrictModel`: unknown keys are errors
(``extra="forbid"``), instances are frozen, and constructing one in Python with bad
values raises :class:`~circuitgraph.errors.SpecError` listing every problem.

Scalars are strict where YAML already gives the right type (``k: true`` is not the
integer 1, ``position: "3"`` is not 3); floats accept integers.  Layer numbers used as
mapping keys are the exception: YAML gives ints, JSON gives strings, both are accepted.

Unions are *tagged*: a callable :class:`~pydantic.Discriminator` picks the variant from
the key that is present (``{logit: ...}`` vs ``{logit_diff: ...}``) or from the shape of
the value (a string vs a mapping), so an error inside one variant is reported for that
variant only.  Tags are written ``<name>``; the error formatter drops them from locations.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    ValidationError,
    ValidationInfo,
    create_model,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from circuitgraph.errors import SpecError
from circuitgraph.spec.error_codes import RULE_ERROR, VARIANT_ERROR, VARIANTS, _short
from circuitgraph.spec.kinds import NODE_KINDS
from circuitgraph.spec.messages import format_validation_error

__all__ = [
    "StrictModel",
    "KeyedModel",
    "KindItem",
    "QueryItem",
    "CheckItem",
    "query_item",
    "check_item",
    "GraphChoice",
    "keyed_union",
    "shaped_union",
    "tagged",
    "rule_error",
    "unused_rules",
    "UsageModel",
    "Params",
    "Int",
    "PositiveInt",
    "NonNegativeInt",
    "Float",
    "Fraction",
    "Bool",
    "Name",
    "Token",
    "TokenPair",
    "NodeIdStr",
    "InputPath",
    "OutputPath",
    "LayerKey",
]

def rule_error(*problems: tuple[str, str]) -> PydanticCustomError:
    """An error for one or more broken rules, each ``(field, message)``.

    ``field`` is a location relative to the model being validated (``"scale"``,
    ``"queries[2].direct_logit_attribution.target"``, or ``""`` for the model itself);
    the formatter appends it to the model's location.
    """
    text = "; ".join(f"{f}: {m}" if f else m for f, m in problems)
    return PydanticCustomError(RULE_ERROR, "{text}", {"text": text, "problems": list(problems)})




class _SpecModelMeta(type(BaseModel)):
    """Makes ``Model(**data)`` raise :class:`SpecError` instead of pydantic's error.

    Done on the metaclass rather than in ``__init__``: pydantic calls an overridden
    ``__init__`` for every nested model, which would stop at the first bad sub-model
    instead of reporting every problem at once.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            assert issubclass(cls, BaseModel)  # every class of this metaclass is a pydantic model
            raise SpecError(format_validation_error(exc, cls, kwargs)) from None


class StrictModel(BaseModel, metaclass=_SpecModelMeta):
    """Base of every spec model: unknown keys are errors, instances are frozen.

    ``Model(**data)`` raises :class:`~circuitgraph.errors.SpecError` listing every
    problem; ``Model.model_validate(data)`` raises pydantic's ``ValidationError``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def unused_rules(model: BaseModel, rules: dict[str, tuple[bool, str]]) -> list[tuple[str, str]]:
    """Problems ``(field, message)`` for the fields written in the spec that the model's other
    choices leave unused; ``rules``: field -> ``(used, why it is not used)``.  A field counts as
    written when the input set it, even to its default: the run would otherwise record a value
    that changed nothing."""
    return [(name, f"{name} is not used here: {why}; remove it") for name, (used, why) in rules.items()
            if name in model.model_fields_set and not used]


class UsageModel(StrictModel):
    """A spec model some of whose fields only matter for some choices of the others
    (``ablate``'s ``k`` only with ``nodes: top_nodes``).

    :meth:`field_usage` says, per such field, whether it is used and why not; the model's
    validator reports a written but unused field with :func:`unused_rules`, and a dump leaves out
    the unused fields (they hold their defaults), so that a dumped spec loads back unchanged and
    a recorded spec shows only what the run used.
    """

    def field_usage(self) -> dict[str, tuple[bool, str]]:
        """``{field: (used, why it is not used)}``."""
        return {}

    @model_serializer(mode="wrap")
    def _without_unused(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name, (used, _) in self.field_usage().items():
                if not used:
                    data.pop(name, None)
        return data


class KeyedModel(StrictModel):
    """One item of a list whose kind is named by the key present, e.g. ``{logit: " an"}``.

    ``kind`` is that key; ``params`` is the value stored under it.
    """

    key: ClassVar[str]

    @staticmethod
    def _key_is_required(schema: dict[str, Any], cls: type) -> None:
        # the naming key may have a default in Python (``TopLogitsTarget()``) but must
        # be written in a spec file: it is what tells the variants apart
        required = schema.setdefault("required", [])
        if cls.key not in required:  # type: ignore[attr-defined]
            required.insert(0, cls.key)  # type: ignore[attr-defined]

    model_config = ConfigDict(json_schema_extra=_key_is_required)

    @property
    def kind(self) -> str:
        return self.key

    @property
    def params(self) -> Any:
        return getattr(self, self.key)


#: which graph a query or check runs on: the unpruned graph or the pruned (exported) one
GraphChoice = Literal["full", "pruned"]


class KindItem(KeyedModel):
    """An item of ``queries`` or ``validate``: one key naming the kind, whose value is the kind's
    parameter model (:attr:`params_model`); made by :func:`query_item` / :func:`check_item`."""

    #: the parameter model stored under :attr:`key`
    params_model: ClassVar[type[StrictModel]]


class QueryItem(KindItem):
    """An item of ``queries``: its kind key, and ``on`` (which graph it runs on).

    Each kind is one line in :mod:`circuitgraph.spec.queries`, ``TopPathsQuery = query_item("top_paths",
    TopPaths)``, listed in the spec's ``QUERY_TYPES``: its union and its schema are built from it; the
    function that runs a kind, ``function(graph, params) -> QueryResult``, registers itself under the
    item's ``key`` in :mod:`circuitgraph.queries.dispatch` (``QUERY_RUNNERS``), which fails on import
    when a kind has no runner or a runner no kind.
    """

    on: GraphChoice = Field(
        "full", description="Run on the full (unpruned) graph or the pruned one; with prune: none both are the "
        "same graph. Results on the full graph say that their node ids refer to the unpruned graph."
    )


class CheckItem(KindItem):
    """An item of ``validate``: its kind key, and ``on`` (which graph it runs on).

    Each kind is one line in :mod:`circuitgraph.spec.validation`, ``AblateCheck = check_item("ablate",
    Ablate)``, listed in the spec's ``CHECK_TYPES``: its union and its schema are built from it; the
    function that runs a kind, ``function(call, params) -> result`` (``call``:
    :class:`circuitgraph.validation.dispatch.CheckCall`), registers itself under the item's ``key``
    in :mod:`circuitgraph.validation.dispatch` (``CHECK_FUNCTIONS``).
    """

    on: GraphChoice = Field(
        "pruned", description="Run on the pruned graph (the circuit) or the full one; with prune: none both are "
        "the same graph."
    )


_Item = TypeVar("_Item", bound=KindItem)


def _kind_item(base: type[_Item], suffix: str, key: str, params: type[StrictModel], doc: str | None,
               module: str) -> type[_Item]:
    """The item class ``<Params><suffix>`` of one kind: ``base`` with the field ``key: Params[params]``,
    which defaults to ``params()`` when every parameter has a default (``ScoresQuery()`` in Python; a
    spec file names the key anyway, it is what tells the kinds apart, and ``null`` there means ``{}``)."""
    if not key.isidentifier():
        raise ValueError(f"a {suffix.lower()} kind is a Python identifier, got {key!r}")
    takes_defaults = not any(field.is_required() for field in params.model_fields.values())
    fields: dict[str, Any] = {key: (Params[params], Field(default_factory=params) if takes_defaults else ...)}
    item = create_model(f"{params.__name__}{suffix}", __base__=base, __module__=module, __doc__=doc, **fields)
    item.key = key
    item.params_model = params
    return item


def _caller_module() -> str:
    """The module of the caller's caller (where the item class is defined and named)."""
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    return caller.f_globals["__name__"] if caller is not None else __name__


def query_item(key: str, params: type[StrictModel], doc: str | None = None) -> type[QueryItem]:
    """The :class:`QueryItem` class of the query kind ``key`` (``{key: params}``), named
    ``<params>Query`` and placed in the calling module; ``doc``: the class's docstring (in the schema)."""
    return _kind_item(QueryItem, "Query", key, params, doc, _caller_module())


def check_item(key: str, params: type[StrictModel], doc: str | None = None) -> type[CheckItem]:
    """The :class:`CheckItem` class of the check kind ``key`` (``{key: params}``), named
    ``<params>Check`` and placed in the calling module; ``doc``: the class's docstring (in the schema)."""
    return _kind_item(CheckItem, "Check", key, params, doc, _caller_module())


def _tag_name(name: str) -> str:
    return f"<{name}>"


def tagged(tp: Any, name: str) -> Any:
    """``Annotated[tp, Tag("<name>")]``: one variant of a tagged union."""
    return Annotated[tp, Tag(_tag_name(name))]


def _discriminator(
    what: str,
    expected: str,
    *,
    keys: dict[str, str] | None = None,
    by_type: dict[type, str] | None = None,
    models: dict[type, str] | None = None,
    hint: str = "",
) -> Discriminator:
    keys = keys or {}
    by_type = by_type or {}
    models = models or {}

    def pick(value: Any) -> str | None:
        if isinstance(value, BaseModel):
            name = models.get(type(value))
            return _tag_name(name) if name else None
        if isinstance(value, dict) and keys:
            present = [k for k in keys if k in value]
            if len(present) == 1:
                return _tag_name(keys[present[0]])
            if present or dict not in by_type:
                return None
        for typ, name in by_type.items():
            if isinstance(value, typ) and not (isinstance(value, bool) and typ is int):
                return _tag_name(name)
        return None

    info = (expected, tuple(keys), hint)
    if VARIANTS.setdefault(what, info) != info:
        raise ValueError(f"two different unions are both called {what!r}")
    # the context travels in VARIANTS: a dict in the Discriminator would make the
    # annotated type unhashable (and so unusable in ``X | None``)
    return Discriminator(pick, custom_error_type=f"{VARIANT_ERROR}:{what}", custom_error_message=f"expected {expected}")


def keyed_union(what: str, *variants: type[KeyedModel], list_item: bool = False) -> Any:
    """A union of :class:`KeyedModel` classes told apart by which of their keys is present.

    ``list_item``: the union is the item type of a list (``targets``, ``queries``...), so
    an item with two kind keys can be fixed by splitting it in two.
    """
    names = ", ".join(v.key for v in variants)
    members = tuple(tagged(v, v.key) for v in variants)
    disc = _discriminator(
        what,
        f"a mapping with exactly one of the keys {names}",
        keys={v.key: v.key for v in variants},
        models={v: v.key for v in variants},
        hint=" (write each as its own list item)" if list_item else "",
    )
    return Annotated[Union[members], disc]  # noqa: UP007 -- a Union over a runtime tuple of members has no | spelling


def shaped_union(
    what: str,
    expected: str,
    variants: dict[str, Any],
    *,
    keys: dict[str, str] | None = None,
    by_type: dict[type, str] | None = None,
) -> Any:
    """A union told apart by the shape of the value (``str`` vs ``dict``) or by its keys.

    ``variants`` maps tag names to types; ``keys`` maps a key of a mapping input to a
    tag name; ``by_type`` maps a Python type of the input to a tag name.
    """
    models = {}
    for name, tp in variants.items():
        inner = get_args(tp)[0] if get_origin(tp) is Annotated else tp
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            models[inner] = name
    members = tuple(tagged(tp, name) for name, tp in variants.items())
    disc = _discriminator(what, expected, keys=keys, by_type=by_type, models=models)
    return Annotated[Union[members], disc]  # noqa: UP007 -- a Union over a runtime tuple of members has no | spelling


class Params:
    """``Params[M]``: a parameter block that may be written as ``null`` (meaning ``{}``)."""

    def __class_getitem__(cls, model: type[BaseModel]) -> Any:
        return Annotated[
            model,
            BeforeValidator(lambda v: {} if v is None else v, json_schema_input_type=model | None),
        ]


# --- scalars -------------------------------------------------------------------------

Int = Annotated[int, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
#: a share or threshold in (0, 1]
Fraction = Annotated[float, Strict(), Field(gt=0, le=1)]
Bool = Annotated[bool, Strict()]
Name = Annotated[str, Strict(), Field(min_length=1)]


def _check_layer_key(value: Any) -> Any:
    # pydantic's lax int would take True as layer 1 and 1.0 as layer 1: types are not guessed
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError(
            RULE_ERROR, "mapping keys here are layer numbers (integers >= 0), got {got}", {"got": _short(value)}
        )
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise PydanticCustomError(
            RULE_ERROR, "mapping keys here are layer numbers (integers >= 0), got {got}", {"got": _short(value)}
        )
    return value


#: a layer number used as a mapping key: an int (YAML) or a string of digits (JSON); never a bool
LayerKey = Annotated[int, Field(ge=0), BeforeValidator(_check_layer_key)]


def _check_token(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise PydanticCustomError(
            RULE_ERROR,
            "expected a token: a string such as ' an' or an integer token id, got {got}"
            + (" (YAML reads yes/no/true/false/on/off as booleans: quote the token)" if isinstance(value, bool) else ""),
            {"got": _short(value)},
        )
    if isinstance(value, str) and value == "":
        raise PydanticCustomError(RULE_ERROR, "empty token ''; give a non-empty string or an integer token id", {})
    if isinstance(value, int) and value < 0:
        raise PydanticCustomError(RULE_ERROR, "token id must be >= 0, got {got}", {"got": value})
    return value


#: a token: a string that must encode to one token, or an integer token id
Token = Annotated[
    Annotated[str, Field(min_length=1)] | Annotated[int, Field(ge=0)],
    BeforeValidator(_check_token),
]


def _check_token_pair(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) != 2:
        raise PydanticCustomError(
            RULE_ERROR,
            "expected two tokens [a, b] (the logit of a minus the logit of b), got {n}: {got}",
            {"n": len(value), "got": _short(list(value))},
        )
    return value


#: exactly two tokens ``[a, b]``
TokenPair = Annotated[tuple[Token, Token], BeforeValidator(_check_token_pair)]


def _check_node_id(value: str) -> str:
    parts = value.split("/")
    if len(parts) != 4:
        reason = f"node id {value!r} is not of the form kind/layer/position/index"
    elif parts[0] not in NODE_KINDS:
        reason = f"node id {value!r}: unknown node kind {parts[0]!r}; expected one of {', '.join(NODE_KINDS)}"
    else:
        try:
            return "/".join([parts[0], *(str(int(p)) for p in parts[1:])])
        except ValueError:
            reason = f"node id {value!r}: layer, position and index must be integers"
    raise PydanticCustomError(RULE_ERROR, "{reason} (e.g. 'feature/1/4/17')", {"reason": reason})


#: a node id string ``kind/layer/position/index`` (see :class:`circuitgraph.graph.nodes.NodeId`)
NodeIdStr = Annotated[str, Strict(), AfterValidator(_check_node_id)]


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    text = str(value)
    if "\x00" in text:
        raise PydanticCustomError(RULE_ERROR, "a path cannot contain a NUL character, got {got}", {"got": _short(text)})
    try:
        value = value.expanduser()
    except RuntimeError:
        raise PydanticCustomError(
            RULE_ERROR,
            "cannot expand {got}: no such user or home folder; write the path in full",
            {"got": _short(text)},
        ) from None
    base = (info.context or {}).get("base_dir")
    if base is not None and not value.is_absolute():
        value = Path(base) / value
    return value


#: a path read by the run; relative paths in a spec file are relative to the file's folder
InputPath = Annotated[Path, AfterValidator(_resolve_path)]
#: a path written by the run; resolved like :data:`InputPath`
OutputPath = Annotated[Path, AfterValidator(_resolve_path)]
