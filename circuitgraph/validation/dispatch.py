"""One entry point for the spec's ``validate:`` list: :func:`run_check`.

Each item names one check; :func:`run_check` runs it on a graph (which must carry its live
model context) and returns a :class:`CheckResult`, whose ``to_dict()`` is the entry written
into the graph JSON's top-level ``validation`` list::

    {"kind": "ablate", "params": {...the check's parameters...}, "result": {...}}

Example::

    >>> from circuitgraph.validation import run_check
    >>> res = run_check(graph, {"ablate": {"k": 5, "controls": ["count_matched"]}})  # doctest: +SKIP
    >>> print(res.table())  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from circuitgraph._results import Tabular
from circuitgraph.attribution.targets import resolve_token
from circuitgraph.display import result_html
from circuitgraph.errors import ValidationRunError
from circuitgraph.spec.dataset import parse_rows, read_dataset_rows
from circuitgraph.spec.validation import CHECK_TYPES
from circuitgraph.validation._common import PromptResolver, graph_context, jsonable, resolve_prompt
from circuitgraph.validation.ablation import AblationResult, PredictedVsActualResult, ablate, predicted_vs_actual
from circuitgraph.validation.activation_patching import PatchingResult, patching
from circuitgraph.validation.circuit_faithfulness import FaithfulnessResult, faithfulness
from circuitgraph.validation.faithfulness_curves import FaithfulnessCurveResult, faithfulness_curve
from circuitgraph.validation.fidelity import ReplacementFidelityResult, replacement_fidelity
from circuitgraph.validation.gated_signs import SignRegimeResult, sign_regimes
from circuitgraph.validation.interventions import Unit
from circuitgraph.validation.metrics import Metric
from circuitgraph.validation.qk_check import QKCheckResult, qk_check

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.sites import Site
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.graph.graph import AttributionGraph
    from circuitgraph.spec.queries import QK
    from circuitgraph.spec.root import Spec
    from circuitgraph.spec.validation import (
        Ablate,
        Faithfulness,
        FaithfulnessCurve,
        Patching,
        PredictedVsActual,
        ReplacementFidelity,
        SignRegimes,
    )

__all__ = ["CHECK_FUNCTIONS", "CHECK_KINDS", "CheckCall", "CheckResult", "run_check", "run_checks", "sign_regimes_rows",
           "patch_sets", "check_metric"]

#: the check kinds, in the spec's order: the spec's registry (its union and schema are built from it too)
CHECK_KINDS: tuple[str, ...] = tuple(t.key for t in CHECK_TYPES)
_CHECK_TYPES = {t.key: t for t in CHECK_TYPES}


@dataclass(repr=False)
class CheckResult(Tabular):
    """One validation check: its kind, its parameters (JSON) and its typed result."""

    kind: str
    params: dict[str, Any]
    result: Any

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": jsonable(self.params), "result": jsonable(self.result.to_dict())}

    def table(self, max_rows: int = 10) -> str:
        return f"### {self.kind}\n\n{self.result.table(max_rows)}"

    def records(self) -> list[dict[str, Any]]:
        """The rows of the check's result (see :class:`circuitgraph._results.Tabular`)."""
        return self.result.records()

    def _repr_html_(self) -> str:
        return result_html(self.kind, self.result)


def _split(check: Any) -> tuple[str, Any]:
    """``(kind, params)`` of a spec item: a parsed check model, ``{kind: params}`` or a pair."""
    if hasattr(check, "kind") and hasattr(check, "params"):
        return str(check.kind), check.params
    if isinstance(check, dict) and len(check) == 1:
        ((kind, params),) = check.items()
        return str(kind), params
    if isinstance(check, (tuple, list)) and len(check) == 2 and isinstance(check[0], str):
        return check[0], check[1]
    raise ValidationRunError(
        f"a validation check must have exactly one key naming it ({', '.join(CHECK_KINDS)}), got {check!r}"
    )


