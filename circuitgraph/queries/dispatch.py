"""One entry point for the spec's ``queries:`` list: :func:`run_query`.

``run_query(graph, query)`` takes one item of the list (a ``TopPathsQuery`` etc., its
parameter block ``TopPaths`` etc., or a plain mapping ``{"top_paths": {...}}``) and returns
the typed result; the API writes ``{"kind": query.kind, "params": ..., "result":
result.to_dict()}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.queries._base import QueryResult
from circuitgraph.queries.ground_truth import ground_truth
from circuitgraph.queries.head_split import head_split
from circuitgraph.queries.influence import influence
from circuitgraph.queries.neighbours import neighbours, subgraph, supernodes
from circuitgraph.queries.paths import top_paths
from circuitgraph.queries.qk import qk
from circuitgraph.queries.scores import compute_scores
from circuitgraph.queries.tables import congruence, direct_logit_attribution, logit_lens
from circuitgraph.queries.weights import de_embedding, virtual_weights
from circuitgraph.spec import queries as q
from circuitgraph.spec.base import KeyedModel

__all__ = ["run_query", "QUERY_FUNCTIONS", "QUERY_RUNNERS"]

#: query kind (the spec item's ``key``) -> the function that runs it: each runner below registers
#: itself (``@_runs(kind)``); the kinds are the spec's registry, ``QUERY_TYPES``
QUERY_RUNNERS: dict[str, Callable[[AttributionGraph, Any], QueryResult]] = {}


def _runs(kind: str) -> Callable[[Callable[[AttributionGraph, Any], QueryResult]],
                                 Callable[[AttributionGraph, Any], QueryResult]]:
    def register(fn: Callable[[AttributionGraph, Any], QueryResult]) -> Callable[[AttributionGraph, Any], QueryResult]:
        if kind in QUERY_RUNNERS:
            raise ValueError(f"query kind {kind!r} has two runners")
        QUERY_RUNNERS[kind] = fn
        return fn
    return register



@_runs('top_paths')
def run_top_paths(g: AttributionGraph, p: q.TopPaths) -> QueryResult:
    return top_paths(g, p.source, p.target, p.k, rank=p.rank, method=p.method, beam_width=p.beam_width,
                     max_length=p.max_length, min_length=p.min_length, through=p.through, avoid=p.avoid, expand_heads=p.expand_heads)


@_runs('influence')
def run_influence(g: AttributionGraph, p: q.Influence) -> QueryResult:
    return influence(g, top_k=p.top_k, signed=p.signed)


@_runs('direct_logit_attribution')
def run_direct_logit_attribution(g: AttributionGraph, p: q.DirectLogitAttribution) -> QueryResult:
    return direct_logit_attribution(g, p.target, top_k=p.top_k, kinds=p.kinds)


@_runs('logit_lens')
def run_logit_lens(g: AttributionGraph, p: q.LogitLens) -> QueryResult:
    return logit_lens(g, tokens=p.tokens, position=p.position, top_k=p.top_k)


@_runs('congruence')
def run_congruence(g: AttributionGraph, p: q.Congruence) -> QueryResult:
    return congruence(g, p.tokens, kind=p.kind, layer=p.layer, mode=p.mode, top_k=p.top_k)


@_runs('neighbours')
def run_neighbours(g: AttributionGraph, p: q.Neighbours) -> QueryResult:
    return neighbours(g, p.node, direction=p.direction, top_k=p.top_k)


@_runs('subgraph')
def run_subgraph(g: AttributionGraph, p: q.Subgraph) -> QueryResult:
    return subgraph(g, p.filter)


@_runs('supernodes')
def run_supernodes(g: AttributionGraph, p: q.Supernodes) -> QueryResult:
    return supernodes(g, dict(p.groups))


@_runs('scores')
def run_scores(g: AttributionGraph, p: q.Scores) -> QueryResult:
    return compute_scores(g)


@_runs('head_split')
def run_head_split(g: AttributionGraph, p: q.HeadSplit) -> QueryResult:
    return head_split(g, p.source, p.target)


@_runs('virtual_weights')
def run_virtual_weights(g: AttributionGraph, p: q.VirtualWeights) -> QueryResult:
    return virtual_weights(g, p.source, p.target, top_k=p.top_k)


@_runs('de_embedding')
def run_de_embedding(g: AttributionGraph, p: q.DeEmbedding) -> QueryResult:
    return de_embedding(g, p.node, top_k=p.top_k, head=p.head)


@_runs('qk')
def run_qk(g: AttributionGraph, p: q.QK) -> QueryResult:
    return qk(g, p.layer, p.head if isinstance(p.head, int) else list(p.head), p.query_position,
              p.key_position, top_k=p.top_k)


@_runs('ground_truth')
def run_ground_truth(g: AttributionGraph, p: q.GroundTruth) -> QueryResult:
    return ground_truth(g, p.circuit, edge_threshold=p.edge_threshold, max_disagreements=p.max_disagreements)


if set(QUERY_RUNNERS) != {t.key for t in q.QUERY_TYPES}:  # pragma: no cover - a kind without a runner, or the reverse
    raise ImportError(f"query runners {sorted(QUERY_RUNNERS)} do not match the spec's QUERY_TYPES "
                      f"{sorted(t.key for t in q.QUERY_TYPES)}")


#: parameter-block class -> the function that runs it (the spec's ``QUERY_TYPES`` with the runners above)
QUERY_FUNCTIONS: dict[type, Callable[[AttributionGraph, Any], QueryResult]] = {
    t.params_model: QUERY_RUNNERS[t.key] for t in q.QUERY_TYPES
}


def _parse(query: Mapping) -> Any:
    """A query item from a mapping ``{key: params}``; bad params raise :class:`SpecError`."""
    types = {t.key: t for t in q.QUERY_TYPES}
    if len(query) != 1 or next(iter(query)) not in types:
        raise QueryError(f"a query is a mapping with exactly one of the keys {', '.join(types)}; "
                         f"got keys {list(query)}")
    return types[next(iter(query))](**dict(query))


def run_query(graph: AttributionGraph, query: Any) -> QueryResult:
    """Run one spec query on ``graph`` and return its typed result.

    ``query`` is an item of ``spec.queries`` (e.g. ``TopPathsQuery``), its parameter block
    (``TopPaths``), or a mapping ``{"top_paths": {...}}`` (validated like the spec).

    Example::

        from circuitgraph.spec.queries import InfluenceQuery
        res = run_query(graph, InfluenceQuery(influence={"top_k": 5}))
        {"kind": res.kind, "result": res.to_dict()}
    """
    if isinstance(query, Mapping):
        query = _parse(query)
    params = query.params if isinstance(query, KeyedModel) else query
    fn = QUERY_FUNCTIONS.get(type(params))
    if fn is None:
        known = ", ".join(sorted(c.__name__ for c in QUERY_FUNCTIONS))
        raise QueryError(f"unknown query {type(query).__name__}; expected a spec query item or one of {known}")
    return fn(graph, params)
