"""One record per model source and per dictionary source (adapters/model_sources.py,
adapters/dictionary_sources.py): every key of the spec's ``model:`` and ``transcoders:`` has
exactly one record with its loader, nothing outside the records compares a source with a key,
and every loaded object is made with its final source record (none is patched afterwards)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

import circuitgraph.adapters.loading  # registers the model sources' loaders
import circuitgraph.dictionaries.sources  # noqa: F401 - registers the dictionary sources' loaders
from circuitgraph.adapters.dictionary_sources import DICTIONARY_SOURCES, existing_dictionary_folder
from circuitgraph.adapters.model_sources import MODEL_SOURCES, existing_model_folder
from circuitgraph.spec import load_spec
from circuitgraph.spec.model import ModelSource, ModelSpec, TranscoderSource, TranscodersSpec

PACKAGE = Path(__file__).resolve().parents[1] / "circuitgraph"

#: one spec section per source key (a new key needs its example here, and a record)
MODEL_EXAMPLES = {"path": {"path": "some/folder"}, "name": {"name": "gpt2"}, "builtin": {"builtin": "demo"},
                  "pretrained": {"pretrained": "smollm2-135m-instruct"}}
DICTIONARY_EXAMPLES = {"path": {"path": "some/folder"}, "hf": {"hf": "org/repo"}, "release": {"release": "r"},
                       "builtin": {"builtin": "demo"}}


def test_every_model_source_key_has_one_record_with_a_loader_and_back():
    keys = set(get_args(ModelSource))
    assert set(MODEL_SOURCES) == keys, "a model source key of spec/model.py without its record, or the reverse"
    assert set(MODEL_EXAMPLES) == keys
    for key, record in MODEL_SOURCES.items():
        assert record.key == key and key in ModelSpec.model_fields
        assert callable(record.loader())
        assert ModelSpec(**MODEL_EXAMPLES[key]).source == key


def test_every_dictionary_source_key_has_one_record_with_a_loader_and_back():
    keys = set(get_args(TranscoderSource))
    assert set(DICTIONARY_SOURCES) == keys, "a dictionary source key of spec/model.py without its record, or the reverse"
    assert set(DICTIONARY_EXAMPLES) == keys
    for key, record in DICTIONARY_SOURCES.items():
        assert record.key == key and key in TranscodersSpec.model_fields
        assert callable(record.loader())
        assert TranscodersSpec(**DICTIONARY_EXAMPLES[key]).source == key


def test_local_folders_come_from_the_records():
    assert existing_model_folder(ModelSpec(path="some/folder")) == Path("some/folder")
    assert existing_model_folder(ModelSpec(name="gpt2")) is None
    assert existing_model_folder(ModelSpec(builtin="demo")) == existing_model_folder(ModelSpec(builtin="demo"))
    assert (existing_model_folder(ModelSpec(builtin="demo")) / "config.json").is_file()
    assert existing_dictionary_folder(TranscodersSpec(path="tc")) == Path("tc")
    assert existing_dictionary_folder(TranscodersSpec(hf="org/repo")) is None
    assert existing_dictionary_folder(TranscodersSpec(release="r")) is None
    assert existing_dictionary_folder(None) is None
    assert existing_dictionary_folder(TranscodersSpec(builtin="demo")).is_dir()


def _python_files():
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not p.relative_to(PACKAGE).as_posix().startswith("spec/")]


def _keyish(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_keyish(e) for e in node.elts)


def source_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing a ``.source`` with a key (``m.source == "path"``, ``t.source in ("hf", ...)``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "source" for s in sides) and any(map(_keyish, sides)):
                out.append(node.lineno)
    return out


def source_assignments(tree: ast.AST) -> list[int]:
    """Lines that set the ``source`` of an object other than ``self`` (``adapter.source = ...``,
    ``tcs.source[...] = ...``): an object patched after it was made."""
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            while isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and t.attr == "source" and not (
                    isinstance(t.value, ast.Name) and t.value.id == "self"):
                out.append(node.lineno)
    return out


def test_no_module_but_the_spec_compares_a_source_with_a_key():
    bad = [f"{p.relative_to(PACKAGE)}:{line}" for p in _python_files()
           for line in source_comparisons(ast.parse(p.read_text()))]
    assert not bad, "compare sources through their records (adapters/model_sources.py, dictionary_sources.py):\n" \
        + "\n".join(bad)
    assert source_comparisons(ast.parse('if m.source == "path" or t.source in ("hf", "release"): pass')) == [1, 1]
    assert source_comparisons(ast.parse("if record.local: pass")) == []


def test_no_loaded_object_has_its_source_set_afterwards():
    bad = [f"{p.relative_to(PACKAGE)}:{line}" for p in _python_files()
           for line in source_assignments(ast.parse(p.read_text()))]
    assert not bad, "make the object with its final source (a source= parameter, with_source):\n" + "\n".join(bad)
    snippet = 'adapter.source = {"builtin": "demo"}\nadapter.source["weights_dtype"] = "float32"\nself.source = s\n'
    assert source_assignments(ast.parse(snippet)) == [1, 2]


def _demo_spec(**transcoders):
    return load_spec({"format_version": 1, "model": {"builtin": "demo"}, "transcoders": transcoders or {"builtin": "demo"},
                      "prompt": {"tokens": [1, 2, 3]}, "targets": [{"logit": 5}]})


def test_the_builtin_sources_are_recorded_once_as_loaded():
    from circuitgraph.pipeline.inputs import load_inputs

    adapter, tcs = load_inputs(_demo_spec())
    assert adapter.source == {"builtin": "demo", "weights_dtype": "float32"}
    assert tcs is not None and tcs.source == {"builtin": "demo"}


def test_an_allowed_model_mismatch_is_in_the_source_the_dictionary_is_made_with(tmp_path, monkeypatch):
    import circuitgraph.dictionaries.sources as sources
    from circuitgraph.builtin import builtin_dictionary_dir
    from circuitgraph.dictionaries.transcoders import TranscoderSet
    from circuitgraph.pipeline.inputs import load_inputs

    made: list[dict] = []
    real = TranscoderSet.__init__

    def record(self, layers, source, format="saelens"):
        made.append(dict(source))
        real(self, layers, source, format)

    monkeypatch.setattr(TranscoderSet, "__init__", record)
    folder = builtin_dictionary_dir("demo")
    monkeypatch.setattr(sources, "dictionary_folder", lambda t: folder)
    spec = _demo_spec(path=str(folder), allow_model_mismatch=True)
    _, tcs = load_inputs(spec)
    assert tcs is not None and tcs.source == {"path": str(folder)}  # the demo dictionary names the demo model
    made.clear()
    # a check that allows a mismatch: the dictionary returned is made with it, last in its record
    with monkeypatch.context() as m:
        m.setattr("circuitgraph.pipeline.inputs.check_dictionary_model", lambda spec, folder, adapter: "other model")
        _, tcs = load_inputs(spec)
    assert tcs is not None and tcs.source == {"path": str(folder), "model_mismatch": "other model"}
    assert list(tcs.source)[-1] == "model_mismatch" and made[-1] == tcs.source


@pytest.mark.parametrize(("model", "expected"), [
    ({"builtin": "demo"}, False),  # a TransformerLens folder the native forward runs
    ({"builtin": "demo", "backend": "transformer_lens"}, True),
    ({"name": "gpt2"}, True),  # the record: always TransformerLens
    ({"pretrained": "smollm2-135m-instruct"}, True),
    ({"path": "no/such/folder"}, True),  # its loader reports the missing folder
])
def test_whether_loading_imports_transformer_lens_is_read_from_the_record(model, expected):
    from circuitgraph.pipeline.inputs import needs_transformer_lens

    spec = load_spec({"format_version": 1, "model": model, "prompt": {"tokens": [1, 2]}, "targets": [{"logit": 1}]})
    assert needs_transformer_lens(spec) is expected


def test_sparsify_reads_the_models_local_folder_and_refuses_one_that_is_not_hugging_face():
    from circuitgraph.errors import SpecError
    from circuitgraph.training.sparsify_backend import _model_folder

    with pytest.raises(SpecError, match="needs a Hugging Face model folder.*model.builtin 'demo'"):
        _model_folder(ModelSpec(builtin="demo"))  # a TransformerLens folder
    with pytest.raises(SpecError, match="model.name 'gpt2' is not one here"):
        _model_folder(ModelSpec(name="gpt2"))  # no local folder
