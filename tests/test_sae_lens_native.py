"""sae-lens ``save_model`` folders read without sae-lens (circuitgraph.dictionaries.saelens_native):
the same TranscoderLayer, tensor for tensor, as ``SAE.load_from_disk``; sae-lens itself for
whatever the reader does not recognise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from circuitgraph.adapters import ModelAdapter
from circuitgraph.dictionaries import TranscoderSet, saelens_native
from circuitgraph.errors import LoadError
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model

REPO = Path(__file__).resolve().parents[1]
KINDS = {"relu": "transcoder", "skip": "skip_transcoder", "jumprelu": "jumprelu_transcoder",
         "jumprelu_skip": "jumprelu_skip_transcoder"}
TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec", "W_skip", "threshold")


@pytest.fixture(scope="module")
def model():
    return tiny_model(norm="LN", mlp="gelu", positional="learned", n_layers=2)


def _bundle(tmp_path: Path, model, kind: str, input_site: str = "normalized") -> Path:
    tcs = random_transcoders(model, d_sae=24, kind=kind, input_site=input_site)
    return save_bundle(tmp_path / f"{kind}-{input_site}", model, tcs) / "transcoders"


def _with_sae_lens(monkeypatch, path: Path, adapter, dtype=None) -> TranscoderSet:
    with monkeypatch.context() as m:
        m.setattr(saelens_native, "read_folder", lambda *a, **k: None)
        return TranscoderSet.from_dir(path, adapter, dtype=dtype)


def _assert_same(a: TranscoderSet, b: TranscoderSet) -> None:
    assert list(a.layers) == list(b.layers)
    for l, x in a.layers.items():
        y = b.layers[l]
        for name in TENSORS:
            s, t = getattr(x, name), getattr(y, name)
            assert (s is None) == (t is None), name
            if s is not None:
                assert s.dtype == t.dtype and s.device == t.device, name
                assert torch.equal(s, t), name
        for attr in ("layer", "input_site", "hook_in", "hook_out", "architecture", "output_site", "source",
                     "activation_kind", "d_sae"):
            assert getattr(x, attr) == getattr(y, attr), attr
        assert (x.sae_input is None) == (y.sae_input is None)
        for s, t in zip(x.sae_input or (), y.sae_input or (), strict=False):
            assert (s is None and t is None) or torch.equal(s, t)
        assert x.sae.dtype == y.sae.dtype and x.sae.cfg.architecture() == y.sae.cfg.architecture()
        assert x.describe() == y.describe()
        gen = torch.Generator().manual_seed(l)
        inp = torch.randn(3, 5, x.W_enc.shape[0], generator=gen, dtype=torch.float64)
        ax, ay = x.activation(inp), y.activation(inp)
        assert ax.dtype == ay.dtype and torch.equal(ax, ay) and (ax != 0).any()
        assert torch.equal(x.reconstruction(ax, inp), y.reconstruction(ay, inp))


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("input_site", ["normalized", "mlp_input"])
def test_native_equals_sae_lens(tmp_path, monkeypatch, model, kind, input_site):
    path = _bundle(tmp_path, model, kind, input_site)
    adapter = ModelAdapter(model)
    for sub in sorted(path.iterdir()):
        native = saelens_native.read_folder(sub)
        assert isinstance(native, saelens_native.NativeTranscoder)
        assert native.cfg.architecture() == KINDS[kind]
    for dtype in (None, torch.float64, torch.bfloat16):
        fast = TranscoderSet.from_dir(path, adapter, dtype=dtype)
        assert all(isinstance(t.sae, saelens_native.NativeTranscoder) for t in fast.layers.values())
        slow = _with_sae_lens(monkeypatch, path, adapter, dtype)
        assert type(slow[0].sae).__module__.startswith("sae_lens")
        _assert_same(fast, slow)
        # TranscoderLayer.to (converts the sae object in place, as nn.Module.to does)
        _assert_same(fast.to(torch.float64), slow.to(torch.float64))


def test_float64_request_equals_sae_lens_to_float64(tmp_path, model):
    from sae_lens import SAE

    path = _bundle(tmp_path, model, "jumprelu_skip")
    adapter = ModelAdapter(model)
    fast = TranscoderSet.from_dir(path, adapter, dtype=torch.float64)
    for l, layer in fast.layers.items():
        sae = SAE.load_from_disk(str(path / f"layer_{l}")).to(torch.float64)
        for name in ("W_enc", "b_enc", "W_dec", "b_dec", "W_skip", "threshold"):
            t = getattr(layer, name)
            assert t.dtype == torch.float64 and torch.equal(t, getattr(sae, name).detach())


def test_cfg_dtype_is_cast_first(tmp_path, monkeypatch, model):
    """cfg.json's dtype is applied as the file is read, the requested dtype after it (two casts)."""
    path = _bundle(tmp_path, model, "jumprelu")
    for sub in path.iterdir():
        cfg = json.loads((sub / "cfg.json").read_text())
        (sub / "cfg.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}))
    adapter = ModelAdapter(model)
    for dtype in (None, torch.float64):
        fast = TranscoderSet.from_dir(path, adapter, dtype=dtype)
        assert isinstance(fast[0].sae, saelens_native.NativeTranscoder)
        assert fast[0].W_enc.dtype == (dtype or torch.bfloat16)
        _assert_same(fast, _with_sae_lens(monkeypatch, path, adapter, dtype))


def _edit_cfg(sub: Path, **changes) -> None:
    cfg = json.loads((sub / "cfg.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (sub / "cfg.json").write_text(json.dumps(cfg))


def _edit_weights(sub: Path, **changes) -> None:
    w = load_file(str(sub / "sae_weights.safetensors"))
    for k, v in changes.items():
        if v is None:
            w.pop(k)
        else:
            w[k] = v(w) if callable(v) else v
    save_file(w, str(sub / "sae_weights.safetensors"))


def _meta(sub: Path, **changes):
    meta = json.loads((sub / "cfg.json").read_text())["metadata"]
    return {**meta, **changes}


FALLBACKS = {  # name: (edit of layer_0, error sae-lens (or _from_sae on its object) gives, or None if it loads)
    "unknown architecture": (lambda s: _edit_cfg(s, architecture="jumprelu"), "not a transcoder"),
    "extra cfg key": (lambda s: _edit_cfg(s, some_new_field=1), None),
    "normalize_activations": (lambda s: _edit_cfg(s, normalize_activations="expected_average_only_in"),
                              "normalize_activations"),
    "apply_b_dec_to_input": (lambda s: _edit_cfg(s, apply_b_dec_to_input=True), "apply_b_dec_to_input"),
    "pre-6.0 config": (lambda s: _edit_cfg(s, metadata=_meta(s, sae_lens_version="5.9.0")), "hook_name"),
    "model_from_pretrained_kwargs": (
        lambda s: _edit_cfg(s, metadata=_meta(s, model_from_pretrained_kwargs={"center_writing_weights": False})),
        None),
    "scaling_factor of ones": (lambda s: _edit_weights(s, scaling_factor=lambda w: torch.ones(())), None),
    "missing b_enc": (lambda s: _edit_weights(s, b_enc=None), "b_enc"),
    "extra tensor": (lambda s: _edit_weights(s, W_extra=torch.zeros(3)), "W_extra"),
    "log_threshold": (lambda s: _edit_weights(s, log_threshold=lambda w: w.pop("threshold").log()), "threshold"),
    "misshapen b_dec": (lambda s: _edit_weights(s, b_dec=torch.zeros(5)), "b_dec"),
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_unrecognised_folder_falls_back_to_sae_lens(tmp_path, monkeypatch, model, case):
    import sae_lens

    edit, error = FALLBACKS[case]
    path = _bundle(tmp_path, model, "jumprelu")
    edit(path / "layer_0")
    assert saelens_native.read_folder(path / "layer_0") is None
    assert isinstance(saelens_native.read_folder(path / "layer_1"), saelens_native.NativeTranscoder)
    adapter = ModelAdapter(model)
    if error is None:
        tcs = TranscoderSet.from_dir(path, adapter)
        assert isinstance(tcs[0].sae, sae_lens.SAE)
        assert isinstance(tcs[1].sae, saelens_native.NativeTranscoder)
        _assert_same(tcs, _with_sae_lens(monkeypatch, path, adapter))
        return
    with pytest.raises(LoadError, match=error) as native_err:
        TranscoderSet.from_dir(path, adapter)
    with pytest.raises(LoadError) as sae_lens_err:
        _with_sae_lens(monkeypatch, path, adapter)
    assert str(native_err.value) == str(sae_lens_err.value)


def test_native_path_imports_no_sae_lens(tmp_path, model):
    path = _bundle(tmp_path, model, "jumprelu_skip")
    code = (
        "import sys\n"
        "from circuitgraph.adapters.loading import load_model_dir\n"
        "from circuitgraph.dictionaries import TranscoderSet\n"
        f"a = load_model_dir({str(path.parent / 'model')!r})\n"
        f"t = TranscoderSet.from_dir({str(path)!r}, a)\n"
        "print(type(t[0].sae).__name__, len(t), sorted(m for m in sys.modules if m.split('.')[0] == 'sae_lens'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["NativeTranscoder", "2", "[]"]
