"""Head and whole-MLP nodes with inputs (graph.component_inputs): every edge into them is path
patching of the frozen model, recomputed here with TransformerLens hooks and modules only (the
model's own norms, weights and cache; no engine vector), in float64; the total-effect identity and
the flow identity (a component's total effect = the sum of its outgoing edges) on every graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution.build import attribute
from circuitgraph.attribution.linearisation import frozen, linearise
from circuitgraph.attribution.targets import ResolvedTarget
from circuitgraph.errors import AttributionError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.testing.synthetic import tiny_model
from tests.helpers.bundles import VARIANTS

#: the variants whose logits are the targets' readout (no logit soft-cap) and whose MLP output is
#: the MLP's own (no post-norm): the hook reference below reads both directly
CASES = ["ln-gelu-learned", "ln-gated-rotary", "rms-gelu-learned", "rms-gated-rotary-gqa", "lnpre-relu-rotary",
         "none-relu-learned", "ln-attnonly-rotary"]
TOKENS = [1, 5, 7, 2, 9, 4, 11]
A_TOK, B_TOK = 3, 8


#: a soft-capped attention score without post-norms (the hook reference reads outputs directly)
EXTRA = {"rms-gated-rotary-gqa-softcap": dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2,
                                              attn_soft_cap=2.0)}


def _graph(variant: str, **kw):
    model = tiny_model(seed=1, n_layers=3, **{**VARIANTS, **EXTRA}[variant]).to(torch.float64)
    adapter = ModelAdapter(model)
    target = ResolvedTarget("logit_diff", position=len(TOKENS) - 1, tokens=(A_TOK, B_TOK))
    g = attribute(adapter, TOKENS, targets=[target], mlp=kw.pop("mlp", "mlp"), attention="heads",
                  dtype=torch.float64, component_inputs=True, **kw)
    return model, adapter, g


def _frozen_slopes(adapter, lin):
    """Hooks that make every MLP linear at its neurons' frozen slopes (TransformerLens names):
    GELU/ReLU ``post = (act(pre0) / pre0) * pre``; gated ``post = act(gate0) * linear + b_in``."""
    hooks, seen = [], {}
    m = adapter.model
    for l in range(adapter.facts.n_layers):
        if adapter.facts.attn_only:
            break
        pre0, post0 = lin.mlp_pre[l], lin.mlp_post[l]
        if adapter.facts.gated_mlp:
            gate = m.blocks[l].mlp.act_fn(pre0)

            def keep(x, hook, l=l):
                seen[l] = x
                return x

            def post(x, hook, l=l, gate=gate, post0=post0):
                out = gate[None, : x.shape[1]] * seen[l] + m.blocks[l].mlp.b_in
                out[:, 0] = post0[0]  # the BOS position's MLP output is a constant of the graph
                return out

            hooks += [(f"blocks.{l}.mlp.hook_pre_linear", keep), (f"blocks.{l}.mlp.hook_post", post)]
        else:
            ratio = torch.where(pre0 != 0, post0 / torch.where(pre0 != 0, pre0, 1.0), 0.0)

            def keep(x, hook, l=l):
                seen[l] = x
                return x

            def post(x, hook, l=l, ratio=ratio, post0=post0):
                out = ratio[None, : x.shape[1]] * seen[l]
                out[:, 0] = post0[0]  # the BOS position's MLP output is a constant of the graph
                return out

            hooks += [(f"blocks.{l}.mlp.hook_pre", keep), (f"blocks.{l}.mlp.hook_post", post)]
    return hooks


def _logit_diff(logits, a: int = A_TOK, b: int = B_TOK):
    return logits[:, -1, a] - logits[:, -1, b]


def _writer_vectors(model, cache, g):
    """Every writer node of the graph and its output vector, from the model's cache and weights."""
    out = {}
    for n in g.nodes:
        nid = n.id
        if nid.kind == "embedding":
            out[nid] = cache["hook_embed"][0, nid.position]
        elif nid.kind == "attention_head":
            W_O = model.blocks[nid.layer].attn.W_O[nid.index]
            out[nid] = cache[f"blocks.{nid.layer}.attn.hook_z"][0, nid.position, nid.index] @ W_O
        elif nid.kind == "mlp":
            out[nid] = cache[f"blocks.{nid.layer}.hook_mlp_out"][0, nid.position]
    return out


