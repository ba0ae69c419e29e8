"""Assemble an :class:`AttributionGraph` from a linearisation: nodes, edges, constants, checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.attribution.component_inputs import (
    check_component_edge_bound,
    check_component_inputs_supported,
    component_inputs,
)
from circuitgraph.attribution.context import AttributionContext
from circuitgraph.attribution.engine import compute_edges
from circuitgraph.attribution.feature_selection import fold_unselected, select_and_compute
from circuitgraph.attribution.linearisation import Linearisation, linearise
from circuitgraph.attribution.nodes_builder import GraphOptions, collect_nodes
from circuitgraph.attribution.plan import (
    USABLE,
    EdgePlan,
    available_memory,
    check_plan,
    check_rows,
    device_working_set,
    neuron_probe_top_k,
    plan_edges,
    process_memory,
)
from circuitgraph.attribution.targets import ResolvedTarget, top_logit_targets
from circuitgraph.dictionaries import Dictionary
from circuitgraph.graph.dag import adopt_engine_order
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.linearised_edges import LINEARISED_ATTRS, LinearisedEdges
from circuitgraph.graph.metadata import GraphMetadata
from circuitgraph.graph.nodes import NodeAttrs
from circuitgraph.residual import ResidualLocation

if TYPE_CHECKING:
    from circuitgraph.attribution.nodes_builder import Collected

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
    if options.component_inputs:
        check_component_inputs_supported(adapter, options.mlp)
    col, plan = _collect_and_plan(adapter, lin, transcoders, targets, options)
    check_plan(plan)  # refuse, with advice that works, before the sweep
    if options.component_inputs:
        check_component_edge_bound(col, tuple(options.head_inputs))
    if not plan.selecting and not isinstance(col.nodes, list):
        col.nodes = list(col.nodes)  # the records the graph holds (and its constants are set on)
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
    edge_target, edge_source, edge_weight = edges.target, edges.source, edges.weight
    linearised = None
    if options.component_inputs:
        edge_target, edge_source, edge_weight, linearised = _add_component_inputs(col, nodes, edges, options)
    graph = AttributionGraph(
        nodes=nodes,
        edge_target=edge_target,
        edge_source=edge_source,
        edge_weight=edge_weight.astype(np_dtype, copy=False),
        targets=col.targets,
        metadata=GraphMetadata(metadata or {}),
        context=AttributionContext(adapter, lin, transcoders, options, col, targets),
        edges_unique=True,  # one edge per (reader, writer) pair: queries skip coalescing
        linearised_edges=linearised,
    )
    if edges.sums is not None and edges.abs_sums is not None and not options.component_inputs:
        # the engine summed every row as it wrote it and knows its order: no pass over the edges
        # for the completeness check and the scores' level order
        graph.adopt_incoming_sums(_per_node(edges.sums, len(nodes)), _per_node(edges.abs_sums, len(nodes)))
        if edges.segments is not None:
            # the readers' rows in the graph (after folding, the selected ones, renumbered)
            row = (lambda r: r) if new_row is None else new_row.get
            readers = [(row(r), loc) for r, loc in zip(col.readers.rows, col.readers.locs, strict=False) if row(r) is not None]
            adopt_engine_order(graph, edges.segments, np.array([r for r, _ in readers], dtype=np.int64),
                               np.array([loc for _, loc in readers], dtype=np.int64))
    report = graph.check_completeness()
    graph.metadata.set_completeness(report)
    if linearised is not None:
        graph.metadata.set_linearised_edges(linearised)
    graph.metadata.set_dtype(str(options.dtype).replace("torch.", ""))
    return graph


def _add_component_inputs(col: Collected, nodes: list, edges: Any, options: GraphOptions
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, LinearisedEdges | None]:
    """The edges into head and whole-MLP nodes appended to the engine's; each such node's
    ``pre_activation`` becomes its total effect on the targets and ``constant`` the part of it no
    node carries, so that :meth:`AttributionGraph.check_completeness` checks the identity
    ``total effect = sum of incoming edges + constant`` (:mod:`~circuitgraph.attribution.component_inputs`).
    The linearised query / key edges (``options.head_inputs``) come back apart, never among them."""
    index = {n.id: i for i, n in enumerate(nodes)}
    comp = component_inputs(col, index, min_mlp_pos=0 if options.bos_nodes else 1, batch_size=options.batch_size,
                            head_inputs=tuple(options.head_inputs))
    heads_in = ",".join(k for k in ("value", "query", "key") if k in options.head_inputs)
    for row, value in comp.total_effect.items():
        node = nodes[row]
        node.pre_activation = value
        node.constant = comp.constant[row]
        node.attrs = {**node.attrs, "total_effect": value,
                      "inputs": heads_in if node.kind == "attention_head" else "input"}
    index_dtype = edges.target.dtype
    linearised = None
    if comp.linearised is not None:
        assert comp.linearised_constant is not None and comp.linearised_total is not None  # set with it
        linearised = LinearisedEdges.from_kinds(comp.linearised, comp.linearised_constant, comp.linearised_total)
        for kind, totals in comp.linearised_total.items():  # on the heads too: they travel with the nodes
            for row, value in totals.items():
                total_key, constant_key = LINEARISED_ATTRS[kind]
                attrs: NodeAttrs = nodes[row].attrs.copy()
                attrs[total_key] = value
                attrs[constant_key] = comp.linearised_constant[kind].get(row, 0.0)
                nodes[row].attrs = attrs
    return (np.concatenate([edges.target, comp.target.astype(index_dtype)]),
            np.concatenate([edges.source, comp.source.astype(edges.source.dtype)]),
            np.concatenate([edges.weight.astype(np.float64), comp.weight]), linearised)


def _per_node(values: dict[int, float] | np.ndarray, n: int) -> np.ndarray:
    """Per-row sums as one float64 value per node: the engine's ``{row: value}`` or the fold's array."""
    if not isinstance(values, dict):
        return values
    out = np.zeros(n)
    out[np.fromiter(values.keys(), dtype=np.int64, count=len(values))] = np.fromiter(
        values.values(), dtype=np.float64, count=len(values))
    return out


def _collect_and_plan(adapter: ModelAdapter, lin: Linearisation, transcoders: Dictionary | None,
                      targets: list[ResolvedTarget], options: GraphOptions, floor: int = 0) -> tuple[Any, EdgePlan]:
    """The node tables and their edge plan.  When every neuron's node table would not fit (a long
    prompt's neuron graph without ``neuron_top_k``), the nodes are collected with a probe's
    ``neuron_top_k`` (:func:`~circuitgraph.attribution.plan.neuron_probe_top_k`) and the plan is
    the spec's (it does not fit; its advice, within the probe, does): the dry run and the refusal
    never build what cannot fit."""
    f = adapter.facts
    before = process_memory()
    neuron_layers = sum(1 for mode in options.mlp.values() if mode == "neurons")
    n_sites = neuron_layers * lin.n_pos
    probe = None
    if options.neuron_top_k is None and options.max_neuron_nodes is None and n_sites:
        usable = int(USABLE * (available_memory() + before))
        limit = usable if options.memory_limit is None else min(options.memory_limit, usable)
        probe = neuron_probe_top_k(n_sites, f.d_mlp, f.d_model, max(limit - before, 0))
    probing = options if probe is None else dataclasses.replace(options, neuron_top_k=probe)
    col = collect_nodes(adapter, lin, transcoders, targets, probing)
    unseen = 0
    if probe is not None:
        unseen = max(0, n_sites * f.d_mlp - int(sum(1 for n in col.nodes if n.kind == "neuron")))
    plan = plan_edges(col, probing, ResidualLocation.count(f.n_layers), lin.n_pos, limit=options.memory_limit,
                      rss_before_nodes=before, unseen_neurons=unseen, floor=floor)
    plan.probe_top_k = probe
    if probe is not None and plan.fits:  # every neuron fits after all: the spec's own node tables
        del col
        col = collect_nodes(adapter, lin, transcoders, targets, options)
        plan = plan_edges(col, options, ResidualLocation.count(f.n_layers), lin.n_pos, limit=options.memory_limit,
                          rss_before_nodes=before, floor=floor)
    return col, plan


def plan_run(adapter: ModelAdapter, lin: Linearisation, transcoders: Dictionary | None,
             targets: list[ResolvedTarget], options: GraphOptions, floor: int = 0) -> tuple[EdgePlan, int]:
    """The dry run's part in the engine: the node tables, the edge plan
    (:func:`circuitgraph.attribution.plan.plan_edges`) and the edge sweep's per-batch working
    set on the model's device (bytes), without computing any edge.  ``floor``: the process's peak
    so far (loading), see :func:`~circuitgraph.attribution.plan.plan_edges`."""
    col, plan = _collect_and_plan(adapter, lin, transcoders, targets, options, floor)
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