def _params(kind: str, params: Any) -> BaseModel:
    """The check's parameter block as its spec model, every default filled in by the model (the
    one place defaults live): a parsed block is kept, a mapping (or None) is validated."""
    if isinstance(params, BaseModel):
        return params
    if params is not None and not isinstance(params, dict):
        raise ValidationRunError(f"check parameters must be a mapping, got {type(params).__name__}: {params!r}")
    try:
        return _CHECK_TYPES[kind].model_validate({kind: params}).params
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ValidationRunError(f"{where}: {first['msg']}") from None


def _token(token: Any, adapter: ModelAdapter, tokenizer: Tokenizer | None, where: str) -> int:
    try:
        return resolve_token(token, tokenizer, adapter.facts.d_vocab, where)
    except Exception as exc:  # noqa: BLE001 - TokenError already says what to do
        raise ValidationRunError(str(exc)) from None


def check_metric(spec: Any, adapter: ModelAdapter, tokenizer: Tokenizer | None) -> Metric | None:
    if spec is None:
        return None
    if hasattr(spec, "kind") and hasattr(spec, "params"):
        kind, value = spec.kind, spec.params
    elif isinstance(spec, dict) and len(spec) == 1:
        ((kind, value),) = spec.items()
    else:
        raise ValidationRunError(f"patching.metric: expected {{logit_diff: [a, b]}} or {{logit: a}}, got {spec!r}")
    if kind == "logit_diff":
        a, b = value
        return Metric.logit_diff(_token(a, adapter, tokenizer, "patching.metric.logit_diff[0]"),
                                 _token(b, adapter, tokenizer, "patching.metric.logit_diff[1]"))
    if kind == "logit":
        return Metric.logit(_token(value, adapter, tokenizer, "patching.metric.logit"))
    raise ValidationRunError(f"patching.metric: unknown metric {kind!r}; expected logit_diff or logit")


@dataclass
class CheckCall:
    """What every check's runner gets besides its parameters: the graph, the model adapter, the
    tokenizer, the prompt resolution (``prompt(value, where)``, ``prompts(values, where)``) and
    the run's seed."""

    #: None in the dry run's probes, which read no graph (:meth:`built_graph` says so)
    graph: AttributionGraph | None
    adapter: ModelAdapter
    tokenizer: Tokenizer | None
    prompt_resolver: PromptResolver | None = None
    #: the run's seed (the spec's ``seed``): what a check whose own ``seed`` is not set uses
    seed: int = 0
    #: the run's spec, when the check runs from one: what executor workers load (``sign_regimes.executor``)
    spec: Spec | None = None

    def built_graph(self) -> AttributionGraph:
        """The graph the check runs on (the dry run's probes, :mod:`~circuitgraph.pipeline.check_estimate`,
        have none and read none)."""
        if self.graph is None:
            raise ValidationRunError("this check runs on the built graph, and the dry run's probe has none")
        return self.graph

    def prompt(self, value: Any, where: str) -> list[int]:
        if self.prompt_resolver is not None:
            return list(self.prompt_resolver(value))
        return resolve_prompt(value, self.tokenizer, where=where)

    def prompts(self, values: Sequence[Any] | None, where: str) -> list[list[int]]:
        return [self.prompt(v, f"{where}[{i}]") for i, v in enumerate(values or ())]


# --- one runner per check kind, each registered under the spec item's key (``@_runs(kind)``) ---
#: check kind -> the function that runs it (the kinds are the spec's registry, ``CHECK_TYPES``)
CHECK_FUNCTIONS: dict[str, Callable[[CheckCall, Any], Any]] = {}
#: a check runner, kept with its own parameter and result types by :func:`_runs`
_Runner = TypeVar("_Runner", bound=Callable[[CheckCall, Any], Any])


def _runs(kind: str) -> Callable[[_Runner], _Runner]:
    def register(fn: _Runner) -> _Runner:
        if kind in CHECK_FUNCTIONS:
            raise ValueError(f"check kind {kind!r} has two runners")
        CHECK_FUNCTIONS[kind] = fn
        return fn
    return register


