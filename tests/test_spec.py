"""The spec: every accepted form, every error located and reported at once, the committed
JSON Schema, round trips.  No torch, no model."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pydantic
import pytest

import circuitgraph.spec as spec_pkg
from circuitgraph.errors import CircuitGraphError, SpecError
from circuitgraph.spec import (
    AblateCheck,
    DirectionTarget,
    FeatureTarget,
    LogitDiffTarget,
    LogitTarget,
    NodeFilter,
    PruneSpec,
    Spec,
    TextPrompt,
    TokensPrompt,
    TopLogitsTarget,
    load_spec,
    spec_json_schema,
    spec_schema_text,
)
from circuitgraph.spec.json_schema import DEFAULT_SCHEMA_PATH

REPO = Path(__file__).resolve().parents[1]


def base(**overrides: Any) -> dict[str, Any]:
    """A minimal valid spec with some keys replaced."""
    data: dict[str, Any] = {"format_version": 1, "model": {"builtin": "demo"}, "prompt": "The cat sat on the"}
    data.update(overrides)
    return data


def errors_of(data: Any, **kwargs: Any) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        load_spec(data, **kwargs)
    return info.value.errors


def locations(data: Any) -> list[str]:
    return [loc for loc, _ in errors_of(data)]


# --- accepted forms ---------------------------------------------------------------------


def test_minimal_spec_and_defaults():
    spec = load_spec(base())
    assert spec.format_version == 1 and spec.seed == 0
    assert spec.model.source == "builtin" and spec.model.builtin == "demo"
    assert spec.model.dtype == "float32" and spec.model.device == "cpu"
    assert spec.transcoders is None
    assert isinstance(spec.prompt, TextPrompt) and spec.prompt.prepend_bos is True
    (target,) = spec.targets
    assert isinstance(target, TopLogitsTarget) and target.kind == "top_logits"
    assert (target.params.max_n, target.params.cumulative_probability) == (10, 0.95)
    assert spec.graph.mlp is None and spec.graph.attention == "frozen"
    assert spec.graph.mlp_for(0, has_transcoders=False) == "neurons"
    assert spec.prune == "none" and spec.pruning is None
    assert spec.queries == () and spec.validate == ()
    assert spec.export.outputs() == {}


@pytest.mark.parametrize(
    ("model", "source"),
    [
        ({"path": "models/tiny"}, "path"),
        ({"name": "gpt2", "fold_ln": True, "center_writing_weights": True, "center_unembed": True}, "name"),
        ({"builtin": "demo", "dtype": "float64", "device": "auto"}, "builtin"),
    ],
)
def test_model_sources(model, source):
    spec = load_spec(base(model=model))
    assert spec.model.source == source


def test_transcoders_path_and_release():
    spec = load_spec(base(transcoders={"path": "tc", "layers": [0, 1]}))
    assert spec.transcoders.source == "path" and spec.transcoders.layers == (0, 1)
    assert spec.graph.mlp_for(1, has_transcoders=True) == "transcoders"
    spec = load_spec(base(transcoders={"release": "gpt2-tc", "ids": {0: "a", "1": "b"}}))
    assert spec.transcoders.source == "release" and spec.transcoders.ids == {0: "a", 1: "b"}
    assert spec.transcoders.available_layers() == (0, 1)
    spec = load_spec(base(transcoders={"release": "gemma-scope-2b-pt-transcoders"}))  # ids optional
    assert spec.transcoders.source == "release" and spec.transcoders.ids is None
    assert spec.transcoders.available_layers() is None


@pytest.mark.parametrize(
    ("prompt", "kind"),
    [("hello", TextPrompt), ({"text": "hello", "prepend_bos": False}, TextPrompt), ({"tokens": [1, 41, 52]}, TokensPrompt)],
)
def test_prompt_forms(prompt, kind):
    assert isinstance(load_spec(base(prompt=prompt)).prompt, kind)


def test_target_forms():
    spec = load_spec(
        base(
            transcoders={"path": "tc"},
            targets=[
                {"logit": " an", "position": -2, "relative_to_mean": True, "weight": 0.5},
                {"logit": 262},
                {"logit_diff": [" an", " a"]},
                {"logit_diff": [1, " a"], "weight": 2},
                {"top_logits": 5},
                {"top_logits": {"max_n": 3, "cumulative_probability": 0.5, "relative_to_mean": False}},
                {"top_logits": None},
                {"feature": {"layer": 1, "position": 3, "index": 17}, "weight": 1.0},
                {"neuron": {"layer": 0, "position": 3, "index": 5}},
                {"direction": {"site": "resid_mid", "layer": 1, "vector": [0.1, -2, 3e-3], "name": "d"}},
                {"direction": {"site": "resid_post", "layer": 0, "file": "dir.npy"}},
            ],
        )
    )
    kinds = [t.kind for t in spec.targets]
    assert kinds == [
        "logit", "logit", "logit_diff", "logit_diff", "top_logits", "top_logits", "top_logits",
        "feature", "neuron", "direction", "direction",
    ]  # fmt: skip
    t = spec.targets
    assert isinstance(t[0], LogitTarget) and t[0].logit == " an" and t[0].position == -2 and t[0].weight == 0.5
    assert t[1].logit == 262 and t[1].position == -1 and t[1].weight is None
    assert isinstance(t[2], LogitDiffTarget) and t[2].logit_diff == (" an", " a")
    assert t[3].logit_diff == (1, " a") and t[3].weight == 2.0
    assert t[4].top_logits.max_n == 5
    assert t[5].params.cumulative_probability == 0.5 and t[5].params.relative_to_mean is False
    assert t[6].top_logits.max_n == 10
    assert isinstance(t[7], FeatureTarget) and (t[7].feature.layer, t[7].feature.position, t[7].feature.index) == (1, 3, 17)
    assert t[8].neuron.index == 5
    assert isinstance(t[9], DirectionTarget) and t[9].direction.vector == (0.1, -2.0, 3e-3)
    assert t[10].direction.file.name == "dir.npy" and t[10].direction.position == -1


def test_graph_forms():
    spec = load_spec(
        base(
            transcoders={"path": "tc"},
            graph={
                "mlp": {0: "neurons", "1": "transcoders"},
                "attention": {1: "heads"},
                "positional_nodes": True,
                "bias_nodes": True,
                "bos_nodes": True,
                "neuron_top_k": 8,
                "max_feature_nodes": 100,
                "dtype": "float64",
                "batch_size": 4,
                "max_dense_nodes": 10,
            },
        )
    )
    g = spec.graph
    assert g.mlp == {0: "neurons", 1: "transcoders"}
    assert [g.mlp_for(layer, has_transcoders=True) for layer in (0, 1, 2)] == ["neurons", "transcoders", "transcoders"]
    assert [g.attention_for(layer) for layer in (0, 1)] == ["frozen", "heads"]
    assert load_spec(base(graph={"mlp": "mlp", "attention": "heads"})).graph.mlp_for(3, has_transcoders=False) == "mlp"


@pytest.mark.parametrize("prune", ["none", None])
def test_prune_none(prune):
    assert load_spec(base(prune=prune)).pruning is None


def test_prune_thresholds():
    spec = load_spec(base(prune={"node_threshold": 0.5, "top_k_edges": 100, "target_share": 1}))
    assert isinstance(spec.prune, PruneSpec) and spec.pruning is spec.prune
    assert (spec.prune.node_threshold, spec.prune.edge_threshold, spec.prune.top_k_edges) == (0.5, 0.98, 100)
    assert load_spec(base(prune={})).pruning == PruneSpec()


def test_export_forms():
    spec = load_spec(
        base(
            export={
                "json": "out/g.json",
                "dot": "out/g.dot",
                "svg": "out/g.svg",
                "png": "out/g.png",
                "neuronpedia": "out/np.json",
                "graph": "out/g.npz",
                "max_render_nodes": 50,
                "max_json_edges": 10,
            }
        )
    )
    assert list(spec.export.outputs()) == ["json", "dot", "svg", "png", "neuronpedia", "graph"]
    assert spec.export.json == Path("out/g.json") and spec.export.max_render_nodes == 50


ALL_QUERIES = [
    {"top_paths": {"source": {"kind": "embedding"}}},
    {
        "top_paths": {
            "source": {"kind": ["embedding", "feature"], "layer": [-1, 1]},
            "target": {"id": "logit/2/4/262"},
            "k": 3,
            "rank": "normalized",
            "method": "beam",
            "beam_width": 5,
            "max_length": 4,
            "through": [{"layer": 1}],
            "avoid": [{"kind": "error"}],
            "expand_heads": True,
        }
    },
    {"influence": {"top_k": 5, "signed": True}},
    {"influence": None},
    {"direct_logit_attribution": {"target": 0, "top_k": 3, "kinds": ["feature", "error"]}},
    {"logit_lens": {"tokens": [" an", 5], "position": -1, "top_k": 3}},
    {"congruence": {"tokens": [" an", " a"], "kind": "neuron", "layer": 0, "mode": "cosine"}},
    {"congruence": {"tokens": [" an"], "mode": "input_scaled"}},
    {"neighbours": {"node": "feature/1/4/17", "direction": "in", "top_k": 3}},
    {"subgraph": {"filter": {"position": [3, 4], "index": 17}}},
    {"supernodes": {"groups": {"say an": {"id": ["feature/1/4/17"]}, "early": {"layer": 0}}}},
    {"scores": {}},
    {"scores": None},
    {"head_split": {"source": "feature/0/2/3", "target": "feature/1/4/17"}},
    {"virtual_weights": {"source": {"layer": 0, "kind": "feature"}, "target": {"layer": 1}, "top_k": 4}},
    {"de_embedding": {"node": "feature/1/4/17"}},
    {"de_embedding": {"node": {"kind": "neuron", "layer": 0, "index": 5}, "head": {"layer": 0, "head": 1}}},
]

ALL_CHECKS = [
    {"ablate": {}},
    {"ablate": {"nodes": {"kind": "feature", "layer": 1}, "mode": "scale", "scale": 0.0, "controls": "count_matched"}},
    {"ablate": {"mode": "set", "value": 0.5, "positions": [-1], "controls": [], "tolerance": 0}},
    {"ablate": {"mode": "patch", "patch_prompt": {"tokens": [1, 2, 3]}, "max_draws": 5}},
    {"ablate": {"mode": "mean", "reference_prompts": ["a b c", {"tokens": [4, 5]}]}},
    {"predicted_vs_actual": {"k": 3}},
    {"predicted_vs_actual": {"mode": "mean", "reference_prompts": ["x"]}},
    {"patching": {"corrupted": "The dog sat on the"}},
    {
        "patching": {
            "clean": "The cat sat on the",
            "corrupted": {"tokens": [1, 2, 3]},
            "metric": {"logit_diff": [" an", " a"]},
            "granularity": ["layer", "head", "neuron", "feature", "position"],
            "heatmap": "out/patch.png",
        }
    },
    {"patching": {"corrupted": "x", "metric": {"logit": 5}, "granularity": "position"}},
    {"faithfulness": None},
    {"faithfulness": {"mode": "zero"}},
    {"sign_regimes": {"layers": [0, 1], "top_k": 3, "prompts": ["a"], "echo_threshold": 0.25}},
    {"replacement_fidelity": {"prompts": ["a", {"tokens": [1]}]}},
]


def test_every_query_and_check_kind():
    spec = load_spec(base(transcoders={"path": "tc"}, queries=ALL_QUERIES, validate=ALL_CHECKS))
    assert [q.kind for q in spec.queries] == [next(iter(q)) for q in ALL_QUERIES]
    assert [c.kind for c in spec.validate] == [next(iter(c)) for c in ALL_CHECKS]
    top = spec.queries[1].params
    assert top.source.layer == (-1, 1) and top.target.id == ("logit/2/4/262",) and top.through[0].layer == (1, 1)
    assert spec.queries[0].params.target == "targets"
    assert spec.queries[3].params.top_k == 20
    ablate = spec.validate[0]
    assert isinstance(ablate, AblateCheck) and ablate.params.nodes == "top_nodes"
    assert ablate.params.controls == ("matched_magnitude", "count_matched")
    assert spec.validate[1].params.controls == ("count_matched",) and spec.validate[1].params.scale == 0.0
    assert spec.validate[7].params.metric is None and spec.validate[7].params.granularity == ("layer", "head")
    assert spec.validate[9].params.granularity == ("position",)
    assert spec.validate[10].params.mode == "mean"


def test_node_filter_normalises_and_matches():
    f = NodeFilter(kind="feature", layer=[1, 2], position=[3, -1])
    assert f.kind == ("feature",) and f.layer == (1, 2) and f.position == (3, -1)
    assert f.matches("feature", 1, 3, 0)
    assert not f.matches("neuron", 1, 3, 0) and not f.matches("feature", 3, 3, 0)
    assert not f.matches("feature", 1, 5, 0) and f.matches("feature", 1, 5, 0, n_positions=6)
    assert NodeFilter(id="feature/1/04/17").id == ("feature/1/4/17",)
    assert NodeFilter(id="feature/1/4/17").matches("feature", 1, 4, 17)


def test_yaml_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            format_version: 1
            model: {path: models/tiny}
            transcoders: {path: tc}
            prompt: "The cat sat on the"
            targets:
              - logit_diff: [" an", " a"]
              - top_logits: 5
            graph: {mlp: {0: neurons, 1: transcoders}}
            prune: {node_threshold: 0.8, edge_threshold: 1e-1}
            export: {json: out/graph.json, svg: /abs/graph.svg}
            """
        )
    )
    spec = load_spec(path)
    # relative paths are relative to the spec file's folder; absolute ones are kept
    assert spec.model.path == tmp_path / "models/tiny"
    assert spec.transcoders.path == tmp_path / "tc"
    assert spec.export.json == tmp_path / "out/graph.json" and spec.export.svg == Path("/abs/graph.svg")
    assert spec.prune.edge_threshold == 0.1  # YAML 1.1 would read 1e-1 as a string
    assert spec.graph.mlp == {0: "neurons", 1: "transcoders"}
    assert load_spec(str(path)) == spec


