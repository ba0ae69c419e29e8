"""The memory budget (``--memory-limit GB``, ``CIRCUITGRAPH_MEMORY_LIMIT``, ``memory_limit=``) and
the watch that keeps a run under it (circuitgraph.pipeline.memory_watch), the later stages the
estimate counts (circuitgraph.pipeline.stage_memory), and the exports' edge limit: the budget
lowers the advice, an over-budget run stops with advice and writes nothing, the advice followed
fits (the exports' limit included), and the estimate bounds each stage's measured growth."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import circuitgraph
from circuitgraph.cli.main import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, app
from circuitgraph.errors import ResourceError, SpecError
from circuitgraph.pipeline import memory_watch
from circuitgraph.pipeline.memory_watch import MEMORY_LIMIT_ENV, MemoryWatch, memory_budget, parse_gb, run_limit
from circuitgraph.pipeline.runner import run
from circuitgraph.pipeline.stage_memory import later_stages
from circuitgraph.spec import load_spec
from circuitgraph.testing.synthetic import save_bundle, tiny_model

GB = 1024**3


# ---------------------------------------------------------------------------- the budget
def test_budget_from_python_env_and_cli_units(monkeypatch):
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    assert memory_budget(None) is None
    assert memory_budget(123) == 123  # bytes from Python
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "2.5")
    assert memory_budget(None) == int(2.5 * GB)  # GB from the environment
    assert memory_budget(7) == 7  # the explicit budget wins
    assert parse_gb("6", "--memory-limit") == 6 * GB
    for bad in ("lots", "0", "-1", "nan"):
        monkeypatch.setenv(MEMORY_LIMIT_ENV, bad)
        with pytest.raises(SpecError, match=MEMORY_LIMIT_ENV):
            memory_budget(None)


def test_budget_lowers_the_limit_never_raises_it(monkeypatch):
    monkeypatch.setattr(memory_watch, "available_memory", lambda: 10 * GB)
    monkeypatch.setattr(memory_watch, "process_memory", lambda: 2 * GB)
    usable = int(memory_watch.USABLE * 12 * GB)
    assert run_limit(None) == usable
    assert run_limit(3 * GB) == 3 * GB
    assert run_limit(100 * GB) == usable  # a budget above the machine's memory changes nothing


# ---------------------------------------------------------------------------- the watch
def test_watch_stops_a_stage_that_passes_the_limit():
    """A stage that keeps allocating is stopped soon after it passes the limit: a ResourceError
    that names the stage and the fix, not the operating system's killer."""
    import psutil

    start = psutil.Process().memory_info().rss
    watch = MemoryWatch(start + 64 * 1024**2, interval=0.005, budget_given=True)
    held = []
    with pytest.raises(ResourceError, match=r"stopped in stage 'grow'.*more than the .*--memory-limit"):
        with watch.watching(), watch.stage("grow"):
            for _ in range(400):  # up to 1.6 GB in 4 MB steps, each page touched
                held.append(np.ones(512 * 1024))
                time.sleep(0.002)  # a stage's real work lets the watch's thread run; a bare loop on a busy machine may not
    grown = len(held) * 4 * 1024**2
    del held
    assert 48 * 1024**2 <= grown <= 1024**3  # stopped past the limit, long before the end
    assert watch.peaks["grow"] > start


def test_watch_records_each_stage_and_passes_other_interrupts():
    watch = MemoryWatch(None)
    with watch.watching():
        with watch.stage("a"):
            x = np.ones(4 * 1024**2)  # 32 MB
        del x
    assert set(watch.peaks) >= {"a"} and watch.starts["a"] <= watch.peaks["a"]
    with pytest.raises(KeyboardInterrupt):  # a user's Ctrl-C is not turned into a memory error
        with MemoryWatch(None).watching():
            raise KeyboardInterrupt


# ---------------------------------------------------------------------------- runs on a tiny model
@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    model = tiny_model(seed=3, n_layers=2, d_model=32, d_mlp=64, d_vocab=50, n_ctx=24)
    return save_bundle(tmp_path_factory.mktemp("budget") / "bundle", model)


def _spec(out: Path, bundle: Path, n_pos: int = 24, **extra) -> dict:
    tokens = [1] + [3 + (7 * i) % 45 for i in range(n_pos - 1)]
    spec = {"format_version": 1, "model": {"path": str(bundle / "model")}, "prompt": {"tokens": tokens},
            "targets": [{"top_logits": {"max_n": 3}}], "graph": {"mlp": "neurons"},
            "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
            "queries": [{"top_paths": {"source": {"kind": "embedding"}}}, {"scores": {}}],
            "export": {"json": str(out / "g.json"), "svg": str(out / "g.svg"), "graph": str(out / "g.npz")}}
    spec.update(extra)
    return spec


