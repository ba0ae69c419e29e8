"""HTML: notebook display of graphs, runs and results, and the one-file run report.

Everything here is self-contained HTML (inline CSS, inline SVG, images as ``data:`` URIs,
no script from the network), so a report opens offline and can be mailed as one file.

* :func:`result_html` -- a query or validation result: its kind, a one-line summary and
  its rows as a table (what ``_repr_html_`` of every result shows);
* :func:`graph_html` -- a graph: counts, targets, exactness checks and the diagram;
* :func:`report_html` / :func:`write_report` -- the run report: the diagram (inline SVG, each
  node's tooltip shows its activation, influence and label), the spec, the model and
  dictionary identity, the scores, every query result and validation table, the patching
  heat maps and control distributions as inline images, and the exactness checks.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitgraph._io import atomic_write_text
from circuitgraph._results import ResultEntry, stored_entry
from circuitgraph.display import document_html, esc, html_table, result_html  # the tables; re-exported: their old home
from circuitgraph.errors import RenderError
from circuitgraph.export.dot import DEFAULT_MAX_NODES, graph_to_dot, raw_influence
from circuitgraph.export.graph_files import read_graph_file  # re-exported: its old home
from circuitgraph.export.portable import portable_paths
from circuitgraph.export.render import render_dot_bytes
from circuitgraph.export.steering_html import steering_html
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, display_name
from circuitgraph.validation.activation_patching import write_heatmap

if TYPE_CHECKING:
    from circuitgraph.features.summary import FeatureDashboards
    from circuitgraph.pipeline.runner import RunResult

__all__ = [
    "result_html", "document_html", "graph_html", "graph_svg", "diagram_svg", "run_html", "report_html", "write_report", "html_table",
    "read_graph_file",
]

_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;
max-width:1200px;padding:16px 24px;color:#222;line-height:1.4}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
h3{font-size:1.0em;margin:1em 0 .3em}
table.cg{border-collapse:collapse;font-size:12px;margin:.3em 0 1em}
table.cg th,table.cg td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
table.cg th{background:#f3f3f3}table.cg td.num{text-align:right;font-variant-numeric:tabular-nums}
.cg-diagram{overflow:auto;border:1px solid #ddd;max-height:80vh}.cg-diagram svg{max-width:100%;height:auto}
#diagram{cursor:grab;height:80vh;max-height:none;width:calc(100vw - 48px);margin-left:calc(50% - 50vw + 24px)}#diagram.cg-panning{cursor:grabbing}#diagram svg{max-width:none}
.cg-zoom{margin:.3em 0}.cg-zoom button{font-size:12px;min-width:2.4em;margin-right:2px}
.cg-note{color:#666;font-size:12px}.cg-ok{color:#1a7f37;font-weight:bold}.cg-bad{color:#b2182b;font-weight:bold}
pre.cg-spec{background:#f7f7f7;padding:8px;font-size:12px;overflow:auto;max-height:40vh}
img.cg-figure{max-width:100%;border:1px solid #eee}
.cg-table-wrap{max-width:100%;overflow-x:auto;max-height:60vh;overflow-y:auto}
"""


# --------------------------------------------------------------------------- graphs
def graph_svg(graph: AttributionGraph, **dot_kwargs: Any) -> str | None:
    """The diagram as inline SVG text (``<svg ...>``) scaled to fit its container's width (a
    notebook cell), or ``None`` when Graphviz's ``dot`` is not installed.  ``dot_kwargs`` go to
    :func:`circuitgraph.export.dot.graph_to_dot`."""
    svg = diagram_svg(graph, **dot_kwargs)
    return None if svg is None else _fit_width(svg)


def diagram_svg(graph: AttributionGraph, **dot_kwargs: Any) -> str | None:
    """The diagram as inline SVG text at Graphviz's own size (1 pt a CSS pt: labels at their
    font size), or ``None`` when Graphviz's ``dot`` is not installed."""
    try:
        svg = render_dot_bytes(graph_to_dot(graph, **dot_kwargs), "svg").decode("utf-8")
    except RenderError:
        return None
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _fit_width(svg: str) -> str:
    """The SVG scaled down to its container's width (a notebook cell, the report's column) instead
    of Graphviz's fixed size: an inline style, because a notebook shows no stylesheet."""
    if svg.startswith("<svg") and "max-width" not in svg[:400]:
        return '<svg style="max-width:100%;height:auto"' + svg[4:]
    return svg


