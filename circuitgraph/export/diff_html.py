"""The HTML page of a graph diff: two diagrams side by side on the same layout, changes highlighted.

Both diagrams draw the same nodes (the union's strongest, by ``max(|influence a|, |influence b|)``,
targets always) at the same places: rows by layer (embeddings at the bottom, each layer's heads
below its MLP side, targets on top, as :mod:`circuitgraph.export.dot` lays graphs out), columns by
(position, kind, index), positions fixed for Graphviz (``neato -n2``), so a node sits at the same
spot in both.  Colours are :mod:`circuitgraph.export.dot`'s (fill by kind, edges blue excite / red
inhibit, width by ``|weight|`` on one scale for both sides).  Highlights: a node in one graph only
has a thick green border there and is a dashed ghost in the other; a node among the top changes
(``|effect b - effect a|``, its signed total effect on the targets) has a thick orange border in
both.  Below: the top changes (effect a and b side by side, the signed change, sign flips flagged),
the nodes only in one, and the edges that changed most; a click on a column's header sorts a
table by it (the flip column puts sign flips first).
"""

from __future__ import annotations

import os
import subprocess
from html import escape
from typing import Any

import graphviz
import numpy as np

from circuitgraph._io import atomic_write_text
from circuitgraph.errors import RenderError
from circuitgraph.export.dot import KIND_COLORS, NEGATIVE_COLOR, POSITIVE_COLOR
from circuitgraph.export.render import find_dot
from circuitgraph.graph.nodes import NODE_KINDS
from circuitgraph.residual import ResidualLocation
from circuitgraph.spec.kinds import OUTPUT_KINDS

__all__ = ["diff_html", "write_diff_html", "diff_svgs"]

ONLY_COLOR = "#1a9850"
CHANGED_COLOR = "#f46d43"
_KIND_ORDER = {k: i for i, k in enumerate(NODE_KINDS)}
_X_STEP, _Y_STEP = 96.0, 64.0


def _row(kind: str, layer: int, top: int) -> int:
    if kind in ("embedding", "positional"):
        return 0
    if kind in OUTPUT_KINDS:
        return top
    return int(ResidualLocation.written_by(kind, layer))


def _drawn(d: Any, max_nodes: int) -> Any:
    nodes = d.nodes
    strength = np.maximum(nodes["influence_a"].abs().to_numpy(), nodes["influence_b"].abs().to_numpy())
    is_target = nodes["kind"].isin(sorted(OUTPUT_KINDS)).to_numpy()
    order = np.lexsort((nodes["node"].to_numpy(), -strength))
    keep = [i for i in order if is_target[i]] + [i for i in order if not is_target[i] and nodes["kind"].iat[i]
                                                  not in ("remainder",)]
    return nodes.iloc[keep[:max(max_nodes, int(is_target.sum()))]]


def _layout(drawn: Any) -> dict[str, tuple[float, float]]:
    top = 2 * int(drawn["layer"].clip(lower=0).max() if len(drawn) else 0) + 3
    rows: dict[int, list[Any]] = {}
    for rec in drawn.itertuples():
        rows.setdefault(_row(rec.kind, int(rec.layer), top), []).append(rec)
    pos = {}
    for r, members in rows.items():
        members.sort(key=lambda m: (-1 if m.position is None else m.position, _KIND_ORDER.get(m.kind, 99), m.index))
        for i, m in enumerate(members):
            pos[m.node] = (i * _X_STEP, r * _Y_STEP)
    return pos


def _label(rec: Any, side: str) -> str:
    kind_short = {"feature": "F", "neuron": "N", "attention_head": "H", "error": "err", "embedding": "emb",
                  "logit": "logit", "target": "target", "mlp": "MLP", "bias": "bias", "positional": "pos"}
    pos = "" if rec.position is None else f" @{rec.position}"
    if rec.token:
        head = f"{rec.token!r}{pos}" if rec.kind == "embedding" else f"logit {rec.token!r}{pos}"
    else:
        head = f"{kind_short.get(rec.kind, rec.kind)}{rec.index} L{rec.layer}{pos}"
    if rec.kind in OUTPUT_KINDS:
        return head  # a target's effect on the targets is not a path through it
    return f"{head}\neff {getattr(rec, f'effect_{side}'):+.3g}"


