#!/usr/bin/env python
"""Run circuit-tracer 0.5.0 on a LOCAL model + transcoders (no hub) and dump its graph.

Run it with the circuit-tracer virtualenv, NOT the system python:

    bash scripts/install_circuit_tracer.sh   # creates .venv-ct
    .venv-ct/bin/python benchmarks/circuit_tracer/run_ct.py \
        --model BUNDLE/model --transcoders BUNDLE/transcoders \
        --tokens BUNDLE/prompt.json --out OUT/NAME/graph.npz \
        [--prune-out OUT/NAME/prune]
    .venv-ct/bin/python benchmarks/circuit_tracer/run_ct.py --batch CASES.json
        # CASES.json: a list of argument lists, run one after the other in one process

Local formats (see shared/fixtures/example-*):
  MODEL/config.json        HookedTransformerConfig fields, dtype as a string ("float32")
  MODEL/model.safetensors  HookedTransformer state dict (buffers may be absent)
  tokenizer                MODEL/tokenizer (a directory, or a file holding a relative path
                           to one, e.g. "../tokenizer"), else MODEL/../tokenizer; if none is
                           found a word-level stand-in ("<pad>", "<bos>", "<eos>", "t3", ...)
                           is written next to --out.
  TRANSCODERS/layer_<i>/cfg.json + sae_weights.safetensors   (sae-lens save format;
      architectures transcoder, jumprelu_transcoder, skip_transcoder,
      jumprelu_skip_transcoder; metadata.hook_name / hook_name_out give the hooks)

The model is built with circuit-tracer's own TransformerLens replacement-model class:
``TransformerLensReplacementModel(cfg, tokenizer=...)`` (a HookedTransformer subclass),
``load_state_dict`` with the local weights, then ``_configure_replacement_model`` --
i.e. exactly what ``ReplacementModel.from_config`` does, plus loading the weights.
Nothing of circuit-tracer's maths is patched.  Transcoders are built directly as
``SingleLayerTranscoder`` / ``TranscoderSet`` from the sae-lens weights.

Outputs:
  OUT (.npz)          adjacency_matrix (float32, rows = targets, cols = sources), active_features
                      (n,3: layer,pos,feature), selected_features, activation_values,
                      logit_tokens, logit_probabilities, logit_vectors, input_tokens, n_layers,
                      n_pos, n_features, d_vocab, plus error_vectors (n_layers,n_pos,d_model),
                      token_vectors (n_pos,d_model) and last_logits (d_vocab,) from
                      circuit-tracer's own setup_attribution.
  OUT minus .npz + .json   timings (wall seconds of attribute, peak RSS), arguments, versions,
                      warnings.
  --prune-out DIR     prune.npz (node_mask, edge_mask as [target,source] index pairs,
                      cumulative_scores), scores.json, the Neuronpedia graph JSON
                      (<slug>.json + graph-metadata.json) and timings.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path

# Never reach for a hub: everything is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from safetensors.torch import load_file

SUPPORTED_ARCHS = {
    "transcoder": ("relu", False),
    "skip_transcoder": ("relu", True),
    "jumprelu_transcoder": ("jumprelu", False),
    "jumprelu_skip_transcoder": ("jumprelu", True),
}


# --------------------------------------------------------------------------- utils
def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def log(msg: str) -> None:
    print(f"[run_ct] {msg}", file=sys.stderr, flush=True)


def strip_block_prefix(hook_name: str, layer: int) -> str:
    prefix = f"blocks.{layer}."
    if not hook_name.startswith(prefix):
        raise ValueError(
            f"transcoder hook {hook_name!r} for layer {layer} is not a per-block hook "
            f"('{prefix}...'); circuit-tracer needs block-relative hooks"
        )
    return hook_name[len(prefix):]


# --------------------------------------------------------------------------- model
def load_hooked_config(model_dir: Path):
    from transformer_lens import HookedTransformerConfig

    raw = json.loads((model_dir / "config.json").read_text())
    known = {f.name for f in dataclasses.fields(HookedTransformerConfig)}
    dropped = sorted(k for k in raw if k not in known)
    d = {k: v for k, v in raw.items() if k in known}
    if isinstance(d.get("dtype"), str):
        d["dtype"] = getattr(torch, d["dtype"].replace("torch.", ""))
    d["device"] = "cpu"
    cfg = HookedTransformerConfig.from_dict(d)
    return cfg, dropped


def find_tokenizer_dir(model_dir: Path) -> Path | None:
    cand = model_dir / "tokenizer"
    if cand.is_dir():
        return cand.resolve()
    if cand.is_file():  # a "symlink" stored as a text file holding a relative path
        target = (model_dir / cand.read_text().strip()).resolve()
        if target.is_dir():
            return target
    cand = model_dir.parent / "tokenizer"
    if cand.is_dir():
        return cand.resolve()
    return None


def write_standin_tokenizer(out_dir: Path, d_vocab: int) -> Path:
    """Word-level tokenizer of the fixtures' shape: 0 <pad>, 1 <bos>, 2 <eos>, i -> 't{i}'."""
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
            for i, s in specials.items() if i < d_vocab
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<pad>"},
    }
    (out_dir / "tokenizer.json").write_text(json.dumps(tok_json))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<pad>", "clean_up_tokenization_spaces": False,
        "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
    }, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<pad>",
    }, indent=2))
    return out_dir


