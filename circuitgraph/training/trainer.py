"""``circuitgraph train SPEC``: from a training spec to dictionaries, metrics.json and report.html."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.adapters.loading import load_model_spec
from circuitgraph.dictionaries.mlp_input import mlp_input_norm
from circuitgraph.errors import SpecError
from circuitgraph.spec.model import ModelSpec
from circuitgraph.training.data import read_documents, split_windows, token_windows
from circuitgraph.training.dictionary import TrainableDictionary
from circuitgraph.training.loop import LoopConfig, Progress, train_loop
from circuitgraph.training.quality import evaluate
from circuitgraph.training.report import report_html
from circuitgraph.training.sparsify_backend import CHECKPOINT_DIR, read_sparsify_folder, train_with_sparsify
from circuitgraph.training.writers import circuit_tracer_refusal, write_dictionaries

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.spec.model import ModelSpec
    from circuitgraph.spec.train import TrainRunSpec

__all__ = ["train", "load_model", "DICTIONARY_FOLDER"]

#: the dictionaries' folder inside train.output
DICTIONARY_FOLDER = "dictionaries"


def load_model(model_spec: ModelSpec) -> ModelAdapter:
    """The model adapter of a spec's ``model:`` section (any model circuitgraph loads), in its
    ``dtype``: the run's model sources (:data:`~circuitgraph.adapters.model_sources.MODEL_SOURCES`)."""
    return load_model_spec(model_spec, dtype=model_spec.dtype)


def train(spec: TrainRunSpec, *, adapter: ModelAdapter | None = None,
          progress: Callable[[Progress], None] | None = None,
          stop_after: int | None = None) -> dict[str, Any]:
    """Train the dictionaries a :class:`~circuitgraph.spec.train.TrainRunSpec` describes; returns
    the metrics written to ``train.output/metrics.json`` (or, when ``stop_after`` stops the run
    early as a kill would, ``{"stopped_at": step}`` and nothing but the checkpoint)."""
    t = spec.train
    adapter = load_model(spec.model) if adapter is None else adapter
    f = adapter.facts
    layers = list(range(f.n_layers)) if t.layers is None else sorted(t.layers)
    bad = [l for l in layers if l >= f.n_layers]
    if bad:
        raise SpecError(f"train.layers: layers {bad} requested, the model has {f.n_layers} layers "
                        f"(0-{f.n_layers - 1}); list layers of the model")
    tok = adapter.tokenizer
    if tok is None:
        raise SpecError("train: the model has no tokenizer, so text cannot be tokenised; give a model folder "
                        "with tokenizer files")
    bos = getattr(tok, "bos_id", None)
    windows = token_windows(read_documents(list(t.text), t.text_field), tok, t.context, bos_id=bos)
    skip_first = bos is not None
    per_window = t.context - (1 if skip_first else 0)
    train_w, eval_w = split_windows(windows, -(-t.eval_tokens // per_window), t.seed)
    steps = max(-(-t.tokens // (t.batch * per_window)), 1)
    out = Path(t.output)
    out.mkdir(parents=True, exist_ok=True)
    last: list[Progress] = []

    def seen(p: Progress) -> None:
        last[:] = [p]
        if progress is not None:
            progress(p)

    norms = [mlp_input_norm(adapter, l) for l in layers]
    # the dictionaries folder is this command's own output, rewritten whole (a TopK run writes another
    # layout than a ReLU run: left-over files of an earlier run would make the folder ambiguous)
    shutil.rmtree(out / DICTIONARY_FOLDER, ignore_errors=True)
    t0 = time.perf_counter()
    if t.backend == "sparsify":
        reached, hookpoints = train_with_sparsify(spec, adapter, train_w, layers, steps, out, bos=bos, norms=norms,
                                                  progress=seen, stop_after=stop_after)
        seconds = time.perf_counter() - t0
        if reached < steps:
            return {"stopped_at": reached}
        folder = out / DICTIONARY_FOLDER
        for h in hookpoints:  # sparsify's files as they are (circuitgraph's eleuther_topk format)
            (folder / h).mkdir(parents=True, exist_ok=True)
            for name in ("cfg.json", "sae.safetensors"):
                shutil.copyfile(out / CHECKPOINT_DIR / h / name, folder / h / name)
        weights = read_sparsify_folder(folder, hookpoints, norms, t.kind)
    else:
        torch.manual_seed(t.seed)
        module = TrainableDictionary(len(layers), f.d_model, t.width, kind=t.kind, activation=t.activation,
                                     seed=t.seed, k=t.k)
        cfg = LoopConfig(steps=steps, batch=t.batch, lr=t.lr, sparsity=0.0 if t.activation == "topk" else t.sparsity,
                         seed=t.seed, checkpoint_every=t.checkpoint_every, skip_first=skip_first)
        reached = train_loop(adapter, train_w, layers, module, cfg, out, resume=t.resume, progress=seen,
                             stop_after=stop_after)
        seconds = time.perf_counter() - t0
        if reached < steps:
            return {"stopped_at": reached}
        weights = module.export()
        module.cpu()
        folder = write_dictionaries(weights, layers, out / DICTIONARY_FOLDER, scan=f"circuitgraph-train:{out.name}",
                                    norms=norms)
    metrics = {
        "settings": {"backend": t.backend, "kind": t.kind, "activation": t.activation,
                     **({"k": t.k} if t.activation == "topk" else {}), "layers": layers, "width": t.width,
                     "context": t.context, "tokens": t.tokens, "batch": t.batch,
                     "lr": t.lr if t.backend == "circuitgraph" or "lr" in t.model_fields_set else "sparsify default",
                     "sparsity": t.sparsity,
                     "seed": t.seed, "model": str(getattr(spec.model, spec.model.source)),
                     "text": [str(p) for p in t.text], "train_windows": len(train_w), "held_out_windows": len(eval_w),
                     "bos": bos is not None},
        "steps": steps, "train_tokens": steps * t.batch * per_window, "seconds": seconds,
        "last": asdict(last[0]) if last else {"loss": float("nan"), "l0": float("nan"),
                                               "explained_variance": float("nan")},
        "dictionaries": str(folder),
        "circuit_tracer": circuit_tracer_refusal(weights) or "reads the dictionaries folder as it is",
        "eval": evaluate(adapter, weights, eval_w, layers, batch=t.batch, skip_first=skip_first),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    (out / "report.html").write_text(report_html(metrics), encoding="utf-8")
    return metrics
