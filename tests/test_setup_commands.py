"""README's two set-up commands are the ones CI runs, and they use the virtual environment that
``scripts/install.sh`` creates (a stock Debian Python refuses system-wide pip installs, PEP 668)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Set-up"):]
    section = section[: section.index("\n## ", 3)]
    return [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)]


def test_readme_has_exactly_two_setup_commands_through_the_venv():
    commands = _setup_commands()
    assert commands == [
        "bash scripts/install.sh && .venv/bin/python -m circuitgraph run examples/demo.yaml",
        "bash scripts/install.sh && .venv/bin/python -m pytest",
    ]


def test_ci_runs_the_readme_test_command_with_the_system_python():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert _setup_commands()[1] in ci.splitlines()
    assert "pyenv" in ci and "grep -v" in ci  # pyenv is dropped from PATH before the command


def test_install_script_creates_and_uses_a_virtual_environment():
    script = (REPO / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert '-m venv "$VENV"' in script
    assert '"$VPY" -m pip install -q "torch==2.13.0"' in script
    # nothing is pip-installed into the interpreter that created the environment
    assert not re.search(r'"\$PY" -m pip', script)
    assert "CIRCUITGRAPH_SKIP_BROWSER" in script