def _patched_head(model, adapter, lin, head: NodeId, removed: torch.Tensor, extra, tokens=TOKENS, ab=(A_TOK, B_TOK)):
    """Targets with ``removed[b] (T, d_model)`` taken out of ``head``'s value input only."""
    m, t, h = head.layer, head.position, head.index
    B = removed.shape[0]
    x = lin.resid_pre[m][None].expand(B, -1, -1) - removed
    attn = model.blocks[m].attn
    A = lin.patterns[m][h, t]  # (T,)

    def patch_z(z, hook):
        z = z.clone()
        normed = model.blocks[m].ln1(x)  # the model's own norm, its sigma frozen by the hooks
        v = normed @ attn.W_V[h] + attn.b_V[h]  # (B, T, d_head)
        z[:, t, h] = torch.einsum("s,bsk->bk", A, v)
        return z

    with frozen(adapter, lin, extra_hooks=extra + [(f"blocks.{m}.attn.hook_z", patch_z)]) as fm:
        return _logit_diff(fm(torch.tensor([tokens] * B)), *ab)


def _patched_mlp(model, adapter, lin, node: NodeId, removed: torch.Tensor, extra, slopes):
    """Targets with ``removed[b] (d_model,)`` taken out of MLP ``node``'s input at its position only."""
    m, t = node.layer, node.position
    B = removed.shape[0]
    mlp = model.blocks[m].mlp
    x = lin.resid_mid[m][None, t : t + 1].expand(B, -1, -1) - removed[:, None]

    def patch_post(post, hook):
        post = post.clone()
        normed = _ln2_at(model, m, x, t)
        r, c = slopes[m]
        post[:, t] = r[t] * (normed[:, 0] @ mlp.W_in) + c[t]
        return post

    with frozen(adapter, lin, extra_hooks=extra + [(f"blocks.{m}.mlp.hook_post", patch_post)]) as fm:
        return _logit_diff(fm(torch.tensor([TOKENS] * B)))


def _ln2_at(model, m, x, t):
    """ln2 of ``x (B, 1, d_model)`` at position ``t`` with the frozen sigma: the module sees a
    prompt-length input (its frozen-scale hook expands over positions) and ``t``'s row is read."""
    B = x.shape[0]
    T = len(TOKENS)
    full = torch.zeros(B, T, x.shape[-1], dtype=x.dtype)
    full[:, t] = x[:, 0]
    return model.blocks[m].ln2(full)[:, t : t + 1]


def _slopes(adapter, lin):
    """Per layer ``(r, c) (T, d_mlp)``: the frozen MLP's ``post = r * (W_in . N2) + c`` from the cache."""
    out = {}
    for l in range(adapter.facts.n_layers):
        mlp = adapter.model.blocks[l].mlp
        pre, post = lin.mlp_pre[l], lin.mlp_post[l]
        if adapter.facts.gated_mlp:
            out[l] = (mlp.act_fn(pre), mlp.b_in.expand_as(pre))
        else:
            r = torch.where(pre != 0, post / torch.where(pre != 0, pre, 1.0), 0.0)
            out[l] = (r, r * mlp.b_in)
    return out


