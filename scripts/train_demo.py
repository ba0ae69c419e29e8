"""Train the built-in demo model and its transcoders, and write the demo folder.

Run::

    python scripts/train_demo.py --out DIR   # default: the package's demo/

Steps (CPU, two threads, fixed seed, a few minutes):

1. Build a word-level tokenizer over the task vocabulary
   (:func:`circuitgraph.builtin.demo_task.vocabulary`). Every word carries the
   SentencePiece space marker (``"▁an"``), so ``" an"`` is one token and
   decodes back to ``" an"``, as with GPT-2's ``"Ġan"``. Ids 0-3 are
   ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``; a post-processor prepends
   ``<bos>`` when encoding with special tokens.
2. Train a 2-layer GPT-2-style :class:`~transformer_lens.HookedTransformer`
   (built natively from a config) with next-token cross-entropy on completed
   task sentences (``"mia likes owl . mia buys an owl ."``), with the article
   position weighted up.
3. Fit one ReLU transcoder per layer (sae-lens :class:`~sae_lens.Transcoder`)
   from ``blocks.{l}.ln2.hook_normalized`` to ``blocks.{l}.hook_mlp_out``:
   minimise ``||y - y_hat||^2 / Var(y) + lambda * sum_j f_j ||W_dec[j]||``.
4. Evaluate on held-out prompts: article accuracy, article cross-entropy of
   the model and of the replacement model (every MLP output replaced by its
   transcoder's reconstruction), each transcoder's fraction of variance
   explained and mean L0, plus mechanism checks: mean-ablating each MLP, the
   attention paid by the last position to the noun, and the transcoder
   features most selective for " an" and for " a" at the last position.
5. Save the folder in the fixture layout (model/config.json,
   model/model.safetensors, model/tokenizer/, transcoders/layer_<l>/,
   prompt.json, stats.json).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a busy machine spinning
# makes two threads ~10x slower than one. It must be set before torch loads,
# and does not change any result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from safetensors.torch import save_file
from torch import Tensor

from circuitgraph.builtin import demo_path
from circuitgraph.builtin.demo_task import (
    make_prompts,
    make_training_texts,
    noun_position,
    vocabulary,
)

SEED = 0
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPACE_MARKER = "\u2581"  # "▁", as in SentencePiece
DEMO_PROMPT = "mia saw the owl in the park . later she wants"
MODEL_NAME = "circuitgraph-demo-a-an"


@dataclass(frozen=True)
class TrainSettings:
    """Every knob of the reproduction; the defaults make the shipped files."""

    seed: int = SEED
    n_train: int = 40_000
    n_eval: int = 2_000
    steps: int = 1_500
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.01
    article_weight: float = 4.0
    d_sae: int = 512
    tc_rows: int = 120_000
    tc_steps: int = 3_000
    tc_batch_size: int = 512
    tc_lr: float = 2e-3
    tc_l1: float = 1e-2


# ---------------------------------------------------------------- tokenizer


def build_tokenizer(words: Sequence[str]):
    """A word-level ``tokenizers.Tokenizer`` whose tokens are ``"▁" + word``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in words:
        vocab[SPACE_MARKER + word] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.add_special_tokens(
        [AddedToken(tok, special=True, normalized=False) for tok in SPECIAL_TOKENS]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE_MARKER, prepend_scheme="always", split=True
    )
    # Replace (not Metaspace) so the first token keeps its space: " an" -> " an".
    tokenizer.decoder = decoders.Replace(SPACE_MARKER, " ")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", BOS_ID)]
    )
    return tokenizer


