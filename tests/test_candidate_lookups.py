"""Validation on a ``max_neuron_nodes`` graph looks its writers and readers up one at a time among
the candidates held as arrays: no id map of every candidate is built (on SmolLM2-135M at 256
tokens those maps of 11.7 M candidates took 6.9 GB, kept for the graph's lifetime), and the
lookups equal the maps'."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

import circuitgraph
from circuitgraph.testing.synthetic import save_bundle, tiny_config, tiny_model
from circuitgraph.validation import run_check


def test_a_check_on_candidates_builds_no_map_of_every_candidate():
    cfg = tiny_config(norm="RMS", mlp="gated", positional="rotary", n_layers=2, d_model=32, d_mlp=128, n_ctx=32,
                      d_vocab=50)
    root = Path(tempfile.mkdtemp(prefix="cg-candidate-lookups-"))
    save_bundle(root, tiny_model(cfg))
    g = np.random.default_rng(0)
    spec = circuitgraph.spec.load_spec({
        "format_version": 1, "model": {"path": str(root / "model")},
        "prompt": {"tokens": [1] + g.integers(2, 50, 15).tolist()}, "targets": [{"logit": 3}],
        "graph": {"mlp": "neurons", "attention": "frozen", "max_neuron_nodes": 6},
        "validate": [{"predicted_vs_actual": {"k": 4}}]})
    graph = circuitgraph.build(spec)
    ctx = graph.context
    tables = ctx._tables
    assert tables.nodes.has_candidates and len(tables.readers.rows) > 1000
    result = run_check(graph, spec.validate[0], spec=spec).result
    # the frozen runs removed each node exactly (their lookups found its writes and the targets)
    assert result.frozen_max_deviation is not None and result.frozen_max_deviation < 1e-4
    assert ctx._reader_index is None and tables._writer_index is None
    # each lookup equals the full maps' (built here, after the check)
    ids = [n.id for n in graph.nodes if n.kind == "neuron"] + [t for t, _ in graph.targets]
    ids += [tables.nodes.node_id(r) for r in (0, len(tables.nodes) // 2, len(tables.nodes) - 1)]
    slots = {n: tables.writer_slots(n) for n in ids}
    readers = {n: ctx._reader_of(n) for n in ids}
    assert any(slots.values()) and any(r is not None for r in readers.values())
    full_w, full_r = tables.writer_index(), ctx._readers()
    for n in ids:
        assert slots[n] == full_w.get(n, []), n
        assert readers[n] == full_r.get(n), n
    direction = ctx.reader(graph.targets[0][0]).direction
    assert torch.isfinite(direction).all()
