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

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from circuitgraph.errors import ValidationRunError
from circuitgraph.validation._common import PromptResolver, graph_context, jsonable, resolve_prompt
from circuitgraph.validation.metrics import Metric

__all__ = ["CHECK_KINDS", "CheckResult", "run_check", "run_checks"]

CHECK_KINDS: tuple[str, ...] = ("ablate", "predicted_vs_actual", "patching", "faithfulness", "sign_regimes",
                                "replacement_fidelity", "qk")


@dataclass
class CheckResult:
    """One validation check: its kind, its parameters (JSON) and its typed result."""

    kind: str
    params: dict[str, Any]
    result: Any

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": jsonable(self.params), "result": jsonable(self.result.to_dict())}

    def table(self, max_rows: int = 10) -> str:
        return f"### {self.kind}\n\n{self.result.table(max_rows)}"


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


def _fields(params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parameter values as Python objects, and their JSON record."""
    if params is None:
        return {}, {}
    if hasattr(params, "model_dump"):
        values = {name: getattr(params, name) for name in type(params).model_fields}
        return values, params.model_dump(mode="json")
    if isinstance(params, dict):
        return dict(params), jsonable(params)
    raise ValidationRunError(f"check parameters must be a mapping, got {type(params).__name__}: {params!r}")


def _token(token: Any, adapter: Any, tokenizer: Any, where: str) -> int:
    from circuitgraph.attribution.targets import resolve_token

    try:
        return resolve_token(token, tokenizer, adapter.facts.d_vocab, where)
    except Exception as exc:  # noqa: BLE001 - TokenError already says what to do
        raise ValidationRunError(str(exc)) from None


def _metric(spec: Any, adapter: Any, tokenizer: Any) -> Metric | None:
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


def run_check(graph: Any, check_spec: Any, *, tokenizer: Any = None,
              prompt_resolver: PromptResolver | None = None) -> CheckResult:
    """Run one item of the spec's ``validate:`` list on ``graph``.

    ``check_spec``: a parsed spec check (``AblateCheck``...), ``{kind: params}`` or
    ``(kind, params)``.  ``tokenizer`` (default: the model's) turns text prompts and token
    strings into ids; ``prompt_resolver`` (one spec prompt -> token ids) replaces that for
    prompts.  Raises :class:`~circuitgraph.errors.ValidationRunError` on bad input.
    """
    from circuitgraph.validation.ablation import ablate, predicted_vs_actual
    from circuitgraph.validation.activation_patching import patching
    from circuitgraph.validation.circuit_faithfulness import faithfulness
    from circuitgraph.validation.fidelity import replacement_fidelity
    from circuitgraph.validation.gated_signs import sign_regimes

    kind, raw = _split(check_spec)
    if kind not in CHECK_KINDS:
        raise ValidationRunError(f"unknown validation check {kind!r}; expected one of {', '.join(CHECK_KINDS)}")
    ctx = graph_context(graph, kind)
    adapter = ctx.adapter
    tokenizer = tokenizer if tokenizer is not None else adapter.tokenizer
    p, record = _fields(raw)

    def prompt(value: Any, where: str) -> list[int]:
        if prompt_resolver is not None:
            return list(prompt_resolver(value))
        return resolve_prompt(value, tokenizer, where=where)

    def prompts(values: Sequence[Any] | None, where: str) -> list[list[int]]:
        return [prompt(v, f"{where}[{i}]") for i, v in enumerate(values or ())]

    def get(name: str, default: Any) -> Any:
        value = p.get(name, default)
        return default if value is None else value

    if kind == "ablate":
        result = ablate(
            graph, get("nodes", "top_nodes"), k=get("k", 10), mode=get("mode", "zero"), value=p.get("value"),
            scale=p.get("scale"), reference_prompts=prompts(p.get("reference_prompts"), "ablate.reference_prompts"),
            patch_prompt=None if p.get("patch_prompt") is None else prompt(p["patch_prompt"], "ablate.patch_prompt"),
            positions=p.get("positions"), controls=tuple(get("controls", ("matched_magnitude", "count_matched"))),
            n_controls=get("n_controls", 10), tolerance=get("tolerance", 0.1),
            control_tolerance=get("control_tolerance", 0.05), max_draws=get("max_draws", 1000),
            match_layers=get("match_layers", False), match_positions=get("match_positions", False),
            seed=get("seed", graph.metadata.get("spec", {}).get("seed", 0)),
            tokenizer=tokenizer)
    elif kind == "predicted_vs_actual":
        result = predicted_vs_actual(
            graph, k=get("k", 10), mode=get("mode", "zero"),
            reference_prompts=prompts(p.get("reference_prompts"), "predicted_vs_actual.reference_prompts"),
            tokenizer=tokenizer)
    elif kind == "patching":
        if p.get("corrupted") is None:
            raise ValidationRunError("patching needs corrupted: a prompt of the same token length as clean")
        result = patching(
            graph, corrupted=prompt(p["corrupted"], "patching.corrupted"),
            clean=None if p.get("clean") is None else prompt(p["clean"], "patching.clean"),
            metric=_metric(p.get("metric"), adapter, tokenizer),
            granularity=tuple(get("granularity", ("layer", "head"))),
            heatmap=p.get("heatmap"), tokenizer=tokenizer)
    elif kind == "faithfulness":
        result = faithfulness(
            graph, mode=get("mode", "mean"),
            reference_prompts=prompts(p.get("reference_prompts"), "faithfulness.reference_prompts"),
            tokenizer=tokenizer)
    elif kind == "sign_regimes":
        result = sign_regimes(
            graph, prompts=prompts(p.get("prompts"), "sign_regimes.prompts"), layers=p.get("layers"),
            top_k=get("top_k", 20), echo_threshold=get("echo_threshold", 0.5), tokenizer=tokenizer)
    elif kind == "qk":
        from circuitgraph.validation.qk_check import qk_check

        head = p.get("head")
        result = qk_check(graph, p.get("layer"), head if isinstance(head, int) else list(head or ()),
                          get("query_position", -1), get("key_position", "top"), top_k=get("top_k", 10))
    else:
        result = replacement_fidelity(
            graph, prompts=prompts(p.get("prompts"), "replacement_fidelity.prompts"), tokenizer=tokenizer)
    return CheckResult(kind, record, result)


def run_checks(graph: Any, checks: Sequence[Any], *, tokenizer: Any = None,
               prompt_resolver: Callable[[Any], list[int]] | None = None) -> list[CheckResult]:
    """:func:`run_check` for each item, in order (the JSON's ``validation`` list is
    ``[r.to_dict() for r in results]``)."""
    return [run_check(graph, c, tokenizer=tokenizer, prompt_resolver=prompt_resolver) for c in checks]
