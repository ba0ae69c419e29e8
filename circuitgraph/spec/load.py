"""Load a spec from a YAML or JSON file, a mapping, or a :class:`Spec`.

Every problem is reported at once as a :class:`~circuitgraph.errors.SpecError`:
malformed YAML/JSON (with line and column), duplicate keys, unknown keys, bad values.

Relative paths in a spec *file* (``model.path``, ``export.svg``...) are relative to the
folder of that file, so a spec runs the same from any working directory.  Relative
paths in a mapping are relative to ``base_dir`` if given, else to the working directory.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import ValidationError

from circuitgraph.errors import SpecError
from circuitgraph.spec.base import _short
from circuitgraph.spec.dataset import parse_rows, read_dataset_rows
from circuitgraph.spec.messages import format_location, format_validation_error
from circuitgraph.spec.root import Spec

__all__ = ["load_spec", "read_spec_file", "check_inputs", "trained_dictionary_hint", "check_plain_data", "SPEC_SUFFIXES", "SpecSource"]

#: what the entry points take as a spec: a file path, a mapping, or a validated :class:`Spec`
SpecSource = Union[str, "os.PathLike[str]", Mapping[str, Any], Spec]

SPEC_SUFFIXES = (".yaml", ".yml", ".json")
#: a spec file larger than this is refused before it is parsed
MAX_SPEC_BYTES = 16 << 20
#: the deepest nesting of lists and mappings a spec may have
MAX_DEPTH = 64
#: the most values (scalars, lists, mappings) a spec may hold once YAML aliases are expanded
MAX_VALUES = 1_000_000


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any] | Spec, *, base_dir: str | os.PathLike[str] | None = None) -> Spec:
    """Return the :class:`Spec` described by ``source``.

    ``source`` is a path to a ``.yaml``/``.yml``/``.json`` file, a mapping with the
    spec's keys, or a :class:`Spec` (returned as is).

    >>> spec = load_spec({"format_version": 1, "model": {"builtin": "demo"}, "prompt": "The cat"})
    >>> spec.model.source, spec.targets[0].kind
    ('builtin', 'top_logits')
    """
    if isinstance(source, Spec):
        return source
    if isinstance(source, Mapping):
        return _validate(dict(source), base_dir)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        data = read_spec_file(path)
        return _validate(data, path.resolve().parent if base_dir is None else base_dir)
    raise SpecError(f"expected a spec file path, a mapping or a Spec, got {type(source).__name__}")


def _validate(data: dict[str, Any], base_dir: str | os.PathLike[str] | None) -> Spec:
    check_plain_data(data)
    context = {"base_dir": Path(base_dir)} if base_dir is not None else None
    try:
        spec = Spec.model_validate(data, context=context)
        spec._base_dir = Path(os.path.abspath(base_dir)) if base_dir is not None else None
        return spec
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, Spec, data)) from None
    except RecursionError:
        raise SpecError(f"the spec is nested too deeply; at most {MAX_DEPTH} levels of lists and mappings") from None


def check_plain_data(data: Any) -> None:
    """Bound the work any spec can cause, before pydantic sees it.

    Refuses nesting deeper than :data:`MAX_DEPTH`, more than :data:`MAX_VALUES` values,
    self-containing (recursive) values, mapping keys that are not strings or integers, and
    strings that are not valid Unicode text (lone surrogates such as ``\\udc80``, which no
    tokenizer or file system accepts).  The walk is iterative and stops at the first problem.
    """
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(data, (), 0)]
    seen = 0
    while stack:
        value, loc, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise SpecError(f"the spec holds more than {MAX_VALUES:,} values (after YAML aliases are expanded); "
                            "a spec is a small file: remove repeated or aliased data")
        if depth > MAX_DEPTH:
            raise SpecError([(format_location(loc[:8]) + "...", f"nested more than {MAX_DEPTH} levels deep; "
                              "a spec's lists and mappings are a few levels deep")])
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise SpecError([(format_location(loc), f"{_short(value)} holds {value[exc.start]!r} at character "
                                  f"{exc.start}, a lone surrogate that is not text; remove it")]) from None
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise SpecError([(format_location(loc), f"mapping key {_short(key)} is a "
                                      f"{type(key).__name__}; keys are names (strings) or layer numbers")])
                if isinstance(key, str):
                    stack.append((key, (*loc, key), depth + 1))
                stack.append((item, (*loc, key), depth + 1))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                stack.append((item, (*loc, i), depth + 1))


def read_spec_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw mapping in a spec file (not validated)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SPEC_SUFFIXES:
        raise SpecError([(str(path), f"unsupported spec file type {suffix or '(none)'!r}; use .yaml, .yml or .json")])
    try:
        if path.is_file() and path.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError([(str(path), f"the spec file is {path.stat().st_size:,} bytes; a spec is at most "
                              f"{MAX_SPEC_BYTES:,} bytes")])
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([(str(path), "spec file not found")]) from None
    except IsADirectoryError:
        raise SpecError([(str(path), "is a folder, not a spec file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([(str(path), f"cannot read the spec file: {exc}")]) from None
    data = _parse_json(text, path) if suffix == ".json" else _parse_yaml(text, path)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SpecError([(str(path), f"a spec is a mapping of keys (format_version, model, prompt...), got {got}")])
    return data


# --- YAML -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _yaml_loader() -> type:
    class Loader(yaml.SafeLoader):
        """SafeLoader that rejects duplicate keys, reads ``1e-3`` as a float and a plain ``on``
        mapping key as the string ``"on"`` (the spec key), not as the boolean true."""

        _circuitgraph_depth = 0  # nesting depth of the node being composed (see compose_node)

        def get_single_node(self) -> Any:
            node = yaml.SafeLoader.get_single_node(self)
            if node is not None:
                _check_yaml_size(node)
            return node

        def compose_node(self, parent: Any, index: Any) -> Any:
            # stop at the first node too deep, before the rest of the file is even scanned
            depth = getattr(self, "_circuitgraph_depth", 0)
            if depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise SpecError([(f"line {mark.line + 1}, column {mark.column + 1}",
                                  f"nested more than {MAX_DEPTH} levels deep; a spec's lists and mappings are a few "
                                  "levels deep")])
            self._circuitgraph_depth = depth + 1
            try:
                return yaml.SafeLoader.compose_node(self, parent, index)
            finally:
                self._circuitgraph_depth = depth

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> dict[Any, Any]:
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                mark = key_node.start_mark
                raise SpecError(
                    [(f"line {mark.line + 1}, column {mark.column + 1}",
                      f"a mapping key cannot be a {type(key).__name__}; keys are names or layer numbers")]
                ) from None
            if key is True and key_node.style is None and key_node.value in ("on", "On", "ON"):
                key = "on"  # the spec key `on` (YAML 1.1 would read a plain on as true)
            if key in out:
                mark = key_node.start_mark
                raise SpecError(
                    [(f"line {mark.line + 1}, column {mark.column + 1}", f"duplicate key {key!r}; give each key once")]
                )
            out[key] = loader.construct_object(value_node, deep=deep)
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    # YAML 1.1 wants a dot in floats (1.0e-3); accept 1e-3 as YAML 1.2 does
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
            |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
            |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        list("-+0123456789."),
    )
    return Loader


def _check_yaml_size(root: Any) -> None:
    """Refuse a YAML document whose aliases expand to more than :data:`MAX_VALUES` values,
    or that nests deeper than :data:`MAX_DEPTH` (before anything is constructed).

    An alias is a reference to an earlier node, so nine lines of ``[*a, *a, ...]`` describe
    billions of values (the "billion laughs"); the expanded size is counted on the node graph
    with one pass per distinct node, so the check itself is cheap.
    """
    size: dict[int, int] = {}
    order: list[tuple[Any, int, bool]] = [(root, 0, False)]
    active: set[int] = set()
    while order:
        node, depth, done = order.pop()
        key = id(node)
        if done:
            active.discard(key)
            children = _yaml_children(node)
            size[key] = min(1 + sum(size[id(c)] for c in children), MAX_VALUES + 1)
            continue
        if key in size:
            continue
        if key in active:
            mark = node.start_mark
            raise SpecError([(f"line {mark.line + 1}, column {mark.column + 1}",
                              "this value contains itself (a recursive YAML alias); remove the alias")])
        if depth > MAX_DEPTH:
            mark = node.start_mark
            raise SpecError([(f"line {mark.line + 1}, column {mark.column + 1}",
                              f"nested more than {MAX_DEPTH} levels deep; a spec's lists and mappings are a few "
                              "levels deep")])
        active.add(key)
        order.append((node, depth, True))
        for child in _yaml_children(node):
            if id(child) not in size:
                order.append((child, depth + 1, False))
    if size[id(root)] > MAX_VALUES:
        raise SpecError(f"the spec expands to more than {MAX_VALUES:,} values through YAML aliases (&name / *name); "
                        "a spec is a small file: write the values out or remove the aliases")


def _yaml_children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = ": ".join(x for x in (exc.context, exc.problem) if x)
        raise SpecError([(where, f"malformed YAML: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([(str(path), f"malformed YAML: {exc}")]) from None
    except RecursionError:
        raise SpecError([(str(path), f"nested too deeply; at most {MAX_DEPTH} levels of lists and mappings")]) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise SpecError([(str(path), f"unreadable value: {' '.join(str(exc).split())[:200]}")]) from None
    except SpecError as exc:
        raise SpecError([(f"{path}: {loc}" if loc else str(path), msg) for loc, msg in exc.errors]) from None


# --- JSON -------------------------------------------------------------------------------


def _parse_json(text: str, path: Path) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise SpecError([(str(path), f"duplicate key {key!r}; give each key once")])
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise SpecError([(f"{path}:{exc.lineno}:{exc.colno}", f"malformed JSON: {exc.msg}")]) from None
    except RecursionError:
        raise SpecError([(str(path), f"nested too deeply; at most {MAX_DEPTH} levels of lists and mappings")]) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise SpecError([(str(path), f"unreadable value: {' '.join(str(exc).split())[:200]}")]) from None


# --- input files ------------------------------------------------------------------------


def trained_dictionary_hint(path: Path) -> str:
    """What to do when a missing dictionary folder is one ``circuitgraph train`` writes
    (``train.output/dictionaries``): train it first."""
    if path.name != "dictionaries":
        return ""
    return (f" (`circuitgraph train` writes its dictionaries to OUTPUT/dictionaries: run the training spec whose "
            f"train.output is {path.parent} first, e.g. `circuitgraph train examples/real/train.yaml` for the "
            f"feature-level specs of examples/real)")


def check_inputs(spec: Spec) -> list[tuple[str, str]]:
    """Problems with the files a spec reads, found without loading anything.

    Checks that ``model.path`` holds ``config.json`` and ``model.safetensors``, that
    ``transcoders.path`` is a folder, that direction files exist, and that the rows of a
    ``dataset:`` file are well formed (checks against the model happen when it runs).
    """
    problems: list[tuple[str, str]] = []
    model = spec.model
    if model.path is not None:
        if not model.path.is_dir():
            problems.append(("model.path", f"model folder not found: {model.path}"))
        else:
            for name in ("config.json", "model.safetensors"):
                if not (model.path / name).is_file():
                    problems.append(("model.path", f"{model.path} has no {name}"))
    tc = spec.transcoders
    if tc is not None and tc.path is not None and not tc.path.is_dir():
        problems.append(("transcoders.path", f"transcoder folder not found: {tc.path}{trained_dictionary_hint(tc.path)}"))
    for i, target in enumerate(spec.targets):
        if target.kind == "direction" and target.params.file is not None and not target.params.file.is_file():
            problems.append((f"targets[{i}].direction.file", f"direction file not found: {target.params.file}"))
    if spec.dataset is not None:
        if isinstance(spec.dataset, tuple):
            raw, read_problems = list(spec.dataset), []
        else:
            raw, read_problems = read_dataset_rows(Path(spec.dataset))
        problems += [(f"dataset: {loc}" if loc != "dataset" else loc, msg) for loc, msg in read_problems]
        if raw:
            problems += [(f"dataset: {loc}", msg) for loc, msg in parse_rows(raw)[1]]
    return problems
