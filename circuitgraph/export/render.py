"""Render DOT text to SVG/PNG/PDF with the Graphviz ``dot`` binary.

Text generation lives in :mod:`circuitgraph.export.dot` and needs nothing installed;
only this module runs the binary.  The DOT text goes to ``dot`` on stdin, the image
comes back on stdout and is written atomically, so a failed render leaves no file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from circuitgraph._io import atomic_write_bytes
from circuitgraph.errors import RenderError
from circuitgraph.export.dot import graph_to_dot
from circuitgraph.graph.graph import AttributionGraph

__all__ = ["RENDER_FORMATS", "find_dot", "render_dot_text", "render_graph"]

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


def render_dot_text(
    dot_text: str,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    timeout: float = 300.0,
) -> str:
    """Render ``dot_text`` to ``path``; ``format`` defaults to the path's suffix (.svg/.png/.pdf).

    Returns the path written.  Raises :class:`RenderError` if the format is unknown, the
    ``dot`` binary is missing, fails or runs past ``timeout`` seconds (nothing is written then).
    """
    fmt = _format_of(path, format)
    binary = find_dot()
    try:
        done = subprocess.run(
            [binary, f"-T{fmt}"],
            input=dot_text.encode("utf-8"),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RenderError(
            f"Graphviz dot ran past {timeout:g} s; draw fewer nodes (export.max_render_nodes in a spec, --max-nodes "
            "for circuitgraph render, max_nodes= in Python) or raise timeout="
        ) from None
    except OSError as exc:
        raise RenderError(f"cannot run Graphviz dot at {binary!r}: {exc}") from None
    if done.returncode != 0 or not done.stdout:
        message = done.stderr.decode("utf-8", "replace").strip()[-2000:] or "no output"
        raise RenderError(f"Graphviz dot failed (exit status {done.returncode}): {message}")
    atomic_write_bytes(path, done.stdout)
    return os.fspath(path)


def render_graph(
    graph: AttributionGraph,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    max_nodes: int | None = 100,
    timeout: float = 300.0,
    **dot_kwargs: Any,
) -> str:
    """Draw ``graph`` (see :func:`circuitgraph.export.dot.graph_to_dot`) and render it to ``path``.

    ``dot_kwargs`` go to :func:`graph_to_dot` (``min_edge_fraction``, ``title``).  Returns
    the path written.  The format is checked and the binary located before any work.
    """
    _format_of(path, format)
    find_dot()
    return render_dot_text(graph_to_dot(graph, max_nodes=max_nodes, **dot_kwargs), path,
                           format=format, timeout=timeout)


def _format_of(path: str | os.PathLike[str], format: str | None) -> str:
    fmt = (format or Path(path).suffix.lstrip(".")).lower()
    if fmt not in RENDER_FORMATS:
        got = f"format {format!r}" if format else f"the suffix of {os.fspath(path)!r}"
        raise RenderError(
            f"cannot render to {got}; use one of {', '.join('.' + f for f in RENDER_FORMATS)} "
            "(or pass format=)"
        )
    return fmt
