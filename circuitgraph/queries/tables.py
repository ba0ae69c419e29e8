"""Tables: direct logit attribution, logit lens, output congruence.

* **Direct logit attribution (DLA)** of a target: its incoming edges (the direct effect of
  every node, exact), plus the same summed by kind and by (kind, layer); with the target's
  constant they add up to its pre-activation.
* **Logit lens**: the residual stream before each block and after the last one, read through
  ``ln_final`` (with that residual's own normalisation statistics, as the usual logit lens
  does) and the unembedding.  At the last layer this is the model's logits.
* **Output congruence** of neurons or features with a token direction ``u = W_U[:, a]`` or
  ``u = W_U[:, a] - W_U[:, b]``: ``dot = W_out[i] . u`` (features: ``W_dec[j] . u``);
  ``cosine = dot / (|W_out[i]| |u|)``; ``input_scaled = dot * |W_in[:, i]|`` (features:
  ``|W_enc[:, j]|``), so a unit whose output weights shrank while its input weights grew is
  not under-rated.  For gated MLPs ``W_in`` is the linear (value) branch.  Weight-only:
  every unit of the model is scored, and ``in_graph`` says whether it is a node of this graph
  (a unit active on the prompt but left out by the graph's selection or pruning is not).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from circuitgraph.attribution.targets import resolve_token
from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NODE_KINDS, NodeId
from circuitgraph.queries._base import QueryResult, check_k, format_table, require_context, share
from circuitgraph.queries.filters import resolve_node
from circuitgraph.spec.kinds import ACTIVATION_KINDS, ActivationKind

if TYPE_CHECKING:
    from circuitgraph.attribution.context import AttributionContext

__all__ = [
    "DLAResult",
    "LogitLensResult",
    "LensRow",
    "CongruenceResult",
    "direct_logit_attribution",
    "logit_lens",
    "congruence",
]


# ---------------------------------------------------------------------------- DLA
def _resolve_target(graph: AttributionGraph, target: int | NodeId | str) -> NodeId:
    if isinstance(target, bool):
        raise QueryError(f"target must be an index into the targets or a node id, got {target!r}")
    if isinstance(target, (int, np.integer)):
        n = len(graph.targets)
        if not (0 <= target < n):
            raise QueryError(f"target index {target} is out of range: the graph has {n} target(s) (0-{n - 1})")
        return graph.targets[int(target)][0]

    return resolve_node(graph, target, what="direct_logit_attribution target")


@dataclass(frozen=True, repr=False)
class DLAResult(QueryResult):
    """Direct effects into one target: per node, per kind and per (kind, layer)."""

    kind = "direct_logit_attribution"
    target: NodeId
    pre_activation: float | None
    constant: float | None
    rows: tuple[tuple[NodeId, float], ...]
    by_kind: tuple[tuple[str, float], ...]
    by_kind_layer: tuple[tuple[str, int, float], ...]
    top_k: int
    kinds: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": str(self.target),
            "pre_activation": self.pre_activation,
            "constant": self.constant,
            "kinds": None if self.kinds is None else list(self.kinds),
            "top": [{"node": str(n), "weight": w, "share": share(w, self.pre_activation)}
                    for n, w in self.rows[: self.top_k]],
            "n_sources": len(self.rows),
            "by_kind": {k: w for k, w in self.by_kind},
            "by_kind_layer": [{"kind": k, "layer": lyr, "weight": w} for k, lyr, w in self.by_kind_layer],
        }

    def table(self, max_rows: int = 10) -> str:
        rows = [(str(n), w, share(w, self.pre_activation)) for n, w in self.rows[: self.top_k]]
        groups = ", ".join(f"{k} {w:.4g}" for k, w in self.by_kind)
        pre = "-" if self.pre_activation is None else f"{self.pre_activation:.4g}"
        return format_table(["node", "direct effect", "share"], rows, max_rows=max_rows,
                            title=f"direct attribution to {self.target} (pre-activation {pre})",
                            footer=f"by kind: {groups}")


def direct_logit_attribution(graph: AttributionGraph, target: int | NodeId | str = 0, top_k: int = 20,
                             kinds: Iterable[str] | None = None) -> DLAResult:
    """The direct effect of every node on one target (an index into the targets or a node id).

    Example::

        dla = direct_logit_attribution(graph, 0, top_k=10, kinds=["feature", "error"])
        dla.by_kind             # (("embedding", 1.2), ("error", -0.3), ("feature", 2.1))
    """
    top_k = check_k(top_k, "top_k")
    tid = _resolve_target(graph, target)
    kinds = None if kinds is None else tuple(kinds)
    if kinds is not None:
        bad = [k for k in kinds if k not in NODE_KINDS]
        if bad:
            raise QueryError(f"unknown node kind(s) {bad}; expected some of {', '.join(NODE_KINDS)}")
    edges = graph.in_edges(tid)
    rows = tuple((s, w) for s, w in edges if kinds is None or s.kind in kinds)
    by_kind: dict[str, float] = {}
    by_kl: dict[tuple[str, int], float] = {}
    for s, w in edges:
        by_kind[s.kind] = by_kind.get(s.kind, 0.0) + w
        by_kl[(s.kind, s.layer)] = by_kl.get((s.kind, s.layer), 0.0) + w
    rec = graph.node(tid)
    by_layer = tuple((k, lyr, w) for (k, lyr), w in sorted(by_kl.items(), key=lambda x: (x[0][1], x[0][0])))
    return DLAResult(tid, rec.pre_activation, rec.constant, rows, tuple(sorted(by_kind.items())), by_layer,
                     top_k, kinds)


# ---------------------------------------------------------------------------- token helpers
def _tok_ids(ctx: AttributionContext, tokens: Iterable[str | int], where: str) -> list[int]:
    a = ctx.adapter
    return [resolve_token(t, a.tokenizer, a.facts.d_vocab, where) for t in tokens]


def _tok_str(ctx: AttributionContext, token: int) -> str:
    tk = ctx.adapter.tokenizer
    return tk.token_str(int(token)) if tk is not None else f"<{int(token)}>"


# ---------------------------------------------------------------------------- logit lens
@dataclass(frozen=True)
class LensRow:
    """One residual site: its top tokens and the asked tokens, each ``(id, string, logit, prob, rank)``."""

    site: str
    layer: int
    top: tuple[tuple[int, str, float, float, int], ...]
    tokens: tuple[tuple[int, str, float, float, int], ...]

    def to_dict(self) -> dict[str, Any]:
        def cell(t: tuple[int, str, float, float, int]) -> dict[str, Any]:
            return {"token": t[0], "token_str": t[1], "logit": t[2], "probability": t[3], "rank": t[4]}

        return {"site": self.site, "layer": self.layer, "top": [cell(t) for t in self.top],
                "tokens": [cell(t) for t in self.tokens]}


@dataclass(frozen=True, repr=False)
class LogitLensResult(QueryResult):
    """The logit lens at one position, one row per residual site (bottom to top)."""

    kind = "logit_lens"
    position: int
    rows: tuple[LensRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "rows": [r.to_dict() for r in self.rows]}

    def table(self, max_rows: int = 10) -> str:
        asked = bool(self.rows and self.rows[0].tokens)
        rows = []
        for r in self.rows:
            cells = r.tokens if asked else r.top
            rows.append((r.site, "  ".join(f"{t[1]!r} {t[2]:.3g} (p {t[3]:.3f}, #{t[4]})" for t in cells)))
        return format_table(["site", "tokens" if asked else "top tokens"], rows, max_rows=max(max_rows, len(rows)),
                            title=f"logit lens at position {self.position}")


def logit_lens(graph: AttributionGraph, tokens: Iterable[str | int] | None = None, position: int = -1,
               top_k: int = 5) -> LogitLensResult:
    """The residual stream at every layer read through ``ln_final`` and the unembedding.

    Example::

        lens = logit_lens(graph, tokens=[" Paris"], position=-1)
        [r.tokens[0][4] for r in lens.rows]      # rank of " Paris" at each layer
    """
    ctx = require_context(graph, "logit_lens")
    top_k = check_k(top_k, "top_k")
    lin, a = ctx.linearisation, ctx.adapter
    T = lin.n_pos
    p = position + T if position < 0 else position
    if not (0 <= p < T):
        raise QueryError(f"logit_lens position {position} is out of range for a {T}-token prompt "
                         f"(valid: 0..{T - 1} or -{T}..-1)")
    ids = None if tokens is None else _tok_ids(ctx, tokens, "logit_lens tokens")
    L = a.facts.n_layers
    sites = [(f"resid_pre {l}", l, lin.resid_pre[l][p]) for l in range(L)]
    sites.append((f"resid_post {L - 1}", L, lin.resid_final[p]))
    resid = torch.stack([s[2] for s in sites]).double()
    norm = a.norm("ln_final")
    eps = float(a.model.cfg.eps)
    x = resid - resid.mean(-1, keepdim=True) if norm.center else resid
    x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if norm.gamma is not None:
        x = x * norm.gamma.double()
    if norm.beta is not None:
        x = x + norm.beta.double()
    logits = x @ a.W_U.double() + a.b_U.double()
    cap = a.facts.output_logits_soft_cap
    if cap:
        logits = cap * torch.tanh(logits / cap)
    probs = torch.softmax(logits, -1)
    ranks = (-logits).argsort(-1).argsort(-1)
    rows = []
    for i, (site, layer, _) in enumerate(sites):
        lg, pr, rk = logits[i], probs[i], ranks[i]
        top = torch.topk(lg, min(top_k, lg.shape[0])).indices.tolist()

        def cell(v: int, lg: torch.Tensor = lg, pr: torch.Tensor = pr,
                 rk: torch.Tensor = rk) -> tuple[int, str, float, float, int]:
            return (int(v), _tok_str(ctx, v), float(lg[v]), float(pr[v]), int(rk[v]))

        rows.append(LensRow(site, layer, tuple(cell(v) for v in top), tuple(cell(v) for v in ids or ())))
    return LogitLensResult(p, tuple(rows))


# ---------------------------------------------------------------------------- congruence
@dataclass(frozen=True, repr=False)
class CongruenceResult(QueryResult):
    """Units ranked by ``|score|``: rows ``(kind, layer, index, score, dot, in_graph)``."""

    kind = "congruence"
    tokens: tuple[int, ...]
    token_strs: tuple[str, ...]
    unit_kind: ActivationKind
    mode: Literal["dot", "cosine", "input_scaled"]
    rows: tuple[tuple[str, int, int, float, float, bool], ...]
    n_units: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "token_strs": list(self.token_strs),
            "kind": self.unit_kind,
            "mode": self.mode,
            "n_units": self.n_units,
            "top": [{"kind": k, "layer": lyr, "index": i, "score": s, "dot": d, "in_graph": g}
                    for k, lyr, i, s, d, g in self.rows],
        }

    def table(self, max_rows: int = 10) -> str:
        direction = " - ".join(repr(s) for s in self.token_strs)
        rows = [(f"{k} L{lyr} #{i}", s, d, "yes" if g else "") for k, lyr, i, s, d, g in self.rows]
        # the score column is the chosen mode; the dot column is always the raw W_out . u
        return format_table(["unit", f"score ({self.mode})", "dot (output . direction)", "in graph"], rows,
                            max_rows=max_rows,
                            title=f"output congruence of {self.unit_kind}s with {direction}")


def _unit_weights(ctx: AttributionContext, kind: str, layer: int) -> tuple[Any, Any] | None:
    """(W_out (n, d_model), W_in (d_model, n)) of one layer's neurons or transcoder features."""
    if kind == "neuron":
        w = ctx.adapter.mlp_weights(layer)
        return w["W_out"], w["W_in"]
    tcs = ctx.transcoders
    if tcs is None or layer not in tcs:
        return None
    tc = tcs[layer]

    # output weights: the sum of the decoder rows over every MLP output the feature writes
    # (one for per-layer transcoders; layer..L-1 for a cross-layer transcoder): all reach the
    # logits directly through the residual stream
    W_dec = tcs.decoder_rows(layer, torch.arange(tc.d_sae)).sum(1)
    return W_dec, tc.W_enc


