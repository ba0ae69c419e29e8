"""Graphs are shared: they must not reveal the folders of the machine that made them.

Every path a run records (the spec's ``model.path``, ``transcoders.path``, export paths,
direction files, heat maps; the model's and transcoders' ``source``) is written relative to
the spec file's folder when it lies inside it, and as its bare name otherwise.  The graph
still says which model and which transcoders it came from (names, architecture, sizes),
but not where a user keeps their files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["portable_paths", "PATH_KEYS"]

#: keys whose string values are file system paths
PATH_KEYS = frozenset({"path", "file", "json", "dot", "svg", "png", "neuronpedia", "graph", "html", "heatmap",
                       "source", "labels", "reference_file", "features", "from_graph"})


def _portable(text: str, base: Path | None) -> str:
    if not os.path.isabs(text) or len(text) < 2:
        return text
    path = Path(os.path.normpath(text))
    if base is not None:
        try:
            return path.relative_to(base).as_posix() or "."
        except ValueError:
            pass
    return path.name


def portable_paths(value: Any, base: str | os.PathLike[str] | None, *, _key: str | None = None) -> Any:
    """A copy of ``value`` (dicts, lists, strings) with every absolute path under a path key
    made relative to ``base`` (when inside it) or reduced to its name (when outside).

    >>> portable_paths({"model": {"path": "/srv/ann/specs/m"}, "prompt": "/"}, "/srv/ann/specs")
    {'model': {'path': 'm'}, 'prompt': '/'}
    >>> portable_paths({"source": {"path": "/data/models/gpt2-small"}}, "/srv/ann/specs")
    {'source': {'path': 'gpt2-small'}}
    """
    base_path = Path(os.path.normpath(os.fspath(base))) if base is not None else None
    if isinstance(value, dict):
        return {k: portable_paths(v, base_path, _key=k if isinstance(k, str) else None) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable_paths(v, base_path, _key=_key) for v in value]
    if isinstance(value, str) and _key in PATH_KEYS:
        return _portable(value, base_path)
    return value
