"""The whole spec: one model, versioned, that says what to run."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from circuitgraph.errors import SpecError
from circuitgraph.spec.base import RULE_ERROR, InputPath, StrictModel, _short, rule_error
from circuitgraph.spec.dataset import AggregateSpec, ExecutorSpec
from circuitgraph.spec.export import EXPORT_KINDS, ExportSpec
from circuitgraph.spec.features import FeaturesSpec
from circuitgraph.spec.graph import GraphSpec, Prune, PruneSpec
from circuitgraph.spec.messages import format_validation_error
from circuitgraph.spec.model import ModelSpec, TranscodersSpec
from circuitgraph.spec.prompts import Prompt, TextPrompt
from circuitgraph.spec.queries import Query
from circuitgraph.spec.steering import SteerItem
from circuitgraph.spec.targets import Target, TopLogitsTarget
from circuitgraph.spec.validation import Check

__all__ = ["Spec", "FORMAT_VERSION"]

FORMAT_VERSION = 1
#: the largest seed (torch.manual_seed takes a 64-bit integer)
MAX_SEED = 2**63 - 1


def _exact_version(value: Any) -> Any:
    # Literal[1] alone would take true and 1.0 (both compare equal to 1): types are not guessed
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError(
            RULE_ERROR, "expected the integer {v}, got {got}; write format_version: {v}",
            {"v": FORMAT_VERSION, "got": _short(value)},
        )
    return value


#: a random seed: an integer (never a bool or a float) that torch accepts
Seed = Annotated[int, Field(strict=True, ge=0, le=MAX_SEED)]

MISSING_PROMPT = ("missing required key 'prompt' (one prompt), or give dataset: (a .jsonl/.csv file or a list "
                  "of rows) for many")


def _default_targets() -> tuple[Target, ...]:
    return (TopLogitsTarget(),)


with warnings.catch_warnings():
    # ``validate`` shadows the deprecated ``BaseModel.validate`` classmethod; the spec key wins
    warnings.filterwarnings("ignore", message='Field name "validate"', category=UserWarning)

    class Spec(StrictModel):
        """A circuitgraph run: model, dictionaries, prompt, targets, graph options,
        pruning, queries, validation checks and exports.

        Load one with :func:`circuitgraph.spec.load_spec` (YAML, JSON, a dict) or build
        it in Python; bad input raises :class:`~circuitgraph.errors.SpecError` listing
        every problem with its location.
        """

        format_version: Annotated[Literal[1], BeforeValidator(_exact_version)] = Field(
            description="Version of the spec format; this is version 1."
        )
        seed: Seed = Field(0, description="Random seed (control sets, sampling), 0 to 2**63-1.")
        model: ModelSpec = Field(description="The model: exactly one of path, name, builtin or pretrained.")
        transcoders: TranscodersSpec | None = Field(None, description="Dictionaries (transcoders or a cross-layer transcoder): exactly one of path, release, builtin, hf.")
        prompt: Prompt | None = Field(
            None, description="The prompt: a string, {text, prepend_bos} or {tokens: [...]} (or give dataset:)."
        )
        dataset: InputPath | tuple[dict[str, Any], ...] | None = Field(
            None, description="Many prompts instead of prompt: a .jsonl/.csv file or an inline list of rows "
            "{prompt | tokens, targets?, corrupted?, id?}.",
        )
        targets: tuple[Target, ...] = Field(
            default_factory=_default_targets, min_length=1, description="What the graph explains."
        )
        graph: GraphSpec = Field(default_factory=GraphSpec, description="How the graph is built.")
        prune: Prune = Field("none", description="'none' or pruning thresholds.")
        queries: tuple[Query, ...] = Field((), description="Queries run on the graph.")
        validate: tuple[Check, ...] = Field((), description="Checks against the real model.")
        steer: tuple[SteerItem, ...] = Field((), description="Interventions on the real model, watched through "
                                             "generation (docs/steering.md).")
        export: ExportSpec = Field(default_factory=ExportSpec, description="Output files.")
        aggregate: AggregateSpec | None = Field(None, description="Dataset runs: how per-prompt graphs are aggregated.")
        executor: ExecutorSpec | None = Field(None, description="Dataset runs: local processes or Ray.")
        features: FeaturesSpec | None = Field(
            None, description="Dataset runs: feature dashboards (top activating tokens, density, quantiles, output "
            "and input tokens) written to export.features.")
        #: the folder relative paths were resolved against (the spec file's folder), when known
        _base_dir: Path | None = PrivateAttr(default=None)

        @property
        def base_dir(self) -> Path | None:
            """The folder relative paths in this spec were resolved against (``None``: unknown)."""
            return self._base_dir

        @property
        def pruning(self) -> PruneSpec | None:
            """The pruning settings, or ``None`` for ``prune: none``."""
            return self.prune if isinstance(self.prune, PruneSpec) else None

        @property
        def is_dataset(self) -> bool:
            """Whether this spec runs a dataset (``dataset:``) rather than one prompt."""
            return self.dataset is not None

        def _dataset_checks(self) -> list[tuple[str, str]]:
            problems: list[tuple[str, str]] = []
            if self.prompt is None and self.dataset is None:
                problems.append(("prompt", MISSING_PROMPT))
            elif self.prompt is not None and self.dataset is not None:
                problems.append(("dataset", "give prompt: (one prompt) or dataset: (many), not both"))
            patching = [i for i, c in enumerate(self.validate) if c.kind == "patching"]
            if self.dataset is not None and self.steer:
                problems.append(("steer", "steer: runs on one prompt's graph; remove it or give prompt: instead of "
                                 "dataset:"))
            if self.dataset is None:
                for key in ("aggregate", "executor", "features"):
                    if getattr(self, key) is not None:
                        problems.append((key, f"{key}: is only used with dataset:; remove it or give a dataset"))
                if self.export.dataset is not None:
                    problems.append(("export.dataset", "export.dataset is the output folder of a dataset run; "
                                                       "give dataset: or use export.json/graph for one prompt"))
                for i in patching:
                    if self.validate[i].params.corrupted is None:
                        problems.append((f"validate[{i}].patching.corrupted",
                                         "missing required key 'corrupted' (the corrupted prompt)"))
                return problems
            problems += self._features_checks()
            for i, c in enumerate(self.validate):
                if c.kind == "sign_regimes" and c.params.executor is not None:
                    problems.append((f"validate[{i}].sign_regimes.executor", "a dataset run already runs each row's "
                                     "checks on its executor; remove the check's executor"))
            if self.export.dataset is None and self.features is None:
                problems.append(("export.dataset", "a dataset run needs an output folder: add export: {dataset: DIR}"))
            single = [k for k in EXPORT_KINDS if getattr(self.export, k, None)]
            if single:
                problems.append((f"export.{single[0]}", f"export.{', '.join(single)} write one graph; a dataset run "
                                 "writes every graph under export.dataset (dataset_format: binary or json)"))
            for i in patching:
                p = self.validate[i].params
                if p.clean is not None:
                    problems.append((f"validate[{i}].patching.clean", "in a dataset run clean is each row's prompt; "
                                     "remove clean"))
                if p.heatmap is not None:
                    problems.append((f"validate[{i}].patching.heatmap", "heat maps are not drawn in dataset runs "
                                     "(one file per prompt); remove heatmap"))
            return problems

        @property
        def runs_graphs(self) -> bool:
            """Whether a dataset spec builds every prompt's graph (``export.dataset``); a spec with
            only ``features:`` and ``export.features`` computes feature dashboards alone."""
            return self.dataset is not None and self.export.dataset is not None

        def _features_checks(self) -> list[tuple[str, str]]:
            """A dataset spec's ``features:`` and ``export.features`` go together; without
            ``export.dataset`` no graph is built, so graph-only sections are refused."""
            problems: list[tuple[str, str]] = []
            if self.features is not None and self.export.features is None:
                problems.append(("export.features", "features: needs an output folder: add export: {features: DIR}"))
            if self.features is not None and self.features.units == "features" and self.transcoders is None:
                problems.append(("features.units", "units: features (the default) reads transcoder features and "
                                                   "needs transcoders: (or a CLT); for the model's own units give "
                                                   "units: neurons or units: heads"))
            if self.features is None and self.export.features is not None:
                problems.append(("features", "export.features is the output folder of feature dashboards; add "
                                             "features: {} (or remove export.features)"))
            ex = self.export
            if ex.features is not None and ex.dataset is not None and \
                    Path(os.path.normpath(ex.features)) == Path(os.path.normpath(ex.dataset)):
                problems.append(("export.features", f"export.features {str(ex.features)!r} is also export.dataset; "
                                                     "give the dashboards their own folder"))
            if self.features is not None and self.export.dataset is None:
                for key in ("queries", "validate"):
                    if getattr(self, key):
                        problems.append((key, f"{key}: runs on graphs; a features-only run builds none: add "
                                              "export.dataset to build the graphs too, or remove it"))
                if self.aggregate is not None:
                    problems.append(("aggregate", "aggregate: is for graph dataset runs; add export.dataset or "
                                                  "remove it"))
            return problems

        @model_validator(mode="wrap")
        @classmethod
        def _prompt_or_dataset(cls, data: Any, handler: Any) -> Any:
            # a missing prompt is reported with the other problems, not only once they are fixed
            try:
                return handler(data)
            except ValidationError as exc:
                if not isinstance(data, dict) or "prompt" in data or "dataset" in data:
                    raise

                problems = format_validation_error(exc, cls, data) + [("prompt", MISSING_PROMPT)]
                raise SpecError(problems) from None

        @model_validator(mode="after")
        def _targets_not_zero(self) -> Spec:
            """A target that is identically zero (weight 0, or a logit difference of a token with
            itself) has nothing to explain: every edge, share and score would be 0 or 0/0."""
            problems: list[tuple[str, str]] = []
            for i, target in enumerate(self.targets):
                if getattr(target, "weight", None) == 0:
                    problems.append((f"targets[{i}].weight", "a target with weight 0 explains nothing; give a "
                                     "non-zero weight or remove the target"))
                if target.kind == "logit_diff" and target.params[0] == target.params[1]:
                    a = target.params[0]
                    problems.append((f"targets[{i}].logit_diff", f"[{a!r}, {a!r}] compares a token with itself, so "
                                     "the target is always 0; give two different tokens"))
            if problems:
                raise rule_error(*problems)
            return self

        @model_validator(mode="after")
        def _cross_checks(self) -> Spec:
            problems: list[tuple[str, str]] = self._dataset_checks()
            has_tc = self.transcoders is not None
            available = self.transcoders.available_layers() if self.transcoders is not None else None
            named = self.graph.transcoder_layers_named()
            if named and not has_tc:
                problems.append(
                    ("graph.mlp", "mlp: transcoders needs a transcoders section; add transcoders: {path: ...} "
                     "or use mlp: neurons")
                )
            elif isinstance(named, tuple) and available is not None:
                missing = [layer for layer in named if layer not in available]
                if missing:
                    problems.append(
                        ("graph.mlp", f"layers {missing} use transcoders but transcoders has only layers "
                         f"{list(available)}")
                    )
            g = self.graph
            if g.neuron_top_k is not None and g.mlp in ("transcoders", "mlp"):
                problems.append(("graph.neuron_top_k", f"neuron_top_k is not used here: it keeps the top neurons and "
                                 f"mlp: {g.mlp} makes no neuron nodes; remove it"))
            if g.max_neuron_nodes is not None and g.neuron_top_k is not None:
                problems.append(("graph.max_neuron_nodes", "max_neuron_nodes and neuron_top_k both choose which "
                                 "neurons stay nodes (by influence on the targets, by activation); keep one "
                                 "(max_neuron_nodes: K keeps the K most influential neurons of the graph)"))
            if g.max_neuron_nodes is not None and g.mlp in ("transcoders", "mlp"):
                problems.append(("graph.max_neuron_nodes", f"max_neuron_nodes is not used here: it caps the neuron "
                                 f"nodes and mlp: {g.mlp} makes none; remove it"))
            if g.max_feature_nodes is not None and (not has_tc or g.mlp in ("neurons", "mlp")):
                why = "there is no transcoders section" if not has_tc else f"mlp: {g.mlp} makes no feature nodes"
                problems.append(("graph.max_feature_nodes", f"max_feature_nodes is not used here: it caps the "
                                 f"feature nodes and {why}; remove it"))
            if self.export.qk_inset and not any(q.kind == "qk" for q in self.queries):
                problems.append(("export.qk_inset", "qk_inset is not used here: it draws the results of the qk "
                                 "queries and queries has none; add a qk query or remove it"))
            if self.export.dataset_format == "json" and self.dataset is None:
                problems.append(("export.dataset_format", "dataset_format is not used here: it is the format of a "
                                 "dataset run's graphs and there is no dataset:; remove it"))
            for i, target in enumerate(self.targets):
                if target.kind != "feature":
                    continue
                layer = target.params.layer
                if self.graph.mlp_for(layer, has_transcoders=has_tc) != "transcoders" or not has_tc:
                    problems.append(
                        (f"targets[{i}].feature", f"a feature target needs transcoders at layer {layer}; add a "
                         "transcoders section (and mlp: transcoders for that layer)")
                    )
                elif available is not None and layer not in available:
                    problems.append(
                        (f"targets[{i}].feature.layer", f"layer {layer} has no transcoder; transcoders has layers "
                         f"{list(available)}")
                    )
            for i, query in enumerate(self.queries):
                if query.kind == "direct_logit_attribution" and query.params.target >= len(self.targets):
                    problems.append(
                        (f"queries[{i}].direct_logit_attribution.target",
                         f"target {query.params.target} requested, the spec has {len(self.targets)} target(s) "
                         f"(0-{len(self.targets) - 1})")
                    )
                if query.kind == "congruence" and query.params.kind == "feature" and not has_tc:
                    problems.append(
                        (f"queries[{i}].congruence.kind", "kind: feature needs transcoders; add a transcoders "
                         "section or use kind: neuron")
                    )
            if problems:
                raise rule_error(*problems)
            return self

        def summary(self) -> str:
            """One line: model, prompt, targets, graph, queries, checks, exports."""
            m = self.model
            model = f"{m.source} {getattr(m, m.source)}"
            if self.dataset is not None:
                prompt = f"dataset {self.dataset}" if not isinstance(self.dataset, tuple) else (
                    f"dataset of {len(self.dataset)} inline rows")
            elif isinstance(self.prompt, TextPrompt):
                text = self.prompt.text if len(self.prompt.text) <= 40 else self.prompt.text[:37] + "..."
                prompt = repr(text)
            elif self.prompt is not None:
                prompt = f"{len(self.prompt.tokens)} tokens"
            else:
                prompt = "no prompt"
            parts = [
                f"model {model}",
                f"transcoders {self.transcoders.source}" if self.transcoders else "no transcoders",
                prompt if self.dataset is not None else f"prompt {prompt}",
                f"graph mlp {self.graph.mlp or 'default'}, attention {self.graph.attention}",
                f"targets {', '.join(t.kind for t in self.targets)}",
                f"queries {', '.join(q.kind for q in self.queries) or 'none'}",
                f"checks {', '.join(c.kind for c in self.validate) or 'none'}",
                f"exports {', '.join(self.export.outputs()) or 'none'}" if self.dataset is None else
                f"exports dataset folder {self.export.dataset}" if self.export.dataset is not None else
                f"exports features folder {self.export.features}",
            ]
            return "; ".join(parts)
