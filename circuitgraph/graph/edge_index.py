"""A grouping of edge indices by a node column (:func:`grouped`): re-exported from the edge
toolkit, :mod:`circuitgraph.graph.edges`, where it lives with the other edge operations."""

from __future__ import annotations

from circuitgraph.graph.edges import grouped

__all__ = ["grouped"]
