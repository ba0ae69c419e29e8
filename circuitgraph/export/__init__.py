"""Export an attribution graph: our JSON schema, a binary .npz, Neuronpedia JSON, DOT text, images.

Every writer is atomic (a failure leaves no partial file); formats are documented in
docs/export.md.  Importing this package registers its functions behind the graph's methods
(``graph.to_json()``, ``AttributionGraph.from_json()``, ``graph.to_dot()``, ``graph.render()``,
the notebook views: :func:`circuitgraph.graph.graph.register_graph_exports`).
"""

from circuitgraph.export.binary import load_graph_binary, read_graph_binary, save_graph_binary
from circuitgraph.export.dot import graph_to_dot
from circuitgraph.export.graph_schema import graph_json_schema
from circuitgraph.export.html import graph_html, graph_svg
from circuitgraph.export.json_graph import GraphDocument, graph_from_json, graph_to_json, read_graph_json
from circuitgraph.export.neuronpedia import graph_to_neuronpedia
from circuitgraph.export.render import render_dot_text, render_graph
from circuitgraph.graph.graph import register_graph_exports

#: the graph's file and display methods (``graph.to_json()``...) call these free functions
register_graph_exports(to_json=graph_to_json, from_json=graph_from_json, to_dot=graph_to_dot, render=render_graph,
                       html=graph_html, svg=graph_svg)

__all__ = [
    "GraphDocument",
    "graph_to_json",
    "graph_from_json",
    "read_graph_json",
    "save_graph_binary",
    "load_graph_binary",
    "read_graph_binary",
    "graph_json_schema",
    "graph_to_neuronpedia",
    "graph_to_dot",
    "render_graph",
    "render_dot_text",
]
