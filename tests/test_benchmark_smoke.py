"""The benchmark code path on a tiny bundle, and the sparse edges against a dense reference.

* ``benchmarks/bench_one.py`` (one benchmark run: load, attribute, scores, prune, exports) and
  ``benchmarks/report.py`` (tables and plots) on a tiny model, in-process;
* the sparse edge list the engine builds equals, entry by entry, a dense matrix computed
  independently: one forward pass of the frozen real model per writer with that writer
  removed (``frozen_ablation_effects``; no engine code, no autograd), over every
  (reader, writer) pair -- so no edge is missing, spurious or different; and the same sparse
  graph comes out whatever the reader batching or a no-op ``max_feature_nodes``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks import bench_one, report, side_by_side
from circuitgraph.attribution import attribute
from circuitgraph.validation.frozen import frozen_ablation_effects
from tests.helpers.bundles import load_bundle, make_bundle


def test_bench_one_and_report_on_a_tiny_bundle(tmp_path):
    bundle = make_bundle(tmp_path, "ln-gelu-learned")
    tokens = json.loads((bundle / "prompt.json").read_text())["tokens"]
    params = bench_one.BenchParams(bundle, tokens, tmp_path / "out", threads=None)
    res = bench_one.run_one(params)
    assert set(res["timings_s"]) >= {"import", "load", "attribute", "scores", "prune", "export_json", "export_npz"}
    assert all(v >= 0 for v in res["timings_s"].values())
    assert res["completeness"]["max_relative_violation"] < 1e-5
    assert res["pruned"]["completeness"]["max_relative_violation"] < 1e-5
    assert res["n_active_features"] == res["nodes_by_kind"]["feature"]
    assert (tmp_path / "out" / "pruned.json").stat().st_size == res["files"]["pruned_json_bytes"] > 0
    assert (tmp_path / "out" / "full.npz").exists()

    run = {"name": "tiny", "suite": "prompt_length", "bundle": "tiny", "bundle_config": {
        "n_layers": 2, "d_model": 16, "n_heads": 4, "d_mlp": 32, "d_vocab": 23, "d_sae": 48},
        "plan": {"reason": "full graph fits", "est_full_edges": 1.0, "est_full_peak_gb": 0.1, "dry_run": None},
        "process": {"wall_s": 1.0, "user_s": 0.5, "sys_s": 0.1, "peak_rss_mb": 100.0, "returncode": 0,
                    "load_avg_1min": {"start": 1.0, "mean": 1.0, "max": 1.0}},
        "result": res}
    entry = {"suite": "prompt_length", "mode": "quick", "command": "test", "started": "now", "total_seconds": 1.0,
             "machine": {"cpu_count": 2, "memory_gb": 1.0, "cuda": False, "python": "3", "torch": "2",
                         "torch_threads": 1},
             "load_avg_at_start": [1.0, 1.0, 1.0], "load_avg_at_end": [1.0, 1.0, 1.0],
             "peak_bytes_per_edge_assumed": 120, "runs": [run]}
    results = {"format": 2, "suites": {"prompt_length": entry}}
    report.write_report(results, tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "| tiny | 10 |" in text and "time_memory_vs_prompt_length.png" in text
    assert (tmp_path / "time_memory_vs_prompt_length.png").stat().st_size > 0


def _sorted_edges(g) -> tuple[np.ndarray, np.ndarray]:
    key = g.edge_target.astype(np.int64) * g.n_nodes + g.edge_source
    order = np.argsort(key)
    return key[order], g.edge_weight[order]


@pytest.mark.parametrize("variant_name,kind", [("ln-gelu-learned", "relu"), ("rms-gated-rotary-gqa", "skip")])
def test_sparse_edges_equal_a_dense_reference(tmp_path, variant_name, kind):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant_name, kind=kind), "float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64)
    key, weight = _sorted_edges(g)
    assert np.all(np.diff(key) > 0), "the sparse edge list holds a (target, source) pair twice"
    assert np.all(weight != 0), "the sparse edge list stores an exact zero"

    # dense reference: every writer removed in turn from the frozen real model
    writers = [n.id for n in g.nodes if n.kind not in ("logit", "target")]
    effects = frozen_ablation_effects(g.context, writers)
    reference = np.zeros((g.n_nodes, g.n_nodes))
    for w, row in effects.items():
        for r, v in row.items():
            reference[g.index_of(r), g.index_of(w)] = v
    dense = g.dense_adjacency()
    scale = np.abs(reference).max()
    assert scale > 0
    assert np.abs(dense - reference).max() < 1e-10 * scale
    # structural zeros agree too: an entry is an edge exactly where the reference is non-zero
    assert np.all((np.abs(reference) > 1e-12 * scale) <= (dense != 0))

    # the same sparse graph whatever the batching, and with a max_feature_nodes that keeps all
    n_features = sum(1 for n in g.nodes if n.kind == "feature")
    for options in (dict(batch_size=1), dict(batch_size=7), dict(max_feature_nodes=n_features, batch_size=5)):
        other = attribute(adapter, tokens, tcs, dtype=torch.float64, **options)
        assert other.node_ids() == g.node_ids()
        k2, w2 = _sorted_edges(other)
        assert np.array_equal(k2, key)
        np.testing.assert_allclose(w2, weight, rtol=0, atol=1e-12 * scale)


def test_pruning_comparison_tells_a_float32_tie_at_the_cut_from_a_different_circuit():
    """The side by side's kept-edge verdict: a cut whose cumulative share is within a few float32
    steps of the threshold and a kept set that differs by one edge there is a tie; anything
    else is a different circuit."""
    sbs = side_by_side
    # 10 scores of 1 and one of 2e-8 pushing the cumulative share past 0.9 by a hair
    scores = np.array([1.0] * 9 + [0.99999995, 0.5])
    cut = sbs.cut_margin(scores, 9.0 / scores.sum() + 1e-9)
    assert cut["rank"] == 9 and abs(cut["cumulative_share_before_cut_minus_threshold"]) < 1e-7
    base = {"kept_edges_equal": False, "edge_cut": cut, "n_edges_kept_ct": 9, "n_edges_kept_circuitgraph": 10,
            "n_edges_only_ct": 0, "n_edges_only_circuitgraph": 1}
    assert sbs.kept_edges_verdict(base) == "tie at the cut"
    assert sbs.kept_edges_verdict({**base, "kept_edges_equal": True}) == "equal"
    # the same counts with a cut far from the threshold, or edges swapped: a different circuit
    far = sbs.cut_margin(scores, 0.5)
    assert sbs.kept_edges_verdict({**base, "edge_cut": far}) == "different"
    assert sbs.kept_edges_verdict({**base, "n_edges_only_ct": 1, "n_edges_kept_ct": 10}) == "different"
