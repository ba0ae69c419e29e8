"""A new export is one record (``spec/export.py`` ``EXPORT_KINDS``): the dataset run's refusal of
one-graph outputs, the memory plan's bytes per kept edge and the run's need of Graphviz's ``dot``
follow from it."""

from __future__ import annotations

import pytest

from circuitgraph.errors import SpecError
from circuitgraph.pipeline.stage_memory import KEPT_EDGE_BYTES
from circuitgraph.spec import load_spec
from circuitgraph.spec.export import EXPORT_KINDS, ExportKind


def _dataset_spec(tmp_path, **export: str) -> dict:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "prompt": "I ate an"}\n')
    return {"format_version": 1, "model": {"builtin": "demo"}, "dataset": str(rows),
            "targets": [{"logit": " apple"}], "export": {"dataset": str(tmp_path / "out"), **export}}


@pytest.mark.parametrize("key", list(EXPORT_KINDS))
def test_a_dataset_run_refuses_every_one_graph_output(tmp_path, key):
    load_spec(_dataset_spec(tmp_path))  # the spec is valid without it
    with pytest.raises(SpecError, match=f"export.{key}"):
        load_spec(_dataset_spec(tmp_path, **{key: f"g{EXPORT_KINDS[key].suffixes[0]}"}))


def test_the_memory_plan_counts_every_kind_by_its_record():
    assert KEPT_EDGE_BYTES == {k.key: k.kept_edge_bytes for k in EXPORT_KINDS.values()}
    assert all(v > 0 for v in KEPT_EDGE_BYTES.values())
    with pytest.raises(ValueError, match="kept_edge_bytes"):
        ExportKind("x", (".x",))


def test_only_dots_own_outputs_need_the_dot_binary():
    assert [k.key for k in EXPORT_KINDS.values() if k.requires_dot] == ["svg", "png"]