def diff_svgs(d: Any, *, max_nodes: int = 60, top: int = 10, max_edges: int | None = None,
              sort: str = "change") -> tuple[str, str]:
    """The two diagrams (SVG text) of a :class:`~circuitgraph.queries.diff.GraphDiff`."""
    drawn = _drawn(d, max_nodes)
    pos = _layout(drawn)
    changed = set(d.top_changes(top, sort).query("present == 'both'")["node"])
    names = set(drawn["node"])
    edges = d.edges[d.edges["source"].isin(names) & d.edges["target"].isin(names)]
    max_abs = float(max(edges["weight_a"].abs().max() if len(edges) else 0.0,
                        edges["weight_b"].abs().max() if len(edges) else 0.0)) or 1.0
    max_edges = 3 * len(drawn) if max_edges is None else max_edges
    find_dot()
    out = []
    for side, other in (("a", "b"), ("b", "a")):
        g = graphviz.Digraph("diff", engine="neato")
        g.attr("graph", splines="true", outputorder="edgesfirst", fontname="Helvetica", fontsize="12",
               label=f"{side}: {d.names[0 if side == 'a' else 1]}"[:120], labelloc="t")
        g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="9", margin="0.05,0.02",
               height="0.3", penwidth="0.8", color="#555555")
        g.attr("edge", arrowsize="0.45")
        for rec in drawn.itertuples():
            x, y = pos[rec.node]
            attrs = {"pos": f"{x:.1f},{y:.1f}!", "fillcolor": KIND_COLORS.get(rec.kind, "#ffffff"),
                     "tooltip": (f"{rec.node}: activation a {rec.activation_a:.4g}, b {rec.activation_b:.4g}; "
                                 f"influence a {rec.influence_a:.4g}, b {rec.influence_b:.4g}; effect a "
                                 f"{rec.effect_a:+.4g}, b {rec.effect_b:+.4g}" + ("; sign flip" if rec.sign_flip
                                                                                  else ""))}
            if rec.present == other:  # absent on this side: a ghost
                attrs.update(style="rounded,dashed", fillcolor="#ffffff", color="#bbbbbb", fontcolor="#aaaaaa")
            elif rec.present == side:
                attrs.update(color=ONLY_COLOR, penwidth="3")
            elif rec.node in changed:
                attrs.update(color=CHANGED_COLOR, penwidth="3")
            g.node(rec.node, label=_label(rec, side), **attrs)
        w = edges[f"weight_{side}"]
        mine = edges[w != 0].assign(_abs=w[w != 0].abs()).sort_values("_abs", ascending=False).head(max_edges)
        for rec in mine.itertuples():
            weight = getattr(rec, f"weight_{side}")
            width = 0.4 + 4.6 * abs(weight) / max_abs
            g.edge(rec.source, rec.target, color=NEGATIVE_COLOR if weight < 0 else POSITIVE_COLOR,
                   penwidth=f"{width:.2f}", style="bold" if rec.present == side else "solid",
                   tooltip=f"{rec.source} -> {rec.target}: {side} {weight:+.4g}, difference {rec.difference:+.4g}")
        try:
            svg = g.pipe(format="svg", neato_no_op=2, quiet=True).decode("utf-8")
        except (graphviz.ExecutableNotFound, subprocess.CalledProcessError, OSError) as exc:
            raise RenderError(f"Graphviz neato failed: {exc}") from None
        out.append(svg[svg.find("<svg"):])
    return out[0], out[1]


def _cell(column: str, value: Any) -> str:
    """One cell; ``data-v`` is what the table sorts by (a number, or the text)."""
    if column == "sign_flip":
        flip = bool(value)
        return f'<td class="flip" data-v="{int(flip)}">{"FLIP" if flip else ""}</td>'
    if isinstance(value, (float, np.floating)):
        v = float(value)
        signed = column.startswith(("effect", "weight")) or column == "difference"
        text = f"{v:+.4g}" if signed else f"{v:.4g}"
        cls = ' class="neg"' if signed and v < 0 else ""
        return f'<td data-v="{v!r}"{cls}>{text}</td>'
    return f"<td>{escape(str(value))}</td>"


#: column headers as the page shows them
_HEADERS = {"effect_a": "effect a", "effect_b": "effect b", "effect_difference": "change (b - a)",
            "sign_flip": "flip", "influence_a": "influence a", "influence_b": "influence b",
            "activation_a": "activation a", "activation_b": "activation b", "weight_a": "weight a",
            "weight_b": "weight b", "difference": "change (b - a)"}


