"""The explorer's API and server (`circuitgraph serve`): pruned graphs equal `prune_graph`'s, nodes,
dashboards, supernodes, QK, dataset runs, saved subgraphs, bad parameters, and nothing served
outside the served path.  The page itself is tested in Chromium in tests/test_serve_browser.py."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

import circuitgraph
from circuitgraph.export.binary import save_graph_binary
from circuitgraph.export.dot import merge_supernodes, propose_supernodes
from circuitgraph.export.json_graph import read_graph_json
from circuitgraph.queries.prune import prune_graph
from circuitgraph.serve import running_server
from circuitgraph.serve.dashboards import FeatureDashboards, split_marked_text
from circuitgraph.testing.explorer_fixture import demo_dataset_run, demo_graph_file, write_features_folder
from tests.helpers.serve import get_json, request

REPO = Path(__file__).resolve().parents[1]
THRESHOLDS = [(0.3, 0.5), (0.6, 0.9), (0.8, 0.98), (1.0, 1.0), (0.55, 0.77)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder of sources: the demo graph (pruned, with QK), the demo graph unpruned with heads as
    nodes (with QK) also as .npz, a two-prompt dataset run, and a features folder for every
    feature of the graphs."""
    root = tmp_path_factory.mktemp("served")
    demo_graph_file(root / "demo" / "graph.json", qk=True)
    heads = demo_graph_file(root / "heads" / "graph.json", qk=True, heads=True, prune=False)
    doc = read_graph_json(heads)
    save_graph_binary(doc.graph, root / "heads" / "graph.npz", queries=doc.queries)
    demo_dataset_run(root / "ds")
    feats = set()
    for name in ("demo/graph.json", "heads/graph.json"):
        feats |= {(n.layer, n.index) for n in circuitgraph.load_graph(str(root / name)).nodes if n.kind == "feature"}
    written = write_features_folder(root / "features", feats)
    return root, written


@pytest.fixture(scope="module")
def server(folder):
    with running_server(folder[0]) as srv:
        yield srv






def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


# ------------------------------------------------------------------ pruned graphs
@pytest.mark.parametrize("name", ["demo/graph.json", "heads/graph.json", "heads/graph.npz", "ds/aggregate",
                                  "ds/graphs/1.npz"])
def test_api_graph_is_prune_graph_exactly(server, folder, name):
    root, _ = folder
    if name == "ds/aggregate":
        graph = circuitgraph.open_dataset(root / "ds").graph()
    else:
        graph = circuitgraph.load_graph(str(root / name))
    for nt, et in THRESHOLDS:
        view = get_json(server, f"/api/graph/{q(name)}?node_threshold={nt}&edge_threshold={et}")
        expected = prune_graph(graph, node_threshold=nt, edge_threshold=et)
        assert [n["id"] for n in view["nodes"]] == [str(i) for i in expected.graph.node_ids()]
        got = [(e["source"], e["target"], e["weight"]) for e in view["edges"]]
        ids = [str(i) for i in expected.graph.node_ids()]
        want = [(ids[s], ids[t], w) for s, t, w in zip(expected.graph.edge_source.tolist(),
                                                        expected.graph.edge_target.tolist(),
                                                        expected.graph.edge_weight.tolist(), strict=False)]
        assert got == want  # the same edges, weights equal as floats (no rounding on the way)
        assert (view["node_threshold"], view["edge_threshold"]) == (nt, et)
        kept = expected.node_influence[expected.node_mask]
        assert [n["influence"] for n in view["nodes"][: len(kept)]] == pytest.approx(kept.tolist(), rel=0, abs=0)
    # the slashes of a name may be sent as they are
    assert get_json(server, f"/api/graph/{name}?node_threshold=0.6&edge_threshold=0.9")["nodes"] == \
        get_json(server, f"/api/graph/{q(name)}?node_threshold=0.6&edge_threshold=0.9")["nodes"]


