"""Graph diffs: clean vs corrupted prompts, by position, identity and from the end; aggregates; files."""

from __future__ import annotations

import functools
import json
import shutil
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import circuitgraph
from circuitgraph.attribution import attribute
from circuitgraph.attribution.targets import ResolvedTarget
from circuitgraph.errors import QueryError
from circuitgraph.queries.diff import diff_graphs
from circuitgraph.queries.influence import influence, node_influence
from circuitgraph.testing.synthetic import random_transcoders, tiny_model
from tests.helpers.bundles import run_tmpdir

CLEAN = [1, 5, 7, 9, 4, 3, 11]
CORRUPTED = [1, 5, 8, 9, 4, 3, 11]  # one token differs
LONGER = [1, 2, 5, 7, 9, 4, 3, 11]  # the clean prompt with one more token in front


@functools.cache
def _graphs():

    from circuitgraph.adapters.loading import load_model_dir
    from circuitgraph.dictionaries import TranscoderSet
    from circuitgraph.testing.synthetic import save_bundle

    model = tiny_model(norm="LN", mlp="gelu", positional="learned", n_layers=2)
    root = save_bundle(run_tmpdir("cg-diff-"), model, random_transcoders(model, active_frac=0.3))
    adapter = load_model_dir(root / "model")
    tset = TranscoderSet.from_dir(root / "transcoders", adapter)
    out = {}
    for name, toks in (("clean", CLEAN), ("corrupted", CORRUPTED), ("longer", LONGER)):
        target = ResolvedTarget(kind="logit_diff", position=len(toks) - 1, tokens=(3, 4))
        meta = {"model": {"name": adapter.name, "n_layers": 2}, "prompt_tokens": toks, "prompt": name,
                "transcoders": {"format": "saelens", "source": {"kind": "test"}, "kind": "transcoder_set"}}
        out[name] = attribute(adapter, toks, tset, [target], metadata=meta)
    return out


def _by_key(graph, key):
    act, inf = defaultdict(float), defaultdict(float)
    influence = node_influence(graph)
    for n, i in zip(graph.nodes, influence, strict=False):
        act[key(n)] += n.activation
        inf[key(n)] += float(i)
    return act, inf


def _edges_by_key(graph, key):
    out = defaultdict(float)
    for s, t, w in zip(graph.edge_source, graph.edge_target, graph.edge_weight, strict=False):
        out[(key(graph.nodes[s]), key(graph.nodes[t]))] += float(w)
    return out


KEYS = {
    "position": lambda g: (lambda n: f"{n.kind}/{n.layer}/{n.position}/{n.index}"),
    "identity": lambda g: (lambda n: f"{n.kind}/{n.layer}/*/{n.index}"),
    "from_end": lambda g: (lambda n: f"{n.kind}/{n.layer}/{n.position - len(g.metadata['prompt_tokens'])}/{n.index}"),
}


@pytest.mark.parametrize("match,other", [("position", "corrupted"), ("identity", "corrupted"),
                                         ("from_end", "longer"), ("identity", "longer")])
def test_clean_vs_corrupted_equals_an_independent_tally(match, other):
    g = _graphs()
    a, b = g["clean"], g[other]
    d = diff_graphs(a, b, match=match)
    ka, kb = KEYS[match](a), KEYS[match](b)
    act_a, inf_a = _by_key(a, ka)
    act_b, inf_b = _by_key(b, kb)
    rows = d.nodes.set_index("node")
    assert set(rows.index) == set(act_a) | set(act_b)
    for node, r in rows.iterrows():
        assert r.activation_a == pytest.approx(act_a.get(node, 0.0), abs=1e-9)
        assert r.activation_b == pytest.approx(act_b.get(node, 0.0), abs=1e-9)
        assert r.influence_a == pytest.approx(inf_a.get(node, 0.0), abs=1e-9)
        assert r.influence_difference == pytest.approx(inf_b.get(node, 0.0) - inf_a.get(node, 0.0), abs=1e-9)
        assert r.present == ("both" if node in act_a and node in act_b else "a" if node in act_a else "b")
    assert set(d.only_in_a()["node"]) == set(act_a) - set(act_b)
    assert set(d.only_in_b()["node"]) == set(act_b) - set(act_a)
    ea, eb = _edges_by_key(a, ka), _edges_by_key(b, kb)
    edges = {(r.source, r.target): r for r in d.edges.itertuples()}
    assert set(edges) == set(ea) | set(eb)
    for k, r in edges.items():
        assert r.weight_a == pytest.approx(ea.get(k, 0.0), abs=1e-6)
        assert r.difference == pytest.approx(eb.get(k, 0.0) - ea.get(k, 0.0), abs=1e-6)
    top = d.top_changes(5)["effect_difference"].abs().tolist()
    assert top == sorted(top, reverse=True) and top[0] == pytest.approx(d.nodes["effect_difference"].abs().max())
    # effect: the signed total effect on the weighted targets, summed by key
    for g, side, key in ((a, "a", ka), (b, "b", kb)):
        res = influence(g)
        eff = defaultdict(float)
        for n, e in zip(g.nodes, res.total_effect, strict=False):
            eff[key(n)] += float(e)
        for node, r in rows.iterrows():
            assert getattr(r, f"effect_{side}") == pytest.approx(eff.get(node, 0.0), abs=1e-6)
    flips = (np.sign(d.nodes["effect_a"]) * np.sign(d.nodes["effect_b"]) < 0).to_numpy()
    assert (d.nodes["sign_flip"].to_numpy() == flips).all()
    if match == "position" and other == "corrupted":
        # the changed token: its embedding is only in one graph each, and after it things differ
        assert "embedding/-1/2/7" in set(d.only_in_a()["node"]) and "embedding/-1/2/8" in set(d.only_in_b()["node"])
        assert (d.nodes["present"] == "both").sum() > 0 and top[0] > 0
    if match == "from_end":
        # the longer prompt lines up with the clean one at the end: the last token's embedding matches
        last = rows.loc["embedding/-1/-1/11"]
        assert last.present == "both"


