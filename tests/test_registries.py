"""Each kind of change has one place (docs/architecture.md, "Where each kind of change goes"):
the registries agree with what is built from them, so a record without its part fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from circuitgraph.spec.export import EXPORT_KINDS, EXPORT_SUFFIXES, ExportSpec

STATIC = Path(__file__).resolve().parents[1] / "circuitgraph" / "serve" / "static"


def test_every_export_kind_has_a_spec_field_a_writer_and_its_explorer_download():
    from circuitgraph.pipeline.exports import EXPORT_WRITERS
    from circuitgraph.serve.api import DOWNLOADS, explorer_kinds

    outputs = {name for name, f in ExportSpec.model_fields.items() if "pathlib.Path" in str(f.annotation)}
    assert set(EXPORT_KINDS) == outputs - {"dataset", "features"}  # those two are folders of other runs
    assert set(EXPORT_WRITERS) == set(EXPORT_KINDS)
    assert list(EXPORT_WRITERS)[:3] == ["json", "graph", "neuronpedia"]  # the order the run writes them
    assert EXPORT_SUFFIXES == {k: v.suffixes for k, v in EXPORT_KINDS.items()}
    offered = [k for k, v in EXPORT_KINDS.items() if v.explorer]
    assert set(DOWNLOADS) == set(offered) and [k.key for k in explorer_kinds()] == offered
    assert all(v.explorer_label for v in EXPORT_KINDS.values() if v.explorer)
    spec = ExportSpec(**{k: f"out/x{v.suffixes[0]}" for k, v in EXPORT_KINDS.items() if k != "neuronpedia"})
    assert list(spec.outputs()) == [k for k in EXPORT_KINDS if k != "neuronpedia"]


def test_every_explorer_view_is_routed_and_shown_by_its_panel():
    from circuitgraph.serve.api import VIEWS, Explorer

    script = (STATIC / "explorer.js").read_text()
    functions = set(re.findall(r"^(?:async )?function (\w+)\(", script, flags=re.M))
    asked = set(re.findall(r"""(?:/api/|nameUrl\(")(\w+)""", script))
    assert asked == set(VIEWS), "the page asks for routes that are not views, or a view no page asks for"
    for route, view in VIEWS.items():
        assert view.route == route and view.panel in functions, (route, view.panel)
        assert getattr(Explorer, view.method.__name__) is view.method, route


def test_model_and_dictionary_sources_are_resolved_where_they_live():
    from circuitgraph.adapters.dictionary_sources import DICTIONARY_SOURCES
    from circuitgraph.adapters.model_sources import MODEL_SOURCES
    from circuitgraph.spec.model import ModelSource, TranscoderSource

    assert set(MODEL_SOURCES) == set(get_args(ModelSource))
    assert set(DICTIONARY_SOURCES) == set(get_args(TranscoderSource))
    inputs = (Path(__file__).resolve().parents[1] / "circuitgraph" / "pipeline" / "inputs.py").read_text()
    assert "adapter.source[" not in inputs  # the adapter records its own source


def test_the_graph_methods_are_exports_registered_by_circuitgraph_export():
    """The graph imports nothing from export: its file methods are the functions
    ``circuitgraph.export`` registers when imported; before that they say so (and a notebook falls
    back to ``repr``)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from circuitgraph.errors import CircuitGraphError\n"
        "from circuitgraph.graph.graph import GRAPH_EXPORTS, AttributionGraph\n"
        "g = AttributionGraph(nodes=[], edge_target=np.zeros(0, np.int32), edge_source=np.zeros(0, np.int32),\n"
        "                     edge_weight=np.zeros(0), targets=[], metadata={})\n"
        "assert 'circuitgraph.export' not in sys.modules and not GRAPH_EXPORTS\n"
        "assert g._repr_html_() is None\n"
        "try:\n"
        "    g.to_dot()\n"
        "    raise SystemExit('no error')\n"
        "except CircuitGraphError as exc:\n"
        "    assert 'import circuitgraph.export' in str(exc), exc\n"
        "import circuitgraph.export as ex\n"
        "assert GRAPH_EXPORTS['to_json'] is ex.graph_to_json and GRAPH_EXPORTS['render'] is ex.render_graph\n"
        "assert g.to_dot() == ex.graph_to_dot(g)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
