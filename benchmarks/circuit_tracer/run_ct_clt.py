#!/usr/bin/env python
"""Run circuit-tracer 0.5.0 with a CROSS-LAYER transcoder (or one of its per-layer transcoder_set
folders) on a local model and dump its graph.

Run it with the circuit-tracer virtualenv (see NOTES.md), not the project's python:

    .venv-ct/bin/python benchmarks/circuit_tracer/run_ct_clt.py --model BUNDLE/model \
        --clt CLT_DIR --tokens '[1, 5, 7]' --out OUT/graph.npz
    .venv-ct/bin/python benchmarks/circuit_tracer/run_ct_clt.py --jobs JOBS.json   # several

CLT_DIR is circuit-tracer's own CLT layout (config.yaml + W_enc_<i>.safetensors +
W_dec_<i>.safetensors); it is loaded with circuit-tracer's ``load_clt`` exactly as its hub
loader does after downloading (feature hooks from config.yaml), in float32 on the CPU.  The
model is built as in run_ct.py (``TransformerLensReplacementModel`` + local weights +
``_configure_replacement_model``), and ``attribute`` runs with its defaults (top logits, up
to 10, cumulative probability 0.95).  Nothing of circuit-tracer's maths is patched.

Output (.npz): adjacency_matrix (rows = targets, cols = sources), active_features (n, 3:
layer, pos, feature), selected_features, activation_values, logit_tokens,
logit_probabilities, input_tokens, n_layers, n_pos.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_ct import find_tokenizer_dir, load_hooked_config, read_tokens, write_standin_tokenizer


def build(model_dir: Path, clt_dir: Path, standin_dir: Path):
    import yaml
    from circuit_tracer.replacement_model.replacement_model_transformerlens import (
        TransformerLensReplacementModel,
    )
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    cfg, _ = load_hooked_config(model_dir)
    tok_dir = find_tokenizer_dir(model_dir) or write_standin_tokenizer(standin_dir, cfg.d_vocab)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    config = yaml.safe_load((clt_dir / "config.yaml").read_text())
    if config["model_kind"] == "transcoder_set":
        # circuit-tracer's per-layer sets, with its own loader (load_transcoder_set) on the local files;
        # the special loader is chosen by the files, as its hub loader does by repository name
        from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
        from safetensors import safe_open

        n = len(list(clt_dir.glob("layer_*.safetensors")))
        paths = {i: str(clt_dir / f"layer_{i}.safetensors") for i in range(n)}
        with safe_open(paths[0], framework="pt") as f:
            special = "gemma-scope-2" if "w_enc" in f.keys() else None
        clt = load_transcoder_set(paths, scan=config.get("scan", "local"),
                                  feature_input_hook=config["feature_input_hook"],
                                  feature_output_hook=config["feature_output_hook"], device=torch.device("cpu"),
                                  dtype=torch.float32, special_load_fn=special, lazy_encoder=False, lazy_decoder=False)
    else:
        clt = load_clt(str(clt_dir), feature_input_hook=config["feature_input_hook"],
                       feature_output_hook=config["feature_output_hook"], scan=config.get("scan", "local"),
                       device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=True)
    torch.manual_seed(0)
    model = TransformerLensReplacementModel(cfg, tokenizer=tokenizer)
    buffers = {n for n, _ in model.named_buffers()}
    # parameters only: TransformerLens rebuilds its buffers (masks, rotary tables) from the config
    state = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items() if k not in buffers}
    res = model.load_state_dict(state, strict=False)
    bad = [k for k in res.missing_keys if k not in buffers]
    if bad or res.unexpected_keys:
        raise ValueError(f"state dict mismatch: missing {bad}, unexpected {res.unexpected_keys}")
    model._configure_replacement_model(clt)
    model.cfg.tokenizer_name = str(tok_dir)
    model.eval()
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--clt", type=Path)
    ap.add_argument("--tokens")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--jobs", type=Path, help="a JSON list of {model, clt, tokens, out}: several runs, "
                    "one interpreter start")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-feature-nodes", type=int, default=None,
                    help="circuit-tracer's max_feature_nodes (default: its own, every active feature)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.jobs is not None:
        import json

        jobs = json.loads(args.jobs.read_text())
    else:
        jobs = [{"model": args.model, "clt": args.clt, "tokens": args.tokens, "out": args.out}]
    for job in jobs:
        run_one(Path(job["model"]), Path(job["clt"]), str(job["tokens"]), Path(job["out"]), args.batch_size,
                job.get("max_feature_nodes", args.max_feature_nodes))
    return 0


def run_one(model_dir: Path, clt_dir: Path, tokens_arg: str, out: Path, batch_size: int,
            max_feature_nodes: int | None = None) -> None:
    import json
    import time

    from circuit_tracer import attribute
    from run_ct import peak_rss_mb

    out.parent.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    model = build(model_dir, clt_dir, out.parent / (out.stem + "_tokenizer"))
    t1, c1 = time.perf_counter(), time.process_time()
    tokens = torch.tensor(read_tokens(tokens_arg), dtype=torch.long)
    graph = attribute(tokens, model, max_n_logits=10, desired_logit_prob=0.95, batch_size=batch_size,
                      max_feature_nodes=max_feature_nodes)
    t2, c2 = time.perf_counter(), time.process_time()
    # the timings of this run (load = model + dictionaries), next to OUT: OUT minus .npz + .json
    out.with_suffix(".json").write_text(json.dumps({
        "load_s": t1 - t0, "attribute_s": t2 - t1, "load_cpu_s": c1 - c0, "attribute_cpu_s": c2 - c1,
        "peak_rss_mb_after_attribute": peak_rss_mb(), "max_feature_nodes": max_feature_nodes,
        "batch_size": batch_size, "threads": torch.get_num_threads()}))
    np.savez(
        out,
        adjacency_matrix=graph.adjacency_matrix.float().cpu().numpy(),
        active_features=graph.active_features.cpu().numpy().astype(np.int64),
        selected_features=graph.selected_features.cpu().numpy().astype(np.int64),
        activation_values=graph.activation_values.float().cpu().numpy(),
        logit_tokens=graph.logit_token_ids.cpu().numpy().astype(np.int64),
        logit_probabilities=graph.logit_probabilities.float().cpu().numpy(),
        input_tokens=graph.input_tokens.cpu().numpy().astype(np.int64),
        n_layers=np.int64(model.cfg.n_layers),
        n_pos=np.int64(graph.n_pos),
    )


if __name__ == "__main__":
    raise SystemExit(main())
