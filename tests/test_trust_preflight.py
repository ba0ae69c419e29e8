"""``circuitgraph validate`` checks what it can without the weights (issue 20): the spec
against the model's config.json (TransformerLens layout or a Hugging Face save_pretrained one),
the dictionaries' config files and the tokenizer; every problem at once, with its location."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from typer.testing import CliRunner

from circuitgraph.cli.main import app
from circuitgraph.pipeline.preflight import PREFLIGHT_CHECKS, Preflight, preflight, read_model_facts
from circuitgraph.spec import load_spec

FIXTURES = Path(__file__).resolve().parents[1] / "examples" / "fixtures"
GPT2 = FIXTURES / "example-gpt2"


def _spec(**extra) -> dict:
    spec = {"format_version": 1, "model": {"path": str(GPT2 / "model")},
            "transcoders": {"path": str(GPT2 / "transcoders")}, "prompt": {"tokens": [1, 5, 7, 9]},
            "targets": [{"logit": 5}]}
    spec.update(extra)
    return spec


def _validate(tmp_path: Path, spec: dict):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return CliRunner().invoke(app, ["validate", str(path)])


def test_a_good_spec_passes(tmp_path):
    res = _validate(tmp_path, _spec())
    assert res.exit_code == 0, res.output
    assert preflight(load_spec(_spec())) == []


def test_every_problem_the_files_show_at_once(tmp_path):
    spec = _spec(
        targets=[{"feature": {"layer": 7, "position": 1, "index": 0}},          # no layer 7
                 {"logit": 5, "position": 9},                                     # beyond a 4-token prompt
                 {"logit": 99}],                                                 # outside a 60-token vocabulary
        graph={"mlp": {0: "transcoders", 5: "neurons"}},                         # key beyond the last layer
        queries=[{"logit_lens": {"position": -6}}, {"qk": {"layer": 3, "head": 0}}],
        export={"diagram": {"labels": str(tmp_path / "missing.csv")}},
    )
    spec["targets"].append({"direction": {"site": "resid_post", "layer": 0, "file": str(tmp_path / "missing.npy")}})
    res = _validate(tmp_path, spec)
    assert res.exit_code == 2, res.output
    out = res.output
    assert out.count("\n") == 1, out
    for words in ["targets[0].feature.layer: layer 7 requested, the model has 2 layers (0-1",
                  "targets[1].position: position 9 is beyond the prompt of 4 tokens",
                  "targets[2].logit: token id 99 is outside the vocabulary (0..59)",
                  "graph.mlp: layer keys [5] are beyond the last layer",
                  "queries[0].logit_lens.position: position -6 is beyond the prompt",
                  "queries[1].qk.layer: layer 3 requested",
                  "export.diagram.labels: label file not found",
                  "targets[3].direction.file: direction file not found"]:
        assert words in out, (words, out)


def test_token_strings_the_tokenizer_cannot_make(tmp_path):
    spec = _spec(model={"builtin": "demo"}, transcoders={"builtin": "demo"}, prompt="mia saw the owl",
                 targets=[{"logit_diff": [" an", " aardvarkish"]}], queries=[{"congruence": {"tokens": " an owl"}}])
    res = _validate(tmp_path, spec)
    assert res.exit_code == 2, res.output
    assert "targets[0].logit_diff[1] ' aardvarkish'" in res.output
    assert "queries[0].congruence.tokens[0] ' an owl' is not a single token" in res.output
    assert "logit_diff[0]" not in res.output


def test_dictionary_of_another_model_and_layers_it_lacks(tmp_path):
    llama = FIXTURES / "example-llama" / "transcoders"
    res = _validate(tmp_path, _spec(transcoders={"path": str(llama)}))
    assert res.exit_code == 2 and "'tiny-llama-s101'" in res.output and "'tiny-gpt2-s100'" in res.output
    assert _validate(tmp_path, _spec(transcoders={"path": str(llama), "allow_model_mismatch": True})).exit_code == 0
    one = shutil.copytree(GPT2 / "transcoders", tmp_path / "one")
    shutil.rmtree(one / "layer_1")
    res = _validate(tmp_path, _spec(transcoders={"path": str(one)},
                                    targets=[{"feature": {"layer": 1, "position": 1, "index": 0}}]))
    assert res.exit_code == 2 and "layer 1 has no transcoder; the dictionary folder has layers [0]" in res.output


def test_hugging_face_config_layout(tmp_path):
    """A save_pretrained config.json (num_hidden_layers / n_layer, max_position_embeddings /
    n_positions, vocab_size) is read as well as the TransformerLens one."""
    from transformers import GPT2Config, LlamaConfig

    gpt = tmp_path / "gpt"
    GPT2Config(n_layer=3, n_positions=8, vocab_size=50, n_embd=16, n_head=2).save_pretrained(gpt)
    llama = tmp_path / "llama"
    LlamaConfig(num_hidden_layers=2, max_position_embeddings=6, vocab_size=40, hidden_size=16,
                intermediate_size=32, num_attention_heads=2).save_pretrained(llama)
    f = read_model_facts(gpt)
    assert (f.layout, f.n_layers, f.n_ctx, f.d_vocab, f.d_model, f.model_type) == ("hf", 3, 8, 50, 16, "gpt2")
    f = read_model_facts(llama)
    assert (f.layout, f.n_layers, f.n_ctx, f.d_vocab, f.d_model, f.model_type) == ("hf", 2, 6, 40, 16, "llama")
    tl = read_model_facts(GPT2 / "model")
    assert (tl.layout, tl.n_layers, tl.n_ctx, tl.d_vocab, tl.d_model) == ("transformer_lens", 2, 16, 60, 32)

    spec = load_spec({"format_version": 1, "model": {"path": str(llama)}, "prompt": {"tokens": list(range(1, 8))},
                      "targets": [{"logit": 45}, {"neuron": {"layer": 2, "position": 0, "index": 0}}],
                      "graph": {"attention": {3: "heads"}}})
    problems = dict(preflight(spec))
    assert "more than the model's context of 6" in problems["prompt"]
    assert "token id 45 is outside the vocabulary (0..39)" in problems["targets[0].logit"]
    assert "the model has 2 layers (0-1; config.json)" in problems["targets[1].neuron.layer"]
    assert "layer keys [3]" in problems["graph.attention"]


def test_checks_are_a_list_another_engineer_extends():
    seen = []

    def model_type_known(p: Preflight):
        seen.append(p.model.layout)
        return [("model.path", "model_type x is not supported")]

    spec = load_spec(_spec())
    assert preflight(spec, [*PREFLIGHT_CHECKS, model_type_known]) == [("model.path", "model_type x is not supported")]
    assert seen == ["transformer_lens"]


def test_builtin_demo_and_examples_pass(tmp_path):
    examples = Path(__file__).resolve().parents[1] / "examples"
    for name in ("demo.yaml", "demo_clt.yaml", "fixture_gpt2_transcoders.yaml", "fixture_llama_neurons.yaml",
                 "qk_demo.yaml", "demo_dataset.yaml"):
        assert preflight(load_spec(examples / name)) == [], name