def test_json_file_with_string_layer_keys(tmp_path):
    data = base(transcoders={"release": "r", "ids": {"0": "a", "1": "b"}}, graph={"attention": {"1": "heads"}})
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    spec = load_spec(path)
    assert spec.transcoders.ids == {0: "a", 1: "b"} and spec.graph.attention == {1: "heads"}


def test_spec_instance_is_returned_and_python_construction():
    spec = Spec(format_version=1, model={"name": "gpt2"}, prompt="hi", targets=[LogitTarget(logit=" an")])
    assert load_spec(spec) is spec
    assert spec.targets[0].kind == "logit"
    with pytest.raises(SpecError) as info:
        Spec(format_version=1, model={"name": "gpt2"}, prompt="hi", targets=[{"logit_diff": ["a"]}])
    assert info.value.errors[0][0] == "targets[0].logit_diff"


def test_frozen():
    spec = load_spec(base())
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.seed = 3  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.model.name = "x"  # type: ignore[misc]


@pytest.mark.parametrize("mode", ["python", "json"])
def test_round_trip(mode):
    data = base(transcoders={"path": "tc"}, queries=ALL_QUERIES, validate=ALL_CHECKS, prune={"top_k_nodes": 3})
    data["targets"] = [{"logit_diff": [" an", 3]}, {"top_logits": 2}, {"feature": {"layer": 1, "position": 3, "index": 1}}]
    data["graph"] = {"mlp": {0: "neurons"}, "attention": "heads"}
    data["export"] = {"json": "g.json", "png": "g.png"}
    spec = load_spec(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. pydantic's union serializer falling back
        dumped = spec.model_dump(mode=mode)
    if mode == "json":
        dumped = json.loads(json.dumps(dumped))
    again = load_spec(dumped)
    assert again == spec
    assert again.model_dump(mode=mode) == spec.model_dump(mode=mode)


# --- errors -----------------------------------------------------------------------------


def test_three_mistakes_three_located_messages():
    data = base(
        targets=[{"logit": " an"}, {"logit_diff": [" an"]}],
        graph={"mlp": "neurons", "foo": 1},
        prune={"node_threshold": 1.5},
    )
    errors = errors_of(data)
    assert [loc for loc, _ in errors] == ["targets[1].logit_diff", "graph.foo", "prune.node_threshold"]
    messages = dict(errors)
    assert "expected two tokens" in messages["targets[1].logit_diff"] and "got 1" in messages["targets[1].logit_diff"]
    assert messages["graph.foo"].startswith("unknown key 'foo'; allowed keys: mlp, attention,")
    assert "<= 1" in messages["prune.node_threshold"] and "1.5" in messages["prune.node_threshold"]


def test_error_in_one_variant_is_reported_for_that_variant_only():
    errors = errors_of(base(targets=[{"logit_diff": [" an", " a", " the"], "position": "x"}]))
    assert [loc for loc, _ in errors] == ["targets[0].logit_diff", "targets[0].position"]
    assert "got 3" in errors[0][1]


@pytest.mark.parametrize(
    ("targets", "location", "words"),
    [
        ([{"foo": 1}], "targets[0]", ["exactly one of the keys logit, logit_diff", "got foo"]),
        ([{"logit": "a", "logit_diff": ["a", "b"]}], "targets[0]", ["got logit and logit_diff"]),
        ([5], "targets[0]", ["expected a mapping", "got 5"]),
        ([{"logit": "a", "postion": 1}], "targets[0].postion", ["unknown key 'postion'", "did you mean 'position'"]),
        ([{"logit": True}], "targets[0].logit", ["expected a token", "quote"]),
        ([{"logit": ""}], "targets[0].logit", ["empty token"]),
        ([{"logit": -1}], "targets[0].logit", [">= 0", "-1"]),
        ([{"top_logits": 0}], "targets[0].top_logits", ["must be > 0, got 0"]),
        ([{"top_logits": {"cumulative_probability": 0}}], "targets[0].top_logits.cumulative_probability", ["> 0"]),
        ([{"feature": {"layer": 1, "position": 3}}], "targets[0].feature.index", ["missing required key 'index'"]),
        ([{"direction": {"site": "resid_pre", "layer": 0}}], "targets[0].direction", ["exactly one of vector or file"]),
        ([{"direction": {"site": "x", "layer": 0, "vector": [1]}}], "targets[0].direction.site", ["resid_pre"]),
        ([{"direction": {"site": "resid_pre", "layer": 0, "file": "d.txt"}}], "targets[0].direction.file", [".npy"]),
        ([], "targets", ["at least 1"]),
    ],
)
def test_target_errors(targets, location, words):
    ((loc, message),) = errors_of(base(targets=targets))
    assert loc == location
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    ("overrides", "location", "words"),
    [
        ({"format_version": 2}, "format_version", ["expected 1", "got 2"]),
        ({"prompt": ""}, "prompt", ["empty prompt"]),
        ({"prompt": {"tokens": []}}, "prompt.tokens", ["at least 1"]),
        ({"prompt": {"tokens": [1, -2]}}, "prompt.tokens[1]", [">= 0"]),
        ({"prompt": 5}, "prompt", ["a string, {text: ...} or {tokens: [...]}", "got 5"]),
        ({"prompt": {"text": "a", "tokens": [1]}}, "prompt", ["got text and tokens"]),
        ({"model": {}}, "model", ["exactly one of path, name, builtin or pretrained", "none of them"]),
        ({"model": {"name": "gpt2", "builtin": "demo"}}, "model", ["got name and builtin"]),
        ({"model": {"builtin": "other"}}, "model.builtin", ["'demo'", "'other'"]),
        ({"model": {"path": "m", "fold_ln": True}}, "model.fold_ln", ["loaded by name"]),
        ({"model": {"name": "gpt2", "dtype": "float8"}}, "model.dtype", ["float32"]),
        ({"transcoders": {"release": "r", "format": "saelens"}}, "transcoders.format", ["use it with path or hf"]),
        ({"transcoders": {"path": "p", "ids": {0: "a"}}}, "transcoders.ids", ["only used with release"]),
        ({"transcoders": {"path": "p", "release": "r"}}, "transcoders", ["exactly one of path, release, builtin or hf"]),
        ({"transcoders": {"release": "r", "ids": {"x": "a"}}}, "transcoders.ids.x", ["layer numbers"]),
        ({"transcoders": {"release": "r", "ids": {0: "a"}, "layers": [0, 2]}}, "transcoders.layers", ["[2]"]),
        ({"graph": {"mlp": "transcoders"}}, "graph.mlp", ["needs a transcoders section"]),
        ({"graph": {"mlp": "transcoder"}}, "graph.mlp", ["did you mean 'transcoders'"]),
        ({"graph": {"mlp": 3}}, "graph.mlp", ["'transcoders', 'neurons', 'mlp' or a mapping", "got 3"]),
        ({"graph": {"attention": {0: "hedas"}}}, "graph.attention[0]", ["'frozen' or 'heads'"]),
        ({"graph": {"batch_size": 0}}, "graph.batch_size", ["must be > 0, got 0"]),
        ({"graph": {"neuron_top_k": True}}, "graph.neuron_top_k", ["expected an integer"]),
        ({"prune": "all"}, "prune", ["expected 'none'"]),
        ({"prune": {"top_k_nodes": 0}}, "prune.top_k_nodes", ["> 0"]),
        ({"prune": 0.5}, "prune", ["'none' or a mapping"]),
        ({"export": {"svg": "g.png"}}, "export.svg", [".svg"]),
        ({"export": {"max_render_nodes": 0}}, "export.max_render_nodes", ["> 0"]),
        ({"export": {"html": "g.txt"}}, "export.html", ["should end in .html"]),
        ({"export": {"report": "g.html"}}, "export.report", ["unknown key 'report'", "json, dot, svg, png"]),
        ({"seed": "1"}, "seed", ["expected an integer", "'1'"]),
        ({"extra": 1}, "extra", ["unknown key 'extra'", "format_version, seed, model"]),
    ],
)
def test_section_errors(overrides, location, words):
    ((loc, message),) = errors_of(base(**overrides))
    assert loc == location
    for word in words:
        assert word in message, message


