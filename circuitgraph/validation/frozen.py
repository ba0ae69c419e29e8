"""Interventions in the *frozen* real model: an independent check of every edge.

The frozen model is the real TransformerLens model with every sigma and attention pattern
frozen (:func:`~circuitgraph.attribution.linearisation.frozen`) and every node frozen at its
recorded output: MLP outputs are fixed (plus the linear skip path of skip transcoders), and in
layers analysed as heads the attention output is fixed too.  Removing one writer and running
the model forward changes each reader by exactly the graph's edge (for readers reached only
through frozen paths), with no autograd and no use of the engine's transposes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.attribution.context import AttributionContext
from circuitgraph.attribution.linearisation import dictionary_input, frozen
from circuitgraph.dictionaries.protocol import require_dictionary
from circuitgraph.errors import ValidationRunError
from circuitgraph.graph.nodes import NodeId

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["frozen_reader_values", "frozen_ablation_effects", "frozen_node_hooks", "frozen_capture_names"]


@torch.no_grad()
def frozen_reader_values(context: AttributionContext, ablate: Iterable[NodeId] = (), scale: float = 0.0,
                         readers: Iterable[NodeId] | None = None) -> dict[NodeId, float]:
    """Every reader's pre-activation in the frozen real model (only ``readers``' when given: a
    ``max_neuron_nodes`` run has millions of candidate readers), with the writers in ``ablate``
    scaled by ``scale`` (0 = removed)."""
    a, lin = context.adapter, context.linearisation
    hooks, captured = frozen_node_hooks(context, ablate, scale)

    def keep(value, hook):
        captured[hook.name] = value.detach()[0]
        return value

    hooks += [(n, keep) for n in frozen_capture_names(a)]
    with frozen(a, lin, extra_hooks=hooks) as model:
        model(lin.tokens.to(a.device)[None])
    return _read_values(context, captured, readers)


def frozen_capture_names(a: ModelAdapter) -> list[str]:
    """The hooks :func:`frozen_reader_values` keeps in a frozen run: every layer's residuals, its
    attention output, ln2's and ln_final's normalised inputs and the MLP's pre-activations (the
    dry run probes a pass that keeps them, :mod:`circuitgraph.pipeline.check_estimate`)."""
    names = {a.hook_norm_normalized("ln_final")}
    for layer in range(a.facts.n_layers):
        names |= {a.hook_norm_normalized("ln2", layer), a.hook_resid_mid(layer),
                  a.hook_resid_pre(layer), a.hook_resid_post(layer), a.hook_attn_out(layer)}
        if not a.facts.num_experts:  # MoE layers: expert neurons are read from ln2's output (below)
            names.add(a.hook_mlp_pre(layer))
            if a.facts.gated_mlp:
                names.add(a.hook_mlp_pre_linear(layer))
    return sorted(n for n in names if a.has_hook(n))  # parallel blocks: no resid_mid; OLMo-2: no input ln2


def frozen_node_hooks(context: AttributionContext, ablate: Iterable[NodeId] = (),
                      scale: float = 0.0) -> tuple[list[tuple[str, Any]], dict[str, torch.Tensor]]:
    """Hooks that, inside :func:`~circuitgraph.attribution.linearisation.frozen`, freeze every node
    at its recorded output (MLP outputs, attention outputs of layers analysed as heads) and scale
    the writers in ``ablate`` by ``scale``; and the dict the hooks use for captured values."""
    a, lin, tcs = context.adapter, context.linearisation, context.transcoders
    opts = context.options
    L = a.facts.n_layers
    # removal vectors per hook: {(kind, layer): (T, D) tensor to subtract}
    T, D = lin.n_pos, a.facts.d_model
    delta: dict[tuple[str, int], torch.Tensor] = {}
    for node_id in ablate:
        writes = context.writes(node_id)  # several for a cross-layer transcoder feature
        if not writes:
            raise ValidationRunError(f"node {node_id} is not a writer of this graph")
        for write in writes:
            pos, vec = write.position, write.vector
            if node_id.kind == "embedding":
                key = ("embed", 0)
            elif node_id.kind == "positional":
                key = ("pos_embed", 0)
            else:
                key = (write.location.sublayer, write.location.layer)
            if key[0] == "attn" and opts.attention[key[1]] != "heads":
                raise ValidationRunError(f"node {node_id}: attention writers can be removed only in heads mode")
            d = delta.setdefault(key, torch.zeros(T, D, dtype=vec.dtype))
            d[pos] += (1.0 - scale) * vec.cpu()

    captured: dict[str, torch.Tensor] = {}
    hooks = []

    def sub(key):
        def fn(value, hook):
            return value - delta[key].to(value.dtype)[None, : value.shape[1]]
        return fn

    if ("embed", 0) in delta:
        hooks.append((a.hook_embed(), sub(("embed", 0))))
    if ("pos_embed", 0) in delta:
        hooks.append((a.hook_pos_embed(), sub(("pos_embed", 0))))
    for layer in range(L):
        if opts.attention[layer] == "heads":
            rec = lin.attn_out[layer]
            d = delta.get(("attn", layer))

            def fix_attn(value, hook, rec=rec, d=d):
                out = rec.to(value.dtype)[None].clone()
                return out - d.to(value.dtype)[None] if d is not None else out

            hooks.append((a.hook_attn_out(layer), fix_attn))
        # a skip transcoder's linear path (its input site, weight, and whether it writes before ln2_post)
        skip: tuple[str, torch.Tensor, bool] | None = None
        if tcs is not None and layer in tcs and opts.mlp[layer] == "transcoders":
            W_skip = tcs.skip_weight(layer)
            if W_skip is not None:
                skip = (tcs[layer].input_site, W_skip, tcs.output_site(layer) == "before_post_norm")
        rec_mlp = lin.mlp_out[layer]
        d = delta.get(("mlp", layer))

        def fix_mlp(value, hook, rec=rec_mlp, d=d, layer=layer, skip=skip):
            out = rec.to(value.dtype)[None].clone()
            if skip is not None:
                input_site, W_skip, before_post = skip
                resid, normalized = _mlp_inputs(a, captured, layer)
                x = dictionary_input(a, input_site, layer, resid[None], normalized[None])
                change = (x - lin.tc_input[layer].to(value.dtype)[None]) @ W_skip.to(value.dtype).T
                if before_post:  # the skip writes before ln2_post: its frozen image gamma P(v) / sigma
                    norm = a.norm("ln2_post", layer)
                    if norm.center:
                        change = change - change.mean(-1, keepdim=True)
                    change = change / lin.sigma[("ln2_post", layer)].to(value.dtype)[None, :, None]
                    change = change * norm.gamma.to(value.dtype) if norm.gamma is not None else change
                out = out + change
            return out - d.to(value.dtype)[None] if d is not None else out

        hooks.append((a.hook_mlp_out(layer), fix_mlp))
    return hooks, captured


def _read_values(context: AttributionContext, c: dict[str, torch.Tensor],
                 readers: Iterable[NodeId] | None = None) -> dict[NodeId, float]:
    """Reader pre-activations from the captured hooks of a frozen run (vectorised per kind); a
    reader's direction is made only for a direction target (the others are read from hooks)."""
    a, lin, tcs = context.adapter, context.linearisation, context.transcoders
    out: dict[NodeId, float] = {}
    norm = a.norm("ln_final")
    n = c[a.hook_norm_normalized("ln_final")]
    final_in = n * norm.gamma if norm.gamma is not None else n
    if norm.beta is not None:
        final_in = final_in + norm.beta
    W_U, b_U = a.W_U, a.b_U
    feature_pre: dict[int, torch.Tensor] = {}
    neuron_val: dict[int, torch.Tensor] = {}
    for nid in (context.reader_ids() if readers is None else readers):
        t = nid.position
        if nid.kind == "feature":
            if nid.layer not in feature_pre:
                tc = require_dictionary(tcs, f"feature reader {nid}")[nid.layer]
                x = dictionary_input(a, tc.input_site, nid.layer, *_mlp_inputs(a, c, nid.layer))
                feature_pre[nid.layer] = tc.pre_activation(x)
            out[nid] = float(feature_pre[nid.layer][t, nid.index])
            continue
        if nid.kind == "neuron" and a.facts.num_experts:
            # expert neuron: routing weight and gate frozen, W_in^e[:, i] read on ln2's output
            layer, e = nid.layer, nid.index // a.facts.d_mlp
            x2 = dictionary_input(a, "mlp_input", layer, *_mlp_inputs(a, c, layer))[t]
            w = a.expert_neuron_weights(layer, torch.tensor([nid.index]))
            i = nid.index
            linear = lin.mlp_pre_linear[layer]
            if linear is None:
                raise ValidationRunError(f"reader {nid}: layer {layer}'s experts recorded no value branch")
            scale, offset = a.expert_value_map(layer, lin.mlp_pre[layer][t, i:i + 1],
                                               linear[t, i:i + 1], w["b_in"])
            route = lin.routing[layer][t, e]
            out[nid] = float(route * (scale[0] * (x2 @ w["W_in"][:, 0].to(x2.dtype)) + offset[0]))
            continue
        if nid.kind == "neuron":
            if nid.layer not in neuron_val:
                if a.facts.gated_mlp:
                    gate = a.mlp_act_fn(nid.layer)(lin.mlp_pre[nid.layer])
                    b_in = a.mlp_weights(nid.layer)["b_in"]
                    neuron_val[nid.layer] = gate * c[a.hook_mlp_pre_linear(nid.layer)] + b_in
                else:
                    neuron_val[nid.layer] = c[a.hook_mlp_pre(nid.layer)]
            out[nid] = float(neuron_val[nid.layer][t, nid.index])
            continue
        node = context.attributed_node(nid)
        if node is None:
            raise ValidationRunError(f"reader {nid} reads nothing in this graph")
        if node.attrs.get("target_kind") in ("logit", "logit_diff"):
            toks = node.attrs.get("tokens")
            if not toks:
                raise ValidationRunError(f"reader {nid}: a logit target without its tokens")
            if len(toks) == 2:
                w, b = W_U[:, toks[0]] - W_U[:, toks[1]], b_U[toks[0]] - b_U[toks[1]]
            else:
                w, b = W_U[:, toks[0]], b_U[toks[0]]
                if node.attrs.get("relative_to_mean"):
                    w, b = w - W_U.mean(-1), b - b_U.mean()
            out[nid] = float(final_in[t] @ w + b)
        elif node.attrs.get("target_kind") == "direction":
            site, layer, reader = node.attrs.get("site"), nid.layer, context.reader(nid)
            if reader is None:
                raise ValidationRunError(f"reader {nid} has no read direction")
            if site == "resid_mid":
                x = _resid_mid(a, c, layer)
            else:
                x = c[a.hook_resid_pre(layer) if site == "resid_pre" else a.hook_resid_post(layer)]
            out[nid] = float(x[t] @ reader.direction.to(x.dtype))
    return out


