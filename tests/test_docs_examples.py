"""Every code block and spec in README.md and docs/ runs, so a documented example can never
fail again.

Blocks are read from the Markdown files and executed in a scratch folder holding a copy of
``examples/`` (the built-in demo model and the repository's fixtures need no download):

* ``python``: the blocks of one file run in order in one namespace, like a doctest session;
* ``yaml``: a complete spec (it has ``format_version``) runs end to end; a fragment
  (``queries:``, ``validate:``, ``prune:``...) is merged into the demo spec
  (``examples/demo.yaml`` without its queries, checks and exports) and that spec runs (a
  fragment of only queries and checks runs them on one shared build of the demo graph, each on
  the graph its ``on`` names); every query and check must succeed;
* ``json``: parsed; a check or query item (``{"ablate": {...}}``) is also validated as a spec item;
* ``bash`` / ``console``: each ``circuitgraph ...`` or ``python -m circuitgraph ...`` command
  runs through the CLI in-process and must exit 0 (``> FILE`` redirects its output);
  ``bash scripts/install.sh`` and ``.venv/bin/python -m pytest`` (README's set-up commands: this test
  suite is the second) are skipped, and ``.venv/bin/python -m circuitgraph`` is the CLI;
* ``text``: output listings and formulas, not code.

A block that must not run here (it installs software, trains a model, runs a benchmark for
minutes) says so in its info string: ```` ```bash no-run ````.  There are few, and every
other block needs an info string.  A YAML example of bad input is marked ```` ```yaml raises ````:
it must be refused with a :class:`~circuitgraph.errors.CircuitGraphError`.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

import circuitgraph

REPO = Path(__file__).resolve().parents[1]
FILES = [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))
BLOCK = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
RUNNABLE = {"python", "yaml", "json", "bash", "console"}
#: the most blocks that may be marked ``no-run`` across the docs (each benchmark results page has one:
#: its reproduce commands take minutes to hours; docs/features.md's full demo run takes a minute;
#: docs/tracr.md's three (tracr is an optional extra) and its benchmark page)
MAX_NO_RUN = 19  # + docs/benchmarks/README.md (the one page of every benchmark table; older pages in archive/)
#: commands of a shell block that are not run here, with why
SKIPPED_COMMANDS = {
    "bash scripts/install.sh": "installs system packages; the test environment is installed already",
    "python3 -m pytest": "the test suite, which this test is part of",
    ".venv/bin/python -m pytest": "the test suite, which this test is part of",
}
#: how the docs call the CLI (the README's set-up commands use the virtual environment's interpreter)
CLI_PREFIXES = (["python", "-m", "circuitgraph"], ["python3", "-m", "circuitgraph"],
                [".venv/bin/python", "-m", "circuitgraph"])


def _blocks(path: Path) -> list[tuple[int, str, bool, str, bool]]:
    """``(line, language, runs, code, raises)`` of every fenced block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        info = m.group(1).split()
        lang = info[0] if info else ""
        out.append((text[: m.start()].count("\n") + 1, lang, "no-run" not in info[1:], m.group(2),
                    "raises" in info[1:]))
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A scratch folder per file with a copy of examples/ (outputs land here, never in the repository)."""
    root = tmp_path
    shutil.copytree(REPO / "examples", root / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


@pytest.fixture(scope="module")
def demo_base() -> dict:
    from circuitgraph.spec import read_spec_file

    data = read_spec_file(REPO / "examples" / "demo.yaml")
    for key in ("queries", "validate", "export"):
        data.pop(key, None)
    return data


def test_every_block_is_marked():
    """Every block has an info string; a block that does not run says so; there are few of those."""
    unmarked, no_run = [], []
    for path in FILES:
        for line, lang, runs, _, _ in _blocks(path):
            if lang not in RUNNABLE | {"text"}:
                unmarked.append(f"{_rel(path)}:{line} ({lang or 'no info string'})")
            elif not runs:
                no_run.append(f"{_rel(path)}:{line}")
    assert not unmarked, ("give every code block one of the info strings "
                          f"{', '.join(sorted(RUNNABLE | {'text'}))}: {unmarked}")
    assert len(no_run) <= MAX_NO_RUN, f"too many blocks are marked no-run: {no_run}"


@pytest.fixture(scope="module")
def demo_graphs(demo_base) -> dict:
    """The demo spec's full and pruned graphs, shared by the YAML fragments that only add
    queries and checks (run as ``circuitgraph.run`` would: each on the graph its ``on`` names)."""
    import circuitgraph
    from circuitgraph.queries import prune_graph
    from circuitgraph.spec import load_spec

    spec = load_spec(demo_base)
    full = circuitgraph.build(spec)
    p = spec.pruning
    pruned = prune_graph(full, node_threshold=p.node_threshold, edge_threshold=p.edge_threshold).graph
    return {"full": full, "pruned": pruned}


def _run_yaml(code: str, where: str, workdir: Path, base: dict, graphs: dict) -> None:
    import circuitgraph
    from circuitgraph.pipeline.inputs import resolve_prompt_like
    from circuitgraph.queries import run_query
    from circuitgraph.spec import load_spec, read_spec_file
    from circuitgraph.validation import run_check

    block = workdir / "block.yaml"
    block.write_text(code, encoding="utf-8")
    data = read_spec_file(block)
    if "dataset" in data:
        base = {k: v for k, v in base.items() if k != "prompt"}  # a dataset spec has rows instead of a prompt
    if "format_version" in data or not set(data) <= {"queries", "validate"}:
        spec = load_spec(data if "format_version" in data else {**base, **data}, base_dir=workdir)
        result = circuitgraph.run(spec)
        assert not result.failures, f"{where}: {result.failures}"
        return
    spec = load_spec({**base, **data}, base_dir=workdir)
    for q in spec.queries:
        run_query(graphs[q.on], q)
    adapter = graphs["full"].context.adapter
    for c in spec.validate:
        run_check(graphs[c.on], c, prompt_resolver=lambda p: resolve_prompt_like(p, adapter))


def _run_json(code: str, where: str, base: dict, workdir: Path) -> None:
    from circuitgraph.spec import load_spec
    from circuitgraph.spec.queries import QUERY_TYPES
    from circuitgraph.spec.validation import CHECK_TYPES

    value = json.loads(code)
    if isinstance(value, dict) and len(value) == 1:
        (key,) = value
        if key in {t.key for t in CHECK_TYPES}:
            load_spec({**base, "validate": [value]}, base_dir=workdir)
        elif key in {t.key for t in QUERY_TYPES}:
            load_spec({**base, "queries": [value]}, base_dir=workdir)


def _run_shell(code: str, where: str) -> None:
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    runner = CliRunner()
    for raw in code.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        line = re.sub(r"\s+#.*$", "", line).strip()
        if not line or line.startswith("#"):
            continue
        for command in (c.strip() for c in line.split("&&")):
            if command in SKIPPED_COMMANDS:
                continue
            words = shlex.split(command)
            out_file = None
            if ">" in words:
                i = words.index(">")
                words, out_file = words[:i], words[i + 1]
            if words[:1] == ["circuitgraph"]:
                args = words[1:]
            elif words[:3] in CLI_PREFIXES:
                args = words[3:]
            else:
                raise AssertionError(f"{where}: cannot run {command!r} here; mark the block `no-run` if it "
                                     "must not run in the tests")
            result = runner.invoke(app, args)
            assert result.exit_code == 0, f"{where}: {command!r} exited {result.exit_code}: {result.output}"
            if out_file is not None:
                Path(out_file).write_text(result.stdout)


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_doc_blocks_run(path, workdir, demo_base, demo_graphs, monkeypatch):
    blocks = [b for b in _blocks(path) if b[2] and b[1] in RUNNABLE]
    if not blocks:
        pytest.skip(f"{_rel(path)} has no runnable block")
    monkeypatch.chdir(workdir)
    namespace: dict = {"__name__": "__doc__"}
    for line, lang, _, code, raises in blocks:
        where = f"{_rel(path)}:{line}"
        if raises:  # an example of bad input: it must be refused with a clean error
            with pytest.raises(circuitgraph.errors.CircuitGraphError):
                _run_yaml(code, where, workdir, demo_base, demo_graphs)
            continue
        if lang == "python":
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, where, "exec"), namespace)  # the documented example
        elif lang == "yaml":
            _run_yaml(code, where, workdir, demo_base, demo_graphs)
        elif lang == "json":
            _run_json(code, where, demo_base, workdir)
        else:
            _run_shell(code, where)
