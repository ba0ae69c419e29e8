"""Graph scores: circuit-tracer's replacement and completeness scores, and error shares.

With ``A`` the row-normalised absolute adjacency, ``w`` the target weights and
``influence = w (A + A^2 + ...)`` (circuit-tracer's ``compute_graph_scores``):

* **replacement score** = influence of the input nodes / (influence of the input nodes +
  influence of the error nodes): the share of the end-to-end influence from the inputs
  that reaches the targets through explained nodes only;
* **completeness score** = ``sum_r (1 - sum_{e error} A[r, e]) (influence_r + w_r) /
  sum_r (influence_r + w_r)``: the influence-weighted share of every node's input that
  does not come straight from an error node.

circuit-tracer's graphs have features, error nodes, tokens and logits only; here the
*input* kinds are ``embedding``, ``positional`` and ``bias`` and the *error-like* kinds
(writers whose own input is not explained by the graph) are ``error``, ``mlp``,
``remainder`` and ``attention_head`` (a head node's inputs are not edges of the graph).
Both sets can be changed by argument; on a graph with circuit-tracer's node kinds the
numbers are circuit-tracer's.

Per target: ``error_share`` is one minus the replacement score computed with that target
alone (weight 1), and ``error_effect`` is the signed exact total effect of the error-like
nodes on the target's pre-activation (:mod:`circuitgraph.queries.influence`), also given as
a fraction of the pre-activation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from circuitgraph.graph.dag import graph_dag, sweep
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import NodeId
from circuitgraph.queries._base import QueryResult, format_table, share
from circuitgraph.queries._sparse import pass_through_divisors, safe_inverse, target_weight_vector

__all__ = [
    "ScoresResult",
    "TargetErrorShare",
    "compute_scores",
    "graph_scores",
    "record_scores",
    "ERROR_KINDS",
    "INPUT_KINDS",
]

ERROR_KINDS = ("error", "mlp", "remainder", "attention_head")
INPUT_KINDS = ("embedding", "positional", "bias")


@dataclass(frozen=True)
class TargetErrorShare:
    """How much of one target the error-like nodes account for."""

    target: NodeId
    weight: float
    error_share: float | None
    error_effect: float
    pre_activation: float | None
    error_effect_fraction: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": str(self.target),
            "weight": self.weight,
            "error_share": self.error_share,
            "error_effect": self.error_effect,
            "pre_activation": self.pre_activation,
            "error_effect_fraction": self.error_effect_fraction,
        }


@dataclass(frozen=True, repr=False)
class ScoresResult(QueryResult):
    """Replacement score, completeness score and per-target error shares."""

    kind = "scores"
    replacement_score: float | None
    completeness_score: float | None
    per_target: tuple[TargetErrorShare, ...]
    error_kinds: tuple[str, ...] = ERROR_KINDS
    input_kinds: tuple[str, ...] = INPUT_KINDS

    def to_metadata(self) -> dict[str, Any]:
        """The two numbers the JSON metadata carries."""
        return {"replacement_score": self.replacement_score, "completeness_score": self.completeness_score}

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.to_metadata(),
            "error_kinds": list(self.error_kinds),
            "input_kinds": list(self.input_kinds),
            "targets": [t.to_dict() for t in self.per_target],
        }

    def table(self, max_rows: int = 10) -> str:
        head = (f"replacement_score {_f(self.replacement_score)}   "
                f"completeness_score {_f(self.completeness_score)}")
        rows = [(str(t.target), t.weight, t.error_share, t.error_effect, t.error_effect_fraction)
                for t in self.per_target]
        return format_table(["target", "weight", "error_share", "error_effect", "effect/pre"], rows,
                            max_rows=max_rows, title=head)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 else None


def compute_scores(
    graph: AttributionGraph,
    *,
    error_kinds: Iterable[str] = ERROR_KINDS,
    input_kinds: Iterable[str] = INPUT_KINDS,
    per_target: bool = True,
) -> ScoresResult:
    """circuit-tracer's replacement and completeness scores (on the graph as given: compute
    them on the unpruned graph) and, with ``per_target``, each target's error share and error
    effect; everything in one back-substitution pass over the edges.

    Example::

        s = compute_scores(graph)
        s.replacement_score, s.completeness_score
    """
    error_kinds, input_kinds = tuple(error_kinds), tuple(input_kinds)
    n = graph.n_nodes
    w = target_weight_vector(graph)
    kinds = np.array([nd.kind for nd in graph.nodes], dtype=object)
    is_err = np.isin(kinds, list(error_kinds))
    is_in = np.isin(kinds, list(input_kinds))

    # one pass over the edges: the weighted influence, one influence and one total effect per
    # target, and the absolute input each row takes straight from error-like nodes
    targets = graph.target_ids if per_target else []
    starts = np.zeros((n, 1 + len(targets)), dtype=np.float64)
    starts[:, 0] = w
    for j, t in enumerate(targets):
        starts[graph.index_of(t), j + 1] = 1.0
    gd = graph_dag(graph)
    res = sweep(gd.dag, abs_start=starts, row_divisor=gd.row_divisor,
                signed_start=starts[:, 1:] if targets else None,
                gain=safe_inverse(pass_through_divisors(graph)) if targets else None)
    infl = res["abs"]
    graph.store_derived("node_influence", infl[:, 0].copy())  # for pruning

    token_infl = infl[is_in, 0].sum()
    error_infl = infl[is_err, 0].sum()
    replacement = _ratio(token_infl, token_infl + error_infl)

    # circuit-tracer's completeness, sum_r (1 - from_error_r) out_r / sum_r out_r, with from_error_r
    # = sum_{s error} |E[r, s]| / divisor_r (the normalised weight row r takes from error nodes) and
    # out = influence + target weight: since out_r is exactly the z_r the sweep propagates,
    # sum_r out_r from_error_r = sum_{s error} sum_r z_r |E[r, s]| / divisor_r = the error nodes'
    # influence, so no second sum over the edges is needed
    output_influence = infl[:, 0] + w
    total_out = float(output_influence.sum())
    completeness = _ratio(total_out - float(error_infl), total_out)

    if not per_target:
        return ScoresResult(replacement, completeness, (), error_kinds, input_kinds)
    effects = res["signed"].T
    shares = []
    for j, (t, weight) in enumerate(graph.targets):
        tin, terr = infl[is_in, j + 1].sum(), infl[is_err, j + 1].sum()
        rep = _ratio(tin, tin + terr)
        pre = graph.node(t).pre_activation
        eff = float(effects[j, is_err].sum())
        shares.append(TargetErrorShare(t, float(weight), None if rep is None else 1.0 - rep, eff, pre,
                                       share(eff, pre)))
    return ScoresResult(replacement, completeness, tuple(shares), error_kinds, input_kinds)


#: the name the run API imports (circuitgraph.pipeline.runner); the same function as :func:`compute_scores`
graph_scores = compute_scores


def record_scores(graph: AttributionGraph, **kwargs: Any) -> ScoresResult:
    """:func:`compute_scores`, and write ``replacement_score`` / ``completeness_score`` (and the
    per-target error shares under ``scores``) into ``graph.metadata``."""
    result = compute_scores(graph, **kwargs)
    graph.metadata.set_scores(result.replacement_score, result.completeness_score)
    graph.metadata.set_score_report(result.to_dict())
    return result
