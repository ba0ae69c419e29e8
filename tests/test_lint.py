"""``ruff check`` (configured in pyproject.toml) passes on the package, the tests, the scripts,
the benchmarks and the examples.  Skipped where ruff is not installed (it is in the test extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    return [exe] if Path(exe).exists() else None


def test_ruff_check_passes():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install 'circuitgraph-lm[test]')")
    done = subprocess.run([*ruff, "check", "--no-cache", "circuitgraph", "tests", "scripts", "benchmarks", "examples"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
