#!/usr/bin/env python
"""circuitgraph and circuit-tracer 0.5.0 side by side on the real model with dictionaries `circuitgraph
train` wrote: the same edges, and each one's end-to-end time and peak memory, measured in one run.

    python benchmarks/real_side_by_side.py --dictionaries out/real_train/dictionaries \\
        --prompt "When Mary and John went to the store, John gave a drink to" --work out/ct_real \\
        [--max-feature-nodes 2048] [--json docs/benchmarks/real_side_by_side.json]

Both tools read the dictionary folder as ``circuitgraph train`` wrote it (circuit-tracer's
``transcoder_set`` or ``cross_layer_transcoder`` layout), without conversion: circuitgraph with
``load_dictionaries``, circuit-tracer with its own ``load_transcoder_set`` / ``load_clt``
(``benchmarks/circuit_tracer/run_ct_clt.py``).  The model is the fetched SmolLM2-135M-Instruct
folder (``model: {pretrained: smollm2-135m-instruct}``); circuit-tracer reads it through
TransformerLens, as its ``from_pretrained`` does (``tl_bundle_from_hf.py`` writes the
TransformerLens state dict once into ``WORK/bundle/model``; not timed).

Each tool runs in its own process, one after the other, one thread each (``torch.set_num_threads(1)``),
under ``/usr/bin/time -v``: CPU seconds (user + sys), wall seconds and peak RSS of the whole process
(interpreter start, imports, loading the model and the dictionaries, the graph, writing it), and,
from inside, the load and attribution phases.  circuitgraph goes first, from the prompt text, and
writes the token ids circuit-tracer is then given (BOS included).  Then every entry of
circuit-tracer's adjacency is compared with circuitgraph's edge between the same nodes
(``benchmarks/side_by_side.py``: features matched by (layer, position, index), error, embedding and
logit nodes by identity); both select ``max_feature_nodes`` features by the same influence rule.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _timed(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``argv`` under /usr/bin/time -v: its CPU seconds, wall seconds and peak RSS."""
    r = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")

    def field(name: str) -> str:
        m = re.search(rf"^\s*{re.escape(name)}: (.+)$", r.stderr, re.M)
        return m.group(1) if m else "nan"

    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
    return {"cpu_s": float(field("User time (seconds)")) + float(field("System time (seconds)")),
            "wall_s": sum(float(v) * 60 ** i for i, v in enumerate(reversed(wall))),
            "peak_rss_mb": float(field("Maximum resident set size (kbytes)")) / 1024}


def circuitgraph_child(args: argparse.Namespace) -> None:
    """The circuitgraph process: model + dictionaries + graph from the prompt text, written to WORK/cg."""
    import torch

    torch.set_num_threads(1)
    t0, c0 = time.perf_counter(), time.process_time()
    from circuitgraph.adapters.loading import load_pretrained
    from circuitgraph.attribution import attribute
    from circuitgraph.dictionaries import load_dictionaries
    from circuitgraph.export import save_graph_binary

    adapter = load_pretrained(args.model)
    dictionaries = load_dictionaries(args.dictionaries, adapter)
    t1, c1 = time.perf_counter(), time.process_time()
    tokens = [adapter.tokenizer.bos_id, *adapter.tokenizer.encode(args.prompt)]
    graph = attribute(adapter, tokens, dictionaries, max_feature_nodes=args.max_feature_nodes,
                      batch_size=args.batch_size)
    t2, c2 = time.perf_counter(), time.process_time()
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = Path(args.work) / "cg"
    out.mkdir(parents=True, exist_ok=True)
    save_graph_binary(graph, str(out / "full.npz"))
    (out / "run.json").write_text(json.dumps({
        "tokens": tokens, "load_s": t1 - t0, "attribute_s": t2 - t1, "load_cpu_s": c1 - c0,
        "attribute_cpu_s": c2 - c1, "peak_rss_mb_after_attribute": peak, "n_nodes": graph.n_nodes,
        "n_edges": int(graph.n_edges), "completeness": graph.metadata["completeness"],
        "n_active_features": sum(1 for n in graph.context.attributed_nodes if n.kind == "feature")}))


def make_tl_bundle(python: Path, hf_dir: Path, bundle: Path) -> Path:
    """The TransformerLens model bundle circuit-tracer reads (written once, in its virtualenv)."""
    if not (bundle / "model.safetensors").is_file():
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run([str(python), str(HERE / "circuit_tracer" / "tl_bundle_from_hf.py"), "--hf", str(hf_dir),
                        "--out", str(bundle)], check=True, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True)
    return bundle


def ct_argv(python: Path, bundle: Path, dictionaries: Path, tokens: list[int], out: Path,
            max_feature_nodes: int | None, batch_size: int = 256) -> list[str]:
    """The command that runs circuit-tracer on ``tokens`` (its graph goes to ``out``, timings next to it)."""
    jobs = out.with_name(out.stem + "_jobs.json")
    jobs.parent.mkdir(parents=True, exist_ok=True)
    jobs.write_text(json.dumps([{"model": str(bundle), "clt": str(dictionaries), "tokens": json.dumps(tokens),
                                 "out": str(out), "max_feature_nodes": max_feature_nodes}]))
    return [str(python), str(HERE / "circuit_tracer" / "run_ct_clt.py"), "--jobs", str(jobs),
            "--batch-size", str(batch_size)]


