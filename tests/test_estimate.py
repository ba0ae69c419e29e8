"""The memory estimate and guard (circuitgraph.pipeline.estimate): the edge bound is an upper
bound of the edges built, max_feature_nodes and neuron_top_k are accounted for, the advice
given when a run does not fit makes it fit, the dry run exits 4 on "fits: NO", and the
estimated peak bounds the measured peak of real runs within a small factor."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution.engine import compute_edges
from circuitgraph.attribution.feature_selection import select_and_compute
from circuitgraph.attribution.linearisation import linearise
from circuitgraph.attribution.nodes_builder import GraphOptions, collect_nodes
from circuitgraph.attribution.targets import top_logit_targets
from circuitgraph.cli.main import EXIT_DOES_NOT_FIT, app
from circuitgraph.errors import ResourceError
from circuitgraph.pipeline import estimate
from circuitgraph.pipeline.estimate import FLOAT64_EXTRA_BYTES, MFN_EDGE_PEAK_BYTES, check_plan, plan_edges
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model
from tests.helpers.graphs import stub_transcoders

TOKENS = [1, 5, 7, 2, 9, 3, 11, 4, 8, 6, 10, 12, 13, 14, 15, 16]


def _collected(mlp: str, attention: str = "frozen", **opts):
    model = tiny_model(seed=1, n_layers=3, n_ctx=len(TOKENS))
    tcs = stub_transcoders(model, TOKENS, d_sae=48, active_frac=0.3) if mlp == "transcoders" else None
    adapter = ModelAdapter(model.to(torch.float64))
    lin = linearise(adapter, torch.tensor(TOKENS), tcs)
    targets = top_logit_targets(lin.logits, position=len(TOKENS) - 1, max_n=3, cumulative_probability=0.95)
    L = model.cfg.n_layers
    options = GraphOptions(mlp={l: mlp for l in range(L)}, attention={l: attention for l in range(L)},
                           dtype=torch.float64, **opts)
    return collect_nodes(adapter, lin, tcs, targets, options), options, 2 * L + 1


def _plan(col, options, n_locs, limit=10**15):
    return plan_edges(col, options, n_locs, len(TOKENS), limit=limit, base=0)


@pytest.mark.parametrize("mlp,attention", [("transcoders", "frozen"), ("neurons", "frozen"), ("mlp", "frozen"),
                                            ("neurons", "heads")])
def test_edge_bound_is_an_upper_bound(mlp, attention):
    col, options, n_locs = _collected(mlp, attention)
    plan = _plan(col, options, n_locs)
    built = compute_edges(col).target.size
    assert built <= plan.n_edges_upper
    assert plan.n_edges_upper <= 3 * built  # causality, not n_readers x n_writers
    if mlp == "transcoders":
        options.max_feature_nodes = 20
        plan = _plan(col, options, n_locs)
        assert plan.max_feature_nodes == 20 and plan.bytes_per_edge == MFN_EDGE_PEAK_BYTES + FLOAT64_EXTRA_BYTES
        rows, _ = select_and_compute(col, 20, batch_size=8)
        assert rows.n_edges <= plan.n_edges_upper < _plan(col, GraphOptions(**{
            **options.__dict__, "max_feature_nodes": None}), n_locs).n_edges_upper


def test_max_feature_nodes_advice_makes_the_run_fit():
    col, options, n_locs = _collected("transcoders")
    full = _plan(col, options, n_locs)
    limit = full.bytes_peak - full.bytes_edges + full.bytes_edges // 3
    plan = _plan(col, options, n_locs, limit)
    assert not plan.fits
    advice = "; ".join(plan.advice)
    k = int(re.search(r"graph\.max_feature_nodes: (\d+)", advice).group(1))
    assert "neuron_top_k" not in advice  # only advice that applies to this graph
    options.max_feature_nodes = k
    assert _plan(col, options, n_locs, limit).fits
    options.max_feature_nodes = k + 1
    assert not _plan(col, options, n_locs, limit).fits
    with pytest.raises(ResourceError, match="max_feature_nodes: "):
        check_plan(plan)


def test_neuron_top_k_advice_makes_the_run_fit():
    col, options, n_locs = _collected("neurons")
    full = _plan(col, options, n_locs)
    limit = full.bytes_peak - full.bytes_edges + full.bytes_edges // 3
    plan = _plan(col, options, n_locs, limit)
    advice = "; ".join(plan.advice)
    assert "max_feature_nodes" not in advice  # a neuron graph has no features to select
    k = int(re.search(r"graph\.neuron_top_k: (\d+)", advice).group(1))
    col_k, options_k, _ = _collected("neurons", neuron_top_k=k)
    assert _plan(col_k, options_k, n_locs, limit).fits
    col_k1, options_k1, _ = _collected("neurons", neuron_top_k=k + 1)
    assert not _plan(col_k1, options_k1, n_locs, limit).fits
    assert "graph.mlp: mlp" in advice
    col_m, options_m, _ = _collected("mlp")
    assert _plan(col_m, options_m, n_locs, limit).fits


def _bundle(tmp_path: Path, n_ctx: int = 48) -> Path:
    model = tiny_model(seed=2, n_layers=3, d_model=32, d_mlp=128, d_vocab=50, n_ctx=n_ctx)
    return save_bundle(tmp_path / "bundle", model, random_transcoders(model, d_sae=256, active_frac=0.3))


def _spec(tmp_path: Path, bundle: Path, graph: dict, n_pos: int = 48) -> Path:
    tokens = [1] + [3 + (7 * i) % 45 for i in range(n_pos - 1)]
    spec = {"format_version": 1, "model": {"path": str(bundle / "model")},
            "transcoders": {"path": str(bundle / "transcoders")}, "prompt": {"tokens": tokens},
            "targets": [{"top_logits": {"max_n": 5}}], "graph": graph,
            "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
            "export": {"json": str(tmp_path / "out" / f"g{len(list(tmp_path.glob('*.json')))}.json")}}
    path = tmp_path / f"spec{len(list(tmp_path.glob('spec*.json')))}.json"
    path.write_text(json.dumps(spec))
    return path


def test_dry_run_exits_4_when_it_does_not_fit(tmp_path, monkeypatch):
    bundle = _bundle(tmp_path, n_ctx=16)
    spec = _spec(tmp_path, bundle, {"mlp": "transcoders"}, n_pos=16)
    res = CliRunner().invoke(app, ["run", str(spec), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "fits: yes" in res.output and "edges at most" in res.output
    real = estimate.process_memory()
    # pretend that only a little more than what the process holds is available
    monkeypatch.setattr(estimate, "available_memory", lambda: 0)
    monkeypatch.setattr(estimate, "process_memory", lambda: real)
    res = CliRunner().invoke(app, ["run", str(spec), "--dry-run"])
    assert res.exit_code == EXIT_DOES_NOT_FIT, res.output
    assert "fits: NO" in res.output
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def shared_bundle(tmp_path_factory):
    return _bundle(tmp_path_factory.mktemp("estimate"))


_MEASURE = """
import json, resource, subprocess, sys
out = {}
for mode in ("run", "dry"):  # the real run first: ru_maxrss of the children is then its peak
    cmd = [sys.executable, "-m", "circuitgraph", "run", sys.argv[1], "--quiet"] + (["--dry-run"] if mode == "dry" else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    out[mode] = p.stdout + p.stderr
    out[mode + "_rc"] = p.returncode
    if mode == "run":
        out["peak"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps(out))
"""


@pytest.mark.parametrize("graph", [
    {"mlp": "transcoders"},
    {"mlp": "transcoders", "max_feature_nodes": 200},
    {"mlp": "neurons", "attention": "heads"},
], ids=["transcoders", "max_feature_nodes", "neurons-heads"])
def test_estimate_bounds_the_measured_peak(tmp_path, shared_bundle, graph):
    """The dry run's peak is at least the real run's measured peak (ru_maxrss of the process) and,
    less what the exports add at their bound (pruning keeping every edge it may: real pruning
    keeps a few percent), at most twice it."""
    spec = _spec(tmp_path, shared_bundle, graph)
    res = subprocess.run([sys.executable, "-c", _MEASURE, str(spec)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=600)
    out = json.loads(res.stdout)
    assert out["dry_rc"] == 0 and out["run_rc"] == 0, out
    est = float(re.search(r"peak at most about ([\d.]+) GB", out["dry"]).group(1)) * 1024**3
    assert est >= out["peak"], (est / 1024**3, out["peak"] / 1024**3)
    exports = float(re.search(r"the exports add up to ([\d.]+) GB", out["dry"]).group(1)) * 1024**3
    assert est - exports <= 2 * out["peak"], (est / 1024**3, exports / 1024**3, out["peak"] / 1024**3)


def test_max_feature_nodes_rows_are_watched_as_they_are_computed():
    """Which rows max_feature_nodes selects is known only as they are computed: the plan gives a
    lower and an upper bound, the build refuses only when even the narrowest rows cannot fit,
    and check_rows stops a run whose computed rows show that it will not fit."""
    from circuitgraph.pipeline.estimate import check_rows

    col, options, n_locs = _collected("transcoders", max_feature_nodes=20)
    plan = _plan(col, options, n_locs)
    assert plan.n_edges_lower <= plan.n_edges_upper and plan.may_fit
    plan.limit = plan.bytes_peak_lower  # only the narrowest rows fit
    assert plan.may_fit and not plan.fits
    check_plan(plan)  # not refused before the rows are known
    done = 5 * 10**5  # edges of the first 5 rows
    plan.limit = plan.bytes_fixed + (done + 35 * plan.min_row_edges) * plan.bytes_per_edge
    check_rows(plan, 5, done, 40)  # the remaining rows could still fit
    plan.limit -= plan.bytes_per_edge
    with pytest.raises(ResourceError, match=r"after 5 of the 40 rows .*more than"):
        check_rows(plan, 5, done, 40)
