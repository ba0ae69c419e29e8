"""Dataset runs: ``dataset:`` (the prompts), ``aggregate:`` and ``executor:`` (no torch here).

A dataset spec replaces ``prompt:`` with ``dataset:``, either a path to a JSONL or CSV file
or an inline list of rows.  Each row is one prompt::

    {id: owl-1, prompt: "mia saw the owl . later she wants", targets: [{logit_diff: [" an", " a"]}],
     corrupted: "mia saw the dog . later she wants"}

``prompt`` (text, tokenized with BOS as for ``prompt:``) or ``tokens`` (ids, used as they
are) is required; ``targets`` (replacing the spec's targets for that row), ``corrupted``
(the corrupted prompt of the ``patching`` checks for that row) and ``id`` (default: the
1-based row number) are optional.  :func:`parse_rows` checks every row and reports every
problem with its 1-based row number; checks that need the model (token ids, lengths,
target tokens) live in :mod:`circuitgraph.datasets.rows`.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from circuitgraph.spec.base import NonNegativeInt, PositiveInt, StrictModel, rule_error
from circuitgraph.spec.messages import format_validation_error
from circuitgraph.spec.prompts import Prompt, TextPrompt, TokensPrompt
from circuitgraph.spec.targets import Target

__all__ = [
    "DatasetRow",
    "Row",
    "AggregateSpec",
    "ExecutorSpec",
    "DATASET_SUFFIXES",
    "parse_rows",
    "read_dataset_rows",
    "ID_PATTERN",
]

#: file types a ``dataset:`` path may have
DATASET_SUFFIXES = (".jsonl", ".csv")
#: stands for a line of a dataset file that could not be read (already reported)
UNREADABLE = object()
#: what a row id may look like (it names files under ``DIR/graphs/``)
ID_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


class DatasetRow(StrictModel):
    """One prompt of a dataset (see the module docstring)."""

    id: str | None = Field(None, description="The row's id (default: its 1-based row number); names its files.")
    prompt: str | None = Field(None, description="The prompt text (tokenized with BOS, as for prompt:).")
    tokens: tuple[NonNegativeInt, ...] | None = Field(
        None, min_length=1, description="The prompt as token ids, used as they are (at least one)."
    )
    targets: tuple[Target, ...] | None = Field(None, min_length=1, description="This row's targets (default: the spec's).")
    corrupted: Prompt | None = Field(None, description="The corrupted prompt of this row's patching checks.")

    @field_validator("id", mode="before")
    @classmethod
    def _int_id(cls, value: Any) -> Any:
        # JSONL and inline rows may number their ids: 7 is the id "7"
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str | None) -> str | None:
        if value is not None and not ID_PATTERN.match(value):
            raise rule_error(("", f"id {value!r} must be 1-128 letters, digits, '_', '-' or '.' (not starting "
                                  "with '.' or '-'): it names the row's files; rename it"))
        return value

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise rule_error(("", f"empty prompt {value!r}; give some text, or token ids as tokens: [...]"))
        return value

    @model_validator(mode="after")
    def _one_prompt(self) -> DatasetRow:
        if (self.prompt is None) == (self.tokens is None):
            got = "both" if self.prompt is not None else "neither"
            raise rule_error(("", f"a row needs exactly one of prompt (text) or tokens (ids), got {got}"))
        return self


@dataclass(frozen=True)
class Row:
    """A parsed row: ``number`` is 1-based; ``prompt`` is a spec prompt."""

    number: int
    id: str
    prompt: TextPrompt | TokensPrompt
    targets: tuple[Any, ...] | None
    corrupted: TextPrompt | TokensPrompt | None


class AggregateSpec(StrictModel):
    """How per-prompt graphs are aggregated (``aggregate:``).

    Nodes are keyed by their identity ``(kind, layer, index)`` (position-free), or by
    ``(kind, layer, index, position_from_end)`` with ``position: from_end``.
    """

    graph: Literal["pruned", "full"] = Field(
        "pruned", description="Aggregate the pruned graphs (as the spec's prune: makes them) or the full ones."
    )
    position: Literal["free", "from_end"] = Field(
        "free", description="'free': one row per (kind, layer, index); 'from_end': also per position from the end."
    )


class ExecutorSpec(StrictModel):
    """Where the prompts run (``executor:``): local processes or Ray tasks."""

    kind: Literal["local", "ray"] = Field("local", description="'local' (processes here) or 'ray' (Ray tasks).")
    workers: PositiveInt | None = Field(
        None, description="Prompts run at once (local: null = the number of cores; ray: null = the cluster's CPUs)."
    )
    address: str | None = Field(
        None, description="ray only: 'local' starts a local Ray instance; a cluster address runs on that cluster "
        "(null = Ray's default: RAY_ADDRESS, or a new local instance)."
    )
    threads: PositiveInt = Field(
        1, description="Torch threads per worker (results are byte-identical across runs with the same value)."
    )
    max_retries: NonNegativeInt = Field(2, description="Retries of a prompt whose worker died while running it.")

    @model_validator(mode="after")
    def _address(self) -> ExecutorSpec:
        if self.kind == "local" and self.address is not None:
            raise rule_error(("address", f"address {self.address!r} is only used with kind: ray; remove it"))
        return self


def _row_problems(exc: ValidationError, raw: Any, number: int) -> list[tuple[str, str]]:
    out = []
    for loc, msg in format_validation_error(exc, DatasetRow, raw):
        out.append((f"row {number}" + (f".{loc}" if loc else ""), msg))
    return out


def parse_rows(raw_rows: list[Any]) -> tuple[list[Row], list[tuple[str, str]]]:
    """Validate raw rows (mappings); returns the rows and every problem as ``("row N[.field]", message)``."""
    rows: list[Row] = []
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(raw_rows, start=1):
        if raw is UNREADABLE:  # already reported by the reader
            continue
        if not isinstance(raw, dict):
            problems.append((f"row {number}", f"a row is a mapping {{prompt: ...}} or {{tokens: [...]}}, "
                                              f"got {type(raw).__name__}"))
            continue
        raw_id = raw.get("id", str(number))
        raw_id = str(raw_id) if isinstance(raw_id, int) and not isinstance(raw_id, bool) else raw_id
        duplicate = False
        if isinstance(raw_id, str):
            duplicate = raw_id in seen
            if duplicate:
                problems.append((f"row {number}.id", f"id {raw_id!r} is also the id of row {seen[raw_id]}; "
                                                     "give every row its own id"))
            else:
                seen[raw_id] = number
        try:
            row = DatasetRow.model_validate(raw)
        except ValidationError as exc:
            problems += _row_problems(exc, raw, number)
            continue
        if duplicate:
            continue
        row_id = row.id if row.id is not None else str(number)
        prompt = TextPrompt(text=row.prompt) if row.prompt is not None else TokensPrompt(tokens=row.tokens)
        rows.append(Row(number, row_id, prompt, row.targets, row.corrupted))
    if not raw_rows:
        problems.append(("", "the dataset has no rows; give at least one prompt"))
    return rows, problems


def _csv_value(key: str, value: str) -> Any:
    """A CSV cell: ``tokens`` and ``targets`` hold JSON (``[1, 2]``; tokens may be space-separated ids)."""
    if value == "":
        return None
    if key in ("tokens", "targets"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            if key == "tokens" and all(p.lstrip("-").isdigit() for p in value.split()):
                return [int(p) for p in value.split()]
            raise ValueError(f"{key}: {value!r} is not JSON (write e.g. [1, 2, 3])") from None
    return value


def read_dataset_rows(path: Path) -> tuple[list[Any], list[tuple[str, str]]]:
    """Raw rows of a JSONL or CSV dataset file, and problems reading it (1-based row numbers)."""
    suffix = path.suffix.lower()
    if suffix not in DATASET_SUFFIXES:
        return [], [("dataset", f"unsupported dataset file type {suffix or '(none)'!r} ({path}); use .jsonl or .csv")]
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], [("dataset", f"dataset file not found: {path}")]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [("dataset", f"cannot read the dataset file {path}: {exc}")]
    rows: list[Any] = []
    problems: list[tuple[str, str]] = []
    if suffix == ".jsonl":
        for number, line in enumerate((ln for ln in text.splitlines() if ln.strip()), start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                problems.append((f"row {number}", f"malformed JSON: {exc.msg} (one JSON object per line)"))
                rows.append(UNREADABLE)
        return rows, problems
    reader = csv.DictReader(io.StringIO(text))
    known = set(DatasetRow.model_fields)
    unknown = [k for k in (reader.fieldnames or []) if k not in known]
    if unknown:
        return [], [("dataset", f"unknown CSV column(s) {unknown} in {path}; allowed columns: {sorted(known)}")]
    for number, record in enumerate(reader, start=1):
        row: dict[str, Any] = {}
        for key, value in record.items():
            try:
                parsed = _csv_value(key, value or "")
            except ValueError as exc:
                problems.append((f"row {number}.{key}", str(exc)))
                continue
            if parsed is not None:
                row[key] = parsed
        rows.append(row)
    return rows, problems
