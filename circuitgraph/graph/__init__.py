"""The attribution graph: node identity, node records and the graph object."""

from circuitgraph.graph.graph import AttributionGraph, CompletenessReport
from circuitgraph.graph.nodes import Node, NodeId

__all__ = ["AttributionGraph", "CompletenessReport", "Node", "NodeId"]
