"""Mixture-of-experts models (Mixtral, OLMoE, Qwen3-MoE, GPT-OSS): tiny random checkpoints made by
transformers' own classes and ``save_pretrained`` (2 layers, 4 experts, top-2, d_model 32), loaded
through the adapter's family table (:mod:`circuitgraph.adapters.hf_config`).

The references are transformers' own forward and its MoE block (router and experts), and
TransformerLens's frozen forward rebuilt from hooks; none reuses the engine's vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.adapters import ModelAdapter
from circuitgraph.adapters.hf_config import hooked_config_dict, load_snapshot
from circuitgraph.attribution import attribute
from circuitgraph.errors import LoadError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries.qk import qk
from circuitgraph.testing.hf_moe import moe_checkpoint
from tests.helpers.edges import assert_edges_equal, removal_effects

FAMILIES = ["mixtral", "olmoe", "qwen3_moe", "gpt_oss"]
TOKENS = [1, 5, 7, 9, 4, 3, 11, 6]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (folder, transformers model in float64)."""
    out = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(family)
        out[family] = (folder, moe_checkpoint(family, folder).double())
    return out


def _load(folder, dtype=torch.float64) -> ModelAdapter:
    model = load_snapshot(str(folder), dtype=dtype, device="cpu", fold_ln=False, center_writing_weights=False,
                          center_unembed=False, name="tiny")
    return ModelAdapter(model)


