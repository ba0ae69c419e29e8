"""sae-lens ``save_model`` folders read lazily (``TranscoderSet.from_dir(lazy=True)``, the default
above 1 GiB of encoders): the same graph as the eager path, bit for bit, while each layer's
encoder is read once per prompt and not kept, and only the active features' decoder rows are read."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from circuitgraph.adapters import ModelAdapter
from circuitgraph.attribution import attribute
from circuitgraph.dictionaries import TranscoderSet, load_dictionaries
from circuitgraph.dictionaries.formats import dictionary_footprint
from circuitgraph.dictionaries.stored import StoredRows
from circuitgraph.testing.synthetic import random_transcoders, save_bundle, tiny_model

TOKENS = [1, 5, 7, 9, 4, 3, 11, 2]
FAMILIES = {"gpt2": dict(norm="LN", mlp="gelu", positional="learned", n_layers=3),
            "llama": dict(norm="RMS", mlp="gated", positional="rotary", n_layers=3)}


def _folder(tmp_path, model, kind, input_site):
    tcs = random_transcoders(model, d_sae=64, kind=kind, input_site=input_site)
    return save_bundle(tmp_path / f"{kind}-{input_site}", model, tcs) / "transcoders"


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("kind,input_site", [("relu", "normalized"), ("jumprelu", "normalized"),
                                             ("skip", "raw"), ("jumprelu_skip", "mlp_input")])
def test_lazy_saelens_graph_equals_eager(tmp_path, family, kind, input_site):
    model = tiny_model(**FAMILIES[family])
    path = _folder(tmp_path, model, kind, input_site)
    adapter = ModelAdapter(model)
    eager = TranscoderSet.from_dir(path, adapter, lazy=False)
    lazy = load_dictionaries(path, adapter, lazy=True)
    assert all(not t.stored and t.sae is not None for t in eager.layers.values())
    assert all(t.stored and t.lazy and t.sae is None for t in lazy.layers.values())
    g_eager = attribute(adapter, TOKENS, eager)
    g_lazy = attribute(adapter, TOKENS, lazy)
    assert [n.id for n in g_lazy.nodes] == [n.id for n in g_eager.nodes]
    assert sum(n.kind == "feature" for n in g_lazy.nodes) > 0
    if input_site == "mlp_input":  # gamma applied to rows as read (float32) vs folded in float64: last bits
        np.testing.assert_allclose(g_lazy.edge_weight, g_eager.edge_weight, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(g_lazy.edge_weight, g_eager.edge_weight)
    assert g_lazy.metadata["completeness"]["max_relative_violation"] < 1e-5


def test_each_encoder_is_read_once_per_prompt_and_not_kept(tmp_path, monkeypatch):
    model = tiny_model(**FAMILIES["llama"])
    path = _folder(tmp_path, model, "relu", "normalized")
    adapter = ModelAdapter(model)
    lazy = TranscoderSet.from_dir(path, adapter, lazy=True)
    whole_reads: Counter = Counter()
    real = StoredRows.stored_matrix_raw

    def counted(self):
        whole_reads[(self.path.parent.name, self.key)] += 1
        return real(self)

    monkeypatch.setattr(StoredRows, "stored_matrix_raw", counted)
    for prompt in (TOKENS, TOKENS[:5] + [8, 6]):
        whole_reads.clear()
        for tc in lazy.layers.values():
            tc._dec.bytes_read = 0
        g = attribute(adapter, prompt, lazy)
        # one whole read of each layer's encoder per prompt (activations), none of any decoder
        assert whole_reads == Counter({(f"layer_{l}", "W_enc"): 1 for l in lazy.layers}), whole_reads
        d_model = model.cfg.d_model
        for layer, tc in lazy.layers.items():
            active = {n.index for n in g.nodes if n.kind == "feature" and n.layer == layer}
            assert active and tc._dec.bytes_read == len(active) * d_model * 4  # active rows, once each
            assert tc._enc_cache is None
            ids, rows = tc._active_rows  # what stays: the active features' encoder rows only
            assert set(ids.tolist()) >= active and rows.shape == (len(ids), d_model)
        assert lazy.resident_bytes() < 0.5 * sum(2 * tc.d_sae * d_model * 4 for tc in lazy.layers.values())


def test_default_is_lazy_by_size_and_dry_run_counts_it(tmp_path, monkeypatch):
    model = tiny_model(**FAMILIES["gpt2"])
    path = _folder(tmp_path, model, "relu", "normalized")
    adapter = ModelAdapter(model)
    assert not any(t.stored for t in TranscoderSet.from_dir(path, adapter).layers.values())  # small: eager
    monkeypatch.setattr("circuitgraph.dictionaries.transcoders.LAZY_ENCODER_BYTES", 1000)
    monkeypatch.setattr("circuitgraph.dictionaries.formats.LAZY_ENCODER_BYTES", 1000)
    assert all(t.stored and t.lazy for t in TranscoderSet.from_dir(path, adapter).layers.values())
    d_sae, on_disk, in_memory, note = dictionary_footprint(path, active_fraction=0.1, n_pos=4)
    assert d_sae == 64 and in_memory < 0.6 * on_disk and "one encoder layer at a time" in note
