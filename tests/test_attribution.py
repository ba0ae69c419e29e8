"""The exactness identities of the attribution engine, on every tiny architecture.

* completeness: every reader's measured pre-activation = sum of incoming edges + constant;
* every edge equals the change in the reader when that one writer is removed in the frozen
  real model (forward passes with hooks: an independent computation, no autograd);
* the frozen model is exactly linear (superposition);
* gated-neuron attribution sums to hook_post;
* neuron + head granularity agrees with TransformerLens's get_full_resid_decomposition
  projected on the reader direction with the right norm scale (ln2 / ln_final).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.attribution import ResolvedTarget, attribute
from circuitgraph.graph.nodes import NodeId
from circuitgraph.validation.frozen import frozen_ablation_effects, frozen_reader_values
from tests.helpers.bundles import load_bundle, make_bundle

MIXED = dict(mlp={0: "transcoders", 1: "neurons"}, attention={0: "frozen", 1: "heads"})


def _targets(n_pos: int, d_model: int) -> list[ResolvedTarget]:
    gen = torch.Generator().manual_seed(3)
    return [
        ResolvedTarget(kind="logit", position=n_pos - 1, tokens=(4,), relative_to_mean=True),
        ResolvedTarget(kind="logit", position=n_pos - 1, tokens=(7,)),
        ResolvedTarget(kind="logit_diff", position=n_pos - 3, tokens=(5, 6)),
        ResolvedTarget(kind="direction", position=n_pos - 2, site="resid_mid", layer=1,
                       vector=torch.randn(d_model, generator=gen, dtype=torch.float64)),
    ]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float64", 1e-10)])
@pytest.mark.parametrize("granularity", ["default", "mixed", "mlp-heads"])
def test_completeness_every_node(tmp_path, variant, dtype, tol, granularity):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant), dtype=dtype)
    kwargs = {"default": {}, "mixed": MIXED, "mlp-heads": dict(mlp="mlp", attention="heads")}[granularity]
    targets = _targets(len(tokens), adapter.facts.d_model)
    for t in targets:
        if t.vector is not None:
            t.vector = t.vector.to(getattr(torch, dtype))
    g = attribute(adapter, tokens, tcs, targets, dtype=getattr(torch, dtype), positional_nodes=True,
                  bias_nodes=granularity == "mixed", **kwargs)
    report = g.check_completeness()
    assert report.n_readers >= len(targets)
    assert report.max_violation < tol, report
    assert g.metadata["completeness"]["max_relative_violation"] == report.max_violation


@pytest.mark.parametrize("kind,site", [("relu", "normalized"), ("jumprelu", "raw"), ("skip", "normalized"),
                                       ("jumprelu_skip", "raw")])
def test_edges_equal_removal_in_frozen_model(tmp_path, variant, kind, site):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, variant, kind=kind, input_site=site), "float64")
    for kwargs in (MIXED, dict(mlp={0: "neurons", 1: "transcoders"}, attention={0: "heads", 1: "frozen"})):
        g = attribute(adapter, tokens, tcs, _targets(len(tokens), adapter.facts.d_model), dtype=torch.float64,
                      positional_nodes=True, neuron_top_k=4, **kwargs)
        base = frozen_reader_values(g.context)
        for node in g.nodes:  # the unablated frozen model reproduces the measured values
            if node.id in base:
                assert base[node.id] == pytest.approx(node.pre_activation, abs=1e-10)
        writers = [n.id for n in g.nodes if n.kind not in ("logit", "target", "bias")]
        # every kind of writer, a random sample of each (every writer costs one forward pass)
        rng = np.random.default_rng(0)
        by_kind: dict[str, list] = {}
        for w in writers:
            by_kind.setdefault(w.kind, []).append(w)
        sample = [w for ws in by_kind.values() for w in rng.permutation(np.array(ws, dtype=object))[:6]]
        effects = frozen_ablation_effects(g.context, sample)
        dense = g.dense_adjacency()
        scale = np.abs(dense).max()
        worst = max(
            abs(v - dense[g.index_of(r), g.index_of(w)]) for w, row in effects.items() for r, v in row.items()
        )
        assert worst < 1e-10 * scale


def test_frozen_model_is_linear(tmp_path):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "rms-gated-rotary-gqa"), "float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, **MIXED)
    features = [n.id for n in g.nodes if n.kind == "feature" and n.layer == 0][:2]
    emb = NodeId("embedding", -1, 2, tokens[2])
    base = frozen_reader_values(g.context)
    u = frozen_reader_values(g.context, [features[0]])
    v = frozen_reader_values(g.context, [emb])
    uv = frozen_reader_values(g.context, [features[0], emb])
    half = frozen_reader_values(g.context, [features[0]], scale=0.5)
    for r in base:
        assert uv[r] - base[r] == pytest.approx((u[r] - base[r]) + (v[r] - base[r]), abs=1e-11)
        assert half[r] == pytest.approx((base[r] + u[r]) / 2, abs=1e-11)


def test_gated_neuron_attribution_sums_to_hook_post(tmp_path):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "rms-gated-rotary-gqa"), "float64")
    g = attribute(adapter, tokens, None, dtype=torch.float64, mlp="neurons")
    lin = g.context.linearisation
    sums = g.incoming_sums()
    neurons = [n for n in g.nodes if n.kind == "neuron"]
    assert neurons
    for n in neurons:
        post = float(lin.mlp_post[n.layer][n.position, n.index])
        assert n.pre_activation == post == n.activation
        assert sums[g.index_of(n.id)] + n.constant == pytest.approx(post, abs=1e-11)
        assert {"gate", "linear"} <= set(n.attrs)


@pytest.mark.parametrize("variant_name", ["ln-gelu-learned", "rms-gated-rotary-gqa", "lnpre-relu-rotary"])
def test_agrees_with_transformerlens_decomposition(tmp_path, variant_name):
    """Neuron + head granularity = get_full_resid_decomposition projected with the right sigma."""
    adapter, _, tokens = load_bundle(make_bundle(tmp_path, variant_name), "float64")
    t = len(tokens) - 1
    target = ResolvedTarget(kind="logit", position=t, tokens=(5,))
    g = attribute(adapter, tokens, None, [target], dtype=torch.float64, mlp="neurons", attention="heads",
                  positional_nodes=True, bias_nodes=True, bos_nodes=True)
    model = adapter.transformer_lens_model()  # TransformerLens itself: its ActivationCache decomposition
    _, cache = model.run_with_cache(torch.tensor([tokens]))

    def check(reader: NodeId, stack, labels, w, norm_site, layer):
        norm = adapter.norm(norm_site, layer)
        direction = norm.reader_direction(w) / g.context.linearisation.sigma[(norm_site, layer)][t]
        projected = stack[:, 0, t, :] @ direction
        edges = dict(g.in_edges(reader))
        bias_total = sum(w for s, w in edges.items() if s.kind == "bias")
        for label, value in zip(labels, projected.tolist(), strict=False):
            if label == "bias":  # TransformerLens accumulates its bias term in float32
                assert bias_total == pytest.approx(value, rel=1e-6, abs=1e-7)
                continue
            if label == "embed":
                src = NodeId("embedding", -1, t, tokens[t])
            elif label == "pos_embed":
                src = NodeId("positional", -1, t, 0)
            elif "H" in label:
                lyr, head = label[1:].split("H")
                src = NodeId("attention_head", int(lyr), t, int(head))
            else:
                lyr, neuron = label[1:].split("N")
                src = NodeId("neuron", int(lyr), t, int(neuron))
            assert edges.get(src, 0.0) == pytest.approx(value, abs=1e-10), label

    # the logit, through ln_final
    stack, labels = cache.get_full_resid_decomposition(expand_neurons=True, apply_ln=False, return_labels=True)
    check(NodeId("logit", adapter.facts.n_layers, t, 5), stack, labels, adapter.W_U[:, 5], "ln_final", None)
    # a layer-1 neuron, through ln2 of layer 1 (MLP-input reader: decomposition of resid_mid)
    if not adapter.facts.gated_mlp:
        stack, labels = cache.get_full_resid_decomposition(layer=1, mlp_input=True, expand_neurons=True,
                                                           apply_ln=False, return_labels=True)
        reader = next(n.id for n in g.nodes if n.kind == "neuron" and n.layer == 1 and n.position == t)
        check(reader, stack, labels, adapter.mlp_weights(1)["W_in"][:, reader.index], "ln2", 1)


def test_default_follows_circuit_tracer_conventions(tmp_path):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned"))
    g = attribute(adapter, tokens, tcs)
    kinds = {n.kind for n in g.nodes}
    assert kinds == {"embedding", "feature", "error", "logit"}
    assert sorted(n.position for n in g.nodes if n.kind == "embedding") == list(range(len(tokens)))
    assert all(n.position > 0 for n in g.nodes if n.kind in ("feature", "error"))
    errors = {(n.layer, n.position) for n in g.nodes if n.kind == "error"}
    assert errors == {(l, p) for l in range(2) for p in range(1, len(tokens))}
    weights = [w for _, w in g.targets]
    assert all(0 < w <= 1 for w in weights) and sum(weights) <= 1 + 1e-9


def test_shared_fixtures_complete():
    """The two shipped fixture bundles (GPT-2 and Llama style) pass the completeness check."""
    from tests.helpers.bundles import SHARED_FIXTURES

    for name in ("example-gpt2", "example-llama"):
        adapter, tcs, tokens = load_bundle(SHARED_FIXTURES / name)
        g = attribute(adapter, tokens, tcs)
        assert g.check_completeness().max_violation < 1e-5
        assert any(n.kind == "feature" for n in g.nodes)


def test_max_feature_nodes_keeps_completeness(tmp_path):
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned"), "float64")
    full = attribute(adapter, tokens, tcs, dtype=torch.float64)
    n_features = sum(1 for n in full.nodes if n.kind == "feature")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, max_feature_nodes=10, batch_size=4)
    features = [n for n in g.nodes if n.kind == "feature"]
    remainders = [n for n in g.nodes if n.kind == "remainder"]
    assert len(features) == 10 < n_features
    assert sum(n.attrs["n_features"] for n in remainders) == n_features - 10
    assert g.check_completeness().max_violation < 1e-10
    # the kept rows are the same edges as in the full graph, for sources that stayed nodes
    for f in features[:3]:
        kept = {s: w for s, w in g.in_edges(f.id) if s.kind != "remainder"}
        for s, w in kept.items():
            assert w == pytest.approx(full.edge_weight_between(s, f.id), abs=1e-12)


def test_nan_in_weights_is_named(tmp_path):
    from circuitgraph.errors import NumericalError

    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned"))
    with torch.no_grad():
        adapter.model.blocks[1].mlp.W_out[3, 2] = float("nan")
    with pytest.raises(NumericalError, match=r"blocks\.1\.mlp\.W_out"):
        attribute(adapter, tokens, tcs)


def test_nan_in_transcoder_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from circuitgraph.adapters.loading import load_model_dir
    from circuitgraph.dictionaries import TranscoderSet
    from circuitgraph.errors import NumericalError

    bundle = make_bundle(tmp_path, "ln-gelu-learned")
    f = bundle / "transcoders" / "layer_1" / "sae_weights.safetensors"
    w = load_file(str(f))
    w["W_dec"][0, 0] = float("inf")
    save_file(w, str(f))
    with pytest.raises(NumericalError, match="layer_1.*W_dec"):
        TranscoderSet.from_dir(bundle / "transcoders", load_model_dir(bundle / "model"))


def test_bidirectional_long_prompt_blocks(tmp_path, monkeypatch):
    """Past ``CAUSAL_BLOCK`` positions the frozen pattern is applied by blocks of sources that skip
    the destinations a causal pattern leaves at zero: a bidirectional pattern has none to skip."""
    from circuitgraph.attribution import frozen_model

    monkeypatch.setattr(frozen_model, "CAUSAL_BLOCK", 3)
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "none-relu-bidirectional"), dtype="float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64)
    assert g.check_completeness().max_violation < 1e-10


def test_bidirectional_head_split_of_an_edge_from_a_later_position(tmp_path):
    """An edge from a writer after its reader (bidirectional attention) splits over heads and
    source positions into parts that sum to it."""
    from circuitgraph.queries.head_split import head_split, parts_sum_check

    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "none-relu-bidirectional"), dtype="float64")
    g = attribute(adapter, tokens, tcs, dtype=torch.float64)
    later = [(s, t, w) for s, t, w in zip(g.edge_source, g.edge_target, g.edge_weight, strict=False)
             if g.nodes[s].position > g.nodes[t].position and g.nodes[t].kind == "feature" and abs(w) > 1e-3]
    assert later
    s, t, _ = max(later, key=lambda e: abs(e[2]))
    for by_position in (False, True):
        res = head_split(g, g.nodes[s].id, g.nodes[t].id, by_position=by_position)
        assert parts_sum_check(res) < 1e-10


def _greedy_selection(full, k: int, per_round: int) -> list[int]:
    """circuit-tracer's max_feature_nodes rule recomputed from the FULL graph's edges with a dense
    matrix (no code of feature_selection.py): rows known = every non-feature reader's and the
    expanded features'; each round ranks the unexpanded features by the influence on the targets
    through the known rows (each row normalised by its sum of |w|), expands the best
    ``per_round``.  Returns the expanded feature rows; asserts every round's cut is not a tie."""
    n = full.n_nodes
    A = np.zeros((n, n))
    A[full.edge_target, full.edge_source] = np.abs(full.edge_weight.astype(np.float64))
    start = np.zeros(n)
    for tid, w in full.targets:
        start[full.index_of(tid)] = w
    features = [i for i, node in enumerate(full.nodes) if node.kind == "feature"]
    known = np.array([node.kind != "feature" for node in full.nodes])
    chosen: list[int] = []
    while len(chosen) < k:
        M = np.where(known[:, None], A, 0.0)
        M /= np.maximum(M.sum(1, keepdims=True), 1e-8)
        infl, x = np.zeros(n), start.copy()
        for _ in range(2 * len(full.nodes)):
            x = M.T @ x
            infl += x
        todo = sorted((f for f in features if f not in chosen), key=lambda f: -infl[f])
        take = min(per_round, k - len(chosen))
        assert infl[todo[take - 1]] > infl[todo[take]] * (1 + 1e-6), "a tie at the cut: choose another k"
        chosen += todo[:take]
        known[todo[:take]] = True
    return chosen


@pytest.mark.parametrize("k,batch_size", [(6, 8), (9, 1)], ids=["one-round", "three-rounds"])
def test_max_feature_nodes_selects_the_most_influential_features(tmp_path, k, batch_size):
    """The kept features are the ones circuit-tracer's rule picks, recomputed independently from
    the full graph (a reversed or wrong ranking keeps other features); in one round (k <= 4 x
    batch_size) that is the top-k of the full graph's influence through the target rows."""
    adapter, tcs, tokens = load_bundle(make_bundle(tmp_path, "ln-gelu-learned"), "float64")
    full = attribute(adapter, tokens, tcs, dtype=torch.float64)
    expected = {full.nodes[r].id for r in _greedy_selection(full, k, 4 * batch_size)}
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, max_feature_nodes=k, batch_size=batch_size)
    assert {n.id for n in g.nodes if n.kind == "feature"} == expected
