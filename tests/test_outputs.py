"""A run's exports: all or none, locked, never over a file circuitgraph did not write, no
stale temporaries, and no absolute local paths inside a shared graph."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from circuitgraph.cli.main import app
from circuitgraph.errors import ExportError
from circuitgraph.export.outputs import MANIFEST_NAME, OutputSet, owned_by_circuitgraph
from tests.helpers.bundles import SHARED_FIXTURES

BUNDLE = SHARED_FIXTURES / "example-gpt2"


def _spec(folder: Path, **export) -> Path:
    spec = {
        "format_version": 1,
        "model": {"path": str(BUNDLE / "model")},
        "transcoders": {"path": str(BUNDLE / "transcoders")},
        "prompt": {"tokens": [1, 36, 37, 23]},
        "targets": [{"logit": 5}],
        "export": export or {"json": "out/g.json", "dot": "out/g.dot"},
    }
    path = folder / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _run(*args: str):
    return CliRunner().invoke(app, ["run", "-q", *args])


def test_rerun_replaces_its_own_files_but_not_others(tmp_path):
    spec = _spec(tmp_path)
    assert _run(str(spec)).exit_code == 0
    out = tmp_path / "out"
    assert owned_by_circuitgraph(out / "g.json") and (out / MANIFEST_NAME).is_file()
    assert _run(str(spec)).exit_code == 0  # its own, unchanged files: replaced
    (out / "g.dot").write_text("my notes\n")  # edited by hand: no longer circuitgraph's
    before = (out / "g.json").read_bytes()
    res = _run(str(spec))
    assert res.exit_code == 2 and "--force" in res.output and "g.dot" in res.output
    assert (out / "g.dot").read_text() == "my notes\n" and (out / "g.json").read_bytes() == before
    assert _run(str(spec), "--force").exit_code == 0
    assert (out / "g.dot").read_text().startswith(("digraph", "//", "strict"))


def test_a_foreign_file_is_refused_before_any_work(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "g.json").write_text("{}")
    import circuitgraph.pipeline.runner as runner

    monkeypatch.setattr(runner, "build", lambda *a, **k: pytest.fail("the graph was built"))
    res = _run(str(spec))
    assert res.exit_code == 2 and "not written by circuitgraph" in res.output


def test_a_failing_export_writes_nothing(tmp_path, monkeypatch):
    spec = _spec(tmp_path, json="out/g.json", dot="out/g.dot", neuronpedia="out/np.json")
    import circuitgraph.pipeline.exports as exports

    def broken(*args, **kwargs):
        from circuitgraph.errors import ExportError

        raise ExportError("neuronpedia writer failed (simulated)")

    monkeypatch.setattr(exports, "graph_to_neuronpedia", broken)
    res = _run(str(spec))
    assert res.exit_code == 2 and "simulated" in res.output
    out = tmp_path / "out"
    assert not out.exists() or os.listdir(out) == [], "a failed export left files (or temporaries) behind"


def test_stale_temporaries_are_cleaned(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stale = [out / ".g.json.ab12cd.tmp", out / ".g.json.0000.tmp.json", out / "..g.dot.xyz.tmp"]
    fresh = out / ".g.json.fresh.tmp"
    other = out / ".notes.txt.1234.tmp"
    for p in (*stale, fresh, other):
        p.write_text("partial")
    old = time.time() - 3600
    for p in (*stale, other):
        os.utime(p, (old, old))
    outputs = {"json": out / "g.json", "dot": out / "g.dot"}
    with OutputSet(outputs).writing() as w:
        for kind in outputs:
            w.stage(kind).write_text(kind)
    assert not any(p.exists() for p in stale)
    assert fresh.exists(), "a temporary file of a run still writing must be left alone"
    assert other.exists(), "only temporaries of these outputs are cleaned"
    assert (out / "g.json").read_text() == "json"


def test_two_writers_of_the_same_paths_do_not_interleave(tmp_path):
    outputs = {"json": tmp_path / "g.json", "dot": tmp_path / "g.dot"}
    log: list[str] = []

    def writer(name: str, pause: float) -> None:
        with OutputSet(outputs, force=True).writing() as w:
            log.append(f"{name} start")
            for kind in outputs:
                w.stage(kind).write_text(name)
                time.sleep(pause)
            log.append(f"{name} end")

    a = threading.Thread(target=writer, args=("a", 0.2))
    a.start()
    time.sleep(0.05)
    b = threading.Thread(target=writer, args=("b", 0.0))
    b.start()
    a.join()
    b.join()
    assert log == ["a start", "a end", "b start", "b end"]
    assert {p.read_text() for p in outputs.values()} == {"b"}, "the set is one run's, never a mix"


def test_lock_timeout_is_an_error(tmp_path):
    outputs = {"json": tmp_path / "g.json"}
    with OutputSet(outputs).writing() as w:
        w.stage("json").write_text("x")
        with pytest.raises(ExportError, match="another circuitgraph run"):
            with OutputSet({"dot": tmp_path / "g.dot"}, lock_timeout=0.2).writing():
                pass


def test_same_path_twice_and_bad_suffixes_are_spec_errors(tmp_path):
    for export, needle in (({"json": "o/x.json", "neuronpedia": "o/x.json"}, "also the json output"),
                           ({"graph": "o/x.json"}, "should end in .npz"),
                           ({"png": "o/x.svg"}, "should end in .png"),
                           ({"dot": "o/x.txt"}, "should end in .dot")):
        spec = _spec(tmp_path, **export)
        res = CliRunner().invoke(app, ["validate", str(spec)])
        assert res.exit_code == 2 and needle in res.output, res.output


def test_graphs_hold_no_absolute_local_paths(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    spec = _spec(folder, json="out/g.json", neuronpedia="out/np.json", html="out/r.html", graph="out/g.npz")
    assert _run(str(spec)).exit_code == 0
    import numpy as np

    with np.load(folder / "out" / "g.npz") as archive:
        header = archive["header"].tobytes().decode("utf-8")
    for name, text in (("g.json", None), ("np.json", None), ("r.html", None), ("g.npz", header)):
        text = text if text is not None else (folder / "out" / name).read_text()
        assert str(tmp_path) not in text and str(BUNDLE.parent) not in text, name
    meta = json.loads((folder / "out" / "g.json").read_text())["metadata"]
    assert meta["spec"]["export"]["json"] == "out/g.json"  # relative to the spec's folder
    assert meta["spec"]["model"]["path"] == "model"  # outside it: the name only


def test_a_heatmap_over_a_foreign_file_is_refused(tmp_path):
    spec = json.loads(_spec(tmp_path).read_text())
    spec["validate"] = [{"patching": {"corrupted": {"tokens": [1, 36, 37, 24]}, "granularity": "layer",
                                      "heatmap": "out/patch.png"}}]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "patch.png").write_bytes(b"my picture")
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    res = _run(str(path))
    assert res.exit_code == 2 and "validate[0].patching.heatmap" in res.output and "--force" in res.output
    assert (tmp_path / "out" / "patch.png").read_bytes() == b"my picture"
    OutputSet.record([tmp_path / "out" / "patch.png"])  # as a run that wrote it would
    assert owned_by_circuitgraph(tmp_path / "out" / "patch.png")
