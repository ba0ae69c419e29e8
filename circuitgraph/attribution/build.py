"""Assemble an :class:`AttributionGraph` from a linearisation: nodes, edges, constants, checks."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.attribution.context import AttributionContext
from circuitgraph.attribution.engine import compute_edges
from circuitgraph.attribution.feature_selection import fold_unselected, select_and_compute
from circuitgraph.attribution.linearisation import Linearisation, linearise
from circuitgraph.attribution.nodes_builder import GraphOptions, collect_nodes
from circuitgraph.attribution.plan import EdgePlan, check_plan, check_rows, device_working_set, plan_edges
from circuitgraph.attribution.targets import ResolvedTarget, top_logit_targets
from circuitgraph.dictionaries import Dictionary
from circuitgraph.graph.dag import adopt_engine_order
from circuitgraph.graph.graph import AttributionGraph

__all__ = ["AttributionContext", "build_graph", "attribute", "plan_run"]


def build_graph(
    adapter: ModelAdapter,
    lin: Linearisation,
    transcoders: Dictionary | None,
    targets: list[ResolvedTarget],
    options: GraphOptions,
    *,
    progress: Callable[[int, int], None] | None = None,
    metadata: dict[str, Any] | None = None,
) -> AttributionGraph:
    """Build the exact attribution graph of the frozen model on one prompt."""
    col = collect_nodes(adapter, lin, transcoders, targets, options)
    plan = plan_edges(col, options, 2 * adapter.facts.n_layers + 1, lin.n_pos, limit=options.memory_limit)
    check_plan(plan)  # refuse, with advice that works, before the sweep
    nodes = col.nodes
    if plan.selecting:
        rows, selected = select_and_compute(col, plan.max_feature_nodes, max_neuron_nodes=plan.max_neuron_nodes,
                                            batch_size=options.batch_size, progress=progress,
                                            watch=lambda done, n_edges, total: check_rows(plan, done, n_edges, total))
        nodes, edges, new_row = fold_unselected(col, rows, selected)
        del rows
    else:
        edges = compute_edges(col, batch_size=options.batch_size, progress=progress)
        new_row = None
    for row, c in edges.constants.items():
        nodes[row].constant = c
    np_dtype = np.float32 if options.dtype == torch.float32 else np.float64
    graph = AttributionGraph(
        nodes=nodes,
        edge_target=edges.target,
        edge_source=edges.source,
        edge_weight=edges.weight.astype(np_dtype, copy=False),
        targets=col.targets,
        metadata=dict(metadata or {}),
        context=AttributionContext(adapter, lin, transcoders, options, col, targets),
        edges_unique=True,  # one edge per (reader, writer) pair: queries skip coalescing
    )
    if edges.sums is not None and edges.abs_sums is not None:
        # the engine summed every row as it wrote it and knows its order: no pass over the edges
        # for the completeness check and the scores' level order
        graph.adopt_incoming_sums(_per_node(edges.sums, len(nodes)), _per_node(edges.abs_sums, len(nodes)))
        if edges.segments is not None:
            # the readers' rows in the graph (after folding, the selected ones, renumbered)
            row = (lambda r: r) if new_row is None else new_row.get
            readers = [(row(r), loc) for r, loc in zip(col.readers.rows, col.readers.locs) if row(r) is not None]
            adopt_engine_order(graph, edges.segments, np.array([r for r, _ in readers], dtype=np.int64),
                               np.array([loc for _, loc in readers], dtype=np.int64))
    report = graph.check_completeness()
    graph.metadata["completeness"] = report.to_dict()
    graph.metadata["dtype"] = str(options.dtype).replace("torch.", "")
    return graph


def _per_node(values: "dict[int, float] | np.ndarray", n: int) -> np.ndarray:
    """Per-row sums as one float64 value per node: the engine's ``{row: value}`` or the fold's array."""
    if not isinstance(values, dict):
        return values
    out = np.zeros(n)
    out[np.fromiter(values.keys(), dtype=np.int64, count=len(values))] = np.fromiter(
        values.values(), dtype=np.float64, count=len(values))
    return out


def plan_run(adapter: ModelAdapter, lin: Linearisation, transcoders: Dictionary | None,
             targets: list[ResolvedTarget], options: GraphOptions) -> tuple[EdgePlan, int]:
    """The dry run's part in the engine: the node tables, the edge plan
    (:func:`circuitgraph.attribution.plan.plan_edges`) and the edge sweep's per-batch working
    set on the model's device (bytes), without computing any edge."""
    col = collect_nodes(adapter, lin, transcoders, targets, options)
    plan = plan_edges(col, options, 2 * adapter.facts.n_layers + 1, lin.n_pos, limit=options.memory_limit)
    n_pos = max(col.readers.positions, default=0) + 1
    return plan, device_working_set(col.largest_writer_block(), n_pos, adapter.facts.d_model, options)


def attribute(
    adapter: ModelAdapter,
    tokens: torch.Tensor | list[int],
    transcoders: Dictionary | None = None,
    targets: list[ResolvedTarget] | None = None,
    *,
    mlp: str | dict[int, str] | None = None,
    attention: str | dict[int, str] = "frozen",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
    metadata: dict[str, Any] | None = None,
    **options: Any,
) -> AttributionGraph:
    """Python entry point below the spec: linearise ``tokens`` and build the graph.

    ``mlp`` defaults to transcoders where a transcoder is loaded for the layer, else neurons;
    ``targets`` defaults to circuit-tracer's top logits (max 10, cumulative probability 0.95,
    relative to the mean logit).  Other keyword arguments are :class:`GraphOptions` fields.

    Example::

        >>> from circuitgraph.testing.synthetic import tiny_model
        >>> from circuitgraph.adapters import ModelAdapter
        >>> g = attribute(ModelAdapter(tiny_model()), [1, 5, 7, 2])
        >>> g.check_completeness().ok()
        True
    """
    L = adapter.facts.n_layers
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if adapter.dtype != dtype and dtype == torch.float64:
        adapter.model.to(torch.float64)
        if transcoders is not None:
            transcoders = transcoders.to(torch.float64)
    if mlp is None:
        mlp = {l: ("transcoders" if transcoders is not None and l in transcoders else "neurons") for l in range(L)}
    elif isinstance(mlp, str):
        mlp = {l: mlp for l in range(L)}
    if isinstance(attention, str):
        attention = {l: attention for l in range(L)}
    lin = linearise(adapter, tokens, transcoders)
    if targets is None:
        targets = top_logit_targets(lin.logits, position=len(tokens) - 1, max_n=10, cumulative_probability=0.95)
    opts = GraphOptions(mlp=dict(mlp), attention=dict(attention), dtype=dtype, **options)
    return build_graph(adapter, lin, transcoders, targets, opts, progress=progress, metadata=metadata)
