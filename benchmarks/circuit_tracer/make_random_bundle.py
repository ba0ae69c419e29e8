#!/usr/bin/env python
"""Build a random model + random transcoders in the local bundle format (system python).

    python benchmarks/circuit_tracer/make_random_bundle.py --out OUT/bundles/rand-6L \
        [--n-layers 6 --d-model 256 --n-heads 8 --d-mlp 1024 --d-vocab 1000 --d-sae 4096 \
         --active-frac 0.02 --prompt-len 32 --style gpt2|llama --act relu|jumprelu --skip
         --n-calib-prompts 64 --calib-len N --no-fit-decoder]

Llama-3.2-1B size (about 6 GB of model and 8.6 GB of transcoders; about 7 GB peak memory,
13 minutes on 2 busy cores):

    python benchmarks/circuit_tracer/make_random_bundle.py --out OUT/bundles/llama-1b-size \
        --style llama --n-layers 16 --d-model 2048 --n-heads 32 --n-kv-heads 8 --d-head 64 \
        --d-mlp 8192 --d-vocab 128256 --n-ctx 256 --d-sae 32768 --active-frac 0.003 \
        --prompt-len 64 --n-calib-prompts 16 --calib-len 64 --no-fit-decoder

Memory stays bounded at that size: the model is written tensor by tensor (no second copy),
calibrated on the blocks' activations only (no unembedding) and dropped before the
transcoders, which are built, written and freed one layer at a time.

Writes (same layout as shared/fixtures/example-*):
  OUT/model/config.json        HookedTransformerConfig.to_dict(), dtype as a string
  OUT/model/model.safetensors  HookedTransformer state dict (without the mask / rotary buffers)
  OUT/model/tokenizer          a text file "../tokenizer" (pointer, as in the fixtures)
  OUT/tokenizer/               word-level tokenizer: 0 <pad>, 1 <bos>, 2 <eos>, i -> "t{i}"
  OUT/transcoders/layer_<i>/   sae-lens save_model() output (cfg.json, sae_weights.safetensors)
  OUT/prompt.json              {"tokens": [1, ...random...], "text": ...}
  OUT/bundle.json              arguments, config, per-layer transcoder stats

The model is TransformerLens's random init (seeded), with W_U scaled by --unembed-scale.
Transcoders read --tc-input-hook (default ln2.hook_normalized) and write --tc-output-hook
(default hook_mlp_out).  Encoders are random unit-norm directions; each feature's encoder
bias (and, for JumpReLU, threshold) is set from quantiles of its pre-activation over random
calibration prompts (positions > 0, as circuit-tracer ignores position 0) so that about
--active-frac of the features are active per token.  W_skip (with --skip) is the least-squares
map from transcoder input to MLP output; W_dec is a ridge fit of the rest on the calibration
activations (or random and rescaled with --no-fit-decoder).  All seeds are fixed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.float64: "F64", torch.int64: "I64", torch.int32: "I32"}


def save_safetensors_streaming(tensors: dict, path: Path) -> None:
    """Write a .safetensors file one tensor at a time, without the whole-file byte copy that
    ``safetensors.torch.save_file`` builds first (that copy doubles the peak at 6 GB of weights).
    Same format: an 8-byte little-endian header length, a JSON header, the raw tensor bytes."""
    header, offset = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_suffix(path.suffix + ".partial")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for t in tensors.values():
            t = t.detach().contiguous()
            if t.dtype == torch.bfloat16:
                f.write(t.view(torch.int16).numpy().data)
            else:
                f.write(t.numpy().data)
    tmp.replace(path)


def write_tokenizer(out_dir: Path, d_vocab: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = {0: "<pad>", 1: "<bos>", 2: "<eos>"}
    vocab = {specials.get(i, f"t{i}"): i for i in range(d_vocab)}
    tok_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, s in specials.items()
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<pad>"},
    }
    (out_dir / "tokenizer.json").write_text(json.dumps(tok_json, indent=2))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in specials.items()
        },
        "bos_token": "<bos>", "clean_up_tokenization_spaces": False, "eos_token": "<eos>",
        "model_max_length": 4096, "pad_token": "<pad>",
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<pad>",
    }, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<pad>",
    }, indent=2))


def cfg_kwargs_for(args) -> dict:
    d_head = args.d_head or args.d_model // args.n_heads
    kw = dict(
        n_layers=args.n_layers, d_model=args.d_model, n_heads=args.n_heads, d_head=d_head,
        d_mlp=args.d_mlp, d_vocab=args.d_vocab, n_ctx=args.n_ctx or max(64, args.prompt_len),
        seed=args.seed, model_name=f"random-{args.style}-{args.n_layers}L-s{args.seed}",
        dtype="float32", device="cpu",
    )
    if args.style == "gpt2":
        kw.update(act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard",
                  original_architecture="GPT2LMHeadModel")
    else:
        kw.update(act_fn="silu", normalization_type="RMS", final_rms=True,
                  positional_embedding_type="rotary", rotary_dim=d_head,
                  rotary_adjacent_pairs=False, gated_mlp=True,
                  n_key_value_heads=args.n_kv_heads or max(1, args.n_heads // 2), eps=1e-5,
                  original_architecture="LlamaForCausalLM")
    return kw


def random_tokens(gen: torch.Generator, n: int, length: int, d_vocab: int, bos: int = 1):
    toks = torch.randint(3, d_vocab, (n, length), generator=gen)
    toks[:, 0] = bos
    return toks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--style", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--d-head", type=int, default=None)
    ap.add_argument("--n-kv-heads", type=int, default=None, help="llama style (default heads/2)")
    ap.add_argument("--d-mlp", type=int, default=1024)
    ap.add_argument("--d-vocab", type=int, default=1000)
    ap.add_argument("--n-ctx", type=int, default=None)
    ap.add_argument("--d-sae", type=int, default=4096)
    ap.add_argument("--act", choices=["relu", "jumprelu"], default="relu")
    ap.add_argument("--skip", action="store_true", help="skip transcoders (W_skip)")
    ap.add_argument("--active-frac", type=float, default=0.02)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--n-calib-prompts", type=int, default=64)
    ap.add_argument("--unembed-scale", type=float, default=4.0)
    ap.add_argument("--tc-input-hook", default="ln2.hook_normalized")
    ap.add_argument("--tc-output-hook", default="hook_mlp_out")
    ap.add_argument("--no-fit-decoder", action="store_true")
    ap.add_argument("--ridge", type=float, default=1e-2)
    ap.add_argument("--calib-len", type=int, default=None,
                    help="calibration prompt length (default --prompt-len)")
    args = ap.parse_args(argv)

    from sae_lens.saes.transcoder import (
        JumpReLUSkipTranscoder,
        JumpReLUSkipTranscoderConfig,
        JumpReLUTranscoder,
        JumpReLUTranscoderConfig,
        SkipTranscoder,
        SkipTranscoderConfig,
        Transcoder,
        TranscoderConfig,
    )
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    out = args.out
    (out / "model").mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- model
    kw = cfg_kwargs_for(args)
    cfg = HookedTransformerConfig(**{**kw, "dtype": torch.float32})
    model = HookedTransformer(cfg)
    with torch.no_grad():
        model.unembed.W_U.mul_(args.unembed_scale)
    model.eval()
    buffers = {n for n, _ in model.named_buffers()}
    # the state dict shares the parameters' storage; written tensor by tensor (no second copy)
    sd = {k: v for k, v in model.state_dict().items() if k not in buffers}
    save_safetensors_streaming(sd, out / "model" / "model.safetensors")
    del sd
    cfg_dict = dict(cfg.to_dict())  # to_dict() may return the live __dict__
    cfg_dict["dtype"] = str(cfg.dtype).replace("torch.", "")
    cfg_dict = {k: (v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else str(v))
                for k, v in cfg_dict.items()}
    (out / "model" / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True))
    (out / "model" / "tokenizer").write_text("../tokenizer")
    write_tokenizer(out / "tokenizer", args.d_vocab)

    # ---------------------------------------------------------------- calibration data
    calib = random_tokens(gen, args.n_calib_prompts, args.calib_len or args.prompt_len,
                          args.d_vocab)
    in_names = [f"blocks.{l}.{args.tc_input_hook}" for l in range(args.n_layers)]
    out_names = [f"blocks.{l}.{args.tc_output_hook}" for l in range(args.n_layers)]
    with torch.no_grad():
        # the transcoders' inputs and outputs only: the blocks, not the (large) unembedding
        _, cache = model.run_with_cache(calib, names_filter=lambda n: n in in_names + out_names,
                                        stop_at_layer=args.n_layers)
    cache = {k: v for k, v in cache.items()}
    del model  # the model is on disk; the transcoders need only its cached activations

    # ---------------------------------------------------------------- transcoders
    if args.act == "relu":
        cfg_cls, tc_cls = ((SkipTranscoderConfig, SkipTranscoder) if args.skip
                           else (TranscoderConfig, Transcoder))
    else:
        cfg_cls, tc_cls = ((JumpReLUSkipTranscoderConfig, JumpReLUSkipTranscoder) if args.skip
                           else (JumpReLUTranscoderConfig, JumpReLUTranscoder))
    d = args.d_model
    k_hi = None
    stats = []
    for layer in range(args.n_layers):
        x = cache[in_names[layer]][:, 1:].reshape(-1, d)  # positions > 0
        y = cache[out_names[layer]][:, 1:].reshape(-1, d)
        n_rows = x.shape[0]
        W_enc = torch.randn(d, args.d_sae, generator=gen)
        W_enc /= W_enc.norm(dim=0, keepdim=True)
        pre0 = x @ W_enc
        # kthvalue(k) = k-th smallest; feature j active on ~active_frac of rows
        k_hi = max(1, min(n_rows, round(n_rows * (1 - args.active_frac))))
        q_hi = pre0.kthvalue(k_hi, dim=0).values
        threshold = None
        if args.act == "relu":
            b_enc = -q_hi
        else:
            k_lo = max(1, min(n_rows, round(n_rows * (1 - 2 * args.active_frac))))
            q_lo = pre0.kthvalue(k_lo, dim=0).values
            b_enc = -q_lo
            threshold = (q_hi - q_lo).clamp(min=1e-4)
        pre = pre0 + b_enc
        acts = torch.relu(pre) if threshold is None else pre * (pre > threshold)

        b_dec = y.mean(0)
        target = y - b_dec
        W_skip = None
        if args.skip:
            # least squares x -> target (with a tiny ridge), as W_skip @ x
            xtx = x.T @ x + args.ridge * torch.eye(d)
            W_skip = torch.linalg.solve(xtx, x.T @ target).T.contiguous()  # (d_out, d_in)
            target = target - x @ W_skip.T
        if args.no_fit_decoder:
            W_dec = torch.randn(args.d_sae, d, generator=gen) / d ** 0.5
            R = acts @ W_dec
            W_dec *= (R * target).sum() / (R * R).sum().clamp(min=1e-12)
        else:
            # ridge in dual form: W = acts^T (acts acts^T + lam I)^-1 target
            K = acts @ acts.T
            lam = args.ridge * K.diagonal().mean().clamp(min=1e-8)
            W_dec = acts.T @ torch.linalg.solve(K + lam * torch.eye(n_rows), target)
        recon = acts @ W_dec
        fvu = float(((target - recon) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())
        l0 = float((acts != 0).float().sum(1).mean())

        tc_cfg = cfg_cls.from_dict({
            "d_in": d, "d_sae": args.d_sae, "d_out": d, "dtype": "float32", "device": "cpu",
            "apply_b_dec_to_input": False, "normalize_activations": "none",
            "metadata": {
                "model_name": kw["model_name"],
                "hook_name": in_names[layer],
                "hook_name_out": out_names[layer],
                "prepend_bos": True,
                "context_size": kw["n_ctx"],
            },
        })
        tc = tc_cls(tc_cfg)
        state = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec}
        if threshold is not None:
            state["threshold"] = threshold
        if W_skip is not None:
            state["W_skip"] = W_skip
        tc.load_state_dict({k: v.float().contiguous() for k, v in state.items()}, strict=True)
        tc.save_model(out / "transcoders" / f"layer_{layer}")
        del tc, state, W_enc, W_dec, pre0, pre, acts, recon, W_skip  # one layer resident at a time
        stats.append({"layer": layer, "l0": l0, "active_frac": l0 / args.d_sae, "fvu": fvu,
                      "n_fit_rows": n_rows})

    # ---------------------------------------------------------------- prompt
    prompt = random_tokens(torch.Generator().manual_seed(args.seed + 2), 1, args.prompt_len,
                           args.d_vocab)[0].tolist()
    text = " ".join("<bos>" if t == 1 else f"t{t}" for t in prompt)
    (out / "prompt.json").write_text(json.dumps({"tokens": prompt, "text": text}))

    import sae_lens
    import transformer_lens
    (out / "bundle.json").write_text(json.dumps({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cfg_kwargs": kw,
        "transcoder_architecture": tc_cfg.architecture(),
        "transcoder_stats": stats,
        "special_ids": {"pad": 0, "bos": 1, "eos": 2},
        "torch": torch.__version__,
        "transformer_lens": getattr(transformer_lens, "__version__", None),
        "sae_lens": getattr(sae_lens, "__version__", None),
        "build_seconds": time.perf_counter() - t_start,
    }, indent=2))
    print(f"wrote {out} ({tc_cfg.architecture()}, mean L0 "
          f"{sum(s['l0'] for s in stats) / len(stats):.1f}, mean FVU "
          f"{sum(s['fvu'] for s in stats) / len(stats):.3f}, "
          f"{time.perf_counter() - t_start:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