def test_default_thresholds(server, folder):
    # a graph pruned by its run starts unpruned further; an unpruned one at the spec's defaults
    demo = get_json(server, "/api/graph/demo/graph.json")
    assert (demo["node_threshold"], demo["edge_threshold"]) == (1.0, 1.0)
    heads = get_json(server, "/api/graph/heads/graph.json")
    assert (heads["node_threshold"], heads["edge_threshold"]) == (0.8, 0.98)
    graph = circuitgraph.load_graph(str(folder[0] / "heads" / "graph.json"))
    assert len(heads["nodes"]) == prune_graph(graph).graph.n_nodes


def test_graph_listing(server, folder):
    listing = get_json(server, "/api/graphs")
    names = {g["name"]: g for g in listing["graphs"]}
    assert set(names) == {"demo/graph.json", "heads/graph.json", "heads/graph.npz", "ds/aggregate",
                          "ds/graphs/1.npz", "ds/graphs/2.npz"}
    assert names["ds/aggregate"]["kind"] == "aggregate" and names["ds/graphs/2.npz"]["row_id"] == "2"
    assert names["ds/aggregate"]["file"] is None and names["ds/graphs/2.npz"]["file"] == "ds/graphs/2.npz"
    code, body, _ = request(server, "/files/" + names["heads/graph.npz"]["file"])
    assert code == 200 and body == (folder[0] / "heads" / "graph.npz").read_bytes()
    assert listing["datasets"] == ["ds"] and listing["features"] == ["features"]
    assert listing["kind_colors"]["feature"].startswith("#")


# ------------------------------------------------------------------ nodes, dashboards, QK
def test_node_inputs_outputs_and_dashboard(server, folder):
    root, written = folder
    graph = circuitgraph.load_graph(str(root / "demo" / "graph.json"))
    influence = prune_graph(graph, node_threshold=1.0, edge_threshold=1.0).node_influence
    feature = max((n for n in graph.nodes if n.kind == "feature"), key=lambda n: len(graph.in_edges(n.id)))
    node = get_json(server, f"/api/node/demo/graph.json/{feature.id}?limit=5")
    assert node["id"] == str(feature.id) and node["activation"] == feature.activation
    assert node["pre_activation"] == feature.pre_activation and node["constant"] == feature.constant
    assert node["influence"] == float(influence[graph.index_of(feature.id)])
    ins = graph.in_edges(feature.id)
    assert node["n_inputs"] == len(ins) > 5 and len(node["inputs"]) == 5
    assert [(e["id"], e["weight"]) for e in node["inputs"]] == [(str(i), w) for i, w in ins[:5]]
    assert [(e["id"], e["weight"]) for e in node["outputs"]] == [(str(i), w) for i, w in graph.out_edges(feature.id)]
    info = written[(feature.layer, feature.index)]
    board = node["dashboard"]
    assert board["label"] == info["label"] == node["label"]  # labels.csv names the node
    assert board["examples"][0]["text"] == info["top_text"]
    assert board["examples"][0]["marked"]["token"] == info["top_token"]
    assert board["stats"]["density"] == info["density"]
    assert [t["token"] for t in board["tokens"]["top_output_tokens"]][:1] and "q0.99" in board["quantiles"]
    # an encoded name works as well; a node not in the graph is a 404
    assert get_json(server, f"/api/node/{q('demo/graph.json')}/{feature.id}")["id"] == str(feature.id)
    get_json(server, "/api/node/demo/graph.json/feature/0/0/999999", status=404)


def test_remainder_node_of_the_view(server, folder):
    view = get_json(server, "/api/graph/heads/graph.json?node_threshold=0.5&edge_threshold=0.9")
    rem = next(n for n in view["nodes"] if n["kind"] == "remainder")
    node = get_json(server, f"/api/node/heads/graph.json/{rem['id']}?node_threshold=0.5&edge_threshold=0.9")
    assert node["kind"] == "remainder" and node["n_outputs"] >= 1
    get_json(server, f"/api/node/heads/graph.json/{rem['id']}?node_threshold=1&edge_threshold=1", status=404)


