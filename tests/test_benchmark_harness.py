"""The benchmark harness without running a benchmark: environments, merged results, the page.

* circuit-tracer's default environment has no thread-tuning variable at all (nothing the
  benchmark or the caller's shell added), its tuned one has circuitgraph's OpenMP settings, and
  ``circuitgraph run`` applies its own OpenMP defaults inside itself before torch is imported;
* ``benchmarks/report.py`` writes one page with every suite's table from a merged results.json
  (suites recorded in separate invocations), says which suites are not recorded yet, and makes
  README.md's speed paragraph from the same record;
* ``benchmarks/side_by_side.py`` compares the selected features as sets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import report as benchmark_report
from benchmarks import run_benchmarks, side_by_side
from tests.helpers.bundles import REPO


@pytest.fixture(scope="module")
def rb():
    return run_benchmarks


@pytest.fixture(scope="module")
def report():
    return benchmark_report


INHERITED = {"PATH": "bin-dir", "PYTHONPATH": "here", "HOME": "home-dir", "OMP_WAIT_POLICY": "ACTIVE",
             "GOMP_SPINCOUNT": "20000", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2", "KMP_BLOCKTIME": "0",
             "OPENBLAS_NUM_THREADS": "3", "OPENBLAS_CORETYPE": "Haswell"}


def test_circuit_tracer_default_environment_has_no_tuning_variable(rb):
    default = rb.ct_env("default", 4, INHERITED)
    assert default == {"PATH": "bin-dir", "PYTHONPATH": "here", "HOME": "home-dir", "OPENBLAS_CORETYPE": "Haswell"}
    assert rb.plain_env(INHERITED) == default
    assert rb.tuning_variables(default) == {}
    # circuitgraph's processes start from the same plain environment; --threads adds OMP_NUM_THREADS only
    assert rb.circuitgraph_env(None, INHERITED) == default
    assert rb.circuitgraph_env(3, INHERITED) == {**default, "OMP_NUM_THREADS": "3"}


def test_circuit_tracer_tuned_environment_is_circuitgraphs_openmp_settings(rb):
    from circuitgraph.cli.main import OPENMP_DEFAULTS

    tuned = rb.ct_env("tuned", 4, INHERITED)
    assert rb.tuning_variables(tuned) == {**OPENMP_DEFAULTS, "OMP_NUM_THREADS": "4"}
    assert rb.tuning_variables(rb.ct_env("tuned", None, {})) == {**OPENMP_DEFAULTS,
                                                                 "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    with pytest.raises(ValueError, match="expected 'default' or 'tuned'"):
        rb.ct_env("fast", 4, INHERITED)


def test_circuitgraph_run_sets_its_openmp_defaults_itself_before_torch(rb):
    """What the plain environment relies on: the console script (``circuitgraph run``) sets
    OPENMP_DEFAULTS in its own process before torch is imported (OpenMP reads them when torch
    loads), and keeps a setting the user made."""
    probe = ("import os, sys\nimport circuitgraph.cli.main as m\n"
             "m.app = lambda: print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), "
             "'torch' in sys.modules)\nm.main()\n")
    env = {**rb.plain_env(), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["ACTIVE", "20000", "False"], out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "OMP_WAIT_POLICY": "PASSIVE"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["PASSIVE", "None", "False"], out.stderr[-2000:]


def test_results_merge_per_suite_and_reproduce_commands(rb, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"mode": "full", "runs": []}))  # an older record
    results = rb.load_results(tmp_path)
    assert results == {"format": rb.RESULTS_FORMAT, "suites": {}}
    results["suites"]["side_by_side"] = {"suite": "side_by_side"}
    rb.save_results(results, tmp_path)
    again = rb.load_results(tmp_path)
    again["suites"]["dataset"] = {"suite": "dataset"}
    rb.save_results(again, tmp_path)
    assert set(rb.load_results(tmp_path)["suites"]) == {"side_by_side", "dataset"}
    assert not list(tmp_path.glob("*.partial"))
    cmd = rb.reproduce_command(["--only", "side_by_side,dataset", "--ct-env", "both", "--work", "/x", "--threads",
                                "2"], "dataset")
    assert cmd == "python benchmarks/run_benchmarks.py --only dataset --ct-env both --threads 2"
    assert rb.reproduce_command(["--device", "cuda", "--llama-bundle-args", "--style llama --n-layers 2"], "gpu") == (
        "python benchmarks/run_benchmarks.py --only gpu --llama-bundle-args '--style llama --n-layers 2'")


def test_every_suite_has_a_configuration_and_a_section(rb, report):
    for quick in (True, False):
        suite = rb.configurations(quick)
        named = {r.suite for r in suite.runs} | {r.suite for r in suite.side_by_sides}
        assert named | {"dataset", "gpu"} == set(rb.ALL_SUITES)
    assert set(report.SECTIONS) == set(rb.RECORDED_SUITES) == set(report.COMMANDS)
    full = rb.configurations(False)
    gpt2 = next(r for r in full.side_by_sides if r.suite == "gpt2_side_by_side")
    # the configuration: 64 tokens, 4096 features for both, circuit-tracer at batch size 64,
    # circuitgraph at the same batch size (the same ranking rounds)
    assert (gpt2.n_pos, gpt2.max_feature_nodes, gpt2.ct_batch_size, gpt2.batch_size) == (64, 4096, 64, 64)
    assert gpt2.bundle == rb.Bundle("gpt2-size-dense", 12, 768, 12, 3072, 50257, 24576, 0.0085, 1024,
                                    calib_len=256, n_calib=16)
    long = [r for r in full.runs if r.suite == "long_prompt_gpt2"]
    assert [r.n_pos for r in long] == [256, 512, 1024, 2048]
    assert {(r.max_feature_nodes, r.memory_budget_gb) for r in long} == {(8192, 20.0)}
    assert long[0].bundle == rb.Bundle("gpt2-size-2k-random", 12, 768, 12, 3072, 50257, 24576, 0.0032, 2048,
                                       calib_len=256, n_calib=16, fit_decoder=False)


def _run(name: str, suite: str, n_pos: int, wall: float, peak_mb: float, *, mfn: int | None = None,
         d_sae: int = 64) -> dict:
    bundle = {"n_layers": 2, "d_model": 16, "n_heads": 4, "d_mlp": 32, "d_vocab": 23, "d_sae": d_sae,
              "active_frac": 0.01, "fit_decoder": True, "n_ctx": 4096}
    result = {"n_pos": n_pos, "n_active_features": 10 * n_pos, "active_per_token_per_layer": 5.0,
              "max_feature_nodes": mfn, "n_nodes": 100, "n_edges": 1000 * n_pos, "model_dtype": "float32",
              "graph_dtype": "float32", "timings_s": {"import": 1.0, "load": 1.0, "attribute": wall / 2, "scores": 0.1,
                                                      "prune": 0.1, "export_json": 0.1, "export_npz": 0.1},
              "completeness": {"max_relative_violation": 1e-7}, "peak_rss_mb": {"attribute": peak_mb},
              "pruned": {"n_nodes": 10, "n_edges": 20, "completeness": {"max_relative_violation": 1e-7}}}
    return {"name": name, "suite": suite, "bundle": "b", "bundle_config": bundle,
            "plan": {"reason": "fixed", "est_full_edges": 2e6, "est_full_peak_gb": 3.0, "est_mfn_peak_gb": 1.0,
                     "dry_run": {"n_edges_upper": 5000, "peak_gb": 1.5 * peak_mb / 1024, "verdict": "yes"}},
            "process": {"wall_s": wall, "user_s": wall, "sys_s": 0.0, "peak_rss_mb": peak_mb, "returncode": 0,
                        "load_avg_1min": {"start": 0.5, "mean": 0.5, "max": 0.7}},
            "result": result}


def _entry(suite: str, **more) -> dict:
    return {"suite": suite, "mode": "full", "command": f"python benchmarks/run_benchmarks.py --only {suite}",
            "reproduce": f"python benchmarks/run_benchmarks.py --only {suite}", "started": "2026-12-02 01:00:00 UTC",
            "total_seconds": 60.0, "machine": {"cpu": "Test CPU", "cpu_count": 2, "memory_gb": 24.0, "cuda": False,
                                               "python": "3.11", "torch": "2"},
            "load_avg_at_start": [0.3, 0.2, 0.1], "load_avg_at_end": [0.4, 0.2, 0.1],
            "code_at_start": {"commit": "abc1234", "subject": "s", "uncommitted_package_files": []},
            "environment": {"stripped_from_inherited": ["OMP_NUM_THREADS"]}, "runs": [], **more}


def _side_by_side(ct_e2e: dict[str, float], cg_e2e: float, cg_peak: float, ct_peak: float) -> dict:
    cli = {"wall_s": cg_e2e, "peak_rss_mb": cg_peak, "returncode": 0, "json_bytes": 10**6,
           "load_avg_1min": {"start": 0.2, "mean": 0.3, "max": 0.4}, "stage_times_s": {"graph": 1.0}}
    ct = {k: {"returncode": 0, "peak_rss_mb": ct_peak, "load_avg_1min": {"mean": 0.5},
              "environment": {} if k == "default" else {"OMP_WAIT_POLICY": "ACTIVE"},
              "pipeline": {"end_to_end_s": v, "timings_s": {"import": 2.0, "load": 1.0, "attribute": v - 5,
                                                            "create_graph_files": 2.0},
                           "n_active_features": 5000, "n_selected_features": 4096, "threads": 2, "json_bytes": 10**6}}
          for k, v in ct_e2e.items()}
    pruning = {"n_nodes_kept_ct": 50, "n_nodes_kept_circuitgraph": 50, "kept_nodes_equal": True,
               "n_edges_kept_ct": 300, "n_edges_kept_circuitgraph": 300, "kept_edges_equal": True,
               "n_edges_only_ct": 0, "n_edges_only_circuitgraph": 0, "n_nodes_kept_without_ct_node": 0}
    comparison = {"targets_equal": True, "n_nodes_ct": 5000, "n_nodes_circuitgraph": 5010, "nonzero_ct": 10**6,
                  "n_edges_circuitgraph": 10**6, "largest_edge": 3.0, "max_abs_difference": 1e-6,
                  "max_difference_relative_to_largest_edge": 3e-7, "pruning": pruning,
                  "selected_features": {"n_selected_ct": 4096, "n_selected_circuitgraph": 4096, "n_active_ct": 5000,
                                        "selected_features_equal": True, "n_only_ct": 0, "n_only_circuitgraph": 0}}
    return {"name": "sbs", "bundle": "b", "bundle_config": _run("x", "x", 1, 1, 1)["bundle_config"], "n_pos": 64,
            "max_feature_nodes": 4096, "batch_size": 64, "ct_batch_size": 64, "circuitgraph_cli_runs": [cli, cli],
            "circuitgraph_environment": {}, "circuit_tracer": ct, "comparison": comparison,
            "circuitgraph_stages": _run("side-by-side-sbs", "gpt2_side_by_side", 64, cg_e2e, cg_peak)}


def test_report_writes_every_table_from_merged_results(report, tmp_path):
    llama = _run("llama-1b-T64", "llama_1b", 64, 300.0, 12 * 1024.0, mfn=4096, d_sae=32768)
    long = [_run(f"gpt2-2k-T{t}", "long_prompt_gpt2", t, t * 0.5, 1000.0 + t, mfn=8192) for t in (256, 2048)]
    stopped = _run("gpt2-2k-T4096", "long_prompt_gpt2", 4096, 50.0, 20.5 * 1024, mfn=8192)
    del stopped["result"]
    stopped["process"].update(returncode=-9, killed_for_memory=True, log_tail="")
    long.append(stopped)
    results = {"format": 2, "suites": {
        "gpt2_side_by_side": _entry("gpt2_side_by_side", side_by_side=_side_by_side({"default": 1000.0}, 20.0,
                                                                                    4000.0, 14000.0),
                                    runs=[_run("gpt2-dense-T256", "gpt2_side_by_side", 256, 200.0, 9000.0, mfn=4096)]),
        "llama_1b": _entry("llama_1b", runs=[llama], ct_attempt={"fits": False, "why": "passed the 22 GiB cap after 80 s",
                                                                 "memory_cap_gb": 22.0, "time_cap_s": 3600.0,
                                                                 "batch_size": 64, "max_feature_nodes": 4096}),
        "long_prompt_gpt2": _entry("long_prompt_gpt2", runs=long),
        "dataset": _entry("dataset", dataset={"record": {"runs": [{
            "executor": "local", "workers": 1, "prompts": 4, "prompts_per_minute": 30.0,
            "steady_prompts_per_minute": 40.0, "mean_prompt_seconds": 1.5, "reduce_seconds_total": 0.1,
            "aggregate_seconds": 0.2, "aggregation_overhead": 0.01, "load_before": [0.1], "load_after": [0.2]}]}}),
        "gpu": _entry("gpu", skipped="no GPU lent to this session (device tool status: not drawn)"),
    }}
    report.write_report(results, tmp_path)
    text = (tmp_path / "README.md").read_text()
    # a suite not recorded yet says so, with its command
    assert "## Side by side with circuit-tracer: 6 layers, 32 tokens" in text
    assert "Not recorded yet. Command: `python benchmarks/run_benchmarks.py --only side_by_side --ct-env both`" in text
    # GPT-2 size: the 50x ratio with the default environment meets the 40x target; lower peak; same features
    assert "| 50.0x | >= 40x with circuit-tracer's default environment: met |" in text
    assert "lower: met" in text and "equal: met" in text
    assert "4,096 / 4,096 (of 5,000 active), equal: True" in text
    assert "gpt2-dense-T256: completed True, peak 8.79 GB: within 16 GiB met." in text
    # the machine, the load at start and end, the commit and the command of each recorded section
    assert text.count("on Test CPU, 2 cores, 24 GB RAM") == 5 and "commit `abc1234`" in text
    assert "0.3 at the start, 0.4 at the end" in text and "`OMP_NUM_THREADS`" in text
    assert "Command: `python benchmarks/run_benchmarks.py --only llama_1b`" in text
    # Llama: within 16 GiB, the dry run next to the measured peak, circuit-tracer does not fit
    assert "| llama-1b-T64 | True | 300.0 | 12.00 | met | 18.00 (1.50x), yes |" in text
    assert "**does not fit**: passed the 22 GiB cap after 80 s" in text
    # long prompts: the 30-minute target, the plot
    assert "2048 tokens: 17.1 min, peak 3.0 GiB; target 30 min and 20 GiB: met." in text
    assert (tmp_path / "long_prompts_gpt2.png").stat().st_size > 0
    head = next(line for line in text.splitlines() if line.startswith("| run | tokens |"))
    row = next(line for line in text.splitlines() if line.startswith("| gpt2-2k-T4096 |"))
    assert "FAILED (exit -9, stopped at the memory budget)" in row and row.count("|") == head.count("|")
    assert "| local | 1 | 4 | 30.0 | 40.0 |" in text
    # a longest prompt stopped at the time limit: what it had done, and the target not met
    timed = _run("gpt2-2k-T8192", "long_prompt_gpt2", 8192, 1800.0, 15.0 * 1024, mfn=8192)
    del timed["result"]
    timed["n_pos"] = 8192
    timed["process"].update(returncode=-9, killed_for_time=True, log_tail="")
    timed["progress_at_stop"] = {"seconds": 1790.5, "done": 2304, "total": 8192}
    results["suites"]["long_prompt_gpt2"]["runs"] = long + [timed]
    report.write_report(results, tmp_path)
    text = (tmp_path / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| gpt2-2k-T8192 |"))
    assert "FAILED (exit -9, stopped at the time limit after 1790.5 s: 2304 / 8192)" in row
    assert ("8192 tokens: stopped at the time limit after 30.0 min, 2304 / 8192 feature rows done; "
            "target 30 min and 20 GiB: not met.") in text
    assert "skipped: no GPU lent to this session (device tool status: not drawn)" in text
    assert text.count("```bash no-run") == 1  # the page's one reproduce block is not run by the docs test


def test_side_by_side_ratio_uses_the_default_environment(report, tmp_path):
    sbs = _side_by_side({"default": 100.0, "tuned": 200.0}, 10.0, 500.0, 1000.0)
    report.write_report({"format": 2, "suites": {"side_by_side": _entry("side_by_side", side_by_side=sbs)}}, tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "circuit-tracer 0.5.0 (default env.) | circuit-tracer 0.5.0 (tuned env.) | circuitgraph |" in text
    assert "| 10.0x | 20.0x | >= 15x with circuit-tracer's default environment: NOT met |" in text
    paragraph = report.readme_paragraph({"format": 2, "suites": {"side_by_side": _entry("side_by_side",
                                                                                        side_by_side=sbs)}})
    assert max(len(line) for line in paragraph.splitlines()) <= 92
    paragraph = " ".join(paragraph.split())
    assert "takes 10.0 s against circuit-tracer 0.5.0's 100.0 s in its default environment (10.0x)" in paragraph
    assert "the same selected features, kept nodes and kept edges" in paragraph


def test_readme_paragraph_is_rewritten_between_its_markers(report, tmp_path):
    empty = " ".join(report.readme_paragraph({"format": 2, "suites": {}}).split())
    assert "appear here once recorded" in empty and "docs/benchmarks/README.md" in empty
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{report.README_START}\nold 12x text\n{report.README_END}\n\n## next\n")
    report.rewrite_readme(readme, "new paragraph")
    assert readme.read_text() == f"# x\n\n{report.README_START}\nnew paragraph\n{report.README_END}\n\n## next\n"
    readme.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="markers are missing"):
        report.rewrite_readme(readme, "new paragraph")
    assert readme.read_text() == "# no markers\n"
    # the repository's README has the markers
    text = (REPO / "README.md").read_text()
    assert text.index(report.README_START) < text.index(report.README_END)


def test_selected_features_are_compared_as_sets():
    sbs = side_by_side
    ct = {"active_features": np.array([[0, 1, 5], [0, 2, 7], [1, 3, 9]]), "selected_features": np.array([0, 2])}

    def graph(*triples):
        nodes = [SimpleNamespace(kind="feature", id=SimpleNamespace(layer=a, position=b, index=c)) for a, b, c in triples]
        nodes.append(SimpleNamespace(kind="remainder", id=SimpleNamespace(layer=0, position=2, index=0)))
        return SimpleNamespace(nodes=nodes)

    same = sbs.selected_features_agreement(ct, graph((1, 3, 9), (0, 1, 5)))
    assert same["selected_features_equal"] and same["n_selected_ct"] == same["n_selected_circuitgraph"] == 2
    other = sbs.selected_features_agreement(ct, graph((0, 1, 5), (0, 2, 7)))
    assert not other["selected_features_equal"]
    assert other["only_ct"] == [[1, 3, 9]] and other["only_circuitgraph"] == [[0, 2, 7]]


def test_edge_difference_sets_remainder_edges_aside_but_not_missing_or_wrong_edges():
    """circuitgraph's remainder nodes (max_feature_nodes) hold what circuit-tracer leaves out: their
    edges are counted apart; an edge that differs, or one circuit-tracer has and circuitgraph lacks,
    is still a difference."""
    sbs = side_by_side
    kinds = ["feature", "feature", "logit", "remainder"]
    graph = SimpleNamespace(nodes=[SimpleNamespace(kind=k, id=str(i)) for i, k in enumerate(kinds)],
                            edge_target=np.array([2, 2, 2]), edge_source=np.array([0, 1, 3]),
                            edge_weight=np.array([1.0, 2.0, 5.0]), n_edges=3)
    row_map = np.array([0, 1, 2, -1])  # the remainder node has no circuit-tracer row
    adjacency = np.zeros((3, 3), dtype=np.float32)
    adjacency[2, 0], adjacency[2, 1] = 1.0, 2.0
    same = sbs.edge_difference(adjacency.copy(), graph, row_map)
    assert same["max_abs_difference"] == 0.0
    assert (same["n_remainder_edges_circuitgraph"], same["largest_remainder_edge_circuitgraph"]) == (1, 5.0)
    wrong = adjacency.copy()
    wrong[2, 1] = 2.5
    assert sbs.edge_difference(wrong, graph, row_map)["max_abs_difference"] == pytest.approx(0.5)
    missing = adjacency.copy()
    missing[1, 0] = 0.75  # an edge circuit-tracer has, circuitgraph not
    assert sbs.edge_difference(missing, graph, row_map)["largest_ct_entry_without_circuitgraph_edge"] == 0.75


def test_report_names_runs_kept_from_an_earlier_invocation(report, tmp_path):
    """``--runs`` re-measures some runs of a suite and keeps the others: the page says which runs
    were kept and the commit they were measured with."""
    old = _run("gpt2-2k-T256", "long_prompt_gpt2", 256, 90.0, 7000.0, mfn=8192)
    old["recorded_with"] = {"started": "2026-12-01 10:00:00 UTC", "code": {"commit": "0ld0ld0"}, "command": "x"}
    new = _run("gpt2-2k-T2048", "long_prompt_gpt2", 2048, 2000.0, 15000.0, mfn=8192)
    results = {"format": 2, "suites": {"long_prompt_gpt2": _entry("long_prompt_gpt2", runs=[old, new])}}
    report.write_report(results, tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "run gpt2-2k-T256 kept from an earlier invocation (2026-12-01 10:00:00 UTC, commit `0ld0ld0`)" in text
    assert "run gpt2-2k-T2048 kept" not in text


def test_recorded_commands_name_the_work_folder_not_this_machines_path(rb, tmp_path, monkeypatch):
    monkeypatch.setattr(rb, "_WORK", [tmp_path])
    assert rb._portable(str(tmp_path)) == "$WORK"
    assert rb._portable(str(tmp_path / "bundles" / "x")) == "$WORK/bundles/x"
    assert rb._portable(str(rb.REPO / "benchmarks" / "x.py")) == "benchmarks/x.py"


def test_progress_lines_of_bench_one_are_parsed(rb):
    """bench_one's progress line (what a run stopped at its time limit had done) as the harness reads it."""
    assert rb.PROGRESS_LINE.match("[progress 1790.5 s] 2304 / 8192").groups() == ("1790.5", "2304", "8192")
    assert rb.PROGRESS_LINE.match("Changing model dtype to torch.float32") is None
