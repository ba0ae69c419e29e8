"""Run a dataset spec: check every row, run the prompts, write the manifest and the aggregate.

Layout of the output folder ``DIR`` (``export: {dataset: DIR}``)::

    DIR/run.json              what ran: the spec's fingerprint, its row ids
    DIR/graphs/<id>.npz       each prompt's graph (.json with export.dataset_format: json)
    DIR/results/<id>.json     each prompt's record: status, error, timings, scores, counts,
                              query and validation results (written last: the completeness marker)
    DIR/parts/<id>.npz        each prompt's graph reduced by node identity (for the aggregate)
    DIR/manifest.parquet      one row per prompt
    DIR/nodes.parquet         the aggregate over nodes
    DIR/edges.parquet         the aggregate over edges
    DIR/aggregate.json        what the aggregate is over, and labels for its nodes

Re-running the same spec on the same folder resumes: prompts whose outputs are complete
are skipped, the rest (including failed ones) run again, and the aggregate is rebuilt from
every prompt's part in row order, so it equals an uninterrupted run's byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitgraph._io import atomic_write_bytes, atomic_write_text, read_json_file
from circuitgraph._results import RunOutcome
from circuitgraph.datasets.executors import make_executor
from circuitgraph.datasets.folders import claim_run_folder
from circuitgraph.datasets.prompt import is_complete, record_path
from circuitgraph.datasets.reduce import KIND_CODE, Accumulator, Part, parquet_bytes
from circuitgraph.datasets.rows import model_problems, row_problems
from circuitgraph.datasets.store import open_dataset
from circuitgraph.errors import DatasetError, LoadError
from circuitgraph.pipeline.inputs import load_inputs
from circuitgraph.spec import Spec, SpecSource, load_spec
from circuitgraph.spec.dataset import AggregateSpec

__all__ = ["run_dataset", "DatasetRunResult", "MANIFEST_COLUMNS", "spec_fingerprint"]

#: the manifest's columns, in order
MANIFEST_COLUMNS = (
    "id", "row", "status", "error", "attempts", "n_tokens",
    "time_total", "time_graph", "time_prune", "time_queries", "time_validation", "time_export", "time_reduce",
    "replacement_score", "completeness_score", "max_completeness_violation",
    "n_nodes", "n_edges", "n_nodes_full", "n_edges_full", "n_failed_checks",
)
_STRING_COLUMNS = {"id", "status", "error"}
_INT_COLUMNS = {"row", "attempts", "n_tokens", "n_nodes", "n_edges", "n_nodes_full", "n_edges_full",
                "n_failed_checks"}


@dataclass
class DatasetRunResult(RunOutcome):
    """What a dataset run produced (``circuitgraph.run`` on a spec with ``dataset:``)."""

    spec: Spec
    directory: Path
    n_prompts: int
    n_ok: int
    n_failed: int
    n_skipped: int
    timings: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    #: the feature dashboards computed by the same spec (``features:``), if any
    features: Any = None

    def open(self) -> Any:
        """The outputs as a :class:`~circuitgraph.datasets.Dataset`."""
        return open_dataset(self.directory)

    def summary_lines(self) -> list[str]:
        rate = self.timings.get("prompts_per_minute")
        lines = [
            f"dataset: {self.n_prompts} prompts: {self.n_ok} ok, {self.n_failed} failed"
            + (f" ({self.n_skipped} already complete, skipped)" if self.n_skipped else ""),
            f"wrote {self.directory.resolve()}: manifest.parquet, nodes.parquet, edges.parquet, graphs/, results/",
            "time: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items() if k.startswith("time_"))
            + (f"; {rate:.1f} prompts/minute" if rate else ""),
        ]
        if self.n_failed:
            lines.append(f"{self.n_failed} failed prompts are listed in the manifest (status, error): "
                         f"circuitgraph dataset summary {self.directory}")
        if self.features is not None:
            lines += self.features.summary_lines()
        return lines


def spec_fingerprint(spec: Spec, rows: list[Any]) -> str:
    """What makes two runs' outputs the same: the spec (but not its executor) and the rows."""
    dump = spec.model_dump(mode="json", exclude={"executor", "dataset", "features"})
    dump["export"].pop("dataset", None)
    dump["export"].pop("features", None)  # feature dashboards are written to their own folder
    rows_json = [{"id": r.id, "prompt": r.prompt.model_dump(mode="json"),
                  "targets": None if r.targets is None else [t.model_dump(mode="json") for t in r.targets],
                  "corrupted": None if r.corrupted is None else r.corrupted.model_dump(mode="json")} for r in rows]
    text = json.dumps({"spec": dump, "rows": rows_json}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _prepare_directory(out: Path, fingerprint: str, rows: list[Any]) -> None:
    claim_run_folder(out, "run.json", fingerprint, "circuitgraph-dataset", {"ids": [r.id for r in rows]},
                     key="export.dataset", what="dataset run",
                     different="the outputs of a different spec or dataset (or of another circuitgraph version, "
                               "whose spec defaults differ)")


class _Progress:
    """Prompts done and failed, and the rate, on stderr (tqdm) when enabled."""

    def __init__(self, enabled: bool, total: int, skipped: int):
        self.bar = None
        self.failed = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=skipped, desc="prompts", unit="prompt", file=sys.stderr,
                            dynamic_ncols=True)
            self.bar.set_postfix(failed=0)

    def update(self, record: dict[str, Any]) -> None:
        if record.get("status") != "ok":
            self.failed += 1
        if self.bar is not None:
            self.bar.set_postfix(failed=self.failed, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _manifest_table(records: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    columns = {}
    for name in MANIFEST_COLUMNS:
        values = [r.get(name) for r in records]
        kind = pa.string() if name in _STRING_COLUMNS else pa.int64() if name in _INT_COLUMNS else pa.float64()
        columns[name] = pa.array(values, type=kind)
    return pa.table(columns)


def write_aggregate(spec: Spec, out: Path, records: list[dict[str, Any]], token_str: Any = None,
                    n_layers: int | None = None) -> float:
    """Combine the parts of the ``ok`` records in row order; write nodes/edges/aggregate.json.

    Streams: one part is read at a time.  Returns the seconds it took.
    """
    t0 = time.perf_counter()
    agg_spec = spec.aggregate or AggregateSpec()
    acc = Accumulator(agg_spec.position)
    target_labels: dict[str, str] = {}
    ok = [r for r in sorted(records, key=lambda r: r["row"]) if r.get("status") == "ok"]
    for record in ok:
        acc.add(Part.load(out / record["part"]))
        for index, label in (record.get("target_labels") or {}).items():
            target_labels.setdefault(index, label)
    atomic_write_bytes(out / "nodes.parquet", parquet_bytes(acc.nodes_table()))
    atomic_write_bytes(out / "edges.parquet", parquet_bytes(acc.edges_table()))
    tokens = sorted({int(k[2]) for k in acc.node_keys if k[0] in _TOKEN_KIND_CODES()})
    info = {
        "format": "circuitgraph-dataset-aggregate",
        "format_version": 1,
        "graph": agg_spec.graph,
        "position": agg_spec.position,
        "n_prompts": len(records),
        "n_aggregated": len(ok),
        "aggregated_ids": [r["id"] for r in ok],
        "n_layers": n_layers,
        "token_strs": {str(t): token_str(t) for t in tokens} if token_str is not None else {},
        "target_labels": dict(sorted(target_labels.items(), key=lambda kv: int(kv[0]))),
    }
    atomic_write_text(out / "aggregate.json", json.dumps(info, indent=1) + "\n")
    return time.perf_counter() - t0


def _TOKEN_KIND_CODES() -> set[int]:
    return {KIND_CODE["embedding"], KIND_CODE["logit"]}


def _row_order(problem: tuple[str, str]) -> tuple[int, int]:
    """Sort key: problems of row N (``row N...`` in the location or the message) by N, others first."""
    loc, msg = problem
    m = re.match(r"(?:dataset: )?row (\d+)", loc) or re.match(r"row (\d+)", msg)
    return (1, int(m.group(1))) if m else (0, 0)


def run_dataset(spec: SpecSource, *, progress: bool = False) -> DatasetRunResult:
    """Run every prompt of a dataset spec (see the module docstring and docs/dataset.md)."""
    t_start = time.perf_counter()
    spec = load_spec(spec)
    rows, problems = row_problems(spec)
    adapter, transcoders = load_inputs(spec)
    problems += model_problems(rows, spec, adapter, transcoders)
    if problems:  # every problem of every row, before anything is written
        raise DatasetError(sorted(problems, key=_row_order))
    tok = adapter.tokenizer
    n_layers = adapter.facts.n_layers
    token_str = (lambda t: tok.token_str(t)) if tok is not None else (lambda t: f"<{t}>")
    del adapter, transcoders
    out = Path(spec.export.dataset)
    _prepare_directory(out, spec_fingerprint(spec, rows), rows)
    timings: dict[str, float] = {"time_check": time.perf_counter() - t_start}

    complete = {r.id for r in rows if is_complete(out, r.id) is not None}
    pending = [r for r in rows if r.id not in complete]
    bar = _Progress(progress, len(rows), len(complete))
    t0 = time.perf_counter()
    try:
        make_executor(spec).run(spec, pending, out, bar.update)
    finally:
        bar.close()
    timings["time_prompts"] = time.perf_counter() - t0
    if pending:
        timings["prompts_per_minute"] = 60.0 * len(pending) / max(timings["time_prompts"], 1e-9)

    records = []
    for row in rows:
        try:
            record = read_json_file(record_path(out, row.id), "prompt record")
        except LoadError:
            record = {"id": row.id, "row": row.number, "status": "failed", "error": "no result was recorded"}
        records.append(record)
    atomic_write_bytes(out / "manifest.parquet", _parquet(_manifest_table(records)))
    timings["time_aggregate"] = write_aggregate(spec, out, records, token_str, n_layers)
    timings["time_total"] = time.perf_counter() - t_start
    n_ok = sum(r["status"] == "ok" for r in records)
    failures = [f"row {r['row']} (id {r['id']}): {r.get('error')}" for r in records if r["status"] != "ok"]
    return DatasetRunResult(spec, out, len(rows), n_ok, len(rows) - n_ok, len(complete), timings, failures)


def _parquet(table: Any) -> bytes:
    return parquet_bytes(table)
