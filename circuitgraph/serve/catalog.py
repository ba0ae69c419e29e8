"""What the explorer serves: the graph files, dataset runs and features folders under one path.

``PATH`` may be a graph file (``.json`` in our format, or the binary ``.npz``), a dataset run's
folder (``export: {dataset: DIR}``: its aggregate, its manifest and every prompt's graph), a
features folder (``features.parquet``), or a folder holding any of them (searched
:data:`MAX_DEPTH` folders deep).  Everything is found once, when the catalog is made, and
named by its path relative to ``PATH`` (``demo/graph.json``; a dataset's aggregate is
``<run>/aggregate``): the API only ever opens what the catalog lists, so a request can name
nothing outside ``PATH``.  Symbolic links that point outside ``PATH`` are skipped.
Graphs are read on first use and kept.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitgraph.datasets.store import open_dataset
from circuitgraph.errors import LoadError
from circuitgraph.export.graph_files import is_graph_file, read_graph_file
from circuitgraph.export.json_graph import GraphDocument
from circuitgraph.serve.dashboards import FeatureDashboards, folder_units, is_features_folder

__all__ = ["Catalog", "GraphEntry", "DatasetEntry", "MAX_DEPTH", "inside", "is_dataset_folder"]

#: how many folders deep a folder of sources is searched
MAX_DEPTH = 6
#: at most this many sources are listed (a folder with more is cut, and says so)
MAX_SOURCES = 5000


def inside(path: Path, root: Path) -> bool:
    """``path``, with every symbolic link resolved, lies in ``root`` (itself resolved)."""
    try:
        path.resolve(strict=True).relative_to(root)
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def is_dataset_folder(path: Path) -> bool:
    """A finished dataset run: ``manifest.parquet`` and ``aggregate.json``."""
    return path.is_dir() and (path / "manifest.parquet").is_file() and (path / "aggregate.json").is_file()


@dataclass
class GraphEntry:
    """One graph the explorer can show."""

    name: str
    kind: str  # "graph", "aggregate" or "prompt"
    path: Path
    dataset: str | None = None
    row_id: str | None = None

    def info(self, root_dir: Path) -> dict[str, Any]:
        """What ``GET /api/graphs`` lists: the name, kind, dataset and row, and ``file``, the
        graph file's path under the served folder (``/files/<file>``; None for an aggregate)."""
        file = None if self.kind == "aggregate" else self.path.relative_to(root_dir).as_posix()
        return {"name": self.name, "kind": self.kind, "dataset": self.dataset, "row_id": self.row_id, "file": file}


@dataclass
class DatasetEntry:
    """A dataset run: its folder and the names of its prompts' graphs by row id."""

    name: str
    path: Path
    prompt_graphs: dict[str, str] = field(default_factory=dict)