@_runs('ablate')
def run_ablate(c: CheckCall, p: Ablate) -> AblationResult:
    seed = p.seed if p.seed is not None else c.seed
    return ablate(
        c.built_graph(), p.nodes, k=p.k, mode=p.mode, value=p.value, scale=p.scale,
        reference_prompts=c.prompts(p.reference_prompts, "ablate.reference_prompts"),
        patch_prompt=None if p.patch_prompt is None else c.prompt(p.patch_prompt, "ablate.patch_prompt"),
        positions=p.positions, controls=tuple(p.controls), n_controls=p.n_controls, tolerance=p.tolerance,
        control_tolerance=p.control_tolerance, max_draws=p.max_draws, match_layers=p.match_layers,
        match_positions=p.match_positions, seed=seed, tokenizer=c.tokenizer,
        eval_prompts=[{"tokens": t} for t in c.prompts(p.eval_prompts, "ablate.eval_prompts")
                      + ([] if p.eval_dataset is None else
                         _file_rows(c, p.eval_dataset, p.max_rows, "ablate.eval_dataset"))])


@_runs('predicted_vs_actual')
def run_predicted_vs_actual(c: CheckCall, p: PredictedVsActual) -> PredictedVsActualResult:
    return predicted_vs_actual(
        c.built_graph(), k=p.k, mode=p.mode,
        reference_prompts=c.prompts(p.reference_prompts, "predicted_vs_actual.reference_prompts"),
        tokenizer=c.tokenizer)


def patch_sets(c: CheckCall, sets: Any) -> tuple[list[list[Unit]], list[str]]:
    """The units of the spec's patching ``sets`` (checked against the model) and their names."""
    f = c.adapter.facts
    out, names = [], []
    for i, s in enumerate(sets):
        where = f"patching.sets[{i}]"
        units = []
        indexed: tuple[tuple[Site, Any, int, str], ...] = (("neuron", s.neurons, f.d_mlp, "neurons"),
                                                           ("head", s.heads, f.n_heads, "heads"))
        for site, pairs, size, what in indexed:
            for layer, index in pairs:
                if layer >= f.n_layers or index >= size:
                    raise ValidationRunError(f"{where}.{what}: [{layer}, {index}] is out of range: the model has "
                                             f"{f.n_layers} layers of {size} {what}")
                units.append(Unit(site, layer, None, index))
        whole: tuple[tuple[Site, Any, str], ...] = (("mlp", s.mlps, "mlps"), ("attn", s.attns, "attns"))
        for site, layers, what in whole:
            for layer in layers:
                if layer >= f.n_layers:
                    raise ValidationRunError(f"{where}.{what}: layer {layer} is out of range: the model has "
                                             f"{f.n_layers} layers")
                units.append(Unit(site, layer, None))
        out.append(units)
        names.append(s.name if s.name is not None else " + ".join(str(u) for u in units))
    return out, names


@_runs('patching')
def run_patching(c: CheckCall, p: Patching) -> PatchingResult:
    sets, names = patch_sets(c, p.sets)
    return patching(
        c.built_graph(), corrupted=c.prompt(p.corrupted, "patching.corrupted"),
        clean=None if p.clean is None else c.prompt(p.clean, "patching.clean"),
        metric=check_metric(p.metric, c.adapter, c.tokenizer), granularity=tuple(p.granularity),
        heatmap=p.heatmap, tokenizer=c.tokenizer, layers=p.layers, sets=sets, set_names=names)


@_runs('faithfulness')
def run_faithfulness(c: CheckCall, p: Faithfulness) -> FaithfulnessResult:
    return faithfulness(
        c.built_graph(), mode=p.mode, reference_prompts=c.prompts(p.reference_prompts,
                      "faithfulness.reference_prompts"),
        tokenizer=c.tokenizer)


