"""Dataset runs: exact aggregation, byte-identity across executors, faults, resume, queries.

One dataset of 24 a/an prompts on the built-in demo model (a tiny 2-layer model built
natively, shipped in the package) in float64 is run with the local executor (1 and 2
workers) and on a local Ray instance (one instance for the whole module); the aggregate is
checked against an independent aggregation of the per-prompt graphs read back from disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pa = pytest.importorskip("pyarrow", reason="dataset runs need pyarrow (pip install '.[dataset]')")
pd = pytest.importorskip("pandas", reason="dataset runs need pandas (pip install '.[dataset]')")

import circuitgraph  # noqa: E402
from circuitgraph.builtin.demo_task import make_patching_pairs  # noqa: E402
from circuitgraph.errors import DatasetError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
N_ROWS = 20
FAILING_ROW = 7  # shorter than the qk query's position: the pipeline refuses it when the prompt runs
FAILED_CHECK_ROW = 9  # its corrupted prompt equals its prompt: the patching check fails (recorded), the prompt is ok


def _rows() -> list[dict]:
    rows = []
    for i, pair in enumerate(make_patching_pairs(N_ROWS, seed=3, clean_answer=" an")):
        corrupted = pair.clean if i + 1 == FAILED_CHECK_ROW else pair.corrupted
        rows.append({"id": f"r{i + 1:02d}", "prompt": pair.clean, "corrupted": corrupted})
    rows[FAILING_ROW - 1].update(prompt="later she wants", corrupted="later mia wants")
    rows[3]["targets"] = [{"logit": " an"}]  # a row with its own targets
    return rows


def _spec(out: Path, executor: dict, rows: list[dict] | None = None, **extra) -> dict:
    spec = {
        "format_version": 1,
        "model": {"builtin": "demo"},
        "transcoders": {"builtin": "demo"},
        "dataset": rows if rows is not None else _rows(),
        "targets": [{"logit_diff": [" an", " a"]}],
        "graph": {"dtype": "float64"},
        "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
        "queries": [{"scores": {}}, {"qk": {"layer": 1, "head": 0, "query_position": 6, "key_position": 1}}],
        "validate": [{"patching": {"granularity": ["layer"]}}],
        "executor": executor,
        "export": {"dataset": str(out)},
    }
    spec.update(extra)
    return spec


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("datasets")
    out = {}
    for name, executor in (("local1", {"kind": "local", "workers": 1}), ("local2", {"kind": "local", "workers": 2})):
        result = circuitgraph.run(_spec(base / name, executor))
        out[name] = (base / name, result)
    out["base"] = base
    return out


# ------------------------------------------------------------------ independent aggregation
def _influence(graph) -> np.ndarray:
    """circuit-tracer's influence, computed densely here: w (A + A^2 + ...), A = row-normalised |E|."""
    n = graph.n_nodes
    E = np.zeros((n, n))
    np.add.at(E, (graph.edge_target, graph.edge_source), np.abs(graph.edge_weight))
    rows = E.sum(axis=1, keepdims=True)
    A = E / np.maximum(rows, 1e-10)
    w = np.zeros(n)
    for t, weight in graph.targets:
        w[graph.index_of(t)] += weight
    total, current = np.zeros(n), w @ A
    while np.abs(current).max() > 0:
        total += current
        current = current @ A
    return total


def _independent(directory: Path, ids: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    node_rows, edge_rows = [], []
    for rid in ids:
        g = circuitgraph.load_graph(str(directory / "graphs" / f"{rid}.npz"))
        infl = _influence(g)
        targets = {g.index_of(t): w for t, w in g.targets}
        direct = np.zeros(g.n_nodes)
        for s, t, w in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False):
            if t in targets:
                direct[s] += targets[t] * w
        for i, node in enumerate(g.nodes):
            node_rows.append((rid, node.kind, node.layer, node.index, node.activation, infl[i], direct[i]))
        for s, t, w in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False):
            a, b = g.nodes[s], g.nodes[t]
            if w != 0:
                edge_rows.append((rid, a.kind, a.layer, a.index, b.kind, b.layer, b.index, w))
    nodes = pd.DataFrame(node_rows, columns=["rid", "kind", "layer", "index", "a", "i", "d"])
    nodes = nodes.groupby(["kind", "layer", "index"]).agg(
        n_prompts=("rid", "nunique"), sum_activation=("a", "sum"), sum_influence=("i", "sum"),
        sum_direct_effect=("d", "sum")).reset_index()
    edges = pd.DataFrame(edge_rows, columns=["rid", "source_kind", "source_layer", "source_index", "target_kind",
                                             "target_layer", "target_index", "w"])
    edges["aw"] = edges["w"].abs()
    keys = ["source_kind", "source_layer", "source_index", "target_kind", "target_layer", "target_index"]
    edges = edges.groupby(keys).agg(n_prompts=("rid", "nunique"), sum_weight=("w", "sum"),
                                    sum_abs_weight=("aw", "sum")).reset_index()
    return nodes, edges


