"""Writers and readers of the linearised model on one prompt.

A *writer* adds a vector to the residual stream at a location and position (its output,
already scaled by its activation).  A *reader* reads ``pre = g . x(loc, t) + own_constant``
where ``g`` already includes its norm's ``P(gamma * w) / sigma`` (and, for gated neurons, the
frozen gate).  Constant writers (biases, folded positional embeddings, the BOS-position MLP
output by default) are summed per location into ``constants[loc] (pos, d_model)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from circuitgraph.adapters.architecture import ModelAdapter, NormWeights
from circuitgraph.attribution.frozen_model import (
    FrozenLinearModel,
    loc_resid_mid,
    loc_resid_post,
    loc_resid_pre,
)
from circuitgraph.attribution.linearisation import Linearisation
from circuitgraph.attribution.targets import ResolvedTarget
from circuitgraph.errors import AttributionError
from circuitgraph.graph.nodes import BIAS_INDEX, REMAINDER_INDEX, Node, NodeId

__all__ = ["GraphOptions", "WriterTable", "ReaderTable", "collect_nodes"]


@dataclass
class GraphOptions:
    """Granularity and switches (see the ``graph:`` section of the spec)."""

    mlp: dict[int, str]  # layer -> transcoders | neurons | mlp
    attention: dict[int, str]  # layer -> frozen | heads
    positional_nodes: bool = False
    bias_nodes: bool = False
    bos_nodes: bool = False
    neuron_top_k: int | None = None
    max_feature_nodes: int | None = None
    dtype: torch.dtype = torch.float32
    batch_size: int = 256
    memory_limit: int | None = None  # bytes; None = the memory available


@dataclass
class WriterTable:
    """Writer nodes grouped by residual location and position."""

    # loc -> list of (position, node rows LongTensor, vectors (n, d_model))
    groups: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def add(self, loc: int, position: int, rows: list[int], vectors: torch.Tensor) -> None:
        if not rows:
            return
        self.groups.setdefault(loc, []).append((position, torch.tensor(rows, dtype=torch.long), vectors))

    # loc -> (positions (k,), rows (k, max_n) padded with -1, vectors (k, max_n, d_model) padded with 0)
    padded: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def finalise(self) -> None:
        """Merge groups that share (loc, position) and build the padded per-location blocks."""
        for loc, items in self.groups.items():
            merged: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
            for pos, rows, vecs in items:
                r, v = merged.setdefault(pos, ([], []))
                r.append(rows)
                v.append(vecs)
            self.groups[loc] = sorted(
                ((pos, torch.cat(r), torch.cat(v)) for pos, (r, v) in merged.items()), key=lambda x: x[0]
            )
            groups = self.groups[loc]
            k, max_n = len(groups), max(len(r) for _, r, _ in groups)
            ref = groups[0][2]
            rows = torch.full((k, max_n), -1, dtype=torch.long)
            vecs = torch.zeros(k, max_n, ref.shape[-1], dtype=ref.dtype, device=ref.device)
            for g, (_, r, v) in enumerate(groups):
                rows[g, : len(r)] = r
                vecs[g, : len(r)] = v
            # the groups keep views into the padded block: every writer vector is held once
            self.groups[loc] = [(p, r, vecs[g, : len(r)]) for g, (p, r, _) in enumerate(groups)]
            self.padded[loc] = (torch.tensor([p for p, _, _ in groups], dtype=torch.long), rows, vecs)


@dataclass
class ReaderTable:
    rows: list[int] = field(default_factory=list)
    locs: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    directions: list[torch.Tensor] = field(default_factory=list)
    own_constants: list[float] = field(default_factory=list)

    def add(self, row: int, loc: int, position: int, g: torch.Tensor, own_constant: float) -> None:
        self.rows.append(row)
        self.locs.append(loc)
        self.positions.append(position)
        self.directions.append(g)
        self.own_constants.append(float(own_constant))


@dataclass
class Collected:
    nodes: list[Node]
    writers: WriterTable
    readers: ReaderTable
    constants: dict[int, torch.Tensor]  # loc -> (pos, d_model)
    targets: list[tuple[NodeId, float]]
    frozen: FrozenLinearModel
    # True when a node writes at several residual locations (cross-layer transcoder features):
    # the engine then sums its per-location edges into one edge per (reader, writer)
    multi_location_writers: bool = False

    #: node id -> its writes, built on first use (:meth:`writer_index`)
    _writer_index: dict[NodeId, list[tuple[int, int, torch.Tensor]]] | None = field(default=None, repr=False)

    def writer_index(self) -> dict[NodeId, list[tuple[int, int, torch.Tensor]]]:
        """node id -> every ``(location, position, output vector)`` at which it writes (one for most
        nodes; one per downstream MLP output for a CLT feature)."""
        if self._writer_index is None:
            idx: dict[NodeId, list[tuple[int, int, torch.Tensor]]] = {}
            for loc, groups in self.writers.groups.items():
                for pos, rows, vecs in groups:
                    for j, r in enumerate(rows.tolist()):
                        idx.setdefault(self.nodes[r].id, []).append((loc, pos, vecs[j]))
            self._writer_index = idx
        return self._writer_index

    def count_tables(self, n_locs: int, n_pos: int) -> tuple[Any, Any, Any, Any]:
        """What the memory estimate needs (numpy): writers per (location, position)
        ``(n_locs, n_pos)``, and per reader its location, position and node kind."""
        import numpy as np

        counts = np.zeros((n_locs, n_pos), dtype=np.int64)
        for loc, groups in self.writers.groups.items():
            for pos, rows, _ in groups:
                counts[loc, pos] += len(rows)
        locs = np.asarray(self.readers.locs, dtype=np.int64)
        positions = np.asarray(self.readers.positions, dtype=np.int64)
        kinds = np.array([self.nodes[r].kind for r in self.readers.rows], dtype=object)
        return counts, locs, positions, kinds

    def largest_writer_block(self) -> int:
        """The most (position, writer) slots of one residual location's padded writer block."""
        return max((int(rows.shape[0]) * int(rows.shape[1]) for _, rows, _ in self.writers.padded.values()),
                   default=0)

    def writer_locations(self, node: NodeId) -> list[tuple[int, int, torch.Tensor]]:
        """Every ``(location, position, output vector)`` at which ``node`` writes; empty for non-writers."""
        return self.writer_index().get(node, [])


