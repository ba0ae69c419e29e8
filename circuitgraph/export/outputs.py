"""A run's exports as one transaction: all written or none, under a lock, never over a stranger's file.

:class:`OutputSet` is used by the pipeline around every export of a run:

1. **Checked first.**  Before any work, every output path is checked: not a folder, its
   folder creatable, and, if a file is already there, a file that circuitgraph wrote and
   that has not been changed since (see *ownership* below); anything else is refused
   unless ``force`` is set (``circuitgraph run --force``).
2. **Locked.**  While the exports are written, each output folder is locked
   (``flock`` on the folder itself, no lock files), so two runs writing the same paths
   cannot interleave their files; the second waits (up to ``lock_timeout`` seconds) and
   then writes its own complete set.
3. **Staged, then moved together.**  Each writer writes to a hidden staging file next to
   its destination.  Only when every export has been written are the staging files moved
   onto their destinations; if any writer fails, every staging file is removed and no
   destination changes.  If a move fails half-way, the destinations already replaced are
   restored from their backups.
4. **Stale files cleaned.**  Hidden ``.NAME.*.tmp`` files of these outputs left by a killed
   run (older than a minute) are removed when the folder is locked.

*Ownership*: each output folder holds a small manifest, ``.circuitgraph-outputs.json``,
with the size and modification time of every file circuitgraph wrote there.  A file whose
size and time still match was written by circuitgraph and not edited since; any other
existing file is someone else's, and is only replaced with ``force``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from circuitgraph._io import atomic_write_text, read_json_file
from circuitgraph.errors import ExportError, LoadError

__all__ = ["OutputSet", "MANIFEST_NAME", "owned_by_circuitgraph"]

#: the per-folder record of the files circuitgraph wrote
MANIFEST_NAME = ".circuitgraph-outputs.json"
#: hidden temporary files older than this (seconds) are from a killed run
STALE_AFTER = 60.0


def _manifest(folder: Path) -> dict[str, dict[str, int]]:
    try:
        data = read_json_file(folder / MANIFEST_NAME, "outputs record")
    except LoadError:
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def _stamp(path: Path) -> dict[str, int]:
    st = os.stat(path)
    return {"size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def owned_by_circuitgraph(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file circuitgraph wrote and nobody changed since."""
    path = Path(path)
    entry = _manifest(path.parent).get(path.name)
    try:
        return isinstance(entry, dict) and entry == _stamp(path)
    except OSError:
        return False


def _key(kind: str) -> str:
    """The spec key of an output: ``json`` -> ``export.json``; a full location is kept."""
    return kind if "." in kind else f"export.{kind}"