def save_tokenizer(tokenizer, out: Path, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json.

    The two config files are written by hand in the layout of the fixtures
    (``PreTrainedTokenizerFast``, ``add_bos_token``) rather than by
    ``save_pretrained``, whose output format changes across transformers
    versions.
    """
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    special = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIAL_TOKENS)
        },
        **special,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


# ---------------------------------------------------------------- data


def encode(tokenizer, texts: Sequence[str], n_ctx: int) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, " batch"]]:
    """Right-padded ``<bos>``-prefixed tokens and each row's length."""
    rows = [tokenizer.encode(t).ids for t in texts]
    for text, row in zip(texts, rows, strict=True):
        if UNK_ID in row or len(row) > n_ctx:
            raise ValueError(f"cannot encode {text!r}: unknown word or longer than n_ctx={n_ctx}")
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
    return tokens, torch.tensor([len(r) for r in rows])


def article_ids(tokenizer) -> tuple[int, int]:
    """Ids of ``" a"`` and ``" an"``."""
    a = tokenizer.encode(" a", add_special_tokens=False).ids
    an = tokenizer.encode(" an", add_special_tokens=False).ids
    assert len(a) == len(an) == 1, (a, an)
    return a[0], an[0]


# ---------------------------------------------------------------- model


def model_config(d_vocab: int, seed: int):
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(
        n_layers=2,
        d_model=64,
        n_heads=4,
        d_head=16,
        d_mlp=256,
        d_vocab=d_vocab,
        n_ctx=32,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel",
        model_name=MODEL_NAME,
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        default_prepend_bos=True,
    )


def train_model(
    model, tokens: Int[Tensor, "n pos"], lengths: Int[Tensor, " n"], s: TrainSettings, log: Callable[[str], None]
) -> list[float]:
    """Next-token training; the article target (third token from the end) counts ``article_weight`` times."""
    gen = torch.Generator().manual_seed(s.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.98))
    warmup = s.steps // 20
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(i, s.steps) / s.steps)),
    )
    positions = torch.arange(tokens.shape[1])
    losses = []
    model.train()
    for step in range(s.steps):
        idx = torch.randint(0, tokens.shape[0], (s.batch_size,), generator=gen)
        batch, length = tokens[idx], lengths[idx]
        width = int(length.max())
        batch = batch[:, :width]
        logits = model(batch)[:, :-1]
        targets = batch[:, 1:]
        pos = positions[: width - 1]
        valid = pos[None, :] < (length[:, None] - 1)
        weight = valid.float()
        # "... buys an owl ." : the article is 3 tokens before the end.
        weight[torch.arange(len(idx)), length - 4] *= s.article_weight
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        loss = (ce * weight.reshape(-1)).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % 500 == 0:
            log(f"  model step {step + 1}/{s.steps}: loss {sum(losses[-100:]) / 100:.3f}")
    model.eval()
    return losses


# ---------------------------------------------------------------- transcoders


def collect_mlp_io(
    model, tokens: Int[Tensor, "n pos"], lengths: Int[Tensor, " n"], layer: int, batch_size: int = 512
) -> tuple[Float[Tensor, "rows d_model"], Float[Tensor, "rows d_model"]]:
    """MLP input (``ln2.hook_normalized``) and output (``hook_mlp_out``) at every real position."""
    names = (f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out")
    xs, ys = [], []
    with torch.no_grad():
        for start in range(0, tokens.shape[0], batch_size):
            batch, length = tokens[start : start + batch_size], lengths[start : start + batch_size]
            _, cache = model.run_with_cache(batch, names_filter=lambda n: n in names)
            mask = torch.arange(batch.shape[1])[None, :] < length[:, None]
            xs.append(cache[names[0]][mask])
            ys.append(cache[names[1]][mask])
    return torch.cat(xs), torch.cat(ys)


def new_transcoder(layer: int, d_model: int, d_sae: int, n_ctx: int):
    from sae_lens import Transcoder
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.transcoder import TranscoderConfig

    metadata = SAEMetadata(
        model_name=MODEL_NAME,
        hook_name=f"blocks.{layer}.ln2.hook_normalized",
        hook_name_out=f"blocks.{layer}.hook_mlp_out",
        hook_head_index=None,
        hook_head_index_out=None,
        prepend_bos=True,
        context_size=n_ctx,
        dataset_path=None,
        neuronpedia_id=None,
        model_from_pretrained_kwargs={},
        seqpos_slice=[None],
        exclude_special_tokens=False,
    )
    cfg = TranscoderConfig(
        d_in=d_model,
        d_sae=d_sae,
        d_out=d_model,
        dtype="float32",
        device="cpu",
        apply_b_dec_to_input=False,
        normalize_activations="none",
        metadata=metadata,
    )
    return Transcoder(cfg)


def train_transcoder(
    tc,
    x: Float[Tensor, "rows d_model"],
    y: Float[Tensor, "rows d_model"],
    s: TrainSettings,
    seed: int,
    log: Callable[[str], None],
) -> None:
    """Fit ``tc`` in place: normalised MSE + L1 on decoder-norm-weighted activations.

    Decoder rows start at unit norm with the encoder as their transpose; the
    L1 coefficient ramps up over the first 10% of steps.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = torch.randn(tc.cfg.d_sae, tc.cfg.d_out, generator=gen)
        w /= w.norm(dim=1, keepdim=True)
        tc.W_dec.copy_(w)
        tc.W_enc.copy_(w.T * 0.5)
        tc.b_enc.zero_()
        tc.b_dec.copy_(y.mean(0))
    var = (y - y.mean(0)).pow(2).sum(1).mean()
    opt = torch.optim.Adam(tc.parameters(), lr=s.tc_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 if i < 0.8 * s.tc_steps else 0.2)
    for step in range(s.tc_steps):
        idx = torch.randint(0, x.shape[0], (s.tc_batch_size,), generator=gen)
        recon, acts = tc.forward_with_activations(x[idx])
        mse = (recon - y[idx]).pow(2).sum(1).mean() / var
        l1 = (acts * tc.W_dec.norm(dim=1)).sum(1).mean()
        l1_coeff = s.tc_l1 * min(1.0, step / (0.1 * s.tc_steps))
        loss = mse + l1_coeff * l1
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % 1000 == 0:
            l0 = float((acts > 0).sum(1).float().mean())
            log(f"  transcoder step {step + 1}/{s.tc_steps}: nmse {mse.item():.3f}, l0 {l0:.1f}")


def transcoder_metrics(tc, x: Float[Tensor, "rows d_model"], y: Float[Tensor, "rows d_model"]) -> dict[str, float]:
    """Fraction of variance explained, mean L0 and dead-feature count on (x, y)."""
    with torch.no_grad():
        recon, acts = tc.forward_with_activations(x)
    fvu = (recon - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    active = acts > 0
    return {
        "fve": float(1 - fvu),
        "l0": float(active.sum(1).float().mean()),
        "dead_features": int((~active.any(0)).sum()),
        "n_rows": int(x.shape[0]),
    }


def replacement_hooks(transcoders: Sequence) -> list[tuple[str, object]]:
    """Forward hooks that replace every layer's MLP output by its transcoder's output."""
    hooks: list[tuple[str, object]] = []
    for tc in transcoders:
        stash: dict[str, Tensor] = {}

        def read(x, hook, stash=stash):
            stash["x"] = x

        def write(out, hook, stash=stash, tc=tc):
            return tc(stash.pop("x")).to(out.dtype)

        hooks.append((tc.cfg.metadata.hook_name, read))
        hooks.append((tc.cfg.metadata.hook_name_out, write))
    return hooks


# ---------------------------------------------------------------- evaluation


def last_logits(model, tokens: Int[Tensor, "n pos"], lengths: Int[Tensor, " n"], fwd_hooks=()) -> Float[Tensor, "n d_vocab"]:
    """Logits at each row's last real position (the article prediction point)."""
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks))
    return logits[torch.arange(tokens.shape[0]), lengths - 1]