def test_features_endpoint(server, folder):
    _, written = folder
    (layer, index), info = next(iter(written.items()))
    board = get_json(server, f"/api/features/{layer}/{index}")
    assert [e["text"] for e in board["examples"]] == [e["text"] for e in info["examples"]]
    assert board["stats"]["n_tokens"] == 10_000
    get_json(server, f"/api/features/{layer}/99999999", status=404)
    get_json(server, "/api/features/x/1", status=400)
    get_json(server, f"/api/features/{layer}/{index}?features=nope", status=404)


def test_feature_listing(server, folder):
    _, written = folder
    info = get_json(server, "/api/features")
    layers = sorted({k[0] for k in written})
    assert info["layers"] == {str(l): sum(1 for k in written if k[0] == l) for l in layers}
    listing = get_json(server, f"/api/features/{layers[0]}?offset=1&limit=2")
    indices = sorted(k[1] for k in written if k[0] == layers[0])
    assert [f["index"] for f in listing["features"]] == indices[1:3] and listing["n_features"] == len(indices)
    assert listing["features"][0]["label"] == written[(layers[0], indices[1])]["label"]
    get_json(server, "/api/features/x", status=400)
    get_json(server, "/api/features/0?limit=0", status=400)
    get_json(server, "/api/features/0/1/2", status=400)


def test_head_nodes_show_their_qk(server, folder):
    root, _ = folder
    doc = read_graph_json(root / "heads" / "graph.json")
    heads = [h for qr in doc.queries if qr["kind"] == "qk" for h in qr["result"]["heads"]]
    assert heads
    for h in heads:
        node_id = f"attention_head/{h['layer']}/{h['query_position']}/{h['head']}"
        node = get_json(server, f"/api/node/heads/graph.json/{node_id}")
        assert node["qk"] == [h]
    assert get_json(server, "/api/qk/heads/graph.npz")["heads"] == heads
    assert get_json(server, "/api/graph/heads/graph.json")["has_qk"]
    other = next(n for n in doc.graph.nodes if n.kind == "feature")
    assert get_json(server, f"/api/node/heads/graph.json/{other.id}")["qk"] == []


# ------------------------------------------------------------------ supernodes and saving
def test_supernodes_are_merge_and_propose(server, folder):
    graph = circuitgraph.load_graph(str(folder[0] / "demo" / "graph.json"))
    pruned = prune_graph(graph, node_threshold=0.9, edge_threshold=1.0).graph
    proposals = get_json(server, "/api/supernodes/demo/graph.json?node_threshold=0.9&edge_threshold=1")["proposals"]
    assert proposals == {k: [str(m) for m in v] for k, v in propose_supernodes(pruned).items()} and proposals
    groups = dict(list(proposals.items())[:1])
    view = get_json(server, "/api/graph/demo/graph.json?node_threshold=0.9&edge_threshold=1&supernodes="
                    + q(json.dumps(groups)))
    merged = merge_supernodes(pruned, groups)
    assert [n["id"] for n in view["nodes"]] == [str(i) for i in merged.node_ids()]
    assert sorted(e["weight"] for e in view["edges"]) == sorted(merged.edge_weight.tolist())
    sup = [n for n in view["nodes"] if n.get("supernode")]
    assert len(sup) == 1 and sup[0]["members"] == list(groups.values())[0]


