"""Neuron and head dashboards (``features: {units: neurons | heads}``): exact top-k against an
independent computation, the same bytes however the dataset is split, the Parquet files read
back, the explorer's node panel, and what ``validate`` says without the weights.

The model is a tiny Llama checkpoint (RMSNorm, SwiGLU, grouped-query attention: 4 heads, 2
key-value heads) saved as a Hugging Face folder; the independent computation runs it with
**transformers** (not TransformerLens): a neuron's activation is the input of ``down_proj``
(``act(gate) * up``), a head's pattern is ``output_attentions``, its values the output of
``v_proj`` and its ``W_O`` a slice of ``o_proj``.  Every activation of every row is collected
and sorted by (value desc, row, position, key position).  The dataset repeats some rows, so
exact ties occur and must go to the earlier row.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow", reason="dashboards need pyarrow (pip install '.[dataset]')")
pq = pytest.importorskip("pyarrow.parquet")

import circuitgraph  # noqa: E402
from circuitgraph.errors import SpecError  # noqa: E402
from circuitgraph.features import open_features  # noqa: E402
from circuitgraph.pipeline.preflight import preflight  # noqa: E402
from circuitgraph.spec import load_spec  # noqa: E402
from circuitgraph.testing.hf_checkpoints import save_checkpoint, tiny_checkpoint  # noqa: E402

N_ROWS = 60
TOP_K = 5
CONTEXT = 2
BOS = 1
FILES = ("features.parquet", "examples.parquet")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    base = tmp_path_factory.mktemp("unit_dashboards")
    model = tiny_checkpoint("llama", seed=5)
    save_checkpoint(model, base / "llama")
    gen = np.random.default_rng(11)
    rows = []
    for i in range(N_ROWS):
        if i % 10 == 9:  # an exact copy of an earlier row: every value ties with it
            rows.append({"id": f"dup{i}", "tokens": list(rows[i - 7]["tokens"])})
        else:
            body = gen.integers(3, 96, size=int(gen.integers(2, 12))).tolist()
            rows.append({"id": f"p{i:02d}", "tokens": ([BOS] if i % 3 else []) + body})
    return {"base": base, "model": model, "rows": rows}


def _spec(bundle, out: Path, executor: dict, **features) -> dict:
    return {
        "format_version": 1,
        "model": {"path": str(bundle["base"] / "llama")},
        "dataset": bundle["rows"],
        "features": {"top_k": TOP_K, "context": CONTEXT, "shard_size": 16, **features},
        "executor": executor,
        "export": {"features": str(out)},
    }


@pytest.fixture(scope="module")
def runs(bundle):
    base = bundle["base"]
    one = {"kind": "local", "workers": 1}
    return {
        "neurons": circuitgraph.run(_spec(bundle, base / "neurons", one, units="neurons")),
        "neurons2": circuitgraph.run(_spec(bundle, base / "neurons2", {"kind": "local", "workers": 2},
                                           units="neurons", shard_size=7)),
        "heads": circuitgraph.run(_spec(bundle, base / "heads", one, units="heads",
                                        head_metrics=["attention", "norm", "score"])),
        "heads2": circuitgraph.run(_spec(bundle, base / "heads2", {"kind": "local", "workers": 2}, units="heads",
                                         head_metrics=["attention", "norm", "score"], shard_size=5)),
    }


# ------------------------------------------------------------------ the independent computation
def _transformers_values(bundle):
    """Per row: ``{layer: neurons (pos, d_mlp)}``, ``{layer: (pattern (H, q, k), norm (H, q, k))}``."""
    model = bundle["model"]
    cfg = model.config
    H, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = cfg.hidden_size // H
    out = []
    for row in bundle["rows"]:
        grabbed: dict[str, torch.Tensor] = {}
        hooks = []
        for i, layer in enumerate(model.model.layers):
            hooks.append(layer.mlp.down_proj.register_forward_hook(
                lambda m, inp, o, i=i, grabbed=grabbed: grabbed.__setitem__(f"mlp{i}", inp[0][0].detach())))
            hooks.append(layer.self_attn.v_proj.register_forward_hook(
                lambda m, inp, o, i=i, grabbed=grabbed: grabbed.__setitem__(f"v{i}", o[0].detach())))
        with torch.no_grad():
            res = model(torch.tensor([row["tokens"]]), output_attentions=True)
        for h in hooks:
            h.remove()
        neurons, heads = {}, {}
        for i, layer in enumerate(model.model.layers):
            neurons[i] = grabbed[f"mlp{i}"]
            pattern = res.attentions[i][0]  # (H, q, k)
            v = grabbed[f"v{i}"].reshape(-1, kv, dh).repeat_interleave(H // kv, dim=1)  # (pos, H, dh)
            W_O = layer.self_attn.o_proj.weight.detach()  # (d_model, H * dh)
            written = torch.stack([(v[:, h] @ W_O[:, h * dh:(h + 1) * dh].T).norm(dim=-1) for h in range(H)])
            heads[i] = (pattern, pattern * written[:, None, :])
        out.append((neurons, heads))
    return out


@pytest.fixture(scope="module")
def expected(bundle):
    return _transformers_values(bundle)


def _first(tokens: list[int]) -> int:
    return 1 if tokens[0] == BOS else 0


def _check_order(got: list[tuple], want: list[tuple], got_acts, want_acts, what) -> int:
    """``got`` (the run's top k: ``(row, position[, key])``) is in the total order of its own
    values (activation descending, then row, position, key: an exact tie goes to the earlier
    row), and holds the first entries of ``want`` (the independent ranking, longer than the top
    k) but where two implementations round a near tie differently (a swap allowed only
    between activations equal to float32 rounding).  Returns the exact ties seen."""
    k = len(got)
    assert k == min(TOP_K, len(want)), what
    np.testing.assert_allclose(got_acts, want_acts[:k], rtol=2e-5, atol=2e-6, err_msg=str(what))
    keys = [(-float(a), *g) for a, g in zip(got_acts, got, strict=False)]
    assert keys == sorted(keys), (what, keys)
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            j = want.index(g) if g in want else None
            assert j is not None and abs(want_acts[j] - want_acts[i]) <= 2e-5 * abs(want_acts[i]) + 2e-6, \
                (what, i, g, w)
    return sum(1 for a, b in zip(got_acts, got_acts[1:], strict=False) if a == b)


def test_neuron_top_k_equals_an_independent_top_k(bundle, runs, expected):
    fd = open_features(runs["neurons"].directory)
    ex, feats = fd.examples, fd.features
    n_layers, d_mlp = 2, 48
    assert len(feats) == n_layers * d_mlp and (feats["n_tokens"] == sum(
        len(r["tokens"]) - _first(r["tokens"]) for r in bundle["rows"])).all()
    ties = 0
    for layer in range(n_layers):
        items = []  # (activation, row, position, neuron)
        for number, (row, (neurons, _)) in enumerate(zip(bundle["rows"], expected, strict=False), start=1):
            a = neurons[layer]
            for pos in range(_first(row["tokens"]), a.shape[0]):
                items += [(float(a[pos, j]), number, pos, j) for j in range(d_mlp)]
        for j in range(d_mlp):
            mine = sorted((x for x in items if x[3] == j), key=lambda x: (-x[0], x[1], x[2]))
            top, ranking = mine[:TOP_K], mine[:TOP_K + 5]
            got = ex[(ex["layer"] == layer) & (ex["index"] == j)].sort_values("rank")
            ties += _check_order(list(zip(got["row"], got["position"], strict=False)), [(r, p) for _, r, p, _ in ranking],
                         got["activation"].to_numpy(np.float64), [a for a, _, _, _ in ranking], (layer, j))
            rec = feats[(feats["layer"] == layer) & (feats["index"] == j)].iloc[0]
            assert rec["n_active"] == sum(1 for x in mine if x[0] != 0)
            assert rec["max_activation"] == pytest.approx(top[0][0], rel=2e-5, abs=2e-6)
            assert rec["mean_active_activation"] == pytest.approx(np.mean([x[0] for x in mine]), rel=1e-4, abs=1e-5)
            for (_, e) in got.iterrows():
                r, p = int(e["row"]), int(e["position"])
                tokens = bundle["rows"][r - 1]["tokens"]
                lo, hi = max(p - CONTEXT, 0), min(p + CONTEXT + 1, len(tokens))
                assert list(e["tokens"]) == tokens[lo:hi] and e["start"] == lo
    assert ties > 0, "the repeated rows give exact ties: the test must see some"


@pytest.mark.parametrize("metric", ["attention", "norm"])
def test_head_top_k_equals_an_independent_top_k(bundle, runs, expected, metric):
    fd = open_features(runs["heads"].directory)
    ex, feats = fd.examples, fd.features
    n_pairs = sum((len(r["tokens"]) - _first(r["tokens"])) * (len(r["tokens"]) - _first(r["tokens"]) + 1) // 2
                  for r in bundle["rows"])
    assert (feats["n_pairs"] == n_pairs).all() and len(feats) == 2 * 4 * 3
    which = 0 if metric == "attention" else 1
    for layer in range(2):
        for h in range(4):
            items = []
            for number, (row, (_, heads)) in enumerate(zip(bundle["rows"], expected, strict=False), start=1):
                v = heads[layer][which][h]
                f = _first(row["tokens"])
                items += [(float(v[q, k]), number, q, k) for q in range(f, v.shape[0]) for k in range(f, q + 1)]
            ranking = sorted(items, key=lambda x: (-x[0], x[1], x[2], x[3]))[:TOP_K + 5]
            got = ex[(ex["layer"] == layer) & (ex["index"] == h) & (ex["metric"] == metric)].sort_values("rank")
            _check_order(list(zip(got["row"], got["position"], got["key_position"], strict=False)),
                         [(r, q, k) for _, r, q, k in ranking], got["activation"].to_numpy(np.float64),
                         [a for a, *_ in ranking], (layer, h, metric))
            for _, e in got.iterrows():
                r, q, k = int(e["row"]), int(e["position"]), int(e["key_position"])
                want = expected[r - 1][1][layer]
                assert e["attention"] == pytest.approx(float(want[0][h, q, k]), rel=2e-5, abs=2e-6)
                assert e["norm"] == pytest.approx(float(want[1][h, q, k]), rel=2e-5, abs=2e-6)
                assert np.isfinite(e["score"])
                tokens = bundle["rows"][r - 1]["tokens"]
                assert list(e["key_tokens"]) == tokens[max(k - CONTEXT, 0):k + CONTEXT + 1]
                assert e["key_start"] == max(k - CONTEXT, 0)
                assert "\u00ab" in e["text"] and "\u27e6" in e["key_text"]


def test_the_same_bytes_however_the_dataset_is_split(runs):
    for a, b in (("neurons", "neurons2"), ("heads", "heads2")):
        for name in FILES:
            assert (runs[a].directory / name).read_bytes() == (runs[b].directory / name).read_bytes(), (a, name)


def test_parquet_round_trip_and_dashboards(bundle, runs):
    neurons = pq.read_table(runs["neurons"].directory / "features.parquet")
    assert neurons.column_names[:3] == ["layer", "index", "n_tokens"] and "top_gate_tokens" in neurons.column_names
    heads = pq.read_table(runs["heads"].directory / "examples.parquet")
    assert heads.schema.field("key_position").type == pa.int64()
    assert heads.schema.field("attention").type == pa.float32()
    fd = open_features(runs["heads"].directory)
    assert fd.info["units"] == "heads" and fd.info["head_metrics"] == ["attention", "norm", "score"]
    board = fd.dashboard(1, 2)
    assert [s["metric"] for s in board["metrics"]] == ["attention", "norm", "score"]
    top = board["metrics"][0]["examples"][0]
    assert top["rank"] == 1 and top["key_position"] <= top["position"]
    nd = open_features(runs["neurons"].directory).dashboard(0, 3)
    assert nd["units"] == "neurons" and len(nd["examples"]) == TOP_K and len(nd["top_gate_tokens"]) == 10
    # the explorer's reader, as the node panel uses it
    from circuitgraph.serve.dashboards import FeatureDashboards

    sd = FeatureDashboards.open(runs["heads"].directory)
    d = sd.dashboard(1, 2)
    assert d["units"] == "heads" and [s["metric"] for s in d["metrics"]] == ["attention", "norm", "score"]
    assert d["metrics"][1]["examples"][0]["key_position"] >= 0


def test_validate_says_what_a_features_section_needs(bundle, tmp_path):
    base = {"format_version": 1, "model": {"path": str(bundle["base"] / "llama")}, "dataset": bundle["rows"][:3],
            "export": {"features": str(tmp_path / "out")}}
    with pytest.raises(SpecError, match="units: features .* needs transcoders"):
        load_spec({**base, "features": {}})
    with pytest.raises(SpecError, match="head_metrics is not used here"):
        load_spec({**base, "features": {"units": "neurons", "head_metrics": ["norm"]}})
    spec = load_spec({**base, "features": {"units": "heads", "layers": [1, 2, 7],
                                           "features": {"from_graph": str(tmp_path / "missing.json")}}})
    problems = dict(preflight(spec))
    assert problems["features.layers"] == "layers [2, 7] requested, the model has 2 layers (0-1; config.json)"
    assert problems["features.features.from_graph"].startswith("graph file not found")
    assert "attention_head nodes" in problems["features.features.from_graph"]
    assert preflight(load_spec({**base, "features": {"units": "neurons", "layers": [0, 1]}})) == []


def test_neurons_of_a_graph(bundle, runs, tmp_path):
    """``features: {from_graph: PATH}`` with units: neurons computes the graph's neuron nodes only,
    with the same examples as the run over every neuron."""
    g = circuitgraph.run({"format_version": 1, "model": {"path": str(bundle["base"] / "llama")},
                          "prompt": {"tokens": bundle["rows"][1]["tokens"]}, "targets": [{"logit": 5}],
                          "graph": {"mlp": "neurons", "attention": "frozen"}, "prune": "none",
                          "export": {"json": str(tmp_path / "graph.json")}})
    wanted = {(n.layer, n.index) for n in g.graph.nodes if n.kind == "neuron"}
    assert wanted
    out = tmp_path / "sel"
    circuitgraph.run(_spec(bundle, out, {"kind": "local", "workers": 1}, units="neurons",
                           features={"from_graph": str(tmp_path / "graph.json")}))
    feats = open_features(out).features
    assert set(zip(feats["layer"], feats["index"], strict=False)) == wanted
    full = open_features(runs["neurons"].directory).examples
    mine = open_features(out).examples
    for layer, index in sorted(wanted)[:5]:
        a = mine[(mine["layer"] == layer) & (mine["index"] == index)][["row", "position", "activation"]]
        b = full[(full["layer"] == layer) & (full["index"] == index)][["row", "position", "activation"]]
        assert a.to_numpy().tolist() == b.to_numpy().tolist()


@pytest.mark.parametrize("units", ["neurons", "heads"])
def test_flushing_often_gives_the_same_state(bundle, units, tmp_path):
    """A shard folded with a flush after every row (so the k-th-value thresholds cut the
    candidates from the second row on) holds the state of one fold at the end."""
    from circuitgraph.datasets.rows import row_problems
    from circuitgraph.features.stream import make_shards, shard_state
    from circuitgraph.features.units import select_units
    from circuitgraph.pipeline.inputs import load_inputs

    spec = load_spec(_spec(bundle, tmp_path / "x", {"kind": "local", "workers": 1}, units=units,
                           **({"head_metrics": ["norm", "score"]} if units == "heads" else {})))
    adapter, _ = load_inputs(spec)
    selection = select_units(spec, adapter, None)
    shard = make_shards(row_problems(spec)[0], N_ROWS)[0]
    once = shard_state(spec, shard, adapter, None, selection)
    often = shard_state(spec, shard, adapter, None, selection, flush_entries=1)
    assert once.to_bytes() == often.to_bytes()


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", ["demo_features_neurons.yaml", "demo_features_heads.yaml"])
def test_demo_examples_run(name, tmp_path):
    """examples/demo_features_{neurons,heads}.yaml on the demo dataset's first 40 rows, one worker."""
    import json

    import yaml

    spec = yaml.safe_load((EXAMPLES / name).read_text())
    lines = (EXAMPLES / spec["dataset"]).read_text().splitlines()[:40]
    spec.update(dataset=[json.loads(line) for line in lines], executor={"kind": "local", "workers": 1})
    spec["export"]["features"] = str(tmp_path / "out")
    result = circuitgraph.run(circuitgraph.load_spec(spec, base_dir=EXAMPLES))
    fd = open_features(result.directory)
    assert fd.units == spec["features"]["units"] and result.n_rows == 40
    ex = fd.examples
    assert (ex["rank"] >= 1).all() and len(ex) == result.n_examples > 0
    if fd.units == "heads":
        assert (ex["key_position"] <= ex["position"]).all() and set(ex["metric"]) == {"attention", "norm"}
        assert (ex["key_position"] > 0).all()  # the BOS key (position 0) is left out by default
    else:
        assert (ex["position"] > 0).all() and "top_output_tokens" in fd.features.columns
    assert fd.summary_lines()[0].startswith("features ")


def test_the_explorer_node_panel_shows_neuron_and_head_dashboards(bundle, runs, tmp_path):
    """A graph with neuron and head nodes served beside a neurons and a heads folder: clicking a
    node shows its unit's dashboard (a head's with the query and the key marked)."""
    import os

    from circuitgraph.serve import running_server
    from circuitgraph.testing.browser import playwright_chromium, playwright_unavailable

    reason = playwright_unavailable()
    if reason:
        if os.environ.get("CIRCUITGRAPH_REQUIRE_BROWSER"):
            pytest.fail(reason + " (CIRCUITGRAPH_REQUIRE_BROWSER is set)")
        pytest.skip(reason)
    root = tmp_path / "served"
    circuitgraph.run({"format_version": 1, "model": {"path": str(bundle["base"] / "llama")},
                      "prompt": {"tokens": bundle["rows"][1]["tokens"]}, "targets": [{"logit": 5}],
                      "graph": {"mlp": "neurons", "attention": "heads"}, "prune": "none",
                      "export": {"json": str(root / "graph.json")}})
    for name in ("neurons", "heads"):
        shutil.copytree(runs[name].directory, root / name, ignore=shutil.ignore_patterns("shards"))
    with running_server(root) as server, playwright_chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "#graph=graph.json")
        page.wait_for_function("document.body.dataset.state === 'ready'")
        ids = page.eval_on_selector_all("#graph g.node", "els => els.map(e => e.dataset.id)")
        for kind, words in (("neuron", ("dashboard: neuron", "gate read from tokens", "top examples")),
                            ("attention_head", ("dashboard: head", "ranked by attention", "ranked by norm"))):
            nid = next(i for i in ids if i.startswith(kind + "/"))
            page.click(f'#graph g.node[data-id="{nid}"]')
            page.wait_for_function(f"document.getElementById('details').dataset.node === '{nid}' && "
                                   "document.getElementById('details').dataset.state === 'ready'")
            text = page.text_content("#details")
            assert all(w in text for w in words), (kind, text[:400])
            if kind == "attention_head":
                assert page.locator("#details .example mark.key").count() > 0
                assert page.locator("#details .example mark.query").count() > 0
        assert not errors, errors