def article_metrics(logits: Float[Tensor, "n d_vocab"], answers: Int[Tensor, " n"], a_id: int, an_id: int) -> dict[str, float]:
    """Accuracy of ``logit(" an") > logit(" a")``, article cross-entropy, mean signed logit diff."""
    is_an = answers == an_id
    diff = logits[:, an_id] - logits[:, a_id]
    correct = torch.where(is_an, diff > 0, diff < 0)
    return {
        "accuracy": float(correct.float().mean()),
        "article_ce": float(F.cross_entropy(logits, answers)),
        "mean_correct_logit_diff": float(torch.where(is_an, diff, -diff).mean()),
    }


def next_token_ce(model, tokens: Int[Tensor, "n pos"], lengths: Int[Tensor, " n"], fwd_hooks=()) -> float:
    """Mean next-token cross-entropy over every real position of every row."""
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks))[:, :-1]
    valid = torch.arange(tokens.shape[1] - 1)[None, :] < (lengths[:, None] - 1)
    return float(F.cross_entropy(logits[valid], tokens[:, 1:][valid]))


def noun_attention(model, tokens, lengths, noun_pos: Int[Tensor, " n"]) -> list[list[float]]:
    """Mean attention from the last position to the noun, per layer and head."""
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    rows = torch.arange(tokens.shape[0])
    return [
        [round(float(v), 4) for v in cache[name][rows, :, lengths - 1, noun_pos].mean(0)] for name in names
    ]


