"""Faithfulness of a (pruned) circuit: keep only the circuit, or remove only the circuit.

The *universe* is every unit of the model at the graph's granularity: the token (and, with
``positional_nodes``, positional) embeddings at every position; in layers analysed as heads,
every head at every position; in each MLP layer every transcoder feature and error, every
neuron, or the whole MLP output, at the positions the graph has MLP nodes for (not the BOS
position unless ``bos_nodes``).  Attention passed through with frozen patterns and biases
are not nodes and are never ablated.  The *circuit* is the graph's nodes of those kinds
(pruning leaves a smaller graph; remainder nodes are not part of the circuit).

With ``m(S)`` the real model's metric when only the units in ``S`` keep their values (the
rest ablated, mean or zero), ``M`` the universe and ``C`` the circuit::

    share_kept    = (m(C) - m(empty)) / (m(M) - m(empty))     # keep only the circuit
    share_removed = (m(M) - m(M \\ C)) / (m(M) - m(empty))    # ablate only the circuit

1 and 1 for a circuit that carries the whole computation.  ``mode="mean"`` without
reference prompts uses the mean over the prompt's own positions (but the first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from circuitgraph._results import Tabular
from circuitgraph.errors import ValidationRunError
from circuitgraph.validation._common import graph_context, markdown_table, resolve_prompt
from circuitgraph.validation.interventions import NODE_SITES, Intervention, Unit, run_rows
from circuitgraph.validation.metrics import Metric

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.attribution.nodes_builder import GraphOptions
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["FaithfulnessResult", "faithfulness", "universe_units"]


def universe_units(a: ModelAdapter, opts: GraphOptions, T: int) -> list[Unit]:
    """Every unit of the model ``a`` at the granularity of a graph built with ``opts`` over ``T``
    positions (see the module docstring)."""
    L = a.facts.n_layers
    units = [Unit("embed", -1, t) for t in range(T)]
    if opts.positional_nodes and a.facts.positional == "learned":
        units += [Unit("pos_embed", -1, t) for t in range(T)]
    first = 0 if opts.bos_nodes else 1
    for layer in range(L):
        if opts.attention.get(layer) == "heads":
            units += [Unit("head", layer, t, None) for t in range(T)]
        mode = opts.mlp.get(layer)
        if mode == "transcoders":
            units += [Unit("feature", layer, t, None) for t in range(first, T)]
            units += [Unit("error", layer, t) for t in range(first, T)]
        elif mode == "neurons":
            units += [Unit("neuron", layer, t, None) for t in range(first, T)]
        elif mode == "mlp":
            units += [Unit("mlp", layer, t) for t in range(first, T)]
    return units


@dataclass(repr=False)
class FaithfulnessResult(Tabular):
    """Metric values with the universe, the circuit only, nothing, and everything but the circuit."""

    mode: str
    metric: str
    n_circuit_units: int
    full: float
    circuit_only: float
    empty: float
    without_circuit: float
    notes: list[str] = field(default_factory=list)

    @property
    def share_kept(self) -> float | None:
        d = self.full - self.empty
        return None if d == 0 else (self.circuit_only - self.empty) / d

    @property
    def share_removed(self) -> float | None:
        d = self.full - self.empty
        return None if d == 0 else (self.full - self.without_circuit) / d

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "metric": self.metric,
            "n_circuit_units": self.n_circuit_units,
            "full": self.full,
            "circuit_only": self.circuit_only,
            "empty": self.empty,
            "without_circuit": self.without_circuit,
            "share_kept": self.share_kept,
            "share_removed": self.share_removed,
            "notes": self.notes,
        }

    def table(self, max_rows: int = 10) -> str:
        return markdown_table(
            ["mode", "circuit units", "full", "circuit only", "nothing", "without circuit", "share kept",
             "share removed"],
            [[self.mode, self.n_circuit_units, self.full, self.circuit_only, self.empty, self.without_circuit,
              self.share_kept, self.share_removed]], max_rows)


def faithfulness(
    graph: AttributionGraph,
    *,
    mode: Literal["zero", "mean"] = "mean",
    reference_prompts: Sequence[Any] = (),
    metric: Metric | None = None,
    tokenizer: Tokenizer | None = None,
) -> FaithfulnessResult:
    """Keep only the graph's nodes / remove only them in the real model (module docstring)."""
    ctx = graph_context(graph, "faithfulness")
    a = ctx.adapter
    tokenizer = tokenizer if tokenizer is not None else a.tokenizer
    metric = metric if metric is not None else Metric.from_graph(graph)
    tokens = ctx.linearisation.tokens.tolist()
    circuit = [Unit.from_node(n.id) for n in graph.nodes if n.kind in NODE_SITES]
    if not circuit:
        raise ValidationRunError("faithfulness: the graph has no node that maps to a unit of the model "
                                 "(embeddings, features, errors, neurons, heads, MLPs); nothing to keep")
    notes = []
    if mode == "mean":
        if reference_prompts:
            refs = tuple(tuple(resolve_prompt(p, tokenizer, where=f"reference_prompts[{i}]"))
                         for i, p in enumerate(reference_prompts))
            pooling = "auto"
        else:
            refs, pooling = (tuple(tokens),), "all"
            notes.append("no reference prompts: mean over the prompt's own positions (but the first)")
        kw: dict[str, Any] = dict(reference=refs, pooling=pooling)
    elif mode == "zero":
        kw = {}
    else:
        raise ValidationRunError(f"faithfulness mode {mode!r}: expected zero or mean")
    universe = tuple(universe_units(ctx.adapter, ctx.options, ctx.linearisation.n_pos))
    rows = [
        [],
        [Intervention(universe, mode, exclude=tuple(circuit), **kw)],
        [Intervention(universe, mode, **kw)],
        [Intervention(tuple(circuit), mode, **kw)],
    ]
    out = run_rows(a, tokens, rows, metric, transcoders=ctx.transcoders).metric.tolist()
    return FaithfulnessResult(mode, metric.describe(tokenizer), len(circuit), *out, notes=notes)