@pytest.mark.parametrize("variant", CASES)
@torch.no_grad()
def test_edges_into_components_are_path_patching(variant):
    model, adapter, g = _graph(variant)
    lin = linearise(adapter, torch.tensor(TOKENS))
    _, cache = model.run_with_cache(torch.tensor([TOKENS]))
    writers = _writer_vectors(model, cache, g)
    extra = _frozen_slopes(adapter, lin)
    with frozen(adapter, lin, extra_hooks=extra) as fm:
        clean = float(_logit_diff(fm(torch.tensor([TOKENS])))[0])
    target = g.node(g.targets[0][0])
    assert abs(clean - target.pre_activation) < 1e-10  # the frozen model reproduces the target
    ids = list(writers)
    T = len(TOKENS)
    checked = 0
    largest = 0.0
    worst = 0.0
    L = adapter.facts.n_layers
    # heads in the last two layers (the first layer's inputs are embeddings only) at three positions
    comps = [NodeId("attention_head", l, t, h) for l in range(1, L) for t in (2, T - 2, T - 1)
             for h in range(model.cfg.n_heads)]
    if not adapter.facts.attn_only:
        comps += [NodeId("mlp", l, t, 0) for l in range(L) for t in (1, T - 1)]
    slopes = _slopes(adapter, lin) if not adapter.facts.attn_only else {}
    for comp in comps:
        row = g.index_of(comp)
        loc_order = (2 * comp.layer) if comp.kind == "attention_head" else (2 * comp.layer + 1)
        before = [w for w in ids if _writes_at(w) <= loc_order and (comp.kind == "attention_head" or
                                                                   w.position == comp.position)]
        if comp.kind == "attention_head":
            removed = torch.zeros(len(before), T, model.cfg.d_model, dtype=torch.float64)
            for b, w in enumerate(before):
                removed[b, w.position] = writers[w]
            patched = _patched_head(model, adapter, lin, comp, removed, extra)
        else:
            removed = torch.stack([writers[w] for w in before])
            patched = _patched_mlp(model, adapter, lin, comp, removed, extra, slopes)
        expected = clean - patched.numpy()
        got = np.array([g.edge_weight_between(w, comp) for w in before])
        largest = max(largest, float(np.abs(expected).max()))
        worst = max(worst, float(np.abs(got - expected).max()))
        checked += len(before)
        # every edge into the component is one of these writers'
        sources = {g.nodes[s].id for s, t in zip(g.edge_source, g.edge_target, strict=False) if t == row}
        assert sources <= set(before), sources - set(before)
    assert largest > 1e-3 and checked > 50
    assert worst <= 1e-9 * largest, (worst, largest)


def _writes_at(node: NodeId) -> int:
    """The residual location a writer writes at: 0 embeddings, 2l+1 heads, 2l+2 MLPs."""
    return {"embedding": 0, "attention_head": 2 * node.layer + 1, "mlp": 2 * node.layer + 2}[node.kind]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_total_effect_identity_and_flow(variant):
    """total effect = incoming edges + constant (the completeness check) on every variant; and,
    with every component a node with inputs, a component's total effect is the sum of its
    outgoing edges (into the targets and into later components)."""
    _, _, g = _graph(variant)
    report = g.check_completeness()
    assert report.max_violation < 1e-10, report
    comps = [i for i, n in enumerate(g.nodes) if n.kind in ("attention_head", "mlp")]
    assert all(g.nodes[i].constant is not None for i in comps)
    out = np.zeros(g.n_nodes)
    np.add.at(out, g.edge_source, g.edge_weight)
    for i in comps:
        T_i = g.nodes[i].pre_activation
        assert abs(out[i] - T_i) <= 1e-10 * max(1.0, abs(T_i)), (g.nodes[i].id, out[i], T_i)


def test_off_by_default_and_transcoders_refused(tmp_path):
    model = tiny_model(seed=1, n_layers=2, **VARIANTS["ln-gelu-learned"])
    adapter = ModelAdapter(model)
    g = attribute(adapter, TOKENS, mlp="mlp", attention="heads")
    heads = {g.index_of(n.id) for n in g.nodes if n.kind == "attention_head"}
    assert not (set(g.edge_target.tolist()) & heads)
    assert all(n.pre_activation is None for n in g.nodes if n.kind == "attention_head")
    with pytest.raises(AttributionError, match="transcoders"):
        attribute(adapter, TOKENS, mlp={0: "transcoders", 1: "mlp"}, attention="heads", component_inputs=True)


def test_neuron_graphs_keep_the_identity():
    """With neurons as nodes the heads' total effects still split exactly over their inputs."""
    _, _, g = _graph("ln-gelu-learned", mlp="neurons")
    assert g.check_completeness().max_violation < 1e-10
    heads = [n for n in g.nodes if n.kind == "attention_head"]
    assert heads and all(n.pre_activation is not None for n in heads)


@pytest.mark.parametrize("variant", ["rms-gated-rotary-gqa", "rms-gated-postnorm-softcap", "none-relu-bidirectional"])
def test_position_local_edges_equal_the_engine_sweep(variant):
    """With every attention layer as heads no path between nodes leaves its position, and the
    component edges are plain dot products (``_local_edges``); they equal the engine's sweep."""
    _, _, g = _graph(variant)
    fast = g.context.component_inputs(position_local=True)
    slow = g.context.component_inputs(position_local=False)
    np.testing.assert_array_equal(fast.target, slow.target)
    np.testing.assert_array_equal(fast.source, slow.source)
    np.testing.assert_allclose(fast.weight, slow.weight, rtol=1e-12, atol=1e-14 * np.abs(slow.weight).max())
    for row, c in slow.constant.items():
        assert fast.constant[row] == pytest.approx(c, rel=1e-10, abs=1e-12)


