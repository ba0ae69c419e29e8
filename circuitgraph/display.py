"""How a result shows itself in a notebook: its ``to_dict()`` document as HTML tables.

A document's rows and the fields it says once (:func:`rows_of`, :func:`summary_of`), and their
HTML.  Below the queries and the validation checks (it imports nothing of the package), so that
every result's ``_repr_html_`` (:class:`circuitgraph._results.Tabular`,
:class:`circuitgraph.validation.dispatch.CheckCall`) calls it directly; the HTML report
(:mod:`circuitgraph.export.html`) builds its result blocks with the same functions.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["RowNames", "document_html", "esc", "html_table", "record_lists", "result_html", "rows_of", "summary_of"]


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update({f"{k}.{ik}": iv for ik, iv in v.items()})
        else:
            out[k] = v
    return out


def record_lists(data: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The lists of records (dicts) of a document, by key."""
    return [(k, v) for k, v in data.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]


def rows_of(data: Any) -> list[dict[str, Any]]:
    """The rows of a ``to_dict()`` document without the fields said once (``[]``: no list of records)."""
    if isinstance(data, list):
        return [_flat(r) if isinstance(r, dict) else {"value": r} for r in data]
    if not isinstance(data, dict):
        return []
    tables = record_lists(data)
    if not tables:
        return []
    _, rows = max(tables, key=lambda kv: len(kv[1]))
    return [_flat(r) for r in rows]


def summary_of(data: Any) -> dict[str, Any]:
    """The fields of a ``to_dict()`` document said once: scalars, lists of scalars and the scalars
    of nested dicts (as ``outer.inner``); not the rows (:func:`rows_of`)."""
    if not isinstance(data, dict):
        return {} if isinstance(data, list) else {"value": data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update({f"{k}.{ik}": iv for ik, iv in v.items() if not isinstance(iv, (list, dict))})
        elif isinstance(v, list):
            if v and not any(isinstance(x, (list, dict)) for x in v):
                out[k] = v
        else:
            out[k] = v
    return out


class RowNames(Protocol):
    """Names for the node ids in a result's rows (the report's token strings and labels, linked
    to their dashboards)."""

    def annotate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]: ...

    def link(self, table: str) -> str: ...


def esc(value: Any) -> str:
    """``value`` as HTML text (quotes escaped too)."""
    return html.escape(str(value), quote=True)


def _cell(value: Any) -> tuple[str, bool]:
    if value is None:
        return "-", False
    if isinstance(value, bool):
        return str(value), False
    if isinstance(value, int):
        return str(value), True
    if isinstance(value, float):
        if value == 0.0:
            return "0", True
        if math.isfinite(value) and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3e}", True
        return f"{value:.4g}", True
    if isinstance(value, (list, tuple)):
        text = ", ".join(_cell(v)[0] for v in value)
        return (text if len(text) <= 120 else text[:119] + "…"), False
    if isinstance(value, dict):
        text = json.dumps(value, default=str)
        return (text if len(text) <= 120 else text[:119] + "…"), False
    return str(value), False


def html_table(rows: Sequence[Mapping[str, Any]], *, max_rows: int = 50) -> str:
    """An HTML table of ``rows`` (one dict per row; columns in order of first appearance)."""
    if not rows:
        return '<p class="cg-note">(no rows)</p>'
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    out = ['<table class="cg"><thead><tr>' + "".join(f"<th>{esc(c)}</th>" for c in columns) + "</tr></thead><tbody>"]
    for r in rows[:max_rows]:
        cells = []
        for c in columns:
            text, numeric = _cell(r.get(c))
            cells.append(f'<td class="num">{esc(text)}</td>' if numeric else f"<td>{esc(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    if len(rows) > max_rows:
        out.append(f'<p class="cg-note">… {len(rows) - max_rows} more rows</p>')
    return "".join(out)


def _shown(key: str, value: Any) -> Any:
    """A summary value as a reader should see it: a local file as its name only (a report is
    shared: it must not reveal the machine's folders)."""
    pathlike = any(word in key.lower() for word in ("heatmap", "path", "file", "dir"))
    if pathlike and isinstance(value, str) and (os.path.isabs(value) or value.startswith("~")) and len(value) < 4096:
        return Path(value).name + (" (drawn below)" if key == "heatmap" else "")
    return value


def document_html(kind: str, document: Any, *, max_rows: int = 50, type_name: str = "",
                  names: RowNames | None = None) -> str:
    """A result's ``to_dict()`` document as an HTML block: its title, what it says once (the
    summary: scalars, short lists, nested scalars) as one small table, then its rows (the longest
    list of records) as a table that scrolls inside the page.  With ``names``, node ids in the
    rows get their token string or label beside them, linked to their dashboard."""
    summary = {k: _shown(k, v) for k, v in summary_of(document).items()}
    rows = rows_of(document)
    if names is not None:
        rows = names.annotate(rows)
    parts = [f'<div class="cg-result"><h3>{esc(kind)}</h3>']
    note = f"{type_name}: " if type_name else ""
    parts.append(f'<p class="cg-note">{esc(note)}{len(rows)} row{"s" if len(rows) != 1 else ""}</p>')
    if summary:
        parts.append(html_table([{"": k, "value": v} for k, v in summary.items()], max_rows=len(summary)))
    if rows:
        table = html_table(rows, max_rows=max_rows)
        parts.append(f'<div class="cg-table-wrap">{names.link(table) if names is not None else table}</div>')
    parts.append("</div>")
    return "".join(parts)


def result_html(kind: str, result: Any, *, max_rows: int = 50, names: RowNames | None = None) -> str:
    """A query or validation result as an HTML block (title, its summary once, its rows as a table)."""
    return document_html(kind, result.to_dict(), max_rows=max_rows, type_name=type(result).__name__, names=names)
