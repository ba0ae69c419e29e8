"""The incoming side of head and whole-MLP nodes: total effects split over their inputs.

A head node ``h`` of layer ``m`` at destination ``t`` (``graph: {attention: heads}``) and a whole
MLP node of layer ``m`` at ``t`` (``graph: {mlp: mlp}``) are vector nodes: they write their
output vector ``v``.  With ``graph: {component_inputs: true}`` they also read (docs/maths.md,
section "Component nodes with inputs"):

* their **scalar** is their *total effect* on the targets in the frozen model,
  ``T = v . G``, where ``G`` is the gradient of the weighted targets (``sum_k w_k pre_k``) with
  respect to the residual stream where the node writes, through *everything* downstream: every
  attention layer with its frozen pattern (heads that are nodes included), every MLP with its
  neurons' frozen activation ratios (``act(pre) / pre``; a gated neuron's frozen gate) and frozen
  norms (:func:`total_effect_gradients`);
* ``v`` is affine in the residual the node reads (the head's value input at every source
  position ``s`` through ln1's frozen sigma; the MLP's input at ``t`` through ln2's), so ``T`` is
  a reader: for the head, at ``(resid_pre(m), s)``, the direction
  ``A[h, t, s] P(gamma1 * W_V^h W_O^h G'(t)) / sigma1(s)`` (``G'`` = ``G`` through a post-norm's
  transpose where the block has one) and the own constant
  ``A[h, t, s] (beta1 W_V^h + b_V^h) W_O^h . G'(t)``; for the MLP, at its input location and
  ``t``, ``P(gamma2 * W_in diag(r) W_out G'(t)) / sigma2(t)`` with the own constant
  ``sum_i (r_i (W_in^i . beta2) + c_i) (W_out^i . G'(t)) + b_out . G'(t)`` (``r_i`` the slope of
  neuron ``i``: its frozen ratio, or its frozen gate; ``c_i`` its frozen bias term);
* the **edge** from writer ``w`` into the node is the engine's direct edge into that reader
  (one transposed sweep, :meth:`AttributionContext.attribute_directions`): the paths from ``w``
  to the node's input that pass through no other node.  For a head it is exactly the
  path-patching effect of ``w`` through ``h``'s value input alone in the frozen model.

Identity (checked on every graph with completeness): ``T = sum of incoming edges + constant``.

With ``graph: {head_inputs: [value, query, key]}`` a head also gets **linearised** query and key
edges (docs/maths.md, section 11): with ``e_s = v_s W_O^h . G'(t)`` the value of source ``s``
against the downstream gradient and ``a_s`` the pre-softmax score, ``dT/da_s = A_s (e_s - T)``
(times a soft-cap's slope), so the query at ``t`` is the reader
``sum_s dT/da_s k_s / scale`` (through the frozen query readers of
:class:`~circuitgraph.attribution.qk_readers.QKReaders`) and the key at ``s`` the reader
``dT/da_s q_t / scale``.  Their edges are the first-order change of ``T`` (of the targets) when
the writer is removed from the head's query (key) input, and they sum with their constant to
``sum_s dT/da_s a_s`` (an Euler identity, not ``T``): they are kept apart from the value edges
and never enter the completeness check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from circuitgraph.attribution.engine import DirectionEdges, attribute_directions
from circuitgraph.attribution.frozen_model import FrozenLinearModel
from circuitgraph.attribution.nodes_builder import Collected
from circuitgraph.attribution.qk_readers import QKReaders
from circuitgraph.errors import AttributionError
from circuitgraph.graph.edges import merge_edges
from circuitgraph.graph.nodes import REMAINDER_INDEX, NodeId
from circuitgraph.residual import ResidualLocation

__all__ = ["ComponentInputs", "HEAD_INPUTS", "LINEARISED_KINDS", "component_inputs", "total_effect_gradients", "check_component_inputs_supported",
           "component_edge_bound", "check_component_edge_bound", "MAX_COMPONENT_EDGES"]


#: the edge kinds into a head node (``graph.head_inputs``)
HEAD_INPUTS = ("value", "query", "key")
#: the kinds that are linearised at the prompt (kept apart from the exact value edges)
LINEARISED_KINDS = ("query", "key")


@dataclass(frozen=True)
class ComponentInputs:
    """Edges into component nodes (rows of the graph's node list) and their scalars.

    ``target``, ``source`` (int64 graph rows) and ``weight`` (float64) are one edge per
    ``(component, writer)``; ``total_effect[row]`` is the component's ``T``, ``constant[row]`` the
    part of it no node carries (its readers' own constants plus the constant writers)."""

    target: np.ndarray
    source: np.ndarray
    weight: np.ndarray
    total_effect: dict[int, float]
    constant: dict[int, float]
    #: ``kind -> (target, source, weight)``: the linearised query / key edges into head rows
    linearised: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    #: ``kind -> {row: constant}``: their constants (the readers' own constants and constant writers)
    linearised_constant: dict[str, dict[int, float]] | None = None
    #: ``kind -> {row: sum_s dT/da_s a_s}``: what each head's edges of that kind plus constant sum to
    linearised_total: dict[str, dict[int, float]] | None = None


def check_component_inputs_supported(adapter, mlp_modes: dict[int, str]) -> None:
    """Refuse, with the reason, what the component readers do not cover yet."""
    f = adapter.facts
    if f.num_experts:
        raise AttributionError("graph.component_inputs: mixture-of-experts MLPs are not supported (their "
                               "routing would have to be frozen in the total effect); set component_inputs: false")
    other = sorted(l for l, m in mlp_modes.items() if m == "transcoders")
    if other:
        raise AttributionError(
            f"graph.component_inputs: layers {other} use transcoders; a component's total effect is defined in the "
            "frozen model with MLPs linear at their neurons' frozen ratios, which a transcoder's features do not "
            "follow; set graph.mlp to 'mlp' or 'neurons' on those layers, or component_inputs: false")


#: the most edges into head and MLP nodes a graph may get (their bound, :func:`component_edge_bound`)
MAX_COMPONENT_EDGES = 100_000_000


def component_edge_bound(col: Collected, head_inputs: tuple[str, ...] = ("value",)) -> int:
    """An upper bound on the edges into head and whole-MLP nodes: a head of layer ``m`` at ``t``
    reads every source ``s <= t`` (any ``s`` without a causal mask), each reader meets at most the
    writers at its position up to resid_pre(m) (or, through frozen attention, at any position);
    the linearised key edges (``head_inputs``) as many again, the query edges one reader per head."""
    fm = col.frozen
    L, T = fm.n_layers, fm.n_pos
    counts, _, _, _ = col.count_tables(ResidualLocation.count(L), T)
    local = _paths_stay_at_their_position(col)
    total = 0
    for m in range(L):
        upto = counts[: ResidualLocation.resid_pre(m) + 1]
        per_pos = upto.sum(0) if local else np.full(T, upto.sum())
        if fm.attention_modes[m] == "heads":
            H = int(fm.attn[m]["W_V"].shape[0])
            readers = (T - np.arange(T)) if fm.causal else np.full(T, T)
            total += int((H * readers * per_pos).sum()) * (2 if "key" in head_inputs else 1)
            if "query" in head_inputs:
                total += int(H * per_pos.sum())
        upto_mid = counts[: ResidualLocation.resid_mid(m) + 1]
        total += int((upto_mid.sum(0) if local else np.full(T, upto_mid.sum())).sum())
    return total


def check_component_edge_bound(col: Collected, head_inputs: tuple[str, ...] = ("value",)) -> None:
    """Refuse a graph whose component edges could exceed :data:`MAX_COMPONENT_EDGES`."""
    bound = component_edge_bound(col, head_inputs)
    if bound > MAX_COMPONENT_EDGES:
        raise AttributionError(
            f"graph.component_inputs: up to {bound:,} edges into head and MLP nodes (the limit is "
            f"{MAX_COMPONENT_EDGES:,}: a head at each position reads every earlier position); use a shorter prompt, "
            "heads on fewer layers (attention: {layer: heads}), fewer head_inputs, or component_inputs: false")


def _slopes_and_offsets(adapter, lin, layer: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position and neuron, the frozen MLP's ``post = r * (W_in . N2(x)) + c``: ``(r, c)``,
    each ``(pos, d_mlp)``.  Gated: ``r`` = act(gate), ``c`` = b_in (TransformerLens adds b_in after
    the product).  Otherwise ``r`` = act(pre) / pre (0 where pre is 0, where act is 0 too) and
    ``c = r * b_in``."""
    w = adapter.mlp_weights(layer)
    b_in = w["b_in"].to(device=device, dtype=dtype)
    pre = lin.mlp_pre[layer].to(device=device, dtype=dtype)
    if adapter.facts.gated_mlp:
        r = adapter.mlp_act_fn(layer)(pre)
        return r, b_in.expand_as(r)
    post = lin.mlp_post[layer].to(device=device, dtype=dtype)
    r = torch.where(pre != 0, post / torch.where(pre != 0, pre, torch.ones_like(pre)), torch.zeros_like(pre))
    return r, r * b_in


class _FrozenMlp:
    """The MLP of one layer with its neurons' slopes frozen: its transpose and its own constant."""

    def __init__(self, adapter, lin, fm: FrozenLinearModel, layer: int, min_pos: int):
        dtype, device = fm.dtype, fm.device
        w = adapter.mlp_weights(layer)
        self.W_in = w["W_in"].to(device=device, dtype=dtype)  # (D, d_mlp)
        self.W_out = w["W_out"].to(device=device, dtype=dtype)  # (d_mlp, D)
        self.b_out = w["b_out"].to(device=device, dtype=dtype)
        r, c = _slopes_and_offsets(adapter, lin, layer, dtype, device)
        self.r, self.c = r.clone(), c.clone()
        # positions below ``min_pos`` (BOS) write a constant MLP output (the graph's convention,
        # graph.bos_nodes false): nothing passes through the MLP there
        self.r[:min_pos] = 0.0
        self.c[:min_pos] = 0.0
        self.ln2 = fm.ln2[layer]
        self.post = fm.ln2_post[layer] if fm.ln2_post is not None else None

    def output_gradient(self, G: torch.Tensor) -> torch.Tensor:
        """``G (T, D)`` where the MLP writes -> the gradient at the MLP's raw output (before a post-norm)."""
        return G if self.post is None else self.post.transpose(G, slice(0, G.shape[0]))

    def transpose(self, G: torch.Tensor) -> torch.Tensor:
        """``G (T, D)`` where the MLP writes -> the gradient at the residual it reads, through it."""
        u = (self.output_gradient(G) @ self.W_out.T) * self.r[: G.shape[0]]  # (T, d_mlp)
        return self.ln2.transpose(u @ self.W_in.T, slice(0, G.shape[0]))

    def own_constant(self, G: torch.Tensor) -> torch.Tensor:
        """``(T,)``: the part of ``MLP(x) . G`` that does not depend on ``x``."""
        Gp = self.output_gradient(G)
        u = Gp @ self.W_out.T  # (T, d_mlp)
        lin_const = self.ln2.reader_constant(self.W_in.T) if self.ln2.beta is not None else 0.0  # (d_mlp,)
        out = ((self.r[: G.shape[0]] * lin_const + self.c[: G.shape[0]]) * u).sum(-1) + Gp @ self.b_out
        if self.post is not None and self.post.beta is not None:
            out = out + G @ self.post.beta
        return out


def _full_frozen_model(col: Collected) -> FrozenLinearModel:
    """The frozen model with every attention layer passed through (heads that are nodes too)."""
    fm = col.frozen
    modes = {l: "frozen" for l in range(fm.n_layers)}
    return FrozenLinearModel(fm.adapter, fm.lin, attention_modes=modes, skip_layers={}, dtype=fm.dtype,
                             device=fm.device)


def total_effect_gradients(col: Collected, full: FrozenLinearModel | None = None, *, min_mlp_pos: int = 1
                           ) -> list[torch.Tensor]:
    """``G[loc] (pos, d_model)``: the gradient of ``sum_k w_k pre_k`` over the graph's targets with
    respect to the residual stream at every location, in the frozen model with everything passed
    through (attention with frozen patterns, MLPs with frozen neuron slopes, frozen norms); an MLP's
    output at positions below ``min_mlp_pos`` (the BOS position unless ``graph.bos_nodes``) is a
    constant, as in the graph."""
    fm = full if full is not None else _full_frozen_model(col)
    adapter, lin = fm.adapter, fm.lin
    L, T = fm.n_layers, fm.n_pos
    D = adapter.facts.d_model
    row_of = {col.nodes[r].id: i for i, r in enumerate(col.readers.rows)}
    inject: dict[int, list[tuple[int, torch.Tensor]]] = {}
    for node_id, weight in col.targets:
        i = row_of[node_id]
        g = col.readers.direction(i).to(device=fm.device, dtype=fm.dtype)
        inject.setdefault(col.readers.locs[i], []).append((col.readers.positions[i], float(weight) * g))
    G = torch.zeros(T, D, dtype=fm.dtype, device=fm.device)
    out: list[torch.Tensor] = [G] * ResidualLocation.count(L)
    mlps = {l: _FrozenMlp(adapter, lin, fm, l, min_mlp_pos) for l in range(L)} if not adapter.facts.attn_only else {}
    G_post: torch.Tensor | None = None
    for loc in map(ResidualLocation, range(ResidualLocation.resid_post(L - 1), -1, -1)):
        for t, g in inject.get(loc, []):
            G[t] += g
        out[loc] = G.clone()
        if loc == 0:
            break
        layer = loc.layer
        if loc.sublayer == "mlp":  # resid_post(l) -> resid_mid(l): through the MLP
            G_post = G.clone()
            if layer in mlps and not fm.parallel:
                G = G + mlps[layer].transpose(G_post)
        else:  # resid_mid(l) -> resid_pre(l): through attention (and a parallel block's MLP)
            below = fm.attention_transpose(layer, G[None])[0] + G
            if layer in mlps and fm.parallel:
                below = below + mlps[layer].transpose(G_post)
            G = below
    return out


def _paths_stay_at_their_position(col: Collected) -> bool:
    """True when the frozen model between nodes is the residual stream alone: every attention layer
    a layer of head nodes and no skip path (then the engine's transposes are identities)."""
    fm = col.frozen
    return all(m == "heads" for m in fm.attention_modes.values()) and not fm.skip and not col.multi_location_writers


class _PositionWriters:
    """Every writer's output vector grouped by position, in location order, and the constant
    writers' prefix sums over locations: what :func:`_local_edges` multiplies (made once per graph)."""

    def __init__(self, col: Collected, device: torch.device):
        T = col.frozen.n_pos
        per: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {p: [] for p in range(T)}
        for loc in sorted(col.writers.blocks):
            block = col.writers.blocks[loc]
            table = block.slot_table(device)
            for g, p in enumerate(table.positions):
                lo, hi = table.group_starts[g], table.group_starts[g + 1]
                per[p].append((loc, block.slot_vectors(table, lo, hi), table.node_rows[lo:hi]))
        self.vectors, self.rows, self.locs = {}, {}, {}
        for p, items in per.items():
            if items:
                self.vectors[p] = torch.cat([v for _, v, _ in items])
                self.rows[p] = torch.cat([r for _, _, r in items]).cpu().numpy().astype(np.int64)
                self.locs[p] = np.concatenate([np.full(len(r), loc) for loc, _, r in items])
        locs = sorted(col.constants)
        self.constant_prefix = torch.stack([col.constants[l] for l in locs]).cumsum(0)  # (n_locs, T, D)


def _local_edges(col: Collected, location: int, positions: list[int], dirs: torch.Tensor,
                 own: torch.Tensor, writers: _PositionWriters) -> DirectionEdges:
    """The engine's edges into ad-hoc readers when every path between nodes stays at its position
    (:func:`_paths_stay_at_their_position`): reader ``i`` at ``(location, positions[i])`` meets each
    writer at its position and a location ``<= location`` with ``direction . output`` (the residual
    stream's transpose is the identity), and the constant writers there with ``direction . c``."""
    pos = torch.as_tensor(positions, dtype=torch.long)
    reader_parts: list[np.ndarray] = []
    writer_parts: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for p in sorted(set(positions)):
        if p not in writers.vectors:
            continue
        idx = (pos == p).nonzero().flatten()
        k = int(np.searchsorted(writers.locs[p], location, side="right"))
        if k == 0:
            continue
        E = (dirs[idx] @ writers.vectors[p][:k].T).to(torch.float64)  # (n, k)
        reader_parts.append(np.repeat(idx.numpy(), k))
        writer_parts.append(np.tile(writers.rows[p][:k], len(idx)))
        weights.append(E.cpu().numpy().reshape(-1))
    from_constants = (dirs * writers.constant_prefix[location][pos]).sum(-1).to(torch.float64)
    constants = [{-1: float(o), location: float(c)} for o, c in zip(own.tolist(), from_constants.tolist(), strict=False)]
    if weights:
        reader = np.concatenate(reader_parts)
        rows = np.concatenate(writer_parts)
        weight = np.concatenate(weights)
        nz = weight != 0
        reader, rows, weight = reader[nz], rows[nz], weight[nz]
    else:
        reader = rows = np.zeros(0, dtype=np.int64)
        weight = np.zeros(0)
    uniq, writer = np.unique(rows, return_inverse=True)
    return DirectionEdges(reader.astype(np.int64), writer.astype(np.int64).reshape(-1),
                          [col.nodes[r].id for r in uniq.tolist()], weight, constants)


def _graph_row(node: NodeId, index: dict[NodeId, int]) -> int:
    """The graph row that carries writer ``node``'s edges: itself, or the remainder it was folded into."""
    row = index.get(node)
    if row is not None:
        return row
    folded = {"feature": "features", "neuron": "neurons"}.get(node.kind)
    if folded is not None:
        row = index.get(NodeId("remainder", node.layer, node.position, REMAINDER_INDEX[folded]))
        if row is not None:
            return row
    raise AttributionError(f"component inputs: writer {node} is not in the graph and was not folded into a "
                           "remainder node; this is a bug, please report it")


@torch.no_grad()
def component_inputs(col: Collected, index: dict[NodeId, int], *, min_mlp_pos: int = 1,
                     batch_size: int = 256, position_local: bool | None = None,
                     head_inputs: tuple[str, ...] = ("value",)) -> ComponentInputs:
    """The edges into every head node and whole-MLP node of ``col`` (module docstring), as rows of
    the graph whose node index is ``index`` (node id -> row).

    ``position_local``: compute the edges as plain dot products with the writers at the reader's
    position (:func:`_local_edges`), which is what the engine's sweep computes when no path between
    two nodes leaves its position (every attention layer is heads, no skip path); None: whenever
    that holds.  The engine's sweep otherwise.  ``head_inputs``: the edge kinds into heads; "query"
    and "key" add the linearised edges (module docstring), returned apart from the value edges."""
    unknown = sorted(set(head_inputs) - set(HEAD_INPUTS))
    if unknown or "value" not in head_inputs:
        raise AttributionError(f"graph.head_inputs: {list(head_inputs)} must list 'value' and may add 'query' "
                               f"and 'key' (unknown: {unknown})")
    linearised_kinds = [k for k in LINEARISED_KINDS if k in head_inputs]
    fm = col.frozen
    adapter, lin = fm.adapter, fm.lin
    L, T = fm.n_layers, fm.n_pos
    full = _full_frozen_model(col)
    G = total_effect_gradients(col, full, min_mlp_pos=min_mlp_pos)
    mlps = {l: _FrozenMlp(adapter, lin, fm, l, min_mlp_pos) for l in range(L)} if not adapter.facts.attn_only else {}
    tgt_parts, src_parts, w_parts = [], [], []
    total: dict[int, float] = {}
    constant: dict[int, float] = {}

    local = position_local if position_local is not None else _paths_stay_at_their_position(col)
    writers = _PositionWriters(col, fm.device) if local else None

    lin_parts: dict[str, tuple[list, list, list]] = {k: ([], [], []) for k in linearised_kinds}
    lin_constant: dict[str, dict[int, float]] = {k: {} for k in linearised_kinds}
    lin_total: dict[str, dict[int, float]] = {k: {} for k in linearised_kinds}

    def sweep(location: int, rows: list[int], positions: list[int], dirs: torch.Tensor, own: torch.Tensor,
              kind: str = "value") -> None:
        """Readers ``i`` of component rows ``rows[i]``: edges summed per (component, writer)."""
        if local:
            edges = _local_edges(col, location, positions, dirs, own, writers)
        else:
            edges = attribute_directions(col, location, positions, dirs, own.tolist(), batch_size=batch_size)
        rows_np = np.asarray(rows, dtype=np.int64)
        writer_rows = np.array([_graph_row(n, index) for n in edges.writer_ids], dtype=np.int64)
        parts_t, parts_s, parts_w = (tgt_parts, src_parts, w_parts) if kind == "value" else lin_parts[kind]
        const = constant if kind == "value" else lin_constant[kind]
        parts_t.append(rows_np[edges.reader])
        parts_s.append(writer_rows[edges.writer])
        parts_w.append(edges.weight.astype(np.float64))
        for r, parts in zip(rows, edges.constants, strict=False):
            const[r] = const.get(r, 0.0) + float(sum(parts.values()))

    for layer in range(L):
        if fm.attention_modes[layer] == "heads":
            w = fm.attn[layer]
            W_V, W_O, b_V = w["W_V"], w["W_O"], w["b_V"]  # (H, D, dh), (H, dh, D), (H, dh)
            H = W_V.shape[0]
            Gm = G[int(ResidualLocation.resid_mid(layer))]
            Gp = Gm if fm.ln1_post is None else fm.ln1_post[layer].transpose(Gm, slice(0, T))
            u = torch.einsum("hkd,td->thk", W_O, Gp)  # (T, H, dh): W_O^h G'(t)
            raw = torch.einsum("hDk,thk->thD", W_V, u)  # (T, H, D): W_V^h W_O^h G'(t)
            ln1 = fm.ln1[layer]
            read = ln1.reader_direction(raw)  # P(gamma1 * .), before 1/sigma1(s)
            beta = ln1.beta if ln1.beta is not None else torch.zeros(W_V.shape[1], dtype=fm.dtype, device=fm.device)
            own_ts = (torch.einsum("D,hDk->hk", beta, W_V) + b_V)  # (H, dh)
            own_th = torch.einsum("hk,thk->th", own_ts, u)  # (T, H)
            z = lin.z[layer].to(device=fm.device, dtype=fm.dtype)  # (T, H, dh)
            heads = torch.einsum("thk,hkd->thd", z, W_O)  # (T, H, D)
            if fm.ln1_post is not None:
                heads = fm.ln1_post[layer].forward_linear(heads.transpose(0, 1), slice(0, T)).transpose(0, 1)
            A = fm.pattern(layer, T)  # (H, t, s)
            rows, positions, dirs, own = [], [], [], []
            sigma = ln1.sigma[:T]
            for t in range(T):
                sources = range(t + 1) if fm.causal else range(T)
                for h in range(H):
                    row = index.get(NodeId("attention_head", layer, t, h))
                    if row is None:
                        continue
                    total[row] = float(heads[t, h].to(torch.float64) @ Gm[t].to(torch.float64))
                    constant[row] = 0.0
                    for s in sources:
                        rows.append(row)
                        positions.append(s)
                        dirs.append(A[h, t, s] * read[t, h] / sigma[s])
                        own.append(A[h, t, s] * own_th[t, h])
            if rows:
                sweep(int(ResidualLocation.resid_pre(layer)), rows, positions, torch.stack(dirs), torch.stack(own))
            if linearised_kinds:
                for kind, (k_rows, k_pos, k_dirs, k_own, k_total) in _qk_readers(
                        col, index, layer, read, own_th, A, linearised_kinds).items():
                    for row, value in k_total.items():
                        lin_total[kind][row] = value
                        lin_constant[kind][row] = 0.0
                    if k_rows:
                        sweep(int(ResidualLocation.resid_pre(layer)), k_rows, k_pos, torch.stack(k_dirs), torch.stack(k_own), kind)
        if layer in mlps:
            mlp = mlps[layer]
            Gpost = G[int(ResidualLocation.resid_post(layer))]
            read_raw = ((mlp.output_gradient(Gpost) @ mlp.W_out.T) * mlp.r[:T]) @ mlp.W_in.T  # (T, D)
            dirs_all = mlp.ln2.transpose(read_raw, slice(0, T))
            own_all = mlp.own_constant(Gpost)
            out = lin.mlp_out[layer].to(device=fm.device, dtype=fm.dtype)
            rows, positions = [], []
            for t in range(T):
                row = index.get(NodeId("mlp", layer, t, 0))
                if row is None:
                    continue
                rows.append(row)
                positions.append(t)
                total[row] = float(out[t].to(torch.float64) @ Gpost[t].to(torch.float64))
                constant[row] = 0.0
            if rows:
                sweep(int(fm.mlp_input_location(layer)), rows, positions, dirs_all[positions], own_all[positions])
    n = len(col.nodes) + 1
    if tgt_parts:
        t_all, s_all, w_all = np.concatenate(tgt_parts), np.concatenate(src_parts), np.concatenate(w_parts)
        n = max(n, int(max(t_all.max(initial=0), s_all.max(initial=0))) + 1, len(index))
        t_all, s_all, w_all, _ = merge_edges(t_all, s_all, w_all, n, drop_zeros=True)
    else:
        t_all = s_all = np.zeros(0, dtype=np.int64)
        w_all = np.zeros(0)
    linearised = {}
    for kind, (pt, ps, pw) in lin_parts.items():
        if pt:
            lt, ls, lw, _ = merge_edges(np.concatenate(pt), np.concatenate(ps), np.concatenate(pw), n, drop_zeros=True)
        else:
            lt = ls = np.zeros(0, dtype=np.int64)
            lw = np.zeros(0)
        linearised[kind] = (lt.astype(np.int64), ls.astype(np.int64), lw.astype(np.float64))
    return ComponentInputs(t_all.astype(np.int64), s_all.astype(np.int64), w_all.astype(np.float64), total, constant,
                           linearised if linearised_kinds else None, lin_constant if linearised_kinds else None,
                           lin_total if linearised_kinds else None)


def _qk_readers(col: Collected, index: dict[NodeId, int], layer: int, read: torch.Tensor, own_th: torch.Tensor,
                A: torch.Tensor, kinds: list[str]) -> dict[str, tuple[list, list, list, list, dict[int, float]]]:
    """The linearised query and key readers of the head nodes of ``layer`` (module docstring):
    ``kind -> (rows, positions, directions, own constants, {row: sum_s dT/da_s a_s})``.

    ``read (T, H, D)`` and ``own_th (T, H)`` are the value readers before ``A / sigma1``: the value
    of source ``s`` against the gradient at destination ``t`` is
    ``e[t, h, s] = read[t, h] . x(s) / sigma1(s) + own_th[t, h]``."""
    fm = col.frozen
    adapter, lin = fm.adapter, fm.lin
    T, H = fm.n_pos, read.shape[1]
    x = lin.resid_pre[layer][:T].to(device=fm.device, dtype=fm.dtype)  # (T, D): the residual the head reads
    sigma = fm.ln1[layer].sigma[:T]
    e = torch.einsum("thD,sD->ths", read, x / sigma[:, None]) + own_th[:, :, None]  # (T, H, s)
    qk = QKReaders(adapter, lin, layer, fm.dtype, fm.device, error=AttributionError)
    cap = adapter.facts.attn_scores_soft_cap
    out: dict[str, tuple[list, list, list, list, dict[int, float]]] = {k: ([], [], [], [], {}) for k in kinds}
    for h in range(H):
        heads_here = [t for t in range(T) if NodeId("attention_head", layer, t, h) in index]
        if not heads_here:
            continue
        q_read = [qk.side("q", h, t) for t in range(T)]
        k_read = [qk.side("k", h, t) for t in range(T)]
        q = torch.stack([d @ x[t] + c for t, (d, c) in enumerate(q_read)])  # (T, dh)
        k = torch.stack([d @ x[t] + c for t, (d, c) in enumerate(k_read)])
        score = q @ k.T / qk.scale  # (t, s): pre-softmax, before a soft-cap
        slope = torch.ones_like(score) if not cap else 1.0 - torch.tanh(score / cap) ** 2
        a_h = A[h, :T, :T]
        total = (a_h * e[:, h, :]).sum(-1, keepdim=True)  # (t, 1): the head's total effect
        g = a_h * (e[:, h, :] - total) * slope  # (t, s): dT/d(pre-cap score)
        for t in heads_here:
            row = index[NodeId("attention_head", layer, t, h)]
            euler = float((g[t].to(torch.float64) * score[t].to(torch.float64)).sum())
            if "query" in out:
                rows, positions, dirs, own, tot = out["query"]
                dq = (g[t] @ k) / qk.scale  # (dh,): dT/dq(t)
                d, c = q_read[t]
                rows.append(row)
                positions.append(t)
                dirs.append(dq @ d)
                own.append(dq @ c)
                tot[row] = euler
            if "key" in out:
                rows, positions, dirs, own, tot = out["key"]
                sources = range(t + 1) if fm.causal else range(T)
                for s in sources:
                    if g[t, s] == 0:
                        continue
                    dk = g[t, s] * q[t] / qk.scale  # (dh,): dT/dk(s)
                    d, c = k_read[s]
                    rows.append(row)
                    positions.append(s)
                    dirs.append(dk @ d)
                    own.append(dk @ c)
                tot[row] = euler
    return out