def test_export_pinned_subgraph(server, folder, tmp_path):
    graph = circuitgraph.load_graph(str(folder[0] / "demo" / "graph.json"))
    pruned = prune_graph(graph, node_threshold=0.9, edge_threshold=1.0).graph
    pinned = [str(n.id) for n in pruned.nodes if n.kind == "feature"][:3] + [str(pruned.target_ids[0])]
    base = f"/api/export/demo/graph.json?node_threshold=0.9&edge_threshold=1&nodes={q(','.join(pinned))}"
    code, body, headers = request(server, base + "&format=json")
    assert code == 200 and "attachment" in headers["content-disposition"]
    (tmp_path / "sub.json").write_bytes(body)
    sub = circuitgraph.load_graph(str(tmp_path / "sub.json"))
    assert sorted(str(i) for i in sub.node_ids()) == sorted(pinned)
    expected = pruned.subgraph([circuitgraph.NodeId.parse(p) for p in pinned])
    assert np.array_equal(sub.edge_weight, expected.edge_weight) and sub.n_edges > 0
    assert sub.metadata["explorer"]["pinned"] == sorted(pinned)

    groups = {"my group": pinned[:2]}
    code, body, _ = request(server, base + "&format=neuronpedia&supernodes=" + q(json.dumps(groups)))
    assert code == 200
    doc = json.loads(body)
    assert {"metadata", "nodes", "links", "qParams"} <= set(doc)
    assert sorted(doc["qParams"]["pinnedIds"]) == sorted(n["node_id"] for n in doc["nodes"])
    assert doc["qParams"]["supernodes"][0][0] == "my group"

    if shutil.which("dot"):
        code, body, headers = request(server, base + "&format=svg&supernodes=" + q(json.dumps(groups)))
        assert code == 200 and headers["content-type"] == "image/svg+xml" and b"<svg" in body
        assert b"my group" in body
    # a pinned node the view does not hold is refused, with the fix
    code, body, _ = request(server, f"/api/export/demo/graph.json?node_threshold=0.1&edge_threshold=0.1&nodes="
                            f"{q(','.join(pinned))}")
    assert code == 400 and b"lower the thresholds" in body


# ------------------------------------------------------------------ datasets
def test_dataset_endpoint(server, folder):
    ds = circuitgraph.open_dataset(folder[0] / "ds")
    answer = get_json(server, "/api/dataset/ds")
    assert [r["id"] for r in answer["rows"]] == ds.manifest["id"].tolist()
    assert [r["replacement_score"] for r in answer["rows"]] == ds.manifest["replacement_score"].tolist()
    assert [r["graph"] for r in answer["rows"]] == ["ds/graphs/1.npz", "ds/graphs/2.npz"]
    assert answer["aggregate"] == "ds/aggregate" and answer["n_ok"] == 2
    assert answer["scores"]["completeness_score"]["mean"] == pytest.approx(ds.manifest["completeness_score"].mean())
    get_json(server, "/api/dataset/nope", status=404)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("path", [
    "/api/graph/demo/graph.json?node_threshold=0",
    "/api/graph/demo/graph.json?node_threshold=1.5",
    "/api/graph/demo/graph.json?node_threshold=abc",
    "/api/graph/demo/graph.json?edge_threshold=nan",
    "/api/graph/demo/graph.json?node_threshold=0.5&node_threshold=0.6",
    "/api/graph/demo/graph.json?colour=red",
    "/api/graph/demo/graph.json?supernodes=%7Bnot%20json",
    "/api/graph/demo/graph.json?supernodes=" + q(json.dumps({"g": ["feature/0/0/999999"]})),
    "/api/node/demo/graph.json/feature/x/1/2",
    "/api/node/demo/graph.json/nokind/1/2/3",
    "/api/node/demo/graph.json/feature/0/11/142?limit=-1",
    "/api/export/demo/graph.json?format=pdf&nodes=feature/0/11/142",
    "/api/export/demo/graph.json?format=json",
    "/api/features/0/1/2",
    "/api/features?colour=1",
    "/api/graph/%ff%fe",
    "/files/%ff",
])
def test_bad_parameters_are_400_with_one_line(server, path):
    err = get_json(server, path, status=400)
    assert set(err) == {"error"} and "\n" not in err["error"] and err["error"]