def test_mixed_attention_modes_keep_the_identities():
    """A frozen attention layer below head nodes: the edges go through the engine's sweep (paths
    cross positions through the frozen pattern); both identities still hold."""
    model = tiny_model(seed=1, n_layers=3, **VARIANTS["ln-gelu-learned"]).to(torch.float64)
    adapter = ModelAdapter(model)
    target = ResolvedTarget("logit_diff", position=len(TOKENS) - 1, tokens=(A_TOK, B_TOK))
    g = attribute(adapter, TOKENS, targets=[target], mlp="mlp", attention={0: "frozen", 1: "heads", 2: "heads"},
                  dtype=torch.float64, component_inputs=True)
    assert g.check_completeness().max_violation < 1e-10
    # a head whose output reaches the targets (non-zero total effect) has incoming edges
    heads = [i for i, n in enumerate(g.nodes) if n.kind == "attention_head" and n.pre_activation != 0]
    into = set(g.edge_target.tolist())
    assert heads and all(i in into for i in heads)


def test_pipeline_queries_and_exports_handle_component_inputs(tmp_path):
    """A spec run on the demo model with head and MLP nodes with inputs: pruning, influence,
    top_paths, the JSON round trip (the identity kept), the diagram, Neuronpedia and the
    explorer's graph API all take it."""
    import json

    import circuitgraph
    from circuitgraph.export.json_graph import graph_from_json

    spec = {"format_version": 1, "model": {"builtin": "demo"},
            "prompt": "mia saw the owl in the park . later she wants",
            "targets": [{"logit_diff": [" an", " a"]}],
            "graph": {"mlp": "mlp", "attention": "heads", "component_inputs": True},
            "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
            "queries": [{"scores": {}}, {"top_paths": {"source": {"kind": "embedding"}, "k": 5}}],
            "export": {"json": str(tmp_path / "g.json"), "neuronpedia": str(tmp_path / "np.json"),
                       "svg": str(tmp_path / "g.svg")}}
    result = circuitgraph.run(spec)
    assert not result.failures
    full = result.full_graph
    assert full.check_completeness().ok()
    heads = [n for n in full.nodes if n.kind == "attention_head"]
    assert all(n.pre_activation is not None and "total_effect" in n.attrs for n in heads)
    # edges into heads survive pruning and reach the files
    pruned = result.graph
    kinds = {pruned.nodes[t].kind for t in pruned.edge_target.tolist()}
    assert "attention_head" in kinds or "mlp" in kinds
    back = graph_from_json((tmp_path / "g.json").read_text())
    assert back.check_completeness().ok()
    paths = result.queries[1]["result"].to_dict()
    assert paths["paths"]
    npj = json.loads((tmp_path / "np.json").read_text())
    assert npj["links"] and (tmp_path / "g.svg").stat().st_size > 0
    # the explorer's API over the graph file: the view and a head node's inputs
    from circuitgraph.serve.api import Explorer
    from circuitgraph.serve.catalog import Catalog

    explorer = Explorer(Catalog(tmp_path))
    (name,) = [n for n in explorer.catalog.graphs if n.endswith("g.json")]
    view = explorer.graph_view(name, {})
    assert view["nodes"]
    head = max((n for n in full.nodes if n.kind == "attention_head"), key=lambda n: abs(n.pre_activation))
    info = explorer.node(name, str(head.id), {"node_threshold": ["1"], "edge_threshold": ["1"]})
    assert info["n_inputs"] > 0 and info["inputs"]
    assert info["sum_inputs"] + info["constant"] == pytest.approx(info["pre_activation"], rel=1e-4, abs=1e-6)


