#!/usr/bin/env python
"""Circuits against ground truth: tracr-compiled models with known circuits, and faithfulness curves.

    python benchmarks/ground_truth.py                       # writes docs/benchmarks/ground_truth.md (+ .json, plots)
    python benchmarks/ground_truth.py --work DIR --out DIR  # keep the compiled models in DIR

For each of four programs of ``tracr.compiler.lib`` (reverse, frac_prevs = ACDC's
tracr-proportion, sort, hist) it compiles the model (``compile_program``, max_seq_len 5,
bidirectional attention as tracr compiles by default), runs one spec on it through
``circuitgraph.run`` (``model: {path:}``, heads and whole MLPs as nodes, positional nodes,
float64; targets: the program's expected output at every position, as logits for categorical
programs and as the output direction for frac_prevs), with the ``ground_truth`` query against
the compiled ``circuit.json`` and three ``faithfulness_curve`` checks on the full graph (edges
with zero ablation, nodes with zero ablation, nodes with mean ablation over other inputs);
then the curves on the demo model (examples/demo.yaml's prompt and target, transcoders).
Needs tracr (``pip install tracr-pypi``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import circuitgraph
from circuitgraph.testing.tracr import compile_program, library_program, tracr_unavailable

REPO = Path(__file__).resolve().parents[1]
#: (program, prompt values) with max_seq_len 5
PROGRAMS = [("reverse", ["a", "b", "c", "b"]), ("frac_prevs", ["x", "a", "x", "b"]),
            ("sort", [3, 1, 4, 2]), ("hist", ["a", "b", "a", "c"])]
MAX_SEQ_LEN = 5
#: ACDC (Conmy et al. 2023), edge ROC AUC on tracr tasks, as issue #26 quotes them
ACDC = {"reverse": {"zero": 1.000, "random": 0.200}, "frac_prevs": {"zero": 1.000, "random": 0.600}}
#: the curves on the component graph (heads and whole MLPs: its only readers are the targets)
CURVES = [("nodes", "zero"), ("nodes", "mean")]
#: the edge curve runs on a neuron graph, whose edges reach neurons as well as the targets
NEURON_GRAPH = {"mlp": "neurons", "attention": "heads", "positional_nodes": True, "dtype": "float64"}


def _spec(model_dir: Path, circuit: Path | None, prompt: str, targets: list, references: list[str],
          graph: dict, plot_dir: Path, name: str, curves=CURVES) -> dict:
    checks = []
    for unit, ablation in curves:
        params = {"unit": unit, "ablation": ablation, "plot": str(plot_dir / f"{name}_{unit}_{ablation}.png")}
        if ablation == "mean":
            params["reference_prompts"] = references
        checks.append({"faithfulness_curve": params, "on": "full"})
    spec = {"format_version": 1, "model": {"path": str(model_dir)}, "prompt": prompt, "targets": targets,
            "graph": graph, "prune": "none", "validate": checks}
    if circuit is not None:
        spec["queries"] = [{"ground_truth": {"circuit": str(circuit)}}]
    return spec


def run_program(name: str, values: list, work: Path, plot_dir: Path) -> dict:
    from tracr.rasp import rasp

    program, vocab = library_program(name, MAX_SEQ_LEN)
    start = time.perf_counter()
    compiled = compile_program(program, vocab, MAX_SEQ_LEN, work / name)
    compile_s = time.perf_counter() - start
    expected = rasp.evaluate(program, values)
    L = compiled.assembled.model_config.num_layers
    if compiled.categorical:
        targets = [{"logit": str(v), "position": i + 1} for i, v in enumerate(expected)]
    else:
        targets = [{"direction": {"site": "resid_post", "layer": L - 1, "position": i + 1,
                                  "file": str(compiled.model_dir / "output_direction.npy"), "name": f"{name}@{i + 1}"}}
                   for i in range(len(values))]
    rng = random.Random(0)
    pool = sorted(vocab, key=str)
    references = [" ".join(str(rng.choice(pool)) for _ in values) for _ in range(8)]
    graph = {"mlp": "mlp", "attention": "heads", "positional_nodes": True, "dtype": "float64"}
    spec = _spec(compiled.model_dir, compiled.out_dir / "circuit.json", " ".join(str(v) for v in values), targets,
                 references, graph, plot_dir, name)
    start = time.perf_counter()
    result = circuitgraph.run(spec)
    run_s = time.perf_counter() - start
    neurons = circuitgraph.run(_spec(compiled.model_dir, None, spec["prompt"], targets, references, NEURON_GRAPH,
                                     plot_dir, f"{name}_neurons", curves=[("edges", "zero")]))
    gt = result.queries[0]["result"].to_dict()
    return {"program": name, "prompt": values, "expected": [str(v) for v in expected], "layers": L,
            "d_model": len(compiled.assembled.residual_labels), "compile_s": compile_s, "run_s": run_s,
            "completeness": result.full_graph.metadata["completeness"]["max_relative_violation"],
            "ground_truth": {k: v for k, v in gt.items() if k not in ("edges", "nodes")},
            "edges": gt["edges"],
            "curves": [{**_curve(v), "graph": "heads + mlp"} for v in result.validation]
            + [{**_curve(v), "graph": "heads + neurons"} for v in neurons.validation]}


def _curve(entry: dict) -> dict:
    r = entry["result"]
    r = r.to_dict() if hasattr(r, "to_dict") else r
    if entry.get("status") != "ok":
        return {"error": entry.get("error"), "unit": entry["params"]["unit"], "ablation": entry["params"]["ablation"]}
    return {k: v for k, v in r.items() if k != "plot"}  # no machine paths in the recorded file


def run_demo(plot_dir: Path) -> dict:
    demo = {"format_version": 1, "model": {"builtin": "demo"}, "transcoders": {"builtin": "demo"},
            "prompt": "mia saw the owl in the park . later she wants", "targets": [{"logit_diff": [" an", " a"]}],
            "prune": "none"}
    refs = ["mia saw the dog in the park . later she wants", "tom saw the cat in the park . later he wants",
            "ann saw the egg in the park . later she wants"]
    checks = []
    for unit, ablation in CURVES + [("edges", "zero")]:
        params = {"unit": unit, "ablation": ablation, "plot": str(plot_dir / f"demo_{unit}_{ablation}.png")}
        if ablation == "mean":
            params["reference_prompts"] = refs
        checks.append({"faithfulness_curve": params, "on": "full"})
    for ablation in ("mean", "patch"):  # edges replaced by their values on reference prompts (MIB / EAP)
        params = {"unit": "edges", "ablation": ablation, "plot": str(plot_dir / f"demo_edges_{ablation}.png")}
        params.update({"reference_prompts": refs} if ablation == "mean" else {"patch_prompt": refs[0]})
        checks.append({"faithfulness_curve": params, "on": "full"})
    demo["validate"] = checks
    start = time.perf_counter()
    result = circuitgraph.run(demo)
    neurons = {**demo, "graph": {"mlp": "neurons"}, "validate": [
        {"faithfulness_curve": {"unit": "edges", "ablation": "zero", "plot": str(plot_dir / "demo_neurons_edges_zero.png")},
         "on": "full"}]}
    del neurons["transcoders"]
    nres = circuitgraph.run(neurons)
    return {"program": "demo", "run_s": time.perf_counter() - start,
            "curves": [{**_curve(v), "graph": "transcoders"} for v in result.validation]
            + [{**_curve(v), "graph": "neurons"} for v in nres.validation]}


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def write_page(results: list[dict], demo: dict | None, out: Path, plot_rel: str) -> str:
    lines = ["# Circuits against ground truth (tracr) and faithfulness curves", "",
             "Recorded by `python benchmarks/ground_truth.py` (see the script's docstring and",
             "[docs/validation.md](../validation.md#faithfulness_curve-recovery-over-circuit-sizes-cpr-and-cmd), [docs/tracr.md](../tracr.md)).",
             f"Machine: {platform.machine()}, Python {platform.python_version()}, CPU; tracr-pypi, max_seq_len "
             f"{MAX_SEQ_LEN}, bidirectional attention, float64 graphs with heads and whole MLPs as nodes "
             "(`graph: {mlp: mlp, attention: heads, positional_nodes: true}`).", "",
             "## Edge ROC AUC against tracr's compiled circuit", "",
             "| program | prompt | layers | d_model | edge AUC (direct) | QK edge AUC | node AUC | precision | recall "
             "| true / candidate edges | ACDC (zero abl.) | ACDC (random abl.) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        g, acdc = r["ground_truth"], ACDC.get(r["program"], {})
        lines.append(f"| {r['program']} | `{' '.join(map(str, r['prompt']))}` | {r['layers']} | {r['d_model']} | "
                     f"{_fmt(g['edge_auc'])} | {_fmt(g['qk_edge_auc'])} | {_fmt(g['node_auc'])} | "
                     f"{_fmt(g['precision'])} | {_fmt(g['recall'])} | {g['n_true_edges']} / {g['n_candidate_edges']} | "
                     f"{_fmt(acdc.get('zero'))} | {_fmt(acdc.get('random'))} |")
    lines += ["", "ACDC's figures are the published ones (Conmy et al. 2023, tracr-reverse and tracr-proportion; "
              "ACDC does not report sort or hist); circuitgraph's graphs are exact direct effects of the "
              "linearised model on one prompt, with no search and no threshold, so the AUC measures whether "
              "every true edge outweighs every false one on that prompt.", ""]
    for r in results:
        d = r["ground_truth"]["disagreements"]
        if d:
            lines.append(f"Disagreements on {r['program']}: " + "; ".join(
                f"{x['true_edge']} ({x['path']}, {x['weight']:.3g}) below {x['n_false_above']} false edge(s), "
                f"strongest {x['strongest_false_edge']} ({x['false_weight']:.3g})" for x in d))
    lines += ["", "## Faithfulness curves (MIB's CPR and CMD)", "",
              "Recovery `(m(circuit) - m(empty)) / (m(full) - m(empty))` at MIB's sizes (fraction of the graph's "
              "edges or nodes kept, the rest ablated in the real model); CPR = area under the curve (higher is "
              "better), CMD = area between the curve and 1 (0 is best), trapezoids with (0, 0) and (1, 1) added.", "",
              "| model | graph | unit | ablation | n | CPR | CMD | recovery at 0.001 / 0.01 / 0.1 / 0.5 |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results + ([demo] if demo else []):
        for c in r["curves"]:
            if "error" in c:
                lines.append(f"| {r['program']} | {c.get('graph')} | {c.get('unit')} | {c.get('ablation')} | - | - | - | "
                             f"{c['error']} |")
                continue
            rec = {p["size"]: p["recovery"] for p in c["points"]}
            pick = " / ".join(_fmt(rec.get(s)) for s in (0.001, 0.01, 0.1, 0.5))
            lines.append(f"| {r['program']} | {c['graph']} | {c['unit']} | {c['ablation']} | {c['n_total']} | {_fmt(c['cpr'])} | "
                         f"{_fmt(c['cmd'])} | {pick} |")
    lines += ["", "Node curves: the tracr models on their component graph (heads and whole MLPs at every position), "
              "the demo on its transcoder graph; the nodes not kept are ablated and everything downstream runs as "
              "the real model does. Edge curves (zero ablation: each removed edge's contribution taken out at its "
              "reader, docs/validation.md) on neuron graphs, whose edges reach neurons as well as the targets "
              "(a component graph's only readers are the targets); the demo's edge curves with mean and patch "
              "ablation replace each ablated edge by its value in the reference prompts' graphs (mean: over the three "
              "reference prompts the node curve uses; patch: from the first, 'mia saw the dog in the park . later "
              "she wants'). tracr's circuits are exact and position-specific: "
              "most of a program's components at most positions are needed, so recovery stays near 0 until most of "
              "the graph is kept. A CPR above 1 (hist) is a curve that overshoots 1: removing some edges raises the "
              "metric; CMD counts the overshoot as |1 - recovery|.", "",
              "Plots: " + ", ".join(f"[{p.name}]({plot_rel}/{p.name})" for p in sorted(out.parent.glob(
                  f'{plot_rel}/*.png'))), "",
              "## Timing", "", "| program | compile (s) | spec run (s) | completeness (max rel. violation) |",
              "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['program']} | {r['compile_s']:.1f} | {r['run_s']:.1f} | {r['completeness']:.1e} |")
    if demo:
        lines.append(f"| demo | - | {demo['run_s']:.1f} | - |")
    lines += ["", "## Reproduce", "", "```bash no-run", "pip install tracr-pypi", "python benchmarks/ground_truth.py",
              "python benchmarks/ground_truth.py --demo-only  # only the demo model's curves, tracr results kept",
              "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="where the compiled models go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks", help="where the page goes")
    parser.add_argument("--no-demo", action="store_true")
    parser.add_argument("--demo-only", action="store_true",
                        help="rerun only the demo model, keeping the tracr programs' results from ground_truth.json")
    args = parser.parse_args(argv)
    if args.demo_only:
        plot_dir = args.out / "ground_truth"
        plot_dir.mkdir(parents=True, exist_ok=True)
        results = json.loads((args.out / "ground_truth.json").read_text())["programs"]
        demo = run_demo(plot_dir)
        page = write_page(results, demo, args.out / "ground_truth.md", "ground_truth")
        (args.out / "ground_truth.md").write_text(page)
        (args.out / "ground_truth.json").write_text(json.dumps({"programs": results, "demo": demo}, indent=1,
                                                               default=str))
        print(page)
        return 0
    reason = tracr_unavailable()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="circuitgraph-tracr-"))
    plot_dir = args.out / "ground_truth"
    plot_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name, values in PROGRAMS:
        print(f"{name} ...", flush=True)
        results.append(run_program(name, values, work, plot_dir))
        g = results[-1]["ground_truth"]
        print(f"  edge AUC {g['edge_auc']:.3f}, QK AUC {g['qk_edge_auc']:.3f}, node AUC {g['node_auc']:.3f}", flush=True)
    demo = None if args.no_demo else run_demo(plot_dir)
    page = write_page(results, demo, args.out / "ground_truth.md", "ground_truth")
    (args.out / "ground_truth.md").write_text(page)
    (args.out / "ground_truth.json").write_text(json.dumps({"programs": results, "demo": demo}, indent=1, default=str))
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