class _Builder:
    def __init__(self, adapter: ModelAdapter, lin: Linearisation, transcoders: Any, options: GraphOptions):
        self.a = adapter
        self.lin = lin
        self.tc = transcoders
        self.opt = options
        self.dtype = options.dtype
        self.device = adapter.device
        self.nodes: list[Node] = []
        self.index: dict[NodeId, int] = {}
        self.multi_location = False
        #: per-prompt dictionary values shared by the MLP layers (see _dictionary_state)
        self.dictionary_state: dict[str, Any] = {"acts": {}, "rows": {}, "dec": {}}
        self.writers = WriterTable()
        self.readers = ReaderTable()
        T, D = lin.n_pos, adapter.facts.d_model
        self.constants: dict[int, torch.Tensor] = {
            loc: torch.zeros(T, D, dtype=self.dtype, device=self.device) for loc in range(2 * adapter.facts.n_layers + 1)
        }
        self.tok_str = (
            (lambda i: adapter.tokenizer.token_str(i)) if adapter.tokenizer is not None else (lambda i: f"<{i}>")
        )

    def c(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.device, dtype=self.dtype)

    def add_node(self, node: Node) -> int:
        if node.id in self.index:
            raise AttributionError(f"duplicate node {node.id}")
        self.index[node.id] = len(self.nodes)
        self.nodes.append(node)
        return self.index[node.id]

    def min_mlp_pos(self) -> int:
        return 0 if self.opt.bos_nodes else 1


def _post_norm_forward(fm: FrozenLinearModel, norms: list | None, layer: int, vecs: torch.Tensor,
                       positions: torch.Tensor | slice) -> torch.Tensor:
    """Writers of a block with post-norms pass through the frozen post-norm's linear part."""
    if norms is None:
        return vecs
    return norms[layer].forward_linear(vecs, positions)


