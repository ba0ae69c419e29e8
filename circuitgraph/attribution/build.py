"""Assemble an :class:`AttributionGraph` from a linearisation: nodes, edges, constants, checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.attribution.engine import compute_edges
from circuitgraph.attribution.linearisation import Linearisation
from circuitgraph.attribution.nodes_builder import Collected, GraphOptions, collect_nodes
from circuitgraph.attribution.targets import ResolvedTarget
from circuitgraph.graph.graph import AttributionGraph

__all__ = ["AttributionContext", "build_graph"]


@dataclass
class AttributionContext:
    """The live objects behind a graph, kept for queries and validation that need the model."""

    adapter: ModelAdapter
    linearisation: Linearisation
    transcoders: Any
    options: GraphOptions
    collected: Collected
    targets: list[ResolvedTarget]


def build_graph(
    adapter: ModelAdapter,
    lin: Linearisation,
    transcoders: Any,
    targets: list[ResolvedTarget],
    options: GraphOptions,
    *,
    progress: Callable[[int, int], None] | None = None,
    metadata: dict[str, Any] | None = None,
) -> AttributionGraph:
    """Build the exact attribution graph of the frozen model on one prompt."""
    col = collect_nodes(adapter, lin, transcoders, targets, options)
    edges = compute_edges(col, batch_size=options.batch_size, progress=progress)
    for row, c in edges.constants.items():
        col.nodes[row].constant = c
    np_dtype = np.float32 if options.dtype == torch.float32 else np.float64
    graph = AttributionGraph(
        nodes=col.nodes,
        edge_target=edges.target,
        edge_source=edges.source,
        edge_weight=edges.weight.astype(np_dtype, copy=False),
        targets=col.targets,
        metadata=dict(metadata or {}),
        context=AttributionContext(adapter, lin, transcoders, options, col, targets),
    )
    report = graph.check_completeness()
    graph.metadata["completeness"] = report.to_dict()
    graph.metadata["dtype"] = str(options.dtype).replace("torch.", "")
    return graph