@pytest.mark.real
@torch.no_grad()
def test_real_model_head_edges_are_frozen_path_patching(smollm2_dir):
    """SmolLM2-135M-Instruct in float64 on a short IOI prompt: every edge into the final position's
    strongest head equals path patching of the frozen model by hooks (<= 1e-9 of the largest), and
    the total-effect identity holds."""
    from circuitgraph.adapters.loading import load_model_dir

    adapter = load_model_dir(smollm2_dir, dtype="float64")
    model = adapter.model
    tok = adapter.tokenizer
    tokens = tok.encode("When Mary and John went out, John gave it to")
    a, b = tok.encode(" Mary")[-1], tok.encode(" John")[-1]
    target = ResolvedTarget("logit_diff", position=len(tokens) - 1, tokens=(a, b))
    g = attribute(adapter, tokens, targets=[target], mlp="mlp", attention="heads", dtype=torch.float64,
                  component_inputs=True, head_inputs=("value", "query", "key"))
    assert g.check_completeness().max_violation < 1e-9
    assert g.linearised_edges.max_violation() < 1e-9
    lin = linearise(adapter, torch.tensor(tokens))
    _, cache = model.run_with_cache(torch.tensor([tokens]))
    writers = _writer_vectors(model, cache, g)
    extra = _frozen_slopes(adapter, lin)
    with frozen(adapter, lin, extra_hooks=extra) as fm:
        clean = float(_logit_diff(fm(torch.tensor([tokens])), a, b)[0])
    assert abs(clean - g.node(g.targets[0][0]).pre_activation) < 1e-8
    T = len(tokens)
    last = sorted((n for n in g.nodes if n.kind == "attention_head" and n.position == T - 1),
                  key=lambda n: -abs(n.pre_activation))[:1]
    largest = worst = 0.0
    for head in last:
        before = [w for w in writers if _writes_at(w) <= 2 * head.layer]
        # the patched forwards in chunks: one batch of every writer is many GB in float64 on 30 layers
        parts = []
        for start in range(0, len(before), 128):
            chunk = before[start:start + 128]
            removed = torch.zeros(len(chunk), T, model.cfg.d_model, dtype=torch.float64)
            for i, w in enumerate(chunk):
                removed[i, w.position] = writers[w]
            parts.append(_patched_head(model, adapter, lin, head.id, removed, extra, tokens, (a, b)).numpy())
        expected = clean - np.concatenate(parts)
        got = np.array([g.edge_weight_between(w, head.id) for w in before])
        largest = max(largest, float(np.abs(expected).max()))
        worst = max(worst, float(np.abs(got - expected).max()))
    assert worst <= 1e-9 * largest, (worst, largest)
    # its linearised query and key edges: -d targets / d eps by autograd through the hooks
    le = g.linearised_edges
    row = g.index_of(last[0].id)
    for side, kind in (("q", "query"), ("k", "key")):
        grads = []
        for start in range(0, len(before), 64):
            chunk = before[start:start + 64]
            removed = torch.zeros(len(chunk), T, model.cfg.d_model, dtype=torch.float64)
            for i, w in enumerate(chunk):
                removed[i, w.position] = writers[w]
            eps = torch.zeros(len(chunk), dtype=torch.float64, requires_grad=True)
            with torch.enable_grad():
                out = _qk_patched_targets(model, adapter, lin, last[0].id, eps, removed, side, extra, tokens, (a, b))
                grads.append(-torch.autograd.grad(out.sum(), eps)[0].numpy())
        expected = np.concatenate(grads)
        m = (le.target == row) & (le.kind_names() == kind)
        by_source = dict(zip(le.source[m].tolist(), le.weight[m].tolist(), strict=True))
        got = np.array([by_source.get(g.index_of(w), 0.0) for w in before])
        assert np.abs(expected).max() > 1e-4
        assert np.abs(got - expected).max() <= 1e-9 * np.abs(expected).max(), kind


def test_component_edge_bound_refuses_with_advice(monkeypatch):
    from circuitgraph.attribution import component_inputs as ci

    _, adapter, g = _graph("ln-gelu-learned")
    into = sum(1 for t in g.edge_target.tolist() if g.nodes[t].kind in ("attention_head", "mlp"))
    assert 0 < into
    monkeypatch.setattr(ci, "MAX_COMPONENT_EDGES", 10)
    target = ResolvedTarget("logit_diff", position=len(TOKENS) - 1, tokens=(A_TOK, B_TOK))
    with pytest.raises(AttributionError, match="shorter prompt"):
        attribute(adapter, TOKENS, targets=[target], mlp="mlp", attention="heads", dtype=torch.float64,
                  component_inputs=True)