def test_missing_required_keys():
    errors = errors_of({"model": {"builtin": "demo"}})
    assert errors[0] == ("format_version", "missing required key 'format_version'")
    assert errors[1][0] == "prompt" and errors[1][1].startswith("missing required key 'prompt'")
    assert len(errors) == 2


@pytest.mark.parametrize(
    ("item", "location", "words"),
    [
        ({"top_paths": {}}, "queries[0].top_paths.source", ["missing required key 'source'"]),
        ({"top_paths": {"source": {}}}, "queries[0].top_paths.source", ["empty node filter"]),
        ({"top_paths": {"source": {"kind": "feat"}}}, "queries[0].top_paths.source.kind", ["'feature'", "'feat'"]),
        ({"top_paths": {"source": {"layer": [2, 1]}}}, "queries[0].top_paths.source.layer", ["[2, 1] is empty"]),
        ({"top_paths": {"source": {"layer": 0}, "target": "logits"}}, "queries[0].top_paths.target", ["'targets'"]),
        ({"top_paths": {"source": {"layer": 0}, "rank": "abs"}}, "queries[0].top_paths.rank", ["'normalized'"]),
        ({"influence": {"top_k": 0}}, "queries[0].influence.top_k", ["> 0"]),
        ({"direct_logit_attribution": {"target": 1}}, "queries[0].direct_logit_attribution.target", ["1 target"]),
        ({"congruence": {"tokens": []}}, "queries[0].congruence.tokens", ["got 0"]),
        ({"congruence": {"tokens": ["a"], "kind": "feature"}}, "queries[0].congruence.kind", ["needs transcoders"]),
        ({"neighbours": {"node": "feature/1/x/2"}}, "queries[0].neighbours.node", ["must be integers"]),
        ({"neighbours": {"node": "feature/1/2"}}, "queries[0].neighbours.node", ["kind/layer/position/index"]),
        ({"supernodes": {"groups": {}}}, "queries[0].supernodes.groups", ["at least 1"]),
        ({"de_embedding": {"node": 5}}, "queries[0].de_embedding.node", ["a node id", "got 5"]),
        ({"scores": {"x": 1}}, "queries[0].scores.x", ["unknown key 'x'"]),
        ({"top_path": {}}, "queries[0]", ["exactly one of the keys top_paths", "did you mean 'top_paths'"]),
    ],
)
def test_query_errors(item, location, words):
    ((loc, message),) = errors_of(base(queries=[item]))
    assert loc == location
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("item", "location", "words"),
    [
        ({"ablate": {"mode": "scale"}}, "validate[0].ablate.scale", ["mode: scale needs scale"]),
        ({"ablate": {"mode": "set"}}, "validate[0].ablate.value", ["mode: set needs value"]),
        ({"ablate": {"mode": "patch"}}, "validate[0].ablate.patch_prompt", ["mode: patch needs patch_prompt"]),
        ({"ablate": {"mode": "mean"}}, "validate[0].ablate.reference_prompts", ["mode: mean needs reference_prompts"]),
        ({"ablate": {"scale": 2.0}}, "validate[0].ablate.scale", ["only used with mode: scale"]),
        ({"ablate": {"reference_prompts": ["x"]}}, "validate[0].ablate.reference_prompts", ["only used with mode: mean"]),
        ({"ablate": {"controls": ["random"]}}, "validate[0].ablate.controls[0]", ["'matched_magnitude'"]),
        ({"ablate": {"controls": ["count_matched"] * 2}}, "validate[0].ablate.controls", ["repeated"]),
        ({"ablate": {"nodes": "top"}}, "validate[0].ablate.nodes", ["'top_nodes'"]),
        ({"ablate": {"tolerance": -1}}, "validate[0].ablate.tolerance", [">= 0"]),
        ({"predicted_vs_actual": {"mode": "mean"}}, "validate[0].predicted_vs_actual.reference_prompts", ["needs"]),
        ({"patching": {}}, "validate[0].patching.corrupted", ["missing required key 'corrupted'"]),
        ({"patching": {"corrupted": "x", "metric": {"logit_diff": ["a"]}}}, "validate[0].patching.metric.logit_diff", ["two tokens"]),
        ({"patching": {"corrupted": "x", "metric": {"prob": "a"}}}, "validate[0].patching.metric", ["logit, logit_diff"]),
        ({"patching": {"corrupted": "x", "granularity": []}}, "validate[0].patching.granularity", ["at least 1"]),
        ({"faithfulness": {"mode": "zero", "reference_prompts": ["x"]}}, "validate[0].faithfulness.reference_prompts", ["mode: mean"]),
        ({"sign_regimes": {"echo_threshold": 2}}, "validate[0].sign_regimes.echo_threshold", ["<= 1"]),
        ({"ablation": {}}, "validate[0]", ["a validation check needs exactly one of the keys ablate"]),
    ],
)
def test_check_errors(item, location, words):
    ((loc, message),) = errors_of(base(validate=[item]))
    assert loc == location
    for word in words:
        assert word in message, message


