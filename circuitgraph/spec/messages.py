"""Turn pydantic's validation errors into located, readable spec messages.

Each error becomes ``(location, message)`` with the location written as in the spec
(``targets[1].logit_diff``, ``graph.mlp[3]``) and a message that states the rule, the
value received and, where there is one, the fix::

    targets[1].logit_diff: expected two tokens [a, b] (...), got 1: [' an']
    graph.foo: unknown key 'foo'; allowed keys: mlp, attention, ...

Union tags (``<logit>``) and the ``[key]`` marker pydantic adds to mapping-key errors
are dropped from locations.  Where the spec wrote a shorthand (``prompt: "text"``,
``top_logits: 5``, ``kind: feature``) and the error is inside its expanded form, the
location stops at the shorthand.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, Tag, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from circuitgraph.spec.error_codes import RULE_ERROR, VARIANT_ERROR, VARIANTS, _short

__all__ = ["format_validation_error", "format_location"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def format_location(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("targets", 1, "logit_diff")`` -> ``"targets[1].logit_diff"``."""
    out = ""
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            out += f"[{part}]"
        elif isinstance(part, str) and _IDENT.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and len(part) > 2 and part[0] == "<" and part[-1] == ">"


def _walk_raw(raw: Any, loc: list[Any]) -> list[Any]:
    """The part of ``loc`` that reaches into ``raw``: stop where ``raw`` holds a scalar."""
    kept: list[Any] = []
    node = raw
    for part in loc:
        if isinstance(node, dict):
            kept.append(part)
            if part in node:
                node = node[part]
            elif str(part) in node:
                node = node[str(part)]
            elif isinstance(part, str) and part.isdigit() and int(part) in node:
                node = node[int(part)]
            else:
                node = None
                kept.extend(loc[len(kept) :])
                return kept
        elif isinstance(node, (list, tuple)) and isinstance(part, int):
            kept.append(part)
            node = node[part] if -len(node) <= part < len(node) else None
        elif isinstance(node, BaseModel) and isinstance(part, str):
            kept.append(part)
            node = getattr(node, part, None)
        elif node is None and kept:
            kept.extend(loc[len(kept) :])
            return kept
        else:
            return kept
    return kept


# --- finding the model at a location (for the "allowed keys" of unknown-key errors) ---


def _members(tp: Any) -> list[tuple[Any, str | None]]:
    """Flatten ``Annotated``/``Union`` into ``(type, tag)`` pairs."""
    if get_origin(tp) is typing.Annotated:
        inner, *meta = get_args(tp)
        tags = [m.tag for m in meta if isinstance(m, Tag)]
        members = _members(inner)
        if tags:
            return [(t, tags[0]) for t, _ in members]
        return members
    if get_origin(tp) in (Union, types.UnionType):
        out: list[tuple[Any, str | None]] = []
        for arg in get_args(tp):
            out.extend(_members(arg))
        return out
    return [(tp, None)]


def _field_of(model: type[BaseModel], name: str) -> FieldInfo | None:
    for fname, info in model.model_fields.items():
        if name in (fname, info.alias):
            return info
    return None


def _step(tp: Any, part: Any) -> list[Any]:
    out: list[Any] = []
    for member, tag in _members(tp):
        if _is_tag(part):
            if tag == part:
                out.append(member)
            continue
        origin = get_origin(member)
        if isinstance(member, type) and issubclass(member, BaseModel) and isinstance(part, str):
            info = _field_of(member, part)
            if info is not None:
                out.append(info.annotation)
        elif origin in (list, tuple) and isinstance(part, int):
            args = [a for a in get_args(member) if a is not Ellipsis]
            if args:
                out.append(args[part] if len(args) > 1 and part < len(args) else args[0])
        elif origin is dict:
            out.append(get_args(member)[1])
    return out


def _models_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[type[BaseModel]]:
    current: list[Any] = [root]
    for part in loc:
        nxt: list[Any] = []
        for tp in current:
            nxt.extend(_step(tp, part))
        current = nxt
    models: list[type[BaseModel]] = []
    for tp in current:
        for member, _ in _members(tp):
            if isinstance(member, type) and issubclass(member, BaseModel) and member not in models:
                models.append(member)
    return models


