"""The binary graph format: one ``.npz`` (edge arrays in their dtype + the JSON format's header).

Lossless like the JSON format (:mod:`circuitgraph.export.json_graph`, whose header fields it
shares): loading gives back the same nodes, edges (same order, same dtype), targets, metadata
and results. No edge limit and no pickling; meant for graphs too large for JSON.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Mapping, Sequence

import numpy as np

from circuitgraph._io import atomic_writer
from circuitgraph._json import jsonable
from circuitgraph.errors import LoadError
from circuitgraph.export.json_graph import (
    GraphDocument,
    _brief,
    _check_format,
    _dumps,
    _header,
    _max_dense_nodes,
    _metadata_from_header,
    _no_constant,
    _nodes_from_header,
    _results,
    _targets_from_header,
    check_graph_file,
)
from circuitgraph.graph.graph import AttributionGraph

__all__ = ["BINARY_FORMAT", "save_graph_binary", "read_graph_binary", "load_graph_binary"]

BINARY_FORMAT = "circuitgraph.graph.npz"


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
            header = json.loads(archive["header"].tobytes().decode("utf-8"), parse_constant=_no_constant)
            src, tgt, w = archive["edge_source"], archive["edge_target"], archive["edge_weight"]
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LoadError(f"{os.fspath(path)!r}: the graph header is not valid JSON: {exc}") from None
        except (OSError, ValueError, RecursionError, EOFError, zipfile.BadZipFile) as exc:
            raise LoadError(f"{os.fspath(path)!r} is not a readable circuitgraph .npz graph: {_brief(exc, 200)}") from None
        if not isinstance(header, Mapping):
            raise LoadError(f"{os.fspath(path)!r}: the graph header must be a JSON object")
        _check_format(header, BINARY_FORMAT)
        nodes, index, dtype = _nodes_from_header(header)
    if str(w.dtype) != str(dtype):
        raise LoadError(f"{os.fspath(path)!r}: edge_weight is {w.dtype}, the header says {dtype}")
    if not (src.shape == tgt.shape == w.shape and src.ndim == 1):
        raise LoadError(f"{os.fspath(path)!r}: edge arrays have different shapes {src.shape}, {tgt.shape}, {w.shape}")
    for name, rows in (("edge_source", src), ("edge_target", tgt)):
        if rows.size and (rows.min() < 0 or rows.max() >= len(nodes)):
            raise LoadError(f"{os.fspath(path)!r}: {name} has rows outside 0..{len(nodes) - 1}")
        if rows.dtype.kind not in "iu":
            raise LoadError(f"{os.fspath(path)!r}: {name} holds {rows.dtype}, expected integers")
    if w.size and not np.isfinite(w).all():
        raise LoadError(f"{os.fspath(path)!r}: edge_weight holds NaN or inf; a graph holds finite numbers only")
    graph = AttributionGraph(
        nodes=nodes,
        edge_target=tgt,
        edge_source=src,
        edge_weight=w,
        targets=_targets_from_header(header, index),
        metadata=_metadata_from_header(header),
        max_dense_nodes=_max_dense_nodes(header),
    )
    return GraphDocument(graph, _results(header, "queries"), _results(header, "validation"),
                         int(header["format_version"]), _results(header, "steering"))


def load_graph_binary(path: str | os.PathLike[str]) -> AttributionGraph:
    """Load a graph written by :func:`save_graph_binary`."""
    return read_graph_binary(path).graph
