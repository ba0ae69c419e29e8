"""The shipped demo model: loads from its folder and solves its task (no training here)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from circuitgraph.builtin import BUILTIN_MODELS, demo_path
from circuitgraph.builtin.demo_task import make_patching_pairs, make_prompts

DEMO = demo_path()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEMO / "model" / "tokenizer")


@pytest.fixture(scope="module")
def model():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = json.loads((DEMO / "model" / "config.json").read_text())
    cfg["dtype"] = getattr(torch, cfg["dtype"])
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    model.load_state_dict(load_file(DEMO / "model" / "model.safetensors"))
    return model.eval()


def article_ids(tokenizer) -> tuple[int, int]:
    (a,) = tokenizer.encode(" a", add_special_tokens=False)
    (an,) = tokenizer.encode(" an", add_special_tokens=False)
    return a, an


def test_registry_points_at_the_shipped_folder():
    assert BUILTIN_MODELS["demo"]() == DEMO
    for rel in ("model/config.json", "model/model.safetensors", "model/tokenizer/tokenizer.json",
                "prompt.json", "stats.json", "transcoders/layer_0/cfg.json"):
        assert (DEMO / rel).is_file(), rel


def test_tokenizer_articles_are_single_space_prefixed_tokens(tokenizer):
    a, an = article_ids(tokenizer)
    assert a != an
    assert tokenizer.decode([a]) == " a"
    assert tokenizer.decode([an]) == " an"
    assert tokenizer.encode("an", add_special_tokens=False) == [an]
    ids = tokenizer.encode("the kid saw owl", add_special_tokens=False)
    assert len(ids) == 4 and tokenizer.unk_token_id not in ids
    assert tokenizer.encode("the kid saw owl")[0] == tokenizer.bos_token_id == 1
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 2)


def test_demo_prompt_tokens_match_text_and_predict_an(model, tokenizer):
    prompt = json.loads((DEMO / "prompt.json").read_text())
    assert tokenizer.encode(prompt["text"]) == prompt["tokens"]  # <bos> prepended
    assert prompt["tokens"][0] == tokenizer.bos_token_id
    a, an = article_ids(tokenizer)
    logits = model(torch.tensor([prompt["tokens"]]))[0, -1]
    assert logits[an] > logits[a]
    assert logits.argmax() == an


def test_model_predicts_the_article_on_generated_prompts(model, tokenizer):
    a, an = article_ids(tokenizer)
    prompts = make_prompts(16, seed=12345)
    for text, answer in prompts:
        logits = model(torch.tensor([tokenizer.encode(text)]))[0, -1]
        want, other = (an, a) if answer == " an" else (a, an)
        assert logits[want] > logits[other], text


def test_patching_pairs_flip_the_prediction(model, tokenizer):
    a, an = article_ids(tokenizer)
    for pair in make_patching_pairs(4, seed=7):
        clean, corrupted = tokenizer.encode(pair.clean), tokenizer.encode(pair.corrupted)
        assert len(clean) == len(corrupted)
        assert sum(c != d for c, d in zip(clean, corrupted, strict=False)) == 1
        logits = model(torch.tensor([clean, corrupted]))[:, -1]
        diff = logits[:, an] - logits[:, a]
        assert diff[0] > 0 > diff[1]


@pytest.mark.parametrize("layer", [0, 1])
def test_transcoders_load_with_sae_lens(model, layer):
    from sae_lens import Transcoder

    tc = Transcoder.load_from_disk(DEMO / "transcoders" / f"layer_{layer}")
    assert tc.cfg.d_in == tc.cfg.d_out == model.cfg.d_model
    assert tc.cfg.metadata.hook_name == f"blocks.{layer}.ln2.hook_normalized"
    assert tc.cfg.metadata.hook_name_out == f"blocks.{layer}.hook_mlp_out"
    assert sorted(p.name for p in (DEMO / "transcoders" / f"layer_{layer}").iterdir()) == [
        "cfg.json",
        "sae_weights.safetensors",
    ]
