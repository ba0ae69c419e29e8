"""The dictionary-format registry (circuitgraph/spec/dictionaries.py): a new on-disk format is one
registry record plus its loader, and the spec, detection, loading and the dry run's footprint
all follow from it.

The toy format here stores each layer as ``toy_<i>.npz`` (``W_enc (d_model, d_sae)``, ``b_enc``,
``W_dec (d_sae, d_model)``, ``b_dec``; ReLU, reading ln2's normalized input); its loader is the
function below.  A spec naming it builds a graph whose feature activations are recomputed here
from the npz files and TransformerLens's cache (independent of the loader), and that is complete.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from circuitgraph.dictionaries import Dictionary, TranscoderSet, detect_format
from circuitgraph.dictionaries.formats import dictionary_footprint
from circuitgraph.dictionaries.layer_formats import _make_layer
from circuitgraph.dictionaries.protocol import require_dictionary
from circuitgraph.errors import SpecError
from circuitgraph.spec import load_spec
from circuitgraph.spec.dictionaries import DICTIONARY_FORMATS, DictionaryFormat, register_format
from circuitgraph.spec.model import TranscodersSpec
from circuitgraph.testing.synthetic import save_bundle, tiny_model

TOKENS = [1, 5, 7, 9, 4, 3]
D_SAE = 12


# ----------------------------------------------------------------------------- the toy format's code
def detect_toy(path: Path) -> bool:
    return next(path.glob("toy_*.npz"), None) is not None


def files_toy(path: Path) -> list[Path]:
    return sorted(path.glob("toy_*.npz"))


def load_toy(path: Path, adapter, *, layers, dtype, lazy, config) -> TranscoderSet:
    out = {}
    for f in files_toy(path):
        layer = int(f.stem.split("_")[1])
        if layers is not None and layer not in layers:
            continue
        with np.load(f) as z:
            t = {k: torch.from_numpy(z[k]) for k in ("W_enc", "b_enc", "W_dec", "b_dec")}
        out[layer] = _make_layer(adapter, layer, f, **t, site="normalized", hook_out="hook_mlp_out",
                                 activation="relu", architecture="toy_relu", dtype=dtype)
    return TranscoderSet(out, {"path": str(path)}, format="toy")


TOY = DictionaryFormat("toy", "toy_<i>.npz (the registry's test format)", f"{__name__}:detect_toy",
                       f"{__name__}:load_toy", f"{__name__}:files_toy", footprint="whole")


@pytest.fixture
def toy_registered():
    register_format(TOY)
    try:
        yield TOY
    finally:
        DICTIONARY_FORMATS.pop(TOY.name, None)


def _toy_bundle(tmp_path: Path):
    model = tiny_model(seed=2, n_layers=2)
    bundle = save_bundle(tmp_path / "bundle", model)
    rng = np.random.default_rng(0)
    D = model.cfg.d_model
    toy = tmp_path / "toy"
    toy.mkdir()
    weights = {}
    for layer in range(model.cfg.n_layers):
        w = {"W_enc": rng.normal(size=(D, D_SAE)), "b_enc": rng.normal(size=D_SAE) * 0.1,
             "W_dec": rng.normal(size=(D_SAE, D)) * 0.1, "b_dec": rng.normal(size=D) * 0.01}
        weights[layer] = w
        np.savez(toy / f"toy_{layer}.npz", **{k: v.astype(np.float32) for k, v in w.items()})
    return model, bundle, toy, weights


def test_a_registered_format_runs_through_the_spec(tmp_path, toy_registered):
    from circuitgraph.pipeline.runner import build, prepare

    model, bundle, toy, weights = _toy_bundle(tmp_path)
    assert detect_format(toy) == "toy"
    spec = load_spec({"format_version": 1, "model": {"path": str(bundle / "model")},
                      "transcoders": {"path": str(toy), "format": "toy"}, "prompt": {"tokens": TOKENS},
                      "graph": {"dtype": "float64"}})
    p = prepare(spec)
    assert isinstance(p.transcoders, Dictionary) and p.transcoders.format == "toy"
    graph = build(spec)
    assert graph.check_completeness().max_violation < 1e-9
    # feature activations from the files and TransformerLens's cache, not through the loader
    _, cache = p.adapter.model.run_with_cache(torch.tensor([TOKENS]))
    features = [n for n in graph.nodes if n.kind == "feature"]
    assert features
    for n in features:
        x = cache[f"blocks.{n.layer}.ln2.hook_normalized"][0, n.position].double().numpy()
        w = weights[n.layer]
        act = max(float(x @ w["W_enc"][:, n.index].astype(np.float32) + np.float32(w["b_enc"][n.index])), 0.0)
        assert n.activation == pytest.approx(act, rel=1e-4, abs=1e-6)
    d_sae, on_disk, in_memory, note = dictionary_footprint(toy)
    assert on_disk == in_memory == sum(f.stat().st_size for f in files_toy(toy)) and "toy" in note


def test_the_spec_accepts_exactly_the_registered_formats(toy_registered):
    assert TranscodersSpec(path="x", format="toy").format == "toy"
    DICTIONARY_FORMATS.pop("toy")
    with pytest.raises(SpecError, match="unknown dictionary format 'toy'; expected one of saelens"):
        TranscodersSpec(path="x", format="toy")
    register_format(TOY)


def test_the_built_in_formats_are_records_with_their_functions():
    from circuitgraph.dictionaries import FORMATS

    assert tuple(DICTIONARY_FORMATS)[: len(FORMATS)] == FORMATS
    for record in DICTIONARY_FORMATS.values():
        for role in ("detect", "load", "layer_files"):
            assert callable(record.function(role)), (record.name, role)
    with pytest.raises(ValueError, match="registered already"):
        register_format(DICTIONARY_FORMATS["saelens"])


def test_require_dictionary_names_what_needs_the_dictionaries():
    ts = TranscoderSet({}, {"path": "toy"})
    assert require_dictionary(ts, "a feature unit") is ts
    with pytest.raises(SpecError, match="a feature unit needs the run's dictionaries"):
        require_dictionary(None, "a feature unit")