def _file_rows(c: CheckCall, path: Any, max_rows: int | None, where: str) -> list[list[int]]:
    """Token ids of the rows of a .jsonl/.csv dataset file (every problem at once)."""
    raw, problems = read_dataset_rows(Path(path))
    rows, more = parse_rows(raw[:max_rows] if max_rows is not None else raw)
    problems += more
    if problems:
        raise ValidationRunError(f"{where} {path}: " + "; ".join(f"{w}: {m}" if w else m for w, m in problems[:5]))
    return [c.prompt(r.prompt, f"{where} row {r.number} (id {r.id})") for r in rows]


def _budgeted(rows: list[list[int]], max_row_tokens: int | None, budget: int | None) -> list[list[int]]:
    """Rows cut to ``max_row_tokens``, then read in order until ``budget`` tokens (the last one cut;
    a piece shorter than two tokens predicts nothing and is dropped)."""
    out, used = [], 0
    for toks in rows:
        toks = toks[:max_row_tokens] if max_row_tokens is not None else toks
        if budget is not None:
            toks = toks[:budget - used]
        if len(toks) >= 2:
            out.append(toks)
            used += len(toks)
        if budget is not None and used >= budget:
            break
    return out


def sign_regimes_rows(c: CheckCall, p: SignRegimes) -> tuple[list[list[int]], list[list[int]]]:
    """The token ids of a ``sign_regimes`` block's selection and evaluation rows, besides the
    graph's prompt (``prompts``/``eval_prompts``, the dataset files split, budgets applied)."""
    selection = c.prompts(p.prompts, "sign_regimes.prompts")
    evaluation = c.prompts(p.eval_prompts, "sign_regimes.eval_prompts")
    if p.dataset is not None:
        rows = _file_rows(c, p.dataset, p.max_rows, "sign_regimes.dataset")
        if p.eval_dataset is None:
            cut = max(1, min(len(rows) - 1, round(p.selection_share * len(rows))))
            if len(rows) < 2:
                raise ValidationRunError(f"sign_regimes.dataset {p.dataset}: {len(rows)} row(s); selecting on some "
                                         "rows and evaluating on others needs at least 2 (or give eval_dataset)")
            selection += rows[:cut]
            evaluation += rows[cut:]
        else:
            selection += rows
    if p.eval_dataset is not None:
        evaluation += _file_rows(c, p.eval_dataset, p.max_rows, "sign_regimes.eval_dataset")
    if p.max_row_tokens is not None or p.token_budget is not None:
        selection = _budgeted(selection, p.max_row_tokens, p.token_budget)
        evaluation = _budgeted(evaluation, p.max_row_tokens, p.token_budget)
    return selection, evaluation


_EXECUTOR_ROWS: Callable[[Any, Any, int], Any] | None = None


def register_executor_rows(factory: Callable[[Any, Any, int], Any]) -> None:
    """Called by ``circuitgraph.datasets.echo_runs`` on import: how ``sign_regimes.executor`` makes
    its row runner (spec, executor block, d_mlp) -> rows, without the checks importing the executors."""
    global _EXECUTOR_ROWS
    _EXECUTOR_ROWS = factory


@_runs('sign_regimes')
def run_sign_regimes(c: CheckCall, p: SignRegimes) -> SignRegimeResult:
    selection, evaluation = sign_regimes_rows(c, p)
    runner = None
    if p.executor is not None:
        if c.spec is None:
            raise ValidationRunError("sign_regimes.executor: the workers load the run's model from its spec; run the "
                                     "check from a spec (circuitgraph run, or run_check(..., spec=spec))")
        # registered, not imported: the dataset executors sit above the checks (docs/architecture.md);
        # importing circuitgraph.datasets (the entry points do) registers them
        if _EXECUTOR_ROWS is None:
            raise ValidationRunError("sign_regimes.executor: the dataset executors are not loaded; import "
                                     "circuitgraph.datasets first (circuitgraph run and circuitgraph.run do)")
        runner = _EXECUTOR_ROWS(c.spec, p.executor, c.adapter.facts.d_mlp)
    return sign_regimes(
        c.built_graph(), prompts=[{"tokens": t} for t in selection], eval_prompts=[{"tokens": t} for t in evaluation],
        use_graph_prompt=p.use_graph_prompt, layers=p.layers, top_k=p.top_k, echo_threshold=p.echo_threshold,
        controls=tuple(p.controls), n_controls=p.n_controls, control_tolerance=p.control_tolerance,
        max_draws=p.max_draws, seed=p.seed if p.seed is not None else c.seed, groups=p.groups,
        group_layer=p.group_layer, batch_size=p.batch_size, tokenizer=c.tokenizer, runner=runner)


