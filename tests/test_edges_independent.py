"""Every edge, recomputed without the engine: TransformerLens, sae-lens and hooks only.

The engine's completeness identity cannot catch a writer vector that is wrong but
self-consistent (a wrong decoder row is absorbed by the error node), and the removal check
in :mod:`circuitgraph.validation.frozen` removes the engine's own writer vectors.  Here
nothing of circuitgraph's computation is used (not its linearisation, norms, writer vectors,
reader directions or frozen model); only its graph is read:

* writers are rebuilt from the libraries: a feature is ``activation x decoder row`` (sae-lens
  ``encode`` on the input TransformerLens cached, ``W_dec`` of the sae-lens object); an error
  node is the cached MLP output minus the sae-lens reconstruction (plus the skip path); a head
  and a neuron are TransformerLens's own ``stack_head_results`` / ``stack_neuron_results``; a
  token embedding is ``hook_embed``;
* the frozen model is TransformerLens's own forward with every norm scale (``hook_scale``,
  i.e. sigma) and attention pattern (``hook_pattern``) replaced by its cached value and
  every MLP output fixed at its cached value (plus the linear skip path), attention outputs
  fixed too in layers split into heads;
* readers are read from that forward: a feature's pre-activation is its encoder row on the
  transcoder input hook plus ``b_enc``, a neuron's is ``hook_pre``, a logit's is ``W_U``
  applied to ``ln_final``'s output.

One batched forward removes each writer in its own batch row; ``reader(base) - reader(removed)``
is the edge.  A wrong decoder row, norm scale, head, position or attention map makes this
test fail (see scripts/mutation_check.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitgraph.attribution import attribute
from circuitgraph.graph.nodes import NodeId
from tests.conftest import assert_edges_equal, load_bundle, removal_effects

#: (variant, transcoder kind, input site, granularity)
CASES = [
    ("ln-gelu-learned", "relu", "normalized", "default"),
    ("ln-gelu-learned", "skip", "raw", "default"),
    ("rms-gated-rotary-gqa", "jumprelu_skip", "normalized", "default"),
    ("ln-gelu-learned", "relu", "normalized", "neurons-heads"),
    ("lnpre-relu-rotary", "jumprelu", "normalized", "features-heads"),
    ("none-relu-learned", "relu", "raw", "default"),
    ("none-relu-bidirectional", "skip", "raw", "default"),
    ("none-relu-bidirectional", "relu", "raw", "neurons-heads"),
    ("ln-attnonly-rotary", "relu", "normalized", "default"),
    ("ln-attnonly-rotary", "relu", "normalized", "features-heads"),
]


def _bundle(tmp_path, variant: str, kind: str, site: str):
    from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model
    from tests.conftest import VARIANTS

    model = tiny_model(seed=1, n_layers=3, **VARIANTS[variant])
    raw = random_transcoders(model, kind=kind, input_site=site, seed=1, active_frac=0.3)
    gen = torch.Generator().manual_seed(5)
    tokens = [1] + torch.randint(3, model.cfg.d_vocab, (8,), generator=gen).tolist()
    path = save_bundle(tmp_path / "bundle", model, raw, prompt_tokens=tokens)
    return path, {layer: tc.to(torch.float64) for layer, tc in raw.items()}


class _Reference:
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


@pytest.mark.parametrize("variant,kind,site,granularity", CASES)
def test_every_edge_equals_the_libraries_removal(tmp_path, variant, kind, site, granularity):
    path, raw = _bundle(tmp_path, variant, kind, site)
    adapter, tcs, tokens = load_bundle(path, "float64")
    options = {"default": {}, "neurons-heads": dict(mlp="neurons", attention="heads"),
               "features-heads": dict(attention={0: "frozen", 1: "heads", 2: "frozen"})}[granularity]
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, **options)
    heads = {n.layer for n in g.nodes if n.kind == "attention_head"}
    ref = _Reference(adapter.transformer_lens_model(), tokens, raw, heads)
    writers = [n.id for n in g.nodes if n.kind in ("embedding", "feature", "error", "attention_head", "neuron")]
    removals = []
    for w in writers:
        hook, vec = ref.writer_vector(w)
        removals.append((hook, w.position, vec))
    captured = ref.run(removals)
    readers = [n for n in g.nodes if n.pre_activation is not None]
    kinds = {n.id.kind for n in readers}
    assert kinds >= {"logit"} and (adapter.facts.attn_only or (kinds & {"feature", "neuron"})), kinds
    expected = removal_effects(g, readers, lambda r: ref.reader_values(r, captured))
    assert_edges_equal(g, readers, writers, expected, what="libraries")
    # where attention is frozen somewhere, edges cross it: a writer reaches a later position
    assert len(heads) == adapter.facts.n_layers or any(expected[i, j] != 0 and writers[j].position < readers[i].id.position
               for i in range(len(readers)) for j in range(len(writers)))


def test_bidirectional_edges_reach_earlier_positions(tmp_path):
    """Bidirectional attention: writers at later positions have edges into earlier readers, and
    each equals the libraries' removal (the case the causal position bands would miss)."""
    path, raw = _bundle(tmp_path, "none-relu-bidirectional", "relu", "raw")
    adapter, tcs, tokens = load_bundle(path, "float64")
    assert not adapter.facts.causal
    g = attribute(adapter, tokens, tcs, dtype=torch.float64)
    ref = _Reference(adapter.transformer_lens_model(), tokens, raw, set())
    readers = [n for n in g.nodes if n.pre_activation is not None and n.position < len(tokens) - 1]
    writers = [n.id for n in g.nodes if n.kind in ("embedding", "feature", "error")
               and n.position > min(r.position for r in readers)]
    removals = [(h, w.position, v) for w in writers for h, v in [ref.writer_vector(w)]]
    captured = ref.run(removals)
    dense = g.dense_adjacency(dtype=np.float64)
    n_later = 0
    for r in readers:
        expected = (ref.reader_values(r, captured)[0] - ref.reader_values(r, captured)[1:]).double().numpy()
        got = dense[g.index_of(r.id), [g.index_of(w) for w in writers]]
        np.testing.assert_allclose(got, expected, atol=1e-9 * max(1.0, np.abs(expected).max()))
        n_later += int(sum(1 for w, e in zip(writers, expected, strict=False) if w.position > r.position and abs(e) > 1e-6))
    assert n_later > 10