def test_a_graph_with_itself_has_no_changes():
    a = _graphs()["clean"]
    d = diff_graphs(a, a)
    assert (d.nodes["present"] == "both").all() and (d.nodes["influence_difference"] == 0).all()
    assert (d.edges["difference"] == 0).all() and d.counts()["edges_only_a"] == 0


def test_different_models_or_dictionaries_are_refused_unless_allowed():
    a, b = _graphs()["clean"], _graphs()["corrupted"]
    other = b.subgraph([n.id for n in b.nodes])
    other.metadata = {**b.metadata, "model": {"name": "gpt2", "n_layers": 12}}
    with pytest.raises(QueryError, match=r"different models \(tiny-LN-gelu-learned vs gpt2\).*allow_different"):
        diff_graphs(a, other)
    assert diff_graphs(a, other, allow_different=True).notes
    other.metadata = {**b.metadata, "transcoders": {"format": "clt", "source": "x"}}
    with pytest.raises(QueryError, match="different dictionaries"):
        diff_graphs(a, other)


def _aggregate_folder(tmp_path: Path, name: str, graph, position: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from circuitgraph.datasets.reduce import reduce_graph
    from circuitgraph.datasets.run import write_aggregate
    from circuitgraph.spec.dataset import AggregateSpec

    out = tmp_path / name
    out.mkdir()
    (out / "p0.npz").write_bytes(reduce_graph(graph, position).to_bytes())
    pq.write_table(pa.table({"id": ["0"], "status": ["ok"]}), out / "manifest.parquet")
    write_aggregate(SimpleNamespace(aggregate=AggregateSpec(position=position)), out,
                    [{"row": 0, "id": "0", "status": "ok", "part": "p0.npz"}], n_layers=2)
    return out


@pytest.mark.parametrize("position,match", [("free", "identity"), ("from_end", "from_end")])
def test_dataset_aggregates_diff_like_their_graphs(tmp_path, position, match):
    g = _graphs()
    da = _aggregate_folder(tmp_path, "a", g["clean"], position)
    db = _aggregate_folder(tmp_path, "b", g["corrupted"], position)
    agg = circuitgraph.diff(da, db / "aggregate.json", match=match)
    direct = diff_graphs(g["clean"], g["corrupted"], match=match)
    assert any("not recorded" in n for n in agg.notes)
    x = agg.nodes.set_index("node").sort_index()
    y = direct.nodes.set_index("node").sort_index()
    assert list(x.index) == list(y.index) and list(x["present"]) == list(y["present"])
    np.testing.assert_allclose(x["activation_a"], y["activation_a"], atol=1e-6)
    np.testing.assert_allclose(x["influence_difference"], y["influence_difference"], atol=1e-6)
    # an aggregate's effect: its mean direct effect, the edges into the targets times their weights
    clean, key = g["clean"], KEYS[match](g["clean"])
    weight = {t: w for t, w in clean.targets}
    into_targets = defaultdict(float)
    for s_, t_, w_ in zip(clean.edge_source, clean.edge_target, clean.edge_weight, strict=False):
        target = clean.nodes[t_].id
        if target in weight:
            into_targets[key(clean.nodes[s_])] += float(w_) * weight[target]
    np.testing.assert_allclose(x["effect_a"], [into_targets.get(k, 0.0) for k in x.index], atol=1e-5)
    ex = agg.edges.set_index(["source", "target"]).sort_index()
    ey = direct.edges.set_index(["source", "target"]).sort_index()
    ey = ey[ey["weight_a"].ne(0) | ey["weight_b"].ne(0)]  # an aggregate drops edges of weight 0
    assert list(ex.index) == list(ey.index)
    np.testing.assert_allclose(ex["difference"], ey["difference"], atol=1e-6)
    with pytest.raises(QueryError, match="dataset aggregate"):
        circuitgraph.diff(da, db, match="position")


def test_files_json_html_and_the_cli(tmp_path):
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app
    from circuitgraph.export import graph_to_json

    g = _graphs()
    graph_to_json(g["clean"], tmp_path / "clean.json")
    graph_to_json(g["corrupted"], tmp_path / "corrupted.json")
    d = circuitgraph.diff(tmp_path / "clean.json", tmp_path / "corrupted.json")
    doc = json.loads(d.to_json())
    assert doc["counts"] == d.counts() and len(doc["top_changes"]) == min(20, len(d.nodes))
    assert {"node", "activation_a", "activation_b", "influence_a", "influence_b", "present"} <= set(doc["nodes"][0])
    assert {"source", "target", "weight_a", "weight_b", "difference", "present"} <= set(doc["edges"][0])
    if shutil.which("dot") is not None:
        from circuitgraph.export.diff_html import diff_svgs

        svg_a, svg_b = diff_svgs(d, max_nodes=30)
        # the same layout: every node drawn on both sides at the same place
        import re

        def places(svg):
            return {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
                r'<g id="node\d+" class="node">\s*<title>([^<]+)</title>[\s\S]*?<text[^>]*x="([-\d.]+)" '
                r'y="([-\d.]+)"', svg)}

        pa, pb = places(svg_a), places(svg_b)
        assert len(pa) >= 10 and pa == pb
    runner = CliRunner()
    out = runner.invoke(app, ["diff", str(tmp_path / "clean.json"), str(tmp_path / "corrupted.json"),
                              "--json", str(tmp_path / "d.json"), "-o", str(tmp_path / "d.html"), "--top", "3"])
    assert out.exit_code == 0, out.output
    assert "top 3 node changes" in out.output and json.loads((tmp_path / "d.json").read_text())["match"] == "position"
    if shutil.which("dot") is not None:
        html = (tmp_path / "d.html").read_text()
        assert html.count("<svg") == 2 and "Nodes only in a" in html
    bad = g["corrupted"].subgraph([n.id for n in g["corrupted"].nodes])
    bad.metadata = {**bad.metadata, "model": {"name": "gpt2", "n_layers": 12}}
    graph_to_json(bad, tmp_path / "other.json")
    out = runner.invoke(app, ["diff", str(tmp_path / "clean.json"), str(tmp_path / "other.json")])
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "--allow-different-models" in out.output
    out = runner.invoke(app, ["diff", str(tmp_path / "clean.json"), str(tmp_path / "other.json"),
                              "--allow-different-models"])
    assert out.exit_code == 0, out.output


