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
from typing import Any

from pydantic import ValidationError

from circuitgraph.errors import SpecError
from circuitgraph.spec.messages import format_validation_error
from circuitgraph.spec.root import Spec

__all__ = ["load_spec", "read_spec_file", "check_inputs", "SPEC_SUFFIXES"]

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def load_spec(source: "str | os.PathLike[str] | Mapping[str, Any] | Spec", *, base_dir: "str | os.PathLike[str] | None" = None) -> Spec:
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


def _validate(data: dict[str, Any], base_dir: "str | os.PathLike[str] | None") -> Spec:
    context = {"base_dir": Path(base_dir)} if base_dir is not None else None
    try:
        return Spec.model_validate(data, context=context)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, Spec, data)) from None


def read_spec_file(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """The raw mapping in a spec file (not validated)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SPEC_SUFFIXES:
        raise SpecError([(str(path), f"unsupported spec file type {suffix or '(none)'!r}; use .yaml, .yml or .json")])
    try:
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
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that rejects duplicate keys, reads ``1e-3`` as a float and a plain ``on``
        mapping key as the string ``"on"`` (the spec key), not as the boolean true."""

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> dict[Any, Any]:
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=deep)
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


def _parse_yaml(text: str, path: Path) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = ": ".join(x for x in (exc.context, exc.problem) if x)
        raise SpecError([(where, f"malformed YAML: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([(str(path), f"malformed YAML: {exc}")]) from None
    except SpecError as exc:
        raise SpecError([(f"{path}: {loc}", msg) for loc, msg in exc.errors]) from None


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


# --- input files ------------------------------------------------------------------------


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
        problems.append(("transcoders.path", f"transcoder folder not found: {tc.path}"))
    for i, target in enumerate(spec.targets):
        if target.kind == "direction" and target.params.file is not None and not target.params.file.is_file():
            problems.append((f"targets[{i}].direction.file", f"direction file not found: {target.params.file}"))
    if spec.dataset is not None:
        from circuitgraph.spec.dataset import parse_rows, read_dataset_rows

        if isinstance(spec.dataset, tuple):
            raw, read_problems = list(spec.dataset), []
        else:
            raw, read_problems = read_dataset_rows(Path(spec.dataset))
        problems += [(f"dataset: {loc}" if loc != "dataset" else loc, msg) for loc, msg in read_problems]
        if raw:
            problems += [(f"dataset: {loc}", msg) for loc, msg in parse_rows(raw)[1]]
    return problems
