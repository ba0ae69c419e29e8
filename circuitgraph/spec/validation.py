"""Validation checks: test the graph against the real model.

Each list item has exactly one key naming the check; ``check.kind`` is that key and
``check.params`` the parameter block under it::

    validate:
      - ablate: {nodes: top_nodes, k: 5, controls: [matched_magnitude]}
      - patching: {corrupted: "The dog sat on the"}
      - faithfulness:

Rules that depend on ``mode`` are checked here: ``mode: scale`` needs ``scale``,
``set`` needs ``value``, ``patch`` needs ``patch_prompt``, ``mean`` needs
``reference_prompts`` (for ``ablate`` and ``predicted_vs_actual``); a parameter that
the chosen mode does not use is an error rather than silently ignored.  The same holds for
the other choices of a check (:func:`unused_rules`): ``ablate``'s ``k`` only picks among
``nodes: top_nodes`` (a node filter ablates every node it matches), and the control
parameters need ``controls`` (``control_tolerance`` and ``max_draws``: matched-magnitude
controls).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, model_validator

from circuitgraph.spec.base import (
    Bool,
    CheckItem,
    Float,
    Fraction,
    InputPath,
    Int,
    KeyedModel,
    NonNegativeInt,
    OutputPath,
    PositiveInt,
    StrictModel,
    Token,
    TokenPair,
    UsageModel,
    check_item,
    keyed_union,
    rule_error,
    unused_rules,
)
from circuitgraph.spec.dataset import ExecutorSpec
from circuitgraph.spec.filters import TopNodes
from circuitgraph.spec.prompts import Prompt
from circuitgraph.spec.queries import QK

__all__ = [
    "Ablate",
    "AblateCheck",
    "PredictedVsActual",
    "PredictedVsActualCheck",
    "LogitMetric",
    "LogitDiffMetric",
    "Metric",
    "Patching",
    "PatchSet",
    "PatchingCheck",
    "Faithfulness",
    "FaithfulnessCheck",
    "FaithfulnessCurve",
    "FaithfulnessCurveCheck",
    "SignRegimes",
    "SignRegimesCheck",
    "ReplacementFidelity",
    "ReplacementFidelityCheck",
    "QKCheck",
    "Check",
]

_REFERENCE = "Prompts whose mean activations are used by mode: mean."


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _unique(name: str, values: tuple[Any, ...] | None) -> list[tuple[str, str]]:
    if values is not None and len(set(values)) != len(values):
        return [(name, f"{name} has repeated values: {list(values)}")]
    return []


def _unset(value: Any) -> bool:
    return value is None or value == ()


def _mode_rules(model: Any, needs: dict[str, str], uses: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """``needs``: mode -> field it requires; ``uses``: field -> modes that use it."""
    problems: list[tuple[str, str]] = []
    mode = model.mode
    field = needs.get(mode)
    if field is not None and _unset(getattr(model, field)):
        problems.append((field, f"mode: {mode} needs {field}; add it or choose another mode"))
    for field, modes in uses.items():
        if not _unset(getattr(model, field)) and mode not in modes:
            which = " or ".join(modes)
            problems.append((field, f"{field} is only used with mode: {which}, mode is {mode}; remove it"))
    return problems


class Ablate(UsageModel):
    """Intervene on a set of nodes in the real model and compare the change in the targets
    with the graph's prediction, against random control sets.

    ``mode``: ``zero`` sets the nodes' activations to 0; ``mean`` to their mean over
    ``reference_prompts``; ``scale`` multiplies them by ``scale``; ``set`` sets them to
    ``value``; ``patch`` copies them from a run on ``patch_prompt``.
    """

    nodes: TopNodes = Field("top_nodes", description="'top_nodes' (the k most influential) or a node filter.")
    k: PositiveInt = Field(10, description="How many top nodes.")
    mode: Literal["zero", "mean", "scale", "set", "patch"] = Field("zero", description="The intervention.")
    value: Float | None = Field(None, description="With mode: set, the new activation.")
    scale: Float | None = Field(None, description="With mode: scale, the factor.")
    reference_prompts: tuple[Prompt, ...] = Field((), description=_REFERENCE)
    patch_prompt: Prompt | None = Field(None, description="With mode: patch, the prompt to copy activations from.")
    positions: tuple[Int, ...] | None = Field(None, min_length=1, description="Only at these positions (null = all).")
    controls: Annotated[
        tuple[Literal["matched_magnitude", "count_matched"], ...],
        BeforeValidator(_one_or_many, json_schema_input_type=(
            Literal["matched_magnitude", "count_matched"]
            | list[Literal["matched_magnitude", "count_matched"]]
        )),
    ] = Field(("matched_magnitude", "count_matched"), description="Kinds of random control sets ([] = none).")
    n_controls: PositiveInt = Field(10, description="Control sets per kind.")
    tolerance: Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)] = Field(
        0.1, description="Relative tolerance of predicted vs actual change (the 'agrees' flag)."
    )
    control_tolerance: Fraction = Field(
        0.05, description="A magnitude-matched control must remove the selected set's activation mass within this "
        "relative tolerance."
    )
    seed: NonNegativeInt | None = Field(None, description="Seed of the random control sets (null = the spec's seed).")
    max_draws: PositiveInt = Field(1000, description="Give up matching a control set after this many draws.")
    match_layers: Bool = Field(
        False, description="Draw each layer's controls from that layer only (default: from every layer whose units "
        "can affect the metric)."
    )
    match_positions: Bool = Field(
        False, description="Draw each position's controls from that position only (default: from every position "
        "whose units can affect the metric)."
    )
    eval_prompts: tuple[Prompt, ...] = Field(
        (), description="Evaluation rows apart from the graph's prompt (where the nodes are selected), each as long "
        "as it: the intervention and its controls run on each, the changes are their mean and the controls are "
        "matched on what the units remove there (none: the graph's prompt, reported as same_rows).")
    eval_dataset: InputPath | None = Field(None, description="A .jsonl/.csv file of evaluation rows (the dataset: "
                                           "format), besides eval_prompts.")
    max_rows: PositiveInt | None = Field(None, description="Read at most this many rows of eval_dataset.")

    def field_usage(self) -> dict[str, tuple[bool, str]]:
        no_controls = "controls is [] (no control sets are drawn)"
        matched = "matched_magnitude" in self.controls
        return {
            "max_rows": (self.eval_dataset is not None, "it limits the rows read from eval_dataset, which is not "
                         "given"),
            "k": (self.nodes == "top_nodes", "it picks the k strongest of nodes: top_nodes, and a node filter "
                  "ablates every node it matches (narrow the filter by layer, position or index instead)"),
            "n_controls": (bool(self.controls), no_controls),
            "seed": (bool(self.controls), f"it draws the control sets, and {no_controls}"),
            "match_layers": (bool(self.controls), no_controls),
            "match_positions": (bool(self.controls), no_controls),
            "control_tolerance": (matched, "it is the tolerance of matched_magnitude controls, which controls "
                                  "does not list"),
            "max_draws": (matched, "it bounds the draws of matched_magnitude controls, which controls does not "
                          "list"),
        }

    @model_validator(mode="after")
    def _modes(self) -> Ablate:
        problems = _mode_rules(
            self,
            needs={"scale": "scale", "set": "value", "patch": "patch_prompt", "mean": "reference_prompts"},
            uses={"scale": ("scale",), "value": ("set",), "patch_prompt": ("patch",), "reference_prompts": ("mean",)},
        )
        problems += _unique("controls", self.controls)
        problems += unused_rules(self, self.field_usage())
        if problems:
            raise rule_error(*problems)
        return self


AblateCheck = check_item("ablate", Ablate)


class PredictedVsActual(StrictModel):
    """For each of the top k nodes, the graph's predicted effect of ablating it vs the real one."""

    k: PositiveInt = Field(10, description="How many top nodes.")
    mode: Literal["zero", "mean"] = Field("zero", description="The intervention.")
    reference_prompts: tuple[Prompt, ...] = Field((), description=_REFERENCE)

    @model_validator(mode="after")
    def _modes(self) -> PredictedVsActual:
        problems = _mode_rules(self, needs={"mean": "reference_prompts"}, uses={"reference_prompts": ("mean",)})
        if problems:
            raise rule_error(*problems)
        return self


