"""A dataset's rows: read, parsed and checked against the model before any work starts.

:func:`load_rows` reads the ``dataset:`` of a spec (a JSONL/CSV file or the inline list)
and :func:`check_rows` checks every row against the loaded model: token ids in the
vocabulary, lengths within ``n_ctx``, empty prompts, target tokens that are not one token,
target positions and layers, corrupted prompts of the prompt's length.  Every problem of
every row is collected and raised at once as a :class:`~circuitgraph.errors.DatasetError`
naming 1-based row numbers; nothing is written before this passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitgraph.attribution.targets import normalise_position, resolve_token
from circuitgraph.errors import CircuitGraphError, DatasetError
from circuitgraph.pipeline.inputs import _direction_vector, resolve_prompt_like
from circuitgraph.spec import Spec
from circuitgraph.spec.dataset import Row, parse_rows, read_dataset_rows

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["load_rows", "check_rows", "row_problems", "model_problems"]


def row_problems(spec: Spec) -> tuple[list[Row], list[tuple[str, str]]]:
    """Rows of a dataset spec and the problems found without the model."""
    if isinstance(spec.dataset, tuple):
        raw, problems = list(spec.dataset), []
    else:
        raw, problems = read_dataset_rows(Path(spec.dataset))
    rows, parse_problems = parse_rows(raw)
    problems = problems + parse_problems
    patching = [c for c in spec.validate if c.kind == "patching"]
    if patching and any(c.params.corrupted is None for c in patching):
        missing = [r.number for r in rows if r.corrupted is None]
        if missing:
            problems.append(("dataset", f"rows {missing[:10]}{'...' if len(missing) > 10 else ''} have no corrupted "
                                        "prompt and a patching check has none: give each row corrupted:, or the "
                                        "check corrupted:"))
    return rows, problems


def load_rows(spec: Spec) -> list[Row]:
    """The parsed rows of a dataset spec; every problem raised at once."""
    rows, problems = row_problems(spec)
    if problems:
        raise DatasetError(problems)
    return rows


def _target_problems(targets: Any, n_pos: int | None, adapter: ModelAdapter, transcoders: Dictionary | None,
                     where: str) -> list[tuple[str, str]]:
    f = adapter.facts
    tok = adapter.tokenizer
    out: list[tuple[str, str]] = []
    for i, t in enumerate(targets):
        loc = f"{where}[{i}].{t.kind}"
        try:
            if t.kind in ("logit", "logit_diff", "top_logits") and n_pos is not None:
                normalise_position(t.position, n_pos, f"{where}[{i}].position")
            if t.kind == "logit":
                resolve_token(t.logit, tok, f.d_vocab, loc)
            elif t.kind == "logit_diff":
                for j, x in enumerate(t.logit_diff):
                    resolve_token(x, tok, f.d_vocab, f"{loc}[{j}]")
            elif t.kind in ("feature", "neuron", "direction"):
                p = getattr(t, t.kind)
                adapter.check_layer(p.layer, what=f"{loc}.layer")
                if n_pos is not None:
                    normalise_position(p.position, n_pos, f"{loc}.position")
                if t.kind == "feature":
                    if transcoders is None or p.layer not in transcoders:
                        raise CircuitGraphError(f"{loc}: no transcoder is loaded for layer {p.layer}")
                    size = transcoders[p.layer].d_sae
                elif t.kind == "neuron":
                    size = f.n_neurons
                else:
                    _direction_vector(p, f.d_model, loc)
                    size = None
                if size is not None and p.index >= size:
                    raise CircuitGraphError(f"{loc}.index: {t.kind} {p.index} requested, layer {p.layer} has "
                                            f"{size} {t.kind}s (0-{size - 1})")
        except CircuitGraphError as exc:
            out.append(("", str(exc)))
    return out


def model_problems(rows: list[Row], spec: Spec, adapter: ModelAdapter,
                   transcoders: Dictionary | None) -> list[tuple[str, str]]:
    """Every problem of every row found with the model loaded (1-based row numbers)."""
    problems: list[tuple[str, str]] = []
    patching = [c for c in spec.validate if c.kind == "patching"]
    for row in rows:
        where = f"row {row.number} (id {row.id})"
        tokens: list[int] | None = None
        try:
            tokens = resolve_prompt_like(row.prompt, adapter, where=f"{where} prompt")
        except CircuitGraphError as exc:  # the row's other problems are still reported
            problems.append(("", str(exc)))
        n_pos = None if tokens is None else len(tokens)
        targets = row.targets if row.targets is not None else spec.targets
        problems += _target_problems(targets, n_pos, adapter, transcoders, f"{where} targets")
        corrupted = [row.corrupted] if row.corrupted is not None else [c.params.corrupted for c in patching]
        for prompt in corrupted if patching else []:
            try:
                other = resolve_prompt_like(prompt, adapter, where=f"{where} corrupted")
            except CircuitGraphError as exc:
                problems.append(("", str(exc)))
                continue
            if tokens is not None and len(other) != len(tokens):
                problems.append(("", f"{where} corrupted: {len(other)} tokens, the prompt has {len(tokens)}; "
                                     "patching needs prompts of the same token length"))
    return problems


def check_rows(rows: list[Row], spec: Spec, adapter: ModelAdapter, transcoders: Dictionary | None) -> None:
    """Raise :class:`DatasetError` listing every problem of every row found with the model."""
    problems = model_problems(rows, spec, adapter, transcoders)
    if problems:
        raise DatasetError(problems)
