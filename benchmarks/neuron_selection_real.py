"""``graph.max_neuron_nodes`` on a real model: one spec run end to end, its numbers as JSON.

    /usr/bin/time -v python benchmarks/neuron_selection_real.py \\
        examples/real/neurons_selection_ioi64.yaml [--model DIR] [--out results.json]

Prints (and writes with ``--out``) the stage timings, the graph's size, completeness (the
largest relative violation of ``pre_activation = incoming edges + constant``), circuit-tracer's
replacement and completeness scores, the share of the target carried by the kept neurons and by
the remainders (direct edges), and each ``predicted_vs_actual`` check's correlations.
Peak memory comes from ``/usr/bin/time -v`` around it (docs/neuron_selection.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    import circuitgraph

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("--model", help="override model.path")
    ap.add_argument("--max-neuron-nodes", type=int, help="override graph.max_neuron_nodes")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    spec = yaml.safe_load(args.spec.read_text())
    spec.pop("export", None)
    if args.model:
        spec["model"] = {"path": args.model}
    if args.max_neuron_nodes:
        spec["graph"]["max_neuron_nodes"] = args.max_neuron_nodes
    t0 = time.perf_counter()
    res = circuitgraph.run(spec)
    wall = time.perf_counter() - t0
    g = res.full_graph
    kinds: dict[str, int] = {}
    for n in g.nodes:
        kinds[n.kind] = kinds.get(n.kind, 0) + 1
    (target, weight), = g.targets[:1]
    direct = {"neuron": 0.0, "remainder": 0.0}
    for s, w in g.in_edges(target):
        if s.kind in direct:
            direct[s.kind] += weight * w
    out = {
        "spec": str(args.spec), "model": spec["model"], "n_pos": g.metadata.get("n_pos") or len(
            g.metadata.get("prompt_tokens", [])),
        "max_neuron_nodes": spec["graph"].get("max_neuron_nodes"), "wall_s": round(wall, 1),
        "timings_s": {k: round(v, 1) for k, v in res.timings.items()},
        "nodes": kinds, "n_edges": int(g.n_edges),
        "completeness_max_relative_violation": g.metadata["completeness"]["max_relative_violation"],
        "replacement_score": g.metadata.get("replacement_score"),
        "completeness_score": g.metadata.get("completeness_score"),
        "target": str(target), "target_value": g.nodes[g.index_of(target)].pre_activation,
        "direct_from_kept_neurons": direct["neuron"], "direct_from_neuron_remainders": direct["remainder"],
        "validation": [],
    }
    for v in res.validation:
        r = v["result"]
        entry = {"kind": v["kind"], "status": v["status"], "error": v["error"]}
        if r is not None and v["kind"] == "predicted_vs_actual":
            entry.update(correlation=r.correlation, correlation_total=r.correlation_total,
                         correlation_gradient=r.correlation_gradient, sign_agreement=r.sign_agreement,
                         sign_agreement_gradient=r.sign_agreement_gradient, frozen_max_deviation=r.frozen_max_deviation,
                         frozen_tolerance=r.frozen_tolerance, n_rows=len(r.rows), notes=r.notes,
                         rows=[{k: getattr(row, k) for k in ("node", "predicted", "predicted_total",
                                                              "predicted_gradient", "actual_frozen", "actual")} for row in r.rows])
        out["validation"].append(entry)
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
