"""What the fuzz tests of documents share: every path into a JSON-like document, and a copy of
a document with hypothesis's edits applied (``tests/test_bad_input.py`` on specs,
``tests/test_graph_files.py`` on graph files)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

Path = tuple[Any, ...]


def document_paths(doc: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path into ``doc`` (dict keys and list indices), the root ``()`` first."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from document_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from document_paths(v, (*prefix, i))


def edited(doc: Any, edits: Iterable[tuple[Path, Any, bool]]) -> Any:
    """A deep copy of ``doc`` with each ``(path, value, delete)`` applied in order: the value
    at ``path`` deleted or replaced; an edit whose path an earlier edit removed is skipped."""
    out = copy.deepcopy(doc)
    for path, value, delete in edits:
        node = out
        try:
            for part in path[:-1]:
                node = node[part]
            if delete:
                del node[path[-1]]
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    return out