# --------------------------------------------------------------------------- transcoders
def load_transcoder_set(tc_dir: Path, n_layers: int, dtype: torch.dtype, jumprelu_threshold: str,
                        notes: list[str]):
    from circuit_tracer.transcoder import SingleLayerTranscoder, TranscoderSet
    from circuit_tracer.transcoder.activation_functions import JumpReLU

    layer_dirs = {}
    for p in tc_dir.iterdir():
        if p.is_dir() and p.name.startswith("layer_"):
            layer_dirs[int(p.name[len("layer_"):])] = p
    if sorted(layer_dirs) != list(range(n_layers)):
        raise ValueError(
            f"{tc_dir}: need layer_0..layer_{n_layers - 1} (circuit-tracer's TranscoderSet needs "
            f"one transcoder per layer), found {sorted(layer_dirs)}"
        )

    transcoders = {}
    in_hooks, out_hooks, archs = set(), set(), set()
    for layer in range(n_layers):
        cfg = json.loads((layer_dirs[layer] / "cfg.json").read_text())
        arch = cfg.get("architecture", "transcoder")
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"layer {layer}: unsupported sae-lens architecture {arch!r}")
        act_kind, has_skip = SUPPORTED_ARCHS[arch]
        archs.add(arch)
        if cfg.get("normalize_activations", "none") not in (None, "none"):
            raise ValueError(f"layer {layer}: normalize_activations="
                             f"{cfg['normalize_activations']!r} has no circuit-tracer equivalent")
        if cfg.get("apply_b_dec_to_input", False):
            raise ValueError(f"layer {layer}: apply_b_dec_to_input=True is not supported")
        if cfg.get("reshape_activations", "none") not in (None, "none"):
            raise ValueError(f"layer {layer}: reshape_activations is not supported")
        meta = cfg.get("metadata", cfg)
        in_hooks.add(strip_block_prefix(meta["hook_name"], layer))
        out_hooks.add(strip_block_prefix(meta["hook_name_out"], layer))

        w = load_file(str(layer_dirs[layer] / "sae_weights.safetensors"))
        W_enc = w["W_enc"]  # sae-lens: (d_in, d_sae)
        W_dec = w["W_dec"]  # (d_sae, d_out)
        d_in, d_sae = W_enc.shape
        d_out = W_dec.shape[1]
        if d_in != d_out:
            raise ValueError(f"layer {layer}: d_in {d_in} != d_out {d_out}")

        if act_kind == "relu":
            act_fn = torch.nn.functional.relu
        else:
            thr = w["threshold"].to(dtype)
            if (thr < 0).any():
                n_neg = int((thr < 0).sum())
                if jumprelu_threshold == "clamp":
                    notes.append(
                        f"layer {layer}: {n_neg} negative JumpReLU thresholds clamped to 0 "
                        "(sae-lens relu(h)*(h>t) == circuit-tracer h*(h>max(t,0)))")
                    thr = thr.clamp(min=0)
                else:
                    notes.append(
                        f"layer {layer}: {n_neg} negative JumpReLU thresholds kept raw: "
                        "circuit-tracer h*(h>t) then differs from sae-lens relu(h)*(h>t)")
            # bandwidth only matters for the threshold's gradient (training); 0.1 as in
            # circuit-tracer's own loaders.
            act_fn = JumpReLU(thr, 0.1)

        with torch.device("meta"):
            tc = SingleLayerTranscoder(d_in, d_sae, act_fn, layer, skip_connection=has_skip,
                                       dtype=dtype)
        state = {
            "W_enc": W_enc.T.contiguous().to(dtype),  # circuit-tracer: (d_sae, d_model)
            "W_dec": W_dec.contiguous().to(dtype),
            "b_enc": w["b_enc"].to(dtype),
            "b_dec": w["b_dec"].to(dtype),
        }
        if act_kind == "jumprelu":
            state["activation_function.threshold"] = act_fn.threshold.data
        if has_skip:
            state["W_skip"] = w["W_skip"].contiguous().to(dtype)  # (d_out, d_in) in both
        tc.load_state_dict(state, assign=True)
        transcoders[layer] = tc

    if len(in_hooks) != 1 or len(out_hooks) != 1:
        raise ValueError(f"transcoders disagree on hooks: in {in_hooks}, out {out_hooks}")
    skip_flags = {SUPPORTED_ARCHS[a][1] for a in archs}
    if len(skip_flags) != 1:
        raise ValueError("mixed skip / non-skip transcoders: circuit-tracer reads the skip flag "
                         "from layer 0 only")
    tset = TranscoderSet(
        transcoders,
        feature_input_hook=in_hooks.pop(),
        feature_output_hook=out_hooks.pop(),
        scan=f"local-{tc_dir.resolve().parent.name}-{tc_dir.name}",
    )
    return tset, sorted(archs)


