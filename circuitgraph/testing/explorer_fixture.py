"""Inputs for the explorer's tests and screenshots: the demo's graph files and a features folder
written directly with pyarrow (the layout docs/explorer.md describes), so the explorer is
tested without running the dashboards pipeline.

* :func:`demo_graph_file` -- the built-in demo's graph (a/an agreement), optionally with QK
  results, heads as nodes, another prompt or the results of ``steer:`` items
  (:data:`DEMO_STEER`), written as graph JSON;
* :func:`demo_dataset_run` -- a dataset run of the demo over a few prompts, its prompts run in
  this process (the pipeline's own prompt runner and aggregation; only the worker processes are
  left out, which take tens of seconds to start on a busy machine);
* :func:`write_features_folder` -- ``features.parquet``, ``examples.parquet`` and ``labels.csv``
  for a list of ``(layer, index)`` features, with made-up but distinct values; returns what it
  wrote, so a test knows each feature's top example and label.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from unittest import mock

from circuitgraph.datasets import executors
from circuitgraph.datasets.executors import PromptJob
from circuitgraph.pipeline import entry, runner
from circuitgraph.spec import Spec

__all__ = ["demo_spec", "demo_graph_file", "demo_dataset_run", "write_features_folder", "DEMO_PROMPT",
           "DEMO_CORRUPTED_PROMPT", "DEMO_STEER"]

DEMO_PROMPT = "mia saw the owl in the park . later she wants"
#: the demo's corrupted prompt (a consonant-initial noun), for diffs
DEMO_CORRUPTED_PROMPT = "mia saw the dog in the park . later she wants"
#: ``steer:`` items on the demo (docs/steering.md): the vowel-class features off and a consonant-class
#: feature on (flips " an owl" to " a key"), and an item that fails (a position outside the prompt)
DEMO_STEER: list[dict[str, Any]] = [
    {"name": "vowel off, consonant on",
     "interventions": [{"nodes": {"id": ["feature/0/11/142", "feature/0/11/160"]}, "mode": "zero"},
                       {"node": "feature/0/11/292", "mode": "set", "value": 3.0}],
     "generate": {"max_new_tokens": 2}},
    {"name": "outside the prompt", "interventions": [{"node": "feature/0/99/1"}]},
]


def demo_spec(*, qk: bool = False, heads: bool = False, prune: bool = True, prompt: str = DEMO_PROMPT,
              steer: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The demo's spec (examples/demo.yaml without checks or exports), with ``steer`` items if given."""
    spec: dict[str, Any] = {
        "format_version": 1,
        "model": {"builtin": "demo"},
        "transcoders": {"builtin": "demo"},
        "prompt": prompt,
        "targets": [{"logit_diff": [" an", " a"]}],
        "prune": {"node_threshold": 0.8, "edge_threshold": 0.98} if prune else "none",
    }
    if heads:
        spec["graph"] = {"attention": "heads"}
    if qk:
        spec["queries"] = [{"qk": {"layer": 0, "head": [0, 1], "query_position": -1, "key_position": "top",
                                   "top_k": 4}}]
    if steer:
        spec["steer"] = steer
    return spec


def demo_graph_file(path: str | os.PathLike[str], **options: Any) -> Path:
    """Run :func:`demo_spec` (``options`` go to it) and write its graph JSON (with its query
    results) to ``path``."""
    spec = demo_spec(**options)
    spec["export"] = {"json": os.fspath(path)}
    runner.run(spec, progress=False)
    return Path(path)


class _InProcessExecutor:
    """Runs a dataset's prompts one after another in this process, as a local worker would."""

    def run(self, spec: Spec, rows: list[Any], out_dir: Path, on_result: Any, job: Any = None) -> None:
        job = job or PromptJob()  # any job of the executors' protocol (prompts, feature shards)
        inputs = job.load(spec)
        for row in rows:
            on_result(job.commit(Path(out_dir), job.run(spec, row, inputs)))


