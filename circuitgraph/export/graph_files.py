"""The one graph-file opener: a graph file is read by its suffix (case-insensitive), ``.npz``
as the binary format (:mod:`~circuitgraph.export.binary`), anything else as our JSON
(:mod:`~circuitgraph.export.json_graph`, which also takes the JSON text itself); and the one
"is this a graph file" test (:func:`is_graph_file`), by the name and the first bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from circuitgraph.export.binary import read_graph_binary
from circuitgraph.export.graph_model import FORMAT
from circuitgraph.export.json_graph import GraphDocument, read_graph_json
from circuitgraph.graph.graph import AttributionGraph

__all__ = ["read_graph_file", "load_graph", "is_graph_file", "BINARY_SUFFIX"]

#: the binary graph format's suffix (any case)
BINARY_SUFFIX = ".npz"
#: the bytes of a .json file :func:`is_graph_file` reads
_SNIFF_BYTES = 256
#: the first key our JSON writer writes (keys sorted), and the format field, without whitespace
_FIRST_KEY = '{"edge_dtype"'
_FORMAT_FIELD = f'"format":{json.dumps(FORMAT)}'


def is_graph_file(path: str | os.PathLike[str]) -> bool:
    """A circuitgraph graph file (not a spec, not other JSON), by its name and first bytes: ``.npz``
    (any case), or a readable ``.json`` whose first :data:`_SNIFF_BYTES` bytes, whitespace removed,
    start with ``{"edge_dtype"`` (the writer sorts the keys) or name our ``format``.  Reads no
    more than those bytes (the explorer sniffs every file of a folder, the CLI a command's argument)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == BINARY_SUFFIX:
        return True
    if suffix != ".json" or not p.is_file():
        return False
    try:
        with open(p, "rb") as handle:
            head = handle.read(_SNIFF_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    compact = "".join(head.split())
    return compact.startswith(_FIRST_KEY) or _FORMAT_FIELD in compact


def read_graph_file(path: str | os.PathLike[str]) -> GraphDocument:
    """A graph file with its stored query and validation results: ``.npz`` (binary) or JSON."""
    if Path(path).suffix.lower() == BINARY_SUFFIX:
        return read_graph_binary(path)
    return read_graph_json(path)


def load_graph(path: str | os.PathLike[str]) -> AttributionGraph:
    """Load a graph written by ``export: {json: ...}`` (``.json``) or ``export: {graph: ...}`` (``.npz``)."""
    return read_graph_file(path).graph
