"""pyright (basic mode) over the packages named in pyproject.toml's ``[tool.pyright]``: the graph,
queries, spec, export, the engine's entry points, validation, pipeline, dictionaries and adapters
(less the files its ``exclude`` lists) type-check with no error.

pyright comes from the test extra (``pyright[nodejs]``: the checker and a Node.js runtime, both as
wheels). Skipped, with the reason, when it is not installed, unless CIRCUITGRAPH_REQUIRE_PYRIGHT is
set (as in CI), which turns the skip into a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.bundles import REPO


def _pyright_or_skip() -> None:
    if importlib.util.find_spec("pyright") is None:
        reason = "pyright is not installed (pip install 'pyright[nodejs]', part of the test extra)"
        if os.environ.get("CIRCUITGRAPH_REQUIRE_PYRIGHT"):
            pytest.fail(reason + " (CIRCUITGRAPH_REQUIRE_PYRIGHT is set)")
        pytest.skip(reason)


def run_pyright(*paths: str) -> dict:
    """pyright's JSON report on ``paths`` (default: pyproject.toml's ``include``), with this
    interpreter's packages."""
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}  # no look-up of newer releases
    out = subprocess.run([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, *paths],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright did not report (exit {out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")


def test_named_packages_type_check():
    _pyright_or_skip()
    report = run_pyright()
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    lines = [f"{os.path.relpath(d['file'], REPO)}:{d['range']['start']['line'] + 1}: {d['message']} ({d.get('rule')})"
             for d in errors]
    assert report["summary"]["filesAnalyzed"] > 50  # the include list was read
    assert not errors, "pyright errors:\n" + "\n".join(lines)
