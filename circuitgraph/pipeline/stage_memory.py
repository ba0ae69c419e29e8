"""What a spec's stages after the edge sweep cost in memory: the queries and checks that run on
the full (unpruned) graph, the scores, pruning, and the exports of the pruned graph.

Each cost was measured with :class:`~circuitgraph.pipeline.memory_watch.MemoryWatch` (the
resident memory sampled every 20 ms, per stage) on the real model and on synthetic neuron graphs
of millions of edges (``benchmarks/memory_stages.py``; docs/benchmarks/memory.md has the runs
and the derivation), and rounded up by a margin:

* :data:`FULL_EDGE_BYTES`: bytes per edge of the full graph at the peak of a stage that runs on
  it, counted from what the process held before the sweep (so the 12 stored bytes an edge and
  what earlier stages left cached on the graph are included);
* :data:`RESIDENT_EDGE_BYTES`: bytes per edge of the full graph while the exports run (the
  exports' peak is that plus the pruned graph being written, not the queries' peak plus it);
* :data:`KEPT_EDGE_BYTES`: bytes per edge of the pruned graph while an export writes it;
* the pruned graph keeps at most the edges its JSON or Neuronpedia export writes
  (:func:`circuitgraph.pipeline.runner.export_edge_limit`; pruning keeps the most influential).

:func:`later_stages` turns a spec into the :class:`~circuitgraph.attribution.later_stages.LaterStages`
the engine's memory plan adds to the sweep's peak, so the dry run's advice and the engine's
refusal before the sweep count every stage that will run.
"""

from __future__ import annotations

from circuitgraph.attribution.later_stages import LaterStages
from circuitgraph.export.neuronpedia import DEFAULT_MAX_LINKS
from circuitgraph.spec import Spec
from circuitgraph.spec.export import EXPORT_KINDS

__all__ = ["FULL_EDGE_BYTES", "DEFAULT_FULL_EDGE_BYTES", "RESIDENT_EDGE_BYTES", "KEPT_EDGE_BYTES", "RENDER_BYTES",
           "check_edge_bytes", "later_stages"]

#: bytes per full-graph edge at the peak of each stage on the full graph, counted from the
#: resident memory before the sweep: the stored edges (12), what earlier stages leave cached on
#: the graph (its DAG order, edge indexes: up to 56 measured) and the stage's own working copies.
#: Measured (docs/benchmarks/memory.md) on SmolLM2-135M (48.4 M edges, neuron_top_k 32) and a
#: synthetic neuron graph (6.0 M edges, every stage), the larger of the two, plus about 12%.
#: Every run computes the scores (``scores``) and, with ``prune:``, prunes (``prune``).
FULL_EDGE_BYTES: dict[str, int] = {
    "scores": 40,  # measured 28.6 / 25.2
    "prune": 40,  # 23.6
    "top_paths": 140,  # 124.6 / 112.6
    "influence": 96,  # 78.9
    "direct_logit_attribution": 80,  # 63.3
    "neighbours": 72,  # 55.9
    "subgraph": 80,  # 63.3
    "virtual_weights": 72,  # 56.1
    "scores query": 112,  # 101.2 (after top_paths' caches)
    "predicted_vs_actual": 100,  # 86.3 / 45.0
    "ablate": 100,  # 86.9
    "replacement_fidelity": 72,  # 56.4
    "sign_regimes": 72,  # 56.4
    "faithfulness": 72,  # 56.7
    "diagram influence": 72,  # 56.4
}
#: a query or check not measured: the heaviest measured one
DEFAULT_FULL_EDGE_BYTES = max(FULL_EDGE_BYTES.values())
#: bytes per full-graph edge while the exports run: the stored edges and the caches of the
#: stages before (measured up to 45 on the real model, 56 on the synthetic graph)
RESIDENT_EDGE_BYTES = 64
#: bytes per pruned-graph edge while each export writes it, the pruned graph itself excluded
#: (each export kind's measured ``kept_edge_bytes``, spec/export.py; JSON: 187 measured per kept edge on
#: the real model, 1.03 M kept edges)
KEPT_EDGE_BYTES: dict[str, int] = {k.key: k.kept_edge_bytes for k in EXPORT_KINDS.values()}
#: a diagram's rendering (Graphviz runs in its own process; its text is bounded by max_render_nodes)
RENDER_BYTES = 64 * 1024**2


def check_edge_bytes(kind: str) -> int:
    """Bytes per full-graph edge while check ``kind`` runs (what the graph holds: its stored edges,
    the caches of the stages before, the check's own per-edge work); the dry run adds the check's
    probed forward passes to it (:mod:`circuitgraph.pipeline.check_estimate`)."""
    return FULL_EDGE_BYTES.get(kind, DEFAULT_FULL_EDGE_BYTES)


def _full_stage_cost(kind: str) -> int:
    return FULL_EDGE_BYTES.get("scores query" if kind == "scores" else kind, DEFAULT_FULL_EDGE_BYTES)


def later_stages(spec: Spec) -> LaterStages:
    """The later stages of ``spec`` as the memory plan counts them (see the module docstring)."""
    full: dict[str, int] = {"scores": FULL_EDGE_BYTES["scores"]}
    pruned = spec.pruning is not None
    if pruned:
        full["prune"] = FULL_EDGE_BYTES["prune"]
    for where, items in (("queries", spec.queries), ("validate", spec.validate)):
        for i, item in enumerate(items):
            # with prune: none both graphs are the full graph
            if item.on == "full" or not pruned:
                full[f"{where}[{i}] {item.kind}"] = _full_stage_cost(item.kind)
    ex = spec.export
    outputs = ex.outputs()
    if any(EXPORT_KINDS[k].diagram for k in outputs):
        full["diagram influence"] = FULL_EDGE_BYTES["diagram influence"]
    if "neuronpedia" in outputs:  # it reads the full graph's influence too
        full["export neuronpedia"] = FULL_EDGE_BYTES["diagram influence"]
    heaviest = max(full, key=full.__getitem__)
    kept_bytes = max((KEPT_EDGE_BYTES[k] for k in outputs if k in KEPT_EDGE_BYTES), default=0)
    if pruned and outputs:
        kept_bytes += 12  # the pruned graph's own edges, held next to the full graph's
    caps = [c for c in (ex.max_json_edges if ex.json is not None else None,
                        DEFAULT_MAX_LINKS if ex.neuronpedia is not None else None) if c is not None]
    limit = min(caps) if caps else None
    top_k = spec.pruning.top_k_edges if spec.pruning is not None else None
    kept_cap = min([c for c in (limit, top_k) if c is not None], default=None) if pruned else None
    return LaterStages(
        full_edge_bytes=full[heaviest], resident_edge_bytes=RESIDENT_EDGE_BYTES if outputs else 0,
        kept_edge_bytes=kept_bytes, kept_cap=kept_cap,
        export_limit=None if pruned else limit,
        fixed=RENDER_BYTES if any(EXPORT_KINDS[k].renders for k in outputs) else 0, heaviest=heaviest)
