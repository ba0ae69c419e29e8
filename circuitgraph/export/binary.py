"""The binary graph format: one ``.npz`` (edge arrays in their dtype + the JSON format's header).

Lossless like the JSON format (:mod:`circuitgraph.export.json_graph`, whose header fields it
shares): loading gives back the same nodes, edges (same order, same dtype), targets, metadata
and results. No edge limit and no pickling; meant for graphs too large for JSON.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from circuitgraph._io import atomic_writer
from circuitgraph._json import jsonable
from circuitgraph.errors import LoadError
from circuitgraph.export.graph_model import BINARY_FORMAT, BinaryGraphHeader, _brief, validate_graph_file
from circuitgraph.export.json_graph import (
    GraphDocument,
    _dumps,
    _header,
    check_graph_file,
    document_of,
    linearised_edges_of,
    nodes_of,
    targets_of,
)
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.metadata import GraphMetadata

__all__ = ["BINARY_FORMAT", "save_graph_binary", "read_graph_binary", "load_graph_binary"]


def save_graph_binary(
    graph: AttributionGraph,
    path: str | os.PathLike[str],
    *,
    queries: Sequence[Mapping[str, Any]] | None = None,
    validation: Sequence[Mapping[str, Any]] | None = None,
    compressed: bool = False,
    steering: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Write ``graph`` as one ``.npz`` file: edge arrays in their dtype + a JSON header.

    The archive holds ``edge_source`` and ``edge_target`` (int64 rows into the node
    table), ``edge_weight`` (the stored dtype) and ``header`` (UTF-8 JSON bytes as a
    uint8 array) with the same ``nodes``, ``targets``, ``metadata``, ``queries`` and
    ``validation`` fields as the JSON format (and ``steering`` when given).  No edge limit; no
    pickling.  Returns the path written.
    """
    header = _header(graph, queries, validation)
    if steering is not None:
        header["steering"] = jsonable(list(steering), "steering")
    header["format"] = BINARY_FORMAT
    header_bytes = _dumps(header, None).encode("utf-8")
    arrays = {
        "header": np.frombuffer(header_bytes, dtype=np.uint8),
        "edge_source": np.ascontiguousarray(graph.edge_source, dtype=np.int64),
        "edge_target": np.ascontiguousarray(graph.edge_target, dtype=np.int64),
        "edge_weight": np.ascontiguousarray(graph.edge_weight),
    }
    saver = np.savez_compressed if compressed else np.savez
    with atomic_writer(path) as handle:
        saver(handle, **arrays)
    return str(path)


def read_graph_binary(path: str | os.PathLike[str]) -> GraphDocument:
    """Read a ``.npz`` graph written by :func:`save_graph_binary`, with its results."""
    check_graph_file(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise LoadError(f"graph file {os.fspath(path)!r} does not exist") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise LoadError(f"{os.fspath(path)!r} is not a circuitgraph .npz graph: {_brief(exc, 200)}") from None
    with archive:
        missing = {"header", "edge_source", "edge_target", "edge_weight"} - set(archive.files)
        if missing:
            raise LoadError(f"{os.fspath(path)!r} is not a circuitgraph .npz graph: missing {sorted(missing)}")
        try:
            header_bytes = archive["header"].tobytes()
            src, tgt, w = archive["edge_source"], archive["edge_target"], archive["edge_weight"]
        except (OSError, ValueError, RecursionError, EOFError, zipfile.BadZipFile) as exc:
            raise LoadError(f"{os.fspath(path)!r} is not a readable circuitgraph .npz graph: {_brief(exc, 200)}") from None
    where = f"graph file {os.fspath(path)!r}"
    try:
        header_text = header_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LoadError(f"{where}: the graph header is not UTF-8: {exc}") from None
    header = validate_graph_file(header_text, BinaryGraphHeader, where=f"{where} (its header)")
    nodes, index = nodes_of(header, where)
    dtype = np.dtype(header.edge_dtype)
    if str(w.dtype) != str(dtype):
        raise LoadError(f"{os.fspath(path)!r}: edge_weight is {w.dtype}, the header says {dtype}")
    if not (src.shape == tgt.shape == w.shape and src.ndim == 1):
        raise LoadError(f"{os.fspath(path)!r}: edge arrays have different shapes {src.shape}, {tgt.shape}, {w.shape}")
    for name, rows in (("edge_source", src), ("edge_target", tgt)):
        if rows.dtype.kind not in "iu":
            raise LoadError(f"{os.fspath(path)!r}: {name} holds {rows.dtype}, expected integers")
        if rows.size and (rows.min() < 0 or rows.max() >= len(nodes)):
            raise LoadError(f"{os.fspath(path)!r}: {name} has rows outside 0..{len(nodes) - 1}")
    if w.size and not np.isfinite(w).all():
        raise LoadError(f"{os.fspath(path)!r}: edge_weight holds NaN or inf; a graph holds finite numbers only")
    metadata = GraphMetadata(header.metadata)
    graph = AttributionGraph(
        nodes=nodes,
        edge_target=tgt,
        edge_source=src,
        edge_weight=w,
        targets=targets_of(header, index, where),
        metadata=metadata,
        max_dense_nodes=metadata.max_dense_nodes,
        linearised_edges=linearised_edges_of(header, index, nodes, where),
    )
    return document_of(header, graph)


def load_graph_binary(path: str | os.PathLike[str]) -> AttributionGraph:
    """Load a graph written by :func:`save_graph_binary`."""
    return read_graph_binary(path).graph
