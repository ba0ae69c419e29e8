"""scripts/mutation_check.py still applies to the current code: each of its mistakes replaces text
that occurs exactly once (running the mutations themselves takes minutes: run the script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutation_check", REPO / "scripts" / "mutation_check.py")
mutation_check = importlib.util.module_from_spec(spec)
sys.modules.setdefault("mutation_check", mutation_check)  # dataclasses look their module up
spec.loader.exec_module(mutation_check)


@pytest.mark.parametrize("mutation", mutation_check.MUTATIONS, ids=lambda m: m.name)
def test_mutation_applies_exactly_once(mutation):
    text = (REPO / mutation.path).read_text()
    assert text.count(mutation.find) == 1, f"{mutation.name}: update scripts/mutation_check.py"
    assert mutation.replace != mutation.find


def test_mutations_cover_the_listed_mistakes():
    names = {m.name for m in mutation_check.MUTATIONS}
    assert {"reversed-decoder-rows", "ln1-sigma-for-ln2", "wrong-head", "off-by-one-position",
            "transposed-attention-map"} <= names