def _resid_mid(a: ModelAdapter, c: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
    """The residual after block ``layer``'s attention (``x_pre + attn_out`` in a parallel block)."""
    if a.facts.parallel_attn_mlp:
        return c[a.hook_resid_pre(layer)] + c[a.hook_attn_out(layer)]
    return c[a.hook_resid_mid(layer)]


def _mlp_inputs(a: ModelAdapter, c: dict[str, torch.Tensor], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(the residual block layer's MLP reads, ln2's P(x)/sigma of it)`` from captured hooks:
    x_pre in a parallel block, x_mid otherwise; the residual itself where there is no input ln2."""
    resid = c[a.hook_resid_pre(layer)] if a.facts.parallel_attn_mlp else c[a.hook_resid_mid(layer)]
    return resid, c[a.hook_norm_normalized("ln2", layer)] if a.has_norm("ln2") else resid


def frozen_ablation_effects(context: AttributionContext, writers: Iterable[NodeId]) -> dict[NodeId, dict[NodeId, float]]:
    """For each writer: ``{reader: base - ablated}`` in the frozen model (should equal the edges)."""
    base = frozen_reader_values(context)
    effects = {}
    for w in writers:
        ablated = frozen_reader_values(context, [w])
        effects[w] = {r: base[r] - ablated[r] for r in base}
    return effects