# --------------------------------------------------------------------------- build
def build_replacement_model(model_dir: Path, tc_dir: Path, tokenizer_dir: Path | None,
                            standin_dir: Path, jumprelu_threshold: str, notes: list[str]):
    from circuit_tracer.replacement_model.replacement_model_transformerlens import (
        TransformerLensReplacementModel,
    )
    from transformers import AutoTokenizer

    cfg, dropped = load_hooked_config(model_dir)
    if dropped:
        notes.append(f"config keys unknown to this TransformerLens, ignored: {dropped}")
    if tokenizer_dir is None:
        tokenizer_dir = write_standin_tokenizer(standin_dir, cfg.d_vocab)
        notes.append(f"no tokenizer found; wrote a word-level stand-in to {tokenizer_dir}")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    transcoders, archs = load_transcoder_set(tc_dir, cfg.n_layers, cfg.dtype, jumprelu_threshold,
                                             notes)

    # == ReplacementModel.from_config(cfg, transcoders, backend="transformerlens",
    #                                 tokenizer=tokenizer), plus loading the local weights
    #    before the MLP / unembed get wrapped (which renames their state-dict keys).
    torch.manual_seed(0)
    model = TransformerLensReplacementModel(cfg, tokenizer=tokenizer)
    sd = load_file(str(model_dir / "model.safetensors"))
    res = model.load_state_dict(sd, strict=False)
    buffers = {n for n, _ in model.named_buffers()}
    bad_missing = [k for k in res.missing_keys if k not in buffers]
    if bad_missing or res.unexpected_keys:
        raise ValueError(f"state dict mismatch: missing {bad_missing}, "
                         f"unexpected {res.unexpected_keys}")
    model._configure_replacement_model(transcoders)
    # create_graph_files re-loads the tokenizer with AutoTokenizer.from_pretrained(
    # graph.cfg.tokenizer_name): point it at the local directory.
    model.cfg.tokenizer_name = str(tokenizer_dir)
    model.eval()
    return model, archs, tokenizer_dir