def test_cross_section_rules():
    errors = errors_of(base(targets=[{"feature": {"layer": 1, "position": 0, "index": 0}}]))
    assert errors[0][0] == "targets[0].feature" and "needs transcoders" in errors[0][1]
    errors = errors_of(
        base(
            transcoders={"release": "r", "ids": {0: "a"}},
            graph={"mlp": {1: "transcoders"}},
            targets=[{"feature": {"layer": 2, "position": 0, "index": 0}}],
        )
    )
    assert [loc for loc, _ in errors] == ["graph.mlp", "targets[0].feature.layer"]


def test_spec_error_is_a_circuitgraph_error_with_one_line():
    with pytest.raises(CircuitGraphError) as info:
        load_spec(base(seed="x", prompt=""))
    text = str(info.value)
    assert "\n" not in text and text.startswith("invalid spec (2 problems): ")


# --- files ------------------------------------------------------------------------------


def test_malformed_yaml_has_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("format_version: 1\nmodel: {builtin: demo\nprompt: x\n")
    ((loc, message),) = errors_of(path)
    assert loc.startswith(f"{path}:") and loc.count(":") >= 2
    line, column = (int(x) for x in loc.rsplit(":", 2)[1:])
    assert line >= 2 and column >= 1
    assert message.startswith("malformed YAML")


