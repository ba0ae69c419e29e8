"""The linearisation: everything frozen at its value on one prompt.

:func:`linearise` runs the real model once and records, per site and position, every norm's
sigma (ln1, ln2, ln_final and the post-norms where the architecture has them), every
attention pattern, the residual stream, the MLP hooks and the transcoder inputs.  With these
values frozen the model is affine in the residual stream (DESIGN.md section 2).

:func:`frozen` is the scoped intervention that makes the *real* TransformerLens model
compute with those frozen values (hooks on ``hook_scale`` and ``hook_pattern``, plus any
extra hooks, e.g. fixed MLP outputs); the hooks are always removed on exit.  It is used by
validation and by the tests as an independent check of the engine.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitgraph._finite import first_nonfinite
from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.errors import NumericalError

if TYPE_CHECKING:
    from circuitgraph.dictionaries.protocol import Dictionary

if TYPE_CHECKING:  # shapes for readers and the type checker (docs/architecture.md, "Tooling"); not checked at run time
    from jaxtyping import Float, Int

__all__ = ["Linearisation", "linearise", "frozen", "norm_sites", "OffloadedPatterns", "offload_patterns",
           "pattern_block", "OFFLOAD_PATTERNS_BYTES", "mlp_input_resid"]


def norm_sites(adapter: ModelAdapter) -> list[tuple[str, int | None]]:
    """All (site, layer) norm sites of the model, ln_final last."""
    sites: list[tuple[str, int | None]] = []
    for layer in range(adapter.facts.n_layers):
        sites += [("ln1", layer), ("ln2", layer)]
        if adapter.facts.post_norms:
            sites += [("ln1_post", layer), ("ln2_post", layer)]
    sites.append(("ln_final", None))
    return sites


@dataclass
class Linearisation:
    """Values of one forward pass, frozen.  Shapes drop the batch dimension.

    Attributes:
        tokens: ``(pos,)`` prompt token ids.
        sigma: ``{(site, layer): (pos,)}`` norm scales (``hook_scale``).
        patterns: per layer ``(n_heads, pos, pos)`` attention patterns.
        resid_pre, resid_mid: per layer ``(pos, d_model)``; ``resid_final`` = last resid_post.
        attn_out, mlp_out: per layer ``(pos, d_model)`` (after post-norms).
        z: per layer ``(pos, n_heads, d_head)``.
        mlp_pre, mlp_post: per layer ``(pos, d_mlp)``; ``mlp_pre_linear`` for gated MLPs.
        tc_input: per transcoder layer, the transcoder's input ``(pos, d_in)``.
        logits: ``(pos, d_vocab)`` real logits (after any soft-cap).
        qk_sigma: ``{("q" | "k", layer): sigma}`` of query/key norms: ``(pos, heads)`` for per-head
            norms (key heads: the model's key/value heads), ``(pos, 1)`` for norms over the whole
            projection; empty without query/key norms.
        routing: per MoE layer, ``(pos, num_experts)`` routing weights (0 for experts not chosen);
            ``mlp_pre``/``mlp_pre_linear``/``mlp_post`` of a MoE layer are over the flat expert neuron
            index ``e * d_mlp + i`` (gate, linear branch, and activation *including the routing
            weight*), 0 for experts not chosen.
    """

    tokens: Int[torch.Tensor, " pos"]
    sigma: dict[tuple[str, int | None], Float[torch.Tensor, " pos"]]
    patterns: Sequence[Float[torch.Tensor, "heads pos pos"]]  # a list, or OffloadedPatterns on long prompts
    resid_pre: list[Float[torch.Tensor, "pos d_model"]]
    resid_mid: list[Float[torch.Tensor, "pos d_model"]]
    resid_final: Float[torch.Tensor, "pos d_model"]
    attn_out: list[Float[torch.Tensor, "pos d_model"]]
    mlp_out: list[Float[torch.Tensor, "pos d_model"]]
    z: list[Float[torch.Tensor, "pos heads d_head"]]
    mlp_pre: list[Float[torch.Tensor, "pos neurons"]]  # neurons: d_mlp (n_experts * d_mlp in a MoE layer)
    mlp_post: list[Float[torch.Tensor, "pos neurons"]]
    mlp_pre_linear: list[Float[torch.Tensor, "pos neurons"] | None]
    tc_input: dict[int, Float[torch.Tensor, "pos d_in"]]
    logits: Float[torch.Tensor, "pos d_vocab"]
    embed: Float[torch.Tensor, "pos d_model"]
    pos_embed: Float[torch.Tensor, "pos d_model"] | None
    extra: dict[str, Any] = field(default_factory=dict)
    qk_sigma: dict[tuple[str, int], Float[torch.Tensor, "pos heads"]] = field(default_factory=dict)
    routing: dict[int, Float[torch.Tensor, "pos experts"]] = field(default_factory=dict)

    @property
    def n_pos(self) -> int:
        return int(self.tokens.shape[0])


#: attention patterns of a prompt (all layers) larger than this (bytes) are kept in a temporary
#: file on CPU runs and read per layer when needed (:class:`OffloadedPatterns`)
OFFLOAD_PATTERNS_BYTES = 256 * 1024**2


class OffloadedPatterns(Sequence):
    """Per layer ``(n_heads, pos, pos)`` attention patterns held in an anonymous temporary file
    instead of memory (they grow as ``layers x heads x pos^2``: 2.4 GB for 12 layers of 12 heads at
    2,048 tokens).  ``patterns[layer]`` reads one layer; :meth:`block` only the first ``n``
    query and key positions, what a sweep of readers at positions below ``n`` needs.  The file
    is read with plain reads (not mapped), so only the layer being used is resident."""

    def __init__(self, patterns: list[torch.Tensor]):
        self.n_layers = len(patterns)
        self.shape = tuple(patterns[0].shape)  # (H, T, T)
        self.dtype = patterns[0].dtype
        self._np_dtype = patterns[0].cpu().numpy().dtype if patterns else None
        self._file = tempfile.TemporaryFile(prefix="circuitgraph-patterns-")
        for p in patterns:
            self._file.write(p.detach().cpu().contiguous().numpy().tobytes())
        self._file.flush()

    def __len__(self) -> int:
        return self.n_layers

    def __getitem__(self, layer: int) -> torch.Tensor:  # type: ignore[override]
        if isinstance(layer, slice):
            return [self[i] for i in range(self.n_layers)[layer]]
        return self.block(layer, self.shape[1])

    def block(self, layer: int, n: int) -> torch.Tensor:
        """``patterns[layer][:, :n, :n]``, read from the file."""
        if layer < 0:
            layer += self.n_layers
        H, T, _ = self.shape
        item = self._np_dtype.itemsize
        out = np.empty((H, n, n), dtype=self._np_dtype)
        fd = self._file.fileno()
        for h in range(H):
            offset = ((layer * H + h) * T * T) * item
            rows = np.frombuffer(os.pread(fd, n * T * item, offset), dtype=self._np_dtype).reshape(n, T)
            out[h] = rows[:, :n]
        return torch.from_numpy(out)


def pattern_block(patterns: Sequence, layer: int, n: int) -> Float[torch.Tensor, "heads n n"]:
    """``patterns[layer][:, :n, :n]`` for in-memory and offloaded patterns alike."""
    if isinstance(patterns, OffloadedPatterns):
        return patterns.block(layer, n)
    return patterns[layer][:, :n, :n]


def offload_patterns(lin: Linearisation) -> None:
    """Move ``lin.patterns`` to a temporary file (:class:`OffloadedPatterns`) when they are on the
    CPU and larger than :data:`OFFLOAD_PATTERNS_BYTES`."""
    ps = lin.patterns
    if isinstance(ps, OffloadedPatterns) or not ps or ps[0].device.type != "cpu":
        return
    if sum(p.numel() * p.element_size() for p in ps) <= OFFLOAD_PATTERNS_BYTES:
        return
    lin.patterns = OffloadedPatterns(ps)  # type: ignore[assignment]


def _check_finite(name: str, t: torch.Tensor) -> None:
    bad = first_nonfinite(t)
    if bad is not None:
        raise NumericalError(f"NaN or inf in {name} on this prompt (first at index {bad}); "
                             "check the model weights and dtype")


def _check_weights(adapter: ModelAdapter) -> None:
    for name, p in adapter.model.named_parameters():
        bad = first_nonfinite(p.detach())
        if bad is not None:
            raise NumericalError(f"model weight {name} holds NaN or inf (first at index {bad})")


@torch.no_grad()
def linearise(adapter: ModelAdapter, tokens: Int[torch.Tensor, " pos"],
              transcoders: Dictionary | None = None) -> Linearisation:
    """Run the model on ``tokens (pos,)`` and record every value the engine freezes."""
    _check_weights(adapter)
    a = adapter
    L = a.facts.n_layers
    attn_only = a.facts.attn_only
    names = {a.hook_embed()}
    if a.facts.positional == "learned":
        names.add(a.hook_pos_embed())
    for site, layer in norm_sites(a):
        if a.has_norm(site, layer):
            names.add(a.hook_norm_scale(site, layer))
    if a.has_norm("ln_final"):
        names.add(a.hook_norm_normalized("ln_final"))
    for layer in range(L):
        names |= {a.hook_resid_pre(layer), a.hook_resid_post(layer), a.hook_pattern(layer), a.hook_z(layer),
                  a.hook_attn_out(layer)}
        if not attn_only:
            names |= {a.hook_resid_mid(layer), a.hook_mlp_out(layer)}
            if a.facts.num_experts:  # mixture of experts: the routing and the experts' hooks
                names |= a.moe_hooks(layer)
            else:
                names |= {a.hook_mlp_pre(layer), a.hook_mlp_post(layer)}
                if a.facts.gated_mlp:
                    names.add(a.hook_mlp_pre_linear(layer))
        if a.has_norm("ln2", layer):
            names.add(a.hook_norm_normalized("ln2", layer))
        if a.facts.qk_norm != "none":
            names |= {a.hook_qk_norm_scale("q", layer), a.hook_qk_norm_scale("k", layer)}
    toks = tokens.to(a.device).unsqueeze(0)
    logits, cache = a.model.run_with_cache(toks, names_filter=lambda n: n in names)
    moe = {l: a.moe_activations(cache, l, toks.shape[1]) for l in range(L)} if a.facts.num_experts else {}
    qk_sigma = {(side, l): cache[a.hook_qk_norm_scale(side, l)].reshape(toks.shape[1], -1).detach()
                for l in range(L) for side in ("q", "k") if a.facts.qk_norm != "none"}
    flat = {n for l in range(L) for n in (a.moe_hooks(l) if a.facts.num_experts else ())}  # no batch dimension
    flat |= {a.hook_qk_norm_scale(side, layer) for side, layer in qk_sigma}
    c = {k: v[0].detach() for k, v in cache.items() if k not in flat}
    for l, m in moe.items():
        c[a.hook_mlp_pre(l)], c[a.hook_mlp_pre_linear(l)], c[a.hook_mlp_post(l)] = m["gate"], m["linear"], m["activation"]
    logits = logits[0].detach()
    _check_finite("logits", logits)
    T = toks.shape[1]
    ones = torch.ones(T, dtype=c[a.hook_embed()].dtype, device=c[a.hook_embed()].device)
    # a site without a norm (norm-free models; ln2 of attention-only ones) is the identity: sigma = 1
    sigma = {(site, layer): c[a.hook_norm_scale(site, layer)][..., 0] if a.has_norm(site, layer) else ones
             for site, layer in norm_sites(a)}
    if attn_only:  # no MLP: resid_mid(l) is resid_post(l) and the MLP writes nothing
        for layer in range(L):
            post = c[a.hook_resid_post(layer)]
            c[a.hook_resid_mid(layer)] = post
            c[a.hook_mlp_out(layer)] = torch.zeros_like(post)
            c[a.hook_mlp_pre(layer)] = c[a.hook_mlp_post(layer)] = post.new_zeros(T, 0)
    for layer in range(L):
        if not a.has_norm("ln2", layer):
            c[a.hook_norm_normalized("ln2", layer)] = c[a.hook_resid_mid(layer)]
    if not a.has_norm("ln_final"):
        c[a.hook_norm_normalized("ln_final")] = c[a.hook_resid_post(L - 1)]
    resid_mid = [_resid_mid(a, c, l) for l in range(L)]
    lin = Linearisation(
        tokens=tokens.detach().cpu(),
        sigma=sigma,
        patterns=[c[a.hook_pattern(l)] for l in range(L)],
        resid_pre=[c[a.hook_resid_pre(l)] for l in range(L)],
        resid_mid=resid_mid,
        resid_final=c[a.hook_resid_post(L - 1)],
        attn_out=[c[a.hook_attn_out(l)] for l in range(L)],
        mlp_out=[c[a.hook_mlp_out(l)] for l in range(L)],
        z=[c[a.hook_z(l)] for l in range(L)],
        mlp_pre=[c[a.hook_mlp_pre(l)] for l in range(L)],
        mlp_post=[c[a.hook_mlp_post(l)] for l in range(L)],
        mlp_pre_linear=[c.get(a.hook_mlp_pre_linear(l)) for l in range(L)],
        tc_input={},
        qk_sigma=qk_sigma,
        routing={l: m["routing"] for l, m in moe.items()},
        logits=logits,
        embed=c[a.hook_embed()],
        pos_embed=c.get(a.hook_pos_embed()),
        extra={"ln_final_normalized": c[a.hook_norm_normalized("ln_final")],
               "ln2_normalized": [c[a.hook_norm_normalized("ln2", l)] if a.has_norm("ln2") else
                                  mlp_input_resid(a, c[a.hook_resid_pre(l)], resid_mid[l]) for l in range(L)]},
    )
    for layer in range(L):
        _check_finite(a.hook_resid_post(layer), c[a.hook_resid_post(layer)])
    if transcoders is not None:
        for layer, tc in transcoders.layers.items():
            lin.tc_input[layer] = dictionary_input(
                adapter, tc.input_site, layer, mlp_input_resid(adapter, lin.resid_pre[layer], lin.resid_mid[layer]),
                lin.extra["ln2_normalized"][layer])
    offload_patterns(lin)
    return lin


def _resid_mid(adapter: ModelAdapter, cache: dict, layer: int) -> torch.Tensor:
    """The residual stream after block ``layer``'s attention. A parallel block (GPT-NeoX, GPT-J,
    Phi) has no ``hook_resid_mid``: its MLP reads the block input, and ``x_pre + attn_out`` is what
    the engine's resid_mid location holds (what a direction reader there reads)."""
    if adapter.facts.parallel_attn_mlp:
        return cache[adapter.hook_resid_pre(layer)] + cache[adapter.hook_attn_out(layer)]
    return cache[adapter.hook_resid_mid(layer)]