def _svg_title_lines(svg: str) -> list[str]:
    """The lines of a Graphviz SVG's graph label (its title: what the diagram shows and leaves out),
    as escaped HTML: the ``<text>`` elements of the top-level group before its first subgroup."""
    start = svg.find('<g id="graph0"')
    end = svg.find("<g ", start + 1)
    if start < 0:
        return []
    return re.findall(r"<text [^>]*>([^<]*)</text>", svg[start:end if end > 0 else len(svg)])


def _target_text(node: Node) -> str:
    """A target as a reader sees it: a token quoted (``' an'``), a difference as labelled (``' an' - ' a'``)."""
    if node.kind == "logit" and node.label:
        return repr(node.label)
    return node.label or str(node.id)


def _graph_facts(graph: AttributionGraph) -> list[dict[str, Any]]:
    kinds: dict[str, int] = {}
    for n in graph.nodes:
        kinds[n.kind] = kinds.get(n.kind, 0) + 1
    facts = [
        {"": "model", "value": graph.metadata.model_name or "?"},
        {"": "prompt", "value": graph.metadata.prompt or ""},
        {"": "nodes", "value": f"{graph.n_nodes} (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")"},
        {"": "edges", "value": graph.n_edges},
        {"": "targets", "value": ", ".join(f"{_target_text(graph.node(t))} (w={w:.3g})" for t, w in graph.targets)},
    ]
    for key, value in (("replacement_score", graph.metadata.replacement_score),
                       ("completeness_score", graph.metadata.completeness_score)):
        if value is not None:
            facts.append({"": key, "value": value})
    return facts


def graph_html(graph: AttributionGraph, *, max_nodes: int | None = DEFAULT_MAX_NODES) -> str:
    """A graph as an HTML block: a facts table and the diagram (when ``dot`` is installed)."""
    svg = graph_svg(graph, max_nodes=max_nodes)
    parts = [f"<div class=\"cg-graph\"><h3>{esc(repr(graph))}</h3>", html_table(_graph_facts(graph))]
    if svg is not None:  # inline styles: a notebook cell shows no stylesheet
        parts.append(f'<div class="cg-diagram" style="max-width:100%;overflow:auto">{svg}</div>')
    else:
        parts.append('<p class="cg-note">(install Graphviz for the diagram)</p>')
    parts.append("</div>")
    return "".join(parts)


def run_html(result: RunResult) -> str:
    """A run's notebook display: the graph block and every query / validation result."""
    parts = [graph_html(result.graph)]
    for what, entries in (("query", result.queries), ("validation", result.validation)):
        for e in entries:
            if e.status == "failed":
                parts.append(f'<p class="cg-bad">{esc(what)} {esc(e.kind)} failed: {esc(e.error)}</p>')
            else:
                parts.append(result_html(f"{what} {e.kind}", e.result))
    return "".join(parts)


# --------------------------------------------------------------------------- the report
_ZOOM_BUTTONS = ('<div class="cg-zoom"><button data-zoom="out" title="zoom out">−</button>'
                 '<button data-zoom="one" title="actual size: labels at their font size">100%</button>'
                 '<button data-zoom="fit" title="the whole diagram in the box">fit</button>'
                 '<button data-zoom="in" title="zoom in">+</button> <span id="diagram-zoom" class="cg-note">100%</span>'
                 '</div>')
