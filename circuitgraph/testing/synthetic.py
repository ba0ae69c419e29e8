"""Random models and transcoders built natively (no download), for tests, examples and benchmarks.

``tiny_model`` builds a TransformerLens ``HookedTransformer`` from a config in milliseconds with
non-trivial norm weights and biases (so constants and the P / gamma / beta bookkeeping are
exercised); ``random_transcoders`` builds sae-lens transcoders (ReLU, JumpReLU, skip) whose
encoder bias is set so that about ``active_frac`` of the features fire; ``save_bundle`` writes
both in the local directory format that ``model: {path: DIR}`` and ``transcoders: {path: DIR}``
read.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import yaml
from safetensors.torch import save_file

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

__all__ = ["hf_cache_repo", "random_layer_dictionary", "save_layer_dictionary", "tiny_config", "tiny_model", "random_transcoders", "save_bundle", "random_clt", "save_clt"]


def tiny_config(
    *,
    norm: Literal["LN", "RMS", "LNPre", "RMSPre"] | None = "LN",
    mlp: Literal["gelu", "relu", "gated"] = "gelu",
    positional: Literal["learned", "rotary"] = "learned",
    n_layers: int = 2,
    d_model: int = 16,
    n_heads: int = 4,
    d_head: int | None = None,
    n_kv_heads: int | None = None,
    d_mlp: int = 32,
    d_vocab: int = 23,
    n_ctx: int = 12,
    post_norms: bool = False,
    attn_soft_cap: float | None = None,
    logit_soft_cap: float | None = None,
    attn_only: bool = False,
    attention_dir: Literal["causal", "bidirectional"] = "causal",
    seed: int = 0,
) -> Any:
    """A HookedTransformerConfig for a tiny decoder of the given architecture (``norm=None``: no
    norms at all; ``attn_only``: no MLP layers; ``attention_dir="bidirectional"``: unmasked attention)."""
    from transformer_lens import HookedTransformerConfig

    kwargs: dict[str, Any] = dict(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_head or d_model // n_heads,
        d_mlp=d_mlp,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        act_fn={"gelu": "gelu_new", "relu": "relu", "gated": "silu"}[mlp],
        normalization_type=norm,
        gated_mlp=mlp == "gated",
        positional_embedding_type="standard" if positional == "learned" else "rotary",
        seed=seed,
        dtype=torch.float32,
        device="cpu",
        model_name=f"tiny-{norm}-{mlp}-{positional}",
        original_architecture="LlamaForCausalLM" if mlp == "gated" else "GPT2LMHeadModel",
    )
    if positional == "rotary":
        kwargs["rotary_dim"] = kwargs["d_head"]
    if n_kv_heads is not None:
        kwargs["n_key_value_heads"] = n_kv_heads
    if norm in ("RMS", "RMSPre"):
        kwargs["final_rms"] = True
    if post_norms:
        kwargs["use_normalization_before_and_after"] = True
    if attn_soft_cap is not None:
        kwargs["attn_scores_soft_cap"] = attn_soft_cap
    if logit_soft_cap is not None:
        kwargs["output_logits_soft_cap"] = logit_soft_cap
    if attn_only:
        kwargs["attn_only"] = True
    if attention_dir != "causal":
        kwargs["attention_dir"] = attention_dir
        kwargs["model_name"] += f"-{attention_dir}"
    if attn_only:
        kwargs["model_name"] += "-attn-only"
    return HookedTransformerConfig(**kwargs)


@torch.no_grad()
def tiny_model(cfg: HookedTransformerConfig | None = None, *, seed: int = 0, bias_scale: float = 0.1,
               **cfg_kwargs: Any) -> HookedTransformer:
    """A HookedTransformer with random weights, random norm gammas/betas and random biases."""
    from transformer_lens import HookedTransformer

    cfg = cfg if cfg is not None else tiny_config(seed=seed, **cfg_kwargs)
    with contextlib.redirect_stdout(io.StringIO()):
        model = HookedTransformer(cfg, move_to_device=False)
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith(".w") and p.ndim == 1:  # norm gamma
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".b") and p.ndim == 1:  # norm beta
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        elif "b_" in name.split(".")[-1] or name.split(".")[-1].startswith("_b_"):
            p.copy_(bias_scale * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) / max(p.shape[-2] if p.ndim >= 2 else 1, 1) ** 0.5)
    model.eval()
    return model


@torch.no_grad()
def random_transcoders(
    model: HookedTransformer,
    *,
    d_sae: int = 48,
    kind: Literal["relu", "jumprelu", "skip", "jumprelu_skip"] = "relu",
    input_site: Literal["normalized", "raw", "mlp_input"] = "normalized",
    active_frac: float = 0.15,
    layers: list[int] | None = None,
    seed: int = 0,
    n_fit_tokens: int = 256,
    output_hook: Literal["hook_mlp_out", "mlp.hook_out"] = "hook_mlp_out",
) -> dict[int, Any]:
    """sae-lens transcoders for every layer of ``model``; the encoder bias is set per feature so
    that about ``active_frac`` of features are active on random tokens.  ``input_site``:
    ``normalized`` reads ``ln2.hook_normalized``, ``raw`` ``hook_resid_mid``, ``mlp_input``
    ``mlp.hook_in`` (the MLP's input, ln2's output with its weight and bias); ``output_hook``
    (``hook_name_out`` relative to ``blocks.<l>``): ``mlp.hook_out`` is the MLP's output before a
    post-MLP norm (Gemma-2's ``ln2_post``).  An attention-only model gets none (it has no MLP); a
    norm-free model's transcoders read ``hook_resid_mid`` whatever ``input_site`` says (its ln2 is
    the identity and has no hooks)."""
    from sae_lens import JumpReLUTranscoder, SkipTranscoder, Transcoder
    from sae_lens.saes.transcoder import (
        JumpReLUSkipTranscoder,
        JumpReLUSkipTranscoderConfig,
        JumpReLUTranscoderConfig,
        SkipTranscoderConfig,
        TranscoderConfig,
    )

    classes = {
        "relu": (Transcoder, TranscoderConfig),
        "jumprelu": (JumpReLUTranscoder, JumpReLUTranscoderConfig),
        "skip": (SkipTranscoder, SkipTranscoderConfig),
        "jumprelu_skip": (JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig),
    }
    cls, cfg_cls = classes[kind]
    cfg = model.cfg
    if cfg.attn_only:
        return {}
    if cfg.normalization_type is None:
        input_site = "raw"
    gen = torch.Generator().manual_seed(seed + 1000)
    tokens = torch.randint(0, cfg.d_vocab, (max(1, n_fit_tokens // cfg.n_ctx), cfg.n_ctx), generator=gen)
    out = {}
    layers = list(range(cfg.n_layers)) if layers is None else layers
    for layer in layers:
        hook_in = {"normalized": f"blocks.{layer}.ln2.hook_normalized", "raw": f"blocks.{layer}.hook_resid_mid",
                   "mlp_input": f"blocks.{layer}.mlp.hook_in"}[input_site]
        hook_out = f"blocks.{layer}.{output_hook}"
        read = f"blocks.{layer}.ln2.hook_normalized" if input_site == "mlp_input" else hook_in
        _, cache = model.run_with_cache(tokens, names_filter=lambda n, read=read: n == read)
        x = cache[read].reshape(-1, cfg.d_model)
        if input_site == "mlp_input":
            ln2 = model.blocks[layer].ln2
            x = x * ln2.w if hasattr(ln2, "w") else x
            x = x + ln2.b if hasattr(ln2, "b") else x
        tc_cfg = cfg_cls.from_dict(
            {
                "d_in": cfg.d_model,
                "d_sae": d_sae,
                "d_out": cfg.d_model,
                "dtype": "float32",
                "device": "cpu",
                "apply_b_dec_to_input": False,
                "metadata": {"hook_name": hook_in, "hook_name_out": hook_out, "model_name": cfg.model_name},
            }
        )
        tc = cls(tc_cfg)
        W_enc = torch.randn(cfg.d_model, d_sae, generator=gen) / cfg.d_model**0.5
        pre = x @ W_enc
        q = torch.quantile(pre, 1 - active_frac, dim=0)
        tc.W_enc.copy_(W_enc)
        tc.b_enc.copy_(-q)
        tc.W_dec.copy_(torch.randn(d_sae, cfg.d_model, generator=gen) / d_sae**0.5)
        tc.b_dec.copy_(0.1 * torch.randn(cfg.d_model, generator=gen))
        if hasattr(tc, "threshold"):
            tc.threshold.copy_(0.05 * torch.rand(d_sae, generator=gen))
        if hasattr(tc, "W_skip"):
            tc.W_skip.copy_(0.1 * torch.randn(cfg.d_model, cfg.d_model, generator=gen) / cfg.d_model**0.5)
        tc.eval()
        out[layer] = tc
    return out


def save_bundle(directory: str | Path, model: HookedTransformer, transcoders: dict[int, Any] | None = None,
                prompt_tokens: list[int] | None = None) -> Path:
    """Write ``DIR/model/{config.json, model.safetensors}``, ``DIR/transcoders/layer_<i>/`` and
    ``DIR/prompt.json`` in the local format circuitgraph reads."""
    directory = Path(directory)
    (directory / "model").mkdir(parents=True, exist_ok=True)
    cfg = model.cfg.to_dict() if hasattr(model.cfg, "to_dict") else dict(vars(model.cfg))
    clean = {}
    for k, v in cfg.items():
        if isinstance(v, torch.dtype):
            v = str(v).replace("torch.", "")
        elif isinstance(v, torch.device):
            v = str(v)
        try:
            json.dumps(v)
        except TypeError:
            continue
        clean[k] = v
    (directory / "model" / "config.json").write_text(json.dumps(clean, indent=2, sort_keys=True))
    buffers = {name for name, _ in model.named_buffers()}
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in buffers}
    save_file(state, str(directory / "model" / "model.safetensors"))
    for layer, tc in (transcoders or {}).items():
        tc.save_model(str(directory / "transcoders" / f"layer_{layer}"))
    if prompt_tokens is not None:
        (directory / "prompt.json").write_text(json.dumps({"tokens": list(prompt_tokens)}))
    return directory


_CLT_INPUT_HOOKS = {"raw": "hook_resid_mid", "normalized": "ln2.hook_normalized", "mlp_input": "mlp.hook_in"}


@torch.no_grad()
def random_clt(
    model: HookedTransformer,
    *,
    d_transcoder: int = 32,
    activation: Literal["relu", "jump_relu", "topk"] = "relu",
    input_site: Literal["raw", "normalized", "mlp_input"] = "raw",
    skip: bool = False,
    active_frac: float = 0.15,
    topk: int = 4,
    seed: int = 0,
    n_fit_tokens: int = 256,
    output_hook: Literal["hook_mlp_out", "mlp.hook_out"] = "hook_mlp_out",
) -> dict[str, Any]:
    """A random cross-layer transcoder for ``model`` as circuit-tracer's tensors (the names and
    shapes :func:`save_clt` writes): per layer ``W_enc (d_transcoder, d_model)``,
    ``b_enc``, ``b_dec``, ``W_dec (d_transcoder, n_layers - l, d_model)``, ``threshold`` for
    JumpReLU, ``W_skip (d_model, d_model)`` with ``skip``.  The encoder bias is set per feature so
    that about ``active_frac`` of the features fire on random tokens."""
    cfg = model.cfg
    L, D = cfg.n_layers, cfg.d_model
    gen = torch.Generator().manual_seed(seed + 2000)
    tokens = torch.randint(0, cfg.d_vocab, (max(1, n_fit_tokens // cfg.n_ctx), cfg.n_ctx), generator=gen)
    hook = _CLT_INPUT_HOOKS[input_site]
    names = [f"blocks.{l}.{'hook_resid_mid' if input_site == 'raw' else 'ln2.hook_normalized'}" for l in range(L)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    layers = []
    for l in range(L):
        x = cache[names[l]].reshape(-1, D)
        if input_site == "mlp_input":  # the MLP's input: ln2's output with its weight and bias
            ln2 = model.blocks[l].ln2
            x = x * ln2.w if hasattr(ln2, "w") else x
            x = x + ln2.b if hasattr(ln2, "b") else x
        W_enc = torch.randn(d_transcoder, D, generator=gen) / D**0.5
        q = torch.quantile(x @ W_enc.T, 1 - active_frac, dim=0)
        t = {
            "W_enc": W_enc,
            "b_enc": -q,
            "b_dec": 0.1 * torch.randn(D, generator=gen),
            "W_dec": torch.randn(d_transcoder, L - l, D, generator=gen) / (d_transcoder * (L - l)) ** 0.5,
        }
        if activation == "jump_relu":
            t["threshold"] = 0.05 * torch.rand(d_transcoder, generator=gen)
        if skip:
            t["W_skip"] = 0.1 * torch.randn(D, D, generator=gen) / D**0.5
        layers.append(t)
    config: dict[str, Any] = {
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": hook,
        "feature_output_hook": output_hook,
        "model_name": cfg.model_name,
    }
    if activation == "topk":
        config["activation_function"] = "topk"
        config["topk"] = int(topk)
    return {"config": config, "layers": layers}


def save_clt(directory: str | Path, clt: dict[str, Any]) -> Path:
    """Write a CLT from :func:`random_clt` in circuit-tracer's format: ``config.yaml``,
    ``W_enc_<i>.safetensors`` (``W_enc_<i>``, ``b_enc_<i>``, ``b_dec_<i>``, ``threshold_<i>``,
    ``W_skip_<i>``) and ``W_dec_<i>.safetensors`` (``W_dec_<i>``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(clt["config"], sort_keys=False))
    for i, t in enumerate(clt["layers"]):
        enc = {f"{k}_{i}": t[k].contiguous() for k in ("W_enc", "b_enc", "b_dec", "threshold", "W_skip") if k in t}
        save_file(enc, str(directory / f"W_enc_{i}.safetensors"))
        save_file({f"W_dec_{i}": t["W_dec"].contiguous()}, str(directory / f"W_dec_{i}.safetensors"))
    return directory


