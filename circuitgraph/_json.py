"""The one JSON encoder: :func:`jsonable` turns results, metadata and records into plain JSON
values, with one policy for the numbers JSON cannot hold.

* ``None``, booleans and strings stay as they are; integers (numpy's too) stay integers;
* finite floats stay floats.  **NaN and the infinities never reach a file** (JSON has no NaN:
  a reader must not get an invalid document): in results and run records they become null
  (an undefined value, e.g. a ratio of zeros); in a graph file (``where`` given) they are an
  error naming the field, since a graph's numbers are measured and must be finite;
* numpy arrays and tensors become (nested) lists, numpy scalars Python numbers;
* node ids and paths become strings; mappings become objects, sequences and sets lists;
* objects with ``to_dict()``, dataclasses and pydantic models become their dicts.

With ``where`` (the graph files), a value JSON cannot hold, a non-finite number or a mapping
key that is not a string is an :class:`~circuitgraph.errors.ExportError` naming the field;
without it, such a value is written as ``str(value)`` (results and run records).

>>> jsonable({"a": float("nan"), "b": (1, 2.5)})
{'a': None, 'b': [1, 2.5]}
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from circuitgraph.errors import ExportError
from circuitgraph.graph.nodes import NodeId

__all__ = ["jsonable"]


def jsonable(value: Any, where: str | None = None) -> Any:
    """``value`` as plain JSON types (see the module docstring)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isfinite(v):
            return v
        if where is not None:
            raise ExportError(f"{where} is {v}; JSON holds finite numbers only: store it as null or a string")
        return None
    if isinstance(value, NodeId):
        return str(value)
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), where)
    if isinstance(value, np.generic):
        return jsonable(value.item(), where)
    if hasattr(value, "detach") and hasattr(value, "tolist"):  # a tensor (no torch import here)
        return jsonable(value.detach().cpu().tolist(), where)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                if where is not None:
                    raise ExportError(f"{where} has the key {key!r} ({type(key).__name__}); JSON object keys are strings")
                key = str(key)
            out[key] = jsonable(item, None if where is None else f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item, None if where is None else f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return jsonable(value.to_dict(), where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name), None if where is None else f"{where}.{f.name}")
                for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"), where)
    if where is not None:
        raise ExportError(
            f"{where} is a {type(value).__name__}, which JSON cannot hold; store it as a string, number, list or dict"
        )
    return str(value)