# ------------------------------------------------------------------ the real model
REAL_TEXT = [
    "The big grey animal with a long trunk is called an elephant.",
    "She ate an apple and an orange for breakfast, then a banana.",
    "It took me an hour to walk to an island in the middle of the lake.",
    "He is an engineer and she is an artist who paints a river every day.",
    "I saw a dog, a cat and an owl in the garden last night.",
    "Please bring an umbrella because it will rain in the afternoon.",
    "Mary and John went to the store, and John gave a drink to Mary.",
    "When the meeting ended, the manager thanked everyone and left the room.",
]


@pytest.mark.real
def test_real_model_neurons_and_heads_equal_an_independent_top_k(smollm2_dir, tmp_path):
    """SmolLM2-135M-Instruct (30 layers, SwiGLU, 9 query heads on 3 key-value heads): the shard
    state of a few neurons (all of layer 25) and heads (layer 3) equals a top-k over
    transformers's own forward of the same folder (``down_proj``'s input; ``output_attentions``,
    ``v_proj``, ``o_proj``)."""
    from transformers import AutoModelForCausalLM

    from circuitgraph.datasets.rows import row_problems
    from circuitgraph.features.stream import make_shards, shard_state
    from circuitgraph.features.units import select_units
    from circuitgraph.pipeline.inputs import load_inputs, resolve_prompt_like

    rows = [{"id": f"s{i}", "prompt": t} for i, t in enumerate(REAL_TEXT)]
    base = {"format_version": 1, "model": {"path": str(smollm2_dir)}, "dataset": rows,
            "export": {"features": str(tmp_path / "x")}}
    neurons = load_spec({**base, "features": {"units": "neurons", "layers": [25], "top_k": TOP_K, "context": 2}})
    heads = load_spec({**base, "features": {"units": "heads", "layers": [3], "top_k": TOP_K, "context": 2}})
    adapter, _ = load_inputs(neurons)
    shard = make_shards(row_problems(neurons)[0], len(rows))[0]
    sn = shard_state(neurons, shard, adapter, None, select_units(neurons, adapter, None))
    sh = shard_state(heads, shard, adapter, None, select_units(heads, adapter, None))
    tokens = [resolve_prompt_like(r.prompt, adapter, where="row") for r in shard.rows]
    del adapter

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    H, kv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    neuron_items: dict[int, list] = {}
    head_items: dict[tuple[int, int], list] = {}
    for number, toks in enumerate(tokens, start=1):
        grab: dict[str, torch.Tensor] = {}
        hooks = [model.model.layers[25].mlp.down_proj.register_forward_hook(
                     lambda m, i, o, grab=grab: grab.__setitem__("mlp", i[0][0])),
                 model.model.layers[3].self_attn.v_proj.register_forward_hook(
                     lambda m, i, o, grab=grab: grab.__setitem__("v", o[0]))]
        with torch.no_grad():
            out = model(torch.tensor([toks]), output_attentions=True)
        for h in hooks:
            h.remove()
        f = 1 if toks[0] == cfg.bos_token_id else 0
        a = grab["mlp"]
        for j in (0, 1527, 700):
            neuron_items.setdefault(j, []).extend((float(a[p, j]), number, p) for p in range(f, len(toks)))
        pattern = out.attentions[3][0]
        v = grab["v"].reshape(-1, kv, dh).repeat_interleave(H // kv, dim=1)
        W_O = model.model.layers[3].self_attn.o_proj.weight
        for h in (0, 4, 8):
            written = (v[:, h] @ W_O[:, h * dh:(h + 1) * dh].T).norm(dim=-1)
            for m, values in (("attention", pattern[h]), ("norm", pattern[h] * written[None, :])):
                head_items.setdefault((h, m), []).extend(
                    (float(values[q, k]), number, q, k) for q in range(f, len(toks)) for k in range(f, q + 1))
    for j, items in neuron_items.items():
        ranking = sorted(items, key=lambda x: (-x[0], x[1], x[2]))[:TOP_K + 5]
        sel = sn.g == j
        _check_order(list(zip(sn.row[sel].tolist(), sn.pos[sel].tolist(), strict=False)), [(r, p) for _, r, p in ranking],
                     sn.act[sel].astype(np.float64), [a for a, _, _ in ranking], ("L25 neuron", j))
    for (h, m), items in head_items.items():
        ranking = sorted(items, key=lambda x: (-x[0], x[1], x[2], x[3]))[:TOP_K + 5]
        sel = sh.g == h * 2 + ("attention", "norm").index(m)
        _check_order(list(zip(sh.row[sel].tolist(), sh.pos[sel].tolist(), sh.key[sel].tolist(), strict=False)),
                     [(r, q, k) for _, r, q, k in ranking], sh.act[sel].astype(np.float64),
                     [a for a, *_ in ranking], ("L3 head", h, m))


def test_a_one_prompt_run_refuses_a_neurons_folder_as_export_features(bundle, runs, tmp_path):
    """``export.features`` of a one-prompt run labels feature nodes by (layer, index): a neurons
    or heads folder there would name features after neurons, so it is refused before any work."""
    with pytest.raises(SpecError, match="holds neurons dashboards"):
        circuitgraph.run({"format_version": 1, "model": {"path": str(bundle["base"] / "llama")},
                          "prompt": {"tokens": [1, 5, 9]}, "targets": [{"logit": 5}],
                          "export": {"features": str(runs["neurons"].directory),
                                     "json": str(tmp_path / "g.json")}})
    assert not (tmp_path / "g.json").exists()
