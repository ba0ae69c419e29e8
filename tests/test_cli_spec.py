"""The command line on specs: validate, schema, and run/render wired to stand-in
APIs.  No torch: the real API is never imported here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

import circuitgraph
import circuitgraph.pipeline
from circuitgraph.cli import main as cli
from circuitgraph.errors import AttributionError, SpecError
from circuitgraph.spec import Spec, spec_json_schema

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()

GOOD = """\
format_version: 1
model: {builtin: demo}
prompt: "The cat sat on the"
targets:
  - logit_diff: [" an", " a"]
export: {json: out/graph.json, svg: out/graph.svg}
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def invoke(*args: str):
    return runner.invoke(cli.app, [str(a) for a in args])


def assert_one_line_error(result, *words: str) -> str:
    assert result.exit_code == cli.EXIT_BAD_INPUT, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# --- validate ---------------------------------------------------------------------------


def test_validate_good_spec(tmp_path):
    result = invoke("validate", write(tmp_path, GOOD))
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith("spec OK: ")
    for word in ("builtin demo", "logit_diff", "exports json, svg"):
        assert word in line


def test_validate_malformed_yaml(tmp_path):
    path = write(tmp_path, "format_version: 1\nmodel: {builtin: demo\nprompt: x\n")
    assert_one_line_error(invoke("validate", path), "malformed YAML", f"{path}:")


def test_validate_unknown_key(tmp_path):
    path = write(tmp_path, GOOD + "graph: {mlp: neurons, atention: heads}\n")
    assert_one_line_error(invoke("validate", path), "graph.atention: unknown key 'atention'", "did you mean 'attention'")


def test_validate_bad_target(tmp_path):
    path = write(tmp_path, GOOD.replace('logit_diff: [" an", " a"]', 'logit_diff: [" an"]'))
    assert_one_line_error(invoke("validate", path), "targets[0].logit_diff: expected two tokens", "got 1")


def test_validate_reports_every_problem_on_one_line(tmp_path):
    path = write(tmp_path, GOOD + "seed: x\ngraph: {batch_size: 0}\nprune: {node_threshold: 2}\n")
    line = assert_one_line_error(invoke("validate", path), "(3 problems)")
    for loc in ("seed:", "graph.batch_size:", "prune.node_threshold:"):
        assert loc in line


def test_validate_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert_one_line_error(invoke("validate", missing), str(missing), "not found")


def test_validate_checks_input_files(tmp_path):
    path = write(tmp_path, GOOD.replace("{builtin: demo}", "{path: no_such_model}"))
    assert_one_line_error(invoke("validate", path), "model.path", "no_such_model")


def test_debug_shows_the_exception(tmp_path):
    result = invoke("validate", tmp_path / "nope.yaml", "--debug")
    assert isinstance(result.exception, SpecError)


# --- schema -----------------------------------------------------------------------------


def test_schema_prints_the_spec_schema():
    result = invoke("schema")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == spec_json_schema()


def test_schema_graph():
    from circuitgraph.export.graph_schema import SCHEMA_PATH

    result = invoke("schema", "--graph")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == json.loads(SCHEMA_PATH.read_text())


# --- run and render, with stand-ins for the API and the graph -------------------------


@pytest.fixture
def fake_api(monkeypatch):
    calls: list[tuple[str, object, dict]] = []

    class Result:
        failures: list[str] = []

        def summary_lines(self):
            return ["graph: 12 nodes, 30 edges", "wrote out/graph.json"]

    def run(spec, *, progress=False, force=False, memory_limit=None):
        calls.append(("run", spec, {"progress": progress} if memory_limit is None else
                      {"progress": progress, "memory_limit": memory_limit}))
        if spec.seed == 13:
            raise AttributionError("layer 7 requested, the model has 2 layers (0-1)")
        return Result()

    def dry_run(spec, *, memory_limit=None):
        calls.append(("dry_run", spec, {} if memory_limit is None else {"memory_limit": memory_limit}))
        return ["would build a graph of at most 40 nodes"]

    module = types.ModuleType("circuitgraph.pipeline.entry")
    module.run, module.dry_run = run, dry_run
    monkeypatch.setitem(sys.modules, "circuitgraph.pipeline.entry", module)
    monkeypatch.setattr(circuitgraph.pipeline, "entry", module, raising=False)
    return calls