class OutputSet:
    """The files one run writes, written all together or not at all (see the module doc)."""

    def __init__(self, outputs: dict[str, Path], *, force: bool = False, lock_timeout: float = 120.0):
        self.outputs = {kind: Path(os.path.abspath(p)) for kind, p in outputs.items()}
        self.force = force
        self.lock_timeout = lock_timeout
        self._staged: dict[str, Path] = {}
        self._locks: list[int] = []

    # ----------------------------------------------------------------- checks
    def check(self) -> None:
        """Refuse, before any work, outputs that cannot or must not be written."""
        seen: dict[Path, str] = {}
        for kind, dest in self.outputs.items():
            if dest in seen:
                raise ExportError(f"{_key(kind)} and {_key(seen[dest])} are the same file {dest}; give each "
                                  "export its own file")
            seen[dest] = kind
            if dest.is_dir():
                raise ExportError(f"{_key(kind)}: {dest} is a folder; give a file path")
            parent = dest.parent
            existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
            if existing is not None and not existing.is_dir():
                raise ExportError(f"{_key(kind)}: cannot create the folder {parent}: {existing} is a file")
            if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
                raise ExportError(f"{_key(kind)}: cannot write in {existing} (permissions)")
            if (dest.exists() or dest.is_symlink()) and not self.force:
                if dest.is_symlink() or not dest.is_file():
                    raise ExportError(f"{_key(kind)}: {dest} exists and is not a regular file; remove it or "
                                      "choose another path")
                if not owned_by_circuitgraph(dest):
                    raise ExportError(
                        f"{_key(kind)}: {dest} exists and was not written by circuitgraph (or was changed since); "
                        "choose another path, remove it, or pass --force (force=True) to replace it"
                    )

    # ----------------------------------------------------------------- writing
    @contextlib.contextmanager
    def writing(self) -> Iterator[OutputSet]:
        """Lock the output folders, yield (writers call :meth:`stage`), then move all or none."""
        self.check()
        folders = sorted({dest.parent for dest in self.outputs.values()})
        try:
            for folder in folders:
                folder.mkdir(parents=True, exist_ok=True)
                self._locks.append(self._lock(folder))
                self._clean_stale(folder)
            self.check()  # another run may have written while we waited for the lock
            yield self
            self._commit()
        finally:
            for path in self._staged.values():
                with contextlib.suppress(OSError):
                    os.unlink(path)
            self._staged.clear()
            for fd in self._locks:
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing the descriptor releases the flock
            self._locks.clear()

    def stage(self, kind: str) -> Path:
        """The hidden file the writer of ``kind`` writes to (same folder and suffix as the destination)."""
        dest = self.outputs[kind]
        staged = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp{dest.suffix}")
        self._staged[kind] = staged
        return staged

    def _commit(self) -> None:
        missing = [kind for kind in self.outputs if kind not in self._staged or not self._staged[kind].is_file()]
        if missing:
            raise ExportError(f"internal: exports {missing} were not written")
        backups: dict[Path, Path] = {}
        moved: list[Path] = []
        try:
            for kind, staged in self._staged.items():
                dest = self.outputs[kind]
                if dest.exists():
                    backup = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp.bak")
                    os.replace(dest, backup)
                    backups[dest] = backup
                os.replace(staged, dest)
                moved.append(dest)
        except OSError as exc:
            for dest in moved:
                with contextlib.suppress(OSError):
                    os.unlink(dest)
            for dest, backup in backups.items():
                with contextlib.suppress(OSError):
                    os.replace(backup, dest)
            raise ExportError(f"could not move the exports into place ({exc}); no output was changed") from None
        for backup in backups.values():
            with contextlib.suppress(OSError):
                os.unlink(backup)
        self._staged.clear()
        self.record(moved)

    @staticmethod
    def record(written: list[Path]) -> None:
        """Note ``written`` (files circuitgraph just wrote) in their folders' manifests, so the next
        run may replace them."""
        written = [Path(os.path.abspath(p)) for p in written]
        by_folder: dict[Path, list[Path]] = {}
        for dest in written:
            by_folder.setdefault(dest.parent, []).append(dest)
        for folder, files in by_folder.items():
            entries = _manifest(folder)
            entries = {name: e for name, e in entries.items() if (folder / name).is_file()}
            for dest in files:
                entries[dest.name] = _stamp(dest)
            atomic_write_text(folder / MANIFEST_NAME, json.dumps(
                {"about": "files written by circuitgraph (size, mtime); a file listed here may be replaced "
                          "by the next run", "files": entries}, indent=1, sort_keys=True) + "\n")

    # ----------------------------------------------------------------- lock and cleanup
    def _lock(self, folder: Path) -> int:
        import fcntl

        fd = os.open(folder, os.O_RDONLY)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise ExportError(f"cannot lock the output folder {folder}: {exc}") from None
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise ExportError(
                        f"another circuitgraph run has been writing into {folder} for more than "
                        f"{self.lock_timeout:.0f} s; wait for it to finish or choose other export paths"
                    ) from None
                time.sleep(0.05)

    def _clean_stale(self, folder: Path) -> None:
        names = {dest.name for dest in self.outputs.values() if dest.parent == folder}
        now = time.time()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        prefixes = tuple(f"{n}." for n in names | {MANIFEST_NAME.lstrip(".")})
        for entry in entries:
            name = entry.name
            if not name.startswith(".") or ".tmp" not in name or not name.lstrip(".").startswith(prefixes):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if entry.is_file(follow_symlinks=False) and now - st.st_mtime > STALE_AFTER:
                    os.unlink(entry.path)