#: the report's one script (inline, nothing fetched): the diagram starts at its own size (1 pt a
#: CSS pt) in a scrolling box, scrolled to the top centre (the targets); zoom by buttons or
#: ctrl + wheel, pan by dragging
_ZOOM_SCRIPT = """<script>(function () {
  var box = document.getElementById("diagram"), svg = box && box.querySelector("svg");
  if (!svg) return;
  var w = svg.width.baseVal.valueInSpecifiedUnits, h = svg.height.baseVal.valueInSpecifiedUnits;
  var unit = svg.width.baseVal.unitType === 9 ? 4 / 3 : 1, zoom = 1;  /* 9: pt */
  function set(z) {
    zoom = Math.max(0.05, Math.min(8, z));
    svg.style.width = (w * unit * zoom) + "px"; svg.style.height = (h * unit * zoom) + "px";
    document.getElementById("diagram-zoom").textContent = Math.round(zoom * 100) + "%";
  }
  set(1);
  var top = null;  /* the highest node (a target): centred in the box at first */
  box.querySelectorAll("g.node").forEach(function (g) {
    var t = g.querySelector("title"), name = t ? t.textContent : "";
    if (/^(axis|legend|width) /.test(name)) return;
    var r = g.getBoundingClientRect();
    if (top === null || r.top < top.top) top = r;
  });
  if (top !== null) {
    var b = box.getBoundingClientRect();
    box.scrollLeft = top.left + top.width / 2 - b.left - box.clientWidth / 2;
  }
  document.querySelectorAll(".cg-zoom button").forEach(function (b) {
    b.addEventListener("click", function () {
      var what = b.dataset.zoom;
      if (what === "in") set(zoom * 1.25); else if (what === "out") set(zoom / 1.25);
      else if (what === "one") set(1);
      else set(Math.min(box.clientWidth / (w * unit), box.clientHeight / (h * unit)));
    });
  });
  box.addEventListener("wheel", function (e) {
    if (!e.ctrlKey) return;
    e.preventDefault(); set(zoom * (e.deltaY < 0 ? 1.1 : 1 / 1.1));
  }, { passive: false });
  var drag = null;
  box.addEventListener("mousedown", function (e) {
    if (e.button !== 0 || e.target.closest("a")) return;
    drag = [e.clientX, e.clientY, box.scrollLeft, box.scrollTop]; box.classList.add("cg-panning"); e.preventDefault();
  });
  window.addEventListener("mousemove", function (e) {
    if (!drag) return;
    box.scrollLeft = drag[2] - (e.clientX - drag[0]); box.scrollTop = drag[3] - (e.clientY - drag[1]);
  });
  window.addEventListener("mouseup", function () { drag = null; box.classList.remove("cg-panning"); });
})();</script>"""


