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

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from circuitgraph.display import record_lists, result_html, rows_of, summary_of
from circuitgraph.errors import CircuitGraphError

if TYPE_CHECKING:
    from circuitgraph.spec.root import Spec

__all__ = ["Tabular", "ResultEntry", "EntryStatus", "RunOutcome", "records_of", "summary_of", "rows_of",
           "stored_entry", "stored_results"]

#: an entry's outcome: ``ok``, ``failed`` (the result is None) or a check's own verdict on a
#: result that ran but cannot be trusted (``uncontrolled``: controls that could not be drawn)
EntryStatus = Literal["ok", "failed", "uncontrolled"]


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
        ``pip install 'circuitgraph-lm[notebook]'``)."""
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas is an optional extra
            raise CircuitGraphError(
                "to_dataframe() needs pandas; install it with `pip install 'circuitgraph-lm[notebook]'`") from None
        return pd.DataFrame.from_records(self.records())

    def __repr__(self) -> str:
        n = len(self.records())
        return f"<{type(self).__name__} {getattr(self, 'kind', '') or ''}: {n} row{'s' if n != 1 else ''}>".replace(
            " :", ":")

    def _repr_html_(self) -> str:
        return result_html(getattr(self, "kind", "") or type(self).__name__, self)


@dataclass(eq=False)
class ResultEntry(Mapping[str, Any]):
    """One declared query, check or steering item of a run and what it gave: the one entry type
    of :class:`~circuitgraph.pipeline.runner.RunResult`'s ``queries``, ``validation`` and
    ``steering``.

    Attributes: ``kind`` (the query or check kind, ``"steer"``), ``params`` (its parameters as
    the spec gave them, JSON), ``on`` (``"full"`` or ``"pruned"``), ``status``
    (:data:`EntryStatus`), ``error`` (the one-line reason when the status is not ``ok``) and
    ``result`` (the result object; None when it failed).

    It is also a read-only mapping of those six keys (``entry["result"]``, ``entry.get("error")``,
    ``dict(entry)``, equal to the same dict), as entries were plain dicts before.
    """

    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    on: str = "full"
    status: str = "ok"
    error: str | None = None
    result: Any = None

    @property
    def ok(self) -> bool:
        """The entry ran and its result can be read."""
        return self.status == "ok"

    def __getitem__(self, key: str) -> Any:
        if key not in _ENTRY_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_ENTRY_KEYS)

    def __len__(self) -> int:
        return len(_ENTRY_KEYS)

    def __repr__(self) -> str:
        return (f"ResultEntry(kind={self.kind!r}, on={self.on!r}, status={self.status!r}"
                + (f", error={self.error!r}" if self.error else "") + ")")


_ENTRY_KEYS = tuple(f.name for f in fields(ResultEntry))


def stored_entry(item: Any) -> ResultEntry | None:
    """One entry of a graph file's ``queries``, ``validation`` or ``steering`` list (the JSON form
    :meth:`RunResult.queries_json` writes: ``{kind, params, on, status, error, result}``) as a
    :class:`ResultEntry` whose ``result`` is the stored document (a JSON value, None when the item
    failed); None for anything but a JSON object.  The one reader of stored entries: the export
    writers (the Neuronpedia export's and the diagrams' qk results, the report's stored results
    and steering) and the explorer read entries through it.  A missing ``status`` reads as
    ``ok``, a missing ``kind`` as ``""``."""
    if not isinstance(item, Mapping):
        return None
    if isinstance(item, ResultEntry):
        return item
    kind, params, on, status, error = (item.get(k) for k in ("kind", "params", "on", "status", "error"))
    return ResultEntry(
        kind=kind if isinstance(kind, str) else "" if kind is None else str(kind),
        params=dict(params) if isinstance(params, Mapping) else {},
        on=on if isinstance(on, str) else "full",
        status=status if isinstance(status, str) else "ok",
        error=None if error is None else str(error),
        result=item.get("result"),
    )


def stored_results(items: Iterable[Any], kind: str) -> list[Mapping[str, Any]]:
    """The result documents (JSON objects) of the stored entries of one ``kind`` (see
    :func:`stored_entry`), in order; entries without one (failed) are left out."""
    out: list[Mapping[str, Any]] = []
    for item in items:
        entry = stored_entry(item)
        if entry is not None and entry.kind == kind and isinstance(entry.result, Mapping):
            out.append(entry.result)
    return out


class RunOutcome:
    """What :func:`circuitgraph.run` returns, whatever the spec runs: the one return type.

    Every outcome has ``spec`` (the validated spec), ``timings`` (seconds per stage),
    ``failures`` (one line per failed item or prompt), :attr:`ok` and :meth:`summary_lines`
    (what ``circuitgraph run`` prints). The concrete class follows the spec:
    :class:`~circuitgraph.pipeline.runner.RunResult` for one prompt (the graph, its queries,
    checks, steering and exports), :class:`~circuitgraph.datasets.DatasetRunResult` for a
    ``dataset:`` and :class:`~circuitgraph.features.FeaturesRunResult` for feature dashboards
    alone; ``isinstance`` tells them apart (and narrows the type for a type checker).
    """

    spec: Spec
    timings: dict[str, float]
    failures: list[str]

    @property
    def ok(self) -> bool:
        """Nothing failed."""
        return not self.failures

    def summary_lines(self) -> list[str]:  # pragma: no cover - every outcome defines it
        raise NotImplementedError
