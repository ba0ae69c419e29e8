"""The spec's query and check items: one ``query_item`` / ``check_item`` line per kind makes the item
class (``TopPathsQuery``...), and the registries, the public names and the union follow from it."""

from __future__ import annotations

import pickle

import pytest

import circuitgraph.spec as spec
from circuitgraph.errors import SpecError
from circuitgraph.spec import queries as sq
from circuitgraph.spec import validation as sv
from circuitgraph.spec.base import CheckItem, QueryItem, StrictModel, check_item, query_item

_KINDS = [(sq, t, "Query", QueryItem) for t in sq.QUERY_TYPES] + [(sv, t, "Check", CheckItem) for t in sv.CHECK_TYPES]


def _ids(kinds: list) -> list[str]:
    return [f"{suffix.lower()}-{t.key}" for _, t, suffix, _ in kinds]


@pytest.mark.parametrize(("module", "item", "suffix", "base"), _KINDS, ids=_ids(_KINDS))
def test_each_item_is_its_parameter_model_under_its_key(module, item, suffix, base):
    params = item.params_model
    name = params.__name__ + suffix
    # the public name, in the module that defines it, exported from the module and from spec
    assert item.__name__ == item.__qualname__ == name
    assert item.__module__ == module.__name__ and getattr(module, name) is item
    assert name in module.__all__ and getattr(spec, name) is item and name in spec.__all__
    assert issubclass(item, base) and issubclass(params, StrictModel)
    assert list(item.model_fields) == ["on", item.key]
    assert item.model_fields[item.key].annotation is params
    # the key is required exactly when the parameter model has a required field
    required = any(f.is_required() for f in params.model_fields.values())
    assert item.model_fields[item.key].is_required() is required
    if not required:
        made = item()
        assert made.kind == item.key and made.params == params() and made.on == base.model_fields["on"].default
    # the schema names the key as required either way: it tells the kinds apart
    assert item.model_json_schema()["required"] == [item.key]


def test_the_registries_list_every_item_once_in_the_documented_order():
    assert [t.key for t in sq.QUERY_TYPES] == [
        "top_paths", "influence", "direct_logit_attribution", "logit_lens", "congruence", "neighbours", "subgraph",
        "supernodes", "scores", "head_split", "virtual_weights", "de_embedding", "qk", "ground_truth"]
    assert [t.key for t in sv.CHECK_TYPES] == [
        "ablate", "predicted_vs_actual", "patching", "faithfulness", "sign_regimes", "replacement_fidelity", "qk",
        "faithfulness_curve"]
    # the qk check shares the qk query's parameters, and keeps its own docstring (the schema's description)
    assert sv.QKCheck.params_model is sq.QKQuery.params_model is sq.QK
    assert sv.QKCheck.__doc__ and "hook_q_input" in sv.QKCheck.__doc__
    assert sv.QKCheck.model_json_schema()["description"].startswith("QK attribution checked by intervention")
    assert "description" not in sq.QKQuery.model_json_schema()


def test_items_read_their_parameters_and_pickle():
    item = sq.TopPathsQuery(top_paths={"source": {"kind": "embedding"}, "k": 3})
    assert item.kind == "top_paths" and item.params is item.top_paths and item.params.k == 3
    assert pickle.loads(pickle.dumps(item)) == item
    check = sv.QKCheck(qk={"layer": 1, "head": [0, 2]}, on="full")
    assert pickle.loads(pickle.dumps(check)) == check and check.params.head == (0, 2)
    assert sq.ScoresQuery(scores=None).params == sq.Scores()  # null means all defaults


def test_a_required_parameter_block_is_still_required():
    with pytest.raises(SpecError, match="top_paths"):
        sq.TopPathsQuery()
    with pytest.raises(SpecError, match="source"):
        sq.TopPathsQuery(top_paths={})


def test_a_kind_is_an_identifier():
    with pytest.raises(ValueError, match="identifier"):
        query_item("top paths", sq.TopPaths)
    with pytest.raises(ValueError, match="identifier"):
        check_item("", sv.Ablate)


def test_a_new_item_is_placed_in_the_calling_module():
    made = query_item("influence", sq.Influence)
    assert made.__module__ == __name__ and made.__name__ == "InfluenceQuery" and made is not sq.InfluenceQuery
