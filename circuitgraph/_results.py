"""What every result object shares: rows for tables and data frames, and its notebook display.

A result (a query's, a validation check's) has ``to_dict()`` (JSON).  :class:`Tabular` gives
it, from that document:

* ``records()``: one dict per row, for ``pandas.DataFrame.from_records`` (the longest list of
  records in the document, nested dicts flattened one level as ``outer.inner``, each row also
  carrying the result's scalar fields); one row of the scalar fields when there is no list;
* ``to_dataframe()``: those rows as a ``pandas.DataFrame`` (pandas is the ``notebook`` extra);
* ``_repr_html_()``: the summary once, then the rows as a table (:func:`circuitgraph.display.result_html`).

:func:`~circuitgraph.display.summary_of` and :func:`~circuitgraph.display.rows_of` split a document
into the part said once and the rows.
"""

from __future__ import annotations

from typing import Any

from circuitgraph.display import record_lists, result_html, rows_of, summary_of
from circuitgraph.errors import CircuitGraphError

__all__ = ["Tabular", "records_of", "summary_of", "rows_of"]


def records_of(data: Any) -> list[dict[str, Any]]:
    """Rows of a ``to_dict()`` document (see :meth:`Tabular.records`)."""
    if isinstance(data, list):
        return rows_of(data)
    if not isinstance(data, dict):
        return [{"value": data}]
    scalars = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
    if not record_lists(data):
        nested = {k: v for k, v in data.items() if isinstance(v, dict)}
        row = dict(scalars)
        for k, v in nested.items():
            row.update({f"{k}.{ik}": iv for ik, iv in v.items() if not isinstance(iv, (list, dict))})
        return [row]
    return [{**{k: v for k, v in scalars.items() if k not in r}, **r} for r in rows_of(data)]


class Tabular:
    """Mixin of every result object: ``records()``, ``to_dataframe()`` and ``_repr_html_()`` from
    its ``to_dict()`` (see the module docstring)."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - every result defines it
        raise NotImplementedError

    def records(self) -> list[dict[str, Any]]:
        """The result as rows (one dict per row, JSON values): the longest list of records in
        :meth:`to_dict` (nested dicts flattened one level as ``outer.inner``), each row also
        carrying the result's scalar fields; a single row of the scalar fields when the
        result has no list of records."""
        return records_of(self.to_dict())

    def to_dataframe(self) -> Any:
        """The rows of :meth:`records` as a ``pandas.DataFrame`` (needs pandas:
        ``pip install 'circuitgraph[notebook]'``)."""
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas is an optional extra
            raise CircuitGraphError(
                "to_dataframe() needs pandas; install it with `pip install 'circuitgraph[notebook]'`") from None
        return pd.DataFrame.from_records(self.records())

    def __repr__(self) -> str:
        n = len(self.records())
        return f"<{type(self).__name__} {getattr(self, 'kind', '') or ''}: {n} row{'s' if n != 1 else ''}>".replace(
            " :", ":")

    def _repr_html_(self) -> str:
        return result_html(getattr(self, "kind", "") or type(self).__name__, self)