def _table(df: Any, columns: list[str], max_rows: int = 20) -> str:
    head = "".join(f'<th title="sort by {escape(_HEADERS.get(c, c))}">{escape(_HEADERS.get(c, c))}</th>'
                   for c in columns)
    rows = []
    for rec in df.head(max_rows).to_dict(orient="records"):
        rows.append("<tr>" + "".join(_cell(c, rec[c]) for c in columns) + "</tr>")
    more = f'<p class="note">{len(df) - max_rows} more rows in the JSON</p>' if len(df) > max_rows else ""
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{more}'


#: a click on a header sorts its table: numbers by size of |value| (largest first; flips first), text A-Z
_SORT_JS = """document.querySelectorAll('table.sortable th').forEach(function (th, i) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], rows = Array.prototype.slice.call(body.rows);
    var key = function (r) { var c = r.cells[i], v = c.dataset.v; return v === undefined ? c.textContent : Math.abs(+v); };
    rows.sort(function (x, y) { var a = key(x), b = key(y);
      return typeof a === 'number' ? b - a : (a < b ? -1 : a > b ? 1 : 0); });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});"""


_CSS = """body{font-family:Helvetica,Arial,sans-serif;margin:1.5em;color:#222}
.pair{display:flex;gap:1em;align-items:flex-start}.pair>div{flex:1;overflow:auto;border:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px}
.note{color:#666;font-size:12px}.neg{color:#b2182b}.flip{color:#b2182b;font-weight:bold}
th{cursor:pointer}"""


def diff_html(d: Any, *, max_nodes: int = 60, top: int = 10, sort: str = "change") -> str:
    """One self-contained HTML page for a :class:`~circuitgraph.queries.diff.GraphDiff`; ``sort``
    ranks its top changes (``change``: by ``|b - a|``; ``flip``: sign flips first)."""
    svg_a, svg_b = diff_svgs(d, max_nodes=max_nodes, top=top, sort=sort)
    c = d.counts()
    node_cols = ["node", "present", "effect_a", "effect_b", "effect_difference", "sign_flip", "influence_a",
                 "influence_b", "activation_a", "activation_b"]
    edge_cols = ["source", "target", "present", "weight_a", "weight_b", "difference", "sign_flip"]
    by = "|effect b - effect a|" if sort == "change" else "sign flips first, then |effect b - effect a|"
    body = [
        f"<h1>circuitgraph diff</h1><p>a: {escape(d.names[0])}<br>b: {escape(d.names[1])}<br>match: "
        f"{escape(d.match)}</p>",
        f"<p>nodes: {c['nodes_both']} in both, {c['nodes_only_a']} only in a, {c['nodes_only_b']} only in b; "
        f"edges: {c['edges_both']} in both, {c['edges_only_a']} only in a, {c['edges_only_b']} only in b; "
        f"sign flips: {c['node_sign_flips']} nodes, {c['edge_sign_flips']} edges</p>",
        f'<p class="note">Same layout on both sides. Thick green border: only in that graph (a dashed ghost in '
        f'the other); thick orange border: among the top {top} changes by {escape(by)}. effect: the signed total '
        f'effect on the targets; FLIP: non-zero in both with opposite signs. Click a column header to sort.</p>',
        f'<div class="pair"><div>{svg_a}</div><div>{svg_b}</div></div>',
        f"<h2>Top changes by {escape(by)}</h2>{_table(d.top_changes(top, sort), node_cols, top)}",
        f"<h2>Edges that changed most</h2>{_table(d.top_edge_changes(20, sort), edge_cols)}",
        f"<h2>Nodes only in a</h2>{_table(d.only_in_a(), node_cols)}",
        f"<h2>Nodes only in b</h2>{_table(d.only_in_b(), node_cols)}",
    ]
    body += [f'<p class="note">note: {escape(n)}</p>' for n in d.notes]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>circuitgraph diff</title>"
            f"<style>{_CSS}</style></head><body>" + "\n".join(body) + f"<script>{_SORT_JS}</script></body></html>\n")


def write_diff_html(d: Any, path: str | os.PathLike[str], **kwargs: Any) -> str:
    """Write :func:`diff_html` to ``path`` atomically; returns the path."""
    atomic_write_text(path, diff_html(d, **kwargs))
    return os.fspath(path)