def _close(got: pd.Series, want: pd.Series) -> bool:
    """Equal to 1e-9 relative (1e-12 absolute for sums that cancel to about zero)."""
    got, want = got.to_numpy(dtype=float), want.to_numpy(dtype=float)
    return bool((np.abs(got - want) <= 1e-9 * np.abs(want) + 1e-12).all())


def test_aggregate_equals_independent_aggregation_of_the_graphs(runs):
    directory, result = runs["local1"]
    assert result.n_prompts == N_ROWS and result.n_failed == 1
    ds = circuitgraph.open_dataset(directory)
    ok = ds.manifest[ds.manifest["status"] == "ok"]["id"].tolist()
    assert len(ok) == N_ROWS - 1 and ds.n_aggregated == N_ROWS - 1
    want_nodes, want_edges = _independent(directory, ok)
    nodes = ds.nodes
    assert list(nodes.columns) == ["kind", "layer", "index", "n_prompts", "sum_activation", "sum_influence",
                                   "sum_direct_effect"]
    assert list(ds.edges.columns) == ["source_kind", "source_layer", "source_index", "target_kind", "target_layer",
                                      "target_index", "n_prompts", "sum_weight", "sum_abs_weight"]
    key = ["kind", "layer", "index"]
    merged = nodes.merge(want_nodes, on=key, how="outer", suffixes=("", "_want"), indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"]
    assert (merged["n_prompts"] == merged["n_prompts_want"]).all()
    for col in ("sum_activation", "sum_influence", "sum_direct_effect"):
        assert _close(merged[col], merged[f"{col}_want"]), col
    ekey = [c for c in want_edges.columns if c.startswith(("source_", "target_"))]
    merged = ds.edges.merge(want_edges, on=ekey, how="outer", suffixes=("", "_want"), indicator=True)
    assert (merged["_merge"] == "both").all()
    assert (merged["n_prompts"] == merged["n_prompts_want"]).all()
    for col in ("sum_weight", "sum_abs_weight"):
        assert _close(merged[col], merged[f"{col}_want"]), col
    # the identity columns hold the graph JSON's values: every feature identity is a feature of some graph
    g = circuitgraph.load_graph(str(directory / "graphs" / f"{ok[0]}.npz"))
    for n in g.nodes:
        assert ((nodes["kind"] == n.kind) & (nodes["layer"] == n.layer) & (nodes["index"] == n.index)).any()


def test_aggregate_is_byte_identical_with_one_and_two_workers(runs):
    (d1, _), (d2, _) = runs["local1"], runs["local2"]
    for name in ("nodes.parquet", "edges.parquet"):
        assert (d1 / name).read_bytes() == (d2 / name).read_bytes(), name


def test_runtime_failure_is_recorded_and_nothing_else_is_lost(runs):
    directory, _ = runs["local1"]
    m = circuitgraph.open_dataset(directory).manifest
    assert list(m["row"]) == list(range(1, N_ROWS + 1))
    failed = m[m["status"] == "failed"]
    assert failed["row"].tolist() == [FAILING_ROW]
    error = failed["error"].iloc[0]
    assert "query_position 6 is outside the prompt" in error and "\n" not in error
    assert not (directory / "graphs" / f"r{FAILING_ROW:02d}.npz").exists()
    ok = m[m["status"] == "ok"]
    assert ok["error"].isna().all() and (ok["n_nodes"] > 0).all() and (ok["replacement_score"] > 0).all()
    for rid in ok["id"]:
        record = json.loads((directory / "results" / f"{rid}.json").read_text())
        assert record["validation"][0]["kind"] == "patching" and record["queries"][0]["kind"] == "scores"
    # a failed check is recorded with its prompt, which is still aggregated
    assert ok.set_index("row")["n_failed_checks"].to_dict() == {r: int(r == FAILED_CHECK_ROW) for r in ok["row"]}
    record = json.loads((directory / "results" / f"r{FAILED_CHECK_ROW:02d}.json").read_text())
    assert record["validation"][0]["status"] == "failed" and "undefined" in record["validation"][0]["error"]
    # the row with its own target explains that target
    g = circuitgraph.load_graph(str(directory / "graphs" / "r04.npz"))
    assert [t.kind for t in g.target_ids] == ["logit"]


def test_bad_rows_are_all_reported_before_any_output(tmp_path):
    rows = _rows()[:6]
    rows[0] = {"id": "a", "prompt": ""}                                  # empty prompt
    rows[1] = {"id": "b", "tokens": [1, 2, 9999]}                        # outside the vocabulary
    rows[2] = {"id": "c", "prompt": " ".join(["owl"] * 40), "corrupted": " ".join(["dog"] * 40)}  # > n_ctx
    rows[3]["targets"] = [{"logit": " aardvarkish"}]                     # not one token
    rows[4]["bogus"] = 1                                                 # unknown key
    rows[5]["id"] = "a"                                                  # duplicate id
    out = tmp_path / "out"
    with pytest.raises(DatasetError) as info:
        circuitgraph.run(_spec(out, {"kind": "local", "workers": 1}, rows=rows, validate=[]))
    text = str(info.value)
    assert "6 problems" in text
    for n in range(1, 7):
        assert f"row {n}" in text, (n, text)
    assert "empty prompt" in text and "vocabulary" in text and "context" in text and "bogus" in text
    assert "also the id of row 1" in text and "aardvarkish" in text
    assert not out.exists()


def test_bad_rows_from_the_cli_exit_2_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    data = tmp_path / "rows.csv"
    data.write_text('id,prompt,tokens\nx,"mia saw the owl . later she wants",\ny,,"[1, 99999]"\n')
    spec = _spec(tmp_path / "out", {"kind": "local", "workers": 1}, rows=[])
    spec["dataset"] = "rows.csv"
    spec["export"]["dataset"] = "out"
    spec["validate"] = []
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "spec.yaml")])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "row 2" in res.output and "vocabulary" in res.output
    assert not (tmp_path / "out").exists()


