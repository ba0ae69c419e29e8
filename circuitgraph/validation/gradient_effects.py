"""First-order removal effects by autograd on the model: ``a_u . dM/da_u`` per unit.

Removing unit ``u`` (scaling its output by ``c``) changes the metric ``M`` by
``-(1 - c) a_u . dM/da_u`` to first order, where ``a_u`` is the unit's output at its hook (a
neuron's activation, an embedding vector, a head's ``z``, an MLP's output) and the gradient is
taken on the prompt's forward pass.  This is *attribution patching* (Nanda 2023; Syed et al.
2023, "Attribution patching outperforms automated circuit discovery"; Kramár et al. 2024, AtP*).

Two models:

* ``linearised=False`` (default): the real model, every norm scale, attention pattern and MLP
  nonlinearity live: the first-order prediction of the real model's removal effect;
* ``linearised=True``: the graph's frozen linear model (the linearisation's sigmas and
  attention patterns frozen, each neuron's nonlinearity frozen as a slope: a gated neuron's gate
  detached, a GELU/ReLU neuron's ``post / pre``; logits read before a final soft cap, as the
  graph's targets are).  There the removal effect is linear in the
  unit, so ``-a_u . dM/da_u`` is exactly the total effect of the unit over *every* path,
  through every neuron of the model, kept as a node or not: on a graph that keeps every neuron
  it equals the graph's ``total_effects`` (an independent check of the back-substitution).

Only the hooks are used (no engine vectors): one forward and one backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.attribution.linearisation import frozen
from circuitgraph.errors import ValidationRunError
from circuitgraph.validation.interventions import Unit

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.hook_names import HookPointLike

__all__ = ["GRADIENT_SITES", "gradient_effects"]

#: sites whose first-order effect is computed (features and errors need a spliced dictionary)
GRADIENT_SITES = frozenset({"embed", "pos_embed", "neuron", "head", "mlp"})


def gradient_effects(adapter: ModelAdapter, tokens: Sequence[int], metric: Any, units: Sequence[Unit], *,
                     linearised: bool = False, linearisation: Any = None) -> list[float | None]:
    """Per unit, ``a_u . dM/da_u`` (float; ``None`` for a site outside :data:`GRADIENT_SITES`).

    ``metric``: a :class:`~circuitgraph.validation.metrics.Metric`.  ``linearised=True`` needs
    ``linearisation`` (the graph context's) and a dense MLP."""
    a = adapter
    if linearised and linearisation is None:
        raise ValidationRunError("gradient_effects(linearised=True) needs the graph's linearisation")
    if linearised and a.facts.num_experts:
        raise ValidationRunError("gradient_effects(linearised=True): mixture-of-experts MLPs have no dense neuron hook")
    for u in units:
        if u.site in GRADIENT_SITES and (u.position is None or u.index is None):
            raise ValidationRunError(f"unit {u}: a gradient effect needs one position and one index")
    wanted = {a.hook_site(u.site, u.layer) for u in units if u.site in GRADIENT_SITES}
    if not wanted:
        return [None] * len(units)
    readout_hooks = metric.hook_names(a)
    store: dict[str, torch.Tensor] = {}
    hooks: list[tuple[str, Any]] = []

    def leaf(value: torch.Tensor, hook: HookPointLike) -> torch.Tensor:
        value = value.detach().requires_grad_(True)  # the graph's roots: every later value needs grad
        store[hook.name] = value
        return value

    hooks.append((a.hook_embed(), leaf))
    if a.facts.positional == "learned" and a.has_hook(a.hook_pos_embed()):
        hooks.append((a.hook_pos_embed(), leaf))
    if linearised:
        hooks += _frozen_slopes(a)

    def keep(value: torch.Tensor, hook: HookPointLike) -> torch.Tensor:
        if hook.name in store:  # a root, already kept
            return value
        if not value.requires_grad:
            value = value.detach().requires_grad_(True)
        store[hook.name] = value
        return value

    hooks += [(name, keep) for name in sorted(wanted | readout_hooks)]
    toks = torch.as_tensor(list(tokens), device=a.device)[None]
    cfg = getattr(a.model, "cfg", None)
    cap = getattr(cfg, "output_logits_soft_cap", None)
    with torch.enable_grad():
        ctx = frozen(a, linearisation, extra_hooks=hooks) if linearised else a.hooks(hooks)
        try:
            if linearised and cap and cfg is not None:  # logit targets are read before the final soft cap
                cfg.output_logits_soft_cap = None
            with ctx as model:
                logits = model(toks)
                m = metric.combine(metric.values(logits, store, a))[0]
        finally:
            if linearised and cap and cfg is not None:
                cfg.output_logits_soft_cap = cap
        names = sorted(wanted)
        # only the units' gradients (never the parameters'): autograd.grad, not backward
        grads = dict(zip(names, torch.autograd.grad(m, [store[n] for n in names], allow_unused=True), strict=True))
    out: list[float | None] = []
    for u in units:
        if u.site not in GRADIENT_SITES:
            out.append(None)
            continue
        name = a.hook_site(u.site, u.layer)
        value, grad = store[name], grads[name]
        if grad is None:  # the metric does not depend on this hook (e.g. a layer after the readout)
            out.append(0.0)
            continue
        v, g = value.detach()[0, u.position].double(), grad[0, u.position].double()
        if u.site in ("neuron", "head"):
            v, g = v[u.index], g[u.index]
        out.append(float((v * g).sum()))
    return out


def _frozen_slopes(a: ModelAdapter) -> list[tuple[str, Any]]:
    """Hooks that freeze every MLP neuron's nonlinearity as a slope (the graph's linearisation):
    gated MLPs detach the gate; others replace ``post`` by ``(post / pre) * pre`` with the ratio
    detached (0 where ``pre == 0``)."""
    hooks: list[tuple[str, Any]] = []
    for layer in range(a.facts.n_layers):
        if not a.has_hook(a.hook_mlp_pre(layer)):
            continue
        if a.facts.gated_mlp:
            hooks.append((a.hook_mlp_pre(layer), lambda value, hook: value.detach()))
            continue
        pre_live: dict[str, torch.Tensor] = {}

        def cap(value: torch.Tensor, hook: HookPointLike, pre_live: dict = pre_live) -> torch.Tensor:
            pre_live["pre"] = value
            return value

        def slope(value: torch.Tensor, hook: HookPointLike, pre_live: dict = pre_live) -> torch.Tensor:
            pre = pre_live["pre"]
            nz = pre != 0
            ratio = torch.where(nz, value / torch.where(nz, pre, torch.ones_like(pre)), torch.zeros_like(pre))
            return ratio.detach() * pre

        hooks += [(a.hook_mlp_pre(layer), cap), (a.hook_mlp_post(layer), slope)]
    return hooks