def _no_outputs(out: Path) -> bool:
    return not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]


def test_over_budget_run_stops_and_writes_nothing(tmp_path, bundle, monkeypatch):
    out = tmp_path / "out"
    spec = _spec(out, bundle)
    spec["export"].pop("svg")  # no Graphviz needed
    with pytest.raises(ResourceError, match="memory|may use"):
        run(spec, memory_limit=64 * 1024**2)  # far below what the model and the forward pass hold
    assert _no_outputs(out)
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "0.0625")  # the same budget from the environment
    with pytest.raises(ResourceError):
        circuitgraph.run(spec)
    assert _no_outputs(out)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    monkeypatch.delenv(MEMORY_LIMIT_ENV)
    res = CliRunner().invoke(app, ["run", str(path), "--quiet", "--memory-limit", "0.0625"])
    assert res.exit_code == EXIT_BAD_INPUT and "error:" in res.output
    assert _no_outputs(out)
    res = CliRunner().invoke(app, ["run", str(path), "--memory-limit", "x"])
    assert res.exit_code == EXIT_BAD_INPUT and "--memory-limit" in res.output


def _fits(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith("fits:"))


def _advice_k(lines: list[str], setting: str = "neuron_top_k") -> int | None:
    m = re.search(rf"graph\.{setting}: (\d+)", _fits(lines))
    return int(m.group(1)) if m else None


def _peak_and_edges(lines: list[str]) -> tuple[float, float]:
    text = "\n".join(lines)
    peak = float(re.search(r"peak at most about ([\d.]+) GB", text).group(1))
    limit = float(re.search(r"of the ([\d.]+) GB a run may use", text).group(1))
    return peak, limit


_RUN = """
import json, sys
import circuitgraph
limit = int(float(sys.argv[2]) * 1024**3)
if sys.argv[3] == "dry":
    print(json.dumps(circuitgraph.dry_run(sys.argv[1], memory_limit=limit)))
else:
    r = circuitgraph.run(sys.argv[1], memory_limit=limit)
    print(json.dumps(max(m["peak"] for m in r.memory.values())))
"""


