"""Edges checked against an independent reference (TransformerLens, sae-lens and hooks only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.graph.nodes import NodeId


def removal_effects(graph, readers, values_of) -> np.ndarray:
    """``expected[i, j]``: reader ``i``'s value minus its value with writer ``j`` removed, from an
    independent reference: ``values_of(reader)`` gives ``[base, without writer 0, without writer 1,
    ...]``; the base must be the graph's measured pre-activation (frozen = real at the prompt)."""
    rows = []
    for r in readers:
        values = values_of(r).double()
        assert float(values[0]) == pytest.approx(r.pre_activation, abs=1e-9)
        rows.append((values[0] - values[1:]).numpy())
    return np.stack(rows)


def assert_edges_equal(graph, readers, writers, expected: np.ndarray, what: str = "reference") -> None:
    """Every edge ``writer -> reader`` of ``graph`` equals ``expected`` (``removal_effects``) to 1e-9
    of the largest one, naming the worst edge otherwise."""
    dense = graph.dense_adjacency(dtype=np.float64)
    got = dense[np.ix_([graph.index_of(r.id) for r in readers], [graph.index_of(w) for w in writers])]
    scale = np.abs(expected).max()
    assert scale > 0.1
    worst = np.unravel_index(np.abs(got - expected).argmax(), got.shape)
    assert np.abs(got - expected).max() < 1e-9 * scale, (
        f"edge {writers[worst[1]]} -> {readers[worst[0]].id}: graph {got[worst]:.6g}, {what} {expected[worst]:.6g}")