def test_dead_worker_is_retried_and_the_aggregate_is_unchanged(runs, tmp_path):
    import multiprocessing as mp

    out = tmp_path / "killed-worker"
    killed: list[int] = []

    def killer() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            if (out / "results").is_dir() and len(list((out / "results").glob("*.json"))) >= 2:
                for child in mp.active_children():
                    if child.name.startswith(("ForkServerProcess", "Process")) and child.is_alive():
                        os.kill(child.pid, signal.SIGKILL)
                        killed.append(child.pid)
                        break
            time.sleep(0.005)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = circuitgraph.run(_spec(out, {"kind": "local", "workers": 2}))
    thread.join(timeout=1)
    assert killed, "no worker was killed"
    assert result.n_ok == N_ROWS - 1
    m = circuitgraph.open_dataset(out).manifest
    assert m["attempts"].max() == 2
    d1, _ = runs["local1"]
    for name in ("nodes.parquet", "edges.parquet"):
        assert (out / name).read_bytes() == (d1 / name).read_bytes(), name


def test_killed_run_resumes_to_the_same_aggregate(runs, tmp_path):
    out = tmp_path / "killed"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_spec(out, {"kind": "local", "workers": 1})))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "circuitgraph", "run", str(spec_path), "--quiet"], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            done = list((out / "results").glob("*.json")) if (out / "results").is_dir() else []
            if len(done) >= 3 or proc.poll() is not None:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, the fork server and the workers
        proc.wait()
    assert not (out / "nodes.parquet").exists()
    n_done = len(list((out / "results").glob("*.json")))
    assert 3 <= n_done < N_ROWS
    result = circuitgraph.run(_spec(out, {"kind": "local", "workers": 2}))
    assert result.n_skipped >= 3 and result.n_ok == N_ROWS - 1
    d1, _ = runs["local1"]
    for name in ("nodes.parquet", "edges.parquet"):
        assert (out / name).read_bytes() == (d1 / name).read_bytes(), name
    assert not list(out.glob("**/.*.tmp"))