def mlp_input_resid(adapter: ModelAdapter, resid_pre: Float[torch.Tensor, "pos d_model"],
                    resid_mid: Float[torch.Tensor, "pos d_model"]) -> Float[torch.Tensor, "pos d_model"]:
    """The residual stream block ``l``'s MLP reads: ``x_mid``, or ``x_pre`` in a parallel block."""
    return resid_pre if adapter.facts.parallel_attn_mlp else resid_mid


def dictionary_input(adapter: ModelAdapter, site: str, layer: int, resid_mid: torch.Tensor,
                     ln2_normalized: torch.Tensor) -> torch.Tensor:
    """What a dictionary of ``layer`` reads: ``raw`` = resid_mid, ``normalized`` = ln2's
    ``P(x)/sigma`` (TransformerLens ``ln2.hook_normalized``), ``mlp_input`` = the MLP's input
    ``gamma * P(x)/sigma + beta`` (circuit-tracer's ``mlp.hook_in``)."""
    if site == "raw":
        return resid_mid
    if site == "normalized":
        return ln2_normalized
    norm = adapter.norm("ln2", layer)
    out = ln2_normalized * norm.gamma if norm.gamma is not None else ln2_normalized
    return out + norm.beta if norm.beta is not None else out


@contextlib.contextmanager
def frozen(
    adapter: ModelAdapter,
    lin: Linearisation,
    extra_hooks: list[tuple[str, Callable]] | None = None,
    *,
    freeze_norms: bool = True,
    freeze_patterns: bool = True,
) -> Iterator[Any]:
    """Scoped: the real model computes with frozen sigmas and attention patterns.

    Usage::

        with frozen(adapter, lin, extra_hooks=[("blocks.0.hook_mlp_out", fn)]) as model:
            logits = model(tokens[None])

    All hooks are removed on exit, even on error.
    """
    a = adapter
    hooks: list[tuple[str, Callable]] = []
    if freeze_norms:
        for site, layer in norm_sites(a):
            if not a.has_norm(site, layer):
                continue
            value = lin.sigma[(site, layer)]

            def fix_scale(scale, hook, value=value):
                return value.to(scale.dtype)[None, :, None].expand_as(scale).clone()

            hooks.append((a.hook_norm_scale(site, layer), fix_scale))
    if freeze_patterns:
        for layer in range(a.facts.n_layers):

            def fix_pattern(pattern, hook, layer=layer):
                value = lin.patterns[layer]  # read here: offloaded patterns are not all loaded at once
                return value.to(device=pattern.device, dtype=pattern.dtype)[None].expand_as(pattern).clone()

            hooks.append((a.hook_pattern(layer), fix_pattern))
    hooks += list(extra_hooks or [])
    with a.hooks(hooks) as model:  # the adapter's hooks: aliases on models without norms or MLPs
        yield model