def article_features(
    model, transcoders: Sequence, tokens, lengths, is_an: torch.Tensor, a_id: int, an_id: int, k: int = 3
) -> list[dict]:
    """Per layer, the ``k`` transcoder features at the last position most selective for " an" and for " a".

    Selectivity is the difference of mean activations between " an" and " a"
    prompts; ``virtual_weight`` is ``W_dec[j] . (W_U[:, an] - W_U[:, a])``
    (the direct logit-difference effect per unit activation, before ln_final).
    """
    names = [tc.cfg.metadata.hook_name for tc in transcoders]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    rows = torch.arange(tokens.shape[0])
    direction = model.W_U[:, an_id] - model.W_U[:, a_id]
    out = []
    for layer, tc in enumerate(transcoders):
        with torch.no_grad():
            acts = tc.encode(cache[tc.cfg.metadata.hook_name][rows, lengths - 1])
            virtual = tc.W_dec @ direction
        diff = acts[is_an].mean(0) - acts[~is_an].mean(0)

        def describe(j: int, acts: Tensor = acts, virtual: Tensor = virtual) -> dict:
            return {
                "feature": j,
                "mean_act_an": round(float(acts[is_an, j].mean()), 3),
                "mean_act_a": round(float(acts[~is_an, j].mean()), 3),
                "active_frac_an": round(float((acts[is_an, j] > 0).float().mean()), 3),
                "active_frac_a": round(float((acts[~is_an, j] > 0).float().mean()), 3),
                "virtual_weight": round(float(virtual[j]), 3),
            }

        out.append({
            "layer": layer,
            "an": [describe(int(j)) for j in diff.topk(k).indices],
            "a": [describe(int(j)) for j in (-diff).topk(k).indices],
        })
    return out


def mean_ablation_hook(mean: Float[Tensor, " d_model"]):
    def hook(out, hook):
        return mean.expand_as(out).clone()

    return hook


# ---------------------------------------------------------------- saving


def save_model(model, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(model.cfg.to_dict())  # to_dict() returns the live __dict__
    cfg["dtype"] = str(cfg["dtype"]).removeprefix("torch.")
    cfg = {k: cfg[k] for k in sorted(cfg)}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600


# ---------------------------------------------------------------- main


@contextlib.contextmanager
def reproducible(seed: int, threads: int = 2):
    """Seeded, deterministic torch on ``threads`` CPU threads; restores the previous settings.

    The thread count is part of the recipe: results are bit-identical for a
    given count (and torch version), not across counts.
    """
    prev_threads, prev_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)


def run(out: Path, s: TrainSettings = TrainSettings(), log: Callable[[str], None] | None = None) -> dict:
    """Train everything and write the demo folder to ``out``; returns the stats.

    ``log`` receives progress lines (``main`` passes ``print``).
    """
    with reproducible(s.seed):
        return _run(out, s, log or (lambda _msg: None))