def read_tokens(arg: str) -> list[int]:
    p = Path(arg)
    if p.exists():
        data = json.loads(p.read_text())
    else:
        data = json.loads(arg)
    if isinstance(data, dict):
        data = data["tokens"]
    return [int(t) for t in data]


def square_unembed_targets(model, tokens: torch.Tensor, max_n_logits: int,
                           desired_logit_prob: float):
    """Salient-logit selection with the CORRECT (d_model, d_vocab) orientation of W_U.

    Same rule as circuit-tracer's AttributionTargets._from_salient, but the demeaned
    unembedding columns are computed explicitly; handed to attribute() as custom targets.
    """
    from circuit_tracer.attribution.targets import CustomTarget

    with torch.no_grad():
        logits = model(tokens.unsqueeze(0))[0, -1]
    probs = torch.softmax(logits, dim=-1)
    top_p, top_idx = torch.topk(probs, max_n_logits)
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
    idx = top_idx[:cutoff]
    W_U = model.unembed.W_U  # (d_model, d_vocab)
    vecs = (W_U[:, idx] - W_U.mean(dim=-1, keepdim=True)).T
    targets = [CustomTarget(token_str=str(int(i)), prob=float(probs[i]), vec=vecs[k].detach())
               for k, i in enumerate(idx)]
    return targets, idx


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--transcoders", required=True, type=Path)
    ap.add_argument("--tokens", required=True,
                    help="JSON list of token ids, or a prompt.json ({'tokens': [...]})")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="tokenizer directory (default: found next to the model)")
    ap.add_argument("--max-n-logits", type=int, default=10)
    ap.add_argument("--desired-logit-prob", type=float, default=0.95)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--max-feature-nodes", type=int, default=None)
    ap.add_argument("--out", required=True, type=Path, help="output .npz")
    ap.add_argument("--compress", action="store_true", help="np.savez_compressed")
    ap.add_argument("--prune-out", type=Path, default=None)
    ap.add_argument("--node-threshold", type=float, default=0.8)
    ap.add_argument("--edge-threshold", type=float, default=0.98)
    ap.add_argument("--slug", default=None, help="Neuronpedia slug (default: out file stem)")
    ap.add_argument("--check", action="store_true",
                    help="verify every feature/logit row against an independent frozen "
                         "forward computation (see self_check)")
    ap.add_argument("--verbose", action="store_true",
                    help="circuit-tracer's own phase timings / progress on stderr")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--jumprelu-threshold", choices=["clamp", "raw"], default="clamp",
                    help="negative JumpReLU thresholds: clamp to 0 (= sae-lens semantics; exact) "
                         "or keep raw (circuit-tracer's h*(h>t))")
    ap.add_argument("--square-unembed", choices=["ct", "correct"], default="ct",
                    help="when d_vocab == d_model circuit-tracer misreads W_U as (d_vocab, "
                         "d_model): 'ct' keeps its behaviour, 'correct' passes correctly "
                         "oriented demeaned columns as custom targets")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    import circuit_tracer
    from circuit_tracer import attribute
    from circuit_tracer.attribution.targets import AttributionTargets

    notes: list[str] = []
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    info_path = out.with_suffix(".json")

    t0 = time.perf_counter()
    tok_dir = args.tokenizer if args.tokenizer else find_tokenizer_dir(args.model)
    model, archs, tok_dir = build_replacement_model(
        args.model, args.transcoders, tok_dir, out.parent / (out.stem + "_tokenizer"),
        args.jumprelu_threshold, notes)
    t_load = time.perf_counter() - t0
    cfg = model.cfg
    log(f"loaded {cfg.model_name}: {cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"d_vocab {cfg.d_vocab}, transcoders {archs} d={model.transcoders.d_transcoder}, "
        f"in={model.feature_input_hook} out={model.original_feature_output_hook} "
        f"skip={model.skip_transcoder} ({t_load:.2f}s)")

    tokens_list = read_tokens(args.tokens)
    tokens = torch.tensor(tokens_list, dtype=torch.long)
    if tokens_list[0] not in model.tokenizer.all_special_ids:
        notes.append("first token is not a special token: circuit-tracer PREPENDS one "
                     "(input_tokens will be one longer than --tokens)")

    attribution_targets = None
    square = cfg.d_vocab == cfg.d_model
    if square:
        notes.append("d_vocab == d_model: circuit-tracer's _compute_logit_vecs takes "
                     "W_U (d_model, d_vocab) for (d_vocab, d_model) -> logit rows use rows of "
                     f"W_U, not columns (--square-unembed={args.square_unembed})")
        if args.square_unembed == "correct":
            attribution_targets, square_idx = square_unembed_targets(
                model, tokens, args.max_n_logits, args.desired_logit_prob)

    rss_before = current_rss_mb()
    peak_before = peak_rss_mb()
    t0 = time.perf_counter()
    graph = attribute(
        tokens,
        model,
        attribution_targets=attribution_targets,
        max_n_logits=args.max_n_logits,
        desired_logit_prob=args.desired_logit_prob,
        batch_size=args.batch_size,
        max_feature_nodes=args.max_feature_nodes,
        verbose=args.verbose,
    )
    t_attr = time.perf_counter() - t0
    peak_after = peak_rss_mb()
    log(f"attribute: {t_attr:.2f}s, adjacency {tuple(graph.adjacency_matrix.shape)}, "
        f"{len(graph.active_features)} active features, peak RSS {peak_after:.0f} MiB")

    # Extras straight from circuit-tracer's own precomputation (same code path as attribute).
    input_ids = graph.input_tokens
    ctx = model.setup_attribution(input_ids)
    if attribution_targets is None:
        tg = AttributionTargets(
            attribution_targets=None, logits=ctx.logits[0, -1], unembed_proj=model.unembed_proj,
            tokenizer=model.tokenizer, max_n_logits=args.max_n_logits,
            desired_logit_prob=args.desired_logit_prob)
        logit_vectors = tg.logit_vectors
        logit_tokens = graph.logit_token_ids
        assert torch.equal(tg.token_ids.cpu(), logit_tokens.cpu())
    else:
        logit_vectors = torch.stack([t.vec for t in attribution_targets])
        logit_tokens = square_idx

    n_features = len(graph.selected_features)
    arrays = {
        "adjacency_matrix": graph.adjacency_matrix.float().cpu().numpy(),
        "active_features": graph.active_features.cpu().numpy().astype(np.int64),
        "selected_features": graph.selected_features.cpu().numpy().astype(np.int64),
        "activation_values": graph.activation_values.float().cpu().numpy(),
        "logit_tokens": logit_tokens.cpu().numpy().astype(np.int64),
        "logit_probabilities": graph.logit_probabilities.float().cpu().numpy(),
        "logit_vectors": logit_vectors.float().cpu().numpy(),
        "input_tokens": input_ids.cpu().numpy().astype(np.int64),
        "n_layers": np.int64(cfg.n_layers),
        "n_pos": np.int64(graph.n_pos),
        "n_features": np.int64(n_features),
        "d_vocab": np.int64(cfg.d_vocab),
        "error_vectors": ctx.error_vectors.float().cpu().numpy(),
        "token_vectors": ctx.token_vectors.float().cpu().numpy(),
        "last_logits": ctx.logits[0, -1].float().cpu().numpy(),
    }
    del ctx
    t0 = time.perf_counter()
    (np.savez_compressed if args.compress else np.savez)(out, **arrays)
    t_save = time.perf_counter() - t0

    info = {
        "model": str(args.model), "transcoders": str(args.transcoders),
        "tokenizer": str(tok_dir), "tokens": tokens_list,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "versions": {"circuit_tracer": circuit_tracer.__version__, "torch": torch.__version__,
                     "transformer_lens": _version("transformer-lens"),
                     "transformers": _version("transformers"), "python": sys.version.split()[0]},
        "threads": torch.get_num_threads(),
        "architectures": archs,
        "feature_input_hook": model.feature_input_hook,
        "feature_output_hook": model.original_feature_output_hook,
        "skip_transcoder": bool(model.skip_transcoder),
        "n_layers": cfg.n_layers, "n_pos": graph.n_pos, "d_model": cfg.d_model,
        "d_vocab": cfg.d_vocab, "d_transcoder": model.transcoders.d_transcoder,
        "n_active_features": len(graph.active_features), "n_selected_features": n_features,
        "n_logits": len(graph.logit_targets),
        "logit_tokens": arrays["logit_tokens"].tolist(),
        "logit_probability_sum": float(graph.logit_probabilities.sum()),
        "adjacency_shape": list(graph.adjacency_matrix.shape),
        "node_ordering": "[selected features (order of selected_features, i.e. ascending "
                         "active_features index = (layer,pos,feature) lexicographic), errors "
                         "(layer-major: layer*n_pos+pos), tokens (pos), logits (target order)]",
        "timing_s": {"load": t_load, "attribute": t_attr, "save_npz": t_save},
        "memory_mb": {"rss_before_attribute": rss_before,
                      "peak_rss_before_attribute": peak_before,
                      "peak_rss_after_attribute": peak_after},
        "notes": notes,
    }

    if args.check:
        t0 = time.perf_counter()
        info["check"] = self_check(args.model, model, graph, logit_vectors)
        info["check"]["seconds"] = time.perf_counter() - t0
        log(f"check: {info['check']}")

    if args.prune_out is not None:
        info["prune"] = run_prune(graph, args, cfg.n_layers)

    info["memory_mb"]["peak_rss_end"] = peak_rss_mb()
    info_path.write_text(json.dumps(info, indent=2))
    for n in notes:
        log("NOTE " + n)
    log(f"wrote {out} and {info_path}")
    return 0


