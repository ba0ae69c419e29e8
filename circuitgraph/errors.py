"""One exception hierarchy for circuitgraph.

Every error a user can trigger with bad input derives from :class:`CircuitGraphError`
and carries a one-line message that names the rule, the value received and the fix.
The CLI prints ``str(error)`` and exits non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = [
    "CircuitGraphError",
    "SpecError",
    "DatasetError",
    "LoadError",
    "ShapeMismatchError",
    "TokenError",
    "AttributionError",
    "NumericalError",
    "QueryError",
    "ValidationRunError",
    "ExportError",
    "RenderError",
    "ResourceError",
    "TokenWarning",
    "UnknownTokenWarning",
    "LeadingSpaceWarning",
    "DequantisedWeightsWarning",
    "IndexUnreachableError",
    "one_line",
    "spec_field",
]

_T = TypeVar("_T")

#: an error line longer than this is cut (a message must never dump a huge value)
MAX_ERROR_CHARS = 4000


class CircuitGraphError(Exception):
    """Base class of every error circuitgraph raises on bad input."""


def one_line(error: BaseException | str, *, limit: int = MAX_ERROR_CHARS, typed: bool = True) -> str:
    """An error (or a message) as one bounded, printable line: the one error-line formatter.

    Runs of whitespace become one space, lone surrogates are escaped (printable in any
    terminal), and a line longer than ``limit`` is cut with ``...``.  An exception that is not a
    :class:`CircuitGraphError` is prefixed with its type name when ``typed`` (``ValueError: ...``:
    a message of our own already says what went wrong); an empty message gives the type name.

        >>> one_line(ValueError("bad\\n  value"))
        'ValueError: bad value'
        >>> one_line(LoadError("no such file"))
        'no such file'
    """
    if isinstance(error, BaseException):
        text = str(error) if isinstance(error, CircuitGraphError) or not typed else f"{type(error).__name__}: {error}"
        text = " ".join(text.split()) or type(error).__name__
    else:
        text = " ".join(error.split())
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _escape_controls(text: str) -> str:
    """Control characters (a newline inside a key or value of the spec) written as escapes, so
    the message stays on one line."""
    return "".join(repr(c)[1:-1] if c < " " or c == "\x7f" else c for c in text)


def _problems_text(what: str, errors: list[tuple[str, str]]) -> str:
    """One line for a list of ``(location, message)`` problems: ``invalid WHAT: ...``."""
    lines = [_escape_controls(f"{loc}: {msg}" if loc else msg) for loc, msg in errors]
    if len(lines) == 1:
        return f"invalid {what}: {lines[0]}"
    return f"invalid {what} ({len(lines)} problems): " + "; ".join(lines)


class SpecError(CircuitGraphError):
    """The spec is malformed: unknown keys, wrong types, bad values.

    ``errors`` holds every problem found, each as ``(location, message)``.
    """

    def __init__(self, errors: list[tuple[str, str]] | str):
        self.errors = [("", errors)] if isinstance(errors, str) else list(errors)
        super().__init__(_problems_text("spec", self.errors))


class DatasetError(CircuitGraphError):
    """Rows of a dataset are unusable (bad keys, tokens out of the vocabulary, too long...).

    ``errors`` holds every problem of every row, each as ``(location, message)`` with
    1-based row numbers; all of them are found before any work starts.
    """

    def __init__(self, errors: list[tuple[str, str]] | str):
        self.errors = [("", errors)] if isinstance(errors, str) else list(errors)
        super().__init__(_problems_text("dataset", self.errors))


class LoadError(CircuitGraphError):
    """A model, tokenizer or transcoder could not be loaded (missing file, offline hub...)."""


class ShapeMismatchError(LoadError):
    """A transcoder does not fit the model (d_in/d_out, hook layer)."""


class TokenError(CircuitGraphError):
    """A prompt or target token is not usable (empty, too long, not one token, out of vocab)."""


class AttributionError(CircuitGraphError):
    """The graph cannot be built as asked (layer or position out of range, ...)."""


class NumericalError(AttributionError):
    """NaN or inf found in weights or activations."""


class QueryError(CircuitGraphError):
    """A query got bad arguments (unknown node, empty filter, k <= 0, threshold range)."""


class ValidationRunError(CircuitGraphError):
    """A validation check got bad arguments (mismatched prompts, empty node set, ...)."""


class ExportError(CircuitGraphError):
    """A graph cannot be exported as asked (too large for JSON, bad path...)."""


class RenderError(ExportError):
    """Rendering a diagram failed (e.g. the Graphviz ``dot`` binary is missing)."""


class ResourceError(CircuitGraphError):
    """A run would not fit in the memory available."""


class TokenWarning(UserWarning):
    """A token-level problem that does not stop a run: recorded in the graph's metadata
    (``warnings``) and the run's summary, printed by the CLI as one ``warning:`` line."""


class IndexUnreachableError(LoadError):
    """A pretrained model could not be fetched because the Python package index cannot be reached
    (no network, a proxy refusing, DNS failing): the one failure the real-model tests skip on."""


class DequantisedWeightsWarning(UserWarning):
    """The model's weights were dequantised from a quantised checkpoint (a GGUF file): they are an
    approximation of the published model's weights.  The graph's ``metadata.model.quantisation``
    records the quantisation type."""


class UnknownTokenWarning(TokenWarning):
    """A prompt text holds pieces the tokenizer does not know (they became its unknown token or
    were dropped).  A spec records these in the graph's metadata (``warnings``); a prompt with
    ``strict: true`` makes them a :class:`TokenError` instead."""


class LeadingSpaceWarning(TokenWarning):
    """A target token string without a leading space (``"Mary"``) whose space-prefixed form is also
    one token (``" Mary"``): valid, but after a word the next token usually carries the space, so
    the graph likely explains a different question than the one asked.  Recorded like
    :class:`UnknownTokenWarning`."""


def spec_field(value: _T | None, where: str) -> _T:
    """A spec field that the section's ``source`` requires (``model.path`` of a ``path`` model,
    ``transcoders.hf`` of a hub dictionary): ``value``, or a :class:`SpecError` naming ``where``.
    A parsed spec always has it (its validation checks each source's fields); the check makes that
    visible to the type checker and to code that builds a section by hand."""
    if value is None:
        raise SpecError(f"{where} is not set; the section's source needs it")
    return value
