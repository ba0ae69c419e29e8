"""Feature dashboards: exact top-k against an independent computation, byte-identical files
across executors and shard sizes, resume, selection from a graph, spec errors.

A tiny random model (built natively, saved to a folder) with sae-lens transcoders and a
cross-layer transcoder, and a dataset of 300 token-id prompts.  The independent computation
runs the model with TransformerLens hooks and the dictionaries' own encoders (sae-lens
``encode``; circuit-tracer's CLT maths written out), collects every activation and sorts.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow", reason="feature dashboards need pyarrow (pip install '.[dataset]')")
pq = pytest.importorskip("pyarrow.parquet")

import circuitgraph  # noqa: E402
from circuitgraph.errors import CircuitGraphError  # noqa: E402
from circuitgraph.features import open_features  # noqa: E402
from circuitgraph.features.topk import FeatureState  # noqa: E402
from circuitgraph.testing.synthetic import (  # noqa: E402
    random_clt,
    random_transcoders,
    save_bundle,
    save_clt,
    tiny_model,
)

N_ROWS = 300
TOP_K = 6
CONTEXT = 3
QUANTILES = [0.0, 0.5, 0.9, 0.99, 1.0]
FILES = ("features.parquet", "examples.parquet")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    base = tmp_path_factory.mktemp("features")
    model = tiny_model(seed=3, n_layers=2, d_vocab=40, n_ctx=16)
    tcs = random_transcoders(model, d_sae=24, seed=3, active_frac=0.2)
    save_bundle(base / "bundle", model, tcs)
    clt = random_clt(model, d_transcoder=20, seed=4, active_frac=0.2)
    save_clt(base / "clt", clt)
    gen = np.random.default_rng(7)
    rows = [{"id": f"p{i:03d}", "tokens": gen.integers(0, 40, size=int(gen.integers(3, 17))).tolist()}
            for i in range(N_ROWS)]
    return {"base": base, "model": model, "tcs": tcs, "clt": clt, "rows": rows}


def _spec(bundle, out: Path, executor: dict, *, clt: bool = False, **features) -> dict:
    tc_dir = bundle["base"] / ("clt" if clt else "bundle/transcoders")
    return {
        "format_version": 1,
        "model": {"path": str(bundle["base"] / "bundle" / "model")},
        "transcoders": {"path": str(tc_dir)},
        "dataset": bundle["rows"],
        "features": {"top_k": TOP_K, "context": CONTEXT, "quantiles": QUANTILES, "shard_size": 16, **features},
        "executor": executor,
        "export": {"features": str(out)},
    }


@pytest.fixture(scope="module")
def runs(bundle):
    base = bundle["base"]
    out = {}
    out["local1"] = circuitgraph.run(_spec(bundle, base / "local1", {"kind": "local", "workers": 1}))
    out["local2"] = circuitgraph.run(_spec(bundle, base / "local2", {"kind": "local", "workers": 2}, shard_size=7))
    out["clt"] = circuitgraph.run(_spec(bundle, base / "clt-out", {"kind": "local", "workers": 1}, clt=True))
    return out


# ------------------------------------------------------------------ the independent computation
def _all_activations(bundle, clt: bool) -> dict[tuple[int, int], list[tuple[float, int, int]]]:
    """``{(layer, index): [(activation, row number, position)]}`` of every non-zero activation."""
    model = bundle["model"]
    out: dict[tuple[int, int], list[tuple[float, int, int]]] = {}
    for number, row in enumerate(bundle["rows"], start=1):
        _, cache = model.run_with_cache(torch.tensor([row["tokens"]]))
        for layer in range(model.cfg.n_layers):
            if clt:  # circuit-tracer's CLT: relu(W_enc x + b_enc) on hook_resid_mid
                t = bundle["clt"]["layers"][layer]
                x = cache[f"blocks.{layer}.hook_resid_mid"][0]
                acts = torch.relu(x @ t["W_enc"].T + t["b_enc"])
            else:
                tc = bundle["tcs"][layer]
                acts = tc.encode(cache[tc.cfg.metadata.hook_name][0])
            for pos, j in torch.nonzero(acts).tolist():
                out.setdefault((layer, j), []).append((float(acts[pos, j]), number, pos))
    return out


@pytest.fixture(scope="module")
def expected(bundle):
    return {False: _all_activations(bundle, False), True: _all_activations(bundle, True)}


def _check_against_independent(directory: Path, acts: dict, bundle, d_sae: int) -> None:
    fd = open_features(directory)
    ex, feats = fd.examples, fd.features
    n_tokens = sum(len(r["tokens"]) for r in bundle["rows"])
    assert len(feats) == 2 * d_sae
    assert (feats["n_tokens"] == n_tokens).all()
    for (layer, index), items in acts.items():
        items = sorted(items, key=lambda x: (-x[0], x[1], x[2]))
        top = items[:TOP_K]
        got = ex[(ex["layer"] == layer) & (ex["index"] == index)].sort_values("rank")
        assert got["rank"].tolist() == list(range(1, len(top) + 1))
        assert list(zip(got["row"], got["position"], strict=False)) == [(r, p) for _, r, p in top], (layer, index)
        np.testing.assert_allclose(got["activation"], [a for a, _, _ in top], rtol=1e-5, atol=1e-6)
        assert got["row_id"].tolist() == [bundle["rows"][r - 1]["id"] for _, r, _ in top]
        for (_, r, p), (_, e) in zip(top, got.iterrows(), strict=False):
            tokens = bundle["rows"][r - 1]["tokens"]
            lo = max(0, p - CONTEXT)
            assert int(e["start"]) == lo and list(e["tokens"]) == tokens[lo:p + CONTEXT + 1]
            np.testing.assert_allclose(e["activations"][p - lo], e["activation"], rtol=1e-6)
        f = feats[(feats["layer"] == layer) & (feats["index"] == index)].iloc[0]
        values = np.sort(np.array([a for a, _, _ in items], dtype=np.float64))
        assert f["n_active"] == len(items)
        assert f["density"] == pytest.approx(len(items) / n_tokens, rel=1e-12)
        assert f["max_activation"] == pytest.approx(values[-1], rel=1e-6)
        assert f["mean_active_activation"] == pytest.approx(values.mean(), rel=1e-5)
        for q in QUANTILES:
            exact = values[max(1, math.ceil(q * len(values) - 1e-9)) - 1]
            assert f[f"q{q!r}"] == pytest.approx(exact, rel=2.0 ** -11, abs=1e-6), (layer, index, q)
    silent = feats[~feats.apply(lambda r: (int(r["layer"]), int(r["index"])) in acts, axis=1)]
    assert (silent["n_active"] == 0).all() and silent["max_activation"].isna().all()
    assert len(ex) == sum(min(TOP_K, len(v)) for v in acts.values())


def test_examples_equal_an_independent_top_k(runs, bundle, expected):
    _check_against_independent(runs["local1"].directory, expected[False], bundle, d_sae=24)


def test_clt_examples_equal_an_independent_top_k(runs, bundle, expected):
    _check_against_independent(runs["clt"].directory, expected[True], bundle, d_sae=20)


def test_a_broken_activation_fails_the_independent_check(runs, bundle, expected):
    """The check can fail: a wrong example (positions swapped) is caught."""
    wrong = {k: [(a, r, p + 1) for a, r, p in v] for k, v in expected[False].items()}
    with pytest.raises(AssertionError):
        _check_against_independent(runs["local1"].directory, wrong, bundle, d_sae=24)


def test_bytes_identical_across_workers_and_shard_sizes(runs):
    a, b = runs["local1"].directory, runs["local2"].directory
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_ray_local_instance_gives_the_same_bytes(runs, bundle):
    pytest.importorskip("ray", reason="the Ray executor needs ray (pip install '.[dataset]')")
    out = bundle["base"] / "ray"
    circuitgraph.run(_spec(bundle, out, {"kind": "ray", "address": "local", "workers": 2}, shard_size=11))
    for name in FILES:
        assert (out / name).read_bytes() == (runs["local1"].directory / name).read_bytes(), name


def test_resume_after_an_interrupted_run_gives_the_same_bytes(runs, bundle):
    out = bundle["base"] / "resumed"
    shutil.copytree(runs["local1"].directory, out)
    shards = sorted((out / "shards").glob("*.npz"))
    for path in shards[3:9]:  # as if the run was killed: these shards never finished
        path.unlink()
    (out / "shards" / ".00000001-00000016.npz.x.tmp").write_bytes(b"half")  # a killed atomic write
    for name in FILES:
        (out / name).unlink()
    result = circuitgraph.run(_spec(bundle, out, {"kind": "local", "workers": 1}))
    assert result.n_skipped == len(shards) - 6
    assert not list((out / "shards").glob(".*.tmp"))
    for name in FILES:
        assert (out / name).read_bytes() == (runs["local1"].directory / name).read_bytes(), name


def test_a_folder_of_another_spec_is_refused(runs, bundle):
    spec = _spec(bundle, runs["local1"].directory, {"kind": "local", "workers": 1}, top_k=3)
    with pytest.raises(CircuitGraphError, match="different spec or dataset"):
        circuitgraph.run(spec)


def test_merge_is_independent_of_the_split():
    """Unit check of the state: any split of the entries merges to the same state."""
    gen = np.random.default_rng(0)
    n = 500
    g = gen.integers(0, 7, n)
    act = gen.choice([0.5, 1.25, 3.0, 7.5], n).astype(np.float32) * gen.integers(1, 4, n)
    row, pos = gen.integers(1, 30, n), gen.integers(0, 9, n)
    win_t, win_a = np.zeros((n, 3), np.int32), np.zeros((n, 3), np.float32)

    def state(sel):
        return FeatureState.from_entries(4, 3, 0, g[sel], act[sel], row[sel], pos[sel], pos[sel], win_t[sel],
                                         win_a[sel])

    whole = state(np.arange(n))
    # ties (few distinct values) are broken by row, then position
    expected = []
    for feature in range(7):
        items = sorted((-float(act[i]), int(row[i]), int(pos[i])) for i in range(n) if g[i] == feature)[:4]
        expected += [(feature, -a, r, p) for a, r, p in items]
    assert list(zip(whole.g.tolist(), whole.act.tolist(), whole.row.tolist(), whole.pos.tolist(), strict=False)) == expected
    parts = FeatureState.empty(4, 3)
    for chunk in np.array_split(gen.permutation(n), 9):
        parts = state(chunk).merge(parts)
    for name in ("g", "act", "row", "pos", "hist_keys", "hist_counts", "sum_keys", "sum_values", "min_g", "min_value"):
        np.testing.assert_array_equal(getattr(whole, name), getattr(parts, name), err_msg=name)


def test_output_and_input_tokens_from_the_weights(runs, bundle):
    """top_output_tokens: decoder row . P(gamma_f * W_U[:, t]); top_input_tokens: W_E . P(W_enc[:, j])."""
    model, tcs = bundle["model"], bundle["tcs"]
    feats = open_features(runs["local1"].directory).features
    gamma = model.ln_final.w.detach().double()
    G = gamma[:, None] * model.W_U.detach().double()
    G = G - G.mean(0, keepdim=True)
    for _, f in feats.head(8).iterrows():
        layer, j = int(f["layer"]), int(f["index"])
        logits = tcs[layer].W_dec[j].detach().double() @ G
        assert [t["token_id"] for t in f["top_output_tokens"]] == torch.topk(logits, 10).indices.tolist()
        assert [t["token_id"] for t in f["bottom_output_tokens"]] == torch.topk(-logits, 10).indices.tolist()
        np.testing.assert_allclose([t["value"] for t in f["top_output_tokens"]], torch.topk(logits, 10).values,
                                   rtol=1e-6)
        w = tcs[layer].W_enc[:, j].detach().double()
        scores = model.W_E.detach().double() @ (w - w.mean())
        assert [t["token_id"] for t in f["top_input_tokens"]] == torch.topk(scores, 10).indices.tolist()


def test_clt_output_tokens_sum_the_decoder_rows_over_layers(runs, bundle):
    model, clt = bundle["model"], bundle["clt"]
    feats = open_features(runs["clt"].directory).features
    gamma = model.ln_final.w.detach().double()
    G = gamma[:, None] * model.W_U.detach().double()
    G = G - G.mean(0, keepdim=True)
    f = feats[feats["layer"] == 0].iloc[3]
    v = clt["layers"][0]["W_dec"][int(f["index"])].double().sum(0)
    assert [t["token_id"] for t in f["top_output_tokens"]] == torch.topk(v @ G, 10).indices.tolist()


def test_features_from_a_graph(bundle, tmp_path):
    graph_spec = {"format_version": 1, "model": {"path": str(bundle["base"] / "bundle" / "model")},
                  "transcoders": {"path": str(bundle["base"] / "bundle" / "transcoders")},
                  "prompt": {"tokens": bundle["rows"][0]["tokens"]},
                  "export": {"json": str(tmp_path / "graph.json")}}
    graph = circuitgraph.run(graph_spec).graph
    wanted = sorted({(n.layer, n.index) for n in graph.nodes if n.kind == "feature"})
    spec = _spec(bundle, tmp_path / "sel", {"kind": "local", "workers": 1},
                 features={"from_graph": str(tmp_path / "graph.json")})
    circuitgraph.run(spec)
    feats = open_features(tmp_path / "sel").features
    assert list(zip(feats["layer"], feats["index"], strict=False)) == wanted
    ex = open_features(tmp_path / "sel").examples
    assert set(zip(ex["layer"], ex["index"], strict=False)) <= set(wanted)


@pytest.mark.parametrize("change, message", [
    ({"export": {}}, "features: needs an output folder"),
    ({"features": {"layers": [5]}}, "layers \\[5\\] have no dictionary"),
    ({"features": {"quantiles": [1.5]}}, "outside \\[0, 1\\]"),
    ({"queries": [{"scores": {}}]}, "a features-only run builds none"),
    ({"export": {"features": "same", "dataset": "same"}}, "give the dashboards their own folder"),
])
def test_bad_features_specs(bundle, tmp_path, change, message):
    spec = _spec(bundle, tmp_path / "bad", {"kind": "local", "workers": 1})
    for key, value in change.items():
        spec[key] = {**spec[key], **value} if key == "features" else value
    with pytest.raises(CircuitGraphError, match=message):
        circuitgraph.run(spec)
    assert not (tmp_path / "bad" / "features.parquet").exists()


def test_features_without_dataset_is_refused():
    with pytest.raises(CircuitGraphError, match="features: is only used with dataset"):
        circuitgraph.load_spec({"format_version": 1, "model": {"builtin": "demo"}, "prompt": "mia saw",
                                "features": {}})


def test_summary_command(runs):
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    result = CliRunner().invoke(app, ["features", "summary", str(runs["local1"].directory), "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "48 features in layers [0, 1] over 300 rows" in result.output
    assert "most frequent features:" in result.output
    info = json.loads((runs["local1"].directory / "features.json").read_text())
    assert info["format"] == "circuitgraph-features"


# ------------------------------------------------------------------ the demo, and labels everywhere
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
N_DEMO_ROWS = 60


@pytest.fixture(scope="module")
def demo_features(tmp_path_factory):
    """examples/demo_features.yaml in a reduced form (its first rows, one worker), with the demo's
    labels file put beside the parquet files."""
    import yaml

    out = tmp_path_factory.mktemp("demo") / "demo_features"
    spec = yaml.safe_load((EXAMPLES / "demo_features.yaml").read_text())
    lines = (EXAMPLES / spec["dataset"]).read_text().splitlines()[:N_DEMO_ROWS]
    spec.update(dataset=[json.loads(line) for line in lines], executor={"kind": "local", "workers": 1})
    spec["export"]["features"] = str(out)
    result = circuitgraph.run(circuitgraph.load_spec(spec, base_dir=EXAMPLES))
    assert result.n_rows == N_DEMO_ROWS and result.n_features == 1024
    shutil.copy(EXAMPLES / "demo_feature_labels.csv", out / "labels.csv")
    return out


def test_demo_dashboards_skip_bos_and_mark_the_token(demo_features):
    fd = open_features(demo_features)
    ex = fd.examples
    assert (ex["position"] > 0).all()  # the BOS position is not ranked (include_bos: false)
    first = ex.iloc[0]
    assert "\u00ab" in first["text"] and "\u00bb" in first["text"]
    assert fd.labels[(0, 142)] == 'on the top path from " owl"'
    board = fd.dashboard(0, 142)
    assert board["label"] == fd.labels[(0, 142)] and board["examples"] and board["n_active"] > 0


def test_labels_appear_in_diagrams_reports_and_exports(demo_features, tmp_path):
    import yaml

    spec = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    spec.pop("validate")
    spec["export"] = {"json": str(tmp_path / "g.json"), "svg": str(tmp_path / "g.svg"), "dot": str(tmp_path / "g.dot"),
                      "neuronpedia": str(tmp_path / "np.json"), "html": str(tmp_path / "r.html"),
                      "features": str(demo_features)}
    result = circuitgraph.run(circuitgraph.load_spec(spec, base_dir=EXAMPLES))
    label = 'on the top path from " owl"'
    labelled = [n for n in result.graph.nodes if n.kind == "feature" and (n.layer, n.index) == (0, 142)]
    assert labelled and all(n.label == label for n in labelled)
    # the graph JSON
    doc = json.loads((tmp_path / "g.json").read_text())
    assert any(n.get("label") == label for n in doc["nodes"])
    for name in ("g.json", "r.html"):  # the features folder is named, not where it lies
        assert str(demo_features.parent) not in (tmp_path / name).read_text(), name
    # the diagrams
    assert "on the top path from" in (tmp_path / "g.svg").read_text()
    assert "on the top path from" in (tmp_path / "g.dot").read_text()
    # the path listing names nodes by token string and label
    paths = next(q["result"] for q in result.queries if q["kind"] == "top_paths")
    table = paths.table()
    assert '" owl"' in table and label in table
    # the Neuronpedia export: clerp and the embedded dashboard
    np_doc = json.loads((tmp_path / "np.json").read_text())
    feats = [n for n in np_doc["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert feats and all("dashboard" in n for n in feats)
    n142 = [n for n in feats if n["dashboard"]["layer"] == 0 and n["dashboard"]["index"] == 142]
    assert n142 and n142[0]["clerp"] == label and n142[0]["dashboard"]["examples"]
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((EXAMPLES.parent / "schemas" / "neuronpedia" / "graph-schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(np_doc)  # the extra node key keeps the file valid
    # the report: dashboards, linked from the diagram and the tables, names in the tables
    html = (tmp_path / "r.html").read_text()
    assert 'id="feature-L0-142"' in html and 'href="#feature-L0-142"' in html
    assert "Feature dashboards" in html and "&quot; owl&quot;" in html
    # the CLI: a saved graph's report with the features folder, a diagram with the labels
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app

    for node in doc["nodes"]:  # a graph file without the labels
        node["label"] = ""
        node.get("attrs", {}).pop("description", None)
    (tmp_path / "bare.json").write_text(json.dumps(doc))
    runner = CliRunner()
    res = runner.invoke(app, ["render", str(tmp_path / "bare.json"), "-o", str(tmp_path / "bare.svg"),
                              "--labels", str(demo_features)])
    assert res.exit_code == 0, res.output
    assert "on the top path from" in (tmp_path / "bare.svg").read_text()
    res = runner.invoke(app, ["report", str(tmp_path / "bare.json"), "-o", str(tmp_path / "bare.html"),
                              "--features", str(demo_features)])
    assert res.exit_code == 0, res.output
    bare = (tmp_path / "bare.html").read_text()
    assert 'id="feature-L0-142"' in bare and "on the top path from" in bare


def test_demo_clt_features_spec_runs(tmp_path):
    """examples/demo_features_clt.yaml, reduced to its first 20 rows."""
    import yaml

    spec = yaml.safe_load((EXAMPLES / "demo_features_clt.yaml").read_text())
    lines = (EXAMPLES / spec["dataset"]).read_text().splitlines()[:20]
    spec.update(dataset=[json.loads(line) for line in lines], executor={"kind": "local", "workers": 1})
    spec["export"]["features"] = str(tmp_path / "clt")
    result = circuitgraph.run(circuitgraph.load_spec(spec, base_dir=EXAMPLES))
    fd = open_features(result.directory)
    assert fd.info["dictionaries"] == "cross_layer_transcoder" and len(fd.features) == 1024
    assert len(fd.examples) > 0


def test_graphs_and_dashboards_in_one_spec(bundle, tmp_path):
    """With export.dataset as well, the dataset run builds the graphs and then the dashboards."""
    spec = _spec(bundle, tmp_path / "features", {"kind": "local", "workers": 1})
    spec["dataset"] = bundle["rows"][:12]
    spec["export"]["dataset"] = str(tmp_path / "dataset")
    result = circuitgraph.run(spec)
    assert result.n_ok == 12 and result.features is not None and result.features.n_rows == 12
    assert (tmp_path / "dataset" / "nodes.parquet").is_file() and (tmp_path / "features" / "examples.parquet").is_file()
    assert any(line.startswith("features: 48 features over 12 rows") for line in result.summary_lines())


@pytest.mark.parametrize("model_kwargs, kind, input_site", [
    (dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2), "jumprelu", "mlp_input"),
    (dict(norm="LN", mlp="gelu", positional="learned"), "skip", "raw"),
])
def test_other_dictionaries_and_models_match_the_independent_top_k(tmp_path, model_kwargs, kind, input_site):
    """JumpReLU reading the MLP's input on an RMSNorm gated model; a skip transcoder reading the raw
    residual: the examples still equal sae-lens's encode on TransformerLens's activations."""
    model = tiny_model(seed=5, n_layers=2, d_vocab=30, n_ctx=12, **model_kwargs)
    tcs = random_transcoders(model, d_sae=16, seed=5, kind=kind, input_site=input_site, active_frac=0.25)
    save_bundle(tmp_path / "b", model, tcs)
    gen = np.random.default_rng(1)
    rows = [{"tokens": gen.integers(0, 30, size=int(gen.integers(2, 13))).tolist()} for _ in range(40)]
    spec = {"format_version": 1, "model": {"path": str(tmp_path / "b" / "model")},
            "transcoders": {"path": str(tmp_path / "b" / "transcoders")}, "dataset": rows,
            "features": {"top_k": 4, "context": 2, "shard_size": 9}, "executor": {"kind": "local", "workers": 1},
            "export": {"features": str(tmp_path / "out")}}
    circuitgraph.run(spec)
    expected = {}
    for number, row in enumerate(rows, start=1):
        _, cache = model.run_with_cache(torch.tensor([row["tokens"]]))
        for layer, tc in tcs.items():
            if input_site == "raw":
                x = cache[f"blocks.{layer}.hook_resid_mid"][0]
            else:  # the MLP's input: ln2's normalised output times its weight (and plus its bias)
                ln2 = model.blocks[layer].ln2
                x = cache[f"blocks.{layer}.ln2.hook_normalized"][0] * ln2.w
                x = x + ln2.b if hasattr(ln2, "b") else x
            acts = tc.encode(x)
            for pos, j in torch.nonzero(acts).tolist():
                expected.setdefault((layer, j), []).append((float(acts[pos, j]), number, pos))
    ex = open_features(tmp_path / "out").examples
    assert expected and len(ex) == sum(min(4, len(v)) for v in expected.values())
    for key, items in expected.items():
        top = sorted(items, key=lambda x: (-x[0], x[1], x[2]))[:4]
        got = ex[(ex["layer"] == key[0]) & (ex["index"] == key[1])].sort_values("rank")
        assert list(zip(got["row"], got["position"], strict=False)) == [(r, p) for _, r, p in top], key
        np.testing.assert_allclose(got["activation"], [a for a, _, _ in top], rtol=1e-5, atol=1e-6)


def test_a_killed_run_resumes_to_the_same_bytes(runs, bundle, tmp_path):
    """The driver, its fork server and workers killed mid-run (SIGKILL); the rerun skips the
    finished shards and writes the bytes of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    out = tmp_path / "killed"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_spec(bundle, out, {"kind": "local", "workers": 1}, shard_size=3)))
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "circuitgraph", "run", str(spec_path), "--quiet"], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            done = list((out / "shards").glob("*.npz")) if (out / "shards").is_dir() else []
            if len(done) >= 3 or proc.poll() is not None:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    n_done = len(list((out / "shards").glob("*.npz")))
    assert not (out / "examples.parquet").exists() and 3 <= n_done < N_ROWS // 3
    result = circuitgraph.run(_spec(bundle, out, {"kind": "local", "workers": 2}, shard_size=3))
    assert result.n_skipped >= 3
    for name in FILES:
        assert (out / name).read_bytes() == (runs["local1"].directory / name).read_bytes(), name
    assert not list(out.glob("**/.*.tmp"))
