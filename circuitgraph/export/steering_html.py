"""The report's Steering section: each ``steer:`` item's continuations, step by step, and its metric.

Works from the JSON form (``RunResult.steering_json()`` or a graph file's ``steering`` list), so
the report of a run and of a saved graph show the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from circuitgraph._results import stored_entry

__all__ = ["steering_html"]


def _num(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.4g}"


def _steps_table(baseline: Mapping[str, Any], intervened: Mapping[str, Any]) -> str:
    rows = ["<tr><th>step</th><th>baseline</th><th>p</th><th>intervened</th><th>p</th>"
            "<th>intervened top tokens</th></tr>"]
    for i, (b, a) in enumerate(zip(baseline.get("steps", []), intervened.get("steps", []), strict=False)):
        changed = ' class="cg-bad"' if b.get("token") != a.get("token") else ""
        top = ", ".join(f"{escape(repr(t.get('text')))} {float(t.get('probability', 0)):.3f}" for t in a.get("top", []))
        rows.append(f"<tr{changed}><td>{i}</td><td>{escape(repr(b.get('text')))}</td><td>{_num(b.get('probability'))}"
                    f"</td><td>{escape(repr(a.get('text')))}</td><td>{_num(a.get('probability'))}</td>"
                    f"<td>{top}</td></tr>")
    return '<table class="cg-table">' + "".join(rows) + "</table>"


def _interventions(items: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for r in items[:20]:
        what = r.get("node") or f"direction at {r.get('site')} layer {r.get('layer')}"
        value = f" {r['value']:.4g}" if r.get("value") is not None else ""
        parts.append(f"{escape(str(what))} {escape(str(r.get('mode')))}{value} at {escape(str(r.get('positions')))}")
    more = f" ... ({len(items)} in all)" if len(items) > 20 else ""
    return "; ".join(parts) + more


def steering_html(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """HTML fragments: one block per steering entry (``status``, ``error``, ``result``)."""
    out: list[str] = []
    for i, item in enumerate(entries):
        e = stored_entry(item)
        res = e.result if e is not None else None
        label = f"steer {i}" + (f": {res['name']}" if isinstance(res, Mapping) and res.get("name") else "")
        if e is None or e.status == "failed" or not isinstance(res, Mapping):
            out.append(f'<h3>{escape(label)}</h3><p class="cg-bad">failed: {escape(str(e.error if e else None))}</p>')
            continue
        m = res.get("metric", {})
        base, new = res.get("baseline", {}), res.get("intervened", {})
        out.append(
            f'<div class="cg-result"><h3>{escape(label)}</h3>'
            f'<p>{_interventions(res.get("interventions", []))}'
            f'{" (attention frozen at prompt positions)" if res.get("freeze_attention") else ""}</p>'
            f'<p>baseline: <code>{escape(repr(base.get("text")))}</code><br>'
            f'intervened: <code>{escape(repr(new.get("text")))}</code></p>'
            f'<p>{escape(str(m.get("name")))} at the last prompt position: {_num(m.get("baseline"))} &rarr; '
            f'{_num(m.get("intervened"))}, change <b>{_num(m.get("actual"))}</b>; the graph predicts '
            f'{_num(m.get("predicted_direct"))} (direct edges), {_num(m.get("predicted_total"))} (total effect)</p>'
            + _steps_table(base, new) + "</div>")
    if not out:
        out.append('<p class="cg-note">(no steering in this run)</p>')
    return out
