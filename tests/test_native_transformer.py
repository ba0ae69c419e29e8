"""The torch-only HookedTransformer (circuitgraph.adapters.native_transformer) against TransformerLens.

Every supported configuration: the same weights give the same logits and the same value at every
hook point as HookedTransformer (float64: relative 1e-12; float32: float tolerance), the frozen
model (replacement hooks on hook_scale and hook_pattern) agrees, a folder saved as the benchmarks
save it loads natively and its graph equals the one built through TransformerLens; a run on such a
folder never imports transformer_lens; configurations outside the whitelist fall back to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.adapters.loading import folder_backend, load_model_dir
from circuitgraph.adapters.native_transformer import NativeConfig, NativeTransformer, native_unsupported
from circuitgraph.attribution.build import attribute
from circuitgraph.attribution.linearisation import frozen, linearise
from circuitgraph.dictionaries import TranscoderSet
from circuitgraph.errors import LoadError
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_config, tiny_model

REPO = Path(__file__).resolve().parents[1]

#: the whitelist's configurations: tiny_config keyword arguments, then HookedTransformerConfig overrides
SUPPORTED = {
    "gpt2-ln-gelu_new": (dict(norm="LN", mlp="gelu", positional="learned"), {}),
    "ln-relu-no-attn-scale": (dict(norm="LN", mlp="relu", positional="learned"), {"use_attn_scale": False}),
    "ln-gelu-final-rms": (dict(norm="LN", mlp="gelu", positional="learned"), {"final_rms": True}),
    "ln-gelu-inverse-layer-scale": (dict(norm="LN", mlp="gelu", positional="learned"),
                                    {"scale_attn_by_inverse_layer_idx": True}),
    "llama-rms-gated-rotary-gqa": (dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2),
                                   {"rotary_base": 500000.0}),
    "rms-gated-rotary-partial-adjacent": (dict(norm="RMS", mlp="gated", positional="rotary"),
                                          {"rotary_dim": 4, "rotary_adjacent_pairs": True}),
    "lnpre-relu-rotary": (dict(norm="LNPre", mlp="relu", positional="rotary"), {}),
    "rmspre-gated": (dict(norm="RMSPre", mlp="gated", positional="learned"), {}),
    "rms-gelu-softcaps": (dict(norm="RMS", mlp="gelu", positional="learned", attn_soft_cap=5.0, logit_soft_cap=3.0),
                          {}),
    "ln-gelu-fast": (dict(norm="LN", mlp="gelu", positional="learned"), {"act_fn": "gelu_fast"}),
    "ln-gelu-exact": (dict(norm="LN", mlp="gelu", positional="learned"), {"act_fn": "gelu"}),
    "ln-gelu-pytorch-tanh": (dict(norm="LN", mlp="gelu", positional="learned"), {"act_fn": "gelu_pytorch_tanh"}),
    "rms-silu-ungated": (dict(norm="RMS", mlp="relu", positional="rotary"), {"act_fn": "silu"}),
    "ln-attn-only-rotary": (dict(norm="LN", mlp="gelu", positional="rotary", attn_only=True), {}),
    "no-norm-bidirectional": (dict(norm=None, mlp="relu", positional="learned", attention_dir="bidirectional"), {}),
    "ln-gelu-d-vocab-out": (dict(norm="LN", mlp="gelu", positional="learned"), {"d_vocab_out": 17}),
}
TOKENS = torch.tensor([[1, 5, 7, 2, 3, 9, 4, 11, 6]])


def _tl_model(name: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    from transformer_lens import HookedTransformerConfig

    kw, overrides = SUPPORTED[name]
    cfg = tiny_config(seed=seed, d_model=16, n_heads=2, d_mlp=32, d_vocab=50, **kw)
    # built in its dtype (a float64 model's rotary tables are computed in float64, as load_model_dir builds it)
    cfg = HookedTransformerConfig(**{**{k: v for k, v in cfg.to_dict().items()
                                        if k not in ("n_params", "d_vocab_out", "rotary_dim")}, **overrides,
                                     "dtype": dtype})
    return tiny_model(cfg, seed=seed)


def _native_from(tl) -> NativeTransformer:
    """The native model of a HookedTransformer's config and weights (strict state-dict load)."""
    native = NativeTransformer(NativeConfig.from_kwargs(**dict(tl.cfg.to_dict())))
    buffers = {n for n, _ in tl.named_buffers()}
    native.load_state_dict({k: v for k, v in tl.state_dict().items() if k not in buffers}, strict=False)
    return native.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the largest entry; masked (infinite) entries must match exactly."""
    if not torch.equal(torch.isinf(a), torch.isinf(b)) or not torch.equal(a[torch.isinf(a)], b[torch.isinf(b)]):
        return float("inf")
    a, b = a[torch.isfinite(b)], b[torch.isfinite(b)]
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300)) if b.numel() else 0.0


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_logits_and_every_hook_equal_in_float64(name):
    tl = _tl_model(name)
    assert native_unsupported(dict(tl.cfg.to_dict())) is None
    native = _native_from(tl)
    assert set(native.state_dict()) == set(tl.state_dict())
    assert [n for n, _ in sorted(native.named_parameters())] == [n for n, _ in sorted(tl.named_parameters())]
    assert set(native.hook_dict) == set(tl.hook_dict)
    with torch.no_grad():
        ref_logits, ref = tl.run_with_cache(TOKENS)
        logits, cache = native.run_with_cache(TOKENS)
    assert logits.dtype == torch.float64 and logits.shape == ref_logits.shape
    assert _rel(logits, ref_logits) <= 1e-12
    assert set(cache) == set(ref)
    for key in ref:
        assert cache[key].shape == ref[key].shape, key
        assert _rel(cache[key], ref[key]) <= 1e-12, key
    # the attributes circuitgraph's adapter reads
    a, b = ModelAdapter(native), ModelAdapter(tl)
    assert a.facts == b.facts and a.backend == "native" and b.backend == "transformer_lens"
    for layer in range(a.facts.n_layers):
        for key, value in b.attn_weights(layer).items():
            assert torch.equal(a.attn_weights(layer)[key], value), key


@pytest.mark.parametrize("name", ["gpt2-ln-gelu_new", "llama-rms-gated-rotary-gqa", "rmspre-gated"])
def test_float32_within_float_tolerance(name):
    tl = _tl_model(name, torch.float32)
    native = _native_from(tl)
    with torch.no_grad():
        ref_logits, ref = tl.run_with_cache(TOKENS)
        logits, cache = native.run_with_cache(TOKENS)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    for key in ref:
        torch.testing.assert_close(cache[key], ref[key], rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["gpt2-ln-gelu_new", "llama-rms-gated-rotary-gqa", "ln-attn-only-rotary"])
def test_frozen_replacement_hooks_agree(name):
    """circuitgraph's frozen model (hook_scale and hook_pattern replaced, an extra hook on an MLP
    output) on another prompt: the native model and HookedTransformer give the same logits."""
    tl = _tl_model(name)
    native = _native_from(tl)
    a_tl, a_native = ModelAdapter(tl), ModelAdapter(native)
    lin = linearise(a_tl, TOKENS[0])
    other = torch.tensor([[1, 8, 3, 3, 12, 9, 2, 10, 6]])
    out = {}
    for key, adapter in (("tl", a_tl), ("native", a_native)):
        seen = []

        def halve(value, hook, seen=seen):
            seen.append(hook.name)
            return value * 0.5

        extra = [] if adapter.facts.attn_only else [(adapter.hook_mlp_out(0), halve)]
        with torch.no_grad(), frozen(adapter, lin, extra_hooks=extra) as model:
            out[key] = model(other)
        out[key + "_seen"] = seen
        assert not any(p._forward_hooks for p in adapter.model.hook_dict.values())  # removed on exit
    assert _rel(out["native"], out["tl"]) <= 1e-12
    assert out["native_seen"] == out["tl_seen"]
    # and the frozen model is not the free one: the replacement took effect
    with torch.no_grad():
        assert _rel(native(other), out["native"]) > 1e-6


def test_to_transformer_lens_round_trip():
    tl = _tl_model("llama-rms-gated-rotary-gqa")
    native = _native_from(tl)
    back = native.to_transformer_lens()
    assert type(back).__name__ == "HookedTransformer"
    with torch.no_grad():
        assert torch.equal(back(TOKENS), tl(TOKENS))
        zero = [("blocks.1.hook_attn_out", lambda value, hook: value * 0)]
        assert torch.equal(native.run_with_hooks(TOKENS, fwd_hooks=zero), tl.run_with_hooks(TOKENS, fwd_hooks=zero))
    adapter = ModelAdapter(native)
    assert adapter.transformer_lens_model() is adapter.transformer_lens_model()  # converted once
    assert ModelAdapter(tl).transformer_lens_model() is tl


def test_to_float64_updates_the_config():
    """build.attribute moves a float32 model to float64 with ``model.to``; the norms cast to cfg.dtype."""
    tl = _tl_model("gpt2-ln-gelu_new", torch.float32)
    native = _native_from(tl)
    tl.to(torch.float64)
    native.to(torch.float64)
    assert native.cfg.dtype == torch.float64
    with torch.no_grad():
        assert _rel(native(TOKENS), tl(TOKENS)) <= 1e-12


# ----------------------------------------------------------------------------- folders
def _bundle(tmp_path: Path, name: str, dtype=torch.float32) -> tuple[Path, list[int]]:
    tl = _tl_model(name, dtype)
    tcs = None if tl.cfg.attn_only else random_transcoders(tl, d_sae=24, seed=0)
    tokens = TOKENS[0].tolist()
    return save_bundle(tmp_path / name, tl, tcs, prompt_tokens=tokens), tokens


@pytest.mark.parametrize("name", ["gpt2-ln-gelu_new", "llama-rms-gated-rotary-gqa"])
def test_folder_loads_natively_and_the_graph_equals_transformer_lens(tmp_path, name):
    path, tokens = _bundle(tmp_path, name)
    assert folder_backend(path / "model") == "native"
    graphs = {}
    for backend in ("auto", "transformer_lens"):
        adapter = load_model_dir(path / "model", dtype="float64", backend=backend)
        assert adapter.backend == ("native" if backend == "auto" else "transformer_lens")
        assert adapter.describe()["backend"] == adapter.backend
        tcs = TranscoderSet.from_dir(path / "transcoders", adapter, dtype=torch.float64)
        graphs[backend] = attribute(adapter, tokens, tcs, dtype=torch.float64)
    a, b = graphs["auto"], graphs["transformer_lens"]
    assert [n.id for n in a.nodes] == [n.id for n in b.nodes]
    assert np.array_equal(a.edge_source, b.edge_source) and np.array_equal(a.edge_target, b.edge_target)
    np.testing.assert_allclose(a.edge_weight, b.edge_weight, rtol=1e-12, atol=1e-12 * np.abs(b.edge_weight).max())
    for x, y in zip(a.nodes, b.nodes, strict=False):
        for field in ("activation", "constant"):
            u, v = getattr(x, field), getattr(y, field)
            assert (u is None) == (v is None) and (u is None or abs(u - v) <= 1e-12 * max(1.0, abs(v))), (x.id, field)
    assert a.check_completeness().ok(1e-10)


def test_unsupported_config_falls_back_and_native_fails_in_one_line(tmp_path):
    tl = tiny_model(norm="RMS", mlp="gated", positional="rotary", post_norms=True)  # Gemma-2 style post-norms
    path = save_bundle(tmp_path / "postnorm", tl, random_transcoders(tl, seed=0), prompt_tokens=[1, 4, 2, 7])
    assert native_unsupported(dict(tl.cfg.to_dict())).startswith("use_normalization_before_and_after is True")
    assert folder_backend(path / "model") == "transformer_lens"
    adapter = load_model_dir(path / "model")
    assert adapter.backend == "transformer_lens"
    tcs = TranscoderSet.from_dir(path / "transcoders", adapter)
    assert attribute(adapter, [1, 4, 2, 7], tcs).check_completeness().ok(1e-4)
    with pytest.raises(LoadError) as err:
        load_model_dir(path / "model", backend="native")
    message = str(err.value)
    assert "\n" not in message and "use_normalization_before_and_after" in message and "backend" in message


def test_spec_backend_key():
    from circuitgraph.errors import SpecError
    from circuitgraph.spec.model import ModelSpec

    assert ModelSpec(path="m").backend == "auto"
    assert ModelSpec(path="m", backend="native").backend == "native"
    with pytest.raises(SpecError, match="backend"):
        ModelSpec(name="gpt2", backend="native")
    with pytest.raises(SpecError):
        ModelSpec(path="m", backend="jax")


_WATCH = textwrap.dedent("""
    import sys
    MARKER = sys.argv[1]
    class Watch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("transformer_lens", "transformers"):
                with open(MARKER, "a") as f:  # closed now: the CLI ends with os._exit
                    f.write(name + "\\n")
            return None
    sys.meta_path.insert(0, Watch())
    sys.argv = ["circuitgraph", "run", "-q", sys.argv[2]]
    from circuitgraph.cli.main import main
    main()
