"""Tiny GGUF checkpoints written offline, for the tests of ``model: {path: FILE.gguf}``.

:func:`write_gguf` writes a transformers model of the Llama or Qwen2 family (a
:func:`~circuitgraph.testing.hf_checkpoints.tiny_checkpoint`) as llama.cpp's converter does:
its metadata keys, its tensor names, Llama's query/key rows permuted, a byte-level BPE tokenizer
(``tokenizer.ggml.model = gpt2``), and the matrices quantised (Q4_1 by default, with the
``gguf`` package's own quantiser) while norms stay float32.  transformers's GGUF loader reads
such a file back; what it dequantises is the reference the tests compare circuitgraph with.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from circuitgraph.testing.hf_checkpoints import tiny_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["GGUF_FAMILIES", "BYTE_TOKENS", "gguf_tiny_model", "write_gguf"]

#: families this writer knows (transformers's GGUF architecture name = the model_type here)
GGUF_FAMILIES = ("llama", "qwen2")
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("Ġ", "c")]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=False))
    return [chr(table[b]) for b in range(256)]


#: the tokenizer's vocabulary: special tokens, the 256 bytes, then one token per merge
BYTE_TOKENS: list[str] = _SPECIAL + _bytes_to_unicode() + ["".join(m) for m in _MERGES]


def gguf_tiny_model(family: str = "llama", *, seed: int = 0) -> PreTrainedModel:
    """A tiny random model of ``family`` whose sizes suit GGUF's 32-wide quantisation blocks."""
    extra = dict(vocab_size=len(BYTE_TOKENS), intermediate_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":  # the plain rope of a llama.cpp file (its writer here records no rope scaling)
        extra["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    return tiny_checkpoint(family, seed=seed, **extra)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's reordering of a Llama query/key projection's rows (rotary halves -> pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: PreTrainedModel, path: str | Path, *, quant: str = "Q4_1") -> Path:
    """Write ``model`` (a :func:`gguf_tiny_model`) as the GGUF file ``path``; matrices in ``quant``
    (a ``gguf.GGMLQuantizationType`` name: Q4_1, Q8_0, F16, F32), vectors in F32."""
    import gguf

    c = model.config
    family = c.model_type
    if family not in GGUF_FAMILIES:
        raise ValueError(f"write_gguf writes {', '.join(GGUF_FAMILIES)}, not {family}")
    path = Path(path)
    w = gguf.GGUFWriter(str(path), family)
    n_head, n_kv = c.num_attention_heads, c.num_key_value_heads
    w.add_name(f"tiny-{family}")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.hidden_size // n_head)
    qtype = gguf.GGMLQuantizationType[quant]
    w.add_file_type({"Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "F16": gguf.LlamaFileType.MOSTLY_F16, "F32": gguf.LlamaFileType.ALL_F32}[quant])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(BYTE_TOKENS)
    w.add_token_types([gguf.TokenType.CONTROL] * len(_SPECIAL) + [gguf.TokenType.NORMAL] * (len(BYTE_TOKENS) - 3))
    w.add_token_merges([f"{a} {b}" for a, b in _MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    def put(name: str, tensor: Any) -> None:
        data = tensor.detach().to("cpu").float().numpy()
        if data.ndim == 2 and qtype not in (gguf.GGMLQuantizationType.F32,):
            packed = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, packed, raw_dtype=qtype)
        else:
            w.add_tensor(name, data.astype(np.float32))

    sd = model.state_dict()
    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for l in range(c.num_hidden_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if family == "llama":
            q = type(q)(_permute(q.numpy(), n_head))
            k = type(k)(_permute(k.numpy(), n_kv))
        put(b + "attn_q.weight", q)
        put(b + "attn_k.weight", k)
        put(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        for proj in ("q", "k", "v"):  # Qwen2's biases
            key = p + f"self_attn.{proj}_proj.bias"
            if key in sd:
                put(b + f"attn_{proj}.bias", sd[key])
        put(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
