"""``model: {name: llama-3.2-1b | gemma-2-2b | qwen3-0.6b}`` loaded offline from a locally built
Hugging Face cache holding tiny random checkpoints of the real architectures (transformers'
classes: their config.json field names and safetensors tensor names). The TransformerLens
config is derived from the cached config.json (circuitgraph.adapters.hf_config), so the logits
must equal transformers' own forward pass and the graph must be complete."""

from __future__ import annotations

import pytest
import torch

from circuitgraph.testing.synthetic import hf_cache_repo

TOKENS = [1, 5, 7, 9, 4, 3, 11, 6]


def _tokenizer(folder, vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, bos_token="t1", eos_token="t2", unk_token="t0").save_pretrained(folder)


def _checkpoint(family):
    import transformers as tf

    common = dict(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if family == "llama":  # GQA, llama3 rope scaling, rope theta, tied embeddings (as Llama-3.2-1B)
        cfg = tf.LlamaConfig(**common, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                             rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
        cls = tf.LlamaForCausalLM
    elif family == "gemma2":  # soft caps, post norms, sliding window, query_pre_attn_scalar != head_dim
        cfg = tf.Gemma2Config(**common, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
                              attn_logit_softcapping=5.0, final_logit_softcapping=3.0, rms_norm_eps=1e-6)
        cls = tf.Gemma2ForCausalLM
    else:  # qwen3: head_dim != hidden/heads, q/k norms, tied embeddings
        cfg = tf.Qwen3Config(**common, head_dim=8, rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)
        cls = tf.Qwen3ForCausalLM
    torch.manual_seed(0)
    m = cls(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():  # not the init's ones/zeros: every weight must reach the right place
            p.add_(0.2 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("name,repo,family", [
    ("llama-3.2-1b", "meta-llama/Llama-3.2-1B", "llama"),
    ("gemma-2-2b", "google/gemma-2-2b", "gemma2"),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", "qwen3"),
])
def test_family_name_loads_tiny_checkpoint_offline(name, repo, family, tmp_path, monkeypatch):
    import circuitgraph

    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = _checkpoint(family)
    ref.save_pretrained(tmp_path / "ckpt")
    if family != "qwen3":  # the qwen3 snapshot has no tokenizer files: token-id prompts still work
        _tokenizer(tmp_path / "ckpt", 64)
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    hf_cache_repo(cache, repo, tmp_path / "ckpt")
    result = circuitgraph.run({"format_version": 1, "model": {"name": name}, "prompt": {"tokens": TOKENS},
                               "targets": [{"top_logits": {"max_n": 3}}]})
    g = result.graph
    model = g.context.adapter.model
    # the tokenizer is read from the snapshot's files by the tokenizers library (no code runs)
    assert (g.context.adapter.tokenizer is None) == (family == "qwen3")
    assert model.cfg.n_layers == 2 and model.cfg.d_model == 16 and model.cfg.original_architecture == type(ref).__name__
    with torch.no_grad():
        ours = model(torch.tensor([TOKENS]))[0]
        theirs = ref(torch.tensor([TOKENS])).logits[0]
    assert (ours - theirs).abs().max() < 1e-4 * max(1.0, theirs.abs().max())
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