PredictedVsActualCheck = check_item("predicted_vs_actual", PredictedVsActual)


class LogitMetric(KeyedModel):
    """The logit of one token at the last position."""

    key: ClassVar[str] = "logit"
    logit: Token


class LogitDiffMetric(KeyedModel):
    """logit(a) - logit(b) at the last position."""

    key: ClassVar[str] = "logit_diff"
    logit_diff: TokenPair


if TYPE_CHECKING:
    Metric = LogitMetric | LogitDiffMetric
else:
    Metric = keyed_union("metric", LogitMetric, LogitDiffMetric)

Granularity = Literal["layer", "head", "neuron", "feature", "position"]


#: the image formats a patching heat map can be written in (chosen by the file's suffix)
HEATMAP_SUFFIXES = (".png", ".svg", ".pdf")


_LayerIndex = Annotated[tuple[NonNegativeInt, NonNegativeInt], Field(description="[layer, index]")]


class PatchSet(StrictModel):
    """Units patched together from the clean run, at every position: one row of a patching check."""

    name: str | None = Field(None, description="The row's label (default: its units).")
    neurons: tuple[_LayerIndex, ...] = Field((), description="Neurons as [layer, index] pairs.")
    heads: tuple[_LayerIndex, ...] = Field((), description="Heads as [layer, head] pairs.")
    mlps: tuple[NonNegativeInt, ...] = Field((), description="Whole MLP outputs, by layer.")
    attns: tuple[NonNegativeInt, ...] = Field((), description="Whole attention outputs, by layer.")

    @model_validator(mode="after")
    def _not_empty(self) -> PatchSet:
        if not (self.neurons or self.heads or self.mlps or self.attns):
            raise rule_error(("", "a patching set needs at least one unit: give neurons, heads, mlps or attns"))
        return self