def demo_dataset_run(directory: str | os.PathLike[str], prompts: Iterable[str] = (
        "mia saw the owl . later she wants", "ben saw the dog . later he wants")) -> Path:
    """A dataset run of the demo spec over ``prompts`` (``export: {dataset: directory}``)."""
    spec = demo_spec()
    del spec["prompt"]
    spec.update({"dataset": [{"prompt": p} for p in prompts], "executor": {"kind": "local", "workers": 1},
                 "export": {"dataset": os.fspath(directory)}})
    with mock.patch.object(executors, "make_executor", lambda spec: _InProcessExecutor()):
        entry.run(spec, progress=False)
    return Path(directory)


def _token_list(k: int, seed: int, kind: str) -> list[dict[str, Any]]:
    sign = -1.0 if kind == "bottom" else 1.0
    return [{"token": f" tok{(seed * 7 + j) % 97}", "token_id": (seed * 7 + j) % 97,
             "value": sign * round(2.0 - 0.25 * j + 0.01 * (seed % 10), 6)} for j in range(k)]


def write_features_folder(directory: str | os.PathLike[str], features: Iterable[tuple[int, int]], *,
                          n_examples: int = 3, context: int = 4, quantiles: tuple[float, ...] = (0.5, 0.9, 0.99),
                          labels: bool = True, minimal: bool = False) -> dict[tuple[int, int], dict[str, Any]]:
    """Write a features folder for ``features`` into ``directory``.

    Every feature gets ``n_examples`` examples whose text marks the activating token as
    ``«token»`` (rank 1 has the largest activation; the columns of the features runs' files), output/input token lists and quantile
    columns ``q0.5``...; ``labels`` writes ``labels.csv``.  ``minimal``: only the ``layer`` and
    ``index`` columns and the examples' ``text`` (what a reader must tolerate).

    Returns ``{(layer, index): {"label", "top_text", "top_token", "density", "examples"}}``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    feats = sorted({(int(layer), int(index)) for layer, index in features})
    written: dict[tuple[int, int], dict[str, Any]] = {}
    rows, examples = [], []
    for seed, (layer, index) in enumerate(feats):
        density = round(0.001 * (seed + 1), 6)
        rec: dict[str, Any] = {"layer": layer, "index": index}
        if not minimal:
            rec.update({"n_tokens": 10_000, "n_active": int(density * 10_000), "density": density,
                        "max_activation": round(3.0 + 0.1 * seed, 6), "mean_active_activation": round(1.0 + 0.05 * seed, 6),
                        "top_output_tokens": _token_list(5, seed, "top"),
                        "bottom_output_tokens": _token_list(5, seed + 31, "bottom"),
                        "top_input_tokens": _token_list(5, seed + 57, "top")})
            for q in quantiles:
                rec[f"q{q:g}"] = round(q * (3.0 + 0.1 * seed), 6)
        rows.append(rec)
        exs = []
        for rank in range(n_examples):
            token = f"w{layer}x{index}r{rank}"
            before = " ".join(f"c{j}" for j in range(context))
            text = f"{before} «{token}» after{rank}"
            ex = {"layer": layer, "index": index, "text": text}
            if not minimal:
                act = round(3.0 + 0.1 * seed - 0.5 * rank, 6)
                ex.update({"rank": rank + 1, "row_id": f"r{100 + seed * 10 + rank}", "row": 101 + seed * 10 + rank,
                           "position": context + rank, "start": rank, "activation": act,
                           "tokens": list(range(rank, rank + context + 2)),
                           "activations": [0.0] * context + [act, 0.0]})
            examples.append(ex)
            exs.append(ex)
        written[(layer, index)] = {"label": f"test feature {layer}/{index}", "top_text": exs[0]["text"],
                                   "top_token": f"w{layer}x{index}r0", "density": None if minimal else density,
                                   "examples": exs}
    pq.write_table(pa.Table.from_pylist(rows), out / "features.parquet")
    pq.write_table(pa.Table.from_pylist(examples), out / "examples.parquet")
    if labels:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["layer", "index", "label"])
        for (layer, index), info in written.items():
            writer.writerow([layer, index, info["label"]])
        (out / "labels.csv").write_text(buf.getvalue(), encoding="utf-8")
    return written
