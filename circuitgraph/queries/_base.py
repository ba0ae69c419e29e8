"""What every query result shares: ``kind``, ``to_dict()``, ``table()``; argument checks.

Results are frozen dataclasses.  ``to_dict()`` is JSON-serialisable (node ids as strings,
floats as Python floats); ``table(max_rows)`` is a short plain-text table for the CLI.
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from circuitgraph._io import atomic_write_text
from circuitgraph._results import Tabular, records_of
from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.text_tables import cell, format_table

if TYPE_CHECKING:
    from circuitgraph.attribution.context import AttributionContext

__all__ = ["QueryResult", "format_table", "check_k", "check_fraction", "require_context", "fmt", "records_of"]


class QueryResult(Tabular):
    """Base of every query result (each subclass is a frozen dataclass).

    ``kind`` names the query (the spec key, e.g. ``"top_paths"``).
    """

    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:  # every subclass overrides it
        raise NotImplementedError

    def table(self, max_rows: int = 10) -> str:  # every subclass overrides it
        raise NotImplementedError

    def __str__(self) -> str:
        return self.table()

    # records(), to_dataframe() and _repr_html_() come from Tabular (circuitgraph._results)

    def to_json(self, path: Any = None) -> str:
        """:meth:`to_dict` as JSON.  With ``path``: write the file (atomically) and return the
        path; without: return the JSON text."""
        text = json.dumps(self.to_dict(), indent=2, default=str) + "\n"
        if path is None:
            return text
        atomic_write_text(path, text)
        return os.fspath(path)

    def __repr__(self) -> str:
        n = len(self.records())
        return f"<{type(self).__name__} {self.kind or 'query'}: {n} row{'s' if n != 1 else ''}>"


def fmt(value: Any) -> str:
    """A compact cell: 4 significant digits for floats, ``-`` for None (:func:`circuitgraph.text_tables.cell`)."""
    return cell(value)


def check_k(k: Any, name: str = "k") -> int:
    """``k`` must be a positive integer (booleans are not integers here)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise QueryError(f"{name} must be a positive integer, got {k!r}")
    return int(k)


def check_optional_k(k: Any, name: str) -> int | None:
    return None if k is None else check_k(k, name)


def check_fraction(x: Any, name: str) -> float:
    """A share or threshold must lie in (0, 1]."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) or not (0.0 < float(x) <= 1.0):
        raise QueryError(f"{name} must be in (0, 1], got {x!r}")
    return float(x)


def require_context(graph: AttributionGraph, what: str) -> AttributionContext:
    """The live attribution context of ``graph``, or a :class:`QueryError` saying why it is needed."""
    if graph.context is None:
        raise QueryError(f"{what} needs the live model: run the spec, not a loaded JSON")
    return graph.context


def share(value: float, whole: float | None) -> float | None:
    """``value / whole``, or None when ``whole`` is missing or zero."""
    if whole is None or whole == 0.0 or not math.isfinite(whole):
        return None
    return float(value) / float(whole)