class Patching(StrictModel):
    """Activation patching: run ``corrupted`` with activations of ``clean`` (the main prompt by
    default) patched in, one unit at a time at each granularity; relative recovery =
    (patched - corrupted) / (clean - corrupted) of ``metric`` (default: the first target)."""

    clean: Prompt | None = Field(None, description="The clean prompt (null = the main prompt).")
    corrupted: Prompt | None = Field(
        None, description="The corrupted prompt; same number of tokens as clean (required, except in a dataset "
        "run whose rows give corrupted:)."
    )
    metric: Metric | None = Field(None, description="{logit_diff: [a, b]} or {logit: a} (null = the first target).")
    granularity: Annotated[
        tuple[Granularity, ...],
        BeforeValidator(_one_or_many, json_schema_input_type=Granularity | list[Granularity]),
    ] = Field(("layer", "head"), min_length=1, description="What to patch, one sweep each.")
    heatmap: OutputPath | None = Field(None, description="Write a heatmap image here.")
    layers: tuple[NonNegativeInt, ...] | None = Field(
        None, min_length=1, description="Only these layers in the layer, head, neuron and feature sweeps (null = "
        "all; a neuron sweep of every layer is one patch per neuron).")
    sets: tuple[PatchSet, ...] = Field((), description="Units patched together, one row each (granularity set).")

    @model_validator(mode="after")
    def _unique(self) -> Patching:
        problems = _unique("granularity", self.granularity)
        problems += _unique("layers", self.layers)
        if self.heatmap is not None and self.heatmap.suffix.lower() not in HEATMAP_SUFFIXES:
            problems.append(
                ("heatmap", f"heatmap image {str(self.heatmap)!r} should end in {', '.join(HEATMAP_SUFFIXES)} "
                 "(the suffix picks the image format); rename it")
            )
        if problems:
            raise rule_error(*problems)
        return self


PatchingCheck = check_item("patching", Patching)


class Faithfulness(StrictModel):
    """How much of the targets the graph's nodes recover when everything else is ablated.

    With ``mode: mean`` and no ``reference_prompts`` the engine decides the reference
    (see the engine's documentation).
    """

    mode: Literal["zero", "mean"] = Field("mean", description="How nodes outside the graph are ablated.")
    reference_prompts: tuple[Prompt, ...] = Field((), description=_REFERENCE)

    @model_validator(mode="after")
    def _modes(self) -> Faithfulness:
        problems = _mode_rules(self, needs={}, uses={"reference_prompts": ("mean",)})
        if problems:
            raise rule_error(*problems)
        return self


