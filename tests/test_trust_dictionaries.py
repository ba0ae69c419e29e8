"""Dictionaries must fit their model (issue 20): a dictionary whose files name another model,
or whose input width or hook layers do not fit, is an error naming both;
``transcoders: {allow_model_mismatch: true}`` accepts another name (never other shapes), and
the graph's metadata records that it did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import circuitgraph
from circuitgraph.adapters.dictionary_fit import model_mismatch, read_declared
from circuitgraph.errors import LoadError, ShapeMismatchError

FIXTURES = Path(__file__).resolve().parents[1] / "examples" / "fixtures"


def _spec(model: Path, transcoders: Path, **tc) -> dict:
    return {"format_version": 1, "model": {"path": str(model)}, "transcoders": {"path": str(transcoders), **tc},
            "prompt": {"tokens": [1, 5, 7, 9]}, "targets": [{"top_logits": {"max_n": 1}}], "prune": "none"}


def test_llama_transcoders_on_the_gpt2_model_are_refused_naming_both():
    with pytest.raises(LoadError) as info:
        circuitgraph.run(_spec(FIXTURES / "example-gpt2" / "model", FIXTURES / "example-llama" / "transcoders"))
    text = str(info.value)
    assert "'tiny-llama-s101'" in text and "'tiny-gpt2-s100'" in text and "allow_model_mismatch" in text
    assert "\n" not in text


def test_allow_model_mismatch_runs_and_the_metadata_says_so(tmp_path):
    spec = _spec(FIXTURES / "example-gpt2" / "model", FIXTURES / "example-llama" / "transcoders",
                 allow_model_mismatch=True)
    spec["export"] = {"json": str(tmp_path / "g.json")}
    res = circuitgraph.run(spec)
    note = res.graph.metadata["transcoders"]["source"]["model_mismatch"]
    assert "tiny-llama-s101" in note and "allow_model_mismatch" in note
    saved = json.loads((tmp_path / "g.json").read_text())
    assert "tiny-llama-s101" in saved["metadata"]["transcoders"]["source"]["model_mismatch"]


@pytest.mark.parametrize("bundle", ["example-gpt2", "example-llama"])
def test_own_transcoders_fit(bundle):
    res = circuitgraph.run(_spec(FIXTURES / bundle / "model", FIXTURES / bundle / "transcoders"))
    assert "model_mismatch" not in res.graph.metadata["transcoders"]["source"]


def test_a_dictionary_that_names_no_model_is_accepted(tmp_path):
    tcs = shutil.copytree(FIXTURES / "example-llama" / "transcoders", tmp_path / "tcs")
    for cfg in tcs.glob("layer_*/cfg.json"):
        data = json.loads(cfg.read_text())
        data["metadata"].pop("model_name")
        cfg.write_text(json.dumps(data))
    assert read_declared(tcs).model_names == {}
    res = circuitgraph.run(_spec(FIXTURES / "example-gpt2" / "model", tcs))
    assert "model_mismatch" not in res.graph.metadata["transcoders"]["source"]


def test_other_shapes_are_refused_even_when_a_mismatch_is_allowed(tmp_path):
    from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model

    wide = tiny_model(d_model=24, n_heads=4, n_layers=3)   # another width, one more layer
    save_bundle(tmp_path / "wide", wide, random_transcoders(wide))
    for cfg in (tmp_path / "wide" / "transcoders").glob("layer_*/cfg.json"):  # no name: only shapes decide
        data = json.loads(cfg.read_text())
        data["metadata"]["model_name"] = None
        cfg.write_text(json.dumps(data))
    with pytest.raises(ShapeMismatchError) as info:
        circuitgraph.run(_spec(FIXTURES / "example-gpt2" / "model", tmp_path / "wide" / "transcoders",
                               allow_model_mismatch=True))
    text = str(info.value)
    assert "d_in=24" in text and "d_model is 32" in text and "layer 2" in text and "2 layers (0-1)" in text


def test_cross_layer_transcoder_config_names_its_model(tmp_path):
    from circuitgraph.testing.synthetic import random_clt, save_clt, tiny_model

    model = tiny_model()
    clt = random_clt(model)
    clt["config"]["model_name"] = "someone-elses-model"
    folder = save_clt(tmp_path / "clt", clt)
    declared = read_declared(folder)
    assert declared.model_names == {"config.yaml": "someone-elses-model"}
    assert declared.d_in == {"W_enc_0.safetensors": model.cfg.d_model}
    msg = model_mismatch(declared, {"model.name": model.cfg.model_name}, "transcoders.path 'clt'")
    assert "someone-elses-model" in msg and model.cfg.model_name in msg


@pytest.mark.parametrize("dictionary, model, fits", [
    ("gpt2-small", {"model.name": "gpt2"}, True),                  # a TransformerLens alias
    ("openai-community/gpt2", {"model.name": "gpt2"}, True),       # an organisation prefix
    ("GPT2", {"the model config's model_name": "gpt2"}, True),     # case
    ("meta-llama/Llama-3.2-1B", {"model.name": "meta-llama/Llama-3.2-1B"}, True),
    ("pythia-70m", {"model.name": "gpt2"}, False),
    ("tiny-llama-s101", {"the model config's model_name": "tiny-gpt2-s100"}, False),
])
def test_name_rule(dictionary, model, fits):
    from circuitgraph.adapters.dictionary_fit import DeclaredDictionary

    got = model_mismatch(DeclaredDictionary(model_names={"cfg.json": dictionary}), model, "t")
    assert (got is None) == fits, got


def test_builtin_demo_dictionaries_fit_the_demo_model():
    for tc in ("demo", "demo_clt"):
        spec = circuitgraph.load_spec({"format_version": 1, "model": {"builtin": "demo"},
                                       "transcoders": {"builtin": tc}, "prompt": "mia saw the owl . later she wants",
                                       "targets": [{"logit_diff": [" an", " a"]}]})
        from circuitgraph.pipeline.inputs import load_inputs

        _, tcs = load_inputs(spec)
        assert "model_mismatch" not in tcs.source