def self_check(model_dir: Path, model, graph, logit_vectors: torch.Tensor) -> dict:
    """Check the adjacency against independent forward computations (no autograd).

    The "frozen" model: attention patterns and every norm's hook_scale (ln1 / ln2 /
    ln_final) fixed at their clean values; each MLP output replaced by
    b_dec + skip(x_in) (skip only for skip transcoders) at positions > 0 and by its clean
    value - clean skip + skip(x_in) at position 0 (where circuit-tracer zeroes features and
    errors); token embeddings (hook_embed) zeroed; positional embeddings and all biases kept.
    That is the constants-only run.  Adding back a group of circuit-tracer's source nodes
    (all token embeddings; the a_j W_dec_j of all active features of one layer; the error
    vectors of one layer) and subtracting the constants-only reader values must give the
    sum of the adjacency columns of that group, for every row; and the clean reader value
    minus the constants-only one must be the full row sum.
    Readers: feature (l,p,j) = W_enc[j] . x_in(l,p) (x_in = the transcoder's input hook,
    b_enc excluded); logit k = demeaned W_U column (logit_vectors[k]) . ln_final(x)[last].
    Also checks that activation_values equal the transcoder encoding of the clean x_in.
    """
    from functools import partial

    from transformer_lens import HookedTransformer

    cfg = model.cfg
    tset = model.transcoders
    in_hook = model.feature_input_hook
    out_hook = model.original_feature_output_hook
    ht = HookedTransformer(cfg, tokenizer=model.tokenizer)
    ht.load_state_dict(load_file(str(model_dir / "model.safetensors")), strict=False)
    ht.eval()
    toks = graph.input_tokens.unsqueeze(0)
    L = cfg.n_layers
    in_names = [f"blocks.{l}.{in_hook}" for l in range(L)]
    out_names = [f"blocks.{l}.{out_hook}" for l in range(L)]
    af = graph.active_features
    nf = len(graph.selected_features)
    feats = af[graph.selected_features]
    A = graph.adjacency_matrix
    n_pos = graph.n_pos
    n_logits = len(logit_vectors)

    def is_frozen(n: str) -> bool:
        return n.endswith("hook_pattern") or n.endswith("hook_scale")

    def lnf_out(normed):
        out = normed * ht.ln_final.w
        if hasattr(ht.ln_final, "b"):
            out = out + ht.ln_final.b
        return out

    with torch.no_grad():
        _, cache = ht.run_with_cache(
            toks, names_filter=lambda n: is_frozen(n) or n in in_names or n in out_names
            or n == "ln_final.hook_normalized")
        x_in_clean = torch.stack([cache[n][0] for n in in_names])  # (L, P, d)
        mlp_clean = torch.stack([cache[n][0] for n in out_names])
        acts = torch.stack([tset[l].encode(x_in_clean[l]) for l in range(L)])
        acts[:, 0] = 0  # circuit-tracer's zero_positions = slice(0, 1)
        act_err = (acts[af[:, 0], af[:, 1], af[:, 2]] - graph.activation_values).abs().max()
        n_active_ref = int((acts != 0).sum())
        recon = torch.stack([acts[l] @ tset[l].W_dec for l in range(L)])  # sum_j a_j W_dec_j
        err_clean = mlp_clean - recon - torch.stack([tset[l].b_dec for l in range(L)])[:, None]
        if model.skip_transcoder:
            err_clean = err_clean - torch.stack(
                [tset[l].compute_skip(x_in_clean[l]) for l in range(L)])
        err_clean[:, 0] = 0

        def run(tokens_on: bool, feat_layers=(), err_layers=()):
            x_in: dict[int, torch.Tensor] = {}
            lnf: list[torch.Tensor] = []

            def freeze(act, hook):
                return cache[hook.name]

            def embed(act, hook):
                return act if tokens_on else torch.zeros_like(act)

            def grab_in(act, hook, layer):
                x_in[layer] = act
                return act

            def mlp(act, hook, layer):
                tc = tset[layer]
                out = tc.b_dec.to(act.dtype).expand_as(act).clone()
                if model.skip_transcoder:
                    out = out + tc.compute_skip(x_in[layer])
                    out[:, 0] = (mlp_clean[layer, 0] - tc.compute_skip(x_in_clean[layer, 0])
                                 + tc.compute_skip(x_in[layer][:, 0]))
                else:
                    out[:, 0] = mlp_clean[layer, 0]
                if layer in feat_layers:
                    out = out + recon_sel[layer]
                if layer in err_layers:
                    out = out + err_clean[layer]
                return out

            def grab_lnf(act, hook):
                lnf.append(act)
                return act

            hooks = [(n, freeze) for n in cache.keys() if is_frozen(n)]
            hooks.append(("hook_embed", embed))
            hooks += [(in_names[l], partial(grab_in, layer=l)) for l in range(L)]
            hooks += [(out_names[l], partial(mlp, layer=l)) for l in range(L)]
            hooks.append(("ln_final.hook_normalized", grab_lnf))
            ht.run_with_hooks(toks, fwd_hooks=hooks)
            xs = torch.stack([x_in[l][0] for l in range(L)])
            return xs, lnf_out(lnf[0][0, -1])

        def readers(xs, lnf_last):
            vals = torch.zeros(nf + n_logits, dtype=xs.dtype)
            for l in range(L):
                m = feats[:, 0] == l
                if m.any():
                    W = tset[l].W_enc[feats[m, 2]]
                    vals[torch.nonzero(m).squeeze(1)] = (xs[l, feats[m, 1]] * W).sum(-1)
            vals[nf:] = logit_vectors.to(xs.dtype) @ lnf_last
            return vals

        rows = torch.cat([torch.arange(nf), torch.arange(A.shape[0] - n_logits, A.shape[0])])
        Ar = A[rows]
        clean_vals = readers(x_in_clean, lnf_out(cache["ln_final.hook_normalized"][0, -1]))
        const_vals = readers(*run(False))
        full_res = clean_vals - const_vals - Ar.sum(1)

        # decoder outputs of the SELECTED features only (all of them unless max_feature_nodes)
        sel_acts = torch.zeros_like(acts)
        sel_acts[feats[:, 0], feats[:, 1], feats[:, 2]] = acts[feats[:, 0], feats[:, 1],
                                                                feats[:, 2]]
        recon_sel = torch.stack([sel_acts[l] @ tset[l].W_dec for l in range(L)])

        groups = {"tokens": (run(True), slice(nf + L * n_pos, nf + (L + 1) * n_pos))}
        for l in range(L):
            cols = torch.nonzero(feats[:, 0] == l).squeeze(1)
            groups[f"features_L{l}"] = (run(False, feat_layers=(l,)), cols)
        for l in range(L):
            groups[f"errors_L{l}"] = (run(False, err_layers=(l,)),
                                      slice(nf + l * n_pos, nf + (l + 1) * n_pos))
        group_res = {}
        for name, (xs_lnf, cols) in groups.items():
            diff = readers(*xs_lnf) - const_vals - Ar[:, cols].sum(1)
            group_res[name] = float(diff.abs().max())

    return {
        "rows_checked": int(len(rows)),
        "max_abs_reader_value": float(clean_vals.abs().max()),
        # the full-row identity holds only when every active feature is a node
        "full_row_check_applicable": nf == len(af),
        "feature_rows_max_abs_residual": float(full_res[:nf].abs().max()) if nf else 0.0,
        "logit_rows_max_abs_residual": float(full_res[nf:].abs().max()),
        "group_max_abs_residual": group_res,
        "activation_values_max_abs_err": float(act_err),
        "n_active_features": len(af),
        "n_active_reference": n_active_ref,
    }


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def run_prune(graph, args, n_layers: int) -> dict:
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.utils.create_graph_files import create_graph_files

    d = args.prune_out
    d.mkdir(parents=True, exist_ok=True)
    timings = {}

    t0 = time.perf_counter()
    node_mask, edge_mask, cumulative_scores = prune_graph(
        graph, node_threshold=args.node_threshold, edge_threshold=args.edge_threshold)
    timings["prune_graph"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    replacement_score, completeness_score = compute_graph_scores(graph)
    timings["compute_graph_scores"] = time.perf_counter() - t0

    slug = args.slug or args.out.stem
    t0 = time.perf_counter()
    create_graph_files(graph, slug=slug, output_path=str(d), node_threshold=args.node_threshold,
                       edge_threshold=args.edge_threshold)
    timings["create_graph_files"] = time.perf_counter() - t0

    em = edge_mask.cpu().numpy()
    np.savez_compressed(
        d / "prune.npz",
        node_mask=node_mask.cpu().numpy(),
        edge_mask_indices=np.argwhere(em).astype(np.int64),  # [target(row), source(col)]
        edge_mask_shape=np.array(em.shape, dtype=np.int64),
        cumulative_scores=cumulative_scores.float().cpu().numpy(),
    )
    scores = {
        "replacement_score": replacement_score,
        "completeness_score": completeness_score,
        "node_threshold": args.node_threshold,
        "edge_threshold": args.edge_threshold,
        "n_nodes_kept": int(node_mask.sum()),
        "n_edges_kept": int(em.sum()),
        "neuronpedia_json": str(d / f"{slug}.json"),
    }
    (d / "scores.json").write_text(json.dumps(scores, indent=2))
    (d / "timings.json").write_text(json.dumps({"timing_s": timings,
                                                 "peak_rss_mb": peak_rss_mb()}, indent=2))
    log(f"prune: {timings}, replacement {replacement_score:.4f}, "
        f"completeness {completeness_score:.4f}, kept {scores['n_nodes_kept']} nodes / "
        f"{scores['n_edges_kept']} edges")
    return {**scores, "timing_s": timings}


def main_batch(path: Path) -> int:
    """``--batch CASES.json``: a JSON list of argument lists, each run as by :func:`main`, in one
    process (circuit-tracer and torch are imported once)."""
    cases = json.loads(Path(path).read_text())
    return max((main([str(a) for a in argv]) for argv in cases), default=0)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--batch":
        raise SystemExit(main_batch(Path(sys.argv[2])))
    raise SystemExit(main())