@torch.no_grad()
def _hf_moe(hf, adapter: ModelAdapter, tokens: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """Per layer, transformers' own MoE block (its router, its experts' weights and activation, its
    forward) applied to the MLP input TransformerLens computed (ln2's output, float64;
    transformers' RMSNorm would round to float32): the chosen experts and weights ``(T, k)``, each
    chosen expert's gate pre-activation, value branch (with its bias) and activation
    ``(T, k, d_mlp)``, its value rows ``(T, k, d_mlp, D)`` and biases, its down rows
    ``(T, k, D, d_mlp)`` and bias ``(T, k, D)``, and the block's output ``(T, D)``."""
    m = adapter.model
    _, cache = m.run_with_cache(torch.tensor([tokens]))
    got: dict[int, dict[str, torch.Tensor]] = {}
    for l, layer in enumerate(hf.model.layers):
        x = cache[f"blocks.{l}.ln2.hook_normalized"][0] * m.blocks[l].ln2.w
        ex = layer.mlp.experts
        if hasattr(layer.mlp, "router"):  # GPT-OSS: biased router, softmax after the top-k; interleaved gate/up
            logits, _, indices = layer.mlp.router(x)
            # TransformerLens's GptOssMoE takes the softmax of the top-k logits in float32 (transformers in
            # the input's dtype): the same here, so that float64 edges compare at 1e-9
            weights = torch.softmax(logits.gather(1, indices), dim=-1, dtype=torch.float32)
            W = ex.gate_up_proj[indices].transpose(-1, -2)  # (T, k, 2 d_mlp, D), gate/up interleaved
            bias = ex.gate_up_proj_bias[indices]
            gate_up = torch.einsum("tkmd,td->tkm", W, x) + bias
            post = ex._apply_gate(gate_up)  # transformers' clamped SwiGLU
            gate, value, up, up_bias = gate_up[..., ::2], gate_up[..., 1::2], W[:, :, 1::2], bias[..., 1::2]
            down, down_bias = ex.down_proj[indices].transpose(-1, -2), ex.down_proj_bias[indices]
        else:
            _, weights, indices = layer.mlp.gate(x)  # softmax in float32, top-k, renormalised or not
            W = ex.gate_up_proj[indices]  # (T, k, 2 d_mlp, D), gate first
            d = W.shape[2] // 2
            gate, value = torch.einsum("tkmd,td->tkm", W, x).chunk(2, dim=-1)
            post, up, up_bias = ex.act_fn(gate) * value, W[:, :, d:], torch.zeros_like(value)
            down, down_bias = ex.down_proj[indices], torch.zeros(*indices.shape, x.shape[-1], dtype=x.dtype)
        got[l] = {"weights": weights.to(x.dtype), "indices": indices, "gate": gate, "value": value, "post": post,
                  "up": up, "up_bias": up_bias, "down": down, "down_bias": down_bias,
                  "gpt_oss": hasattr(layer.mlp, "router"),
                  # transformers' experts forward, with these routing weights
                  "out": ex(x, indices, weights.to(x.dtype))}
    return got


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(family, checkpoints):
    folder, hf = checkpoints[family]
    raw = hooked_config_dict(hf.config)
    assert raw["num_experts"] == 4 and raw["experts_per_token"] == 2
    adapter = _load(folder, torch.float32)
    assert adapter.facts.num_experts == 4 and adapter.facts.n_neurons == 4 * adapter.facts.d_mlp
    with torch.no_grad():
        ours = adapter.model(torch.tensor([TOKENS]))[0].double()
        theirs = hf(torch.tensor([TOKENS])).logits[0]
    assert (ours - theirs).abs().max() < 1e-5 * max(1.0, float(theirs.abs().max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_neurons_are_the_routed_experts_and_sum_to_the_layer_output(family, checkpoints):
    folder, hf = checkpoints[family]
    adapter = _load(folder)
    g = attribute(adapter, TOKENS, mlp="neurons", dtype=torch.float64)
    ref = _hf_moe(hf, adapter, TOKENS)
    d = adapter.facts.d_mlp
    for l in range(2):
        for t in range(1, len(TOKENS)):
            nodes = [n for n in g.nodes if n.kind == "neuron" and n.layer == l and n.position == t]
            chosen = dict(zip(ref[l]["indices"][t].tolist(), ref[l]["weights"][t].tolist(), strict=False))
            # the nodes are the neurons of the experts the router chose, with its weights
            assert {n.attrs["expert"] for n in nodes} == set(chosen)
            total = torch.zeros(adapter.facts.d_model, dtype=torch.float64)
            for n in nodes:
                e, i = n.attrs["expert"], n.attrs["neuron"]
                assert n.index == e * d + i and n.attrs["routing_weight"] == pytest.approx(chosen[e], abs=1e-12)
                slot = ref[l]["indices"][t].tolist().index(e)
                assert n.activation == pytest.approx(chosen[e] * float(ref[l]["post"][t, slot, i]), abs=1e-10)
                (w,) = g.context.writes(n.id)
                total += w.vector.cpu()
            # the routed experts' neurons (plus their output biases, GPT-OSS) sum exactly to the layer's
            # output (transformers' MoE block)
            total += (ref[l]["weights"][t, :, None] * ref[l]["down_bias"][t]).sum(0)
            assert (total - ref[l]["out"][t]).abs().max() < 1e-10, (l, t)
    assert g.check_completeness().max_violation < 1e-12


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_completeness_on_every_reader(family, dtype, tol, checkpoints):
    adapter = _load(checkpoints[family][0], dtype)
    for mlp, extra in (("neurons", {}), ("mlp", {}), ("neurons", {"attention": "heads"}),
                       ("neurons", {"neuron_top_k": 5, "bias_nodes": True})):
        g = attribute(adapter, TOKENS, mlp=mlp, dtype=dtype, **extra)
        report = g.check_completeness()
        assert report.n_readers > 0 and report.max_violation < tol, (mlp, extra, report)
    assert any(n.kind == "remainder" for n in g.nodes)
    # the graph file keeps the expert neurons and their attributes
    from circuitgraph.graph.graph import AttributionGraph

    back = AttributionGraph.from_json(g.to_json())
    node = next(n for n in back.nodes if n.kind == "neuron")
    assert {"expert", "neuron", "routing_weight"} <= set(node.attrs)


@pytest.mark.parametrize("family", FAMILIES)
def test_mlp_granularity_gives_one_node_per_moe_layer(family, checkpoints):
    folder, hf = checkpoints[family]
    adapter = _load(folder)
    g = attribute(adapter, TOKENS, mlp="mlp", dtype=torch.float64)
    ref = _hf_moe(hf, adapter, TOKENS)
    mlp_nodes = [n for n in g.nodes if n.kind == "mlp"]
    assert {(n.layer, n.position) for n in mlp_nodes} == {(l, t) for l in range(2) for t in range(1, len(TOKENS))}
    assert not any(n.kind == "neuron" for n in g.nodes)
    for n in mlp_nodes:
        (w,) = g.context.writes(n.id)
        assert (w.vector.cpu() - ref[n.layer]["out"][n.position]).abs().max() < 1e-10


def test_transcoders_attach_to_moe_layers(checkpoints, tmp_path):
    from circuitgraph.dictionaries import TranscoderSet
    from circuitgraph.testing.synthetic import random_transcoders

    for layer, tc in random_transcoders(_load(checkpoints["qwen3_moe"][0], torch.float32).model, seed=0).items():  # ln2.hook_normalized -> hook_mlp_out
        tc.save_model(str(tmp_path / f"layer_{layer}"))
    adapter = _load(checkpoints["qwen3_moe"][0])
    tcs = TranscoderSet.from_dir(tmp_path, adapter, dtype=torch.float64)
    g = attribute(adapter, TOKENS, tcs, dtype=torch.float64)
    assert any(n.kind == "feature" for n in g.nodes) and any(n.kind == "error" for n in g.nodes)
    assert g.check_completeness().max_violation < 1e-12


# ----------------------------------------------------------------------------- independent edges
class Reference:
    """Every edge recomputed without the engine: writers and expert-neuron readers from transformers'
    MoE block (router weights, ``act(gate) * up``, ``down_proj``), the frozen model from
    TransformerLens's forward with ln1/ln2/ln_final's ``hook_scale`` and every ``hook_pattern``
    fixed at their cached values and every MLP output fixed; one batch row per removed writer."""

    def __init__(self, adapter: ModelAdapter, hf, tokens: list[int]):
        self.m, self.tokens = adapter.model, torch.tensor([tokens])
        _, self.cache = self.m.run_with_cache(self.tokens)
        self.hf = _hf_moe(hf, adapter, tokens)
        self.T, self.D, self.d = len(tokens), self.m.cfg.d_model, self.m.cfg.d_mlp

    def writer(self, node: NodeId) -> tuple[str, torch.Tensor]:
        if node.kind == "embedding":
            return "hook_embed", self.cache["hook_embed"][0, node.position]
        assert node.kind == "neuron", node
        ref, t = self.hf[node.layer], node.position
        e, i = divmod(node.index, self.d)
        slot = ref["indices"][t].tolist().index(e)
        vec = ref["weights"][t, slot] * ref["post"][t, slot, i] * ref["down"][t, slot, :, i]
        return f"blocks.{node.layer}.hook_mlp_out", vec

    @torch.no_grad()
    def run(self, removals):
        B, c, m = len(removals) + 1, self.cache, self.m
        delta: dict[str, torch.Tensor] = {}
        for k, (hook, t, vec) in enumerate(removals, start=1):
            delta.setdefault(hook, torch.zeros(B, self.T, self.D, dtype=vec.dtype))[k, t] += vec
        captured: dict[str, torch.Tensor] = {}

        def fixed(name):
            return lambda value, hook: c[name].expand_as(value).clone()

        def keep(value, hook):
            captured[hook.name] = value
            return value

        names = [n for n in c.keys() if (n.endswith("hook_scale") and ".attn." not in n) or n.endswith("hook_pattern")]
        hooks = [(n, fixed(n)) for n in names]
        hooks += [(f"blocks.{l}.hook_mlp_out", fixed(f"blocks.{l}.hook_mlp_out")) for l in range(m.cfg.n_layers)]
        hooks += [(name, lambda value, hook, d=d: value - d) for name, d in delta.items()]
        hooks += [(n, keep) for n in ["ln_final.hook_normalized"] +
                  [f"blocks.{l}.ln2.hook_normalized" for l in range(m.cfg.n_layers)]]
        m.run_with_hooks(self.tokens.expand(B, -1), fwd_hooks=hooks)
        return captured

    @torch.no_grad()
    def reader(self, node, captured) -> torch.Tensor:
        nid, t, m = node.id, node.position, self.m
        if nid.kind == "neuron":  # routing weight * act(gate) (frozen) * (up row . ln2's output)
            ref = self.hf[nid.layer]
            e, i = divmod(nid.index, self.d)
            slot = ref["indices"][t].tolist().index(e)
            x2 = captured[f"blocks.{nid.layer}.ln2.hook_normalized"][:, t] * m.blocks[nid.layer].ln2.w
            value = x2 @ ref["up"][t, slot, i] + ref["up_bias"][t, slot, i]
            r, gate = ref["weights"][t, slot], ref["gate"][t, slot, i]
            if not ref["gpt_oss"]:
                return r * self.m.blocks[nid.layer].mlp.experts[e].act_fn(gate) * value
            # GPT-OSS: glu(min(gate, 7)) * (clamp(value, -7, 7) + 1), the gate and the clamp frozen
            g = gate.clamp(max=7.0)
            glu = g * torch.sigmoid(1.702 * g)
            base = ref["value"][t, slot, i]
            value = value if -7.0 < base < 7.0 else base.clamp(-7.0, 7.0).expand_as(value)
            return r * glu * (value + 1)
        assert nid.kind == "logit", nid
        final = captured["ln_final.hook_normalized"][:, t] * m.ln_final.w
        w, b = m.W_U[:, nid.index], m.b_U[nid.index]
        if node.attrs.get("relative_to_mean"):
            w, b = w - m.W_U.mean(-1), b - m.b_U.mean()
        return final @ w + b


@pytest.mark.parametrize("family", FAMILIES)
def test_every_edge_equals_an_independent_removal(family, checkpoints):
    folder, hf = checkpoints[family]
    adapter = _load(folder)
    g = attribute(adapter, TOKENS, mlp="neurons", dtype=torch.float64)
    ref = Reference(adapter, hf, TOKENS)
    writers = [n.id for n in g.nodes if n.kind in ("embedding", "neuron")]
    removals = [(hook, w.position, vec) for w in writers for hook, vec in [ref.writer(w)]]
    captured = ref.run(removals)
    readers = [n for n in g.nodes if n.pre_activation is not None]
    assert {n.kind for n in readers} == {"logit", "neuron"}
    expected = removal_effects(g, readers, lambda r: ref.reader(r, captured))
    assert_edges_equal(g, readers, writers, expected)
    # expert neurons reach expert neurons of the next layer and the logits, across positions
    assert any(expected[i, j] != 0 and writers[j].kind == "neuron" and readers[i].kind == "neuron"
               and writers[j].position < readers[i].position for i in range(len(readers)) for j in range(len(writers)))


# ----------------------------------------------------------------------------- QK
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n_kv_heads", [2, 4])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_qk_sums_equal_the_models_scores(family, n_kv_heads, dtype, tol, tmp_path):
    moe_checkpoint(family, tmp_path, n_kv_heads=n_kv_heads)
    adapter = _load(tmp_path, dtype)
    g = attribute(adapter, TOKENS, mlp="neurons", dtype=dtype)
    _, cache = adapter.model.run_with_cache(torch.tensor([TOKENS]))
    for layer in range(2):
        for h in qk(g, layer=layer, head=[0, 1, 2, 3], query_position=-1, key_position="top").heads:
            s = float(cache[f"blocks.{layer}.attn.hook_attn_scores"][0, h.head, h.query_position, h.key_position])
            for total in (h.pairs_sum_plus_constant, h.query_marginals_sum_plus_constant,
                          h.key_marginals_sum_plus_constant):
                assert abs(total - s) < tol * max(1.0, abs(s)), (layer, h.head, total, s)


# ----------------------------------------------------------------------------- refusals
def test_dense_layers_in_a_moe_model_are_refused_in_one_line():
    import transformers

    cfg = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0],
                                      architectures=["Qwen3MoeForCausalLM"])
    with pytest.raises(LoadError, match=r"mlp_only_layers=\[0\].*every layer must be a mixture-of-experts layer"):
        hooked_config_dict(cfg)




# ----------------------------------------------------------------------------- the spec, by hub name
@pytest.mark.parametrize("family,repo", [("mixtral", "mistralai/Mixtral-8x7B-v0.1"),
                                         ("olmoe", "allenai/OLMoE-1B-7B-0924"), ("gpt_oss", "openai/gpt-oss-20b")])
def test_spec_by_hub_name_from_a_local_cache(family, repo, checkpoints, tmp_path, monkeypatch):
    """``model: {name: ...}`` of a MoE family, from a local Hugging Face cache holding a tiny
    checkpoint (configured from its own config.json, not TransformerLens's table of the real
    sizes): expert neurons as nodes, and a QK query on the same run."""
    import circuitgraph
    from circuitgraph.testing.synthetic import hf_cache_repo

    folder, hf = checkpoints[family]
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf_cache_repo(cache, repo, folder)
    result = circuitgraph.run({"format_version": 1, "model": {"name": repo}, "prompt": {"tokens": TOKENS},
                               "graph": {"mlp": "neurons"}, "targets": [{"top_logits": {"max_n": 3}}],
                               "queries": [{"qk": {"layer": 1, "head": [0, 1]}}]})
    g = result.graph
    assert g.context.adapter.facts.num_experts == 4 and g.context.adapter.model.cfg.d_model == 32
    neurons = [n for n in g.nodes if n.kind == "neuron"]
    assert neurons and all({"expert", "neuron", "routing_weight"} <= set(n.attrs) for n in neurons)
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    (entry,) = result.queries
    assert entry["status"] == "ok", entry["error"]
    for h in entry["result"].heads:
        assert abs(h.pairs_sum_plus_constant - h.score) < 1e-4 * max(1.0, h.magnitude)


@pytest.mark.parametrize("family", ["olmoe", "gpt_oss"])
def test_frozen_validation_reads_expert_neurons(family, checkpoints):
    """circuitgraph's own frozen-model check (validation/frozen.py) on a MoE graph: removing a writer
    changes each expert-neuron reader by its edge."""
    from circuitgraph.validation.frozen import frozen_ablation_effects, frozen_reader_values

    adapter = _load(checkpoints[family][0])
    g = attribute(adapter, TOKENS, mlp="neurons", dtype=torch.float64)
    base = frozen_reader_values(g.context)
    readers = [n for n in g.nodes if n.pre_activation is not None]
    assert all(base[n.id] == pytest.approx(n.pre_activation, abs=1e-10) for n in readers)
    writers = [n.id for n in g.nodes if n.kind == "neuron" and n.layer == 0][:5]
    effects = frozen_ablation_effects(g.context, writers)
    dense = g.dense_adjacency(dtype=np.float64)
    n_checked = 0
    for w in writers:
        for r, value in effects[w].items():
            assert value == pytest.approx(dense[g.index_of(r), g.index_of(w)], abs=1e-10)
            n_checked += r.kind == "neuron"
    assert n_checked > 0


def test_gpt_oss_constants_are_transformer_lens_own():
    from transformer_lens.components.mlps import gpt_oss_moe

    from circuitgraph.adapters.hf_config import GPT_OSS_ALPHA, GPT_OSS_LIMIT

    assert (GPT_OSS_LIMIT, GPT_OSS_ALPHA) == (gpt_oss_moe.GPT_OSS_LIMIT, gpt_oss_moe.GPT_OSS_ALPHA)


def test_gpt_oss_other_swiglu_constants_are_refused():
    import transformers

    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                    swiglu_limit=5.0, architectures=["GptOssForCausalLM"])
    with pytest.raises(LoadError, match="swiglu_limit=5.0"):
        hooked_config_dict(cfg)


@pytest.mark.parametrize("family", ["olmoe", "qwen3_moe"])
def test_qk_intervention_check_on_moe(family, checkpoints):
    """validate: qk on MoE models with q/k norms (whole projection, per head): removing an expert
    neuron or an embedding from one side of the score changes it by that node's marginal."""
    from circuitgraph.validation.qk_check import qk_check

    adapter = _load(checkpoints[family][0])
    g = attribute(adapter, TOKENS, mlp="neurons", dtype=torch.float64)
    res = qk_check(g, layer=1, head=[0, 2], top_k=4)
    assert res.rows and res.ok, res.table()
    assert any(r.node.startswith("neuron") for r in res.rows)