""")


@pytest.mark.parametrize("backend", ["auto", "transformer_lens"])
def test_cli_run_never_imports_transformer_lens(tmp_path, backend):
    path, tokens = _bundle(tmp_path, "llama-rms-gated-rotary-gqa")
    spec = {"format_version": 1, "model": {"path": str(path / "model"), "backend": backend},
            "transcoders": {"path": str(path / "transcoders")}, "prompt": {"tokens": tokens},
            "targets": [{"top_logits": {"max_n": 2}}], "prune": {"node_threshold": 0.8, "edge_threshold": 0.98},
            "export": {"json": str(tmp_path / "out" / "graph.json")}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    marker = tmp_path / "imported.txt"
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _WATCH, str(marker), str(tmp_path / "spec.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    graph = json.loads((tmp_path / "out" / "graph.json").read_text())
    imported = marker.read_text().split() if marker.exists() else []
    if backend == "auto":
        assert graph["metadata"]["model"]["backend"] == "native"
        assert imported == [], imported[:5]
    else:
        assert graph["metadata"]["model"]["backend"] == "transformer_lens"
        assert "transformer_lens" in imported


@pytest.mark.parametrize("kwargs", [
    dict(d_model=16, d_head=4, n_layers=2, n_ctx=8, d_vocab=30, act_fn="gelu_new"),
    dict(d_model=16, d_head=4, n_heads=4, n_layers=2, n_ctx=8, d_vocab=30, act_fn="silu", gated_mlp=True,
         normalization_type="RMS", positional_embedding_type="rotary", n_key_value_heads=2, d_mlp=24),
    dict(d_model=12, d_head=3, n_layers=1, n_ctx=8, d_vocab=30, attn_only=True, use_attn_scale=False),
])
def test_derived_defaults_as_transformer_lens_computes_them(kwargs):
    from transformer_lens import HookedTransformerConfig

    ref = HookedTransformerConfig(**kwargs, device="cpu")
    mine = NativeConfig.from_kwargs(**kwargs, device="cpu")
    for key in ("n_heads", "d_mlp", "d_vocab_out", "rotary_dim", "attn_scale", "eps", "n_key_value_heads",
                "use_attn_scale", "final_rms", "rotary_base", "normalization_type", "act_fn"):
        assert getattr(mine, key) == getattr(ref, key), key
    assert type(mine.attn_scale) in (int, float) or mine.attn_scale == -1.0
