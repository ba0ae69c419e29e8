"""Why ``predicted_vs_actual`` correlates poorly on some real prompts: one graph, many predictions
and many kinds of "actual" removal, for the nodes the check picks and for others.

    /usr/bin/time -v python benchmarks/pva_diagnosis.py \\
        --prompt-source fortunes:OFFSET:NTOKENS | --spec SPEC.yaml  [--k 20] [--all-kinds] [--out r.json]

Per node (kept neurons, embeddings, remainders):
  D        the graph's direct edge into the targets (``predicted``)
  V        the graph's total effect through kept nodes (``predicted_total``)
  lin      -activation x gradient in the frozen linear model (norm scales, attention patterns,
           SwiGLU gates / GELU slopes frozen), autograd over EVERY neuron (folded ones too)
  atp      -activation x gradient in the real model (attribution patching)
and the removal (zero) effect in: the linear model (must equal ``lin``), gates live (norms and
patterns frozen), gates + norms live (patterns frozen), the real model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import yaml


def fortunes_prompt(tok, offset: int, n: int) -> str:
    text = Path("/usr/share/games/fortunes/fortunes").read_text(encoding="utf-8", errors="replace")
    blocks = [" ".join(line.strip() for line in b.splitlines() if line.strip()) for b in text.split("\n%\n")]
    joined = " ".join(b for b in blocks if b)
    ids = tok.encode(joined)
    return tok.decode(ids[offset:offset + n - 1])


def main() -> int:
    import circuitgraph
    from circuitgraph.attribution.linearisation import frozen
    from circuitgraph.validation.metrics import Metric
    from circuitgraph.validation.predictions import direct_effects, total_effects

    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", type=Path)
    ap.add_argument("--prompt-source")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--max-neuron-nodes", type=int, default=1024)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--all-kinds", action="store_true", help="also embeddings and remainders (slower)")
    args = ap.parse_args()
    if args.spec:
        spec = yaml.safe_load(args.spec.read_text())
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(Path("~/.cache/circuitgraph/models/smollm2-135m-instruct").expanduser()))
        _, off, n = args.prompt_source.split(":")
        spec = {"format_version": 1, "model": {"pretrained": "smollm2-135m-instruct"},
                "prompt": fortunes_prompt(tok, int(off), int(n)), "targets": [{"top_logits": {"max_n": 1}}],
                "graph": {"mlp": "neurons", "attention": "frozen"}}
    for key in ("export", "queries", "steer", "prune", "validate"):
        spec.pop(key, None)
    spec["graph"]["max_neuron_nodes"] = args.max_neuron_nodes
    spec["graph"].setdefault("attention", "frozen")
    spec["validate"] = [{"predicted_vs_actual": {"k": args.k, "mode": "zero"}}]
    t0 = time.perf_counter()
    res = circuitgraph.run(spec)
    t_run = time.perf_counter() - t0
    g = res.full_graph
    ctx = g.context
    a, lin = ctx.adapter, ctx.linearisation
    tokens = lin.tokens.to(a.device)[None]
    metric = Metric.from_graph(g)
    L = a.facts.n_layers
    gated = a.facts.gated_mlp

    def run_metric(model):
        logits = model(tokens)
        return metric.combine(metric.values(logits, {}, a))[0]

    def grads(mode: str):
        store: dict = {}
        hooks = []

        def emb(v, hook):
            v = v.detach().requires_grad_(True)
            store["embed"] = v
            return v
        hooks.append((a.hook_embed(), emb))
        for layer in range(L):
            if mode == "lin" and gated:
                hooks.append((a.hook_mlp_pre(layer), lambda v, hook: v.detach()))
            if mode == "lin" and not gated:
                def cap(v, hook, layer=layer):
                    store[("pre", layer)] = v
                    return v
                hooks.append((a.hook_mlp_pre(layer), cap))

            def post(v, hook, layer=layer):
                if mode == "lin" and not gated:
                    pre = store[("pre", layer)]
                    ratio = torch.where(pre != 0, v / torch.where(pre != 0, pre, 1), 0).detach()
                    v = ratio * pre
                v.retain_grad()
                store[layer] = v
                return v
            hooks.append((a.hook_mlp_post(layer), post))
        with torch.enable_grad():
            if mode == "lin":
                with frozen(a, lin, extra_hooks=hooks) as model:
                    m = run_metric(model)
            else:
                with a.hooks(hooks) as model:
                    m = run_metric(model)
            m.backward()
        out = {layer: -(store[layer].detach() * store[layer].grad)[0].double().numpy() for layer in range(L)}
        out["embed"] = -(store["embed"].detach() * store["embed"].grad)[0].sum(-1).double().numpy()
        return out

    t1 = time.perf_counter()
    P = {"lin": grads("lin"), "atp": grads("atp")}
    t_grad = time.perf_counter() - t1

    kept: dict = {}
    for n in g.nodes:
        if n.kind == "neuron":
            kept.setdefault((n.layer, n.position), []).append(n.index)

    def ablate_hooks(node):
        if node.kind == "embedding":
            def h(v, hook):
                v = v.clone()
                v[0, node.position] = 0
                return v
            return [(a.hook_embed(), h)]
        if node.kind == "neuron":
            idx = [node.index]
        else:
            keep = set(kept.get((node.layer, node.position), []))
            idx = [i for i in range(a.facts.d_mlp) if i not in keep]

        def h(v, hook):
            v = v.clone()
            v[0, node.position, idx] = 0
            return v
        return [(a.hook_mlp_post(node.layer), h)]

    gate_freeze = [(a.hook_mlp_pre(layer), None) for layer in range(L)]
    clean_gate = {}

    def cap_gate(v, hook):
        clean_gate[hook.name] = v.detach().clone()
        return v
    with torch.no_grad(), a.hooks([(a.hook_mlp_pre(layer), cap_gate) for layer in range(L)]) as model:
        base_real = float(run_metric(model))

    def fix_gate(v, hook):
        return clean_gate[hook.name].to(v.dtype)
    gate_freeze = [(a.hook_mlp_pre(layer), fix_gate) for layer in range(L)] if gated else []

    modes = {
        "linear": lambda hk: frozen(a, lin, extra_hooks=gate_freeze + hk),
        "gates_live": lambda hk: frozen(a, lin, extra_hooks=hk),
        "patterns_frozen": lambda hk: frozen(a, lin, extra_hooks=hk, freeze_norms=False),
        "real": lambda hk: a.hooks(hk),
    }
    base = {}
    with torch.no_grad():
        for name, mk in modes.items():
            with mk([]) as model:
                base[name] = float(run_metric(model))

    D, V = direct_effects(g), total_effects(g)
    rows = []
    cand = [i for i, n in enumerate(g.nodes) if n.kind in ("neuron", "embedding", "remainder")]
    # the nodes: top by |D| and by |V| of each kind, and by |lin|
    def pval(n, key):
        if n.kind == "embedding":
            return float(P[key]["embed"][n.position])
        if n.kind == "neuron":
            return float(P[key][n.layer][n.position, n.index])
        keep = kept.get((n.layer, n.position), [])
        row = P[key][n.layer][n.position]
        return float(row.sum() - row[keep].sum())
    lin_all = {i: pval(g.nodes[i], "lin") for i in cand}
    chosen = set()
    for kind in ("neuron", "embedding", "remainder") if args.all_kinds else ("neuron",):
        ids = [i for i in cand if g.nodes[i].kind == kind]
        nk = args.k if kind != "embedding" else 5
        for score in (np.abs(D), np.abs(V), np.abs([lin_all.get(i, 0.0) for i in range(g.n_nodes)])):
            chosen |= set(sorted(ids, key=lambda i: -score[i])[:nk])
    t2 = time.perf_counter()
    with torch.no_grad():
        for i in sorted(chosen):
            n = g.nodes[i]
            row = {"node": str(n.id), "kind": n.kind, "activation": float(n.activation), "D": -float(D[i]),
                   "V": -float(V[i]), "lin": pval(n, "lin"), "atp": pval(n, "atp")}
            for name, mk in modes.items():
                with mk(ablate_hooks(n)) as model:
                    row["act_" + name] = float(run_metric(model)) - base[name]
            rows.append(row)
    t_abl = time.perf_counter() - t2

    def corr(sel, x, y="act_real"):
        xs = [r[x] for r in sel]
        ys = [r[y] for r in sel]
        if len(xs) < 3:
            return None
        return round(float(np.corrcoef(xs, ys)[0, 1]), 3)

    def sign(sel, x):
        if not sel:
            return None
        return round(float(np.mean([np.sign(r[x]) == np.sign(r["act_real"]) for r in sel])), 3)
    by = {r["node"]: r for r in rows}
    sets = {}
    intervenable = [i for i in cand if g.nodes[i].kind in ("neuron", "embedding")]
    neurons = [i for i in cand if g.nodes[i].kind == "neuron"]
    rem = [i for i in cand if g.nodes[i].kind == "remainder"]
    for sname, ids, score in [("check: top|D| neuron+emb", intervenable, np.abs(D)),
                              ("top|V| neuron+emb", intervenable, np.abs(V)),
                              ("top|D| neurons", neurons, np.abs(D)),
                              ("top|V| neurons", neurons, np.abs(V)),
                              ("top|lin| neurons", neurons, np.abs([lin_all.get(i, 0.0) for i in range(g.n_nodes)])),
                              ("top|D| remainders", rem, np.abs(D))]:
        top = sorted(ids, key=lambda i: -score[i])[:args.k]
        sel = [by[str(g.nodes[i].id)] for i in top if str(g.nodes[i].id) in by]
        sets[sname] = {"n": len(sel), "kinds": sorted({r["kind"] for r in sel}),
                       **{f"r_{x}": corr(sel, x) for x in ("D", "V", "lin", "atp")},
                       **{f"sign_{x}": sign(sel, x) for x in ("D", "V", "lin", "atp")},
                       **{f"r_lin_vs_{m}": corr(sel, "lin", "act_" + m) for m in modes}}
    lib = [v for v in res.validation if v["kind"] == "predicted_vs_actual"][0]["result"]
    out = {"prompt": spec["prompt"], "targets": spec["targets"], "n_tokens": int(tokens.shape[1]),
           "base": base, "base_real": base_real,
           "library": {"r": lib.correlation, "r_total": lib.correlation_total, "sign": lib.sign_agreement,
                       "rows": [(r.node, r.predicted, r.predicted_total, r.actual) for r in lib.rows]},
           "timings": {"run": t_run, "grads": t_grad, "ablations": t_abl}, "sets": sets, "rows": rows}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: out[k] for k in ("n_tokens", "base", "library", "timings", "sets")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
