"""The declarative spec: pydantic models of a circuitgraph run (no torch here).

Load with :func:`load_spec` (a YAML/JSON file, a mapping, or a :class:`Spec`) or build
in Python; every problem is reported at once as a :class:`~circuitgraph.errors.SpecError`
whose ``errors`` are ``(location, message)`` pairs such as
``("targets[1].logit_diff", "expected two tokens [a, b] ..., got 1: [' an']")``.

Items of ``targets``, ``queries`` and ``validate`` are tagged by the key they hold:
``item.kind`` is that key and ``item.params`` its value.
"""

from circuitgraph.spec.export import ExportSpec
from circuitgraph.spec.filters import NodeFilter, TargetSet, TopNodes
from circuitgraph.spec.graph import AttentionMode, GraphSpec, MlpMode, Prune, PruneSpec
from circuitgraph.spec.json_schema import spec_json_schema, spec_schema_text, write_spec_schema
from circuitgraph.spec.kinds import NODE_KINDS, NodeKind
from circuitgraph.spec.load import SpecSource, check_inputs, load_spec, read_spec_file
from circuitgraph.spec.model import ModelSource, ModelSpec, TranscoderSource, TranscodersSpec
from circuitgraph.spec.prompts import Prompt, TextPrompt, TokensPrompt
from circuitgraph.spec.queries import (
    QK,
    Congruence,
    CongruenceQuery,
    DeEmbedding,
    DeEmbeddingQuery,
    DirectLogitAttribution,
    DirectLogitAttributionQuery,
    GroundTruth,
    GroundTruthQuery,
    HeadRef,
    HeadSplit,
    HeadSplitQuery,
    Influence,
    InfluenceQuery,
    LogitLens,
    LogitLensQuery,
    Neighbours,
    NeighboursQuery,
    QKQuery,
    Query,
    Scores,
    ScoresQuery,
    Subgraph,
    SubgraphQuery,
    Supernodes,
    SupernodesQuery,
    TopPaths,
    TopPathsQuery,
    UnitRef,
    VirtualWeights,
    VirtualWeightsQuery,
)
from circuitgraph.spec.root import FORMAT_VERSION, Spec
from circuitgraph.spec.steering import Generate, SteerIntervention, SteerItem
from circuitgraph.spec.targets import (
    Direction,
    DirectionTarget,
    FeatureTarget,
    LogitDiffTarget,
    LogitTarget,
    NeuronTarget,
    Target,
    TopLogits,
    TopLogitsTarget,
    UnitLocation,
)
from circuitgraph.spec.validation import (
    Ablate,
    AblateCheck,
    Check,
    Faithfulness,
    FaithfulnessCheck,
    FaithfulnessCurve,
    FaithfulnessCurveCheck,
    LogitDiffMetric,
    LogitMetric,
    Metric,
    Patching,
    PatchingCheck,
    PredictedVsActual,
    PredictedVsActualCheck,
    QKCheck,
    ReplacementFidelity,
    ReplacementFidelityCheck,
    SignRegimes,
    SignRegimesCheck,
)

__all__ = [
    # loading and schema
    "load_spec",
    "SpecSource",
    "read_spec_file",
    "check_inputs",
    "spec_json_schema",
    "spec_schema_text",
    "write_spec_schema",
    "FORMAT_VERSION",
    # the spec
    "Spec",
    "ModelSpec",
    "ModelSource",
    "TranscodersSpec",
    "TranscoderSource",
    "Prompt",
    "TextPrompt",
    "TokensPrompt",
    "GraphSpec",
    "MlpMode",
    "AttentionMode",
    "Prune",
    "PruneSpec",
    "ExportSpec",
    # targets
    "Target",
    "LogitTarget",
    "LogitDiffTarget",
    "TopLogitsTarget",
    "TopLogits",
    "FeatureTarget",
    "NeuronTarget",
    "UnitLocation",
    "DirectionTarget",
    "Direction",
    # node filters
    "NodeFilter",
    "TargetSet",
    "TopNodes",
    "NodeKind",
    "NODE_KINDS",
    # queries
    "Query",
    "TopPathsQuery",
    "TopPaths",
    "InfluenceQuery",
    "Influence",
    "DirectLogitAttributionQuery",
    "DirectLogitAttribution",
    "LogitLensQuery",
    "LogitLens",
    "CongruenceQuery",
    "Congruence",
    "NeighboursQuery",
    "Neighbours",
    "SubgraphQuery",
    "Subgraph",
    "SupernodesQuery",
    "Supernodes",
    "ScoresQuery",
    "Scores",
    "HeadSplitQuery",
    "HeadSplit",
    "VirtualWeightsQuery",
    "VirtualWeights",
    "DeEmbeddingQuery",
    "DeEmbedding",
    "UnitRef",
    "HeadRef",
    "QKQuery",
    "QK",
    "GroundTruthQuery",
    "GroundTruth",
    # validation checks
    "Check",
    "AblateCheck",
    "Ablate",
    "PredictedVsActualCheck",
    "PredictedVsActual",
    "PatchingCheck",
    "Patching",
    "Metric",
    "LogitMetric",
    "LogitDiffMetric",
    "FaithfulnessCheck",
    "FaithfulnessCurve",
    "FaithfulnessCurveCheck",
    "Faithfulness",
    "SignRegimesCheck",
    "SignRegimes",
    "ReplacementFidelityCheck",
    "ReplacementFidelity",
    "QKCheck",
    # steering
    "SteerItem",
    "SteerIntervention",
    "Generate",
]