def compare(graph: Any, ct_npz: Path, tokens: list[int]) -> dict[str, Any]:
    """Every entry of circuit-tracer's adjacency against circuitgraph's edge between the same nodes (0 where
    none), and the largest difference relative to the edge itself among the edges above 1e-3 of the largest."""
    import numpy as np
    from side_by_side import _row_map, ct_node_order, edge_difference, selected_features_agreement

    with np.load(ct_npz) as z:
        ct = {k: z[k] for k in z.files}
    order = ct_node_order(ct)
    row_map = _row_map(graph, order)
    adjacency = ct.pop("adjacency_matrix").astype(np.float64)
    t, s = row_map[graph.edge_target], row_map[graph.edge_source]
    keep = (t >= 0) & (s >= 0)
    ours = np.zeros_like(adjacency)
    np.add.at(ours, (t[keep], s[keep]), graph.edge_weight[keep].astype(np.float64))
    scale = float(np.abs(adjacency).max())
    big = np.abs(adjacency) > 1e-3 * scale
    rel = float((np.abs(ours - adjacency)[big] / np.abs(adjacency[big])).max()) if big.any() else 0.0
    del ours
    out: dict[str, Any] = {
        "targets_equal": [str(n) for n in order[-len(ct["logit_tokens"]):]] == [str(tg) for tg, _ in graph.targets],
        "target_probabilities_ct": [float(p) for p in ct["logit_probabilities"]],
        "target_probabilities_circuitgraph": [float(p) for _, p in graph.targets],
        "input_tokens_equal": ct["input_tokens"].tolist() == list(tokens),
        "selected_features": selected_features_agreement(ct, graph),
        "n_nodes_ct": len(order), "n_nodes_circuitgraph": graph.n_nodes,
        "circuitgraph_nodes_without_ct_node": int((row_map < 0).sum()),
        "nonzero_ct": int(np.count_nonzero(adjacency)),
        "max_relative_difference_edges_above_1e-3_of_largest": rel,
        "n_edges_above_1e-3_of_largest": int(big.sum()),
    }
    out.update(edge_difference(adjacency, graph, row_map))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dictionaries", type=Path, required=True, help="a folder `circuitgraph train` wrote")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a pretrained name circuitgraph knows")
    ap.add_argument("--max-feature-nodes", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--ct-python", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the result here too")
    ap.add_argument("--child", choices=["circuitgraph"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "circuitgraph":
        circuitgraph_child(args)
        return 0
    from circuitgraph.adapters.pretrained import fetch
    from circuitgraph.testing.circuit_tracer import circuit_tracer_python, circuit_tracer_unavailable

    reason = circuit_tracer_unavailable()
    python = args.ct_python or (None if reason else circuit_tracer_python())
    if python is None:
        sys.exit(reason)
    work = args.work.resolve()
    dictionaries = args.dictionaries.resolve()
    bundle = make_tl_bundle(python, fetch(args.model), work / "bundle" / "model")  # once; not timed
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ct_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    cg_env = {**env, "PYTHONPATH": str(REPO)}
    result: dict[str, Any] = {"dictionaries": str(args.dictionaries), "prompt": args.prompt, "model": args.model,
                              "max_feature_nodes": args.max_feature_nodes, "batch_size": args.batch_size,
                              "cpu_model": _cpu_model(), "threads": 1}
    cfg_text = (dictionaries / "config.yaml").read_text()
    result["model_kind"] = re.search(r"model_kind:\s*(\S+)", cfg_text).group(1)
    result["circuitgraph"] = _timed(
        [sys.executable, str(Path(__file__).resolve()), "--child", "circuitgraph", "--dictionaries", str(dictionaries),
         "--prompt", args.prompt, "--work", str(work), "--model", args.model, "--max-feature-nodes",
         str(args.max_feature_nodes), "--batch-size", str(args.batch_size)], cg_env)
    cg_run = json.loads((work / "cg" / "run.json").read_text())
    result["circuitgraph"].update({k: v for k, v in cg_run.items() if k != "tokens"})
    result["n_tokens"] = len(cg_run["tokens"])
    ct_out = work / "ct" / "graph.npz"
    result["circuit_tracer"] = _timed(ct_argv(python, bundle, dictionaries, cg_run["tokens"], ct_out,
                                              args.max_feature_nodes, args.batch_size), ct_env)
    result["circuit_tracer"].update(json.loads(ct_out.with_suffix(".json").read_text()))
    from circuitgraph.export import load_graph_binary

    result["agreement"] = compare(load_graph_binary(str(work / "cg" / "full.npz")), ct_out, cg_run["tokens"])
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
