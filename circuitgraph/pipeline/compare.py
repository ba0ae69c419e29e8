"""``circuitgraph.diff``: compare two graphs given as objects, graph files or dataset folders.

A source is an :class:`~circuitgraph.graph.graph.AttributionGraph` (a dataset aggregate
included), a graph file written by circuitgraph (``.json``, ``.npz``), a dataset run's output
folder (its aggregate, :meth:`~circuitgraph.datasets.store.Dataset.graph`), or a file inside one
(``aggregate.json``, ``nodes.parquet``, ``edges.parquet``).  The comparison itself is
:func:`circuitgraph.queries.diff.diff_graphs`.
"""

from __future__ import annotations

import os
from pathlib import Path

from circuitgraph.datasets.store import Dataset, open_dataset
from circuitgraph.errors import LoadError
from circuitgraph.export.html import read_graph_file
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.queries.diff import GraphDiff, Match, diff_graphs

__all__ = ["diff", "load_comparable"]

_AGGREGATE_FILES = ("aggregate.json", "nodes.parquet", "edges.parquet")


#: what :func:`diff` compares: a graph, an open dataset, or the path of a graph file or dataset folder
Comparable = AttributionGraph | Dataset | str | os.PathLike[str]


def load_comparable(source: Comparable) -> tuple[AttributionGraph, str]:
    """``(graph, name)`` of a source (see the module docstring)."""
    if isinstance(source, AttributionGraph):
        prompt = source.metadata.prompt
        return source, prompt if prompt is not None else "graph"
    if isinstance(source, Dataset):
        return source.graph(), str(getattr(source, "directory", "dataset"))
    path = Path(source)
    if path.is_file() and path.name in _AGGREGATE_FILES:
        path = path.parent
    if path.is_dir():
        return open_dataset(path).graph(), f"dataset {path.name}"
    if not path.is_file():
        raise LoadError(f"{path}: no such graph file or dataset folder; give a graph file (.json/.npz) written by "
                        "circuitgraph or a dataset run's output folder")
    graph = read_graph_file(path).graph
    return graph, f"{path.name}: {graph.metadata.prompt or ''}".rstrip(": ")


def diff(a: Comparable, b: Comparable, *, match: Match = "position", allow_different: bool = False) -> GraphDiff:
    """Compare ``a`` with ``b`` (graphs, graph files or dataset folders): matched nodes with their
    signed effect on the targets, influence and activation in both, edges with their weight in both
    and the difference, sign flips flagged, what is only in one, and the top changes by the size of
    the signed change ``|effect_b - effect_a|``
    (:class:`~circuitgraph.queries.diff.GraphDiff`).  Graphs of different models or dictionaries are
    refused unless ``allow_different``.  ``match``: ``position``, ``identity`` (position-free, as
    dataset aggregation) or ``from_end`` (positions counted from the prompt's end).

    >>> d = circuitgraph.diff("out/clean.json", "out/corrupted.json")   # doctest: +SKIP
    >>> d.top_changes(5); d.to_json("out/diff.json")                      # doctest: +SKIP
    """
    ga, name_a = load_comparable(a)
    gb, name_b = load_comparable(b)
    return diff_graphs(ga, gb, match=match, allow_different=allow_different, names=(name_a, name_b))
