"""Small helpers shared by the validation checks: JSON conversion, tables, prompts, statistics.

Nothing here knows TransformerLens hook names; that is the adapter's job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitgraph._json import jsonable  # re-exported: the one JSON encoder
from circuitgraph.adapters.tokenizer import check_prompt_text, prompt_fields, prompt_ids
from circuitgraph.errors import TokenError, ValidationRunError
from circuitgraph.text_tables import cell, markdown_table  # markdown_table re-exported: its old home

if TYPE_CHECKING:
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.attribution.context import AttributionContext
    from circuitgraph.graph.graph import AttributionGraph

__all__ = [
    "jsonable",
    "markdown_table",
    "fmt",
    "resolve_prompt",
    "graph_context",
    "pearson",
    "PromptResolver",
]

#: turns one spec prompt (a string, ``{text: ...}``, ``{tokens: [...]}`` or a parsed prompt
#: model) into token ids
PromptResolver = Callable[[Any], list[int]]


def fmt(value: Any, digits: int = 4) -> str:
    """A compact cell: floats to ``digits`` significant digits, ``None`` as an en dash
    (:func:`circuitgraph.text_tables.cell`'s markdown style)."""
    return cell(value, "markdown", digits)


def graph_context(graph: AttributionGraph, check: str) -> AttributionContext:
    """The live :class:`~circuitgraph.attribution.AttributionContext` of a graph, or a clear error."""
    ctx = getattr(graph, "context", None)
    if ctx is None:
        raise ValidationRunError(
            f"{check} needs the model behind the graph, and this graph has none (it was loaded from a "
            "file); rebuild it with circuitgraph.attribution.attribute or run the spec again"
        )
    return ctx


def resolve_prompt(prompt: Any, tokenizer: Tokenizer | None = None, *, where: str = "prompt") -> list[int]:
    """Token ids of one prompt.

    Accepts a list of ids, a string (tokenized with a BOS token prepended when the tokenizer
    has one), ``{"text": ..., "prepend_bos": ...}``, ``{"tokens": [...]}`` or the spec's
    ``TextPrompt``/``TokensPrompt`` models.
    """
    if isinstance(prompt, torch.Tensor):
        return [int(t) for t in prompt.flatten().tolist()]
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in prompt):
        if not prompt:
            raise ValidationRunError(f"{where}: an empty token list; give at least one token id")
        return [int(t) for t in prompt]
    text, tokens, bos, strict = prompt_fields(prompt)
    if isinstance(prompt, (list, tuple)):
        tokens = None  # a list that is not all token ids is not a prompt (below)
    if tokens is not None:
        return resolve_prompt(list(tokens), tokenizer, where=where)
    if text is None:
        raise ValidationRunError(
            f"{where}: {prompt!r} is not a prompt; give a string, {{text: ...}} or {{tokens: [ids]}}"
        )
    if tokenizer is None:
        raise ValidationRunError(
            f"{where}: the text prompt {text!r} needs a tokenizer and none was given; "
            "pass tokenizer=... or give the prompt as {tokens: [ids]}"
        )
    if hasattr(tokenizer, "unknown_pieces"):
        try:
            check_prompt_text(tokenizer, text, strict=strict, where=where)
        except TokenError as exc:
            raise ValidationRunError(str(exc)) from None
    ids = prompt_ids(tokenizer, text, bos)
    if not ids:
        raise ValidationRunError(f"{where}: {text!r} encodes to no token at all")
    return [int(t) for t in ids]


def pearson(x: Sequence[float | None], y: Sequence[float | None]) -> float | None:
    """Pearson correlation over the pairs where both values are known; ``None`` when it is
    undefined (fewer than two pairs or a constant side)."""
    pairs = [(a, b) for a, b in zip(x, y, strict=False) if a is not None and b is not None]
    if len(pairs) < 2:
        return None
    a = np.array([p[0] for p in pairs], dtype=np.float64)
    b = np.array([p[1] for p in pairs], dtype=np.float64)
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])
