"""The error types of the spec's validators and the bounded ``repr`` of a bad value: the
bottom of the spec package (:mod:`~circuitgraph.spec.base` raises them,
:mod:`~circuitgraph.spec.messages` formats them)."""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["RULE_ERROR", "VARIANT_ERROR", "VARIANTS"]

#: error type of the rule violations raised by validators in this package
RULE_ERROR = "spec_rule"
#: error type of a value that matches no variant of a tagged union
VARIANT_ERROR = "spec_variant"
#: what each tagged union expects, by name: ``(expected, keys, hint)`` (see :func:`_discriminator`)
VARIANTS: dict[str, tuple[str, tuple[str, ...], str]] = {}


def _short(value: Any, limit: int = 60) -> str:
    """A bounded ``repr``: the work is proportional to ``limit``, never to the size of ``value``
    (a YAML alias bomb or a million-item list is summarised, not printed)."""
    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxtuple, short.maxdict, short.maxset = 3, 6, 6, 4, 4
    short.maxstring, short.maxlong, short.maxother = limit, 40, limit
    try:
        text = short.repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails says only the type
        text = f"<{type(value).__name__}>"
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."
