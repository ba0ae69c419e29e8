"""EAP-IG edge scores on the real (unfrozen) model against circuitgraph's component edges (IOI).

circuitgraph's edge from writer ``w`` (at position ``p``) into a head ``h`` at destination ``t``
(``graph.component_inputs``) is path patching of ``w`` through ``h``'s value input in the *frozen*
model with a zero baseline.  EAP-IG (Hanna et al. 2024) scores the same edge on the *unfrozen*
model against a corrupted prompt:

    score(w -> c) = (w_clean - w_corrupt) . (1/m) sum_k  dL/d(input of c) at x_k
    x_k = x_corrupt + (k/m) (x_clean - x_corrupt)          (k = 1..m)

with the integrated-gradients interpolation over the residual stream that the receiving
component reads (``resid_pre`` of a head's layer, ``resid_mid`` of an MLP's), everything
downstream recomputed (patterns, norms, MLPs: the real model), and the gradient taken through
the component's own input path only: for head ``h`` at ``t``, the value input at ``p`` through
that destination, ``J_ln1(x_k[p])^T W_V^h (A_k[h, t, p] dL/dz_k[t, h])``; for the MLP at ``t``,
``J_ln2(x_k[t])^T dL/d ln2(x_k)[t]``.  ``L`` is the logit difference; the corrupted prompt
replaces the three names (Wang et al.'s ABC distribution).  Nothing here is tuned to agree.

The script runs circuitgraph on examples/real/component_ioi.yaml (``graph: {mlp: mlp, attention:
heads, component_inputs: true, head_inputs: [value, query, key]}``; its pruned graph written to
``OUT_DIR/ioi/graph.json`` for scripts/component_ioi_images.py), scores every component edge of the
unpruned graph both ways,
and writes the rank correlations (Spearman over all edges, over the edges into the strongest
heads, top-k overlaps by |score|) and the strongest linearised query/key edges into the name
movers to ``OUT_DIR/component_eap_ig.json``.

Usage (heavy: about 3 GB; run it under the machine's lock for heavy jobs, if it has one)::

    python scripts/component_eap_ig.py MODEL_DIR OUT_DIR [IG_STEPS]
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

import circuitgraph
from circuitgraph.graph.nodes import NodeId

PROMPT = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Anna and Paul went to the store, Mark gave a drink to"  # ABC: every name replaced
TARGET = [" Mary", " John"]


SPEC = Path(__file__).resolve().parents[1] / "examples" / "real" / "component_ioi.yaml"


def spec(model_dir: str, out: Path) -> dict:
    """examples/real/component_ioi.yaml with the model folder given, its pruned graph written to
    ``out/ioi/graph.json`` (what scripts/component_ioi_images.py draws), no queries."""
    import yaml

    s = yaml.safe_load(SPEC.read_text())
    if s["prompt"] != PROMPT or s["targets"] != [{"logit_diff": TARGET}]:
        raise SystemExit(f"{SPEC} no longer has this script's prompt and target")
    s["model"] = {"path": model_dir}
    s.pop("queries", None)
    s["export"] = {"json": str(out / "ioi" / "graph.json")}
    return s


def name(g, nid: NodeId) -> str:
    toks = g.metadata["prompt_token_strs"]
    where = f"@{nid.position}{toks[nid.position]!r}" if nid.position >= 0 else ""
    kind = {"attention_head": f"L{nid.layer}H{nid.index}", "mlp": f"MLP{nid.layer}", "embedding": "emb"}
    return kind.get(nid.kind, str(nid)) + where


def corrupt_tokens(adapter, clean: list[int]) -> list[int]:
    """The corrupted prompt's tokens, aligned with the clean ones (same length, BOS as the clean)."""
    tok = adapter.tokenizer
    ids = tok.encode(CORRUPT) if hasattr(tok, "encode") else None
    ids = list(ids)
    if len(ids) == len(clean) - 1:
        ids = clean[:1] + ids
    if len(ids) != len(clean):
        raise SystemExit(f"the corrupted prompt has {len(ids)} tokens, the clean {len(clean)}")
    return ids