def collect_nodes(
    adapter: ModelAdapter,
    lin: Linearisation,
    transcoders: Any,
    targets: list[ResolvedTarget],
    options: GraphOptions,
) -> Collected:
    """Build the node table, writers, readers and constants for one prompt."""
    b = _Builder(adapter, lin, transcoders, options)
    f = adapter.facts
    L, T = f.n_layers, lin.n_pos
    skip_layers = {}
    if transcoders is not None:
        for layer, tc in transcoders.layers.items():
            W_skip = transcoders.skip_weight(layer)
            if options.mlp.get(layer) == "transcoders" and W_skip is not None:
                skip_layers[layer] = (W_skip, tc.input_site, transcoders.output_site(layer) == "before_post_norm")
        if getattr(transcoders, "kind", "per_layer") == "cross_layer":
            other = sorted(l for l in range(L) if options.mlp.get(l) != "transcoders")
            if other:
                raise AttributionError(
                    f"graph.mlp: layers {other} are not analysed with transcoders, but a cross-layer transcoder "
                    "writes into every MLP output; set graph.mlp: transcoders (or use per-layer transcoders)")
    fm = FrozenLinearModel(adapter, lin, attention_modes=options.attention, skip_layers=skip_layers,
                           dtype=b.dtype, device=b.device)
    tokens = lin.tokens.tolist()

    # ---------------------------------------------------------------- embeddings (loc 0)
    emb = b.c(lin.embed)
    for t, tok in enumerate(tokens):
        row = b.add_node(Node(NodeId("embedding", -1, t, int(tok)), activation=1.0,
                              label=b.tok_str(tok), attrs={"token": int(tok), "token_str": b.tok_str(tok)}))
        b.writers.add(0, t, [row], emb[t : t + 1])
    if lin.pos_embed is not None:
        pe = b.c(lin.pos_embed)
        if options.positional_nodes:
            for t in range(T):
                row = b.add_node(Node(NodeId("positional", -1, t, 0), activation=1.0, label=f"pos {t}"))
                b.writers.add(0, t, [row], pe[t : t + 1])
        else:
            b.constants[0] += pe

    # ---------------------------------------------------------------- blocks
    for layer in range(L):
        _collect_attention(b, fm, layer)
        _collect_mlp(b, fm, layer)

    # ---------------------------------------------------------------- targets
    target_ids = [_collect_target(b, fm, i, tgt) for i, tgt in enumerate(targets)]
    b.writers.finalise()
    b.dictionary_state = {}  # the activations and decoder rows are not needed any more
    return Collected(b.nodes, b.writers, b.readers, b.constants,
                     [(tid, tgt.weight) for tid, tgt in zip(target_ids, targets)], fm,
                     multi_location_writers=b.multi_location)