def _run(out: Path, s: TrainSettings, log: Callable[[str], None]) -> dict:
    import sae_lens
    import transformer_lens
    from transformer_lens import HookedTransformer

    t0 = time.perf_counter()

    tokenizer = build_tokenizer(vocabulary())
    a_id, an_id = article_ids(tokenizer)
    cfg = model_config(tokenizer.get_vocab_size(), s.seed)
    n_ctx = cfg.n_ctx

    train = make_training_texts(s.n_train, seed=s.seed + 1)
    # Held-out prompts: a different seed, minus any prompt seen in training
    # (a training text is its prompt followed by "<article> <noun> .").
    seen = {t.text.rsplit(" ", 3)[0] for t in train}
    held_out = [p for p in make_prompts(s.n_eval * 2, seed=s.seed + 2) if p.text not in seen][: s.n_eval]
    tr_tokens, tr_lengths = encode(tokenizer, [p.text for p in train], n_ctx)
    ev_tokens, ev_lengths = encode(tokenizer, [p.text for p in held_out], n_ctx)
    ev_answers = torch.tensor([an_id if p.answer == " an" else a_id for p in held_out])

    model = HookedTransformer(cfg)
    t_model = time.perf_counter()
    losses = train_model(model, tr_tokens, tr_lengths, s, log)
    t_model = time.perf_counter() - t_model
    model_metrics = article_metrics(last_logits(model, ev_tokens, ev_lengths), ev_answers, a_id, an_id)
    log(f"model: {t_model:.0f}s, final loss {sum(losses[-50:]) / 50:.3f}, held-out {model_metrics}")

    # Transcoders: fit on training-sentence activations, score on held-out prompts.
    t_tc = time.perf_counter()
    fit_sentences = s.tc_rows // 10  # ~16 tokens per sentence: enough rows, then truncated
    transcoders, tc_stats = [], []
    for layer in range(cfg.n_layers):
        x, y = collect_mlp_io(model, tr_tokens[:fit_sentences], tr_lengths[:fit_sentences], layer)
        x, y = x[: s.tc_rows], y[: s.tc_rows]
        tc = new_transcoder(layer, cfg.d_model, s.d_sae, n_ctx)
        train_transcoder(tc, x, y, s, seed=s.seed + 10 + layer, log=log)
        tc.eval()
        ex, ey = collect_mlp_io(model, ev_tokens, ev_lengths, layer)
        stats = {"layer": layer, **transcoder_metrics(tc, ex, ey)}
        log(f"transcoder {layer}: {stats}")
        transcoders.append(tc)
        tc_stats.append(stats)
    t_tc = time.perf_counter() - t_tc

    replaced = article_metrics(
        last_logits(model, ev_tokens, ev_lengths, replacement_hooks(transcoders)), ev_answers, a_id, an_id
    )
    # The article loss is near zero for both; the loss on whole completed
    # sentences shows the transcoders' fidelity where the model is uncertain.
    full_texts = [f"{p.text}{p.answer} {p.text.split()[noun_position(p.text)]} ." for p in held_out]
    fu_tokens, fu_lengths = encode(tokenizer, full_texts, n_ctx)
    model_metrics["next_token_ce"] = next_token_ce(model, fu_tokens, fu_lengths)
    replaced["next_token_ce"] = next_token_ce(model, fu_tokens, fu_lengths, replacement_hooks(transcoders))
    log(f"replacement model: {replaced}")

    # Mechanism checks: which MLP matters, and does the last position attend to the noun?
    ablations = {}
    for layer in range(cfg.n_layers):
        _, y = collect_mlp_io(model, tr_tokens[:2000], tr_lengths[:2000], layer)
        hook = (f"blocks.{layer}.hook_mlp_out", mean_ablation_hook(y.mean(0)))
        ablations[f"mlp{layer}_mean_ablated"] = article_metrics(
            last_logits(model, ev_tokens, ev_lengths, [hook]), ev_answers, a_id, an_id
        )
    noun_pos = torch.tensor([noun_position(p.text) for p in held_out]) + 1  # +1 for <bos>
    attention = noun_attention(model, ev_tokens, ev_lengths, noun_pos)
    log(f"ablations: {ablations}\nattention to the noun (layer x head): {attention}")
    is_an = ev_answers == an_id
    features = article_features(model, transcoders, ev_tokens, ev_lengths, is_an, a_id, an_id)

    out.mkdir(parents=True, exist_ok=True)
    save_model(model, out / "model")
    save_tokenizer(tokenizer, out / "model" / "tokenizer", model_max_length=n_ctx)
    for layer, tc in enumerate(transcoders):
        weights, _ = tc.save_model(out / "transcoders" / f"layer_{layer}")
        weights.chmod(0o644)
    prompt_ids = tokenizer.encode(DEMO_PROMPT).ids
    prompt_logits = last_logits(model, torch.tensor([prompt_ids]), torch.tensor([len(prompt_ids)]))[0]
    # As in a spec: the text without <bos>, the tokens with it (prepend_bos).
    prompt = {"text": DEMO_PROMPT, "tokens": prompt_ids}
    (out / "prompt.json").write_text(json.dumps(prompt) + "\n")

    stats = {
        "task": "article agreement (a/an) with the noun mentioned earlier; see docs/demo.md",
        "seed": s.seed,
        "settings": dataclasses.asdict(s),
        "token_ids": {"a": a_id, "an": an_id, "pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID},
        "d_vocab": cfg.d_vocab,
        "n_params": sum(p.numel() for p in model.parameters()),
        "n_held_out_prompts": len(held_out),
        "model": {**model_metrics, "final_train_loss": sum(losses[-50:]) / 50},
        "replacement_model": replaced,
        "transcoders": tc_stats,
        "ablations": ablations,
        "noun_attention_from_last_position": attention,
        "article_features": features,
        "demo_prompt": {
            "text": DEMO_PROMPT,
            "answer": " an",
            "logit_diff_an_minus_a": float(prompt_logits[an_id] - prompt_logits[a_id]),
        },
        "wall_time_s": {
            "model": round(t_model, 1),
            "transcoders": round(t_tc, 1),
            "total": round(time.perf_counter() - t0, 1),
        },
        "versions": {
            "torch": torch.__version__,
            "transformer_lens": _version("transformer_lens", transformer_lens),
            "sae_lens": sae_lens.__version__,
        },
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    log(f"wrote {out} in {stats['wall_time_s']['total']:.0f}s")
    return stats


def _version(dist: str, module) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist.replace("_", "-"))
    except PackageNotFoundError:
        return getattr(module, "__version__", "unknown")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=demo_path(), help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
    run(args.out, log=print)


if __name__ == "__main__":
    main()
