"""The explorer's steering and diff endpoints (`GET /api/steering/NAME`, `GET /api/diff`): a graph
file's steering entries are served as the file holds them (the spec's `steer:` items run on the
demo), and a diff equals `circuitgraph.diff`'s JSON of the same two files; bad parameters and
graphs of different models are refused with one line.  The page is tested in
tests/test_serve_browser.py."""

from __future__ import annotations

import json
import urllib.parse

import pytest

import circuitgraph
from circuitgraph.export.json_graph import read_graph_json
from circuitgraph.serve import running_server
from circuitgraph.testing.explorer_fixture import (
    DEMO_CORRUPTED_PROMPT,
    DEMO_STEER,
    demo_graph_file,
)
from tests.helpers.serve import get_json


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The demo graph with two `steer:` items (one fails), the corrupted prompt's graph, and a
    copy of the demo graph that names another model."""
    root = tmp_path_factory.mktemp("steerdiff")
    demo_graph_file(root / "clean.json", steer=DEMO_STEER)
    demo_graph_file(root / "corrupted.json", prompt=DEMO_CORRUPTED_PROMPT)
    doc = json.loads((root / "corrupted.json").read_text())
    doc["metadata"]["model"]["name"] = "another-model"
    (root / "other.json").write_text(json.dumps(doc))
    return root


@pytest.fixture(scope="module")
def server(folder):
    with running_server(folder) as srv:
        yield srv


def test_steering_entries_are_the_files(server, folder):
    answer = get_json(server, "/api/steering/clean.json")
    expected = read_graph_json(folder / "clean.json").steering
    assert answer["steering"] == expected == json.loads((folder / "clean.json").read_text())["steering"]
    ok, bad = answer["steering"]
    assert ok["status"] == "ok" and bad["status"] == "failed" and "outside" in bad["error"]
    # the demo's flip (docs/steering.md): " an owl" -> " a key"
    assert ok["result"]["baseline"]["text"] == " an owl" and ok["result"]["intervened"]["text"] == " a key"
    assert [iv["node"] for iv in ok["result"]["interventions"]] == ["feature/0/11/142", "feature/0/11/160",
                                                                    "feature/0/11/292"]
    assert set(ok["result"]["metric"]) >= {"actual", "predicted_direct", "predicted_total"}
    assert get_json(server, "/api/graph/clean.json")["n_steering"] == 2
    assert get_json(server, "/api/graph/corrupted.json")["n_steering"] == 0
    assert get_json(server, "/api/steering/corrupted.json")["steering"] == []
    assert "no graph named" in get_json(server, "/api/steering/nope.json", 404)["error"]
    assert "unknown parameter" in get_json(server, "/api/steering/clean.json?x=1", 400)["error"]


@pytest.mark.parametrize("match", ["position", "identity", "from_end"])
def test_diff_equals_circuitgraph_diff(server, folder, match):
    answer = get_json(server, f"/api/diff?a=clean.json&b=corrupted.json&match={match}")
    expected = json.loads(circuitgraph.diff(folder / "clean.json", folder / "corrupted.json", match=match).to_json())
    assert answer["names"] == ["clean.json", "corrupted.json"]
    assert {**answer, "names": expected["names"]} == expected
    assert answer["top_changes"] and len(answer["top_changes"]) == 20
    if match == "position":  # docs/steering.md: the noun's embedding (" owl") is the top change
        assert answer["top_changes"][0]["node"] == "embedding/-1/4/134"
    top5 = get_json(server, f"/api/diff?a=clean.json&b=corrupted.json&match={match}&top=5")["top_changes"]
    assert top5 == answer["top_changes"][:5]
    flips = get_json(server, f"/api/diff?a=clean.json&b=corrupted.json&match={match}&sort=flip")
    expected = json.loads(circuitgraph.diff(folder / "clean.json", folder / "corrupted.json", match=match)
                          .to_json(sort="flip"))
    assert {**flips, "names": expected["names"]} == expected
    assert flips["top_changes"][0]["sign_flip"] and flips["ranked_by"].startswith("sign_flip")


def test_diff_refuses_different_models_and_bad_parameters(server, folder):
    error = get_json(server, "/api/diff?a=clean.json&b=other.json", 400)["error"]
    assert "different models" in error and "allow_different=true" in error and "\n" not in error
    allowed = get_json(server, "/api/diff?a=clean.json&b=other.json&allow_different=true")
    expected = json.loads(circuitgraph.diff(folder / "clean.json", folder / "other.json",
                                            allow_different=True).to_json())
    assert {**allowed, "names": expected["names"]} == expected
    assert any("different models" in n for n in allowed["notes"])
    for query, message in (("a=clean.json", "b must name a graph"),
                           ("a=clean.json&b=corrupted.json&match=near", "match must be one of"),
                           ("a=clean.json&b=corrupted.json&allow_different=maybe", "must be true or false"),
                           ("a=clean.json&b=corrupted.json&top=0", "top must be at least 1"),
                           ("a=clean.json&b=corrupted.json&c=1", "unknown parameter 'c'")):
        assert message in get_json(server, "/api/diff?" + query, 400)["error"]
    assert "no graph named" in get_json(server, "/api/diff?a=clean.json&b=" + urllib.parse.quote("x.json"), 404)["error"]
    assert get_json(server, "/api/diff/clean.json", 404)["error"]


def test_a_refused_view_carries_the_thresholds_it_was_asked_at(server, monkeypatch):
    """The page shows what was requested even when the view is refused (issue 35): the error
    answer holds the thresholds used, the defaults when none were given."""
    import circuitgraph.serve.api as serve_api

    monkeypatch.setattr(serve_api, "MAX_VIEW_EDGES", 1)
    answer = get_json(server, "/api/graph/clean.json?node_threshold=0.7&edge_threshold=0.9", status=400)
    assert "more than the page draws" in answer["error"]
    assert (answer["node_threshold"], answer["edge_threshold"]) == (0.7, 0.9)
    first = get_json(server, "/api/graph/clean.json", status=400)
    assert "error" in first and {"node_threshold", "edge_threshold"} <= set(first)
    bad = get_json(server, "/api/graph/clean.json?node_threshold=2", status=400)
    assert set(bad) == {"error"}  # a bad parameter: nothing was asked
