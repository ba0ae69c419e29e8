"""circuitgraph vs circuit-tracer 0.5.0 on cross-layer transcoders, edge by edge.

Builds random CLTs in circuit-tracer's on-disk format (``circuitgraph.testing.synthetic.random_clt`` /
``save_clt``) for a GPT-2-style and a Llama-style tiny model, ReLU and JumpReLU, runs
circuit-tracer on them in its own virtualenv (``run_ct_clt.py``, one interpreter for all
cases) and compares every entry of its adjacency with circuitgraph's graph from
``transcoders: {path: CLT_DIR}``.  Used by ``tests/test_clt.py`` and, with ``--out``, writes
the CLT table of ``docs/circuit_tracer_agreement.md``::

    python benchmarks/circuit_tracer/clt_agreement.py --ct-python .venv-ct/bin/python --work OUT
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: name -> (tiny_model kwargs, CLT activation[, random_clt kwargs])
CASES = {
    "gpt2-style relu": (dict(norm="LN", mlp="gelu", positional="learned", n_layers=3), "relu"),
    "gpt2-style jump_relu": (dict(norm="LN", mlp="gelu", positional="learned", n_layers=3), "jump_relu"),
    "llama-style relu": (dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2, n_layers=3), "relu"),
    "llama-style jump_relu": (dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2, n_layers=3),
                              "jump_relu"),
    # feature_input_hook: mlp.hook_in (the MLP's input, gamma2 * P(x)/sigma2 + beta2; circuit-tracer reads it
    # at its ReplacementMLP.hook_in, circuitgraph folds gamma/beta into the encoder)
    "gpt2-style relu, mlp.hook_in": (dict(norm="LN", mlp="gelu", positional="learned", n_layers=3), "relu",
                                     dict(input_site="mlp_input")),
    "llama-style jump_relu, mlp.hook_in": (dict(norm="RMS", mlp="gated", positional="rotary", n_kv_heads=2,
                                                n_layers=3), "jump_relu", dict(input_site="mlp_input")),
    # Gemma-2-style blocks (pre- and post-norms): the CLT writes mlp.hook_out, the MLP output *before* the
    # post-MLP norm (circuit-tracer's ReplacementMLP.hook_out; circuitgraph maps it through the frozen norm)
    "gemma2-style jump_relu, mlp.hook_out": (dict(norm="RMS", mlp="gated", positional="rotary", post_norms=True,
                                                  n_layers=3), "jump_relu",
                                             dict(input_site="normalized", output_hook="mlp.hook_out")),
}


SECTION = "## Cross-layer transcoders"


def ct_python() -> Path | None:
    """circuit-tracer's interpreter ($CIRCUITGRAPH_CT_PYTHON, else <repo>/.venv-ct/bin/python), or None."""
    from circuitgraph.testing.circuit_tracer import circuit_tracer_python

    cand = circuit_tracer_python()
    return cand if cand.exists() else None


def make_case(work: Path, name: str, seed: int = 0) -> dict:
    """Model bundle + CLT directory + a prompt whose last position has an active feature
    (circuit-tracer 0.5.0 crashes otherwise, see docs/dictionaries.md)."""
    from circuitgraph.adapters import ModelAdapter
    from circuitgraph.attribution.linearisation import linearise
    from circuitgraph.dictionaries.clt import load_clt_dir
    from circuitgraph.testing.synthetic import random_clt, save_bundle, save_clt, tiny_model

    kwargs, act, *more = CASES[name]
    slug = name.replace(" ", "-").replace(",", "").replace(".", "-")
    model = tiny_model(seed=seed, **kwargs)
    bundle = save_bundle(work / slug, model)
    clt_dir = save_clt(work / slug / "clt", random_clt(model, activation=act, seed=seed, **(more[0] if more else {})))
    adapter = ModelAdapter(model)
    clt = load_clt_dir(clt_dir, adapter)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(20):
        tokens = [1] + torch.randint(3, model.cfg.d_vocab, (7,), generator=gen).tolist()
        lin = linearise(adapter, torch.tensor(tokens), clt)
        if any(bool((clt[l].activation(lin.tc_input[l])[-1] != 0).any()) for l in clt.layers):
            break
    return {"name": name, "model": str(bundle / "model"), "clt": str(clt_dir), "tokens": json.dumps(tokens),
            "out": str(work / slug / "ct.npz")}


def run_circuit_tracer(jobs: list[dict], work: Path, python: Path) -> None:
    spec = work / "jobs.json"
    spec.write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(python), str(HERE / "run_ct_clt.py"), "--jobs", str(spec)], capture_output=True,
                       text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"circuit-tracer failed:\n{r.stderr[-4000:]}")


