"""Run a features spec: check the rows, stream the shards, merge, write the dashboards.

Layout of ``DIR`` (``export: {features: DIR}``)::

    DIR/features.json         what ran (the fingerprint of the spec and rows), and the settings
    DIR/shards/<a>-<b>.npz    each shard's exact state (rows a..b), written atomically
    DIR/shards/<a>-<b>.json   each shard's record (status, error, attempts)
    DIR/features.parquet      one row per feature
    DIR/examples.parquet      the top-k examples of every feature
    DIR/labels.csv            (yours, optional) layer, index, label: read by diagrams and exports

Re-running the same spec on the same folder resumes: shards whose state file exists are
skipped (a shard file is complete or absent), the rest run; the files are then rebuilt from
every shard's state, so they equal an uninterrupted run's byte for byte.  The shard size is
not part of the fingerprint: a resume with another ``shard_size`` reuses nothing but gives the
same files.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitgraph._io import atomic_write_bytes, read_json_file
from circuitgraph._results import RunOutcome
from circuitgraph.datasets.executors import make_executor
from circuitgraph.datasets.folders import claim_run_folder
from circuitgraph.datasets.rows import model_problems, row_problems
from circuitgraph.errors import DatasetError, LoadError
from circuitgraph.features.stream import HEAD_EXTRA, ShardJob, make_shards, shard_path
from circuitgraph.features.summary import open_features
from circuitgraph.features.topk import FeatureState
from circuitgraph.features.units import select_units
from circuitgraph.features.write import (
    examples_table,
    features_table,
    table_bytes,
    token_lists,
)
from circuitgraph.pipeline.inputs import load_inputs
from circuitgraph.spec import Spec, SpecSource, load_spec

__all__ = ["FeaturesRunResult", "features_fingerprint", "run_features"]

FORMAT = "circuitgraph-features"
#: what a summary calls the rows of features.parquet
_UNIT_WORDS = {"features": "features", "neurons": "neurons", "heads": "head rankings (head x metric)"}


@dataclass
class FeaturesRunResult(RunOutcome):
    """What a features run produced (``circuitgraph.run`` on a spec with ``features:`` only)."""

    spec: Spec
    directory: Path
    n_rows: int
    n_features: int
    n_examples: int
    n_shards: int
    n_skipped: int
    timings: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def open(self) -> Any:
        return open_features(self.directory)

    def summary_lines(self) -> list[str]:
        rate = self.timings.get("rows_per_minute")
        return [
            f"features: {self.n_features} {_UNIT_WORDS[self.spec.features.units]} over {self.n_rows} rows, "
            f"{self.n_examples} examples "
            f"({self.n_shards} shards" + (f", {self.n_skipped} already complete, skipped)" if self.n_skipped else ")"),
            f"wrote {self.directory.resolve()}: features.parquet, examples.parquet",
            "time: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items() if k.startswith("time_"))
            + (f"; {rate:.1f} rows/minute" if rate else ""),
            f"summary: circuitgraph features summary {self.directory}",
        ]


def features_fingerprint(spec: Spec, rows: list[Any]) -> str:
    """What makes two features runs' files the same: model, dictionaries, the ``features:``
    settings except ``shard_size``, and the rows (not the executor, not the graph sections)."""
    dump = spec.model_dump(mode="json", include={"model", "transcoders", "graph", "features"})
    dump["features"].pop("shard_size", None)
    if dump["features"].get("units") == "features":  # the default: the fingerprints of runs before units: hold
        dump["features"].pop("units")
    dump["graph"] = {"dtype": dump["graph"].get("dtype")}
    rows_json = [{"id": r.id, "prompt": r.prompt.model_dump(mode="json")} for r in rows]
    text = json.dumps({"spec": dump, "rows": rows_json}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _prepare(out: Path, fingerprint: str, settings: dict[str, Any]) -> None:
    claim_run_folder(out, "features.json", fingerprint, FORMAT, settings,
                     key="export.features", what="features run",
                     different="the dashboards of a different spec or dataset", allowed=("labels.csv",))


class _Progress:
    def __init__(self, enabled: bool, total: int, skipped: int):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=skipped, desc="rows", unit="row", file=sys.stderr,
                            dynamic_ncols=True)

    def update(self, record: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.update(int(record.get("n_rows", 1)))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_features(spec: SpecSource, *, progress: bool = False) -> FeaturesRunResult:
    """Compute the feature dashboards of a spec with ``dataset:`` and ``features:`` (see the
    module docstring and docs/features.md)."""
    t_start = time.perf_counter()
    spec = load_spec(spec)
    rows, problems = row_problems(spec)
    adapter, dictionaries = load_inputs(spec)
    problems += model_problems(rows, spec, adapter, dictionaries)
    if problems:
        raise DatasetError(problems)
    selection = select_units(spec, adapter, dictionaries)
    f = spec.features
    out = Path(spec.export.features)
    settings = {"units": f.units, **({"head_metrics": list(f.head_metrics)} if f.units == "heads" else {}),
                "top_k": f.top_k, "context": f.context, "quantiles": list(f.quantiles), "layers": list(selection.layers),
                "n_features": selection.n_features, "n_rows": len(rows), "include_bos": f.include_bos,
                "dictionaries": dictionaries.describe().get("kind") if dictionaries is not None else None}
    _prepare(out, features_fingerprint(spec, rows), settings)
    timings: dict[str, float] = {"time_check": time.perf_counter() - t_start}

    shards = make_shards(rows, f.shard_size)
    done = {s.id for s in shards if shard_path(out, s.id).is_file()}
    pending = [s for s in shards if s.id not in done]
    bar = _Progress(progress, len(rows), sum(len(s.rows) for s in shards if s.id in done))
    t0 = time.perf_counter()
    try:
        make_executor(spec).run(spec, pending, out, bar.update, job=ShardJob())
    finally:
        bar.close()
    timings["time_rows"] = time.perf_counter() - t0
    if pending:
        timings["rows_per_minute"] = 60.0 * sum(len(s.rows) for s in pending) / max(timings["time_rows"], 1e-9)

    failures = []
    for s in shards:
        if shard_path(out, s.id).is_file():
            continue
        try:
            record = read_json_file(out / "shards" / f"{s.id}.json", "shard record")
            error = record.get("error") or "no state was written"
        except LoadError:
            error = "no result was recorded"
        failures.append(f"rows {s.rows[0].number}-{s.rows[-1].number}: {error}")
    if failures:
        raise DatasetError(f"{len(failures)} of {len(shards)} shards failed, nothing was written (run again to "
                           f"resume): {'; '.join(failures[:5])}")

    t0 = time.perf_counter()
    heads = f.units == "heads"
    width = (2 if heads else 1) * (2 * f.context + 1)
    state = FeatureState.empty(f.top_k, width, len(HEAD_EXTRA) if heads else 0)
    for s in shards:  # one shard read at a time; the merge is exact, so the order does not matter
        state = state.merge(FeatureState.from_bytes(shard_path(out, s.id).read_bytes()))
    tok = adapter.tokenizer
    token_str = (lambda t: tok.token_str(t)) if tok is not None else (lambda t: f"<{t}>")
    decode = (lambda ids: tok.decode(ids, skip_special_tokens=False) if ids else "") if tok is not None else \
        (lambda ids: "".join(f"<{t}>" for t in ids))
    tokens = token_lists(adapter, dictionaries, selection, f.top_tokens, token_str)
    atomic_write_bytes(out / "features.parquet", table_bytes(features_table(state, selection, f.quantiles, tokens)))
    examples = examples_table(state, selection, {r.number: r.id for r in rows}, decode)
    atomic_write_bytes(out / "examples.parquet", table_bytes(examples))
    timings["time_write"] = time.perf_counter() - t0
    timings["time_total"] = time.perf_counter() - t_start
    return FeaturesRunResult(spec, out, len(rows), selection.n_features, examples.num_rows, len(shards), len(done),
                             timings)
