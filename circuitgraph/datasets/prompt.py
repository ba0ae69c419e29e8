"""One prompt of a dataset: its spec, its run through the pipeline, its files.

Workers (local processes or Ray tasks) call :func:`run_prompt` with the model and
dictionaries they loaded once; it never raises for a failing prompt: the failure is the
record's ``status: failed`` and one-line ``error``.  :func:`commit` writes a prompt's files
atomically, the result record last: a prompt is complete exactly when its record says
``ok`` and the files it names exist, so a killed run never leaves a file a resume trusts.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitgraph._io import atomic_write_bytes, atomic_write_text, read_json_file
from circuitgraph._json import jsonable
from circuitgraph.datasets.reduce import reduce_graph
from circuitgraph.errors import (
    LoadError,
    one_line,  # re-exported: the one error-line formatter
)
from circuitgraph.pipeline import runner
from circuitgraph.spec import Spec
from circuitgraph.spec.dataset import AggregateSpec, Row
from circuitgraph.spec.export import ExportSpec

if TYPE_CHECKING:
    from circuitgraph.pipeline.inputs import LoadedInputs

__all__ = ["PromptOutput", "row_spec", "run_prompt", "commit", "record_path", "is_complete", "one_line",
           "GRAPH_SUFFIX"]

#: file suffix of a prompt's graph for each ``export.dataset_format``
GRAPH_SUFFIX = {"binary": ".npz", "json": ".json"}
#: the stages whose seconds the manifest reports
STAGES = ("graph", "prune", "queries", "validation", "export")


@dataclass
class PromptOutput:
    """A prompt's result record and its files (``{path relative to DIR: bytes}``)."""

    record: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)


def record_path(out_dir: Path, row_id: str) -> Path:
    return out_dir / "results" / f"{row_id}.json"


def row_spec(spec: Spec, row: Row, graph_path: Path) -> Spec:
    """The one-prompt spec of a row: the dataset spec with the row's prompt, targets and
    corrupted prompt, exporting only the graph to ``graph_path``."""
    checks = []
    for check in spec.validate:
        if check.kind == "patching":
            p = check.params
            corrupted = row.corrupted if row.corrupted is not None else p.corrupted
            check = check.model_copy(update={"patching": p.model_copy(update={"corrupted": corrupted})})
        checks.append(check)
    fmt = spec.export.dataset_format
    export = ExportSpec(**{"json" if fmt == "json" else "graph": graph_path,
                           "max_json_edges": spec.export.max_json_edges})
    return spec.model_copy(update={
        "prompt": row.prompt,
        "targets": row.targets if row.targets is not None else spec.targets,
        "dataset": None,
        "aggregate": None,
        "executor": None,
        "export": export,
        "validate": tuple(checks),
    })


def run_prompt(spec: Spec, row: Row, inputs: LoadedInputs) -> PromptOutput:
    """Run one row through the pipeline (graph, pruning, queries, checks), reduce its graph
    for the aggregate, and return its record and files; failures are recorded, not raised."""
    aggregate = spec.aggregate or AggregateSpec()
    fmt = spec.export.dataset_format
    graph_rel = f"graphs/{row.id}{GRAPH_SUFFIX[fmt]}"
    part_rel = f"parts/{row.id}.npz"
    t0 = time.perf_counter()
    record: dict[str, Any] = {"id": row.id, "row": row.number, "status": "ok", "error": None}
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="circuitgraph-prompt-") as tmp:
        try:
            graph_path = Path(tmp) / f"graph{GRAPH_SUFFIX[fmt]}"
            result = runner.run(row_spec(spec, row, graph_path), inputs=inputs)
            t_reduce = time.perf_counter()
            graph = result.full_graph if aggregate.graph == "full" else result.graph
            part = reduce_graph(graph, aggregate.position)
            record["time_reduce"] = time.perf_counter() - t_reduce
            files[graph_rel] = graph_path.read_bytes()
            files[part_rel] = part.to_bytes()
            meta = result.full_graph.metadata
            record.update({
                "n_tokens": len(meta.prompt_tokens or []),
                "replacement_score": meta.replacement_score,
                "completeness_score": meta.completeness_score,
                "max_completeness_violation": (meta.completeness or {}).get("max_relative_violation"),
                "n_nodes": result.graph.n_nodes,
                "n_edges": result.graph.n_edges,
                "n_nodes_full": result.full_graph.n_nodes,
                "n_edges_full": result.full_graph.n_edges,
                "graph": graph_rel,
                "part": part_rel,
                "target_labels": {str(t.index): result.full_graph.node(t).label for t in result.full_graph.target_ids
                                  if t.kind == "target"},
                "queries": result.queries_json(),
                "validation": result.validation_json(),
                "n_failed_checks": len(result.failures),
                "warnings": list(result.warnings),
            })
            for stage in STAGES:
                record[f"time_{stage}"] = result.timings.get(stage, 0.0)
        except Exception as exc:  # noqa: BLE001 - any failure of one prompt is recorded, the run goes on
            files.clear()
            record.update({"status": "failed", "error": one_line(exc)})
    record["time_total"] = time.perf_counter() - t0
    return PromptOutput(record, files)


def commit(out_dir: Path, output: PromptOutput, attempts: int = 1) -> dict[str, Any]:
    """Write a prompt's files atomically, then its record (the completeness marker)."""
    for rel, data in output.files.items():
        atomic_write_bytes(out_dir / rel, data)
    record = dict(output.record, attempts=attempts)
    atomic_write_text(record_path(out_dir, record["id"]), json.dumps(jsonable(record), indent=1) + "\n")
    return record


def is_complete(out_dir: Path, row_id: str) -> dict[str, Any] | None:
    """The record of a prompt whose outputs are complete (status ok, files present), else None."""
    path = record_path(out_dir, row_id)
    try:
        record = read_json_file(path, "prompt record")
    except LoadError:
        return None
    if record.get("status") != "ok":
        return None
    if not all((out_dir / record[key]).is_file() for key in ("graph", "part") if record.get(key)):
        return None
    return record
