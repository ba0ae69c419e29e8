"""run_query over every spec query kind; JSON-serialisable results; errors; the public API."""

from __future__ import annotations

import json

import pytest

import circuitgraph.queries as queries
from circuitgraph.errors import QueryError, SpecError
from circuitgraph.queries import QueryResult, run_query
from circuitgraph.spec import queries as sq
from tests.helpers.graphs import attributed, chain_graph, spec_items


def test_every_spec_query_runs_and_serialises():
    g = attributed("ln-gelu", "transcoders")
    items = spec_items(g)
    # ground_truth needs heads as nodes and a circuit file: run through run_query in tests/test_ground_truth.py
    assert {type(i) for i in items} == set(sq.QUERY_TYPES) - {sq.GroundTruthQuery}
    for item in items:
        res = run_query(g, item)
        assert isinstance(res, QueryResult)
        assert res.kind == item.kind
        record = {"kind": item.kind, "params": item.params.model_dump(mode="json"), "result": res.to_dict()}
        json.loads(json.dumps(record))
        text = res.table(max_rows=3)
        assert isinstance(text, str) and text
        # the parameter block alone dispatches the same way
        assert type(run_query(g, item.params)) is type(res)


def test_mapping_queries_are_validated_like_the_spec():
    g = chain_graph()
    res = run_query(g, {"influence": {"top_k": 1}})
    assert res.kind == "influence" and len(res.to_dict()["top"]) == 1
    assert run_query(g, {"scores": None}).kind == "scores"
    with pytest.raises(SpecError, match="top_k"):
        run_query(g, {"influence": {"top_k": 0}})
    with pytest.raises(QueryError, match="exactly one of the keys"):
        run_query(g, {"centrality": {}})
    with pytest.raises(QueryError, match="unknown query"):
        run_query(g, object())


@pytest.mark.parametrize("item", [
    {"logit_lens": None},
    {"congruence": {"tokens": [1]}},
    {"head_split": {"source": "embedding/-1/0/1", "target": "feature/0/0/7"}},
    {"virtual_weights": {"source": {"kind": "embedding"}, "target": {"kind": "feature"}}},
    {"de_embedding": {"node": "feature/0/0/7"}},
    {"qk": {"layer": 0, "head": 0}},
])
def test_weight_queries_on_a_loaded_graph_say_they_need_the_model(item):
    with pytest.raises(QueryError, match="needs the live model: run the spec, not a loaded JSON"):
        run_query(chain_graph(), item)


def test_graph_queries_work_without_the_model():
    g = chain_graph()
    for item in ({"top_paths": {"source": {"kind": "embedding"}}}, {"influence": None},
                 {"direct_logit_attribution": None}, {"neighbours": {"node": "feature/0/0/7"}},
                 {"subgraph": {"filter": {"layer": [0, 1]}}}, {"supernodes": {"groups": {"f": {"kind": "feature"}}}},
                 {"scores": None}):
        json.dumps(run_query(g, item).to_dict())


def test_filter_errors_name_the_filter_and_ids():
    g = chain_graph()
    with pytest.raises(QueryError, match=r"top_paths source \{kind: neuron, layer: \[0, 2\]\} matches no node"):
        run_query(g, {"top_paths": {"source": {"kind": "neuron", "layer": [0, 2]}}})
    with pytest.raises(QueryError, match="node ids feature/0/0/1, feature/0/0/2 are not in the graph"):
        run_query(g, {"subgraph": {"filter": {"id": ["feature/0/0/1", "feature/0/0/2"]}}})
    with pytest.raises(QueryError, match="neighbours node feature/3/0/7 is not in the graph"):
        run_query(g, {"neighbours": {"node": "feature/3/0/7"}})


def test_public_api_is_pinned():
    assert sorted(queries.__all__) == sorted([
        "QueryResult", "run_query",
        "as_filter", "filter_mask", "match_nodes", "resolve_node",
        "InfluenceResult", "influence", "node_influence", "total_effects",
        "PruneResult", "prune_graph", "find_threshold",
        "ScoresResult", "TargetErrorShare", "compute_scores", "graph_scores", "record_scores",
        "AttributionPath", "HeadResolvedPath", "PathsResult", "top_paths", "path_contribution",
        "HeadPart", "HeadSplitResult", "head_split",
        "Neighbour", "NeighboursResult", "SubgraphResult", "SupernodesResult",
        "neighbours", "parents", "children", "subgraph", "supernodes", "logit_difference",
        "DLAResult", "LensRow", "LogitLensResult", "CongruenceResult",
        "direct_logit_attribution", "logit_lens", "congruence",
        "Unit", "VirtualWeightsResult", "DeEmbeddingResult", "virtual_weights", "de_embedding",
        "QKPair", "QKMarginal", "QKHead", "QKResult", "QKDecomposition", "qk", "qk_decomposition",
        "GroundTruthResult", "ground_truth", "roc_auc",
    ])
    for name in queries.__all__:
        assert hasattr(queries, name), name


def test_dispatch_is_built_from_the_spec_registry():
    """Every query and check kind of the spec has a runner, and every runner in the dispatch
    modules is named by a kind of the spec (one registry: QUERY_TYPES / CHECK_TYPES)."""
    import inspect

    from circuitgraph.queries import dispatch as qd
    from circuitgraph.spec import validation as sv
    from circuitgraph.validation import dispatch as vd

    for types, module, table, key_of, by_kind in (
        (sq.QUERY_TYPES, qd, qd.QUERY_FUNCTIONS, lambda t: t.model_fields[t.key].annotation, qd.QUERY_RUNNERS),
        (sv.CHECK_TYPES, vd, vd.CHECK_FUNCTIONS, lambda t: t.key, vd.CHECK_FUNCTIONS),
    ):
        assert len({t.key for t in types}) == len(types)
        assert set(by_kind) == {t.key for t in types}
        named = {by_kind[t.key] for t in types}
        assert len(named) == len(types), "two kinds name the same runner"
        assert all(callable(f) for f in named)
        assert {key_of(t) for t in types} == set(table)
        assert set(table.values()) == named
        runners = {f for name, f in inspect.getmembers(module, inspect.isfunction)
                   if name.startswith("run_") and f.__module__ == module.__name__}
        assert runners - {module.__dict__.get(n) for n in ("run_query", "run_check", "run_checks")} == named
    assert vd.CHECK_KINDS == tuple(t.key for t in sv.CHECK_TYPES)
