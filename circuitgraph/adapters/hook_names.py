"""The model's hook names (TransformerLens's names: the only place they are built), one part of
:class:`~circuitgraph.adapters.architecture.ModelAdapter`: residual points, attention, MLP,
embeddings and the one translation of an intervention site (:mod:`circuitgraph.adapters.sites`)
to its hook."""

from __future__ import annotations

from typing import Protocol

from circuitgraph.adapters.facts import ArchitectureFacts
from circuitgraph.errors import AttributionError

__all__ = ["HookNames", "HookPointLike"]


class HookPointLike(Protocol):
    """What a hook function receives as ``hook``: TransformerLens's ``HookPoint``, the native
    model's :class:`~circuitgraph.adapters.native_transformer.HookPoint` or a virtual hook's
    stand-in.  The package reads only its ``name`` (the hook's full name, set when the model is
    built)."""

    @property
    def name(self) -> str: ...


class HookNames:
    """Hook names; :meth:`hook_site` needs the model's ``facts``."""

    facts: ArchitectureFacts

    @staticmethod
    def hook_resid_pre(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_pre"

    @staticmethod
    def hook_resid_mid(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_mid"

    @staticmethod
    def hook_resid_post(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_post"

    @staticmethod
    def block_hook(layer: int, name: str) -> str:
        """The hook ``name`` of block ``layer``, ``name`` relative to the block as dictionary configs
        give it (``ln2.hook_normalized``, ``mlp.hook_in``, ``hook_mlp_out``)."""
        return f"blocks.{layer}.{name}"

    @staticmethod
    def hook_pattern(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_pattern"

    @staticmethod
    def hook_attn_scores(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_attn_scores"

    @staticmethod
    def hook_qk(layer: int, side: str, rotated: bool = False) -> str:
        """The queries (``side="q"``) or keys (``"k"``) of ``layer``'s attention, after the rotary
        embedding when ``rotated``."""
        return f"blocks.{layer}.attn.hook_{'rot_' if rotated else ''}{side}"

    @staticmethod
    def hook_qk_input(layer: int, side: str) -> str:
        """The residual stream the queries (``side="q"``) or keys (``"k"``) read, with
        ``use_split_qkv_input``."""
        return f"blocks.{layer}.hook_{side}_input"

    @staticmethod
    def hook_v(layer: int) -> str:
        """The values of ``layer``'s attention ``(batch, pos, n_kv_heads, d_head)`` (one per key-value
        head: grouped-query heads share them)."""
        return f"blocks.{layer}.attn.hook_v"

    @staticmethod
    def hook_z(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_z"

    @staticmethod
    def hook_attn_out(layer: int) -> str:
        return f"blocks.{layer}.hook_attn_out"

    @staticmethod
    def hook_mlp_out(layer: int) -> str:
        return f"blocks.{layer}.hook_mlp_out"

    @staticmethod
    def hook_mlp_pre(layer: int) -> str:
        """GELU/ReLU: the neuron pre-activation; gated: the gate pre-activation."""
        return f"blocks.{layer}.mlp.hook_pre"

    @staticmethod
    def hook_mlp_pre_linear(layer: int) -> str:
        """Gated MLPs only: the linear (value) branch, without b_in."""
        return f"blocks.{layer}.mlp.hook_pre_linear"

    @staticmethod
    def hook_mlp_post(layer: int) -> str:
        return f"blocks.{layer}.mlp.hook_post"

    def hook_site(self, site: str, layer: int) -> str:
        """The hook whose activation is an intervention site's (:mod:`circuitgraph.adapters.sites`)
        at ``layer``: the one site-to-hook translation. ``resid_pre`` past the last block is the
        final residual (``resid_post`` of the last block); a feature or an error edits the MLP's
        output; ``pre`` and ``gate`` the gate's pre-activation, ``value`` the linear branch's."""
        if site == "embed":
            return self.hook_embed()
        if site == "pos_embed":
            return self.hook_pos_embed()
        if site == "resid_pre":
            return self.hook_resid_pre(layer) if layer < self.facts.n_layers else self.hook_resid_post(layer - 1)
        if site == "attn":
            return self.hook_attn_out(layer)
        if site == "head":
            return self.hook_z(layer)
        if site in ("mlp", "feature", "error"):
            return self.hook_mlp_out(layer)
        if site == "neuron":
            return self.hook_mlp_post(layer)
        if site in ("pre", "gate"):
            return self.hook_mlp_pre(layer)
        if site == "value":
            return self.hook_mlp_pre_linear(layer)
        raise AttributionError(f"unknown intervention site {site!r}")

    @staticmethod
    def hook_embed() -> str:
        return "hook_embed"

    @staticmethod
    def hook_pos_embed() -> str:
        return "hook_pos_embed"

    @staticmethod
    def hook_mlp_out_before_post_norm(layer: int) -> str:
        """circuit-tracer's ``mlp.hook_out``: the MLP's own output, *before* a post-MLP norm
        (Gemma-2's ``ln2_post``).  TransformerLens has no hook there: on models with post-norms it
        is a virtual hook that :meth:`hooks` and :meth:`run_with_cache` provide (a forward
        pre-hook on the block's ``ln2_post`` module, whose input is that value); on models
        without post-norms it is the same value as :meth:`hook_mlp_out`."""
        return f"blocks.{layer}.mlp.hook_out"
