"""Output folders of resumable runs (dataset runs, feature dashboards): a marker file records the
fingerprint of the spec and rows that wrote the folder, so a rerun of the same spec continues
where a killed one stopped and anything else is refused before a file is touched."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from circuitgraph._io import atomic_write_text, read_json_file
from circuitgraph.errors import DatasetError, LoadError

__all__ = ["claim_run_folder"]


def claim_run_folder(out: Path, marker: str, fingerprint: str, fmt: str, extra: Mapping[str, Any], *, key: str,
                     what: str, different: str, allowed: Iterable[str] = ()) -> bool:
    """Make ``out`` the folder of the run with ``fingerprint``; True when it already is (resume).

    A folder with ``marker`` of the same fingerprint is resumed (temporary files of a killed run's
    atomic writes are removed, never trusted); another fingerprint is refused with ``different``;
    a folder without the marker must be empty but for the names in ``allowed``. A new run's marker
    holds the format ``fmt`` (version 1), the fingerprint and ``extra``. ``key`` (the spec key) and ``what`` name the folder in the
    one-line errors."""
    path = out / marker
    if out.exists():
        if not out.is_dir():
            raise DatasetError(f"{key}: {out} is a file; give a folder")
        if path.is_file():
            try:
                previous = read_json_file(path, "dataset folder record").get("fingerprint")
            except (LoadError, AttributeError):
                previous = None
            if previous != fingerprint:
                raise DatasetError(f"{key}: {out} holds {different}; use a new folder, or delete this one to "
                                   "start again")
            for tmp in out.glob("**/.*.tmp"):  # left by a killed run's atomic writes; never trusted
                tmp.unlink(missing_ok=True)
            return True
        keep = set(allowed)
        if any(p.name not in keep for p in out.iterdir()):
            extra = f" (a {', '.join(sorted(keep))} alone is fine)" if keep else ""
            raise DatasetError(f"{key}: {out} is not empty and holds no {what} (no {marker}); give a new or empty "
                               f"folder{extra}")
    payload = {"format": fmt, "format_version": 1, "fingerprint": fingerprint, **extra}
    atomic_write_text(path, json.dumps(payload, indent=1) + "\n")
    return False