def test_views_too_large_to_draw_are_refused(server, monkeypatch):
    from circuitgraph.serve import api

    monkeypatch.setattr(api, "MAX_VIEW_EDGES", 10)
    err = get_json(server, "/api/graph/heads/graph.json?node_threshold=0.9&edge_threshold=0.9", status=400)
    assert "lower the thresholds" in err["error"]


@pytest.mark.parametrize("path,status", [
    ("/api/graph/nope.json", 404), ("/api/nothing/x", 404), ("/nothing", 404), ("/api/graph/", 404),
    ("/static/explorer.css.bak", 404), ("/static/../server.py", 404), ("/static/%2e%2e%2fserver.py", 404),
])
def test_unknown_is_404(server, path, status):
    assert get_json(server, path, status=status)["error"]


def test_nothing_outside_the_served_path(folder, tmp_path_factory):
    root, _ = folder
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("TOP-SECRET-CONTENT")
    save_graph_binary(circuitgraph.load_graph(str(root / "heads" / "graph.npz")), outside / "g.npz")
    served = tmp_path_factory.mktemp("served_links")
    (served / "inside.txt").write_text("inside")
    os.symlink(outside / "secret.txt", served / "link.txt")
    os.symlink(outside, served / "linkdir")
    os.symlink(outside / "g.npz", served / "linked_graph.npz")
    (served / "g").mkdir()
    save_graph_binary(circuitgraph.load_graph(str(root / "heads" / "graph.npz")), served / "g" / "own.npz")
    with running_server(served) as srv:
        listing = get_json(srv, "/api/graphs")
        assert [g["name"] for g in listing["graphs"]] == ["g/own.npz"]  # the links outside are not listed
        code, body, _ = request(srv, "/files/inside.txt")
        assert code == 200 and body == b"inside"
        for path in ["/files/../secret.txt", "/files/%2e%2e/secret.txt", "/files/%2E%2E%2Fsecret.txt",
                     "/files/g/../../secret.txt", "/files/" + q(str(outside / "secret.txt")),
                     "/files//etc/passwd", "/files/%2Fetc%2Fpasswd", "/files/link.txt", "/files/linkdir/secret.txt",
                     "/files/linked_graph.npz", "/files/..%5csecret.txt", "/files/%00", "/files/C:/x"]:
            code, body, _ = request(srv, path)
            assert code in (403, 404), (path, code)
            assert b"TOP-SECRET" not in body
        for name in ["linked_graph.npz", "../outside/g.npz", q(str(outside / "g.npz")), "linkdir%2Fg.npz"]:
            code, _, _ = request(srv, f"/api/graph/{name}")
            assert code == 404, name
        assert request(srv, "/files/nothing.txt")[0] == 404
    # a single graph file: only that file is served
    with running_server(root / "heads" / "graph.npz") as srv:
        assert [g["name"] for g in get_json(srv, "/api/graphs")["graphs"]] == ["graph.npz"]
        assert request(srv, "/files/graph.npz")[0] == 200
        assert request(srv, "/files/graph.json")[0] == 403


def test_other_hosts_are_refused(server):
    # DNS rebinding: a page served from another name must not read the API
    code, body, _ = request(server, "/api/graphs", host="evil.example:80")
    assert code == 403 and b"127.0.0.1" in body
    assert request(server, "/api/graphs", host=f"localhost:{server.server_address[1]}")[0] == 200


def test_the_page_ships_in_the_package():
    from circuitgraph.serve.server import STATIC_FILES

    assert STATIC_FILES == {"index.html", "explorer.js", "explorer.css"}
    assert '"serve/static/*"' in (REPO / "pyproject.toml").read_text()  # package-data: installed with the code