def test_resume_refuses_a_different_spec(runs):
    directory, _ = runs["local1"]
    spec = _spec(directory, {"kind": "local", "workers": 1})
    spec["prune"] = {"node_threshold": 0.5, "edge_threshold": 0.9}
    with pytest.raises(DatasetError, match="different spec"):
        circuitgraph.run(spec)


def test_open_dataset_sql_and_the_aggregate_graph(runs, tmp_path):
    pytest.importorskip("duckdb", reason="SQL over a dataset needs duckdb (pip install '.[dataset]')")
    from circuitgraph.queries import neighbours, top_paths

    directory, _ = runs["local1"]
    ds = circuitgraph.open_dataset(directory)
    counts = ds.sql("select status, count(*) as n from manifest group by status order by status").fetchall()
    assert counts == [("failed", 1), ("ok", N_ROWS - 1)]
    top = ds.sql("select kind, layer, index, n_prompts from nodes where kind = 'feature' "
                 "order by sum_influence desc limit 1").fetchall()[0]
    g = ds.graph()
    n = ds.n_aggregated
    assert g.n_nodes == len(ds.nodes) and g.n_edges == len(ds.edges)
    assert np.allclose(g.edge_weight * n, ds.edges["sum_weight"].to_numpy(), rtol=1e-12, atol=0)
    assert g.edge_n_prompts.tolist() == ds.edges["n_prompts"].tolist()
    feature = next(nd for nd in g.nodes if (nd.kind, nd.layer, nd.index) == top[:3])
    assert feature.attrs["n_prompts"] == top[3]
    paths = top_paths(g, source={"kind": "embedding"}, k=3)
    assert len(paths.paths) == 3
    assert neighbours(g, feature.id).to_dict()
    assert "digraph" in g.to_dot(max_nodes=30)

    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    res = CliRunner().invoke(app, ["dataset", "summary", str(directory), "--top", "3"])
    assert res.exit_code == 0, res.output
    assert f"{N_ROWS} prompts, {N_ROWS - 1} ok, 1 failed" in res.output and "replacement_score" in res.output
    res = CliRunner().invoke(app, ["dataset", "summary", str(tmp_path)])
    assert res.exit_code == 2 and "not a finished dataset run" in res.output


def test_csv_full_graphs_json_and_positions_from_the_end(tmp_path):
    pairs = make_patching_pairs(4, seed=5)
    csv_path = tmp_path / "rows.csv"
    lines = ["prompt,targets"] + [f'"{p.clean}","[{{""logit_diff"": ["" an"", "" a""]}}]"' for p in pairs]
    csv_path.write_text("\n".join(lines) + "\n")
    spec = _spec(tmp_path / "out", {"kind": "local", "workers": 1}, rows=[],
                 aggregate={"graph": "full", "position": "from_end"})
    spec.update(dataset=str(csv_path), validate=[], prune={"node_threshold": 0.5, "edge_threshold": 0.9})
    spec["export"]["dataset_format"] = "json"
    result = circuitgraph.run(spec)
    assert result.n_ok == 4
    ds = circuitgraph.open_dataset(tmp_path / "out")
    assert list(ds.nodes.columns)[:4] == ["kind", "layer", "index", "position_from_end"]
    assert "source_position_from_end" in ds.edges.columns and "target_position_from_end" in ds.edges.columns
    # full graphs are aggregated although the exported JSON graphs are pruned
    graphs = [circuitgraph.load_graph(str(tmp_path / "out" / "graphs" / f"{i}.json")) for i in range(1, 5)]
    assert int(ds.manifest["n_edges_full"].sum()) > int(ds.manifest["n_edges"].sum())
    assert sum(g.n_edges for g in graphs) == int(ds.manifest["n_edges"].sum())
    n_full_nonzero = int(ds.manifest["n_edges_full"].sum())
    assert int(ds.edges["n_prompts"].sum()) <= n_full_nonzero
    target = ds.nodes[ds.nodes["kind"] == "target"]
    assert target["position_from_end"].tolist() == [0] and target["n_prompts"].tolist() == [4]
    # the embedding sums over prompts equal the prompts' token counts by position from the end
    emb = ds.nodes[ds.nodes["kind"] == "embedding"]
    n_tokens = ds.manifest["n_tokens"].tolist()
    for k in range(max(n_tokens)):  # one embedding node per position, per prompt
        assert emb[emb["position_from_end"] == k]["n_prompts"].sum() == sum(t > k for t in n_tokens)


