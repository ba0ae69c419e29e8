"""Validation: test a graph against the real model.

* :mod:`~circuitgraph.validation.interventions`: :class:`Unit`, :class:`Intervention` and the
  scoped :func:`intervene` (zero, mean, scale, set, patch; features spliced through their
  transcoder, neurons, gates and values, heads, whole MLPs and attention layers, embeddings);
* :func:`ablate` (with random controls matched on removed magnitude and on count) and
  :func:`predicted_vs_actual` (graph vs frozen model vs real model, node by node);
* :func:`patching`: activation patching with relative recovery and a heat map;
* :func:`faithfulness`: keep only / remove only the circuit;
* :func:`faithfulness_curve`: recovery over circuit sizes, with MIB's CPR and CMD;
* :func:`sign_regimes`: gated-MLP sign regimes and the double-negative echo;
* :func:`replacement_fidelity`: the replacement model vs the real one;
* :func:`run_check`: one item of the spec's ``validate:`` list -> :class:`CheckResult`;
* :mod:`~circuitgraph.validation.frozen`: ablations in the frozen model (edge exactness).
"""

from circuitgraph.validation.ablation import (
    AblationResult,
    PredictedVsActualResult,
    PredictionRow,
    ablate,
    predicted_vs_actual,
)
from circuitgraph.validation.activation_patching import PatchingResult, patch_recovery, patching, write_heatmap
from circuitgraph.validation.circuit_faithfulness import FaithfulnessResult, faithfulness, universe_units
from circuitgraph.validation.controls import ControlSummary, draw_controls, unit_magnitudes
from circuitgraph.validation.dispatch import CHECK_KINDS, CheckResult, run_check, run_checks
from circuitgraph.validation.faithfulness_curves import FaithfulnessCurveResult, curve_areas, faithfulness_curve
from circuitgraph.validation.fidelity import ReplacementFidelityResult, replacement_fidelity, replacement_model
from circuitgraph.validation.frozen import frozen_ablation_effects, frozen_reader_values
from circuitgraph.validation.gated_signs import SignRegimeResult, echo_removed, sign_regimes
from circuitgraph.validation.interventions import (
    Intervention,
    InterventionResult,
    Unit,
    intervene,
    measure_intervention,
    run_rows,
)
from circuitgraph.validation.metrics import Metric, Readout, next_token_loss
from circuitgraph.validation.predictions import direct_effects, select_nodes, total_effects

__all__ = [
    "AblationResult",
    "CHECK_KINDS",
    "CheckResult",
    "ControlSummary",
    "FaithfulnessResult",
    "FaithfulnessCurveResult",
    "Intervention",
    "InterventionResult",
    "Metric",
    "PatchingResult",
    "PredictedVsActualResult",
    "PredictionRow",
    "Readout",
    "ReplacementFidelityResult",
    "SignRegimeResult",
    "Unit",
    "ablate",
    "direct_effects",
    "draw_controls",
    "echo_removed",
    "faithfulness",
    "faithfulness_curve",
    "curve_areas",
    "frozen_ablation_effects",
    "frozen_reader_values",
    "intervene",
    "measure_intervention",
    "next_token_loss",
    "patch_recovery",
    "patching",
    "predicted_vs_actual",
    "replacement_fidelity",
    "replacement_model",
    "run_check",
    "run_checks",
    "run_rows",
    "select_nodes",
    "sign_regimes",
    "total_effects",
    "unit_magnitudes",
    "universe_units",
    "write_heatmap",
]
