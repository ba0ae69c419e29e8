"""Atomic file writes: a file is either written completely or not at all.

Every writer in circuitgraph goes through these helpers so that bad input, a full disk
or an interrupted run never leaves a partial file behind.  The data goes to a temporary
file in the destination's own directory (so the final :func:`os.replace` is a rename on
one filesystem), is flushed and fsync'ed, and only then replaces the destination.  On
any exception the temporary file is removed and the destination is left untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_writer"]

#: permissions of a newly created file (an existing destination keeps its own mode)
_NEW_FILE_MODE = 0o644


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a binary file object whose contents replace ``path`` only on success.

    Parent directories are created.  The yielded file is a temporary file next to
    ``path``; when the ``with`` block exits normally it is fsync'ed and renamed onto
    ``path``.  If the block raises, the temporary file is deleted and ``path`` is not
    touched.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_writer(d / "sub" / "x.bin") as f:
    ...     _ = f.write(b"abc")
    >>> (d / "sub" / "x.bin").read_bytes()
    b'abc'
    """
    dest = Path(path)
    parent = dest.parent if str(dest.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        try:
            mode = os.stat(dest).st_mode & 0o7777
        except FileNotFoundError:
            mode = _NEW_FILE_MODE
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path) as handle:
        handle.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically, encoded as ``encoding``, newlines untranslated."""
    atomic_write_bytes(path, text.encode(encoding))


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable where the platform allows it (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