def test_run_prints_the_summary(tmp_path, fake_api):
    result = invoke("run", write(tmp_path, GOOD))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["graph: 12 nodes, 30 edges", "wrote out/graph.json"]
    ((name, spec, kwargs),) = fake_api
    assert name == "run" and isinstance(spec, Spec) and kwargs == {"progress": True}


def test_run_quiet_and_dry_run(tmp_path, fake_api):
    path = write(tmp_path, GOOD)
    assert invoke("run", path, "--quiet").exit_code == 0
    result = invoke("run", path, "--dry-run")
    assert result.exit_code == 0 and result.stdout.splitlines() == ["would build a graph of at most 40 nodes"]
    assert [(name, kwargs) for name, _, kwargs in fake_api] == [("run", {"progress": False}), ("dry_run", {})]


def test_run_memory_limit_is_passed_in_bytes(tmp_path, fake_api):
    path = write(tmp_path, GOOD)
    assert invoke("run", path, "--quiet", "--memory-limit", "2.5").exit_code == 0
    assert invoke("run", path, "--dry-run", "--memory-limit", "6").exit_code == 0
    assert [(name, kwargs) for name, _, kwargs in fake_api] == [
        ("run", {"progress": False, "memory_limit": int(2.5 * 1024**3)}), ("dry_run", {"memory_limit": 6 * 1024**3})]
    assert_one_line_error(invoke("run", path, "--memory-limit", "-1"), "--memory-limit")


def test_run_errors_are_one_line(tmp_path, fake_api):
    assert_one_line_error(invoke("run", write(tmp_path, GOOD + "seed: 13\n")), "layer 7 requested")
    assert_one_line_error(invoke("run", write(tmp_path, GOOD + "bogus: 1\n")), "unknown key 'bogus'")
    assert len(fake_api) == 1  # a bad spec never reaches the API
    result = invoke("run", write(tmp_path, GOOD + "seed: 13\n"), "--debug")
    assert isinstance(result.exception, AttributionError)


def test_render(tmp_path, monkeypatch):
    calls = []
    graph = object()

    def graph_from_json(path):
        calls.append(("from_json", Path(path)))
        return graph

    def render_graph(g, out, **kwargs):
        calls.append(("render", g is graph, Path(out), kwargs))

    module = types.ModuleType("circuitgraph.export")
    module.graph_from_json, module.render_graph = graph_from_json, render_graph
    monkeypatch.setitem(sys.modules, "circuitgraph.export", module)
    result = invoke("render", "g.json", "-o", "g.svg", "--max-nodes", "50")
    assert result.exit_code == 0, result.output
    assert calls == [("from_json", Path("g.json")), ("render", True, Path("g.svg"), {"max_nodes": 50})]
    assert invoke("render", "g.json", "-o", "g.svg", "--max-nodes", "0").exit_code == 2


def test_render_missing_file_is_one_line(tmp_path, monkeypatch):
    def graph_from_json(path):
        raise FileNotFoundError(2, "No such file or directory", str(path))

    module = types.ModuleType("circuitgraph.export")
    module.graph_from_json, module.render_graph = graph_from_json, None
    monkeypatch.setitem(sys.modules, "circuitgraph.export", module)
    assert_one_line_error(invoke("render", tmp_path / "g.json", "-o", "g.svg"), "g.json")


def test_validate_and_schema_do_not_import_torch(tmp_path):
    path = write(tmp_path, GOOD)
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from circuitgraph.cli.main import app\n"
        f"r = CliRunner().invoke(app, ['validate', {str(path)!r}]); assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(app, ['schema']); assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_openmp_defaults_only_when_the_user_set_neither():
    from circuitgraph.cli.main import OPENMP_DEFAULTS, openmp_defaults

    env: dict[str, str] = {}
    openmp_defaults(env)
    assert env == OPENMP_DEFAULTS == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "20000"}
    for mine in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(mine)
        openmp_defaults(env)
        assert env == mine  # a user's choice is kept as it is
