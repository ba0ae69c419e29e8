"""Attention scores recomputed from the model's own queries and keys, and the QK query checked on every head."""

from __future__ import annotations

import math

import pytest
import torch

from circuitgraph.queries import qk


def check_every_head(g, adapter, tokens, tol, key_positions=("top", 2)):
    f = adapter.facts
    for layer in range(f.n_layers):
        q, k, scores, _ = model_qk(adapter, tokens, layer)
        s_model = uncapped(scores, f.attn_scores_soft_cap)
        for kp in key_positions:
            res = qk(g, layer, list(range(f.n_heads)), -1, kp, top_k=3)
            assert [h.head for h in res.heads] == list(range(f.n_heads))
            for h in res.heads:
                t, kk = h.query_position, h.key_position
                assert t == len(tokens) - 1
                if kp != "top":
                    assert kk == (kp if kp >= 0 else len(tokens) + kp)
                magnitude = float(q[t, h.head].norm() * k[kk, h.head].norm()) / math.sqrt(f.d_head)
                ref = float(s_model[h.head, t, kk])
                for value in (h.score, h.pairs_sum_plus_constant, h.query_marginals_sum_plus_constant,
                              h.key_marginals_sum_plus_constant):
                    assert abs(value - ref) <= tol * magnitude, (layer, h.head, kp, value, ref, magnitude)
                assert h.score_capped == pytest.approx(float(scores[h.head, t, kk]), rel=1e-6, abs=1e-7)
                assert h.probability == pytest.approx(float(g.context.linearisation.patterns[layer][h.head, t, kk]))
                assert len(h.pairs) <= 3 and len(h.query_marginals) <= 3
                if kp == "top":
                    assert kk == int(g.context.linearisation.patterns[layer][h.head, t].argmax())


def model_qk(adapter, tokens, layer):
    """TransformerLens's q, k (rotated; grouped-query keys expanded) and hook_attn_scores."""
    rot = "rot_" if adapter.facts.positional == "rotary" else ""
    names = [f"blocks.{layer}.attn.hook_{rot}q", f"blocks.{layer}.attn.hook_{rot}k",
             f"blocks.{layer}.attn.hook_attn_scores", f"blocks.{layer}.ln1.hook_scale"]
    with torch.no_grad():
        _, cache = adapter.transformer_lens_model().run_with_cache(torch.tensor(tokens)[None],
                                                                 names_filter=lambda n: n in names)
    q, k = cache[names[0]][0], cache[names[1]][0]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    # a norm-free model has no ln1 (sigma = 1)
    sigma = cache[names[3]][0, :, 0] if names[3] in cache.cache_dict else torch.ones(len(tokens))
    return q.double(), k.double(), cache[names[2]][0].double(), sigma.double()


def uncapped(scores, cap):
    return scores if cap is None else cap * torch.atanh(scores / cap)