def test_ray_local_instance_gives_the_same_bytes(runs):
    pytest.importorskip("ray", reason="the Ray executor needs ray (pip install '.[dataset]')")
    out = runs["base"] / "ray"
    result = circuitgraph.run(_spec(out, {"kind": "ray", "address": "local", "workers": 2}))
    assert result.n_ok == N_ROWS - 1 and result.n_failed == 1
    d1, _ = runs["local1"]
    for name in ("nodes.parquet", "edges.parquet"):
        assert (out / name).read_bytes() == (d1 / name).read_bytes(), name
    m = circuitgraph.open_dataset(out).manifest
    assert m[m["status"] == "failed"]["row"].tolist() == [FAILING_ROW]


def test_demo_dataset_example_and_its_generator(tmp_path):
    from circuitgraph.builtin.demo_task import write_dataset

    examples = REPO / "examples"
    shipped = (examples / "demo_dataset.jsonl").read_text()
    assert Path(write_dataset(str(tmp_path / "rows.jsonl"), n=300)).read_text() == shipped
    spec = yaml.safe_load((examples / "demo_dataset.yaml").read_text())
    spec["dataset"] = [json.loads(line) for line in shipped.splitlines()[:6]]  # the example, on 6 of its rows
    spec["executor"] = {"kind": "local", "workers": 1}
    spec["export"]["dataset"] = str(tmp_path / "out")
    result = circuitgraph.run(circuitgraph.load_spec(spec, base_dir=examples))
    assert result.n_ok == 6
    ds = circuitgraph.open_dataset(tmp_path / "out")
    assert ds.manifest["n_failed_checks"].tolist() == [0] * 6
    assert (ds.manifest["replacement_score"] > 0.5).all()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"prompt": "mia saw the owl"}, "not both"),
        ({"export": {}}, "export: {dataset: DIR}"),
        ({"export": {"dataset": "out", "json": "g.json"}}, "write one graph"),
        ({"executor": {"kind": "local", "address": "local"}}, "only used with kind: ray"),
        ({"dataset": None, "prompt": "mia saw the owl", "aggregate": {"graph": "full"}}, "only used with dataset"),
        ({"aggregate": {"graph": "some"}}, "aggregate.graph"),
    ],
)
def test_dataset_spec_rules(change, words):
    from circuitgraph.errors import SpecError

    spec = _spec(Path("out"), {"kind": "local"}, rows=[{"prompt": "mia saw the owl"}])
    spec.update(change)
    if spec.get("dataset") is None:
        spec.pop("dataset"), spec.pop("executor"), spec["export"].pop("dataset")
    with pytest.raises(SpecError) as info:
        circuitgraph.load_spec(spec)
    assert words in str(info.value)


def test_validate_and_dry_run_read_the_rows(tmp_path):
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    (tmp_path / "rows.jsonl").write_text('{"prompt": "mia saw the owl . later she wants"}\n{"promt": "x"}\nnot json\n')
    spec = _spec(Path("out"), {"kind": "local"}, rows=[], validate=[])
    spec["dataset"] = "rows.jsonl"
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["validate", str(tmp_path / "spec.yaml")])
    assert res.exit_code == 2 and "row 2.promt" in res.output and "row 3" in res.output
    (tmp_path / "rows.jsonl").write_text('{"prompt": "mia saw the owl"}\n{"prompt": "mia saw the owl . later she wants"}\n')
    res = CliRunner().invoke(app, ["run", str(tmp_path / "spec.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "dataset: 2 rows" in res.output and "row 2" in res.output and not (tmp_path / "out").exists()


def test_row_ids():
    from circuitgraph.spec.dataset import parse_rows

    rows, problems = parse_rows([{"id": 7, "prompt": "a"}, {"id": "7", "prompt": "b"}, {"prompt": "c"},
                                 {"id": "../x", "prompt": "d"}, {"id": True, "tokens": [1]}])
    assert [(r.number, r.id) for r in rows] == [(1, "7"), (3, "3")]
    assert [loc for loc, _ in problems] == ["row 2.id", "row 4.id", "row 5.id"]
    assert "also the id of row 1" in problems[0][1] and "names the row's files" in problems[1][1]
