"""Linearisation (freezing as a scoped object) and the exact edge computation.

Code outside this package reads the engine through :mod:`circuitgraph.attribution.context`
(residual locations, writer vectors, reader directions, propagation), never its tables.
"""

from circuitgraph.attribution.build import attribute, build_graph
from circuitgraph.attribution.context import AttributionContext, ReaderDirection, ResidualLocation, WriterVector
from circuitgraph.attribution.linearisation import Linearisation, frozen, linearise
from circuitgraph.attribution.nodes_builder import GraphOptions
from circuitgraph.attribution.targets import ResolvedTarget, top_logit_targets

__all__ = [
    "AttributionContext",
    "GraphOptions",
    "Linearisation",
    "ReaderDirection",
    "ResidualLocation",
    "ResolvedTarget",
    "WriterVector",
    "attribute",
    "build_graph",
    "frozen",
    "linearise",
    "top_logit_targets",
]