class Reference:
    """TransformerLens's frozen forward, rebuilt from hooks, with writers removed per batch row."""

    def __init__(self, model, tokens: list[int], transcoders: dict, heads_layers: set[int]):
        self.model, self.tcs, self.heads_layers = model, transcoders, heads_layers
        self.tokens = torch.tensor([tokens])
        _, self.cache = model.run_with_cache(self.tokens)
        self.T, self.D = len(tokens), model.cfg.d_model
        self._stacks: dict[tuple[str, int], torch.Tensor] = {}

    def _stack(self, what: str, layer: int, make) -> torch.Tensor:
        if (what, layer) not in self._stacks:
            self._stacks[(what, layer)] = make()
        return self._stacks[(what, layer)]

    # ---------------------------------------------------------------- writers, from the libraries
    @torch.no_grad()
    def writer_vector(self, node: NodeId) -> tuple[str, torch.Tensor]:
        """(hook the writer adds to, its output vector at its position)."""
        c, layer, t, i = self.cache, node.layer, node.position, node.index
        if node.kind == "embedding":
            return "hook_embed", c["hook_embed"][0, t]
        if node.kind == "feature":
            tc = self.tcs[layer]
            act = tc.encode(c[tc.cfg.metadata.hook_name][0])[t, i]
            return f"blocks.{layer}.hook_mlp_out", act * tc.W_dec[i]
        if node.kind == "error":
            tc = self.tcs[layer]
            x = c[tc.cfg.metadata.hook_name][0]
            recon = tc(x)  # sae-lens's forward: decode(encode(x)), plus x W_skip^T for skip transcoders
            return f"blocks.{layer}.hook_mlp_out", (c[f"blocks.{layer}.hook_mlp_out"][0] - recon)[t]
        if node.kind == "attention_head":  # (layers * heads, batch, T, D): every head of layers <= layer
            stack = self._stack("heads", layer, lambda: c.stack_head_results(layer=layer + 1, apply_ln=False))
            vec = stack[layer * self.model.cfg.n_heads + i, 0, t]
            return f"blocks.{layer}.hook_attn_out", self._through_post_norm(layer, "attn", vec, t)
        if node.kind == "neuron":
            stack = self._stack("neurons", layer, lambda: c.stack_neuron_results(layer=layer + 1, apply_ln=False))
            vec = stack[layer * self.model.cfg.d_mlp + i, 0, t]
            return f"blocks.{layer}.hook_mlp_out", self._through_post_norm(layer, "mlp", vec, t)
        raise AssertionError(f"no reference for writer {node}")

    def _through_post_norm(self, layer: int, which: str, vec: torch.Tensor, t: int) -> torch.Tensor:
        """A sublayer's output as it reaches the residual stream through the block's post-norm
        (Gemma-2/3 ``ln1_post``/``ln2_post``; OLMo-2, whose TransformerLens ``ln1``/``ln2`` normalise
        the outputs), with that norm's scale frozen at its cached ``hook_scale``; unchanged without one."""
        block, m = self.model.blocks[layer], self.model
        name = {"attn": "ln1", "mlp": "ln2"}[which]
        if getattr(m.cfg, "use_normalization_before_and_after", False):
            name += "_post"
        elif m.cfg.original_architecture not in ("Olmo2ForCausalLM", "Olmo3ForCausalLM"):
            return vec
        norm = getattr(block, name)
        scale = self.cache[f"blocks.{layer}.{name}.hook_scale"][0, t, 0]
        return vec * norm.w / scale  # RMSNorm: no centring, no beta

    # ---------------------------------------------------------------- frozen forward
    def run(self, removals: list[tuple[str, int, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Batch row 0: nothing removed; row k: removal k-1.  Returns the hooks readers read."""
        B, c, m = len(removals) + 1, self.cache, self.model
        delta: dict[str, torch.Tensor] = {}
        for k, (hook, t, vec) in enumerate(removals, start=1):
            delta.setdefault(hook, torch.zeros(B, self.T, self.D, dtype=vec.dtype))[k, t] += vec
        captured: dict[str, torch.Tensor] = {}

        def fixed(name):
            return lambda value, hook: c[name].expand_as(value).clone()

        def keep(value, hook):
            captured[hook.name] = value
            return value

        hooks = []
        # query/key norm scales (".attn.") only feed the patterns, which are fixed themselves
        names = [n for n in c.keys() if (n.endswith("hook_scale") and ".attn." not in n) or n.endswith("hook_pattern")]
        hooks += [(n, fixed(n)) for n in names]
        for layer in range(m.cfg.n_layers):
            tc = self.tcs.get(layer)
            if tc is not None and "W_skip" in dict(tc.named_parameters()):
                hooks.append((tc.cfg.metadata.hook_name, keep))
            if layer in self.heads_layers:
                hooks.append((f"blocks.{layer}.hook_attn_out", fixed(f"blocks.{layer}.hook_attn_out")))

            def mlp_out(value, hook, layer=layer, tc=tc):
                out = c[hook.name].expand_as(value).clone()
                if tc is not None and "W_skip" in dict(tc.named_parameters()):
                    name = tc.cfg.metadata.hook_name
                    out = out + (captured[name] - c[name]) @ tc.W_skip.T
                return out

            if not m.cfg.attn_only:
                hooks.append((f"blocks.{layer}.hook_mlp_out", mlp_out))
        for hook_name, d in delta.items():  # after the fixing hooks on the same point
            hooks.append((hook_name, lambda value, hook, d=d: value - d))
        if m.cfg.gated_mlp:  # gated neurons read with their gates frozen: hook_pre is the gate
            hooks += [(f"blocks.{l}.mlp.hook_pre", fixed(f"blocks.{l}.mlp.hook_pre")) for l in range(m.cfg.n_layers)]
        read = ["ln_final.hook_normalized"] + [f"blocks.{l}.{s}" for l in range(m.cfg.n_layers)
                                               for s in ("ln2.hook_normalized", "hook_resid_mid", "mlp.hook_pre",
                                                         "mlp.hook_post")]
        if m.cfg.normalization_type is None:  # no ln_final: the unembedding reads the last resid_post
            read.append(f"blocks.{m.cfg.n_layers - 1}.hook_resid_post")
        hooks += [(n, keep) for n in read if n in m.hook_dict]  # parallel blocks have no hook_resid_mid
        with torch.no_grad():
            m.run_with_hooks(self.tokens.expand(B, -1), fwd_hooks=hooks)
        return captured

    # ---------------------------------------------------------------- readers
    @torch.no_grad()
    def reader_values(self, node, captured) -> torch.Tensor:
        """(B,) pre-activation of a reader node in every batch row."""
        nid, t, m = node.id, node.position, self.model
        if nid.kind == "feature":
            tc = self.tcs[nid.layer]
            x = captured[tc.cfg.metadata.hook_name][:, t]
            return x @ tc.W_enc[:, nid.index] + tc.b_enc[nid.index]
        if nid.kind == "neuron":
            hook = "mlp.hook_post" if m.cfg.gated_mlp else "mlp.hook_pre"  # gated: the activation, gate frozen
            return captured[f"blocks.{nid.layer}.{hook}"][:, t, nid.index]
        if nid.kind == "logit":
            final = captured.get("ln_final.hook_normalized", captured.get(f"blocks.{m.cfg.n_layers - 1}.hook_resid_post"))
            final = final[:, t]
            if getattr(getattr(m, "ln_final", None), "w", None) is not None:
                final = final * m.ln_final.w
            if getattr(getattr(m, "ln_final", None), "b", None) is not None:
                final = final + m.ln_final.b
            w, b = m.W_U[:, nid.index], m.b_U[nid.index]
            if node.attrs.get("relative_to_mean"):
                w, b = w - m.W_U.mean(-1), b - m.b_U.mean()
            return final @ w + b
        raise AssertionError(f"no reference for reader {nid}")
