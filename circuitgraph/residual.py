"""Named points of the residual stream (:class:`ResidualLocation`), below every package: the
engine (its frozen model, node tables and public face :mod:`circuitgraph.attribution.context`,
which re-exports it), the graph's orderings, the queries and the validation checks all number
residual locations through it, never as ``2 * layer + 1``."""

from __future__ import annotations

from typing import Literal

__all__ = ["ResidualLocation", "Sublayer"]


Sublayer = Literal["embed", "attn", "mlp"]


class ResidualLocation(int):
    """A point of the residual stream, numbered bottom-up: ``resid_pre(0)`` is 0, then after each
    block's attention (``resid_mid(l)``) and after its MLP (``resid_post(l) == resid_pre(l + 1)``).

    An ``int`` (so the engine indexes and compares locations at no cost), built and read through
    names: ``ResidualLocation.resid_mid(2)``, ``loc.sublayer``, ``loc.layer``.
    """

    __slots__ = ()

    @classmethod
    def resid_pre(cls, layer: int) -> ResidualLocation:
        """Before block ``layer`` (after block ``layer - 1``'s MLP; the embeddings for layer 0)."""
        return cls(2 * layer)

    @classmethod
    def resid_mid(cls, layer: int) -> ResidualLocation:
        """After block ``layer``'s attention, before its MLP."""
        return cls(2 * layer + 1)

    @classmethod
    def resid_post(cls, layer: int) -> ResidualLocation:
        """After block ``layer``'s MLP."""
        return cls(2 * layer + 2)

    @staticmethod
    def count(n_layers: int) -> int:
        """How many locations a model of ``n_layers`` blocks has: ``resid_pre(0)`` to
        ``resid_post(n_layers - 1)``."""
        return 2 * n_layers + 1

    @property
    def sublayer(self) -> Sublayer:
        """What writes here: the embeddings, a block's attention or a block's MLP."""
        if self == 0:
            return "embed"
        return "attn" if self % 2 == 1 else "mlp"

    @property
    def layer(self) -> int:
        """The block whose sublayer writes here (-1 for the embeddings)."""
        return -1 if self == 0 else (self - 1) // 2

    @classmethod
    def written_by(cls, unit: str, layer: int) -> ResidualLocation:
        """Where a unit writes: ``unit`` a node kind or an intervention site. The embeddings
        write ``resid_pre(0)``; a ``resid_pre`` site is ``resid_pre(layer)``; a head or a block's
        attention ``resid_mid(layer)``; everything of a block's MLP (the MLP, a neuron, its pre-
        and gate activations, a feature, an error, a remainder) ``resid_post(layer)`` (a
        cross-layer feature: its first write)."""
        if unit in ("embed", "pos_embed", "embedding", "positional"):
            return cls(0)
        if unit == "resid_pre":
            return cls.resid_pre(layer)
        if unit in ("attn", "head", "attention_head"):
            return cls.resid_mid(layer)
        return cls.resid_post(layer)

    @classmethod
    def read_by(cls, kind: str, layer: int) -> ResidualLocation:
        """Where a reader reads: a head ``resid_pre(layer)``; an MLP, a neuron or a feature (the
        MLP's input) ``resid_mid(layer)``; other kinds ``resid_pre(layer)``."""
        if kind in ("feature", "neuron", "mlp"):
            return cls.resid_mid(layer)
        return cls.resid_pre(layer)

    def below(self) -> ResidualLocation:
        """The location before this one's sublayer."""
        if self == 0:
            raise ValueError("resid_pre(0) is the bottom of the residual stream")
        return ResidualLocation(self - 1)

    def __repr__(self) -> str:
        if self == 0:
            return "ResidualLocation.resid_pre(0)"
        return f"ResidualLocation.resid_{'mid' if self.sublayer == 'attn' else 'post'}({self.layer})"
