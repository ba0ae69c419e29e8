"""Every class of broken bundle found by probing: one line on stderr, exit 2, nothing written.

Each case copies the repository's GPT-2-style example bundle (examples/fixtures) into a
temporary folder, breaks one thing, and runs ``circuitgraph run`` on it.  ``validate`` and
``run --dry-run`` must also answer cleanly: exit 0 (when the problem only shows once the
model is built) or the same one-line error.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from circuitgraph.cli.main import app
from tests.helpers.bundles import SHARED_FIXTURES

BUNDLE = SHARED_FIXTURES / "example-gpt2"


def _edit_json(rel: str, **changes) -> Callable[[Path], None]:
    def edit(bundle: Path) -> None:
        f = bundle / rel
        data = json.loads(f.read_text())
        for key, value in changes.items():
            if value is _DROP:
                data.pop(key, None)
            else:
                data[key] = value
        f.write_text(json.dumps(data))

    return edit


_DROP = object()


def _write(rel: str, content: bytes) -> Callable[[Path], None]:
    def edit(bundle: Path) -> None:
        f = bundle / rel
        if f.is_dir() and not f.is_symlink():
            shutil.rmtree(f)
        elif f.exists() or f.is_symlink():
            f.unlink()
        f.write_bytes(content)

    return edit


def _truncate(rel: str, keep: float) -> Callable[[Path], None]:
    def edit(bundle: Path) -> None:
        f = bundle / rel
        data = f.read_bytes()
        f.write_bytes(data[: int(len(data) * keep)])

    return edit


def _retensor(rel: str, name: str, change: Callable) -> Callable[[Path], None]:
    def edit(bundle: Path) -> None:
        from safetensors.numpy import load_file, save_file

        f = bundle / rel
        tensors = load_file(str(f))
        new = change(tensors[name])
        if new is None:
            del tensors[name]
        else:
            tensors[name] = np.ascontiguousarray(new)
        save_file(tensors, str(f))

    return edit


def _corrupt_offsets(rel: str) -> Callable[[Path], None]:
    def edit(bundle: Path) -> None:
        f = bundle / rel
        data = f.read_bytes()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8: 8 + n])
        first = next(k for k in header if k != "__metadata__")
        header[first]["data_offsets"] = [0, 10**12]
        raw = json.dumps(header).encode()
        f.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])

    return edit


def _layer_is_file(bundle: Path) -> None:
    shutil.rmtree(bundle / "transcoders" / "layer_1")
    (bundle / "transcoders" / "layer_1").write_text("not a folder")


def _layer_unreadable(bundle: Path) -> None:
    os.chmod(bundle / "transcoders" / "layer_1", 0)


def _layer_dangling(bundle: Path) -> None:
    shutil.rmtree(bundle / "transcoders" / "layer_1")
    os.symlink(bundle / "nowhere", bundle / "transcoders" / "layer_1")


CFG, W, TOK = "model/config.json", "model/model.safetensors", "tokenizer/tokenizer.json"
TC0 = "transcoders/layer_0"

#: (case, how to break the bundle, a piece of the expected message)
CASES = [
    ("config not json", _write(CFG, b"{not json"), "not valid JSON"),
    ("config not utf-8", _write(CFG, b'{"d_model": "\xff\xfe"}'), "not UTF-8"),
    ("config a list", _write(CFG, b"[1, 2]"), "JSON object"),
    ("config empty", _write(CFG, b""), "not valid JSON"),
    ("config string for int", _edit_json(CFG, d_model="32"), "d_model: expected an integer"),
    ("config bool for int", _edit_json(CFG, n_heads=True), "n_heads: expected an integer"),
    ("config zero size", _edit_json(CFG, d_mlp=0), "d_mlp: must be between"),
    ("config negative size", _edit_json(CFG, n_layers=-1), "n_layers: must be between"),
    ("config float size", _edit_json(CFG, d_head=8.5), "d_head: expected an integer"),
    ("config unknown normalization", _edit_json(CFG, normalization_type="BatchNorm"), "normalization_type"),
    ("config unknown act_fn", _edit_json(CFG, act_fn="swish2"), "act_fn"),
    ("config without act_fn", _edit_json(CFG, act_fn=_DROP), "act_fn is not given"),
    ("config huge n_ctx", _edit_json(CFG, n_ctx=10**9), "n_ctx"),
    ("config n_ctx too big for weights", _edit_json(CFG, n_ctx=200_000), "n_ctx"),
    ("config sizes too big for weights", _edit_json(CFG, d_model=8192, d_mlp=32768), "parameters"),
    ("config unknown field", _edit_json(CFG, auto_map={"AutoConfig": "x.Y"}), "unknown field 'auto_map'"),
    ("config tokenizer_name", _edit_json(CFG, tokenizer_name="gpt2"), "trust_remote_code"),
    ("config missing d_model", _edit_json(CFG, d_model=_DROP), "missing required field 'd_model'"),
    ("config nan eps", _write(CFG, BUNDLE.joinpath(CFG).read_bytes().replace(b'"eps": 1e-05', b'"eps": NaN')),
     "eps"),
    ("config is a folder", lambda b: ((b / CFG).unlink(), (b / CFG).mkdir()), "config.json"),
    ("config mismatched d_mlp", _edit_json(CFG, d_mlp=64), "does not match config.json"),
    ("weights empty", _write(W, b""), "safetensors"),
    ("weights garbage", _write(W, os.urandom(4096)), "safetensors"),
    ("weights truncated", _truncate(W, 0.5), "safetensors"),
    ("weights header only", _truncate(W, 0.02), "safetensors"),
    ("weights bad offsets", _corrupt_offsets(W), "safetensors"),
    ("weights transposed tensor", _retensor(W, "blocks.0.mlp.W_in", lambda t: t.T), "blocks.0.mlp.W_in"),
    ("weights missing tensor", _retensor(W, "blocks.1.mlp.b_out", lambda t: None), "missing"),
    ("weights wrong dtype", _retensor(W, "embed.W_E", lambda t: t.astype(np.int64)), "floating point"),
    ("tokenizer garbage", _write(TOK, b"{\"version\": 1}"), "tokenizer"),
    ("tokenizer not utf-8", _write(TOK, b"\xff\xfe\x00garbage"), "tokenizer"),
    ("tokenizer truncated", _truncate(TOK, 0.3), "tokenizer"),
    ("tokenizer config garbage", _write("tokenizer/tokenizer_config.json", b"[[["), "tokenizer config"),
    ("tokenizer config wrong type", _write("tokenizer/tokenizer_config.json", b'{"bos_token": 5}'), "bos_token"),
    ("tokenizer pointer dangling", _write("model/tokenizer", b"../nowhere"), "tokenizer"),
    ("tokenizer pointer binary", _write("model/tokenizer", b"\xff\xfe\x00"), "tokenizer"),
    ("transcoder layer is a file", _layer_is_file, "not a folder"),
    ("transcoder layer dangling link", _layer_dangling, "not a folder"),
    pytest.param("transcoder layer unreadable", _layer_unreadable, "cannot be read", id="transcoder layer unreadable",
                 marks=pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                                          reason="permissions do not apply to root")),
    ("transcoder cfg garbage", _write(f"{TC0}/cfg.json", b"{{"), "not valid JSON"),
    ("transcoder cfg a list", _write(f"{TC0}/cfg.json", b"[]"), "JSON object"),
    ("transcoder cfg wrong d_in", _edit_json(f"{TC0}/cfg.json", d_in=16), "layer_0"),
    ("transcoder cfg without d_sae", _edit_json(f"{TC0}/cfg.json", d_sae=_DROP), "d_sae"),
    ("transcoder cfg string d_sae", _edit_json(f"{TC0}/cfg.json", d_sae="128"), "d_sae"),
    ("transcoder cfg unknown architecture", _edit_json(f"{TC0}/cfg.json", architecture="banana"), "layer_0"),
    ("transcoder weights truncated", _truncate(f"{TC0}/sae_weights.safetensors", 0.5), "safetensors"),
    ("transcoder weights garbage", _write(f"{TC0}/sae_weights.safetensors", b"\x00" * 64), "safetensors"),
    ("transcoder wrong shape", _retensor(f"{TC0}/sae_weights.safetensors", "W_enc", lambda t: t[:, :64]), "layer_0"),
    ("transcoder nan weights",
     _retensor(f"{TC0}/sae_weights.safetensors", "b_enc", lambda t: np.full_like(t, np.nan)), "NaN"),
]


def _spec(tmp_path: Path, bundle: Path, **extra) -> Path:
    spec = {
        "format_version": 1,
        "model": {"path": str(bundle / "model")},
        "transcoders": {"path": str(bundle / "transcoders")},
        "prompt": "t36 t37 t23 t55",
        "targets": [{"logit": 5}],
        "export": {"json": str(tmp_path / "out" / "g.json"), "dot": str(tmp_path / "out" / "g.dot")},
        **extra,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _broken(tmp_path: Path, breaker: Callable[[Path], None]) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE, bundle, symlinks=True)
    breaker(bundle)
    return bundle


def _assert_clean(res, needle: str) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output, repr(res.exception))
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert needle in lines[0], (needle, lines[0])


def test_the_unbroken_bundle_runs(tmp_path):
    spec = _spec(tmp_path, _broken(tmp_path, lambda b: None))
    for args in (["validate", str(spec)], ["run", "--dry-run", str(spec)], ["run", "-q", str(spec)]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "g.json").is_file()


@pytest.mark.parametrize("case,breaker,needle",
                         [c if hasattr(c, "marks") else pytest.param(*c, id=c[0]) for c in CASES])
def test_broken_bundle(tmp_path, case, breaker, needle):
    bundle = _broken(tmp_path, breaker)
    spec = _spec(tmp_path, bundle)
    runner = CliRunner()
    try:
        for args in (["validate", str(spec)], ["run", "--dry-run", str(spec)]):
            res = runner.invoke(app, args)
            if res.exit_code != 0:
                _assert_clean(res, "")
        res = runner.invoke(app, ["run", "-q", str(spec)])
        _assert_clean(res, needle)
        assert not (tmp_path / "out").exists(), "a failed run wrote output"
    finally:
        for sub in (bundle / "transcoders").iterdir():
            if sub.is_dir() and not sub.is_symlink():
                os.chmod(sub, 0o755)  # so the temporary folder can be removed


def _direction(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    if callable(content):
        content(path)
    else:
        path.write_bytes(content)
    return path


D_MODEL = 32
DIRECTION_CASES = [
    ("npy garbage", "d.npy", b"\x93NUMPY garbage"),
    ("npy pickled object", "d.npy", lambda p: np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)),
    ("npy matrix", "d.npy", lambda p: np.save(p, np.ones((4, 8)))),
    ("npy strings", "d.npy", lambda p: np.save(p, np.array(["a"] * D_MODEL))),
    ("npy wrong length", "d.npy", lambda p: np.save(p, np.ones(D_MODEL + 1))),
    ("npy nan", "d.npy", lambda p: np.save(p, np.full(D_MODEL, np.nan))),
    ("pt garbage", "d.pt", b"PK\x03\x04 not a torch file"),
    ("pt dict", "d.pt", lambda p: __import__("torch").save({"v": __import__("torch").ones(D_MODEL)}, p)),
    ("json dict", "d.json", b'{"v": [1, 2]}'),
    ("json strings", "d.json", json.dumps(["x"] * D_MODEL).encode()),
    ("json not utf-8", "d.json", b"[\xff]"),
    ("json nested", "d.json", b"[" * 100_000 + b"]" * 100_000),
    ("safetensors two tensors", "d.safetensors",
     lambda p: __import__("safetensors.numpy").numpy.save_file({"a": np.ones(D_MODEL), "b": np.ones(D_MODEL)}, str(p))),
    ("safetensors truncated", "d.safetensors", lambda p: (
        __import__("safetensors.numpy").numpy.save_file({"a": np.ones(D_MODEL)}, str(p)),
        p.write_bytes(p.read_bytes()[:-40]))),
]


@pytest.mark.parametrize("case,name,content", DIRECTION_CASES, ids=[c[0] for c in DIRECTION_CASES])
def test_bad_direction_file(tmp_path, case, name, content):
    path = _direction(tmp_path, name, content)
    spec = _spec(tmp_path, BUNDLE, targets=[{"direction": {"layer": 1, "site": "resid_post", "file": str(path)}}])
    runner = CliRunner()
    for args in (["validate", str(spec)], ["run", "--dry-run", str(spec)], ["run", "-q", str(spec)]):
        res = runner.invoke(app, args)
        if args[0] == "run" and args[1] == "-q" or res.exit_code != 0:
            _assert_clean(res, "targets[0].direction")
    assert not (tmp_path / "out").exists()
