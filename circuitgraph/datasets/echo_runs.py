"""``sign_regimes``' rows on the dataset executors (``sign_regimes: {executor: {...}}``).

The check's two passes over rows (:mod:`circuitgraph.validation.gated_signs`) are handed to
the executors of dataset runs (:mod:`circuitgraph.datasets.executors`: local worker
processes or Ray) in shards of consecutive rows; each worker loads the spec's model once per
pass.

* **statistics** (selection rows, then evaluation rows): a worker folds its shard's rows into
  per-neuron :class:`~circuitgraph.validation.echo_stats.LayerStats` (one row a forward pass,
  keeping each row's echo mass apart), and the driver merges the shards *in row order* as they
  become contiguous (:meth:`LayerStats.merge`);
* **removal** (evaluation rows): a worker returns each row's summed next-token losses, one per
  run (nothing removed, then each neuron set), and the driver adds them in row order.

Both are exactly what one process computes row by row (see
:mod:`circuitgraph.validation.echo_stats`): the result does not depend on how many workers ran
or how the rows were split, as long as each runs the model with the same number of torch
threads (``executor.threads``; this process's own number may differ, and then the in-process
result can differ by float round-off).  The driver holds the merged statistics and the shards
that arrived ahead of a slower earlier one, never every row's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.datasets.executors import executor_from
from circuitgraph.datasets.prompt import PromptOutput, one_line
from circuitgraph.errors import ValidationRunError
from circuitgraph.pipeline.inputs import load_inputs
from circuitgraph.spec import Spec
from circuitgraph.validation.dispatch import register_executor_rows
from circuitgraph.validation.echo_stats import LayerStats, stream_stats
from circuitgraph.validation.gated_signs import echo_masks, row_nll_totals
from circuitgraph.validation.interventions import Unit

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["EchoShard", "EchoJob", "ExecutorRows", "DEFAULT_SHARD_ROWS"]

#: rows per task handed to a worker
DEFAULT_SHARD_ROWS = 4


@dataclass(frozen=True)
class EchoShard:
    """Consecutive rows of one pass (``number``: the first one's index in the pass)."""

    number: int
    rows: tuple[tuple[int, ...], ...]

    @property
    def id(self) -> str:
        return f"{self.number:08d}-{self.number + len(self.rows) - 1:08d}"


class EchoJob:
    """The executors' job of a ``sign_regimes`` pass: ``phase`` ``stats`` (per-neuron statistics)
    or ``nll`` (each row's losses with the echo of each neuron set removed)."""

    def __init__(self, phase: str, layers: Sequence[int] = (), top_k: int = 1, first_position: int = 1,
                 neuron_sets: Sequence[Sequence[tuple[int, int]]] = (), batch_size: int = 8):
        if phase not in ("stats", "nll"):
            raise ValueError(f"EchoJob phase must be 'stats' or 'nll', got {phase!r}")
        self.phase = phase
        self.layers = tuple(layers)
        self.top_k = top_k
        self.first_position = first_position
        self.neuron_sets = tuple(tuple(s) for s in neuron_sets)
        self.batch_size = batch_size

    def load(self, spec: Spec) -> Any:
        # the model only: a Ray worker keeps what load returns for every job of the same class and
        # spec, whatever the job's own settings (the phase, the neuron sets)
        return load_inputs(spec)[0]

    @torch.no_grad()
    def run(self, spec: Spec, task: EchoShard, adapter: ModelAdapter) -> PromptOutput:
        record: dict[str, Any] = {"id": task.id, "row": task.number, "status": "ok", "error": None}
        try:
            if self.phase == "stats":
                record["stats"] = stream_stats(adapter, task.rows, self.layers, self.top_k, self.first_position,
                                               keep_rows=True)
            else:
                sets = [[Unit("neuron", l, None, i) for l, i in s] for s in self.neuron_sets]
                masks = echo_masks(sets, adapter.facts.d_mlp)
                record["nll"] = [row_nll_totals(adapter, toks, masks, len(self.neuron_sets) + 1, self.first_position,
                                                self.batch_size) for toks in task.rows]
        except Exception as exc:  # noqa: BLE001 - recorded; the driver stops the check with it
            record.update({"status": "failed", "error": one_line(exc)})
        return PromptOutput(record)

    def commit(self, out_dir: Path, output: PromptOutput, attempts: int = 1) -> dict[str, Any]:
        return dict(output.record, attempts=attempts)  # nothing is written: the driver merges the record

    def failed(self, task: EchoShard, error: str) -> PromptOutput:
        return PromptOutput({"id": task.id, "row": task.number, "status": "failed", "error": error})


class ExecutorRows:
    """``sign_regimes``' ``runner`` on a dataset executor (see the module docstring): ``spec``
    names the model each worker loads (``d_mlp`` neurons a layer), ``executor`` is a
    ``LocalExecutor`` or ``RayExecutor`` (:func:`circuitgraph.datasets.executors.make_executor`)."""

    def __init__(self, spec: Spec, executor: Any, d_mlp: int, shard_rows: int = DEFAULT_SHARD_ROWS):
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be at least 1, got {shard_rows}")
        self.spec = spec
        self.executor = executor
        self.d_mlp = d_mlp
        self.shard_rows = shard_rows

    def _run(self, job: EchoJob, rows: Sequence[Sequence[int]], fold: Callable[[dict[str, Any]], None]) -> None:
        """Run ``job`` on ``rows`` in shards and ``fold`` each shard's record in row order, as
        soon as every earlier shard has been folded (the executor finishes them in any order)."""
        shards = [EchoShard(i, tuple(tuple(int(t) for t in r) for r in rows[i:i + self.shard_rows]))
                  for i in range(0, len(rows), self.shard_rows)]
        ahead: dict[int, dict[str, Any]] = {}
        failures: list[str] = []
        expected = [s.number for s in shards]
        done = 0

        def on_result(record: dict[str, Any]) -> None:
            nonlocal done
            if record.get("status") != "ok":
                failures.append(f"rows {record['id']}: {record.get('error')}")
                return
            ahead[int(record["row"])] = record
            while done < len(expected) and expected[done] in ahead:
                fold(ahead.pop(expected[done]))
                done += 1

        with tempfile.TemporaryDirectory(prefix="circuitgraph-echo-") as tmp:
            self.executor.run(self.spec, shards, Path(tmp), on_result, job=job)
        if failures:
            raise ValidationRunError(f"sign_regimes: {len(failures)} of {len(shards)} shards of rows failed on the "
                                     f"executor: {'; '.join(failures[:3])}")
        if done != len(expected):
            raise ValidationRunError(f"sign_regimes: the executor returned {done} of {len(shards)} shards")

    def stats(self, rows: Sequence[Sequence[int]], layers: Sequence[int], top_k: int,
              first_position: int) -> dict[int, LayerStats]:
        layers = sorted(layers)
        merged = {l: LayerStats.empty(top_k, self.d_mlp) for l in layers}

        def fold(record: dict[str, Any]) -> None:
            for l in layers:
                merged[l].merge(record["stats"][l])

        self._run(EchoJob("stats", layers, top_k, first_position), rows, fold)
        return merged

    def nll_totals(self, rows: Sequence[Sequence[int]], neuron_sets: Sequence[Sequence[Unit]], first_position: int,
                   batch_size: int) -> Iterator[torch.Tensor]:
        sets = [[(u.layer, u.index) for u in s] for s in neuron_sets]
        totals: list[torch.Tensor] = []
        self._run(EchoJob("nll", first_position=first_position, neuron_sets=sets, batch_size=batch_size), rows,
                  lambda record: totals.extend(record["nll"]))
        return iter(totals)


def _executor_rows(spec: Spec, executor: Any, d_mlp: int) -> ExecutorRows:
    return ExecutorRows(spec, executor_from(executor), d_mlp)


register_executor_rows(_executor_rows)