FaithfulnessCheck = check_item("faithfulness", Faithfulness)


class FaithfulnessCurve(StrictModel):
    """The metric's recovery when only the top fraction of the graph's edges (or nodes) is kept and
    the rest ablated in the real model, at each size, with MIB's CPR (area under the curve) and
    CMD (area between the curve and 1); see docs/validation.md."""

    sizes: tuple[Annotated[float, Field(ge=0, le=1, strict=True, allow_inf_nan=False)], ...] = Field(
        (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5), min_length=1,
        description="Circuit sizes, as fractions of the graph's edges (or nodes).")
    ablation: Literal["mean", "zero", "patch"] = Field(
        "zero", description="How what is not kept is ablated: zero; mean over reference_prompts; patch from "
        "patch_prompt (edges: the same edge's value in the reference prompt's graph, 0 where it has none).")
    unit: Literal["edges", "nodes"] = Field("edges", description="Rank and keep edges or nodes.")
    reference_prompts: tuple[Prompt, ...] = Field((), description="With ablation: mean, the prompts whose mean "
                                                  "activations (unit: nodes) or mean edge values (unit: edges, "
                                                  "required) replace what is ablated.")
    patch_prompt: Prompt | None = Field(None, description="With ablation: patch, the prompt to copy values from.")
    plot: OutputPath | None = Field(None, description="Write the curve as an image here (needs matplotlib).")

    @model_validator(mode="after")
    def _modes(self) -> FaithfulnessCurve:
        problems = []
        if self.ablation == "patch" and self.patch_prompt is None:
            problems.append(("patch_prompt", "ablation: patch needs patch_prompt"))
        if self.patch_prompt is not None and self.ablation != "patch":
            problems.append(("patch_prompt", f"patch_prompt is only used with ablation: patch, ablation is "
                                             f"{self.ablation}; remove it"))
        if self.reference_prompts and self.ablation != "mean":
            problems.append(("reference_prompts", f"reference_prompts is only used with ablation: mean, ablation "
                                                  f"is {self.ablation}; remove it"))
        if self.unit == "edges" and self.ablation == "mean" and not self.reference_prompts:
            problems.append(("reference_prompts", "unit: edges with ablation: mean averages each edge over "
                                                  "reference_prompts; add reference_prompts"))
        if problems:
            raise rule_error(*problems)
        return self


FaithfulnessCurveCheck = check_item("faithfulness_curve", FaithfulnessCurve)


_CONTROL_KIND = Literal["matched_magnitude", "count_matched"]


