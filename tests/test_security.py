"""A model folder is data: loading one must never run code it ships.

The proof of concept: config.json names a tokenizer folder (``tokenizer_name``) with
``trust_remote_code: true``, and that folder's tokenizer_config.json has an ``auto_map``
pointing at a Python file that writes a marker.  transformers runs that file when asked
to trust remote code (checked first, so the test can fail); circuitgraph must refuse the
config unless the spec says ``model: {trust_remote_code: true}``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.bundles import SHARED_FIXTURES

PAYLOAD = '''
import os, pathlib
pathlib.Path(os.environ["CIRCUITGRAPH_TEST_MARKER"]).write_text("code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
'''


def _evil_bundle(tmp_path: Path) -> tuple[Path, Path]:
    bundle = tmp_path / "bundle"
    shutil.copytree(SHARED_FIXTURES / "example-gpt2", bundle, symlinks=False)
    tok = tmp_path / "evil_tokenizer"
    tok.mkdir()
    shutil.copy(SHARED_FIXTURES / "example-gpt2" / "tokenizer" / "tokenizer.json", tok / "tokenizer.json")
    (tok / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}}))
    (tok / "evil_tok.py").write_text(PAYLOAD)
    cfg_file = bundle / "model" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(tokenizer_name=str(tok), trust_remote_code=True)
    cfg_file.write_text(json.dumps(cfg))
    return bundle, tok


def test_the_payload_is_real(tmp_path):
    """transformers does run the auto_map code when told to trust it (so the next test can fail)."""
    pytest.importorskip("transformers")
    _, tok = _evil_bundle(tmp_path)
    marker = tmp_path / "marker"
    env = dict(os.environ, CIRCUITGRAPH_TEST_MARKER=str(marker), HF_HUB_OFFLINE="1",
               HF_MODULES_CACHE=str(tmp_path / "modules"))
    code = ("from transformers import AutoTokenizer\n"
            f"AutoTokenizer.from_pretrained({str(tok)!r}, trust_remote_code=True)\n")
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert marker.exists(), "the proof-of-concept payload did not run; the refusal test proves nothing"


@pytest.mark.parametrize("entry", ["api", "cli"])
def test_model_folder_cannot_run_code(tmp_path, monkeypatch, entry):
    bundle, _ = _evil_bundle(tmp_path)
    marker = tmp_path / "marker"
    monkeypatch.setenv("CIRCUITGRAPH_TEST_MARKER", str(marker))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = {"format_version": 1, "model": {"path": str(bundle / "model")}, "prompt": {"tokens": [1, 5, 6]},
            "export": {"json": str(tmp_path / "out" / "g.json")}}
    if entry == "api":
        import circuitgraph
        from circuitgraph.errors import LoadError

        with pytest.raises(LoadError, match="trust_remote_code: true"):
            circuitgraph.run(spec)
    else:
        from typer.testing import CliRunner

        from circuitgraph.cli.main import app

        path = tmp_path / "spec.json"
        path.write_text(json.dumps(spec))
        res = CliRunner().invoke(app, ["run", str(path), "--quiet"])
        assert res.exit_code == 2, res.output
        assert "tokenizer_name" in res.output and "Traceback" not in res.output
    assert not marker.exists(), "loading a model folder ran code it ships"
    assert not (tmp_path / "out").exists()


def test_trust_remote_code_is_an_explicit_spec_key():
    from circuitgraph.spec import load_spec

    base = {"format_version": 1, "model": {"builtin": "demo"}, "prompt": "a"}
    assert load_spec(base).model.trust_remote_code is False
    assert load_spec({**base, "model": {"builtin": "demo", "trust_remote_code": True}}).model.trust_remote_code
    from circuitgraph.errors import SpecError

    with pytest.raises(SpecError, match="trust_remote_code"):
        load_spec({**base, "model": {"builtin": "demo", "trust_remote_code": "yes"}})


def test_config_fields_are_allow_listed(tmp_path):
    from circuitgraph.adapters.model_config import read_model_config
    from circuitgraph.errors import LoadError

    base = json.loads((SHARED_FIXTURES / "example-gpt2" / "model" / "config.json").read_text())
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**base, "auto_map": {"AutoConfig": "x.Y"}}))
    with pytest.raises(LoadError, match="unknown field 'auto_map'"):
        read_model_config(cfg)
    cfg.write_text(json.dumps({**base, "tokenizer_name": "gpt2"}))
    with pytest.raises(LoadError, match="tokenizer_name"):
        read_model_config(cfg)
    assert read_model_config(cfg, trust_remote_code=True)["tokenizer_name"] == "gpt2"
    out = read_model_config(_write(tmp_path / "c3.json", base))
    assert "tokenizer_name" not in out and "trust_remote_code" not in out and "seed" not in out


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_act_fn_list_matches_transformer_lens():
    """The allow-list names TransformerLens's activations without importing it (validate is torch-free)."""
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    from circuitgraph.adapters.model_config import ACT_FNS

    assert set(ACT_FNS) == set(SUPPORTED_ACTIVATIONS)