def test_static_page_needs_no_network(server):
    code, body, headers = request(server, "/")
    assert code == 200 and headers["content-type"].startswith("text/html")
    assert not re.search(rb"""(src|href)=["'](https?:)?//""", body)
    assets = re.findall(rb"""(?:src|href)=["'](/static/[^"']+)["']""", body)
    assert sorted(assets) == [b"/static/explorer.css", b"/static/explorer.js"]
    for asset in assets:
        code, text, _ = request(server, asset.decode())
        assert code == 200
        # no address but the SVG namespace's (a name, never fetched)
        assert re.findall(rb"https?://[^\s\"'`]+", text) in ([], [b"http://www.w3.org/2000/svg"])


# ------------------------------------------------------------------ the dashboards reader
def test_dashboards_tolerate_missing_columns(tmp_path):
    written = write_features_folder(tmp_path / "f", [(0, 3), (1, 7)], minimal=True, labels=False)
    boards = FeatureDashboards.open(tmp_path / "f")
    board = boards.dashboard(1, 7)
    assert board["stats"] == {} and board["tokens"] == {} and board["quantiles"] == {} and board["label"] == ""
    assert [e["text"] for e in board["examples"]] == [e["text"] for e in written[(1, 7)]["examples"]]
    assert boards.dashboard(2, 2) is None
    assert split_marked_text("a «b» c") == {"before": "a ", "token": "b", "after": " c"}
    assert split_marked_text("a [[b]] c")["token"] == "b" and split_marked_text("plain") is None
    with pytest.raises(circuitgraph.CircuitGraphError, match="not a features folder"):
        FeatureDashboards.open(tmp_path)


def test_a_broken_features_folder_leaves_the_graphs_usable(folder, tmp_path):
    shutil.copy(folder[0] / "heads" / "graph.npz", tmp_path / "graph.npz")
    (tmp_path / "feats").mkdir()
    (tmp_path / "feats" / "features.parquet").write_bytes(b"not parquet")
    with running_server(tmp_path) as srv:
        listing = get_json(srv, "/api/graphs")
        assert "cannot read" in listing["feature_errors"]["feats"]
        view = get_json(srv, "/api/graph/graph.npz")
        assert view["nodes"] and not any(n["has_dashboard"] for n in view["nodes"])
        err = get_json(srv, "/api/features/0/1", status=400)
        assert "features.parquet" in err["error"]


def test_a_graph_without_targets_is_shown_whole(folder, tmp_path):
    graph = circuitgraph.load_graph(str(folder[0] / "demo" / "graph.json"))
    sub = graph.subgraph([n.id for n in graph.nodes if n.kind == "feature"])
    assert not sub.targets and sub.n_edges > 0
    sub.to_json(tmp_path / "sub.json")
    with running_server(tmp_path / "sub.json") as srv:
        view = get_json(srv, "/api/graph/sub.json?node_threshold=0.5")
        assert view["prunable"] is False
        assert [n["id"] for n in view["nodes"]] == [str(i) for i in sub.node_ids()]
        assert sorted(e["weight"] for e in view["edges"]) == sorted(sub.edge_weight.tolist())
        node = get_json(srv, f"/api/node/sub.json/{view['nodes'][0]['id']}")
        assert node["influence"] is None
        get_json(srv, "/api/supernodes/sub.json")


# ------------------------------------------------------------------ the command
def test_cli_serve_prints_the_url_and_stops_on_ctrl_c(folder):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "circuitgraph", "serve", str(folder[0] / "demo"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = proc.stdout.readline()
        assert line.startswith("circuitgraph explorer: http://127.0.0.1:"), (line, proc.stderr.read()
                                                                                if proc.poll() is not None else "")
        url = line.split()[2]
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        conn.request("GET", "/api/graphs")
        assert json.loads(conn.getresponse().read())["graphs"][0]["name"] == "graph.json"
        conn.close()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err
    done = subprocess.run([sys.executable, "-m", "circuitgraph", "serve", str(folder[0] / "nope")],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