class SignRegimes(UsageModel):
    """Gated (SwiGLU-style) MLP neurons: the sign regimes of their activations, the neurons whose
    top activations are gate-closed 'double negative' echoes (selected on some rows), and the
    next-token loss cost of removing that echo on other rows against random neurons matched on
    the echo they remove there (docs/validation.md)."""

    layers: tuple[NonNegativeInt, ...] | None = Field(None, min_length=1, description="Only these layers (null = all).")
    top_k: PositiveInt = Field(20, description="Top activations per neuron whose sign regimes are counted.")
    echo_threshold: Fraction = Field(
        1.0, description="Share of a neuron's top_k activations that must be echoes for it to be echo-dominated "
        "(1: all of them, the published selection).")
    prompts: tuple[Prompt, ...] = Field((), description="Selection rows besides the main prompt.")
    eval_prompts: tuple[Prompt, ...] = Field(
        (), description="Evaluation rows: the echo is removed and the controls matched on these (none and no "
        "evaluation part of a dataset: the selection rows, reported as such).")
    use_graph_prompt: Bool = Field(True, description="Whether the graph's prompt is a selection row.")
    dataset: InputPath | None = Field(
        None, description="A .jsonl/.csv file of rows (the dataset: format); its first selection_share of rows "
        "are selection rows, the rest evaluation rows (all selection rows when eval_dataset is given).")
    eval_dataset: InputPath | None = Field(None, description="A .jsonl/.csv file of evaluation rows.")
    selection_share: Annotated[float, Field(gt=0, lt=1, strict=True, allow_inf_nan=False)] = Field(
        0.5, description="With dataset and no eval_dataset: the share of its rows (the first ones) that select.")
    max_rows: PositiveInt | None = Field(None, description="Read at most this many rows of each file.")
    max_row_tokens: Annotated[int, Field(ge=2, strict=True)] | None = Field(
        None, description="Cut every row to its first this many tokens.")
    token_budget: PositiveInt | None = Field(
        None, description="At most this many tokens of selection rows and as many of evaluation rows (file rows "
        "are read in order until the budget is spent; the last one cut).")
    groups: Bool = Field(True, description="Also report the echo-dominated neurons of group_layer, those whose "
                         "gate never opened, and neither, each with its own controls.")
    group_layer: NonNegativeInt = Field(1, description="The layer of the first group.")
    controls: Annotated[
        tuple[_CONTROL_KIND, ...],
        BeforeValidator(_one_or_many, json_schema_input_type=_CONTROL_KIND | list[_CONTROL_KIND]),
    ] = Field(("matched_magnitude", "count_matched"), description="Kinds of random control sets ([] = none).")
    n_controls: PositiveInt = Field(10, description="Control sets per kind (and per group).")
    control_tolerance: Fraction = Field(
        0.05, description="A matched control must remove the selected neurons' echo mass on the evaluation rows "
        "within this relative tolerance, in each layer.")
    max_draws: PositiveInt = Field(1000, description="Give up matching a control set after this many draws.")
    seed: NonNegativeInt | None = Field(None, description="Seed of the random control sets (null = the spec's seed).")
    batch_size: PositiveInt = Field(8, description="Evaluation runs (neuron sets) per forward pass.")
    executor: ExecutorSpec | None = Field(
        None, description="Run the rows on the dataset executors (local worker processes or Ray, each loading the "
        "model), in shards of consecutive rows merged in row order: the same result as in this process (null: in "
        "this process).")

    def field_usage(self) -> dict[str, tuple[bool, str]]:
        no_controls = "controls is [] (no control sets are drawn)"
        matched = "matched_magnitude" in self.controls
        files = self.dataset is not None or self.eval_dataset is not None
        return {
            "selection_share": (self.dataset is not None and self.eval_dataset is None,
                                "it splits dataset's rows, and there is no dataset or eval_dataset holds the "
                                "evaluation rows"),
            "max_rows": (files, "it limits the rows read from dataset or eval_dataset, and neither is given"),
            "group_layer": (self.groups, "groups is false"),
            "n_controls": (bool(self.controls), no_controls),
            "seed": (bool(self.controls), f"it draws the control sets, and {no_controls}"),
            "control_tolerance": (matched, "it is the tolerance of matched_magnitude controls, which controls "
                                  "does not list"),
            "max_draws": (matched, "it bounds the draws of matched_magnitude controls, which controls does not "
                          "list"),
        }

    @model_validator(mode="after")
    def _rules(self) -> SignRegimes:
        problems = _unique("controls", self.controls) + unused_rules(self, self.field_usage())
        if problems:
            raise rule_error(*problems)
        return self


SignRegimesCheck = check_item("sign_regimes", SignRegimes)


class ReplacementFidelity(StrictModel):
    """How well the replacement model (transcoders instead of MLPs) reproduces the real logits."""

    prompts: tuple[Prompt, ...] = Field((), description="Extra prompts besides the main prompt.")


ReplacementFidelityCheck = check_item("replacement_fidelity", ReplacementFidelity)


QKCheck = check_item(
    "qk", QK,
    """QK attribution checked by intervention: each node of the top pairs is removed from the
    query side only (``hook_q_input``), or the key side only (``hook_k_input``), in the frozen
    model; the change in the pre-softmax score is compared with the node's marginal.  Same
    parameters as the ``qk`` query (``top_k`` pairs per head).""",
)


#: every validation check kind, in the order the schema and the error messages list them
CHECK_TYPES: tuple[type[CheckItem], ...] = (
    AblateCheck, PredictedVsActualCheck, PatchingCheck, FaithfulnessCheck, SignRegimesCheck,
    ReplacementFidelityCheck, QKCheck, FaithfulnessCurveCheck,
)

if TYPE_CHECKING:
    Check = CheckItem
else:
    Check = keyed_union("validation check", *CHECK_TYPES, list_item=True)
