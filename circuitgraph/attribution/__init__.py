"""Linearisation (freezing as a scoped object) and the exact edge computation."""

from circuitgraph.attribution.build import AttributionContext, attribute, build_graph
from circuitgraph.attribution.linearisation import Linearisation, frozen, linearise
from circuitgraph.attribution.nodes_builder import GraphOptions
from circuitgraph.attribution.targets import ResolvedTarget, top_logit_targets

__all__ = [
    "AttributionContext",
    "GraphOptions",
    "Linearisation",
    "ResolvedTarget",
    "attribute",
    "build_graph",
    "frozen",
    "linearise",
    "top_logit_targets",
]
