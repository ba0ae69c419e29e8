"""Queries over an attribution graph: free functions returning typed results.

Every result has ``kind``, ``to_dict()`` (JSON-serialisable, node ids as strings) and
``table(max_rows)`` (plain text for the CLI).  :func:`run_query` runs one item of the
spec's ``queries:`` list; :func:`prune_graph` prunes a graph keeping the pruned part in
explicit remainder nodes.  See docs/queries.md.
"""

from circuitgraph.queries import neighbours as _neighbours_module
from circuitgraph.queries._base import QueryResult
from circuitgraph.queries.dispatch import run_query
from circuitgraph.queries.filters import as_filter, filter_mask, match_nodes, resolve_node
from circuitgraph.queries.ground_truth import GroundTruthResult, ground_truth, roc_auc
from circuitgraph.queries.head_split import HeadPart, HeadSplitResult, head_split
from circuitgraph.queries.influence import InfluenceResult, influence, node_influence, total_effects
from circuitgraph.queries.neighbours import *  # noqa: F403
from circuitgraph.queries.paths import AttributionPath, HeadResolvedPath, PathsResult, path_contribution, top_paths
from circuitgraph.queries.prune import PruneResult, find_threshold, prune_graph
from circuitgraph.queries.qk import QKDecomposition, QKHead, QKMarginal, QKPair, QKResult, qk, qk_decomposition
from circuitgraph.queries.scores import ScoresResult, TargetErrorShare, compute_scores, graph_scores, record_scores
from circuitgraph.queries.tables import (
    CongruenceResult,
    DLAResult,
    LensRow,
    LogitLensResult,
    congruence,
    direct_logit_attribution,
    logit_lens,
)
from circuitgraph.queries.weights import DeEmbeddingResult, Unit, VirtualWeightsResult, de_embedding, virtual_weights

__all__ = [
    # dispatch and base
    "QueryResult",
    "run_query",
    # filters
    "as_filter",
    "filter_mask",
    "match_nodes",
    "resolve_node",
    # influence, pruning, scores
    "InfluenceResult",
    "influence",
    "node_influence",
    "total_effects",
    "PruneResult",
    "prune_graph",
    "find_threshold",
    "ScoresResult",
    "TargetErrorShare",
    "compute_scores",
    "graph_scores",
    "record_scores",
    # paths and head splits
    "AttributionPath",
    "HeadResolvedPath",
    "PathsResult",
    "top_paths",
    "path_contribution",
    "HeadPart",
    "HeadSplitResult",
    "head_split",
    # tables
    "DLAResult",
    "LensRow",
    "LogitLensResult",
    "CongruenceResult",
    "direct_logit_attribution",
    "logit_lens",
    "congruence",
    # QK attribution
    "QKPair",
    "QKMarginal",
    "QKHead",
    "QKResult",
    "QKDecomposition",
    "qk",
    "qk_decomposition",
    # weight-only
    "Unit",
    "VirtualWeightsResult",
    "DeEmbeddingResult",
    "virtual_weights",
    "de_embedding",
    # against a known circuit
    "GroundTruthResult",
    "ground_truth",
    "roc_auc",
]
# the neighbourhood queries (imported with * above): neighbours.py's ``__all__`` as it is
__all__ += _neighbours_module.__all__
