"""Validation on a ``max_neuron_nodes`` graph looks its writers and readers up one at a time among
the candidates held as arrays: no id map of every candidate is built (on SmolLM2-135M at 256
tokens those maps of 11.7 M candidates took 6.9 GB, kept for the graph's lifetime), and the
lookups equal the maps'."""

from __future__ import annotations

import tempfile
import tracemalloc
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
    n_rows = len(ctx.attributed_nodes)  # the candidates are rows of the node table
    assert n_rows > 3000
    tracemalloc.start()
    result = run_check(graph, spec.validate[0], spec=spec).result
    kept, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # the frozen runs removed each node exactly (their lookups found its writes and the targets)
    assert result.frozen_max_deviation is not None and result.frozen_max_deviation < 1e-4
    # an id map of every candidate keeps ~470 bytes a candidate (measured); the lookups keep none
    assert kept < 50 * n_rows, (kept, n_rows)
    # each lookup equals the full maps' (built here, after the check, by the iterations over every node)
    ids = [n.id for n in graph.nodes if n.kind == "neuron"] + [t for t, _ in graph.targets]
    ids += [ctx.attributed_nodes[r].id for r in (0, n_rows // 2, n_rows - 1)]
    before = {n: (ctx.writes(n), ctx.reader(n)) for n in ids}
    assert any(w for w, _ in before.values()) and any(r is not None for _, r in before.values())
    all_writers = dict(ctx.writers())
    assert len(ctx.reader_ids()) > 1000
    for n in ids:
        (w0, r0), (w1, r1) = before[n], (ctx.writes(n), ctx.reader(n))
        assert [(w.location, w.position) for w in w0] == [(w.location, w.position) for w in w1]
        assert all(torch.equal(a.vector, b.vector) for a, b in zip(w0, w1, strict=True))
        assert len(w0) == len(all_writers.get(n, []))
        assert (r0 is None) == (r1 is None), n
        if r0 is not None:
            assert (r0.location, r0.position, r0.own_constant) == (r1.location, r1.position, r1.own_constant)
            assert torch.equal(r0.direction, r1.direction)
