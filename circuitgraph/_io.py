"""Safe file I/O: atomic writes, and checked reads of files that may be hostile.

**Writes**: a file is either written completely or not at all.

Every writer in circuitgraph goes through these helpers so that bad input, a full disk
or an interrupted run never leaves a partial file behind.  The data goes to a temporary
file in the destination's own directory (so the final :func:`os.replace` is a rename on
one filesystem), is flushed and fsync'ed, and only then replaces the destination.  On
any exception the temporary file is removed and the destination is left untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from circuitgraph.errors import LoadError, one_line

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_writer", "read_text_file", "read_json_file", "read_yaml_file", "safetensors_header",
           "safetensors_shapes", "MAX_JSON_BYTES", "ParquetFrames"]

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


# ------------------------------------------------------------------ checked reads
#: small JSON files (configs, tokenizer configs) larger than this are refused
MAX_JSON_BYTES = 64 << 20
#: the largest safetensors header accepted (the format's own limit is 100 MB)
MAX_HEADER_BYTES = 100_000_000

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def _regular_file(path: Path, max_bytes: int, what: str) -> int:
    """The size of ``path``, which must be a regular file of at most ``max_bytes``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LoadError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise LoadError(f"cannot read {what} {path}: {exc.strerror or one_line(exc, limit=200, typed=False)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise LoadError(f"{what} {path} is not a regular file; give a file")
    if st.st_size > max_bytes:
        raise LoadError(f"{what} {path} is {st.st_size:,} bytes, more than the {max_bytes:,} a {what} may have")
    return st.st_size


def read_text_file(path: str | os.PathLike[str], what: str = "text file", max_bytes: int = MAX_JSON_BYTES,
                   *, kind: str = "") -> str:
    """The text of a UTF-8 file that must be a regular file of at most ``max_bytes``; any problem
    is one LoadError naming the file (``kind``: what to save it as, e.g. ``" JSON"``).  The
    readers of JSON and YAML files below read through it."""
    path = Path(path)
    _regular_file(path, max_bytes, what)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LoadError(f"cannot read {what} {path}: {exc.strerror or one_line(exc, limit=200, typed=False)}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LoadError(f"{what} {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8{kind}") from None


def read_json_file(path: str | os.PathLike[str], what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse a UTF-8 JSON file; any problem is one LoadError naming the file."""
    path = Path(path)
    text = read_text_file(path, what, max_bytes, kind=" JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise LoadError(f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (RecursionError, ValueError) as exc:
        raise LoadError(f"{what} {path} is not usable JSON ({type(exc).__name__}: {one_line(exc, limit=200, typed=False)})") from None


def read_yaml_file(path: str | os.PathLike[str], what: str = "YAML file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse a UTF-8 YAML file (``yaml.safe_load``) with :func:`read_json_file`'s checks (a regular
    file, a size limit, UTF-8); any problem is one LoadError naming the file."""
    path = Path(path)
    text = read_text_file(path, what, max_bytes)
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise LoadError(f"{path}: not valid YAML ({type(exc).__name__}: {first}); fix the file") from None


def safetensors_header(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The tensor table of a safetensors file, checked against the file (nothing else is read).

    Returns ``{name: {"dtype", "shape", "data_offsets"}}``.  A truncated file, a garbage
    header, offsets outside the file, or shapes that do not match their byte counts are a
    LoadError, so a loader that trusts the table cannot over-read or over-allocate.
    """
    path = Path(path)
    size = _regular_file(path, 1 << 50, "safetensors file")
    fix = "re-save it with safetensors.torch.save_file"

    def bad(why: str) -> LoadError:
        return LoadError(f"{path} is not a valid safetensors file: {why}; {fix}")

    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise bad(f"it is only {size} bytes long")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise bad(f"its header claims {n:,} bytes, the file has {size - 8:,} after the length")
            raw = fh.read(n)
    except OSError as exc:
        raise LoadError(f"cannot read {path}: {exc.strerror or one_line(exc, limit=200, typed=False)}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    data_bytes = size - 8 - n
    out: dict[str, dict[str, Any]] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(meta, dict):
            raise bad(f"tensor {name!r} has no dtype/shape/data_offsets")
        dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if dtype not in _DTYPE_BYTES:
            raise bad(f"tensor {name!r} has dtype {dtype!r}")
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape)):
            raise bad(f"tensor {name!r} has shape {str(shape)[:60]}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise bad(f"tensor {name!r} has data_offsets {str(offsets)[:60]} outside the {data_bytes:,} data bytes "
                      "(is the file truncated?)")
        numel = 1
        for d in shape:
            numel *= d
        if numel * _DTYPE_BYTES[dtype] != offsets[1] - offsets[0]:
            raise bad(f"tensor {name!r} of shape {shape} ({dtype}) needs {numel * _DTYPE_BYTES[dtype]:,} bytes, "
                      f"its offsets span {offsets[1] - offsets[0]:,}")
        out[name] = {"dtype": dtype, "shape": tuple(shape), "data_offsets": tuple(offsets)}
    return out


def safetensors_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of a safetensors file (see :func:`safetensors_header`)."""
    return {k: v["shape"] for k, v in safetensors_header(path).items()}


class ParquetFrames:
    """The Parquet tables of an output folder (a dataset run's, a features run's) as pandas
    DataFrames, each read once, on first use: ``frames["nodes"]`` is ``<directory>/nodes.parquet``.
    Needs pyarrow (the ``dataset`` extra)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._read: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._read:
            import pyarrow.parquet as pq

            self._read[name] = pq.read_table(self.directory / f"{name}.parquet").to_pandas()
        return self._read[name]