def congruence(graph: AttributionGraph, tokens: str | int | Iterable[str | int], kind: ActivationKind = "feature",
               layer: int | None = None, mode: Literal["dot", "cosine", "input_scaled"] = "dot",
               top_k: int = 20) -> CongruenceResult:
    """Output congruence of every neuron or feature with the direction of one token or of
    ``a - b``, ranked by ``|score|``.

    Example::

        congruence(graph, [" an", " a"], kind="neuron", mode="cosine", top_k=10).rows[0]
    """
    ctx = require_context(graph, "congruence")
    top_k = check_k(top_k, "top_k")
    if kind not in ACTIVATION_KINDS:
        raise QueryError(f"congruence kind must be 'neuron' or 'feature', got {kind!r}")
    if mode not in ("dot", "cosine", "input_scaled"):
        raise QueryError(f"congruence mode must be 'dot', 'cosine' or 'input_scaled', got {mode!r}")
    tokens = [tokens] if isinstance(tokens, (str, int)) else list(tokens)  # one token may be given as itself
    if len(tokens) not in (1, 2):
        raise QueryError(f"congruence needs one token or two [a, b], got {len(tokens)}: {tokens!r}")
    ids = _tok_ids(ctx, tokens, "congruence tokens")
    a = ctx.adapter
    L = a.facts.n_layers
    if layer is not None and not (isinstance(layer, int) and 0 <= layer < L):
        raise QueryError(f"congruence layer {layer!r} requested, the model has {L} layers (0-{L - 1})")
    W_U = a.W_U.double()
    u = W_U[:, ids[0]] - (W_U[:, ids[1]] if len(ids) == 2 else 0.0)
    layers = [layer] if layer is not None else list(range(L))
    if kind == "feature" and ctx.transcoders is None:
        raise QueryError("congruence kind 'feature' needs transcoders; this graph was built without them "
                         "(use kind: neuron)")
    in_graph = {(n.layer, n.index) for n in graph.nodes if n.kind == kind}
    scores, dots, where = [], [], []
    for lyr in layers:
        w = _unit_weights(ctx, kind, lyr)
        if w is None:
            if layer is not None:
                raise QueryError(f"congruence: no transcoder is loaded for layer {lyr}")
            continue
        W_out, W_in = w[0].double(), w[1].double()
        dot = W_out @ u
        if mode == "dot":
            score = dot
        elif mode == "cosine":
            denom = W_out.norm(dim=-1) * u.norm()
            score = torch.where(denom > 0, dot / denom.clamp_min(1e-300), torch.zeros_like(dot))
        else:
            score = dot * W_in.norm(dim=0)
        scores.append(score)
        dots.append(dot)
        where.append(torch.stack([torch.full_like(dot, lyr), torch.arange(dot.shape[0], dtype=dot.dtype)], -1))
    score = torch.cat(scores)
    dot = torch.cat(dots)
    loc = torch.cat(where).long()
    k = min(top_k, score.shape[0])
    top = torch.topk(score.abs(), k).indices.tolist()
    rows = tuple(
        (kind, int(loc[i, 0]), int(loc[i, 1]), float(score[i]), float(dot[i]),
         (int(loc[i, 0]), int(loc[i, 1])) in in_graph)
        for i in top
    )
    return CongruenceResult(tuple(ids), tuple(_tok_str(ctx, t) for t in ids), kind, mode, rows, int(score.shape[0]))