# -------------------------------------------------------------------- attention
def _collect_attention(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    lin, T = b.lin, b.lin.n_pos
    loc = loc_resid_mid(layer)
    w = fm.attn[layer]
    posts = fm.ln1_post
    A = fm.patterns[layer]  # (H, T, T)
    ln1 = fm.ln1[layer]
    bias_raw = w["b_O"].expand(T, -1).clone()
    if b.opt.attention[layer] == "frozen":
        # the constant part of frozen attention: sum_s A[h,t,s] (beta1 W_V^h + b_V^h) W_O^h
        beta = ln1.beta if ln1.beta is not None else torch.zeros_like(w["b_O"])
        per_head = torch.einsum("d,hdk->hk", beta, w["W_V"]) + w["b_V"]  # (H, d_head)
        per_head_out = torch.einsum("hk,hkd->hd", per_head, w["W_O"])  # (H, d_model)
        bias_raw = bias_raw + torch.einsum("ht,hd->td", A.sum(-1), per_head_out)
    else:
        z = b.c(lin.z[layer])  # (T, H, d_head) includes b_V and beta1 through the frozen pattern
        heads = torch.einsum("thk,hkd->thd", z, w["W_O"])  # (T, H, d_model)
        for t in range(T):
            vecs = _post_norm_forward(fm, posts, layer, heads[t], slice(t, t + 1))
            rows = [
                b.add_node(Node(NodeId("attention_head", layer, t, h), activation=1.0, label=f"L{layer}H{h}@{t}"))
                for h in range(heads.shape[1])
            ]
            b.writers.add(loc, t, rows, vecs)
    bias = _post_norm_forward(fm, posts, layer, bias_raw, slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        bias = bias + posts[layer].beta
    _add_bias(b, loc, layer, "attention", bias)


def _add_bias(b: _Builder, loc: int, layer: int, which: str, vectors: torch.Tensor) -> None:
    """Constant writers: bias nodes when asked, else folded into readers' constants."""
    if not b.opt.bias_nodes:
        b.constants[loc] += vectors
        return
    for t in range(vectors.shape[0]):
        row = b.add_node(Node(NodeId("bias", layer, t, BIAS_INDEX[which]), activation=1.0,
                              label=f"{which} bias L{layer}@{t}"))
        b.writers.add(loc, t, [row], vectors[t : t + 1])


# -------------------------------------------------------------------- MLP
def _collect_mlp(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    mode = b.opt.mlp[layer]
    if mode == "transcoders":
        _collect_transcoder_layer(b, fm, layer)
    elif mode == "neurons":
        _collect_neuron_layer(b, fm, layer)
    elif mode == "mlp":
        _collect_mlp_vector_layer(b, fm, layer)
    else:  # pragma: no cover - the spec forbids it
        raise AttributionError(f"graph.mlp for layer {layer}: unknown granularity {mode!r}")


def _feature_reader(b: _Builder, fm: FrozenLinearModel, layer: int, t: int, idx: torch.Tensor):
    """Reader directions, own constants and measured pre-activations of features ``idx`` at (layer, t).

    The dictionary's input site decides the norm: ``normalized`` reads ``P(x)/sigma2`` (ln2
    before gamma/beta), ``mlp_input`` the MLP's input ``gamma2 * P(x)/sigma2 + beta2``, ``raw``
    the residual stream at resid_mid itself."""
    tc = b.tc[layer]
    W = b.c(tc.encoder_rows(idx))  # (n, d_model)
    own = b.c(tc.b_enc[idx])
    x = b.c(b.lin.tc_input[layer][t])
    pre = W @ x + own
    if tc.input_site in ("normalized", "mlp_input"):
        norm = fm.ln2[layer]
        if tc.input_site == "mlp_input":
            g = norm.reader_direction(W)
            own = own + norm.reader_constant(W) if norm.beta is not None else own
        else:  # P(x)/sigma2: the centring without gamma
            g = NormWeights(None, None, norm.center).reader_direction(W)
        g = g / norm.sigma[t]
    else:
        g = W
    return g, own, pre


def _dictionary_state(b: _Builder) -> dict[str, Any]:
    """Per-prompt dictionary values shared by the MLP layers: activations of every encoder
    layer (computed once), the feature rows created so far and the decoder rows of the
    active features (read once per source layer, lazily for large dictionaries)."""
    return b.dictionary_state


def _acts(b: _Builder, layer: int) -> torch.Tensor:
    st = _dictionary_state(b)
    if layer not in st["acts"]:
        st["acts"][layer] = b.tc[layer].activation(b.lin.tc_input[layer]).to(device=b.device, dtype=b.dtype)
    return st["acts"][layer]


def _decoder(b: _Builder, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted active feature ids of ``layer`` at node positions, their decoder rows (n, n_out, d))."""
    st = _dictionary_state(b)
    if layer not in st["dec"]:
        acts = _acts(b, layer)[b.min_mlp_pos():]
        active = (acts != 0).any(0).nonzero().flatten()
        st["dec"][layer] = (active, b.c(b.tc.decoder_rows(layer, active.cpu())))
    return st["dec"][layer]


def _collect_transcoder_layer(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    """Features of encoder layer ``layer`` (readers), then every write into MLP output ``layer``:
    from the features of each source layer ``l <= layer`` whose decoder reaches it (only
    ``l = layer`` for per-layer transcoders; every ``l <= layer`` for a CLT) and the error node
    ``mlp_out - sum of reconstructions - b_dec - skip``."""
    if b.tc is None or layer not in b.tc:
        raise AttributionError(
            f"graph.mlp: layer {layer} is analysed with transcoders but no transcoder was loaded for it; "
            "load one or set graph.mlp for that layer to neurons or mlp"
        )
    tc = b.tc
    lin, T = b.lin, b.lin.n_pos
    loc = loc_resid_post(layer)
    st = _dictionary_state(b)
    acts = _acts(b, layer)
    # ---- feature nodes of this encoder layer
    rows_at: dict[int, tuple[list[int], torch.Tensor]] = {}
    for t in range(b.min_mlp_pos(), T):
        active = acts[t].nonzero().flatten()
        if not active.numel():
            continue
        g, own, pre = _feature_reader(b, fm, layer, t, active)
        rows = []
        for j, (i, a, o, p) in enumerate(zip(active.tolist(), acts[t, active].tolist(), own.tolist(), pre.tolist())):
            row = b.add_node(Node(NodeId("feature", layer, t, i), activation=a, pre_activation=p,
                                  label=f"F{i} L{layer}@{t}"))
            rows.append(row)
            b.readers.add(row, loc_resid_mid(layer), t, g[j], o)
        rows_at[t] = (rows, active)
    st["rows"][layer] = rows_at
    # ---- writes into MLP output `layer`; a dictionary writing before the post-MLP norm
    # (mlp.hook_out on Gemma-2-style models) writes through the frozen norm: v -> gamma P(v) / sigma(t)
    posts = fm.ln2_post if tc.output_site(layer) == "before_post_norm" else None
    sources = [l for l in sorted(st["rows"]) if l <= layer and layer in tc.output_layers(l)]
    out = b.c(lin.mlp_out[layer])  # hook_mlp_out: after any post-norm, what the block adds
    constant = b.c(tc.decoder_bias(layer)).expand(T, -1).clone()
    W_skip = tc.skip_weight(layer)
    error = out - _post_norm_forward(fm, posts, layer, constant, slice(0, T))
    if W_skip is not None:
        error = error - _post_norm_forward(fm, posts, layer, b.c(lin.tc_input[layer]) @ b.c(W_skip).T, slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        error = error - posts[layer].beta
    for l in sources:
        ids, dec = _decoder(b, l)
        j_out = layer - l
        a_l = _acts(b, l)
        for t, (rows, active) in st["rows"][l].items():
            vecs = a_l[t, active].unsqueeze(-1) * dec[torch.searchsorted(ids, active), j_out]
            vecs = _post_norm_forward(fm, posts, layer, vecs, slice(t, t + 1))
            b.writers.add(loc, t, rows, vecs)
            error[t] -= vecs.sum(0)
    bias = _post_norm_forward(fm, posts, layer, constant, slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        bias = bias + posts[layer].beta
    _add_bias(b, loc, layer, "mlp", bias)
    for t in range(T):
        if t < b.min_mlp_pos():
            # BOS convention: features and error at position 0 are constants
            b.constants[loc][t] += error[t]
            continue
        row = b.add_node(Node(NodeId("error", layer, t, 0), activation=1.0, label=f"err L{layer}@{t}"))
        b.writers.add(loc, t, [row], error[t : t + 1])
    if getattr(tc, "kind", "per_layer") == "cross_layer":
        b.multi_location = True


def _neuron_reader(b: _Builder, fm: FrozenLinearModel, layer: int, t: int, idx: torch.Tensor):
    """Reader directions, own constants and measured values of neurons ``idx`` at (layer, t).

    GELU/ReLU: the pre-activation (hook_pre).  Gated: with the gate frozen, the activation
    itself (hook_post = act(gate) * (W_in . N2(x)) + b_in)."""
    a, lin = b.a, b.lin
    w = a.mlp_weights(layer)
    W_in = b.c(w["W_in"][:, idx]).T  # (n, d_model)
    b_in = b.c(w["b_in"][idx])
    norm = a.norm("ln2", layer)
    gamma = None if norm.gamma is None else b.c(norm.gamma)
    beta = None if norm.beta is None else b.c(norm.beta)
    g = NormWeights(gamma, beta, norm.center).reader_direction(W_in)
    g = g / fm.ln2[layer].sigma[t]
    lin_const = W_in @ beta if beta is not None else torch.zeros_like(b_in)
    if a.facts.gated_mlp:
        gate = a.mlp_act_fn(layer)(lin.mlp_pre[layer][t, idx]).to(device=b.device, dtype=b.dtype)
        g = g * gate.unsqueeze(-1)
        own = gate * lin_const + b_in
        measured = b.c(lin.mlp_post[layer][t, idx])
    else:
        own = lin_const + b_in
        measured = b.c(lin.mlp_pre[layer][t, idx])
    return g, own, measured


def _collect_neuron_layer(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    a, lin, T = b.a, b.lin, b.lin.n_pos
    loc = loc_resid_post(layer)
    w = a.mlp_weights(layer)
    W_out, b_out = b.c(w["W_out"]), b.c(w["b_out"])
    posts = fm.ln2_post
    post = b.c(lin.mlp_post[layer])  # (T, d_mlp)
    bias = _post_norm_forward(fm, posts, layer, b_out.expand(T, -1).clone(), slice(0, T))
    if posts is not None and posts[layer].beta is not None:
        bias = bias + posts[layer].beta
    _add_bias(b, loc, layer, "mlp", bias)
    gated = a.facts.gated_mlp
    for t in range(T):
        if t < b.min_mlp_pos():
            b.constants[loc][t] += _post_norm_forward(fm, posts, layer, (post[t] @ W_out)[None], slice(t, t + 1))[0]
            continue
        active = post[t].nonzero().flatten()
        rest = None
        k = b.opt.neuron_top_k
        if k is not None and active.numel() > k:
            order = post[t, active].abs().argsort(descending=True, stable=True)
            rest = active[order[k:]]
            active = active[order[:k]].sort().values
        if active.numel():
            g, own, measured = _neuron_reader(b, fm, layer, t, active)
            rows = []
            for j, i in enumerate(active.tolist()):
                attrs: dict[str, Any] = {}
                if gated:
                    attrs = {"gate": float(lin.mlp_pre[layer][t, i]), "linear": float(lin.mlp_pre_linear[layer][t, i])}
                else:
                    attrs = {"hook_pre": float(lin.mlp_pre[layer][t, i])}
                row = b.add_node(Node(NodeId("neuron", layer, t, i), activation=float(post[t, i]),
                                      label=f"N{i} L{layer}@{t}", attrs=attrs))
                rows.append(row)
                b.readers.add(row, loc_resid_mid(layer), t, g[j], float(own[j]))
                b.nodes[row].pre_activation = float(measured[j])
            vecs = post[t, active].unsqueeze(-1) * W_out[active]
            b.writers.add(loc, t, rows, _post_norm_forward(fm, posts, layer, vecs, slice(t, t + 1)))
        if rest is not None and rest.numel():
            vec = (post[t, rest].unsqueeze(-1) * W_out[rest]).sum(0, keepdim=True)
            row = b.add_node(Node(NodeId("remainder", layer, t, REMAINDER_INDEX["neurons"]), activation=1.0,
                                  label=f"other neurons L{layer}@{t}", attrs={"n_neurons": int(rest.numel())}))
            b.writers.add(loc, t, [row], _post_norm_forward(fm, posts, layer, vec, slice(t, t + 1)))


def _collect_mlp_vector_layer(b: _Builder, fm: FrozenLinearModel, layer: int) -> None:
    lin, T = b.lin, b.lin.n_pos
    loc = loc_resid_post(layer)
    out = b.c(lin.mlp_out[layer])
    for t in range(T):
        if t < b.min_mlp_pos():
            b.constants[loc][t] += out[t]
            continue
        row = b.add_node(Node(NodeId("mlp", layer, t, 0), activation=1.0, label=f"MLP L{layer}@{t}"))
        b.writers.add(loc, t, [row], out[t : t + 1])


# -------------------------------------------------------------------- targets
def _collect_target(b: _Builder, fm: FrozenLinearModel, number: int, tgt: ResolvedTarget) -> NodeId:
    a, lin = b.a, b.lin
    L = a.facts.n_layers
    t = tgt.position
    if tgt.kind in ("logit", "logit_diff"):
        W_U, b_U = b.c(a.W_U), b.c(a.b_U)
        if tgt.kind == "logit":
            (v,) = tgt.tokens
            w, bias = W_U[:, v], b_U[v]
            if tgt.relative_to_mean:
                w, bias = w - W_U.mean(-1), bias - b_U.mean()
            label = b.tok_str(v)
            node_id = NodeId("logit", L, t, v)
            if node_id in b.index:  # the same token asked twice (e.g. plain and relative)
                node_id = NodeId("target", L, t, number)
        else:
            va, vb = tgt.tokens
            w, bias = W_U[:, va] - W_U[:, vb], b_U[va] - b_U[vb]
            label = f"{b.tok_str(va)} - {b.tok_str(vb)}"
            node_id = NodeId("target", L, t, number)
        norm = fm.ln_final
        g = norm.reader_direction(w) / norm.sigma[t]
        own = (w @ norm.beta if norm.beta is not None else 0.0) + bias
        normalized = b.c(lin.extra["ln_final_normalized"][t])
        resid_in = normalized * norm.gamma if norm.gamma is not None else normalized
        if norm.beta is not None:
            resid_in = resid_in + norm.beta
        pre = float(resid_in @ w + bias)
        attrs = {"relative_to_mean": tgt.relative_to_mean, "tokens": list(tgt.tokens),
                 "token_str": label, "target_kind": tgt.kind}
        if tgt.probability is not None:
            attrs["probability"] = tgt.probability
        row = b.add_node(Node(node_id, activation=pre, pre_activation=pre, label=label, attrs=attrs))
        b.readers.add(row, 2 * L, t, g, float(own))
        return node_id
    if tgt.kind == "feature":
        node_id = NodeId("feature", tgt.layer, t, tgt.index)
        if node_id in b.index and b.nodes[b.index[node_id]].pre_activation is not None:
            return node_id
        if b.tc is None or tgt.layer not in b.tc:
            raise AttributionError(f"target feature at layer {tgt.layer}: no transcoder is loaded for that layer")
        g, own, pre = _feature_reader(b, fm, tgt.layer, t, torch.tensor([tgt.index]))
        act = float(b.tc[tgt.layer].activation(b.lin.tc_input[tgt.layer][t : t + 1])[0, tgt.index])
        row = _add_or_get(b, node_id, act, f"F{tgt.index} L{tgt.layer}@{t}")
        b.nodes[row].pre_activation = float(pre[0])
        b.readers.add(row, loc_resid_mid(tgt.layer), t, g[0], float(own[0]))
        return node_id
    if tgt.kind == "neuron":
        node_id = NodeId("neuron", tgt.layer, t, tgt.index)
        if node_id in b.index and b.nodes[b.index[node_id]].pre_activation is not None:
            return node_id
        g, own, measured = _neuron_reader(b, fm, tgt.layer, t, torch.tensor([tgt.index]))
        act = float(lin.mlp_post[tgt.layer][t, tgt.index])
        row = _add_or_get(b, node_id, act, f"N{tgt.index} L{tgt.layer}@{t}")
        b.nodes[row].pre_activation = float(measured[0])
        b.readers.add(row, loc_resid_mid(tgt.layer), t, g[0], float(own[0]))
        return node_id
    if tgt.kind == "direction":
        site_loc = {"resid_pre": loc_resid_pre, "resid_mid": loc_resid_mid, "resid_post": loc_resid_post}
        loc = site_loc[tgt.site](tgt.layer)
        resid = {"resid_pre": lin.resid_pre, "resid_mid": lin.resid_mid}.get(tgt.site)
        if resid is not None:
            x = resid[tgt.layer][t]
        else:
            x = lin.resid_pre[tgt.layer + 1][t] if tgt.layer + 1 < L else lin.resid_final[t]
        g = b.c(tgt.vector)
        pre = float(g @ b.c(x))
        node_id = NodeId("target", tgt.layer, t, number)
        row = b.add_node(Node(node_id, activation=pre, pre_activation=pre, label=tgt.name or f"direction {number}",
                              attrs={"site": tgt.site, "target_kind": "direction"}))
        b.readers.add(row, loc, t, g, 0.0)
        return node_id
    raise AttributionError(f"unknown target kind {tgt.kind!r}")  # pragma: no cover


def _add_or_get(b: _Builder, node_id: NodeId, activation: float, label: str) -> int:
    if node_id in b.index:
        return b.index[node_id]
    return b.add_node(Node(node_id, activation=activation, label=label))
