"""One reading of a prompt's shape (``adapters.tokenizer.prompt_fields``): the run's
``resolve_prompt_like`` and the checks' ``resolve_prompt`` give the same token ids for every shape
a prompt may have (a string, a dict, the spec's models, token ids)."""

from __future__ import annotations

import pytest

from circuitgraph.adapters.loading import load_builtin_model
from circuitgraph.adapters.tokenizer import PromptFields, prompt_fields
from circuitgraph.pipeline.inputs import resolve_prompt_like
from circuitgraph.spec.prompts import TextPrompt, TokensPrompt
from circuitgraph.validation._common import resolve_prompt

TEXT = "mia found owl in the attic"


def test_prompt_fields_of_every_shape():
    assert prompt_fields(TEXT) == PromptFields(TEXT, None, True, False)
    assert prompt_fields({"text": TEXT, "prepend_bos": False, "strict": True}) == PromptFields(TEXT, None, False, True)
    assert prompt_fields(TextPrompt(text=TEXT, prepend_bos=False)) == PromptFields(TEXT, None, False, False)
    assert prompt_fields(TokensPrompt(tokens=(1, 2))).tokens == (1, 2)
    assert prompt_fields({"tokens": [1, 2]}) == PromptFields(None, [1, 2], True, False)
    assert prompt_fields([1, 2]) == PromptFields(None, [1, 2], True, False)
    assert prompt_fields(3.5) == PromptFields(None, None, True, False)


@pytest.mark.parametrize("prompt", [TEXT, {"text": TEXT}, {"text": TEXT, "prepend_bos": False},
                                    TextPrompt(text=TEXT), TextPrompt(text=TEXT, prepend_bos=False),
                                    {"tokens": [1, 4, 2]}, TokensPrompt(tokens=(1, 4, 2)), [1, 4, 2]],
                         ids=["str", "dict", "dict-no-bos", "TextPrompt", "TextPrompt-no-bos", "tokens-dict",
                              "TokensPrompt", "list"])
def test_the_run_and_the_checks_read_a_prompt_alike(prompt):
    adapter = load_builtin_model("demo")[0]
    ids = resolve_prompt(prompt, adapter.tokenizer)
    assert resolve_prompt_like(prompt, adapter) == ids
    fields = prompt_fields(prompt)
    if fields.text is not None:  # the text encoded by hand: BOS first when asked
        body = [int(t) for t in adapter.tokenizer.encode(TEXT)]
        assert ids == ([adapter.tokenizer.bos_id] if fields.prepend_bos else []) + body
    else:
        assert ids == [1, 4, 2]
