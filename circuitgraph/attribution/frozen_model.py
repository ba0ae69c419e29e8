"""The frozen (linear) model: its transpose, applied to reader directions.

With every sigma, attention pattern and node nonlinearity frozen, the residual stream is an
affine function of the writers.  A reader ``pre = g . x(loc, t) + c`` at residual location
``loc`` sees a writer ``u`` at an earlier location ``loc'`` and position ``s`` through the
gradient ``G(loc', s) = d pre / d x(loc', s)``, propagated backwards by the transposes of:

* the residual stream (identity);
* frozen attention (when attention is passed through): for destination ``t`` and source ``s``
  (``s <= t`` under causal attention, any ``s`` under bidirectional attention),
  ``G_pre(s) += P(gamma1 * sum_h sum_t A[h, t, s] W_V^h W_O^h G'(t)) / sigma1(s)`` with
  ``G'(t) = P(gamma1_post * G(t)) / sigma1_post(t)`` when the block has post-norms;
* the linear skip path of skip transcoders (through the frozen post-MLP norm's transpose when
  the transcoder writes before it, circuit-tracer's ``mlp.hook_out`` on Gemma-2-style models).

MLPs are replaced by their nodes (features + error, neurons + remainder, or one vector), so
no gradient flows through them otherwise: every path between two nodes passes through no
other node, which is exactly the direct effect (DESIGN.md section 2).

Residual locations (:class:`~circuitgraph.attribution.context.ResidualLocation`): ``0`` =
resid_pre(0); ``2l+1`` = resid_mid(l); ``2l+2`` = resid_post(l).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from circuitgraph.adapters.architecture import ModelAdapter, NormWeights
from circuitgraph.attribution.linearisation import Linearisation, OffloadedPatterns, pattern_block
from circuitgraph.residual import ResidualLocation

if TYPE_CHECKING:  # shapes for readers and the type checker (docs/architecture.md, "Tooling"); not checked at run time
    from jaxtyping import Float, Int

__all__ = ["FrozenLinearModel"]


#: sources per block when the frozen pattern is applied (causal attention: each block of sources
#: skips the earlier destinations, whose pattern entries are exactly zero)
CAUSAL_BLOCK = 256


@dataclass(frozen=True)
class _Norm(NormWeights):
    """A norm site with frozen sigma: forward linear part ``v -> gamma * P(v) / sigma``."""

    sigma: Float[torch.Tensor, " pos"]

    def transpose(self, g: Float[torch.Tensor, "*batch pos d_model"], positions: slice | torch.Tensor = slice(None),
                  ) -> Float[torch.Tensor, "*batch pos d_model"]:
        """``P(gamma * g) / sigma`` for ``g (..., pos, d_model)`` (``g`` is not modified)."""
        out = self.reader_direction(g)
        if out is g:
            return out / self.sigma[positions].unsqueeze(-1)
        out /= self.sigma[positions].unsqueeze(-1)
        return out

    def forward_linear(self, v: Float[torch.Tensor, "*batch pos d_model"], positions: torch.Tensor | slice = slice(None),
                       ) -> Float[torch.Tensor, "*batch pos d_model"]:
        """``gamma * P(v) / sigma`` for ``v (..., pos, d_model)``: a writer through a frozen post-norm."""
        if self.center:
            v = v - v.mean(-1, keepdim=True)
        v = v / self.sigma[positions].unsqueeze(-1)
        return v * self.gamma if self.gamma is not None else v


class FrozenLinearModel:
    """Weights and frozen values needed to propagate reader gradients, in the compute dtype."""

    def __init__(
        self,
        adapter: ModelAdapter,
        lin: Linearisation,
        *,
        attention_modes: dict[int, str],
        skip_layers: dict[int, tuple[torch.Tensor, str, bool]],
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.adapter = adapter
        self.lin = lin
        self.dtype = dtype
        self.device = torch.device(device)
        f = adapter.facts
        self.n_layers = f.n_layers
        self.n_pos = lin.n_pos
        #: causal attention (see :attr:`ArchitectureFacts.causal`): a pattern is lower-triangular
        self.causal = f.causal
        #: parallel blocks (GPT-NeoX, GPT-J, Phi): the MLP reads the block input x_pre
        self.parallel = f.parallel_attn_mlp
        self.attention_modes = attention_modes
        cast = lambda t: None if t is None else t.to(device=self.device, dtype=dtype)  # noqa: E731

        def norm(site: str, layer: int | None) -> _Norm:
            w: NormWeights = adapter.norm(site, layer)
            return _Norm(cast(w.gamma), cast(w.beta), w.center, cast(lin.sigma[(site, layer)]))

        self.ln1 = [norm("ln1", l) for l in range(f.n_layers)]
        self.ln2 = [norm("ln2", l) for l in range(f.n_layers)]
        self.ln1_post = [norm("ln1_post", l) for l in range(f.n_layers)] if f.post_norms else None
        self.ln2_post = [norm("ln2_post", l) for l in range(f.n_layers)] if f.post_norms else None
        self.ln_final = norm("ln_final", None)
        # offloaded patterns (long prompts) stay in their file: read per layer when needed
        self.patterns = lin.patterns if isinstance(lin.patterns, OffloadedPatterns) else [cast(p) for p in lin.patterns]
        self._cast = cast
        self.attn = []
        for l in range(f.n_layers):
            w = adapter.attn_weights(l)
            self.attn.append({k: cast(v) for k, v in w.items()})
        # skip transcoders: layer -> (W_skip (d_out, d_in), input_site, writes before the post-MLP norm)
        self.skip = {l: (cast(W), site, before_post) for l, (W, site, before_post) in skip_layers.items()}

    def mlp_input_location(self, layer: int) -> ResidualLocation:
        """Where block ``layer``'s MLP readers (neurons, transcoder features) read: resid_mid(l),
        or resid_pre(l) in a parallel block, whose MLP reads the block input (there is no location
        between its attention and its MLP: the MLP sees the writers up to x_pre, not its own
        block's attention)."""
        return ResidualLocation.resid_pre(layer) if self.parallel else ResidualLocation.resid_mid(layer)

    def pattern(self, layer: int, n: int | None = None) -> Float[torch.Tensor, "heads n n"]:
        """Layer ``layer``'s frozen attention pattern over the first ``n`` positions ``(H, n, n)``.

        The last block made is kept (one layer's at most) and a request for the same layer and
        no more positions is served from it: the engine sends the batches of one wave down
        together, widest first, so each offloaded layer is read (and cast) once per wave."""
        n = self.n_pos if n is None else n
        cached = getattr(self, "_pattern_cache", None)
        if cached is not None and cached[0] == layer and cached[1] >= n:
            return cached[2] if cached[1] == n else cached[2][:, :n, :n]
        self._pattern_cache = None  # the old block is released before the new one is read
        block = self._cast(pattern_block(self.patterns, layer, n))
        self._pattern_cache = (layer, n, block)
        return block

    def release_pattern_cache(self) -> None:
        """Drop the kept pattern block (:meth:`pattern`) and the attention transposes' scratch
        buffers (:meth:`_scratch`)."""
        self._pattern_cache = None
        self._scratch_buffers = [None, None]

    def _scratch(self, slot: int, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """One of the two scratch buffers the attention transposes reuse from call to call (a
        fresh tensor of a batch's gradient size is page-faulted in on first touch: a fifth of
        a long prompt's run was the kernel zeroing those pages)."""
        n = math.prod(shape)
        buffers = getattr(self, "_scratch_buffers", None)
        if buffers is None:
            buffers = self._scratch_buffers = [None, None]
        buf = buffers[slot]
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buffers[slot] = None  # the old one released before the larger one is made
            buf = buffers[slot] = torch.empty(n, dtype=like.dtype, device=like.device)
        return buf[:n].view(shape)

    # ------------------------------------------------------------------ transposes
    def _attention_values(self, layer: int, G: torch.Tensor) -> torch.Tensor:
        """``v[h, s, b] = sum_t A[h, t, s] W_O^h G'(t)``: ``(H, T, B, d_head)``, as a few large GEMMs
        (one for W_O, one per head for the pattern), in scratch buffer 0 (valid until the next
        call; buffer 1 is free again when it returns)."""
        B, T, D = G.shape
        if self.ln1_post is not None:
            G = self.ln1_post[layer].transpose(G, slice(0, T))
        W_O = self.attn[layer]["W_O"]  # (H, d_head, D)
        H, dh = W_O.shape[0], W_O.shape[1]
        u = torch.mm(G.reshape(B * T, D), W_O.reshape(H * dh, D).T, out=self._scratch(0, (B * T, H * dh), G))
        up = self._scratch(1, (H, T, B, dh), G)
        up.copy_(u.view(B, T, H, dh).permute(2, 1, 0, 3))
        up = up.view(H, T, B * dh)  # (H, t, B * d_head)
        At = self.pattern(layer, T).transpose(1, 2)  # (H, s, t): A^T, zero where t < s (causal)
        v = self._scratch(0, (H, T, B * dh), G)  # u is no longer needed
        if T <= CAUSAL_BLOCK or not self.causal:
            torch.bmm(At, up, out=v)
            return v.view(H, T, B, dh)  # (H, s, B, d_head)
        # causal: source s only receives from t >= s, so each block of sources skips the
        # (exactly zero) columns t < s0 of A^T: about half the pattern's multiply-adds
        for s0 in range(0, T, CAUSAL_BLOCK):
            s1 = min(T, s0 + CAUSAL_BLOCK)
            torch.bmm(At[:, s0:s1, s0:], up[:, s0:], out=v[:, s0:s1])
        return v.view(H, T, B, dh)

    def _attention_out(self, layer: int, G: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """``W_V``'s side of :meth:`attention_transpose`, written into ``out (B*T, D)`` (None: scratch 0)."""
        B, T, D = G.shape
        v = self._attention_values(layer, G)
        W_V = self.attn[layer]["W_V"]  # (H, D, d_head)
        H, dh = W_V.shape[0], W_V.shape[2]
        if "W_V_ln1" not in self.attn[layer]:
            # ln1's gamma and centring are linear maps of each output row: folded into W_V once, so that
            # only the per-position 1/sigma is left to apply (ln1.transpose = P(gamma * .) / sigma)
            flat = W_V.permute(0, 2, 1).reshape(H * dh, D)
            self.attn[layer]["W_V_ln1"] = self.ln1[layer].reader_direction(flat).contiguous()
        vp = self._scratch(1, (B, T, H, dh), G)
        vp.copy_(v.permute(2, 1, 0, 3))
        out = torch.mm(vp.view(B * T, H * dh), self.attn[layer]["W_V_ln1"],
                       out=self._scratch(0, (B * T, D), G) if out is None else out).view(B, T, D)
        return out.div_(self.ln1[layer].sigma[:T].unsqueeze(-1))

    def attention_transpose(self, layer: int, G: Float[torch.Tensor, "batch pos d_model"],
                            ) -> Float[torch.Tensor, "batch pos d_model"]:
        """Gradient at resid_pre(layer) coming through frozen attention, for ``G (B, T, d_model)``
        at resid_mid(layer).  Excludes the residual identity term."""
        B, T, D = G.shape
        return self._attention_out(layer, G, torch.empty(B * T, D, dtype=G.dtype, device=G.device))

    def attention_transpose_add_(self, layer: int, G: Float[torch.Tensor, "batch pos d_model"],
                                 ) -> Float[torch.Tensor, "batch pos d_model"]:
        """``G + attention_transpose(layer, G)`` written into ``G`` (returned): no fresh tensor of
        ``G``'s size (the same values, bitwise)."""
        return G.add_(self._attention_out(layer, G, None))

    def attention_transpose_single(self, layer: int, G: Float[torch.Tensor, "batch pos d_model"],
                                   positions: Int[torch.Tensor, " batch"]) -> Float[torch.Tensor, "batch pos d_model"]:
        """:meth:`attention_transpose` for a ``G`` that is non-zero only at ``G[b, positions[b]]``
        (each reader's gradient before it has crossed any attention layer).

        The same sums in another order: ``W_V^h W_O^h`` is applied to one vector per row and
        head, then spread over the sources with that row's pattern row ``A[h, positions[b], :]``,
        so the cost is ``B (2 d_model^2 + T H d_model)`` instead of ``B T (2 d_model^2 + T d_model)``."""
        B, T, D = G.shape
        rows = torch.arange(B, device=G.device)
        g = G[rows, positions]  # (B, D)
        if self.ln1_post is not None:
            g = self.ln1_post[layer].transpose(g, positions)
        W_O = self.attn[layer]["W_O"]  # (H, d_head, D)
        H, dh = W_O.shape[0], W_O.shape[1]
        u = (g @ W_O.reshape(H * dh, D).T).view(B, H, dh)
        w = torch.einsum("bhk,hdk->bhd", u, self.attn[layer]["W_V"])  # (B, H, D)
        A = self.pattern(layer, T)[:, positions, :].permute(1, 2, 0)  # (B, s, H)
        out = torch.bmm(A, w)  # (B, s, D)
        return self.ln1[layer].transpose(out, slice(0, T))

    def attention_transpose_per_head(self, layer: int, G: Float[torch.Tensor, "batch pos d_model"],
                                     ) -> Float[torch.Tensor, "batch heads pos d_model"]:
        """As :meth:`attention_transpose` but kept per head: ``(B, H, T, d_model)``."""
        T = G.shape[1]
        v = self._attention_values(layer, G)
        out = torch.einsum("hsbk,hdk->bhsd", v, self.attn[layer]["W_V"])
        return self.ln1[layer].transpose(out, slice(0, T))

    def mlp_transpose(self, layer: int, G: Float[torch.Tensor, "batch pos d_model"],
                      ) -> Float[torch.Tensor, "batch pos d_model"] | None:
        """Gradient at resid_mid(layer) through the MLP side: only skip-transcoder paths are
        linear and stay in the frozen model; everything else is a node."""
        if layer not in self.skip:
            return None
        W_skip, site, before_post_norm = self.skip[layer]
        if before_post_norm:  # the skip writes the MLP output before ln2_post: through its transpose first
            G = self.ln2_post[layer].transpose(G, slice(0, G.shape[1]))
        out = G @ W_skip  # (B, T, d_in) = W_skip^T G
        if site == "normalized":
            T = G.shape[1]
            norm = self.ln2[layer]
            out = _Norm(None, None, norm.center, norm.sigma).transpose(out, slice(0, T))
        elif site == "mlp_input":
            out = self.ln2[layer].transpose(out, slice(0, G.shape[1]))
        return out

    def step_down(self, loc: int, G: Float[torch.Tensor, "batch pos d_model"], single: Int[torch.Tensor, " batch"] | None = None,
                  ) -> Float[torch.Tensor, "batch pos d_model"]:
        """Propagate ``G`` from residual location ``loc`` to ``loc - 1``.  ``single``: the
        position of each row when ``G`` is non-zero at that position only (see
        :meth:`attention_transpose_single`); the result is the same.  ``G`` may be overwritten:
        the result can be ``G`` itself."""
        loc = ResidualLocation(loc)
        layer = loc.layer
        if loc.sublayer == "attn":  # resid_mid(l) -> resid_pre(l), through attention l
            out = G
            if self.attention_modes[layer] == "frozen":
                if single is not None:
                    out = self.attention_transpose_single(layer, G, single).add_(G)
                elif not self.parallel:  # G itself is not needed below: stepped down in place
                    out = self.attention_transpose_add_(layer, G)
                else:
                    out = self.attention_transpose(layer, G).add_(G)
            return self._parallel_skip(layer, G, out)
        # resid_post(l) -> resid_mid(l), through the MLP side
        if self.parallel:  # a parallel block's MLP side reads x_pre: crossed with the attention (above)
            return G
        extra = self.mlp_transpose(layer, G)
        return G if extra is None else extra.add_(G)

    def _parallel_skip(self, layer: int, G: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """In a parallel block the skip path reads the block input: its transpose of the gradient
        above the block (``G`` at resid_mid equals the one at resid_post, no reader sits between)
        lands at resid_pre, beside the attention's, not through it."""
        if not self.parallel:
            return out
        extra = self.mlp_transpose(layer, G)
        return out if extra is None else extra.add_(out)
