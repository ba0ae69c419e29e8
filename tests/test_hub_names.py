"""Hub names resolved offline against a locally built Hugging Face cache (the hub's exact
layout: blobs, snapshots, refs), with HF_HUB_OFFLINE=1."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import attribute
from circuitgraph.errors import LoadError
from circuitgraph.testing.synthetic import (
    hf_cache_repo,
    random_clt,
    random_layer_dictionary,
    save_clt,
    save_layer_dictionary,
    tiny_model,
)

TOKENS = [1, 5, 7, 9, 4, 3]


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    # huggingface_hub reads HF_HUB_OFFLINE when imported: make this process offline too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_clt_repository(tmp_path, offline_cache):
    from circuitgraph.dictionaries.hub import load_hf_dictionaries

    model = tiny_model(n_layers=3)
    d = save_clt(tmp_path / "clt", random_clt(model))
    hf_cache_repo(offline_cache, "example-org/clt-tiny", d)
    adapter = ModelAdapter(model)
    clt = load_hf_dictionaries("example-org/clt-tiny", adapter)
    assert clt.format == "circuit_tracer_clt" and clt.describe()["scan"] == "example-org/clt-tiny"
    g = attribute(adapter, TOKENS, clt)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5


def test_transcoder_set_listing_hf_files_in_another_repository(tmp_path, offline_cache):
    """circuit-tracer's published sets: a config repository whose config.yaml lists
    hf://ORG/REPO/layer_<i>.safetensors files of a weights repository."""
    from circuitgraph.pipeline.runner import run
    from circuitgraph.spec import load_spec
    from circuitgraph.testing.synthetic import save_bundle

    model = tiny_model(n_layers=2, norm="RMS", mlp="gated", positional="rotary")
    bundle = save_bundle(tmp_path / "b", model)
    weights = save_layer_dictionary(tmp_path / "w", random_layer_dictionary(model), "circuit_tracer_transcoder_set")
    (weights / "config.yaml").unlink()
    hf_cache_repo(offline_cache, "example-org/transcoders-weights", weights)
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out",
        "transcoders": [f"hf://example-org/transcoders-weights/layer_{i}.safetensors" for i in range(2)]}))
    hf_cache_repo(offline_cache, "example-org/transcoders", cfg_dir)
    spec = load_spec({"format_version": 1, "model": {"path": str(bundle / "model")},
                      "transcoders": {"hf": "example-org/transcoders"}, "prompt": {"tokens": TOKENS},
                      "targets": [{"top_logits": {"max_n": 2}}]})
    g = run(spec).graph
    meta = g.metadata["transcoders"]
    assert meta["format"] == "circuit_tracer_transcoder_set" and meta["scan"] == "example-org/transcoders"
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5


def test_missing_file_names_it_and_how_to_get_it(tmp_path, offline_cache):
    from circuitgraph.dictionaries.hub import load_hf_dictionaries

    model = tiny_model(n_layers=3)
    d = save_clt(tmp_path / "clt", random_clt(model))
    (d / "W_dec_1.safetensors").unlink()
    hf_cache_repo(offline_cache, "example-org/clt-partial", d)
    with pytest.raises(LoadError) as info:
        load_hf_dictionaries("example-org/clt-partial", ModelAdapter(model))
    msg = str(info.value)
    assert "W_dec_1.safetensors" in msg and "huggingface-cli download example-org/clt-partial" in msg
    assert "\n" not in msg
    with pytest.raises(LoadError, match="huggingface-cli download example-org/not-cached"):
        load_hf_dictionaries("example-org/not-cached", ModelAdapter(model))


# ----------------------------------------------------------------------------- model names
def _tiny_gpt2_repo(folder):
    """A GPT-2 of the real architecture (transformers' GPT2LMHeadModel, its config.json and
    model.safetensors) with tiny random weights and a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=4, vocab_size=64, n_positions=32, n_ctx=32))
    m.save_pretrained(folder)
    t = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, bos_token="t1", eos_token="t2", unk_token="t0").save_pretrained(folder)
    return m


_GPT2_CHECK = """
import json, sys, torch
import circuitgraph
from transformers import GPT2LMHeadModel
result = circuitgraph.run({"format_version": 1, "model": {"name": "gpt2"}, "prompt": {"tokens": [1, 5, 7, 9]},
                           "targets": [{"top_logits": {"max_n": 3}}]})
g = result.graph
ref = GPT2LMHeadModel.from_pretrained(sys.argv[1])
with torch.no_grad():
    ours = g.context.adapter.model(torch.tensor([[1, 5, 7, 9]]))[0, -1].log_softmax(-1)
    theirs = ref(torch.tensor([[1, 5, 7, 9]])).logits[0, -1].log_softmax(-1)
print(json.dumps({"completeness": g.metadata["completeness"]["max_relative_violation"],
                  "max_logprob_diff": float((ours - theirs).abs().max()), "n_layers": g.context.adapter.facts.n_layers}))
"""


def test_model_name_gpt2_from_the_offline_cache(tmp_path, offline_cache):
    """``model: {name: gpt2}`` with HF_HUB_OFFLINE=1 and a cache holding a tiny GPT-2 (a fresh
    process: huggingface_hub and transformers read the cache location when imported)."""
    import json
    import os
    import subprocess
    import sys

    _tiny_gpt2_repo(tmp_path / "gpt2")
    snap = None
    for repo in ("gpt2", "openai-community/gpt2"):
        snap = hf_cache_repo(offline_cache, repo, tmp_path / "gpt2")
    env = {**os.environ, "HF_HUB_CACHE": str(offline_cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", _GPT2_CHECK, str(snap)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["n_layers"] == 2 and r["completeness"] < 1e-5 and r["max_logprob_diff"] < 1e-4, r


def test_family_names_and_a_model_not_in_the_cache(offline_cache):
    from circuitgraph.adapters.loading import load_model_name, resolve_model_name

    assert resolve_model_name("llama-3.2-1b") == "meta-llama/Llama-3.2-1B"
    assert resolve_model_name("gemma-2-2b") == "google/gemma-2-2b"
    assert resolve_model_name("qwen3-0.6b") == "Qwen/Qwen3-0.6B"
    with pytest.raises(LoadError, match="Qwen/Qwen3-0.6B"):
        resolve_model_name("qwen3")
    with pytest.raises(LoadError) as info:
        load_model_name("llama-3.2-1b")
    assert "huggingface-cli download meta-llama/Llama-3.2-1B" in str(info.value)
    assert "\n" not in str(info.value)
