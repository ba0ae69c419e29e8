"""Tiny random Hugging Face checkpoints of every supported family, made offline.

:func:`tiny_checkpoint` builds a transformers model of a family from its own config class
(``AutoConfig.for_model`` + ``AutoModelForCausalLM.from_config``), perturbs every weight (so
that no weight keeps its init's ones or zeros and each must reach the right place), and
:func:`save_checkpoint` writes it as ``save_pretrained`` does, with a small word-level tokenizer
(``tokenizers`` + ``PreTrainedTokenizerFast.save_pretrained``) at the folder's root.  Nothing is
downloaded.  :func:`circuitgraph.testing.synthetic.hf_cache_repo` puts such a folder into a local
hub cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TINY_CONFIGS", "tiny_checkpoint", "save_checkpoint", "save_tokenizer"]

_VOCAB = 96
_COMMON_LLAMA = dict(vocab_size=_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

#: model_type -> tiny config fields (2 layers, width 32, vocab 96), each exercising its family's
#: particulars (rope scaling, sliding windows, biases, partial rotary, NoPE layers, experts, ...)
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": dict(vocab_size=_VOCAB, n_embd=32, n_inner=64, n_layer=2, n_head=4, n_positions=64),
    "gpt_neox": dict(vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.5, use_parallel_residual=True,
                     tie_word_embeddings=False),
    "gptj": dict(vocab_size=_VOCAB, n_embd=32, n_inner=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=4,
                 tie_word_embeddings=False),
    "phi": dict(vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=64, partial_rotary_factor=0.5, tie_word_embeddings=False),
    "llama": dict(_COMMON_LLAMA, rms_norm_eps=1e-5, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8}),
    "mistral": dict(_COMMON_LLAMA, sliding_window=4, tie_word_embeddings=False),
    "qwen2": dict(_COMMON_LLAMA, tie_word_embeddings=True),
    "qwen3": dict(_COMMON_LLAMA, head_dim=8, tie_word_embeddings=True),
    "gemma2": dict(_COMMON_LLAMA, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3_text": dict(_COMMON_LLAMA, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
                        layer_types=["sliding_attention", "full_attention"],
                        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "gemma3": dict(text_config=dict(_COMMON_LLAMA, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
                                    layer_types=["sliding_attention", "full_attention"]),
                   vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      image_size=28, patch_size=14),
                   mm_tokens_per_image=4, image_token_index=95, boi_token_index=93, eoi_token_index=94),
    "olmo2": dict(_COMMON_LLAMA, num_key_value_heads=4, tie_word_embeddings=False),  # MHA, as OLMo-2 1B/7B/13B
    "phi3": dict(_COMMON_LLAMA, tie_word_embeddings=False),
    "smollm3": dict(_COMMON_LLAMA, no_rope_layers=[1, 0], tie_word_embeddings=True),
    # mixture of experts: 4 experts, top-2 (as circuitgraph.testing.hf_moe's checkpoints)
    "mixtral": dict(_COMMON_LLAMA, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=4, tie_word_embeddings=False),
    "olmoe": dict(_COMMON_LLAMA, intermediate_size=24, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                  tie_word_embeddings=False),  # q/k norms over the whole projection
    "qwen3_moe": dict(_COMMON_LLAMA, head_dim=16, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
    "gpt_oss": dict(_COMMON_LLAMA, head_dim=8, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=4, layer_types=["sliding_attention", "full_attention"], attention_bias=True,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False, "original_max_position_embeddings": 16,
                                     "rope_theta": 150000.0}, tie_word_embeddings=False),
}


def tiny_checkpoint(model_type: str, *, seed: int = 0, scale: float = 0.2, **overrides: Any) -> PreTrainedModel:
    """A transformers causal LM of ``model_type`` with tiny random weights (eval mode, float32)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    fields = dict(TINY_CONFIGS[model_type])
    if "text_config" in fields:  # a multimodal checkpoint: the ids belong to its text model
        fields["text_config"] = dict(fields["text_config"], **ids)
    else:
        fields.update(ids)
    fields.update(overrides)
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():  # not the init's ones/zeros: every weight must reach the right place
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def save_tokenizer(folder: str | Path, vocab: int) -> None:
    """A word-level tokenizer over ``t0 .. t{vocab-1}`` (whitespace-split), saved as transformers does."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, bos_token="t1", eos_token="t2", unk_token="t0").save_pretrained(
        str(folder))


def save_checkpoint(model: PreTrainedModel, folder: str | Path, *, tokenizer: bool = True,
                    max_shard_size: str | None = None) -> Path:
    """``model.save_pretrained(folder)`` (sharded with an index when ``max_shard_size`` is given)
    plus, by default, a tokenizer at the folder's root.  Returns the folder."""
    folder = Path(folder)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(folder), **kwargs)
    if tokenizer:
        config = getattr(model.config, "text_config", None) or model.config
        save_tokenizer(folder, config.vocab_size)
    return folder
