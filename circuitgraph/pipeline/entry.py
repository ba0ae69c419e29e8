"""The entry points above the pipeline: :func:`run` and :func:`dry_run` (``circuitgraph.run``,
``circuitgraph.dry_run`` and the ``circuitgraph run`` command).

A spec with ``dataset:`` runs every row through the dataset executor
(:func:`circuitgraph.datasets.run_dataset`), which calls the single-prompt pipeline
(:func:`circuitgraph.pipeline.runner.run`) once per row; any other spec goes to the
single-prompt pipeline directly.  The imports go one way: this module -> datasets ->
runner, never back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from circuitgraph._results import RunOutcome
from circuitgraph.adapters.files import check_input_files
from circuitgraph.datasets import run_dataset
from circuitgraph.datasets.rows import load_rows
from circuitgraph.errors import SpecError
from circuitgraph.features.driver import run_features
from circuitgraph.pipeline import runner
from circuitgraph.pipeline.estimate import estimate_run
from circuitgraph.pipeline.memory_watch import MemoryWatch, memory_budget, run_limit
from circuitgraph.spec import SpecSource, load_spec
from circuitgraph.spec.prompts import TokensPrompt

if TYPE_CHECKING:
    from circuitgraph.pipeline.inputs import LoadedInputs
    from circuitgraph.spec.prompts import Prompt
    from circuitgraph.spec.root import Spec

__all__ = ["run", "dry_run"]


def run(spec: SpecSource, *, progress: bool = False, force: bool = False, inputs: LoadedInputs | None = None,
        memory_limit: int | None = None) -> RunOutcome:
    """Run a spec (a path, a dict or a :class:`~circuitgraph.spec.Spec`) end to end.

    The result is a :class:`~circuitgraph._results.RunOutcome` (``spec``, ``timings``,
    ``failures``, ``ok``, ``summary_lines()``) of the class the spec asks for. A spec with ``dataset:`` runs every prompt of the dataset and returns a
    :class:`~circuitgraph.datasets.DatasetRunResult` (see docs/dataset.md), with ``features:``
    also the feature dashboards (its ``features``; a features-only spec returns the
    :class:`~circuitgraph.features.FeaturesRunResult`, see docs/features.md); otherwise the
    result is the single-prompt pipeline's :class:`~circuitgraph.pipeline.runner.RunResult`
    (see :func:`circuitgraph.pipeline.runner.run` for ``force``, ``inputs`` and ``memory_limit``,
    the memory budget in bytes; a dataset's prompts read the budget from ``CIRCUITGRAPH_MEMORY_LIMIT``).
    """
    spec = load_spec(spec)
    if spec.is_dataset:
        result = run_dataset(spec, progress=progress) if spec.runs_graphs else None
        features = run_features(spec, progress=progress) if spec.features is not None else None
        if result is None:
            if features is None:  # pragma: no cover - the spec's validation asks for one of them
                raise SpecError("a dataset spec runs graphs (targets) or feature dashboards (features:)")
            return features
        result.features = features
        return result
    return runner.run(spec, progress=progress, force=force, inputs=inputs, memory_limit=memory_limit)


def dry_run(spec: SpecSource, *, memory_limit: int | None = None) -> list[str]:
    """Validate a spec and estimate the peak memory of its run without building the graph: the
    lines ``circuitgraph run --dry-run`` prints, ending with ``fits: yes`` or ``fits: NO - <advice>``
    (see :mod:`circuitgraph.pipeline.estimate`).  ``memory_limit``: the budget in bytes (else
    ``CIRCUITGRAPH_MEMORY_LIMIT`` in GB), which lowers the memory the run may use."""
    spec = load_spec(spec)
    check_input_files(spec)  # a broken bundle is reported here, in one line, not by the estimator
    budget = memory_budget(memory_limit)
    # the dry run loads the model and makes the node tables: it too stops before the system's killer
    with MemoryWatch(run_limit(budget), budget_given=budget is not None).watching():
        return _dry_run(spec, memory_limit)


def _dry_run(spec: Spec, memory_limit: int | None) -> list[str]:
    if spec.is_dataset:
        rows = load_rows(spec)
        longest = max(rows, key=lambda r: _prompt_length(r.prompt))
        one = spec.model_copy(update={"prompt": longest.prompt, "dataset": None})
        return [f"dataset: {len(rows)} rows; the estimate is for the longest (row {longest.number}, id "
                f"{longest.id}): each worker holds one graph at a time"] + estimate_run(
                    one, memory_limit=memory_limit).lines()
    return estimate_run(spec, memory_limit=memory_limit).lines()


def _prompt_length(prompt: Prompt) -> int:
    """A row's prompt length for picking the longest: its token ids, else its words."""
    return len(prompt.tokens) if isinstance(prompt, TokensPrompt) else len(prompt.text.split())