# ----------------------------------------------------------------- linearised query / key edges
QK_CASES = ["ln-gelu-learned", "rms-gated-rotary-gqa", "ln-gated-rotary", "none-relu-bidirectional",
            "rms-gated-rotary-gqa-softcap"]


def _qk_patched_targets(model, adapter, lin, head: NodeId, eps: torch.Tensor, removed: torch.Tensor, side: str,
                        extra, tokens=TOKENS, ab=(A_TOK, B_TOK)):
    """Targets (B,) with ``eps[b] * removed[b] (T, d_model)`` taken out of ``head``'s query
    (``side="q"``) or key (``"k"``) input only, in the frozen model: the head's pattern row at its
    destination recomputed from the model's own ln1 (frozen sigma), ``W_Q`` / ``W_K`` (grouped-query
    keys expanded by TransformerLens), rotary map and soft-cap; its values as on the prompt."""
    m, t, h = head.layer, head.position, head.index
    B, T = removed.shape[0], len(tokens)
    attn = model.blocks[m].attn
    clean = lin.resid_pre[m][None].expand(B, -1, -1)
    patched = clean - eps[:, None, None] * removed
    causal = model.cfg.attention_dir == "causal"

    def patch_z(z, hook):
        z = z.clone()
        xq, xk = (patched, clean) if side == "q" else (clean, patched)
        q = (model.blocks[m].ln1(xq) @ attn.W_Q[h] + attn.b_Q[h])[:, :, None]  # (B, T, 1, dh)
        k = (model.blocks[m].ln1(xk) @ attn.W_K[h] + attn.b_K[h])[:, :, None]
        if model.cfg.positional_embedding_type == "rotary":
            q, k = attn.apply_rotary(q, 0, None), attn.apply_rotary(k, 0, None)
        scores = torch.einsum("bk,bsk->bs", q[:, t, 0], k[:, :, 0]) / attn.attn_scale
        if model.cfg.attn_scores_soft_cap > 0:
            scores = model.cfg.attn_scores_soft_cap * torch.tanh(scores / model.cfg.attn_scores_soft_cap)
        if causal:
            scores = scores.masked_fill(torch.arange(T) > t, float("-inf"))
        pattern = torch.softmax(scores, -1)  # (B, T)
        v = model.blocks[m].ln1(clean) @ attn.W_V[h] + attn.b_V[h]  # (B, T, dh): values as on the prompt
        z[:, t, h] = torch.einsum("bs,bsk->bk", pattern, v)
        return z

    with frozen(adapter, lin, extra_hooks=extra + [(f"blocks.{m}.attn.hook_z", patch_z)]) as fm:
        return _logit_diff(fm(torch.tensor([tokens] * B)), *ab)


@pytest.mark.parametrize("variant", QK_CASES)
def test_query_and_key_edges_are_the_first_order_removal_effect(variant):
    """Every query / key edge into the upper layers' heads (three destinations) equals
    ``-d targets / d eps`` for removing ``eps`` times the writer's output from that head's query
    (key) input only, by autograd through TransformerLens's model with hooks in float64 (no engine
    vector); writers without an edge have a zero derivative; the value edges are unchanged."""
    model, adapter, g = _graph(variant, head_inputs=("value", "query", "key"))
    _, _, g_value = _graph(variant)
    _check_qk_edges(model, adapter, g, g_value)


