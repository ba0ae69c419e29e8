"""Render DOT text to SVG/PNG/PDF with the Graphviz ``dot`` binary.

Text generation lives in :mod:`circuitgraph.export.dot` and needs nothing installed;
only this module runs the binary.  The DOT text goes to ``dot`` on stdin, the image
comes back on stdout and is written atomically, so a failed render leaves no file.
"""

from __future__ import annotations

import os
import shutil
import subprocess  # graphviz raises subprocess.CalledProcessError
from pathlib import Path
from typing import Any

from circuitgraph._io import atomic_write_bytes
from circuitgraph.errors import RenderError
from circuitgraph.export.dot import DEFAULT_MAX_NODES, graph_to_dot
from circuitgraph.graph.graph import AttributionGraph

__all__ = ["RENDER_FORMATS", "find_dot", "render_dot_bytes", "render_dot_text", "render_graph"]

#: output formats render_graph / render_dot_text produce
RENDER_FORMATS = ("svg", "png", "pdf")
_MISSING_DOT = (
    "Graphviz 'dot' binary not found; install it with `apt-get install graphviz` (Debian/Ubuntu) "
    "or `brew install graphviz`"
)


def find_dot() -> str:
    """Path of the ``dot`` binary; :class:`RenderError` with install instructions if missing."""
    found = shutil.which("dot")
    if not found:
        raise RenderError(_MISSING_DOT)
    return found


def render_dot_bytes(dot_text: str, format: str) -> bytes:
    """Render ``dot_text`` with the ``graphviz`` package's ``pipe`` (the ``dot`` binary) and
    return the image bytes.  :class:`RenderError` if the binary is missing or fails."""
    import graphviz

    fmt = format.lower()
    find_dot()
    try:
        return graphviz.Source(dot_text).pipe(format=fmt, quiet=True)
    except graphviz.ExecutableNotFound:
        raise RenderError(_MISSING_DOT) from None
    except subprocess.CalledProcessError as exc:
        message = (exc.stderr or b"").decode("utf-8", "replace").strip()[-2000:] or "no output"
        raise RenderError(f"Graphviz dot failed (exit status {exc.returncode}): {message}") from None
    except OSError as exc:
        raise RenderError(f"cannot run Graphviz dot: {exc}") from None


def render_dot_text(
    dot_text: str,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
) -> str:
    """Render ``dot_text`` to ``path``; ``format`` defaults to the path's suffix (.svg/.png/.pdf).

    Returns the path written.  Raises :class:`RenderError` if the format is unknown, the
    ``dot`` binary is missing or fails (nothing is written then).
    Rendering goes through the ``graphviz`` package (:func:`render_dot_bytes`).
    """
    fmt = _format_of(path, format)
    data = render_dot_bytes(dot_text, fmt)
    if not data:
        raise RenderError("Graphviz dot failed: no output")
    atomic_write_bytes(path, data)
    return os.fspath(path)


def render_graph(
    graph: AttributionGraph,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    max_nodes: int | None = DEFAULT_MAX_NODES,
    **dot_kwargs: Any,
) -> str:
    """Draw ``graph`` (see :func:`circuitgraph.export.dot.graph_to_dot`) and render it to ``path``.

    ``dot_kwargs`` go to :func:`graph_to_dot` (``min_edge_fraction``, ``title``).  Returns
    the path written.  The format is checked and the binary located before any work.
    """
    _format_of(path, format)
    find_dot()
    return render_dot_text(graph_to_dot(graph, max_nodes=max_nodes, **dot_kwargs), path,
                           format=format)


def _format_of(path: str | os.PathLike[str], format: str | None) -> str:
    fmt = (format or Path(path).suffix.lstrip(".")).lower()
    if fmt not in RENDER_FORMATS:
        got = f"format {format!r}" if format else f"the suffix of {os.fspath(path)!r}"
        raise RenderError(
            f"cannot render to {got}; use one of {', '.join('.' + f for f in RENDER_FORMATS)} "
            "(or pass format=)"
        )
    return fmt
