"""No silent wrong answers: unknown token strings are errors, unknown prompt pieces are
recorded warnings, a failing query or check is a result (the run still writes everything),
and every node id a result names is in the exported graph or flagged as unpruned."""

from __future__ import annotations

import json
import re
import textwrap
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import circuitgraph
from circuitgraph.cli import main as cli
from circuitgraph.errors import TokenError, UnknownTokenWarning, ValidationRunError

runner = CliRunner()

DEMO_SPEC = """\
format_version: 1
model: {builtin: demo}
transcoders: {builtin: demo}
prompt: "mia saw the owl in the zzpark . later she wants"
targets: [{logit_diff: [" an", " a"]}]
prune: {node_threshold: 0.8, edge_threshold: 0.98}
queries:
  - top_paths: {source: {kind: embedding}, k: 3}
  - neighbours: {node: feature/1/11/99999}
  - influence: {top_k: 5}
    on: pruned
  - direct_logit_attribution: {top_k: 40}
    on: full
validate:
  - patching: {corrupted: "mia saw the dog"}
  - predicted_vs_actual: {k: 3}
  - predicted_vs_actual: {k: 3}
    on: full
export: {json: out/g.json, dot: out/g.dot}
"""

NODE_ID = re.compile(r"^(embedding|positional|feature|error|neuron|attention_head|mlp|bias|remainder|logit|target)"
                     r"/-?\d+/\d+/-?\d+$")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One CLI run of the demo with an unknown prompt word, a failing query and a failing check."""
    tmp = tmp_path_factory.mktemp("demo_run")
    path = _write(tmp, DEMO_SPEC)
    result = runner.invoke(cli.app, ["run", str(path), "--quiet", "--strict"])
    return tmp, result


# --- 1. tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["zzznotatoken", " ann"])
def test_unknown_target_token_exits_2_in_one_line_and_writes_nothing(tmp_path, token):
    spec = DEMO_SPEC.replace('logit_diff: [" an", " a"]', f'logit_diff: [" an", "{token}"]')
    result = runner.invoke(cli.app, ["run", str(_write(tmp_path, spec)), "--quiet"])
    assert result.exit_code == cli.EXIT_BAD_INPUT, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert repr(token) in lines[0] and "nearest vocabulary entries: '" in lines[0], lines[0]
    assert "targets[0].logit_diff[1]" in lines[0]
    assert not (tmp_path / "out").exists()


def test_nearest_entries_are_the_close_ones():
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.builtin import demo_path

    tok = Tokenizer.from_dir(demo_path() / "model" / "tokenizer")
    with pytest.raises(TokenError, match=r"' ann'.*unknown token '<unk>'.*nearest vocabulary entries: ' an'"):
        tok.single_token(" ann", where="targets[0].logit")
    assert tok.single_token(" an") == tok.encode(" an")[0]


def test_a_token_string_that_does_not_round_trip_is_an_error():
    import tokenizers
    from tokenizers import models, normalizers, pre_tokenizers

    from circuitgraph.adapters.tokenizer import Tokenizer

    vocab = {"<unk>": 0, "an": 1, "owl": 2}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = Tokenizer(backend, bos_id=None, kind="files")
    assert tok.single_token("an") == 1
    with pytest.raises(TokenError, match=r"'An' does not round-trip.*decodes to 'an'.*nearest vocabulary entries"):
        tok.single_token("An", where="logit_lens.tokens[0]")
    assert tok.unknown_pieces("an zebra owl") == ["zebra"]


def test_unknown_tokens_are_errors_in_queries_checks_and_the_python_api():
    from circuitgraph.queries import run_query
    from circuitgraph.validation import run_check

    graph = circuitgraph.build({"format_version": 1, "model": {"builtin": "demo"}, "transcoders": {"builtin": "demo"},
                                "prompt": "mia saw the owl . later she wants", "targets": [{"logit": " an"}]})
    for query in ({"logit_lens": {"tokens": [" an", "zzznotatoken"]}},
                  {"congruence": {"tokens": ["zzznotatoken"], "kind": "feature"}}):
        with pytest.raises(TokenError, match="'zzznotatoken' is not in the tokenizer's vocabulary"):
            run_query(graph, query)
    with pytest.raises(ValidationRunError, match="patching.metric.logit_diff.1. 'zzznotatoken' is not in"):
        run_check(graph, {"patching": {"corrupted": "mia saw the dog . later she wants",
                                       "metric": {"logit_diff": [" an", "zzznotatoken"]}}})
    # unknown words in a check's prompt: a warning by default, an error with strict: true
    with pytest.warns(UnknownTokenWarning, match=r"\['zzzpark'\]"):
        run_check(graph, {"replacement_fidelity": {"prompts": ["zzzpark mia saw the owl"]}})
    with pytest.raises(ValidationRunError, match="does not know 1 piece"):
        run_check(graph, {"replacement_fidelity": {"prompts": [{"text": "zzzpark mia", "strict": True}]}})


def test_strict_prompt_makes_unknown_pieces_an_error(tmp_path):
    spec = DEMO_SPEC.replace('prompt: "mia saw the owl in the zzpark . later she wants"',
                             'prompt: {text: "mia saw the owl in the zzpark . later she wants", strict: true}')
    result = runner.invoke(cli.app, ["run", str(_write(tmp_path, spec)), "--quiet"])
    assert result.exit_code == cli.EXIT_BAD_INPUT, result.output
    assert "' zzpark'" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_unknown_prompt_pieces_are_a_recorded_warning(demo_run):
    tmp, result = demo_run
    doc = json.loads((tmp / "out" / "g.json").read_text())
    (warning,) = doc["metadata"]["warnings"]
    assert "[' zzpark']" in warning and "strict: true" in warning
    assert f"warning: {warning}" in result.stdout
    with warnings.catch_warnings():  # a clean prompt warns about nothing
        warnings.simplefilter("error", UnknownTokenWarning)
        from circuitgraph.adapters.tokenizer import Tokenizer, check_prompt_text
        from circuitgraph.builtin import demo_path

        check_prompt_text(Tokenizer.from_dir(demo_path() / "model" / "tokenizer"), "mia saw the owl", strict=True,
                          where="prompt")


# --- 3. a failing query or check is a result ------------------------------------------------


def test_failures_are_results_and_strict_exits_3(demo_run):
    tmp, result = demo_run
    assert result.exit_code == cli.EXIT_FAILED_CHECKS, result.output
    doc = json.loads((tmp / "out" / "g.json").read_text())
    assert (tmp / "out" / "g.dot").read_text().startswith("digraph")
    status = [(e["kind"], e["status"]) for e in doc["queries"] + doc["validation"]]
    assert status == [("top_paths", "ok"), ("neighbours", "failed"), ("influence", "ok"),
                      ("direct_logit_attribution", "ok"), ("patching", "failed"), ("predicted_vs_actual", "ok"),
                      ("predicted_vs_actual", "ok")]
    for e in doc["queries"] + doc["validation"]:
        if e["status"] == "failed":
            assert e["result"] is None and "\n" not in e["error"] and e["error"]
            assert f"FAILED: {e['error']}" in result.stdout
        else:
            assert "error" not in e and e["result"] is not None
    assert "feature/1/11/99999" in doc["queries"][1]["error"]
    assert "same" in doc["validation"][0]["error"] or "tokens" in doc["validation"][0]["error"]
    failed = [line for line in result.stderr.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 2 and failed[0].startswith("failed: queries[1] neighbours:")


def test_without_strict_a_failed_check_exits_0(tmp_path):
    spec = textwrap.dedent(DEMO_SPEC)
    spec = spec[:spec.index("queries:")] + 'validate: [{patching: {corrupted: "mia saw the dog"}}]\n' \
        + "export: {json: out/g.json}\n"
    result = runner.invoke(cli.app, ["run", str(_write(tmp_path, spec)), "--quiet"])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "g.json").read_text())
    assert doc["validation"][0]["status"] == "failed" and doc["nodes"]


# --- 4. what the results refer to ------------------------------------------------------------


def _node_ids(value) -> set[str]:
    if isinstance(value, str):
        return {value} if NODE_ID.match(value) else set()
    if isinstance(value, dict):
        return set().union(*(_node_ids(v) for v in value.values())) if value else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(_node_ids(v) for v in value)) if value else set()
    return set()


def test_every_node_id_is_exported_or_flagged_as_unpruned(demo_run):
    tmp, _ = demo_run
    doc = json.loads((tmp / "out" / "g.json").read_text())
    exported = {n["id"] for n in doc["nodes"]}
    outside = 0
    for e in doc["queries"] + doc["validation"]:
        assert e["on"] in ("full", "pruned")
        missing = _node_ids(e["result"]) - exported
        if e["on"] == "full":
            assert "unpruned graph" in e["refers_to"]
            outside += len(missing)
        else:
            assert "refers_to" not in e and not missing, (e["kind"], missing)
    assert outside > 0  # the full-graph results do name nodes that pruning removed
    kinds_on = [(e["kind"], e["on"]) for e in doc["queries"] + doc["validation"]]
    assert kinds_on[:4] == [("top_paths", "full"), ("neighbours", "full"), ("influence", "pruned"),
                            ("direct_logit_attribution", "full")]
    assert kinds_on[5:] == [("predicted_vs_actual", "pruned"), ("predicted_vs_actual", "full")]


def test_on_is_a_plain_yaml_key():
    from circuitgraph.spec import load_spec

    spec = load_spec({"format_version": 1, "model": {"builtin": "demo"}, "prompt": "mia",
                      "queries": [{"scores": None, "on": "pruned"}], "validate": [{"faithfulness": None}]})
    assert spec.queries[0].on == "pruned" and spec.validate[0].on == "pruned"
    with pytest.raises(circuitgraph.errors.SpecError, match="on"):
        load_spec({"format_version": 1, "model": {"builtin": "demo"}, "prompt": "mia",
                   "queries": [{"scores": None, "on": "both"}]})


# --- 5. no silently ignored input ------------------------------------------------------------

BASE = {"format_version": 1, "model": {"builtin": "demo"}, "transcoders": {"builtin": "demo"},
        "prompt": "mia saw the owl . later she wants", "targets": [{"logit": " an"}]}


@pytest.fixture(scope="module")
def heads_graph():
    return circuitgraph.build({**BASE, "graph": {"attention": "heads", "mlp": "mlp"}})


@pytest.mark.parametrize("graph_keys, words", [
    ({"mlp": {5: "neurons"}}, ["graph.mlp: layer keys [5]", "2 layers (0-1)"]),
    ({"attention": {0: "heads", 7: "heads"}}, ["graph.attention: layer keys [7]", "use keys 0-1"]),
])
def test_layer_keys_out_of_range_are_errors(graph_keys, words):
    with pytest.raises(circuitgraph.errors.AttributionError) as info:
        circuitgraph.build({**BASE, "graph": graph_keys})
    for word in words:
        assert word in str(info.value)


def test_de_embedding_of_a_node_that_does_not_exist_is_an_error():
    from circuitgraph.queries import run_query

    graph = circuitgraph.build(BASE)
    with pytest.raises(circuitgraph.errors.QueryError,
                       match=r"feature/1/99/3 is not in the graph.*\{kind: feature, layer: 1, index: 3\}"):
        run_query(graph, {"de_embedding": {"node": "feature/1/99/3"}})
    # the position-free form asks about the unit's weights, active or not
    res = run_query(graph, {"de_embedding": {"node": {"kind": "feature", "layer": 1, "index": 3}, "top_k": 2}})
    assert len(res.rows) == 2


def test_head_queries_that_cannot_mean_anything_with_head_nodes_are_errors(heads_graph):
    from circuitgraph.queries import run_query

    g = heads_graph
    QueryError = circuitgraph.errors.QueryError
    with pytest.raises(QueryError, match=r"through\[0\].*has incoming edges.*source: \{kind: attention_head\}"):
        run_query(g, {"top_paths": {"source": {"kind": "embedding"}, "through": [{"kind": "attention_head"}]}})
    with pytest.raises(QueryError, match="expand_heads.*attention: frozen"):
        run_query(g, {"top_paths": {"source": {"kind": "embedding"}, "expand_heads": True}})
    emb = next(str(n.id) for n in g.nodes if n.kind == "embedding" and n.position == 8)
    head = next(str(n.id) for n in g.nodes if n.kind == "attention_head")
    with pytest.raises(QueryError, match="attention: heads, so its heads are nodes"):
        run_query(g, {"head_split": {"source": emb, "target": str(g.target_ids[0])}})
    with pytest.raises(QueryError, match="head nodes have no incoming edges"):
        run_query(g, {"head_split": {"source": emb, "target": head}})
    # what the messages suggest works
    assert run_query(g, {"top_paths": {"source": {"kind": "attention_head"}, "k": 2}}).paths