def _check_qk_edges(model, adapter, g, g_value):
    np.testing.assert_array_equal(g.edge_weight, g_value.edge_weight)  # the exact edges are untouched
    assert g.check_completeness().max_violation < 1e-10
    le = g.linearised_edges
    assert le is not None and set(le.kind_names()) == {"query", "key"}
    assert g.metadata["linearised_edges"]["max_relative_violation"] < 1e-10
    lin = linearise(adapter, torch.tensor(TOKENS))
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([TOKENS]))
    writers = _writer_vectors(model, cache, g)
    extra = _frozen_slopes(adapter, lin)
    T, L = len(TOKENS), adapter.facts.n_layers
    got_edges = {(int(t), int(s), k): float(w) for t, s, k, w in
                 zip(le.target, le.source, le.kind_names(), le.weight, strict=True)}
    largest = worst = 0.0
    checked = 0
    for comp in [NodeId("attention_head", l, t, h) for l in range(1, L) for t in (2, T - 2, T - 1)
                 for h in range(model.cfg.n_heads)]:
        row = g.index_of(comp)
        before = [w for w in writers if _writes_at(w) <= 2 * comp.layer]
        removed = torch.zeros(len(before), T, model.cfg.d_model, dtype=torch.float64)
        for b, w in enumerate(before):
            removed[b, w.position] = writers[w]
        for side, kind in (("q", "query"), ("k", "key")):
            eps = torch.zeros(len(before), dtype=torch.float64, requires_grad=True)
            out = _qk_patched_targets(model, adapter, lin, comp, eps, removed.detach(), side, extra)
            (grad,) = torch.autograd.grad(out.sum(), eps)
            expected = -grad.numpy()
            got = np.array([got_edges.get((row, g.index_of(w), kind), 0.0) for w in before])
            largest = max(largest, float(np.abs(expected).max()))
            worst = max(worst, float(np.abs(got - expected).max()))
            checked += len(before)
    assert largest > 1e-3 and checked > 100
    assert worst <= 1e-9 * largest, (worst, largest)


def _family_graph(family: str, tmp_path, **kw):
    """A tiny transformers checkpoint of ``family`` (from_config + save_pretrained), loaded in
    float64, and its component graph."""
    from circuitgraph.adapters.loading import load_hf_dir
    from circuitgraph.testing.hf_checkpoints import save_checkpoint, tiny_checkpoint

    folder = save_checkpoint(tiny_checkpoint(family), tmp_path / family)
    adapter = load_hf_dir(folder, dtype="float64")
    target = ResolvedTarget("logit_diff", position=len(TOKENS) - 1, tokens=(A_TOK, B_TOK))
    g = attribute(adapter, TOKENS, targets=[target], mlp="mlp", attention="heads", dtype=torch.float64,
                  component_inputs=True, **kw)
    return adapter.model, adapter, g


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "phi", "llama"])
def test_query_and_key_edges_on_transformers_families(family, tmp_path):
    """The same autograd reference on tiny transformers checkpoints of other families (GPT-2;
    Qwen2 with q/k/v biases and grouped-query heads; Phi's parallel block; Llama)."""
    model, adapter, g = _family_graph(family, tmp_path, head_inputs=("value", "query", "key"))
    _, _, g_value = _family_graph(family, tmp_path / "plain")
    _check_qk_edges(model, adapter, g, g_value)


@pytest.mark.parametrize("family", ["gemma2", "qwen3", "olmo2"])
def test_query_and_key_identity_on_families_with_qk_norms_and_soft_caps(family, tmp_path):
    """Gemma-2 (post-norms, attention soft-cap), Qwen3 (per-head q/k norms), OLMo-2 (whole-projection
    q/k norms, no input norm): the value edges unchanged, completeness, and each head's query and
    key edges summing with their constants to ``sum_s dT/da_s a_s`` (to 1e-10)."""
    _, _, g = _family_graph(family, tmp_path, head_inputs=("value", "query", "key"))
    _, _, g_value = _family_graph(family, tmp_path / "plain")
    np.testing.assert_array_equal(g.edge_weight, g_value.edge_weight)
    assert g.check_completeness().max_violation < 1e-10
    le = g.linearised_edges
    assert len(le) > 0 and le.max_violation() < 1e-10
    heads = [n for n in g.nodes if n.kind == "attention_head"]
    assert all("query_total" in n.attrs and "key_total" in n.attrs for n in heads)
    assert any(abs(n.attrs["query_total"]) > 1e-6 for n in heads)