def _in_process(spec: dict, path: Path, budget_gb: float, mode: str):
    """A dry run or a run in its own process (as the CLI runs them: the same starting memory)."""
    path.write_text(json.dumps(spec))
    res = subprocess.run([sys.executable, "-c", _RUN, str(path), repr(budget_gb), mode], capture_output=True,
                         text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_budget_lowers_the_advice_and_the_advice_fits(tmp_path, bundle):
    """A dry run over its budget advises a neuron_top_k; the spec with that setting fits the same
    budget in a dry run and runs under it (every stage and export included, measured); a lower
    budget advises less.  Each in its own process, as the CLI runs them."""
    out = tmp_path / "out"
    spec = _spec(out, bundle)
    spec["export"].pop("svg")
    lines = _in_process(spec, tmp_path / "a.json", 1000.0, "dry")
    assert _fits(lines) == "fits: yes", lines
    peak, _ = _peak_and_edges(lines)
    base = float(re.search(r"memory: ([\d.]+) GB after", "\n".join(lines)).group(1))
    # budgets between what the process holds and the estimated peak: the graph no longer fits
    hi, lo = base + (peak - base) * 0.9, base + (peak - base) * 0.6
    advice = {}
    for budget in (hi, lo):
        lines = _in_process(spec, tmp_path / "b.json", budget, "dry")
        assert _fits(lines).startswith("fits: NO"), lines
        advice[budget] = _advice_k(lines)
    assert advice[hi] is not None and advice[lo] is not None and advice[lo] <= advice[hi]
    followed = {**spec, "graph": {"mlp": "neurons", "neuron_top_k": advice[hi]}}
    assert _fits(_in_process(followed, tmp_path / "c.json", hi, "dry")) == "fits: yes"
    measured = _in_process(followed, tmp_path / "c.json", hi, "run")
    assert (out / "g.json").is_file() and measured <= hi * GB


def test_json_limit_is_met_by_pruning_and_checked_before_the_sweep(tmp_path, bundle):
    """Pruning keeps at most the edges the JSON export writes (the most influential, with a
    warning), so the export never refuses after the sweep; an unpruned graph that could exceed
    the limit is refused before the sweep, with advice, and the dry run says so."""
    out = tmp_path / "out"
    spec = _spec(out, bundle, prune={"node_threshold": 1.0, "edge_threshold": 1.0})
    spec["export"] = {"json": str(out / "g.json"), "max_json_edges": 1000}
    result = run(spec)
    assert 0 < result.graph.n_edges <= 1000 < result.full_graph.n_edges
    assert any("max_json_edges" in w for w in result.full_graph.metadata["warnings"])
    assert len(json.loads((out / "g.json").read_text())["edges"]) == result.graph.n_edges

    out2 = tmp_path / "out2"
    unpruned = _spec(out2, bundle, prune="none")
    unpruned["export"] = {"json": str(out2 / "g.json"), "max_json_edges": 1000}
    lines = circuitgraph.dry_run(unpruned)
    assert _fits(lines).startswith("fits: NO") and "max_json_edges" in "\n".join(lines), lines
    with pytest.raises(ResourceError, match="max_json_edges"):
        run(unpruned)
    assert _no_outputs(out2)
    path = tmp_path / "unpruned.json"
    path.write_text(json.dumps(unpruned))
    res = CliRunner().invoke(app, ["run", str(path), "--dry-run"])
    assert res.exit_code == EXIT_DOES_NOT_FIT


def test_later_stages_count_what_the_spec_runs(tmp_path, bundle):
    """Queries on the full graph raise the bytes per full-graph edge; exports count per kept edge;
    JSON's limit caps the kept edges; a spec without them costs the sweep alone."""
    base = _spec(tmp_path, bundle)
    bare = load_spec({**base, "queries": [], "export": {}, "prune": "none"})
    heavy = load_spec(base)
    pruned_queries = load_spec({**base, "queries": [{"top_paths": {"source": {"kind": "embedding"}}, "on": "pruned"}]})
    b, h, p = later_stages(bare), later_stages(heavy), later_stages(pruned_queries)
    assert h.full_edge_bytes > b.full_edge_bytes and h.full_edge_bytes >= p.full_edge_bytes
    assert h.kept_edge_bytes > b.kept_edge_bytes == 0
    assert h.kept_cap == heavy.export.max_json_edges and b.kept_cap is None
    assert "top_paths" in h.heaviest


def test_neuron_tables_that_cannot_fit_are_planned_from_a_probe(tmp_path, bundle, monkeypatch):
    """A neuron graph whose node tables alone would not fit (a long prompt without neuron_top_k)
    is never built: the nodes are collected with a probe's neuron_top_k, the plan counts every
    neuron's table, the dry run says NO with a neuron_top_k within the probe, the run is refused
    before the sweep with the same advice, and that advice, followed, fits."""
    from circuitgraph.attribution import plan as plan_mod

    out = tmp_path / "out"
    spec = _spec(out, bundle)
    spec["export"].pop("svg")
    # 2 MB a neuron at d_model 32 (the recorded cost is per 576 dimensions): 3,072 neurons = 6 GB
    monkeypatch.setattr(plan_mod, "NEURON_NODE_BYTES", 36 * 1024**2)
    # 1 GB of room above what the process holds, after the advice's margin (a share of the budget,
    # so in a test session that already holds GBs the margin alone would eat the room)
    budget = int((memory_watch.process_memory() + GB) / (1 - plan_mod.ADVICE_MARGIN))
    lines = circuitgraph.dry_run(spec, memory_limit=budget)
    k = _advice_k(lines)
    probe = plan_mod.neuron_probe_top_k(2 * 24, 64, 32, budget - memory_watch.process_memory())
    assert _fits(lines).startswith("fits: NO") and k is not None and 1 <= k <= probe < 64, lines
    with pytest.raises(ResourceError, match=r"neuron_top_k: \d+"):
        run(spec, memory_limit=budget)
    assert _no_outputs(out)
    followed = {**spec, "graph": {"mlp": "neurons", "neuron_top_k": k}}
    assert _fits(circuitgraph.dry_run(followed, memory_limit=budget)) == "fits: yes"
    run(followed, memory_limit=budget)
    assert (out / "g.json").is_file()


def _kernel_resets_the_peak() -> bool:
    from circuitgraph.pipeline.check_estimate import reset_peak

    return reset_peak()


@pytest.mark.parametrize("peak", ["kernel", "sampled"])
def test_the_loading_peak_is_the_dry_runs_own(tmp_path, bundle, monkeypatch, peak):
    """A dry run in a process that once held much more (a notebook, a test session) counts the
    peak of its own loading, not the process's lifetime peak: that made every advice on a tiny
    model 'shorten the prompt' after the real-model tests had run in the same pytest process.
    Where the kernel's peak cannot be reset (a sandbox's /proc: the CI machine's), a sampler
    measures it instead."""
    import psutil

    from circuitgraph.pipeline import check_estimate

    if peak == "kernel" and not _kernel_resets_the_peak():
        pytest.skip("this kernel does not reset the peak (/proc/self/clear_refs): the sampled case covers it")
    if peak == "sampled":
        monkeypatch.setattr(check_estimate, "reset_peak", lambda: False)  # as where the reset has no effect
    held = psutil.Process().memory_info().rss / 1e9  # what the process holds now (earlier tests' caches)
    big = np.ones(int(2e9 // 8))
    big[::512] = 2.0  # touch the pages: the lifetime peak is now above held + 2 GB
    del big
    lines = circuitgraph.dry_run(_spec(tmp_path, bundle))
    loading = [float(m.group(1)) for line in lines for m in [re.search(r"loading peaked at ([0-9.]+) GB", line)] if m]
    assert loading and loading[0] < held + 1.5, (held, lines)


def test_the_sampled_peak_sees_what_the_block_held(monkeypatch):
    """Without the kernel's reset the watch samples: a block that holds 400 MB for a while reads at
    least that much added, and nothing the process held before it."""
    import time

    from circuitgraph.pipeline import check_estimate

    monkeypatch.setattr(check_estimate, "reset_peak", lambda: False)
    with check_estimate.PeakWatch() as watch:
        block = np.ones(int(4e8 // 8))
        block[::512] = 2.0
        time.sleep(0.05)
        del block
    assert watch.sampled and 3.5e8 < watch.added < 6e8, watch.added


@pytest.fixture(scope="module")
def wide_bundle(tmp_path_factory):
    """A neuron graph whose full graph (15,872 neurons, 33 M possible edges) does not fit 1.5 GB."""
    model = tiny_model(seed=3, n_layers=2, d_model=32, d_mlp=256, d_vocab=50, n_ctx=32)
    return save_bundle(tmp_path_factory.mktemp("wide") / "bundle", model)


def test_max_neuron_nodes_advice_fits_when_followed(tmp_path, wide_bundle):
    """A neuron graph over its budget is advised a max_neuron_nodes K (planned from the
    activations, before any candidate is collected); the spec with K fits the same budget in its
    dry run, and its run, measured in its own process, peaks under the memory the dry run says
    it may use and under the dry run's estimate, every stage and export included."""
    out = tmp_path / "out"
    spec = _spec(out, wide_bundle, n_pos=32)
    spec["export"].pop("svg")
    budget = 1.5
    lines = _in_process(spec, tmp_path / "a.json", budget, "dry")
    k = _advice_k(lines, "max_neuron_nodes")
    assert _fits(lines).startswith("fits: NO") and k is not None and 1 <= k < 15872, lines
    followed = {**spec, "graph": {"mlp": "neurons", "max_neuron_nodes": k}}
    lines = _in_process(followed, tmp_path / "b.json", budget, "dry")
    assert _fits(lines) == "fits: yes", lines
    estimate, limit = _peak_and_edges(lines)
    assert estimate <= limit <= budget
    measured = _in_process(followed, tmp_path / "b.json", budget, "run")
    assert (out / "g.json").is_file() and (out / "g.npz").is_file()
    assert measured <= estimate * GB, (measured / GB, estimate)


def test_advice_with_a_probed_check_is_the_graphs_and_fits(tmp_path, wide_bundle):
    """With a check that runs the model (predicted_vs_actual, probed by the dry run), a neuron
    graph over its budget is still advised a smaller graph (the check fits next to the model, so
    the advice, which counts the check's forward passes, is the graph's); followed, its dry run
    fits and counts the check's stage, and the run peaks under the estimate."""
    out = tmp_path / "out"
    spec = _spec(out, wide_bundle, n_pos=32, validate=[{"predicted_vs_actual": {"k": 20}}])
    spec["export"].pop("svg")
    budget = 1.5
    lines = _in_process(spec, tmp_path / "a.json", budget, "dry")
    k = _advice_k(lines, "max_neuron_nodes")
    assert _fits(lines).startswith("fits: NO - set graph.") and k is not None, lines
    followed = {**spec, "graph": {"mlp": "neurons", "max_neuron_nodes": k}}
    lines = _in_process(followed, tmp_path / "b.json", budget, "dry")
    assert _fits(lines) == "fits: yes", lines
    text = "\n".join(lines)
    assert "validate[0] predicted_vs_actual: 24 forward passes" in text and "its stage peaks at about" in text, text
    estimate, limit = _peak_and_edges(lines)
    assert estimate <= limit <= budget
    measured = _in_process(followed, tmp_path / "b.json", budget, "run")
    assert (out / "g.json").is_file()
    assert measured <= estimate * GB, (measured / GB, estimate)