def _image_uri(data: bytes, fmt: str) -> str:
    mime = {"png": "image/png", "svg": "image/svg+xml"}[fmt]
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _control_figures(document: Any, title: str) -> list[str]:
    """One histogram per control distribution found in a result's ``to_dict()``."""
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(x: Any, where: str) -> None:
        if isinstance(x, dict):
            if isinstance(x.get("effects"), list) and "selected_effect" in x and x["effects"]:
                found.append((f"{where} {x.get('kind', '')}".strip(), x))
            for k, v in x.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")

    walk(document, "")
    figures = []
    for where, ctrl in found[:12]:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(4.2, 2.4), dpi=100)
        ax = fig.add_subplot(1, 1, 1)
        effects = [float(e) for e in ctrl["effects"] if isinstance(e, (int, float))]
        ax.hist(effects, bins=min(30, max(5, len(effects) // 2)), color="#9ecae1", edgecolor="#3182bd")
        sel = ctrl.get("selected_effect")
        if isinstance(sel, (int, float)) and math.isfinite(sel):
            ax.axvline(float(sel), color="#b2182b", linewidth=2, label="selected set")
            ax.legend(fontsize=7)
        ax.set_title(f"{title}: {where}", fontsize=8)
        ax.set_xlabel("effect of the control set", fontsize=8)
        ax.tick_params(labelsize=7)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        figures.append(f'<img class="cg-figure" alt="control distribution {esc(where)}" '
                       f'src="{_image_uri(buf.getvalue(), "png")}">')
    return figures


def _heatmap_figures(result: Any, title: str) -> list[str]:
    """The patching heat map of a result, re-drawn in memory (or read from its file)."""
    if not hasattr(result, "heatmap") or type(result).__name__ != "PatchingResult":
        return []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_heatmap(result, Path(tmp) / "heatmap.png")
            data = Path(path).read_bytes()
    except Exception:  # noqa: BLE001 - fall back to the file the run wrote, if any
        if not result.heatmap or not Path(result.heatmap).is_file():
            return []
        data = Path(result.heatmap).read_bytes()
    return [f'<img class="cg-figure" alt="{esc(title)} heat map" src="{_image_uri(data, "png")}">']


def _checks_rows(graph: AttributionGraph, full: AttributionGraph | None) -> list[dict[str, Any]]:
    rows = []
    for name, g in (("exported graph", graph), ("unpruned graph", full)):
        if g is None or (name == "unpruned graph" and g is graph):
            continue
        report = g.check_completeness()
        rows.append({"check": f"completeness ({name})", "max relative violation": report.max_violation,
                     "max abs violation": report.max_abs_violation, "readers": report.n_readers,
                     "worst node": str(report.worst) if report.worst is not None else None,
                     "ok (1e-5)": "yes" if report.ok() else "NO"})
    precision = (full or graph).metadata.precision_warning
    if precision is not None:
        rows.append({"check": "precision (what the dtype allows)", "note": precision})
    checks = graph.metadata.checks
    if checks is not None:
        for k, v in checks.items():
            rows.append({"check": k, **({kk: vv for kk, vv in v.items()} if isinstance(v, Mapping) else {"value": v})})
    return rows


def _identity_rows(graph: AttributionGraph) -> list[dict[str, Any]]:
    rows = []
    model = graph.metadata.model
    if model is not None:
        rows.append({"what": "model", "name": model.get("name"), "source": json.dumps(model.get("source"), default=str),
                     "details": json.dumps(model.get("architecture", {}), default=str)})
    tcs = graph.metadata.transcoders
    if tcs:
        # per-layer facts; each layer's file path is left out (the source above names the files)
        details: dict[str, Any] = {k: v for k, v in tcs.items() if k not in ("source", "layers")}
        layers = tcs.get("layers")
        if isinstance(layers, list):
            details["layers"] = [{k: v for k, v in layer.items() if k != "source"} if isinstance(layer, Mapping)
                                 else layer for layer in layers]
        rows.append({"what": "dictionaries", "name": tcs.get("format") or tcs.get("kind"),
                     "source": json.dumps(tcs.get("source"), default=str),
                     "details": json.dumps(details, default=str)[:800]})
    versions = graph.metadata.versions
    if versions is not None:
        rows.append({"what": "versions", "name": "", "source": "",
                     "details": ", ".join(f"{k} {v}" for k, v in versions.items())})
    return rows


def report_html(source: Any, *, title: str | None = None, max_nodes: int | None = DEFAULT_MAX_NODES,
                queries: Sequence[Mapping[str, Any]] = (), validation: Sequence[Mapping[str, Any]] = (),
                diagram: Mapping[str, Any] | None = None, steering: Sequence[Mapping[str, Any]] = (),
                features: FeatureDashboards | None = None) -> str:
    """The report of a run (a :class:`~circuitgraph.pipeline.runner.RunResult`) or of a graph
    (with the query and validation results stored in its file, as JSON), as one
    self-contained HTML document (see the module docstring).  ``diagram`` holds more
    :func:`~circuitgraph.export.dot.graph_to_dot` options (labels, supernodes...).
    ``features``: a features folder (:class:`~circuitgraph.features.FeatureDashboards`): the
    report gets a dashboard section per feature of the graph, linked from the diagram's nodes
    and from the tables."""
    if isinstance(source, AttributionGraph):
        graph, full, spec = source, None, source.metadata.spec
        stored_q, stored_v = list(queries), list(validation)
        queries, validation = [], []
    else:
        graph, full = source.graph, source.full_graph
        queries, validation = source.queries, source.validation
        spec = source.spec.model_dump(mode="json") if hasattr(source.spec, "model_dump") else source.spec

        spec = portable_paths(spec, getattr(source.spec, "base_dir", None))  # no local folders in a report
        stored_q, stored_v = [], []
    prompt = graph.metadata.prompt or ""
    title = title or f"circuitgraph report: {prompt}"
    body = [f"<h1>{esc(title)}</h1>",
            f'<p class="cg-note">{esc(repr(graph))}</p>']

    body.append("<h2>Diagram</h2>")
    options = dict(diagram or {})
    if full is not None and full.targets and "influence" not in options:
        options["influence"] = raw_influence(full)
    boards = _feature_boards(graph, features)
    svg = diagram_svg(_linked(graph, boards), max_nodes=max_nodes, **options)
    if svg is None:
        body.append('<p class="cg-bad">Graphviz `dot` is not installed: no diagram (apt-get install graphviz)</p>')
    else:
        body.append('<p class="cg-note">Hover a node for its activation, influence and label; edge colour is '
                    'the sign, width the magnitude. Drawn at its own size (labels legible): drag to pan, '
                    'ctrl + wheel or the buttons to zoom.</p>')
        drawn = _svg_title_lines(svg)[1:]  # what the diagram shows and hides, readable at any scroll
        if drawn:
            body.append('<p class="cg-note" id="diagram-summary">' + "<br>".join(drawn) + "</p>")
        body.append(_ZOOM_BUTTONS + f'<div class="cg-diagram" id="diagram">{svg}</div>' + _ZOOM_SCRIPT)

    body.append("<h2>Graph</h2>" + html_table(_graph_facts(graph)))
    body.append("<h2>Model and dictionaries</h2>" + html_table(_identity_rows(full or graph)))
    meta = (full or graph).metadata
    scores = [{"score": k, "value": v} for k, v in (("replacement_score", meta.replacement_score),
                                                    ("completeness_score", meta.completeness_score))
              if v is not None]
    body.append("<h2>Scores</h2>" + html_table(scores))
    body.append("<h2>Exactness checks</h2>" + html_table(_checks_rows(graph, full)))

    names = _NodeNames(graph, full, boards)
    body.append("<h2>Queries</h2>")
    body += _entries_html(queries, stored_q, "query", names)
    body.append("<h2>Validation</h2>")
    body += _entries_html(validation, stored_v, "validation", names)
    steering = list(steering) or (source.steering_json()
                                  if not isinstance(source, AttributionGraph) and getattr(source, "steering", None)
                                  else [])
    if steering:  # the spec's steer: items (docs/steering.md)
        body.append("<h2>Steering</h2>")
        body += steering_html(steering)
    if boards and features is not None:  # boards come from the features folder
        body.append("<h2>Feature dashboards</h2>")
        body.append(f'<p class="cg-note">From {esc(Path(features.directory).name)}: each feature of the graph, its '
                    "top activating tokens over the dataset (the activating token in bold), density, activation "
                    "quantiles, the tokens it promotes and suppresses and the tokens that drive it directly.</p>")
        body += [_dashboard_html(board) for board in boards.values()]

    body.append("<h2>Spec</h2>")
    if spec is not None:
        body.append(f'<pre class="cg-spec">{esc(json.dumps(spec, indent=2, default=str))}</pre>')
    else:
        body.append('<p class="cg-note">(no spec recorded)</p>')
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def _entries_html(live: Sequence[Mapping[str, Any]], stored: Iterable[Any], what: str, names: Any = None) -> list[str]:
    out: list[str] = []
    for i, entry in enumerate(live):
        e = entry if isinstance(entry, ResultEntry) else ResultEntry(**entry)  # a caller's plain dict entry
        label = f"{what} {i}: {e.kind}"
        if e.status == "failed":
            out.append(f'<h3>{esc(label)}</h3><p class="cg-bad">failed: {esc(e.error)}</p>')
            continue
        out.append(result_html(label, e.result, names=names))
        out += _heatmap_figures(e.result, label)
        out += _control_figures(e.result.to_dict(), label)
    for i, item in enumerate(stored):
        e = stored_entry(item)
        if e is None:
            continue
        label = f"{what} {i}: {e.kind}"
        if e.status == "failed" or e.result is None:
            out.append(f'<h3>{esc(label)}</h3><p class="cg-bad">failed: {esc(e.error)}</p>')
            continue
        out.append(document_html(label, e.result, names=names))
        out += _control_figures(e.result, label)
    if not out:
        out.append(f'<p class="cg-note">(no {what} in this run)</p>')
    return out


# --------------------------------------------------------------------------- node names, dashboards
def _anchor(layer: int, index: int) -> str:
    return f"feature-L{layer}-{index}"


def _feature_boards(graph: AttributionGraph, features: FeatureDashboards | None) -> dict[tuple[int, int],
                    dict[str, Any]]:
    """``{(layer, index): dashboard}`` of the graph's features that the features folder has."""
    if features is None:
        return {}
    keys = sorted({(n.layer, n.index) for n in graph.nodes if n.kind == "feature"})
    boards = {key: features.dashboard(*key) for key in keys}
    return {key: board for key, board in boards.items() if board is not None}


def _linked(graph: AttributionGraph, boards: Mapping[tuple[int, int], Any]) -> AttributionGraph:
    """A shallow copy whose feature nodes link (``attrs["href"]``) to their dashboard section."""
    if not boards:
        return graph
    nodes = [Node(n.id, n.activation, n.pre_activation, n.constant, n.label,
                  {**n.attrs, "href": f"#{_anchor(n.layer, n.index)}"})
             if n.kind == "feature" and (n.layer, n.index) in boards else n for n in graph.nodes]
    return AttributionGraph(nodes, graph.edge_target, graph.edge_source, graph.edge_weight,
                            targets=list(graph.targets), metadata=graph.metadata,
                            linearised_edges=graph.linearised_edges)


class _NodeNames:
    """Names nodes in report tables: a cell holding a node id (or a list of them, a path) gets
    the node's token string or label next to it, and a feature with a dashboard links to it."""

    def __init__(self, graph: AttributionGraph, full: AttributionGraph | None,
                 boards: Mapping[tuple[int, int], Any]):
        self.names: dict[str, str] = {}
        self.links: dict[str, str] = {}
        for g in (full, graph):
            for n in (g.nodes if g is not None else ()):
                text = display_name(n) or (boards.get((n.layer, n.index), {}).get("label", "")
                                           if n.kind == "feature" else "")
                self.names[str(n.id)] = text
                if n.kind == "feature" and (n.layer, n.index) in boards:
                    self.links[str(n.id)] = _anchor(n.layer, n.index)

    def _named(self, value: str) -> str:
        name = self.names.get(value)
        return f'{value} "{name}"' if name else value

    def annotate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            new = {}
            for k, v in r.items():
                if isinstance(v, str) and v in self.names:
                    v = self._named(v)
                elif isinstance(v, list) and v and all(isinstance(x, str) and x in self.names for x in v):
                    v = " -> ".join(self._named(x) for x in v)
                new[k] = v
            out.append(new)
        return out

    def table(self, rows: list[dict[str, Any]]) -> str:
        """:func:`html_table` with each named feature's id linked to its dashboard section."""
        return self.link(html_table(rows))

    def link(self, text: str) -> str:
        """An HTML table's text with each named feature's id linked to its dashboard section."""
        if not self.links:
            return text
        links = {esc(k): v for k, v in self.links.items()}
        ids = "|".join(re.escape(k) for k in sorted(links, key=len, reverse=True))
        return re.sub(rf"(?<=[>\s])({ids})(?=[\s<])", lambda m: f'<a href="#{links[m.group(1)]}">{m.group(1)}</a>',
                      text)


def _marked(text: str) -> str:
    """An example's text with the activating token (between \u00ab and \u00bb) in bold."""
    escaped = esc(text)
    return escaped.replace("\u00ab", "<b>").replace("\u00bb", "</b>")


def _dashboard_html(board: Mapping[str, Any]) -> str:
    layer, index = board["layer"], board["index"]
    title = f"feature L{layer} #{index}" + (f": {board['label']}" if board.get("label") else "")
    facts = [{"n_active": board["n_active"], "n_tokens": board["n_tokens"], "density": board["density"],
              "max": board["max_activation"], "mean (active)": board["mean_active_activation"],
              **board.get("quantiles", {})}]

    def tokens(key: str) -> str:
        return ", ".join(f"{t['token']!r} ({t['value']:+.3g})" for t in board.get(key, [])[:8])

    lists = [{"promotes (output)": tokens("top_output_tokens"), "suppresses (output)": tokens("bottom_output_tokens"),
              "driven by (input)": tokens("top_input_tokens")}]
    examples = "".join(f"<tr><td class=\"num\">{e['rank']}</td><td class=\"num\">{e['activation']:.4g}</td>"
                       f"<td>{esc(e['row_id'])} @{e['position']}</td><td>{_marked(e['text'])}</td></tr>"
                       for e in board.get("examples", []))
    return (f'<div class="cg-feature" id="{_anchor(layer, index)}"><h3>{esc(title)}</h3>'
            f"{html_table(facts)}{html_table(lists)}"
            '<table class="cg"><thead><tr><th>rank</th><th>activation</th><th>row</th><th>context</th></tr></thead>'
            f"<tbody>{examples}</tbody></table></div>")


def write_report(source: Any, path: str | os.PathLike[str], **kwargs: Any) -> str:
    """Write :func:`report_html` of ``source`` (a run result, a graph, or a graph JSON path)
    to ``path`` atomically; returns the path."""
    if isinstance(source, (str, os.PathLike)):
        doc = read_graph_file(source)
        source = doc.graph
        kwargs = {"queries": doc.queries, "validation": doc.validation, "steering": doc.steering, **kwargs}
    atomic_write_text(path, report_html(source, **kwargs))
    return os.fspath(path)