def test_pipeline_handles_query_and_key_edges(tmp_path):
    """A spec run with ``head_inputs: [value, query, key]`` on the demo model: the linearised
    edges stay out of completeness and influence, travel through pruning (between kept nodes), the
    JSON and binary files (labelled, their per-head identity kept), the Neuronpedia file, the
    diagram and the explorer's API; the spec refuses head_inputs without value or component_inputs."""
    import json

    import circuitgraph
    from circuitgraph.errors import LoadError, SpecError
    from circuitgraph.export.binary import load_graph_binary, save_graph_binary
    from circuitgraph.export.json_graph import graph_from_json

    base = {"format_version": 1, "model": {"builtin": "demo"}, "prompt": "mia saw the owl in the park . later she wants",
            "targets": [{"logit_diff": [" an", " a"]}]}
    spec = {**base, "graph": {"mlp": "mlp", "attention": "heads", "component_inputs": True,
                              "head_inputs": ["value", "query", "key"]},
            "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
            "queries": [{"scores": {}}, {"top_paths": {"source": {"kind": "embedding"}, "k": 5}}],
            "export": {"json": str(tmp_path / "g.json"), "neuronpedia": str(tmp_path / "np.json"),
                       "dot": str(tmp_path / "g.dot")}}
    result = circuitgraph.run(spec)
    assert not result.failures
    full = result.full_graph
    plain = circuitgraph.run({**base, "graph": {"mlp": "mlp", "attention": "heads", "component_inputs": True}})
    np.testing.assert_array_equal(full.edge_weight, plain.full_graph.edge_weight)  # exact edges unchanged
    le = full.linearised_edges
    assert le is not None and len(le) and set(le.kind_names()) == {"query", "key"}
    assert full.metadata["linearised_edges"]["max_relative_violation"] < 1e-4
    assert full.check_completeness().ok()
    assert result.queries[1]["result"].to_dict()["paths"]
    pruned = result.graph
    assert pruned.linearised_edges is not None and len(pruned.linearised_edges) > 0
    kept = {n.id for n in pruned.nodes}
    for s, t in zip(pruned.linearised_edges.source, pruned.linearised_edges.target, strict=True):
        assert pruned.nodes[s].id in kept and pruned.nodes[t].kind == "attention_head"
    doc = json.loads((tmp_path / "g.json").read_text())
    recs = doc["linearised_edges"]
    assert recs and all(r["linearised"] is True and r["kind"] in ("query", "key") for r in recs)
    # a file with linearised edges is version 2 (a version-1 reader would drop them); one without stays 1
    assert doc["format_version"] == 2
    plain_doc = json.loads(plain.graph.to_json())
    assert plain_doc["format_version"] == 1 and "linearised_edges" not in plain_doc
    with pytest.raises(LoadError, match="upgrade circuitgraph"):
        graph_from_json(json.dumps({**doc, "format_version": 3}))
    back = graph_from_json((tmp_path / "g.json").read_text())
    assert back.linearised_edges is not None and len(back.linearised_edges) == len(recs)
    assert back.linearised_edges.max_violation() < 1e-4  # the per-head sums came back from the attrs
    save_graph_binary(full, tmp_path / "g.npz")
    np.testing.assert_array_equal(load_graph_binary(tmp_path / "g.npz").linearised_edges.weight, le.weight)
    npj = json.loads((tmp_path / "np.json").read_text())
    assert npj["linearised_links"] and all(r["kind"] in ("query", "key") for r in npj["linearised_links"])
    dot = (tmp_path / "g.dot").read_text()
    assert "style=dashed" in dot and "linearised" in dot
    from circuitgraph.serve.api import Explorer
    from circuitgraph.serve.catalog import Catalog

    explorer = Explorer(Catalog(tmp_path))
    (name,) = [n for n in explorer.catalog.graphs if n.endswith("g.json")]
    view = explorer.graph_view(name, {})
    assert view["linearised_edges"] and {e["kind"] for e in view["linearised_edges"]} <= {"query", "key"}
    head = max((n for n in back.nodes if n.kind == "attention_head" and "query_total" in n.attrs),
               key=lambda n: abs(n.attrs["query_total"]))
    info = explorer.node(name, str(head.id), {"node_threshold": ["1"], "edge_threshold": ["1"]})
    kinds = {x["kind"]: x for x in info["linearised_inputs"]}
    assert set(kinds) == {"query", "key"}
    for x in kinds.values():
        assert x["sum_inputs"] + x["constant"] == pytest.approx(x["total"], rel=1e-4, abs=1e-6)
    for bad, match in ((["query"], "must include 'value'"), (["value", "key"], "component_inputs")):
        graph = {"mlp": "mlp", "attention": "heads", "head_inputs": bad, **({"component_inputs": True}
                                                                              if bad == ["query"] else {})}
        with pytest.raises(SpecError, match=match):
            circuitgraph.run({**base, "graph": graph})