@torch.no_grad()
def random_layer_dictionary(model: HookedTransformer, *, d_sae: int = 32,
                            activation: Literal["relu", "jump_relu", "topk"] = "relu",
                            skip: bool = False, active_frac: float = 0.15, seed: int = 0) -> list[dict[str, Any]]:
    """Random per-layer transcoders reading the MLP input (``gamma2 * P(x)/sigma2 + beta2``) and
    writing the MLP output, in circuitgraph's orientation: per layer ``W_enc (d_model, d_sae)``,
    ``b_enc``, ``W_dec (d_sae, d_model)``, ``b_dec``, [``threshold``], [``W_skip (d_model, d_model)``,
    skip = ``x @ W_skip.T``]; :func:`save_layer_dictionary` writes them in a published layout."""
    cfg = model.cfg
    D = cfg.d_model
    gen = torch.Generator().manual_seed(seed + 3000)
    tokens = torch.randint(0, cfg.d_vocab, (max(1, 256 // cfg.n_ctx), cfg.n_ctx), generator=gen)
    names = [f"blocks.{l}.ln2.hook_normalized" for l in range(cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    out = []
    for l in range(cfg.n_layers):
        ln2 = model.blocks[l].ln2
        x = cache[names[l]].reshape(-1, D)
        x = x * ln2.w if hasattr(ln2, "w") else x
        x = x + ln2.b if hasattr(ln2, "b") else x
        W_enc = torch.randn(D, d_sae, generator=gen) / D**0.5
        t = {"W_enc": W_enc, "b_enc": -torch.quantile(x @ W_enc, 1 - active_frac, dim=0),
             "W_dec": torch.randn(d_sae, D, generator=gen) / d_sae**0.5, "b_dec": 0.1 * torch.randn(D, generator=gen)}
        if activation == "jump_relu":
            t["threshold"] = 0.05 * torch.rand(d_sae, generator=gen)
        if activation == "topk":
            t["k"] = 4
        if skip:
            t["W_skip"] = 0.1 * torch.randn(D, D, generator=gen) / D**0.5
        out.append(t)
    return out


def save_layer_dictionary(directory: str | Path, layers: list[dict[str, Any]], format: str) -> Path:
    """Write :func:`random_layer_dictionary` in a published layout: ``circuit_tracer_transcoder_set``
    (``config.yaml`` + ``layer_<i>.safetensors``), ``gemmascope`` (``layer_<i>/width_16k/average_l0_10/
    params.npz``), ``gemmascope2`` (``layer_<i>/params.safetensors``) or ``eleuther_topk``
    (``layers.<i>.mlp/cfg.json`` + ``sae.safetensors``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    c = lambda t: t.contiguous()  # noqa: E731
    for i, t in enumerate(layers):
        if format == "circuit_tracer_transcoder_set":
            d = {"W_enc": c(t["W_enc"].T), "W_dec": c(t["W_dec"]), "b_enc": c(t["b_enc"]), "b_dec": c(t["b_dec"])}
            if "threshold" in t:
                d["activation_function.threshold"] = c(t["threshold"])
            if "W_skip" in t:
                d["W_skip"] = c(t["W_skip"])
            save_file(d, str(directory / f"layer_{i}.safetensors"))
        elif format == "gemmascope":
            sub = directory / f"layer_{i}" / "width_16k" / "average_l0_10"
            sub.mkdir(parents=True, exist_ok=True)
            np.savez(sub / "params.npz", **{k: t[k].numpy() for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")})
        elif format == "gemmascope2":
            sub = directory / f"layer_{i}"
            sub.mkdir(parents=True, exist_ok=True)
            d = {"w_enc": c(t["W_enc"]), "w_dec": c(t["W_dec"]), "b_enc": c(t["b_enc"]), "b_dec": c(t["b_dec"]),
                 "threshold": c(t["threshold"])}
            if "W_skip" in t:
                d["affine_skip_connection"] = c(t["W_skip"].T)
            save_file(d, str(sub / "params.safetensors"))
        elif format == "eleuther_topk":
            sub = directory / f"layers.{i}.mlp"
            sub.mkdir(parents=True, exist_ok=True)
            d = {"encoder.weight": c(t["W_enc"].T), "encoder.bias": c(t["b_enc"]), "W_dec": c(t["W_dec"]),
                 "b_dec": c(t["b_dec"])}
            if "W_skip" in t:
                d["W_skip"] = c(t["W_skip"])
            save_file(d, str(sub / "sae.safetensors"))
            (sub / "cfg.json").write_text(json.dumps({
                "activation": "topk", "expansion_factor": 32, "normalize_decoder": True,
                "num_latents": int(t["W_enc"].shape[1]), "k": int(t.get("k", 4)), "multi_topk": False,
                "skip_connection": "W_skip" in t, "transcode": True, "d_in": int(t["W_enc"].shape[0])}))
        else:
            raise ValueError(f"unknown format {format!r}")
    if format == "circuit_tracer_transcoder_set":
        (directory / "config.yaml").write_text(yaml.safe_dump({
            "model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in",
            "feature_output_hook": "mlp.hook_out"}, sort_keys=False))
    return directory


def hf_cache_repo(cache_dir: str | Path, repo_id: str, folder: str | Path, *, revision: str = "main") -> Path:
    """Put the files of ``folder`` into a Hugging Face hub cache at ``cache_dir`` exactly as a
    download would: ``models--ORG--REPO/blobs/<sha256>``, ``snapshots/<commit>/<path>`` symlinks
    to the blobs and ``refs/<revision>`` holding the commit.  Returns the snapshot folder."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    repo_dir = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    listing = hashlib.sha1()
    for p in files:
        listing.update(str(p.relative_to(folder)).encode() + hashlib.sha256(p.read_bytes()).digest())
    commit = listing.hexdigest()
    snap = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    for p in files:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        blob = repo_dir / "blobs" / digest
        if not blob.exists():
            blob.write_bytes(p.read_bytes())
        dst = snap / p.relative_to(folder)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists() or dst.is_symlink():
            dst.unlink()
        os.symlink(os.path.relpath(blob, dst.parent), dst)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / revision).write_text(commit)
    return snap
