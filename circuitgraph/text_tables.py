"""The one text-table formatter of results' ``table()``: plain text (queries) or GitHub markdown
(validation checks), with the cell formats of each.

Below the queries and the validation checks (it imports nothing of the package);
``queries._base.format_table``/``fmt`` and ``validation._common.markdown_table``/``fmt`` are these
functions under their old names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

__all__ = ["cell", "format_table", "markdown_table", "TableStyle"]

#: ``text``: aligned columns under a dashed rule (queries); ``markdown``: a GitHub table (checks)
TableStyle = Literal["text", "markdown"]


def cell(value: Any, style: TableStyle = "text", digits: int = 4) -> str:
    """A compact cell: floats to ``digits`` significant digits; ``None`` is ``-`` in text and an en
    dash in markdown, where booleans are yes/no and very large or small numbers switch to
    scientific notation at 1e4 (1e5 in text)."""
    if value is None:
        return "-" if style == "text" else "–"
    if style == "markdown" and isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if style == "markdown" and not math.isfinite(v):
            return str(v)
        if v == 0.0:
            return "0"
        if math.isfinite(v) and (abs(v) >= (1e5 if style == "text" else 1e4) or abs(v) < 1e-3):
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}g}"
    return str(value)


def format_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    max_rows: int | None = 10,
    title: str | None = None,
    footer: str | None = None,
    style: TableStyle = "text",
) -> str:
    """A table of ``rows`` under ``headers``: at most ``max_rows`` rows (None: all), then a
    ``... n more`` line.  ``text``: left-aligned text, right-aligned numbers, ``(none)`` when
    empty; ``markdown``: ``|`` escaped in cells."""
    rows = [list(r) for r in rows]
    shown = rows if max_rows is None else rows[: max(0, max_rows)]
    cells = [[cell(c, style) for c in r] for r in shown]
    out = [title] if title else []
    if style == "markdown":
        esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        out += ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in cells]
        if len(rows) > len(shown):
            out.append(f"... {len(rows) - len(shown)} more rows")
    else:
        numeric = [
            all(isinstance(r[j], (int, float, np.integer, np.floating)) or r[j] is None for r in shown) if shown
            else False for j in range(len(headers))
        ]
        widths = [max([len(h)] + [len(c[j]) for c in cells]) for j, h in enumerate(headers)]

        def line(values: Sequence[str]) -> str:
            return "  ".join(v.rjust(w) if numeric[j] else v.ljust(w)
                             for j, (v, w) in enumerate(zip(values, widths, strict=False)))

        out.append(line(list(headers)).rstrip())
        out.append("  ".join("-" * w for w in widths))
        out += [line(c).rstrip() for c in cells]
        if len(rows) > len(shown):
            out.append(f"... {len(rows) - len(shown)} more")
        if not rows:
            out.append("(none)")
    if footer:
        out.append(footer)
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], max_rows: int | None = 10) -> str:
    """A GitHub-markdown table; more than ``max_rows`` rows end in a ``... n more rows`` line."""
    return format_table(headers, rows, max_rows=max_rows, style="markdown")