def _allowed_keys(models: list[type[BaseModel]]) -> list[str]:
    keys: list[str] = []
    for model in models:
        for name, info in model.model_fields.items():
            key = info.alias or name
            if key not in keys:
                keys.append(key)
    return keys


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --- messages ---------------------------------------------------------------------------

_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path (a string)",
}
_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def _variant_message(err: ErrorDetails) -> str:
    what = err["type"].split(":", 1)[1]
    expected, keys, hint = VARIANTS[what]
    value = err.get("input")
    if keys and isinstance(value, dict):
        present = [k for k in keys if k in value]
        names = ", ".join(keys)
        if len(present) > 1:
            return f"a {what} has exactly one of the keys {names}; got {' and '.join(present)}{hint}"
        if not present:
            got = ", ".join(map(str, value)) if value else "an empty mapping"
            hint = _did_you_mean(next(iter(value)), list(keys)) if value else ""
            return f"a {what} needs exactly one of the keys {names}; got {got}{hint}"
    return f"expected {expected}, got {_short(value)}"


def _message(err: ErrorDetails, key_error: bool, allowed: list[str]) -> str:
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    got = _short(value)
    if kind == RULE_ERROR:
        return str(ctx.get("text", err["msg"]))
    if kind.startswith(VARIANT_ERROR + ":"):
        return _variant_message(err)
    if key_error:
        return f"mapping keys here are layer numbers (integers >= 0), got {got}"
    if kind == "missing":
        return f"missing required key '{err['loc'][-1]}'"
    if kind == "extra_forbidden":
        key = err["loc"][-1]
        return f"unknown key '{key}'; allowed keys: {', '.join(allowed)}{_did_you_mean(str(key), allowed)}"
    if kind == "literal_error":
        hint = _did_you_mean(value, re.findall(r"'([^']*)'", ctx.get("expected", ""))) if isinstance(value, str) else ""
        return f"expected {ctx.get('expected')}, got {got}{hint}"
    if kind in _TYPE_NAMES:
        hint = ""
        if kind == "float_type" and isinstance(value, str):
            hint = " (quote-free numbers only; write 0.001 or 1.0e-3)"
        return f"expected {_TYPE_NAMES[kind]}, got {got}{hint}"
    if kind in _BOUNDS:
        name, op = _BOUNDS[kind]
        return f"must be {op} {ctx.get(name)}, got {got}"
    if kind == "finite_number":
        return f"must be a finite number, got {got}"
    if kind == "too_short":
        if value in ("", None) or isinstance(value, str):
            return f"must not be empty, got {got}"
        return f"expected at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "string_too_short":
        return f"must not be empty, got {got}"
    if kind == "too_long":
        return f"expected at most {ctx.get('max_length')} item(s), got {ctx.get('actual_length')}"
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return f"{msg[:1].lower()}{msg[1:]}, got {got}"


def _spurious(err: ErrorDetails) -> bool:
    """pydantic checks a tuple's length after dropping bad items: a list of 2 bad items
    is also "too short".  The items' own errors say what is wrong."""
    value = err.get("input")
    min_length = (err.get("ctx") or {}).get("min_length")
    return (
        err["type"] == "too_short"
        and isinstance(value, (list, tuple))
        and isinstance(min_length, int)
        and len(value) >= min_length
    )


def format_validation_error(exc: ValidationError, root: type[BaseModel], raw: Any) -> list[tuple[str, str]]:
    """Every error of ``exc`` as ``(location, message)``, in the order pydantic found them.

    ``root`` is the model that was validated and ``raw`` the input it was given (used to
    stop locations at shorthands and to list the allowed keys of unknown-key errors).
    """
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        if _spurious(err):
            continue
        loc = tuple(err["loc"])
        key_error = bool(loc) and loc[-1] == "[key]"
        clean = [p for p in loc if not _is_tag(p) and p != "[key]"]
        allowed: list[str] = []
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(_models_at(root, loc[:-1]))
        else:
            clean = _walk_raw(raw, clean)
        problems = (err.get("ctx") or {}).get("problems") if err["type"] == RULE_ERROR else None
        if problems:
            for field, message in problems:
                where = format_location(clean)
                if field:
                    where = f"{where}{'' if field.startswith('[') or not where else '.'}{field}"
                out.append((where, message))
            continue
        out.append((format_location(clean), _message(err, key_error, allowed)))
    return out
