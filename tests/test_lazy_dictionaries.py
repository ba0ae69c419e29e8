"""Per-layer dictionaries in safetensors layouts stay on disk: only what a prompt needs is read."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import attribute
from circuitgraph.dictionaries import load_dictionaries
from circuitgraph.dictionaries.formats import dictionary_footprint
from circuitgraph.dictionaries.stored import StoredRows
from circuitgraph.testing.synthetic import random_layer_dictionary, save_layer_dictionary, tiny_model

GPT2 = dict(norm="LN", mlp="gelu", positional="learned", n_layers=3)
TOKENS = [1, 5, 7, 9, 4, 3, 11]
REPO = Path(__file__).resolve().parents[1]


def test_stored_rows_read_any_feature_set(tmp_path):
    from safetensors.torch import save_file

    W = torch.randn(6, 40)  # stored (d_model, d_sae): features along dim 1
    D = torch.randn(40, 3, 6)  # (d_sae, n_layers, d_model)
    save_file({"w_enc": W, "w_dec": D}, str(tmp_path / "p.safetensors"))
    enc = StoredRows(tmp_path / "p.safetensors", "w_enc", feature_dim=1)
    dec = StoredRows(tmp_path / "p.safetensors", "w_dec", tail=(slice(1, None),))
    idx = torch.tensor([7, 3, 4, 7, 39])
    torch.testing.assert_close(enc.rows(idx), W[:, idx].T)
    torch.testing.assert_close(dec.rows(idx), D[idx, 1:])
    assert enc.shape() == (40, 6) and dec.shape() == (40, 2, 6)
    assert dec.bytes_read == 4 * 2 * 6 * 4  # four distinct rows of (2, 6) float32
    torch.testing.assert_close(enc.all(), W.T)
    assert enc.rows(torch.tensor([], dtype=torch.long)).shape == (0, 6)


@pytest.mark.parametrize("fmt", ["circuit_tracer_transcoder_set", "gemmascope2", "eleuther_topk"])
def test_lazy_rows_equal_the_eager_graph(tmp_path, fmt):
    """The graph from rows read off disk equals the graph from matrices in memory, and only the
    active features' decoder rows were read."""
    model = tiny_model(**GPT2)
    act = {"circuit_tracer_transcoder_set": "relu", "gemmascope2": "jump_relu", "eleuther_topk": "topk"}[fmt]
    d = save_layer_dictionary(tmp_path / fmt, random_layer_dictionary(model, d_sae=512, activation=act), fmt)
    adapter = ModelAdapter(model)
    lazy = load_dictionaries(d, adapter, lazy=True)
    assert all(tc.stored and tc.lazy for tc in lazy.layers.values())
    dense = 3 * 2 * 512 * 16 * 4  # every encoder and decoder
    assert lazy.resident_bytes() < dense / 10  # biases and thresholds: 2 of the 2 * d_model + 2 values per feature
    g = attribute(adapter, TOKENS, lazy)
    for layer, tc in lazy.layers.items():
        active = {n.index for n in g.nodes if n.kind == "feature" and n.layer == layer}
        assert active and tc._dec.bytes_read == len(active) * 16 * 4  # each active feature's row, once
        assert tc._enc_cache is None  # lazy: the encoder is not kept
    eager = attribute(adapter, TOKENS, lazy.in_memory())
    assert g.metadata["completeness"]["max_relative_violation"] < 1e-5
    assert [n.id for n in g.nodes] == [n.id for n in eager.nodes]
    np.testing.assert_array_equal(g.edge_weight, eager.edge_weight)


def test_dry_run_counts_rows_not_files(tmp_path):
    model = tiny_model(**GPT2)
    d = save_layer_dictionary(tmp_path / "ts", random_layer_dictionary(model, d_sae=4096), "circuit_tracer_transcoder_set")
    d_sae, on_disk, in_memory, note = dictionary_footprint(d)
    assert d_sae == 4096 and on_disk > 3 * 2 * 4096 * 16 * 4
    assert in_memory < 0.6 * on_disk  # the encoders and the biases, no decoder
    assert "read into memory" in note and "circuit_tracer_transcoder_set" in note
    _, _, busy, _ = dictionary_footprint(d, active_fraction=0.5, n_pos=8)
    assert busy > in_memory


_RSS = """
import json, sys, torch
from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import attribute
from circuitgraph.dictionaries import load_dictionaries
from circuitgraph.testing.synthetic import tiny_model

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
model = tiny_model(norm="LN", mlp="gelu", positional="learned", n_layers=3)
adapter = ModelAdapter(model)
tokens = [1, 5, 7, 9, 4, 3, 11]
lazy = load_dictionaries(sys.argv[1], adapter, lazy=True)
g = attribute(adapter, tokens, lazy)
start = rss()
g = attribute(adapter, tokens, lazy)  # a second prompt run: what the lazy dictionary holds is the same
after_lazy = rss()
eager = lazy.in_memory()
g2 = attribute(adapter, tokens, eager)
after_eager = rss()
same = bool((g.edge_weight == g2.edge_weight).all())
print(json.dumps({"start": start, "lazy": after_lazy, "eager": after_eager, "same": same,
                  "held": lazy.resident_bytes(), "held_eager": eager.resident_bytes()}))
"""


def _wide_transcoder_set(d: Path, n_layers: int, d_model: int, d_sae: int, n_live: int) -> Path:
    """A circuit-tracer transcoder_set whose features are all dead but ``n_live`` per layer."""
    import yaml
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    (d / "config.yaml").write_text(yaml.safe_dump({"model_kind": "transcoder_set", "feature_input_hook": "hook_resid_mid",
                                                   "feature_output_hook": "hook_mlp_out"}))
    for l in range(n_layers):
        b_enc = torch.full((d_sae,), -1e4)
        b_enc[:n_live] = 0.0
        save_file({"W_enc": torch.randn(d_sae, d_model, generator=gen), "W_dec": torch.randn(d_sae, d_model, generator=gen),
                   "b_enc": b_enc, "b_dec": torch.zeros(d_model)}, str(d / f"layer_{l}.safetensors"))
    return d


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc/self/status")
def test_memory_held_is_the_active_rows_not_the_dictionary(tmp_path):
    """In a fresh process: with a 48 MiB dictionary left on disk, the resident memory after a
    run is far below holding the dictionary (the eager path, measured after it), and the graphs
    are the same."""
    d_sae = 2**17
    d = _wide_transcoder_set(tmp_path / "wide", 3, 16, d_sae, n_live=32)
    size = 3 * 2 * d_sae * 16 * 4
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_RSS), str(d)], capture_output=True, text=True,
                         cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["same"]
    assert r["held"] < 0.05 * size and r["held_eager"] > size
    assert r["lazy"] - r["start"] < 0.25 * size, r  # a second run holds no more than the first
    assert r["eager"] - r["lazy"] > 0.75 * size, r  # the eager path holds the matrices
