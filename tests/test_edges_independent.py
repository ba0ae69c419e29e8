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
from tests.helpers.bundles import load_bundle
from tests.helpers.edges import Reference, assert_edges_equal, removal_effects

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
    from tests.helpers.bundles import VARIANTS

    model = tiny_model(seed=1, n_layers=3, **VARIANTS[variant])
    raw = random_transcoders(model, kind=kind, input_site=site, seed=1, active_frac=0.3)
    gen = torch.Generator().manual_seed(5)
    tokens = [1] + torch.randint(3, model.cfg.d_vocab, (8,), generator=gen).tolist()
    path = save_bundle(tmp_path / "bundle", model, raw, prompt_tokens=tokens)
    return path, {layer: tc.to(torch.float64) for layer, tc in raw.items()}




@pytest.mark.parametrize("variant,kind,site,granularity", CASES)
def test_every_edge_equals_the_libraries_removal(tmp_path, variant, kind, site, granularity):
    path, raw = _bundle(tmp_path, variant, kind, site)
    adapter, tcs, tokens = load_bundle(path, "float64")
    options = {"default": {}, "neurons-heads": dict(mlp="neurons", attention="heads"),
               "features-heads": dict(attention={0: "frozen", 1: "heads", 2: "frozen"})}[granularity]
    g = attribute(adapter, tokens, tcs, dtype=torch.float64, **options)
    heads = {n.layer for n in g.nodes if n.kind == "attention_head"}
    ref = Reference(adapter.transformer_lens_model(), tokens, raw, heads)
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
    ref = Reference(adapter.transformer_lens_model(), tokens, raw, set())
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
