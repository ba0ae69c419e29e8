"""Tiny Hugging Face checkpoints of three families (from_config + save_pretrained, random weights
that are not the init's ones and zeros), shared by the neuron-selection and gradient tests."""

from __future__ import annotations

import torch


def hf_checkpoint(family: str, folder):
    """A tiny qwen2, gpt2 or gemma2 checkpoint saved in ``folder``; returns ``folder``."""
    import transformers as tf

    common = dict(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if family == "qwen2":  # q/k/v biases, GQA, SwiGLU
        cfg, cls = tf.Qwen2Config(**common, rms_norm_eps=1e-6), tf.Qwen2ForCausalLM
    elif family == "gpt2":  # LayerNorm with biases, GELU, learned positions
        cfg = tf.GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=4, n_positions=64, n_inner=24)
        cls = tf.GPT2LMHeadModel
    else:  # gemma2: post-norms, soft caps, GeGLU, a scaled embedding
        cfg = tf.Gemma2Config(**common, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
                              attn_logit_softcapping=5.0, final_logit_softcapping=3.0, rms_norm_eps=1e-6)
        cls = tf.Gemma2ForCausalLM
    torch.manual_seed(0)
    m = cls(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():  # not the init's ones/zeros
            p.add_(0.2 * torch.randn_like(p))
    m.save_pretrained(folder)
    return folder