class Unfrozen:
    """The real model through TransformerLens hooks: clean and corrupted caches, writer deltas,
    and the integrated gradients at each component's input."""

    def __init__(self, adapter, clean: list[int], corrupt: list[int], a: int, b: int):
        self.adapter, self.model = adapter, adapter.model
        for p in self.model.parameters():  # gradients at activations only
            p.requires_grad_(False)
        self.clean = torch.tensor([clean])
        self.a, self.b = a, b
        with torch.no_grad():
            logits, self.cc = self.model.run_with_cache(self.clean)
            logits_x, self.cx = self.model.run_with_cache(torch.tensor([corrupt]))
        self.ld_clean, self.ld_corrupt = self.metric(logits).item(), self.metric(logits_x).item()

    def metric(self, logits):
        return logits[:, -1, self.a] - logits[:, -1, self.b]

    def output(self, cache, nid: NodeId) -> torch.Tensor:
        if nid.kind == "embedding":
            return cache["hook_embed"][0, nid.position]
        if nid.kind == "attention_head":
            return cache[f"blocks.{nid.layer}.attn.hook_z"][0, nid.position, nid.index] @ \
                self.model.blocks[nid.layer].attn.W_O[nid.index]
        return cache[f"blocks.{nid.layer}.hook_mlp_out"][0, nid.position]

    def delta(self, nid: NodeId) -> torch.Tensor:
        return self.output(self.cc, nid) - self.output(self.cx, nid)

    def _run(self, site: str, x: torch.Tensor, grads: list[str], keep: list[str]):
        """Forward with ``site`` replaced by ``x`` (requires grad), backward from the metric; the
        gradients at the ``grads`` hooks and the values at ``keep``."""
        got, kept = {}, {}

        def put(value, hook):
            return x[None]

        def grab(value, hook):
            value.register_hook(lambda g, n=hook.name: got.__setitem__(n, g[0].detach()))
            return value

        def store(value, hook):
            kept[hook.name] = value[0].detach()
            return value

        hooks = [(site, put)] + [(n, grab) for n in grads] + [(n, store) for n in keep]
        with self.adapter.hooks(hooks) as m:
            self.metric(m(self.clean)).sum().backward()
        return got, kept

    def head_readers(self, layer: int, steps: int) -> torch.Tensor:
        """``R (T, H, T, D)``: the IG-averaged gradient of the metric at the value input of head ``h``
        at source ``s`` through destination ``t`` only."""
        site = f"blocks.{layer}.hook_resid_pre"
        x0, x1 = self.cx[site][0], self.cc[site][0]
        attn = self.model.blocks[layer].attn
        W_V = attn.W_V.detach()  # (H, D, dh), grouped-query heads expanded
        T, D = x1.shape
        H = W_V.shape[0]
        R = torch.zeros(T, H, T, D)
        zname, pname = f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.attn.hook_pattern"
        for k in range(1, steps + 1):
            x = (x0 + (k / steps) * (x1 - x0)).detach().requires_grad_(True)
            got, kept = self._run(site, x, [zname], [pname])
            dz, A = got[zname], kept[pname]  # (T, H, dh), (H, T, T)
            u = torch.einsum("hDk,thk->thD", W_V, dz)  # (T, H, D): W_V^h dL/dz[t, h]
            U = A.permute(1, 0, 2)[..., None] * u[:, :, None, :]  # (t, h, s, D)
            xl = x.detach().requires_grad_(True)
            y = self.model.blocks[layer].ln1(xl[None])[0]
            for t in range(T):
                for h in range(H):
                    (g,) = torch.autograd.grad(y, xl, U[t, h], retain_graph=True)
                    R[t, h] += g
        return R / steps

    def mlp_readers(self, layer: int, steps: int) -> torch.Tensor:
        """``R (T, D)``: the IG-averaged gradient of the metric at the MLP's input at ``t``
        (through the MLP's ln2 only)."""
        site = f"blocks.{layer}.hook_resid_mid"
        x0, x1 = self.cx[site][0], self.cc[site][0]
        T, D = x1.shape
        R = torch.zeros(T, D)
        nname = f"blocks.{layer}.ln2.hook_normalized"
        ln2 = self.model.blocks[layer].ln2
        for k in range(1, steps + 1):
            x = (x0 + (k / steps) * (x1 - x0)).detach().requires_grad_(True)
            got, _ = self._run(site, x, [nname], [])
            dn = got[nname]  # (T, D): dL/d(x / scale) (hook_normalized is before the RMSNorm weight)
            xl = x.detach().requires_grad_(True)
            scale = (xl.pow(2).mean(-1, keepdim=True) + ln2.eps).sqrt()
            (g,) = torch.autograd.grad(xl / scale, xl, dn)
            R += g
        return R / steps


def _topk_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    ia = set(np.argsort(-np.abs(a), kind="stable")[:k].tolist())
    ib = set(np.argsort(-np.abs(b), kind="stable")[:k].tolist())
    return len(ia & ib) / k