@_runs('replacement_fidelity')
def run_replacement_fidelity(c: CheckCall, p: ReplacementFidelity) -> ReplacementFidelityResult:
    return replacement_fidelity(
        c.built_graph(), prompts=c.prompts(p.prompts, "replacement_fidelity.prompts"), tokenizer=c.tokenizer)


@_runs('qk')
def run_qk(c: CheckCall, p: QK) -> QKCheckResult:
    head = p.head if isinstance(p.head, int) else list(p.head)
    return qk_check(c.built_graph(), p.layer, head, p.query_position, p.key_position, top_k=p.top_k)


@_runs('faithfulness_curve')
def run_faithfulness_curve(c: CheckCall, p: FaithfulnessCurve) -> FaithfulnessCurveResult:
    return faithfulness_curve(
        c.built_graph(), sizes=p.sizes, ablation=p.ablation, unit=p.unit,
        reference_prompts=c.prompts(p.reference_prompts, "faithfulness_curve.reference_prompts"),
        patch_prompt=None if p.patch_prompt is None else c.prompt(p.patch_prompt, "faithfulness_curve.patch_prompt"),
        plot=None if p.plot is None else str(p.plot), tokenizer=c.tokenizer)


if set(CHECK_FUNCTIONS) != {t.key for t in CHECK_TYPES}:  # pragma: no cover - a kind without a runner, or the reverse
    raise ImportError(f"check runners {sorted(CHECK_FUNCTIONS)} do not match the spec's CHECK_TYPES "
                      f"{sorted(t.key for t in CHECK_TYPES)}")


def run_check(graph: AttributionGraph, check_spec: Any, *, tokenizer: Tokenizer | None = None,
              prompt_resolver: PromptResolver | None = None, seed: int = 0, spec: Spec | None = None) -> CheckResult:
    """Run one item of the spec's ``validate:`` list on ``graph``.

    ``check_spec``: a parsed spec check (``AblateCheck``...), ``{kind: params}`` or
    ``(kind, params)``.  ``tokenizer`` (default: the model's) turns text prompts and token
    strings into ids; ``prompt_resolver`` (one spec prompt -> token ids) replaces that for
    prompts.  ``seed``: the run's seed (the spec's ``seed``), for checks whose own ``seed`` is
    not set; ``spec``: the run's spec (what executor workers load, ``sign_regimes.executor``).  Raises :class:`~circuitgraph.errors.ValidationRunError` on bad input.
    """
    kind, raw = _split(check_spec)
    if kind not in CHECK_KINDS:
        raise ValidationRunError(f"unknown validation check {kind!r}; expected one of {', '.join(CHECK_KINDS)}")
    p: Any = _params(kind, raw)
    ctx = graph_context(graph, kind)
    adapter = ctx.adapter
    call = CheckCall(graph, adapter, tokenizer if tokenizer is not None else adapter.tokenizer, prompt_resolver, seed,
                     spec)
    record = p.model_dump(mode="json")
    return CheckResult(kind, record, CHECK_FUNCTIONS[kind](call, p))


def run_checks(graph: AttributionGraph, checks: Sequence[Any], *, tokenizer: Tokenizer | None = None,
               prompt_resolver: Callable[[Any], list[int]] | None = None) -> list[CheckResult]:
    """:func:`run_check` for each item, in order (the JSON's ``validation`` list is
    ``[r.to_dict() for r in results]``)."""
    return [run_check(graph, c, tokenizer=tokenizer, prompt_resolver=prompt_resolver) for c in checks]
