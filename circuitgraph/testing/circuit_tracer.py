"""Run circuit-tracer 0.5.0 on a bundle and read its graph back, to compare circuitgraph with it.

circuit-tracer lives in its own virtual environment (it pins ``transformers<=4.57.3``):
``bash scripts/install_circuit_tracer.sh`` creates ``<repo>/.venv-ct``; the environment variable
``CIRCUITGRAPH_CT_PYTHON`` names another interpreter.  circuit-tracer itself is run by
``benchmarks/circuit_tracer/run_ct.py`` in a subprocess (several bundles in one process), which
writes its adjacency, active features, logit targets and, optionally, its pruning and scores::

    >>> from circuitgraph.testing.circuit_tracer import run_circuit_tracer   # doctest: +SKIP
    >>> ct = run_circuit_tracer({"gpt2": BUNDLE}, tmp_dir)["gpt2"]          # doctest: +SKIP
    >>> report = compare_with_circuit_tracer(graph, ct)                      # doctest: +SKIP
    >>> report["max_difference_relative_to_largest_edge"] < 1e-5             # doctest: +SKIP

A bundle is the local layout ``model: {path: ...}`` reads: ``model/``, ``transcoders/layer_<l>/``
(sae-lens per-layer transcoders) and ``prompt.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from circuitgraph._io import read_json_file
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId

__all__ = [
    "CT_PYTHON_ENV",
    "CircuitTracerGraph",
    "circuit_tracer_python",
    "circuit_tracer_unavailable",
    "run_circuit_tracer",
    "compare_with_circuit_tracer",
]

#: environment variable naming circuit-tracer's interpreter (default ``<repo>/.venv-ct/bin/python``)
CT_PYTHON_ENV = "CIRCUITGRAPH_CT_PYTHON"
REPO = Path(__file__).resolve().parents[2]
RUN_CT = REPO / "benchmarks" / "circuit_tracer" / "run_ct.py"


def circuit_tracer_python() -> Path:
    """The interpreter of circuit-tracer's virtual environment (it may not exist)."""
    env = os.environ.get(CT_PYTHON_ENV)
    return Path(env) if env else REPO / ".venv-ct" / "bin" / "python"


def circuit_tracer_unavailable() -> str | None:
    """Why circuit-tracer cannot be run here, or None when it can."""
    python = circuit_tracer_python()
    if not python.exists():
        return (f"circuit-tracer's virtualenv is not installed (no {python}): run "
                f"`bash scripts/install_circuit_tracer.sh` or set {CT_PYTHON_ENV}")
    if not RUN_CT.is_file():
        return f"{RUN_CT} is missing (a source checkout of circuitgraph is needed)"
    return None


@dataclass
class CircuitTracerGraph:
    """circuit-tracer's graph on one bundle, as run_ct.py wrote it.

    Attributes:
        adjacency: float32 ``(n, n)``, rows = targets, columns = sources, circuit-tracer's order.
        node_ids: the circuitgraph id of each row: selected features, errors (layer-major,
            every position including 0), token embeddings, logits.
        input_tokens, logit_tokens, logit_probabilities, activation_values: as circuit-tracer has them.
        n_layers, n_pos: sizes.
        scores: ``{"replacement_score", "completeness_score", ...}`` when pruning was asked.
        prune: ``{"node_mask", "edge_mask_indices", "cumulative_scores"}`` when pruning was asked.
        arrays: every array of run_ct.py's ``graph.npz`` (error_vectors, logit_vectors, ...).
    """

    adjacency: np.ndarray
    node_ids: list[NodeId]
    input_tokens: list[int]
    logit_tokens: list[int]
    logit_probabilities: list[float]
    activation_values: np.ndarray
    n_layers: int
    n_pos: int
    scores: dict[str, Any] | None
    prune: dict[str, np.ndarray] | None
    arrays: dict[str, np.ndarray]

    @classmethod
    def load(cls, out_dir: str | os.PathLike[str]) -> CircuitTracerGraph:
        """Read ``OUT/graph.npz`` (and ``OUT/prune/`` when present) written by run_ct.py."""
        out = Path(out_dir)
        with np.load(out / "graph.npz") as z:
            arrays = {k: z[k] for k in z.files}
        n_layers, n_pos = int(arrays["n_layers"]), int(arrays["n_pos"])
        tokens = [int(t) for t in arrays["input_tokens"]]
        logit_tokens = [int(v) for v in arrays["logit_tokens"]]
        feats = arrays["active_features"][arrays["selected_features"]]
        ids = [NodeId("feature", int(lyr), int(p), int(i)) for lyr, p, i in feats.tolist()]
        ids += [NodeId("error", lyr, p, 0) for lyr in range(n_layers) for p in range(n_pos)]
        ids += [NodeId("embedding", -1, p, tok) for p, tok in enumerate(tokens)]
        ids += [NodeId("logit", n_layers, n_pos - 1, v) for v in logit_tokens]
        if len(ids) != arrays["adjacency_matrix"].shape[0]:
            raise ValueError(f"{out}: {len(ids)} nodes for an adjacency of {arrays['adjacency_matrix'].shape}")
        scores = prune = None
        if (out / "prune" / "prune.npz").is_file():
            scores = read_json_file(out / "prune" / "scores.json", "circuit-tracer scores.json")
            with np.load(out / "prune" / "prune.npz") as z:
                prune = {k: z[k] for k in z.files}
        return cls(arrays["adjacency_matrix"], ids, tokens, logit_tokens,
                   [float(p) for p in arrays["logit_probabilities"]], arrays["activation_values"],
                   n_layers, n_pos, scores, prune, arrays)

    def to_graph(self) -> AttributionGraph:
        """circuit-tracer's adjacency as an :class:`AttributionGraph`, nodes in its order, the
        logits weighted by their probabilities (no pre-activations: its graph does not have them)."""
        n_feat = len(self.activation_values)
        nodes = [Node(nid, float(a)) for nid, a in zip(self.node_ids[:n_feat], self.activation_values, strict=False)]
        nodes += [Node(nid, 1.0) for nid in self.node_ids[n_feat:len(self.node_ids) - len(self.logit_tokens)]]
        logits = [Node(nid, 0.0) for nid in self.node_ids[len(self.node_ids) - len(self.logit_tokens):]]
        nodes += logits
        t, s = np.nonzero(self.adjacency)
        return AttributionGraph(nodes, t, s, self.adjacency[t, s],
                                targets=[(n.id, p) for n, p in zip(logits, self.logit_probabilities, strict=False)])