def main(model_dir: str, out_dir: str, steps: int = 5) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(True)
    c0 = time.process_time()
    result = circuitgraph.run(spec(model_dir, out))
    g = result.full_graph
    cpu_graph = time.process_time() - c0
    ctx = g.context
    adapter = ctx.adapter
    tid = g.targets[0][0]
    clean = list(g.metadata["prompt_tokens"])
    corrupt = corrupt_tokens(adapter, clean)
    a, b = g.node(tid).attrs["tokens"]
    real = Unfrozen(adapter, clean, corrupt, a, b)
    T = len(clean)
    kinds = np.array([n.kind for n in g.nodes])
    comp = np.isin(kinds[g.edge_target], ["attention_head", "mlp"])
    tgt, src, w = g.edge_target[comp].astype(np.int64), g.edge_source[comp].astype(np.int64), \
        g.edge_weight[comp].astype(np.float64)
    D = adapter.facts.d_model
    delta = torch.zeros(g.n_nodes, D)
    for r in np.unique(src).tolist():
        nid = g.nodes[r].id
        if nid.kind in ("embedding", "attention_head", "mlp"):
            delta[r] = real.delta(nid)
    eap = np.zeros(len(tgt))
    c1 = time.process_time()
    L = adapter.facts.n_layers
    for layer in range(L):
        R = real.head_readers(layer, steps)  # (t, h, s, D)
        sel = np.flatnonzero((kinds[tgt] == "attention_head") & (layer_of(g)[tgt] == layer))
        if sel.size:
            nt = g.nodes
            tt = np.array([nt[r].position for r in tgt[sel]])
            hh = np.array([nt[r].index for r in tgt[sel]])
            ss = np.array([nt[r].position for r in src[sel]])
            readers = R[torch.as_tensor(tt), torch.as_tensor(hh), torch.as_tensor(ss)]
            eap[sel] = (readers * delta[torch.as_tensor(src[sel])]).sum(-1).double().numpy()
        Rm = real.mlp_readers(layer, steps)
        sel = np.flatnonzero((kinds[tgt] == "mlp") & (layer_of(g)[tgt] == layer))
        if sel.size:
            tt = np.array([g.nodes[r].position for r in tgt[sel]])
            eap[sel] = (Rm[torch.as_tensor(tt)] * delta[torch.as_tensor(src[sel])]).sum(-1).double().numpy()
        print(f"layer {layer} done ({time.process_time() - c1:.0f} s CPU)", file=sys.stderr, flush=True)
    cpu_eap = time.process_time() - c1
    report: dict = {"prompt": PROMPT, "corrupted": CORRUPT, "target": TARGET, "ig_steps": steps,
                    "logit_diff_clean": real.ld_clean, "logit_diff_corrupted": real.ld_corrupt,
                    "graph_logit_diff": g.node(tid).pre_activation, "n_component_edges": int(len(tgt)),
                    "cpu_seconds_graph": cpu_graph, "cpu_seconds_eap_ig": cpu_eap,
                    "linearised_edges": g.metadata.get("linearised_edges")}
    rho = spearmanr(w, eap).statistic
    report["all_edges"] = {"spearman": float(rho), "spearman_abs": float(spearmanr(np.abs(w), np.abs(eap)).statistic),
                           "pearson": float(np.corrcoef(w, eap)[0, 1]),
                           **{f"top{k}_overlap": _topk_overlap(w, eap, k) for k in (20, 100, 1000)}}
    strong = np.argsort(-np.abs(w), kind="stable")[:1000]
    report["strongest_1000_graph_edges"] = {"spearman": float(spearmanr(w[strong], eap[strong]).statistic)}
    # the name movers: the final position's heads with the largest direct effect
    direct = {g.nodes[s].id: float(x) for s, t, x in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False)
              if g.nodes[t].id == tid}
    movers = sorted((n for n in g.nodes if n.kind == "attention_head" and n.position == T - 1),
                    key=lambda n: -direct.get(n.id, 0.0))[:3]
    report["name_movers"] = []
    le = g.linearised_edges
    lk = le.kind_names()
    for mv in movers:
        row = g.index_of(mv.id)
        sel = np.flatnonzero(tgt == row)
        top = sel[np.argsort(-np.abs(w[sel]), kind="stable")[:10]]
        entry = {"head": name(g, mv.id), "n_edges": int(sel.size),
                 "spearman": float(spearmanr(w[sel], eap[sel]).statistic),
                 "top10_overlap": _topk_overlap(w[sel], eap[sel], 10),
                 "strongest": [{"writer": name(g, g.nodes[src[k]].id), "graph": float(w[k]), "eap_ig": float(eap[k])}
                               for k in top.tolist()]}
        for kind in ("query", "key"):
            m = np.flatnonzero((le.target == row) & (lk == kind))
            m = m[np.argsort(-np.abs(le.weight[m]), kind="stable")[:6]]
            entry[f"{kind}_edges"] = [{"writer": name(g, g.nodes[int(le.source[k])].id), "edge": float(le.weight[k])}
                                      for k in m.tolist()]
            entry[f"{kind}_sum"] = float(le.weight[(le.target == row) & (lk == kind)].sum())
            entry[f"{kind}_total"] = float(le.totals[kind][row])
        report["name_movers"].append(entry)
    report["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    (out / "component_eap_ig.json").write_text(json.dumps(report, indent=1))
    np.savez_compressed(out / "component_eap_ig_scores.npz", target=tgt, source=src, graph=w, eap_ig=eap)
    return report


_LAYERS: dict[int, np.ndarray] = {}


def layer_of(g) -> np.ndarray:
    key = id(g)
    if key not in _LAYERS:
        _LAYERS[key] = np.array([n.layer for n in g.nodes])
    return _LAYERS[key]


if __name__ == "__main__":
    rep = main(sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:4]))
    print(json.dumps(rep, indent=1))
