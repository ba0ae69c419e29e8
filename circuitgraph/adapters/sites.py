"""Intervention sites: the one vocabulary of the places a unit of the model can be read or
edited (:class:`~circuitgraph.validation.interventions.Unit`), and which of them are vectors
or one unit per position. Their hook names come from one place,
:meth:`circuitgraph.adapters.architecture.ModelAdapter.hook_site`."""

from __future__ import annotations

from typing import Literal, TypeGuard, get_args

__all__ = ["Site", "SITES", "VECTOR_SITES", "POSITION_SITES", "is_site"]

Site = Literal["embed", "pos_embed", "resid_pre", "attn", "head", "mlp", "neuron", "pre", "gate", "value",
               "feature", "error"]
SITES: tuple[str, ...] = get_args(Site)

#: sites whose units are vectors (activation 1 in the graph); the others are scalars
VECTOR_SITES = frozenset({"embed", "pos_embed", "resid_pre", "attn", "head", "mlp", "error"})
#: sites with one unit per position (index is always 0)
POSITION_SITES = frozenset({"embed", "pos_embed", "resid_pre", "attn", "mlp", "error"})


def is_site(name: str) -> TypeGuard[Site]:
    """Whether ``name`` is an intervention site (and, for the type checker, a :data:`Site`)."""
    return name in SITES
