"""Train the built-in demo's cross-layer transcoder and write it in circuit-tracer's format.

Run::

    python scripts/train_demo_clt.py            # writes circuitgraph/builtin/demo/clt/
    python scripts/train_demo_clt.py --out DIR

The demo model itself is not retrained: the shipped ``demo/model`` is loaded.  Steps (CPU, two
threads, fixed seed, deterministic, about a minute):

1. Activations on the same training sentences ``train_demo.py`` uses (same seeds): the input
   ``blocks.{l}.ln2.hook_normalized`` and the output ``blocks.{l}.hook_mlp_out`` of every
   layer, at every real position except the BOS position (circuit-tracer never makes
   nodes there).
2. A ReLU CLT with ``d_transcoder`` features per layer: feature ``j`` of layer ``l`` reads
   ``x_l`` and writes ``a_j W_dec_l[j, k - l]`` into every ``k >= l``; minimise
   ``sum_k ||y_k - y_hat_k||^2 / Var(y_k) + lambda * sum_{l,j} a_{l,j} ||W_dec_l[j]||``
   (the norm of the feature's decoder rows over all its output layers).
3. Held-out numbers next to the per-layer transcoders': fraction of variance explained per
   MLP output, mean L0 per layer, dead features; the replacement model's article accuracy,
   article and next-token cross-entropy; circuit-tracer's replacement and completeness
   scores of the graph on the demo prompt.
4. Save ``clt/config.yaml``, ``clt/W_enc_<l>.safetensors``, ``clt/W_dec_<l>.safetensors``
   and ``clt/stats.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_demo import (
    DEMO_PROMPT,
    article_ids,
    article_metrics,
    build_tokenizer,
    encode,
    last_logits,
    next_token_ce,
    reproducible,
)

from circuitgraph.builtin import demo_path
from circuitgraph.builtin.demo_task import make_prompts, make_training_texts, noun_position, vocabulary


@dataclass(frozen=True)
class CLTSettings:
    seed: int = 0
    n_train: int = 40_000  # the demo model's training set (the same seed): its first sentences
    n_sentences: int = 8_000
    n_eval: int = 2_000
    d_transcoder: int = 512
    steps: int = 3_000
    batch_size: int = 512
    lr: float = 2e-3
    l1: float = 1e-2


def collect(model, tokens, lengths, batch_size: int = 512):
    """(x (L, rows, d), y (L, rows, d)) at every real position except 0."""
    L = model.cfg.n_layers
    names = [f"blocks.{l}.ln2.hook_normalized" for l in range(L)] + [f"blocks.{l}.hook_mlp_out" for l in range(L)]
    xs, ys = [], []
    with torch.no_grad():
        for start in range(0, tokens.shape[0], batch_size):
            batch, length = tokens[start: start + batch_size], lengths[start: start + batch_size]
            _, cache = model.run_with_cache(batch, names_filter=lambda n: n in names)
            pos = torch.arange(batch.shape[1])[None, :]
            mask = (pos < length[:, None]) & (pos > 0)
            xs.append(torch.stack([cache[names[l]][mask] for l in range(L)]))
            ys.append(torch.stack([cache[names[L + l]][mask] for l in range(L)]))
    return torch.cat(xs, 1), torch.cat(ys, 1)


class CLT(torch.nn.Module):
    def __init__(self, L: int, d: int, n: int, gen: torch.Generator, y_mean: torch.Tensor):
        super().__init__()
        dec = [torch.randn(n, L - l, d, generator=gen) for l in range(L)]
        dec = [w / w.flatten(1).norm(dim=1)[:, None, None] for w in dec]
        self.W_dec = torch.nn.ParameterList([torch.nn.Parameter(w) for w in dec])
        self.W_enc = torch.nn.Parameter(torch.stack([0.5 * w[:, 0] for w in dec]))  # (L, n, d)
        self.b_enc = torch.nn.Parameter(torch.zeros(L, n))
        self.b_dec = torch.nn.Parameter(y_mean.clone())  # (L, d)
        self.L = L

    def forward(self, x):  # x (L, B, d)
        acts = torch.relu(torch.einsum("lbd,lnd->lbn", x, self.W_enc) + self.b_enc[:, None])
        recon = [self.b_dec[k].expand(x.shape[1], -1) for k in range(self.L)]
        for l in range(self.L):
            for k in range(l, self.L):
                recon[k] = recon[k] + acts[l] @ self.W_dec[l][:, k - l]
        return torch.stack(recon), acts

    def decoder_norms(self):
        return torch.stack([w.flatten(1).norm(dim=1) for w in self.W_dec])  # (L, n)


def train(x, y, s: CLTSettings, log) -> CLT:
    L, _, d = x.shape
    gen = torch.Generator().manual_seed(s.seed + 20)
    clt = CLT(L, d, s.d_transcoder, gen, y.mean(1))
    var = (y - y.mean(1, keepdim=True)).pow(2).sum(-1).mean(1)  # (L,)
    opt = torch.optim.Adam(clt.parameters(), lr=s.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 if i < 0.8 * s.steps else 0.2)
    for step in range(s.steps):
        idx = torch.randint(0, x.shape[1], (s.batch_size,), generator=gen)
        recon, acts = clt(x[:, idx])
        mse = ((recon - y[:, idx]).pow(2).sum(-1).mean(1) / var).sum()
        l1 = (acts * clt.decoder_norms()[:, None]).sum(-1).mean(1).sum()
        loss = mse + s.l1 * min(1.0, step / (0.1 * s.steps)) * l1
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % 1000 == 0:
            log(f"  clt step {step + 1}/{s.steps}: nmse {mse.item():.3f}, l0 {(acts > 0).sum(-1).float().mean():.1f}")
    return clt


def save(clt: CLT, out: Path) -> None:
    import yaml
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": "ln2.hook_normalized",
        "feature_output_hook": "hook_mlp_out",
        "model_name": "circuitgraph-demo-a-an",
    }, sort_keys=False))
    for l in range(clt.L):
        save_file({f"W_enc_{l}": clt.W_enc[l].detach().contiguous(), f"b_enc_{l}": clt.b_enc[l].detach().contiguous(),
                   f"b_dec_{l}": clt.b_dec[l].detach().contiguous()}, str(out / f"W_enc_{l}.safetensors"))
        save_file({f"W_dec_{l}": clt.W_dec[l].detach().contiguous()}, str(out / f"W_dec_{l}.safetensors"))


def graph_scores(transcoders_spec: dict) -> dict:
    """circuit-tracer's replacement / completeness scores of the demo prompt's graph."""
    from circuitgraph.pipeline.runner import build
    from circuitgraph.queries.scores import compute_scores
    from circuitgraph.spec import load_spec

    spec = load_spec({"format_version": 1, "model": {"builtin": "demo"}, "transcoders": transcoders_spec,
                      "prompt": DEMO_PROMPT, "targets": [{"logit_diff": [" an", " a"]}]})
    g = build(spec)
    s = compute_scores(g, per_target=False)
    return {"replacement_score": s.replacement_score, "completeness_score": s.completeness_score,
            "n_features": sum(n.kind == "feature" for n in g.nodes),
            "completeness_max_relative_violation": g.metadata["completeness"]["max_relative_violation"]}


def run(out: Path, s: CLTSettings, log) -> dict:
    from circuitgraph.adapters.loading import load_builtin_model
    from circuitgraph.dictionaries import load_dictionaries
    from circuitgraph.validation.fidelity import replacement_model

    t0 = time.perf_counter()
    adapter, _ = load_builtin_model("demo")
    model = adapter.model
    tokenizer = build_tokenizer(vocabulary())
    a_id, an_id = article_ids(tokenizer)
    n_ctx = model.cfg.n_ctx
    train_texts = make_training_texts(s.n_train, seed=s.seed + 1)[: s.n_sentences]
    tr_tokens, tr_lengths = encode(tokenizer, [p.text for p in train_texts], n_ctx)
    seen = {t.text.rsplit(" ", 3)[0] for t in make_training_texts(s.n_train, seed=s.seed + 1)}
    held_out = [p for p in make_prompts(s.n_eval * 2, seed=s.seed + 2) if p.text not in seen][: s.n_eval]
    ev_tokens, ev_lengths = encode(tokenizer, [p.text for p in held_out], n_ctx)
    ev_answers = torch.tensor([an_id if p.answer == " an" else a_id for p in held_out])

    x, y = collect(model, tr_tokens, tr_lengths)
    log(f"{x.shape[1]} training rows")
    clt = train(x, y, s, log)
    save(clt, out)

    ex, ey = collect(model, ev_tokens, ev_lengths)
    with torch.no_grad():
        recon, acts = clt(ex)
    layers = []
    for k in range(clt.L):
        fvu = (recon[k] - ey[k]).pow(2).sum() / (ey[k] - ey[k].mean(0)).pow(2).sum()
        layers.append({"layer": k, "fve": float(1 - fvu), "l0": float((acts[k] > 0).sum(-1).float().mean()),
                       "dead_features": int((~(acts[k] > 0).any(0)).sum()), "n_rows": int(ex.shape[1])})
    loaded = load_dictionaries(out, adapter)
    with replacement_model(adapter, loaded):
        replaced = article_metrics(last_logits(model, ev_tokens, ev_lengths), ev_answers, a_id, an_id)
        full_texts = [f"{p.text}{p.answer} {p.text.split()[noun_position(p.text)]} ." for p in held_out]
        fu_tokens, fu_lengths = encode(tokenizer, full_texts, n_ctx)
        replaced["next_token_ce"] = next_token_ce(model, fu_tokens, fu_lengths)
    stats = {
        "settings": asdict(s),
        "clt": layers,
        "l0_total": sum(r["l0"] for r in layers),
        "replacement_model": replaced,
        "graph_on_demo_prompt": graph_scores({"path": str(out)}),
        "per_layer_transcoders_graph_on_demo_prompt": graph_scores({"builtin": "demo"}),
        "seconds": time.perf_counter() - t0,
        "torch": torch.__version__,
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=demo_path() / "clt")
    args = ap.parse_args(argv)
    s = CLTSettings()
    with reproducible(s.seed):
        stats = run(args.out, s, print)
    print(json.dumps({k: v for k, v in stats.items() if k != "settings"}, indent=2))


if __name__ == "__main__":
    main()