def test_malformed_json_has_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"format_version": 1,\n "model": }')
    ((loc, message),) = errors_of(path)
    assert loc == f"{path}:2:11" and message.startswith("malformed JSON")


def test_duplicate_keys_are_errors(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("format_version: 1\nprompt: a\nprompt: b\n")
    ((loc, message),) = errors_of(path)
    assert "line 3" in loc and "duplicate key 'prompt'" in message
    path = tmp_path / "dup.json"
    path.write_text('{"prompt": "a", "prompt": "b"}')
    ((loc, message),) = errors_of(path)
    assert "duplicate key 'prompt'" in message


def test_missing_file_and_bad_suffix_and_non_mapping(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert errors_of(missing) == [(str(missing), "spec file not found")]
    txt = tmp_path / "spec.txt"
    txt.write_text("x")
    ((loc, message),) = errors_of(txt)
    assert loc == str(txt) and ".yaml, .yml or .json" in message
    listy = tmp_path / "list.yml"
    listy.write_text("- 1\n- 2\n")
    ((_, message),) = errors_of(listy)
    assert "mapping" in message and "list" in message
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    ((_, message),) = errors_of(empty)
    assert "empty file" in message
    with pytest.raises(SpecError):
        load_spec(42)  # type: ignore[arg-type]


def test_check_inputs(tmp_path):
    from circuitgraph.spec import check_inputs

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    spec = load_spec(
        base(
            model={"path": str(tmp_path / "m")},
            transcoders={"path": str(tmp_path / "tc")},
            targets=[{"direction": {"site": "resid_pre", "layer": 0, "file": str(tmp_path / "d.npy")}}],
        )
    )
    problems = check_inputs(spec)
    assert [loc for loc, _ in problems] == ["model.path", "transcoders.path", "targets[0].direction.file"]
    assert "model.safetensors" in problems[0][1]


# --- schema, public API, imports ------------------------------------------------------


def test_committed_schema_matches_the_models():
    committed = DEFAULT_SCHEMA_PATH.read_text(encoding="utf-8") if DEFAULT_SCHEMA_PATH.exists() else ""
    assert committed == spec_schema_text(), (
        "schemas/spec.schema.json is out of date; regenerate it with `python -m circuitgraph.spec.schema`"
    )
    assert spec_schema_text().endswith("}\n") and spec_schema_text() == spec_schema_text()


def test_schema_accepts_what_the_models_accept_and_rejects_unknown_keys():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(spec_json_schema())
    good = base(transcoders={"release": "r", "ids": {"0": "a"}}, queries=ALL_QUERIES, validate=ALL_CHECKS)
    good["targets"] = [{"top_logits": 5}, {"logit_diff": [" an", 3]}, {"logit": "x"}, {"top_logits": None}]
    good["graph"] = {"mlp": {"0": "neurons"}, "attention": "heads"}
    good["prune"] = {"node_threshold": 0.5}
    good["export"] = {"json": "g.json"}
    load_spec(copy.deepcopy(good))
    assert list(validator.iter_errors(good)) == []
    bad = base(graph={"foo": 1})
    assert [e.message for e in validator.iter_errors(bad)]
    for targets in ([{"logit": "a", "logit_diff": ["a", "b"]}], [{"position": 3}]):
        assert list(validator.iter_errors(base(targets=targets))), targets


def test_public_api_is_pinned():
    assert "load_spec" in spec_pkg.__all__ and "Spec" in spec_pkg.__all__
    assert len(spec_pkg.__all__) == len(set(spec_pkg.__all__))
    for name in spec_pkg.__all__:
        assert hasattr(spec_pkg, name), name


def test_node_kinds_agree_with_graph_nodes():
    nodes = pytest.importorskip("circuitgraph.graph.nodes")
    assert spec_pkg.NODE_KINDS == nodes.NODE_KINDS
    assert NodeFilter(id="feature/1/4/17").id[0] == str(nodes.NodeId.parse("feature/1/4/17"))


def test_import_is_light():
    code = (
        "import sys, warnings; warnings.simplefilter('error');"
        "import circuitgraph.spec, circuitgraph.cli.main;"
        "bad = [m for m in ('torch', 'transformer_lens', 'sae_lens', 'numpy') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_the_documented_example_is_valid(tmp_path):
    text = (REPO / "docs" / "spec.md").read_text(encoding="utf-8")
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    spec = load_spec(path)
    assert spec.model.source == "builtin" and [t.kind for t in spec.targets] == ["logit_diff", "top_logits"]
    assert [q.kind for q in spec.queries] == ["top_paths", "influence", "direct_logit_attribution", "logit_lens",
                                              "scores"]
    assert list(spec.export.outputs()) == ["json", "svg", "neuronpedia"]
