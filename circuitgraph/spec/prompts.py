"""Prompts: text (tokenized by the model) or explicit token ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, Field, field_validator

from circuitgraph.spec.base import Bool, NonNegativeInt, StrictModel, rule_error, shaped_union

__all__ = ["TextPrompt", "TokensPrompt", "Prompt"]


class TextPrompt(StrictModel):
    """A text prompt; ``prompt: "..."`` is short for ``{text: "...", prepend_bos: true}``."""

    text: str = Field(
        description="The prompt text, tokenized by the model's tokenizer.", json_schema_extra={"minLength": 1}
    )
    prepend_bos: Bool = Field(True, description="Prepend the beginning-of-sequence token.")
    strict: Bool = Field(
        False, description="Pieces of the text that the tokenizer does not know are an error (default: a warning, "
        "recorded in the graph's metadata)."
    )

    @field_validator("text")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if value == "":
            raise rule_error(("", "empty prompt ''; give some text, or token ids as {tokens: [...]}"))
        return value


class TokensPrompt(StrictModel):
    """A prompt given as token ids, used as they are (no BOS is added)."""

    tokens: tuple[NonNegativeInt, ...] = Field(
        min_length=1, description="Token ids (integers >= 0), at least one."
    )


def _text_shorthand(value: Any) -> Any:
    return {"text": value} if isinstance(value, str) else value


if TYPE_CHECKING:
    Prompt = TextPrompt | TokensPrompt
else:
    Prompt = shaped_union(
        "prompt",
        "a string, {text: ...} or {tokens: [...]}",
        {
            "text": Annotated[
                TextPrompt,
                BeforeValidator(_text_shorthand, json_schema_input_type=Annotated[str, Field(min_length=1)] | TextPrompt),
            ],
            "tokens": TokensPrompt,
        },
        keys={"text": "text", "tokens": "tokens"},
        by_type={str: "text"},
    )
"""A prompt: ``"text"``, ``{text, prepend_bos}`` or ``{tokens: [ids]}``; parsed as
:class:`TextPrompt` or :class:`TokensPrompt`."""