def run_circuit_tracer(
    bundles: Mapping[str, str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    prune: bool = True,
    extra_args: Sequence[str] = (),
    timeout: float = 600,
) -> dict[str, CircuitTracerGraph]:
    """Run circuit-tracer on each bundle (one subprocess for all) and read the graphs back.

    Args:
        bundles: ``{name: bundle directory}``.
        out_dir: where ``NAME/graph.npz`` (and ``NAME/prune/``) are written.
        prune: also run circuit-tracer's ``prune_graph`` (0.8 / 0.98), ``compute_graph_scores``
            and its Neuronpedia export.
        extra_args: more run_ct.py arguments for every bundle (e.g. ``["--max-n-logits", "5"]``).
        timeout: seconds for the whole subprocess.

    Raises:
        RuntimeError: circuit-tracer is unavailable (:func:`circuit_tracer_unavailable`), or it failed
            (its stderr is in the message).
    """
    reason = circuit_tracer_unavailable()
    if reason:
        raise RuntimeError(reason)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, bundle in bundles.items():
        b = Path(bundle)
        argv = ["--model", b / "model", "--transcoders", b / "transcoders", "--tokens", b / "prompt.json",
                "--out", out / name / "graph.npz", "--threads", "1"]
        if prune:
            argv += ["--prune-out", out / name / "prune"]
        cases.append([str(a) for a in [*argv, *extra_args]])
    (out / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([str(circuit_tracer_python()), str(RUN_CT), "--batch", str(out / "cases.json")],
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"circuit-tracer failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return {name: CircuitTracerGraph.load(out / name) for name in bundles}


def compare_with_circuit_tracer(graph: AttributionGraph, ct: CircuitTracerGraph) -> dict[str, Any]:
    """Every entry of circuit-tracer's adjacency against the same edge of ``graph`` (0 when absent).

    ``graph`` should be built with the same prompt and targets (e.g. ``attribute(..., targets)``
    with circuit-tracer's ``logit_tokens`` and probabilities).  circuitgraph's nodes that
    circuit-tracer does not have (none, on its defaults) are listed; their edges are not compared.

    Returns:
        ``max_abs_difference``, ``largest_edge``, ``max_difference_relative_to_largest_edge``,
        ``worst_entry`` (target, source ids), ``n_nodes_ct``, ``nonzero_ct``,
        ``our_nodes_not_in_ct`` (up to 10 ids) and ``largest_dropped_edge``.
    """
    adjacency = ct.adjacency.astype(np.float64)
    ct_index = {nid: i for i, nid in enumerate(ct.node_ids)}
    row_map = np.array([ct_index.get(n.id, -1) for n in graph.nodes], dtype=np.int64)
    t, s = row_map[graph.edge_target], row_map[graph.edge_source]
    keep = (t >= 0) & (s >= 0)
    ours = np.zeros_like(adjacency)
    np.add.at(ours, (t[keep], s[keep]), graph.edge_weight[keep].astype(np.float64))
    diff = np.abs(ours - adjacency)
    worst = np.unravel_index(int(diff.argmax()), diff.shape)
    scale = float(np.abs(adjacency).max())
    return {
        "n_nodes_ct": int(adjacency.shape[0]),
        "nonzero_ct": int((adjacency != 0).sum()),
        "largest_edge": scale,
        "max_abs_difference": float(diff.max()),
        "max_difference_relative_to_largest_edge": float(diff.max() / scale) if scale else float(diff.max()),
        "worst_entry": [str(ct.node_ids[worst[0]]), str(ct.node_ids[worst[1]])],
        "our_nodes_not_in_ct": [str(n.id) for n, r in zip(graph.nodes, row_map, strict=False) if r < 0][:10],
        "largest_dropped_edge": float(np.abs(graph.edge_weight[~keep]).max()) if (~keep).any() else 0.0,
    }
