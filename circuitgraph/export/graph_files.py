"""The one graph-file opener: a graph file is read by its suffix (case-insensitive), ``.npz``
as the binary format (:mod:`~circuitgraph.export.binary`), anything else as our JSON
(:mod:`~circuitgraph.export.json_graph`, which also takes the JSON text itself)."""

from __future__ import annotations

import os
from pathlib import Path

from circuitgraph.export.binary import read_graph_binary
from circuitgraph.export.json_graph import GraphDocument, read_graph_json
from circuitgraph.graph.graph import AttributionGraph

__all__ = ["read_graph_file", "load_graph", "BINARY_SUFFIX"]

#: the binary graph format's suffix (any case)
BINARY_SUFFIX = ".npz"


def read_graph_file(path: str | os.PathLike[str]) -> GraphDocument:
    """A graph file with its stored query and validation results: ``.npz`` (binary) or JSON."""
    if Path(path).suffix.lower() == BINARY_SUFFIX:
        return read_graph_binary(path)
    return read_graph_json(path)


def load_graph(path: str | os.PathLike[str]) -> AttributionGraph:
    """Load a graph written by ``export: {json: ...}`` (``.json``) or ``export: {graph: ...}`` (``.npz``)."""
    return read_graph_file(path).graph