class Catalog:
    """Everything under ``root`` the explorer serves (see the module docstring).

    ``features``: extra features folders to use (e.g. ``serve graph.json --features DIR``); they are
    read through the API only, never served as files."""

    def __init__(self, root: str | os.PathLike[str], *, features: list[str | os.PathLike[str]] = ()):
        given = Path(root)
        if not given.exists():
            raise LoadError(f"{os.fspath(given)!r} does not exist; give a graph file, a dataset run's folder, a "
                            "features folder or a folder of them")
        self.root = given.resolve()
        self.root_dir = self.root if self.root.is_dir() else self.root.parent
        self.graphs: dict[str, GraphEntry] = {}
        self.datasets: dict[str, DatasetEntry] = {}
        self.features: dict[str, Path] = {}
        self.truncated = False
        self._docs: dict[str, GraphDocument] = {}
        self._dashboards: dict[str, FeatureDashboards] = {}
        self._dashboard_errors: dict[str, LoadError] = {}
        self._lock = threading.RLock()
        if self.root.is_file():
            if not is_graph_file(self.root):
                raise LoadError(f"{os.fspath(given)!r} is not a circuitgraph graph file (.json written by "
                                "circuitgraph, or .npz); give a graph file or a folder")
            self._add_graph(self.root.name, "graph", self.root)
        else:
            self._scan(self.root, 0)
        for extra in features:
            path = Path(extra).resolve()
            if not is_features_folder(path):
                raise LoadError(f"--features {os.fspath(extra)!r} is not a features folder (no features.parquet)")
            self.features.setdefault(path.name if path.name not in self.features else os.fspath(path), path)
        if not self.graphs and not self.features:
            raise LoadError(f"{os.fspath(given)!r} holds no graph file, dataset run or features folder")

    # ------------------------------------------------------------------ discovery
    def _rel(self, path: Path) -> str:
        rel = path.relative_to(self.root_dir).as_posix()
        return rel if rel != "." else path.name

    def _full(self) -> bool:
        if len(self.graphs) + len(self.features) >= MAX_SOURCES:
            self.truncated = True
        return self.truncated

    def _add_graph(self, name: str, kind: str, path: Path, **extra: Any) -> None:
        if not self._full():
            self.graphs[name] = GraphEntry(name, kind, path, **extra)

    def _scan(self, folder: Path, depth: int) -> None:
        if self._full():
            return
        if is_features_folder(folder):
            self.features[self._rel(folder)] = folder
            return
        if is_dataset_folder(folder):
            self._add_dataset(folder)
            return
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith(".") or not inside(path, self.root):
                continue
            if entry.is_dir():
                if depth < MAX_DEPTH:
                    self._scan(path, depth + 1)
            elif entry.is_file() and is_graph_file(path):
                self._add_graph(self._rel(path), "graph", path)

    def _add_dataset(self, folder: Path) -> None:
        name = self._rel(folder)
        entry = DatasetEntry(name, folder)
        self.datasets[name] = entry
        self._add_graph(f"{name}/aggregate", "aggregate", folder, dataset=name)
        graphs = folder / "graphs"
        if graphs.is_dir():
            for path in sorted(graphs.iterdir()):
                if path.suffix.lower() in (".npz", ".json") and path.is_file() and inside(path, self.root):
                    gname = self._rel(path)
                    entry.prompt_graphs[path.stem] = gname
                    self._add_graph(gname, "prompt", path, dataset=name, row_id=path.stem)

    # ------------------------------------------------------------------ loading
    def document(self, name: str) -> GraphDocument:
        """The graph ``name`` (read on first use); KeyError if the catalog has no such graph."""
        entry = self.graphs[name]
        with self._lock:
            doc = self._docs.get(name)
            if doc is None:
                doc = self._read(entry)
                self._docs[name] = doc
            return doc

    def _read(self, entry: GraphEntry) -> GraphDocument:
        if entry.kind == "aggregate":
            return GraphDocument(open_dataset(entry.path).graph())
        return read_graph_file(entry.path)  # the one graph-file opener (by suffix)

    def dashboards(self, name: str | None = None) -> FeatureDashboards | None:
        """The features folder ``name`` (default: the first), read on first use; None if there is none."""
        if not self.features:
            return None
        key = name if name is not None else next(iter(self.features))
        path = self.features[key]
        with self._lock:
            if key in self._dashboard_errors:
                raise self._dashboard_errors[key]
            if key not in self._dashboards:
                try:
                    self._dashboards[key] = FeatureDashboards.open(path)
                except LoadError as exc:  # kept: a broken folder is not read again at every request
                    self._dashboard_errors[key] = exc
                    raise
            return self._dashboards[key]

    def dashboards_for(self, units: str) -> FeatureDashboards | None:
        """The first features folder whose rows are ``units`` (``features``, ``neurons`` or
        ``heads``: a graph node's dashboards), read on first use; None if there is none."""
        for key, path in self.features.items():
            if folder_units(path) == units:
                return self.dashboards(key)
        return None