def compare(job: dict, *, dtype: torch.dtype = torch.float32) -> dict:
    """Every entry of circuit-tracer's adjacency against circuitgraph's edge (0 where none)."""
    from circuitgraph.adapters.loading import load_model_dir
    from circuitgraph.attribution import ResolvedTarget, attribute
    from circuitgraph.dictionaries import load_dictionaries
    from circuitgraph.graph.nodes import NodeId

    ct = np.load(job["out"])
    A = ct["adjacency_matrix"].astype(np.float64)
    active, selected = ct["active_features"], ct["selected_features"]
    L, P = int(ct["n_layers"]), int(ct["n_pos"])
    tokens = ct["input_tokens"].tolist()
    adapter = load_model_dir(job["model"])
    clt = load_dictionaries(job["clt"], adapter)
    targets = [ResolvedTarget("logit", len(tokens) - 1, float(p), (int(v),), True, probability=float(p))
               for v, p in zip(ct["logit_tokens"].tolist(), ct["logit_probabilities"].tolist(), strict=False)]
    g = attribute(adapter, tokens, clt, targets, dtype=dtype)
    order = [NodeId("feature", *map(int, active[i])) for i in selected.tolist()]
    order += [NodeId("error", l, p, 0) for l in range(L) for p in range(P)]
    order += [NodeId("embedding", -1, p, tokens[p]) for p in range(P)]
    order += [NodeId("logit", L, len(tokens) - 1, int(v)) for v in ct["logit_tokens"].tolist()]
    index = {n: i for i, n in enumerate(order)}
    rows = np.array([index.get(n.id, -1) for n in g.nodes])
    t, s = rows[g.edge_target], rows[g.edge_source]
    keep = (t >= 0) & (s >= 0)
    ours = np.zeros_like(A)
    np.add.at(ours, (t[keep], s[keep]), g.edge_weight[keep].astype(np.float64))
    scale = float(np.abs(A).max())
    diff = np.abs(ours - A)
    return {
        "name": job["name"],
        "n_nodes_ct": int(A.shape[0]),
        "n_nodes_circuitgraph": g.n_nodes,
        "nonzero_ct": int((A != 0).sum()),
        "n_features_ct": int(len(selected)),
        "n_features_circuitgraph": sum(1 for n in g.nodes if n.kind == "feature"),
        "our_nodes_not_in_ct": [str(n.id) for n in g.nodes if n.id not in index][:5],
        "largest_dropped_edge": float(np.abs(g.edge_weight[~keep]).max()) if (~keep).any() else 0.0,
        "largest_edge": scale,
        "max_abs_difference": float(diff.max()),
        "max_difference_relative_to_largest_edge": float(diff.max() / scale),
        "completeness": g.metadata["completeness"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--ct-python", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = ap.parse_args()
    python = args.ct_python or ct_python()
    if python is None:
        sys.exit("circuit-tracer's python not found: set CIRCUITGRAPH_CT_PYTHON or create .venv-ct")
    jobs = [make_case(args.work, name) for name in CASES]
    from circuitgraph.builtin import demo_path

    demo = demo_path()
    jobs.append({"name": "built-in demo CLT (trained, ln2.hook_normalized)", "model": str(demo / "model"),
                 "clt": str(demo / "clt"), "tokens": json.dumps(json.loads((demo / "prompt.json").read_text())["tokens"]),
                 "out": str(args.work / "demo-clt" / "ct.npz")})
    run_circuit_tracer(jobs, args.work, python)
    rows = [compare(j) for j in jobs]
    lines = ["| case | nodes (circuit-tracer / circuitgraph) | non-zero edges | largest edge | "
             "max abs difference | relative to largest edge | completeness (max rel. violation) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        print(json.dumps(r))
        lines.append(f"| {r['name']} | {r['n_nodes_ct']} / {r['n_nodes_circuitgraph']} | {r['nonzero_ct']:,} | "
                     f"{r['largest_edge']:.4g} | {r['max_abs_difference']:.3g} | "
                     f"{r['max_difference_relative_to_largest_edge']:.2e} | "
                     f"{r['completeness']['max_relative_violation']:.2e} |")
    section = [
        SECTION,
        "",
        "Random CLTs in circuit-tracer's on-disk format (`circuitgraph.testing.synthetic.random_clt` /",
        "`save_clt`: 3 layers, 32 features per layer, reading `hook_resid_mid`, or `mlp.hook_in` where the",
        "case says) on a GPT-2-style, a Llama-style and a Gemma-2-style (pre- and post-norms; the CLT writes",
        "`mlp.hook_out`, before the post-MLP norm) tiny model, and the built-in demo's trained CLT;",
        "circuit-tracer 0.5.0 loads them with",
        "its own `load_clt` (`benchmarks/circuit_tracer/run_ct_clt.py`), circuitgraph with",
        "`transcoders: {path: DIR}`. Every entry of circuit-tracer's adjacency compared, float32.",
        "Generated by `benchmarks/circuit_tracer/clt_agreement.py --out docs/circuit_tracer_agreement.md`;",
        "the random cases are also `tests/test_clt.py::test_clt_edges_equal_circuit_tracers`.",
        "",
        *lines,
        "",
    ]
    if args.out:
        text = args.out.read_text() if args.out.exists() else ""
        head = text.split(SECTION)[0].rstrip("\n")
        args.out.write_text((head + "\n\n" if head else "") + "\n".join(section))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