def _two_sided(w_a: tuple[float, float, float], w_b: tuple[float, float, float]):
    """Three embeddings straight into one target, their edge weights ``w_a`` in a and ``w_b`` in b."""
    from circuitgraph.graph.graph import AttributionGraph
    from circuitgraph.graph.nodes import Node, NodeId

    ids = [NodeId("embedding", -1, 0, i) for i in (1, 2, 3)] + [NodeId("target", 1, 0, 0)]
    out = []
    for name, w in (("a", w_a), ("b", w_b)):
        nodes = [Node(i, 1.0) for i in ids[:3]] + [Node(ids[3], sum(w), pre_activation=sum(w), constant=0.0)]
        meta = {"model": {"name": "m", "n_layers": 1}, "prompt_tokens": [0], "prompt": name}
        out.append(AttributionGraph(nodes, [3, 3, 3], [0, 1, 2], np.asarray(w, dtype=np.float64),
                                    targets=[(ids[3], 1.0)], metadata=meta))
    return out


def test_a_sign_flip_is_the_top_change_and_is_flagged(tmp_path):
    """The IOI case of issue 35: a head's edge into the target goes from +2 to -3.  Its unsigned
    influence does not move at all (2/8 of the target's |input| in a, 3/12 in b), so a ranking by
    influence lists it last; the signed change (-5) puts it first, flagged, in the table, the JSON
    and the HTML page."""
    from typer.testing import CliRunner

    from circuitgraph.cli.main import app
    from circuitgraph.export import graph_to_json

    a, b = _two_sided((2.0, 1.0, 5.0), (-3.0, 4.0, 5.0))
    d = diff_graphs(a, b)
    rows = d.nodes.set_index("node")
    flipped = "embedding/-1/0/1"
    assert rows.loc[flipped, "influence_difference"] == pytest.approx(0.0, abs=1e-12)
    assert (rows.loc[flipped, "effect_a"], rows.loc[flipped, "effect_b"]) == (2.0, -3.0)
    assert rows.loc[flipped, "effect_difference"] == -5.0 and rows.loc[flipped, "sign_flip"]
    assert list(d.top_changes(3)["node"]) == [flipped, "embedding/-1/0/2", "embedding/-1/0/3"]
    assert not rows.loc["embedding/-1/0/2", "sign_flip"] and not rows.loc["embedding/-1/0/3", "sign_flip"]
    edges = d.top_edge_changes(1)
    assert edges["source"].iat[0] == flipped and edges["difference"].iat[0] == -5.0 and edges["sign_flip"].iat[0]
    assert d.counts()["node_sign_flips"] == 1 and d.counts()["edge_sign_flips"] == 1
    # sort="flip": flips first, even when another change is larger
    a2, b2 = _two_sided((0.5, 1.0, 5.0), (-0.5, 9.0, 5.0))
    d2 = diff_graphs(a2, b2)
    assert d2.top_changes(1)["node"].iat[0] == "embedding/-1/0/2"
    assert d2.top_changes(1, sort="flip")["node"].iat[0] == flipped
    doc = json.loads(d.to_json())
    top = doc["top_changes"][0]
    assert top["node"] == flipped and top["effect_a"] == 2.0 and top["effect_b"] == -3.0 and top["sign_flip"] is True
    assert doc["top_edge_changes"][0]["sign_flip"] is True and doc["ranked_by"] == "abs_effect_difference"
    line = next(x for x in d.summary_lines() if flipped in x)
    assert "+2 -> -3" in line and "-5" in line and "FLIP" in line
    graph_to_json(a, tmp_path / "a.json")
    graph_to_json(b, tmp_path / "b.json")
    out = CliRunner().invoke(app, ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--sort", "flip"])
    assert out.exit_code == 0, out.output
    first = out.output.split("top 10 node changes")[1].splitlines()[3]
    assert first.split()[0] == flipped and "FLIP" in first
    bad = CliRunner().invoke(app, ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--sort", "x"])
    assert bad.exit_code == 2 and "--sort 'x'" in bad.output
    if shutil.which("dot") is not None:
        from circuitgraph.export.diff_html import diff_html

        page = diff_html(d)
        assert '<td class="flip" data-v="1">FLIP</td>' in page and 'class="neg">-3</td>' in page
        assert "table.sortable" in page


@pytest.mark.real
def test_swapped_names_on_smollm2_put_the_flipped_head_first(smollm2_dir):
    """Issue 35 on the real model: IOI against the same prompt with the names swapped.  Head L23H3's
    edge into the target goes from about +2.6 to about -2.9; ranked by unsigned influence it was
    fifth (+0.014), by the signed change it is the top change, flagged."""
    from circuitgraph.pipeline.inputs import load_inputs
    from circuitgraph.pipeline.runner import build
    from circuitgraph.spec import load_spec

    def spec(prompt):
        return load_spec({"format_version": 1, "model": {"path": str(smollm2_dir)}, "prompt": prompt,
                          "targets": [{"logit_diff": [" Mary", " John"]}],
                          "graph": {"mlp": "mlp", "attention": "heads"}})

    inputs = load_inputs(spec("x"))  # the model once, for both prompts

    def ioi(prompt):
        return build(spec(prompt), inputs=inputs)

    d = diff_graphs(ioi("When Mary and John went to the store, John gave a drink to"),
                    ioi("When John and Mary went to the store, Mary gave a drink to"))
    top = d.top_changes(1).iloc[0]
    assert top["node"] == "attention_head/23/14/3" and top["sign_flip"]
    assert top["effect_a"] > 2 and top["effect_b"] < -2 and abs(top["influence_difference"]) < 0.05
    edge = d.top_edge_changes(1).iloc[0]
    assert (edge["source"], edge["target"]) == ("attention_head/23/14/3", "target/30/14/0") and edge["sign_flip"]
    by_influence = d.nodes.reindex(d.nodes["influence_difference"].abs().sort_values(ascending=False).index)
    assert list(by_influence["node"]).index("attention_head/23/14/3") >= 3
