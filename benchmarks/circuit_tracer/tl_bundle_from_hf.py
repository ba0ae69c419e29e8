#!/usr/bin/env python
"""Write a Hugging Face Llama-family folder as the local model bundle run_ct.py / run_ct_clt.py read.

Run it with circuit-tracer's virtualenv (TransformerLens 3.2.1, transformers 4.57):

    .venv-ct/bin/python benchmarks/circuit_tracer/tl_bundle_from_hf.py --hf HF_FOLDER --out BUNDLE/model

circuit-tracer's own loader (``ReplacementModel.from_pretrained``) goes through TransformerLens's
``from_pretrained``, which accepts only TransformerLens's list of official model names (SmolLM2 is
not on it in 3.2.1) and reaches for the hub.  This does the same steps on a local folder with
TransformerLens's own pieces: its config conversion for a local folder (``convert_hf_model_config``;
its Llama branch leaves ``rotary_base`` at 10000, so the folder's ``rope_theta`` is set here) and its weight conversion
(``convert_llama_weights``), then writes ``config.json`` (HookedTransformerConfig fields),
``model.safetensors`` (the HookedTransformer state dict) and ``tokenizer/`` (the folder's
``tokenizer.json``, with a ``tokenizer_config.json`` transformers 4.57 reads).  No weight is
changed: the model's matrices are TransformerLens's views of the same float32 tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", type=Path, required=True, help="a Hugging Face Llama-family folder")
    ap.add_argument("--out", type=Path, required=True, help="the bundle's model/ folder to write")
    ap.add_argument("--n-ctx", type=int, default=2048, help="context of the TransformerLens model (its masks "
                    "and rotary tables are n_ctx long)")
    args = ap.parse_args(argv)
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import convert_hf_model_config
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import AutoModelForCausalLM

    d = convert_hf_model_config(str(args.hf))
    if d.get("original_architecture") != "LlamaForCausalLM":
        raise SystemExit(f"{args.hf}: {d.get('original_architecture')} is not a Llama-family model")
    d["n_ctx"] = min(int(d["n_ctx"]), args.n_ctx)
    # TransformerLens 3.2.1's Llama branch leaves rotary_base at its default 10000; SmolLM2 uses 100000
    # (config.json: rope_theta, or rope_parameters.rope_theta as transformers 5 writes it)
    hf_raw = json.loads((args.hf / "config.json").read_text())
    theta = hf_raw.get("rope_theta", (hf_raw.get("rope_parameters") or {}).get("rope_theta"))
    if theta is not None:
        d["rotary_base"] = float(theta)
    d.update(dtype=torch.float32, device="cpu", default_prepend_bos=True, tokenizer_prepends_bos=True)
    cfg = HookedTransformerConfig.from_dict(d)
    hf = AutoModelForCausalLM.from_pretrained(str(args.hf), dtype=torch.float32)
    state = {k: v.contiguous() for k, v in convert_llama_weights(hf, cfg).items()}
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(args.out / "model.safetensors"))
    raw = {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool, list, type(None)))}
    raw["dtype"] = "float32"
    raw.pop("device", None)
    (args.out / "config.json").write_text(json.dumps(raw, indent=1))
    tok = args.out / "tokenizer"
    tok.mkdir(exist_ok=True)
    shutil.copy(args.hf / "tokenizer.json", tok / "tokenizer.json")
    tc = json.loads((args.hf / "tokenizer_config.json").read_text())
    keep = {k: tc[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if k in tc}
    (tok / "tokenizer_config.json").write_text(json.dumps({**keep, "tokenizer_class": "PreTrainedTokenizerFast"}))
    print(json.dumps({"out": str(args.out), "rotary_base": cfg.rotary_base, "n_layers": cfg.n_layers,
                      "n_key_value_heads": cfg.n_key_value_heads, "eps": cfg.eps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
