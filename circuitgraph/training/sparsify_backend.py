"""``train: {backend: sparsify}``: per-layer and skip TopK transcoders trained by EleutherAI's
``eai-sparsify`` (``pip install 'circuitgraph-lm[train-sparsify]'``; pinned, its ``Trainer`` is used
as a library).

What sparsify does: its ``Trainer`` runs the Hugging Face model on batches of token windows,
reads each hooked MLP's input and output by forward hooks (``layers.<l>.mlp``; streamed, nothing
cached) and trains a TopK transcoder per layer on the fraction of variance unexplained (its
default optimiser: signum with schedule-free averaging; its default learning rate unless
``train.lr`` is given).  What circuitgraph adds around it:

* the same text windows, held-out split and batch order as its own trainer (step ``s`` trains
  on the same windows), BOS tokens excluded (sparsify masks BOS by token id, so a BOS that
  separates documents inside a window is left out too);
* checkpoints every ``checkpoint_every`` steps, written to a temporary folder and renamed (a kill
  never leaves half a checkpoint), and resume: a rerun loads the last one and, on CPU, ends with
  the same weights as an uninterrupted run.  ``fit`` is run one checkpoint interval at a time and
  saves at its end (sparsify's own in-loop ``save_every`` records ``global_step`` one step short,
  and its resume leaves the schedule-free optimiser's parameters at their averaged point ``x``
  instead of moving them back to ``y``; both are avoided here);
* a check on the first batch that the Hugging Face MLP input sparsify trains on is
  ``gamma * ln2.hook_normalized + beta`` of circuitgraph's model (the site circuitgraph folds it to);
* the outputs: sparsify's ``<hookpoint>/{cfg.json, sae.safetensors}`` copied as they are into
  ``dictionaries/`` (circuitgraph's ``eleuther_topk`` format) and read back for the held-out
  metrics, which circuitgraph computes on its own model (:mod:`circuitgraph.training.quality`).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file

from circuitgraph._io import read_json_file
from circuitgraph.adapters.files import model_folder_format
from circuitgraph.adapters.model_sources import existing_model_folder
from circuitgraph.errors import SpecError
from circuitgraph.training.activation_stream import layer_activations
from circuitgraph.training.dictionary import DictionaryWeights
from circuitgraph.training.loop import Progress, batch_ids

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.spec.model import ModelSpec
    from circuitgraph.spec.train import TrainRunSpec

__all__ = ["sparsify_unavailable", "train_with_sparsify", "read_sparsify_folder", "SPARSIFY_VERSION", "CHECKPOINT_DIR"]

#: the version the backend is written and tested against (the extra pins it)
SPARSIFY_VERSION = "1.3.3"
#: sparsify's checkpoint folder inside train.output
CHECKPOINT_DIR = "sparsify_checkpoint"


def sparsify_unavailable() -> str | None:
    """Why the sparsify backend cannot run here, or None when it can."""
    try:
        got = version("eai-sparsify")
    except PackageNotFoundError:
        return "eai-sparsify is not installed: pip install 'circuitgraph-lm[train-sparsify]'"
    if got != SPARSIFY_VERSION:
        return (f"eai-sparsify {got} is installed, the backend is written for {SPARSIFY_VERSION}: "
                "pip install 'circuitgraph-lm[train-sparsify]'")
    return None


def _model_folder(model_spec: ModelSpec) -> Path:
    """The Hugging Face folder sparsify reads the model from: the source's local folder (a
    ``path`` folder, a GGUF file's converted folder, a fetched pretrained model)."""
    folder = existing_model_folder(model_spec)
    if folder is None or not (folder / "config.json").is_file() or model_folder_format(folder) != "huggingface":
        given = f"model.{model_spec.source} {getattr(model_spec, model_spec.source)!r}"
        raise SpecError(f"train.backend sparsify needs a Hugging Face model folder with config.json (model.path or "
                        f"model.pretrained, fetched), {given} is not one here; use backend circuitgraph")
    return folder


def _mlp_hookpoints(hf_model: PreTrainedModel, layers: list[int]) -> list[str]:
    from sparsify.utils import get_layer_list

    name, blocks = get_layer_list(hf_model)
    for l in layers:
        if not hasattr(blocks[l], "mlp"):
            raise SpecError(f"train.backend sparsify: block {l} ({type(blocks[l]).__name__}) has no .mlp module; "
                            "use backend circuitgraph")
    return [f"{name}.{l}.mlp" for l in layers]


def _check_input_site(adapter: ModelAdapter, hf_model: PreTrainedModel, hookpoints: list[str], layers: list[int],
                      tokens: torch.Tensor,
                      norms: list[tuple[Any, Any]]) -> None:
    """The HF MLP input (what sparsify reads) is ``gamma * n + beta`` with ``n`` circuitgraph's
    ``ln2.hook_normalized`` (what the eleuther_topk reader folds it to)."""
    got: dict[str, torch.Tensor] = {}
    mods = {hf_model.base_model.get_submodule(h): h for h in hookpoints}

    def keep(mod, args, kwargs=None):
        got[mods[mod]] = args[0].detach()

    handles = [m.register_forward_pre_hook(keep) for m in mods]
    try:
        with torch.no_grad():
            hf_model(tokens.to(hf_model.device))
    finally:
        for h in handles:
            h.remove()
    x, _ = layer_activations(adapter, tokens, layers, skip_first=False)
    for i, (h, (gamma, beta)) in enumerate(zip(hookpoints, norms, strict=True)):
        n = x[i].double().cpu()
        m = n * (1 if gamma is None else gamma) + (0 if beta is None else beta)
        hf = got[h].double().cpu().reshape(m.shape)
        err = float((hf - m).abs().max() / m.abs().max().clamp(min=1e-12))
        if err > 1e-3:
            raise SpecError(f"train.backend sparsify: the input of {h} in the Hugging Face model differs from "
                            f"gamma * ln2.hook_normalized of circuitgraph's model by {err:.2g} (relative); the two "
                            "loaders disagree on this model, use backend circuitgraph")


def read_sparsify_folder(folder: Path, hookpoints: list[str], norms: list[tuple[Any, Any]], kind: str
                         ) -> DictionaryWeights:
    """sparsify's files read back (safetensors only) as weights that read ``ln2.hook_normalized``:
    ``W_enc = encoder.weight * gamma``, ``b_enc = encoder.bias + encoder.weight @ beta`` (the skip
    path likewise), in float64 then float32."""
    enc, benc, dec, bdec, skip, k = [], [], [], [], [], None
    for h, (gamma, beta) in zip(hookpoints, norms, strict=True):
        t = load_file(str(folder / h / "sae.safetensors"))
        k = int(read_json_file(folder / h / "cfg.json", "sparsify cfg.json")["k"])
        E, c, bd = t["encoder.weight"].double(), t["encoder.bias"].double(), t["b_dec"].double()
        if beta is not None:
            c = c + E @ beta
        enc.append((E if gamma is None else E * gamma[None, :]).float())
        benc.append(c.float())
        dec.append(t["W_dec"].float())
        if "W_skip" in t:
            S = t["W_skip"].double()
            if beta is not None:
                bd = bd + S @ beta
            skip.append((S if gamma is None else S * gamma[None, :]).float())
        bdec.append(bd.float())
    return DictionaryWeights(kind, torch.stack(enc), torch.stack(benc), dec, torch.stack(bdec),
                             skip if kind == "skip_transcoder" else None, None, k)


def train_with_sparsify(spec: TrainRunSpec, adapter: ModelAdapter, windows: torch.Tensor, layers: list[int], steps: int,
                        out: Path, *, bos: int | None, norms: list[tuple[Any, Any]],
                        progress: Callable[[Progress], None] | None = None,
                        stop_after: int | None = None) -> tuple[int, list[str]]:
    """Train with sparsify; returns ``(step reached, hookpoints)``; the latest checkpoint (the
    trained transcoders once the step reached is ``steps``) is ``out/CHECKPOINT_DIR/<hookpoint>/``."""
    why = sparsify_unavailable()
    if why is not None:
        raise SpecError(f"train.backend sparsify: {why}")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    with redirect_stdout(io.StringIO()):  # sparsify prints which decoder it uses on import
        from sparsify import SparseCoderConfig, TrainConfig, Trainer

    t = spec.train
    folder = _model_folder(spec.model)
    with redirect_stderr(io.StringIO()):  # transformers's loading bar
        hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(adapter.device).eval()
    hookpoints = _mlp_hookpoints(hf_model, layers)
    order = torch.cat([windows[batch_ids(s, len(windows), t.batch, t.seed)] for s in range(steps)])
    _check_input_site(adapter, hf_model, hookpoints, layers, order[: t.batch], norms)
    ds = Dataset.from_dict({"input_ids": order.tolist()}).with_format("torch")
    cfg = TrainConfig(SparseCoderConfig(activation="topk", num_latents=t.width, k=t.k, transcode=True,
                                        skip_connection=t.kind == "skip_transcoder"),
                      batch_size=t.batch, loss_fn="fvu", lr=t.lr if "lr" in t.model_fields_set else None,
                      exclude_tokens=[] if bos is None else [int(bos)], hookpoints=hookpoints,
                      init_seeds=[t.seed], save_every=10**12, log_to_wandb=False, save_dir=str(out),
                      run_name=CHECKPOINT_DIR)
    ckpt = out / CHECKPOINT_DIR

    class _Trainer(Trainer):
        def save(self) -> None:  # atomically: a temporary folder renamed over the last checkpoint
            tmp, old = ckpt.with_name(ckpt.name + ".tmp"), ckpt.with_name(ckpt.name + ".old")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
            self._checkpoint(self.saes, str(tmp), True)
            if ckpt.exists():
                os.replace(ckpt, old)
            os.replace(tmp, ckpt)
            shutil.rmtree(old, ignore_errors=True)

    precision = torch.get_float32_matmul_precision()
    real_out, real_err = sys.stdout, sys.stderr
    # sparsify's prints and progress bars are kept out of the output: circuitgraph shows its own progress
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        try:
            return _fit(_Trainer, cfg, ds, hf_model, ckpt, t, steps, hookpoints, (real_out, real_err), progress,
                        stop_after)
        finally:
            torch.set_float32_matmul_precision(precision)


def _fit(trainer_class: Any, cfg: Any, ds: Any, hf_model: PreTrainedModel, ckpt: Path, t: Any, steps: int,
         hookpoints: list[str], streams: tuple[Any, Any], progress: Callable[[Progress], None] | None,
         stop_after: int | None) -> tuple[int, list[str]]:
    from schedulefree import ScheduleFreeWrapper

    torch.manual_seed(t.seed)
    trainer = trainer_class(cfg, ds, hf_model)
    old = ckpt.with_name(ckpt.name + ".old")
    if not ckpt.exists() and old.exists():  # killed between the two renames of a save
        os.replace(old, ckpt)
    if t.resume and (ckpt / "state.pt").is_file():
        trainer.load_state(str(ckpt))
        for opt in trainer.optimizers:  # saved at the averaged point x: back to y, as after a save
            if isinstance(opt, ScheduleFreeWrapper):
                opt.train_mode = False
                opt.train()
    seen: dict[str, tuple[float, float]] = {}
    t0, done = time.perf_counter(), [0]

    def record(name: str):
        def hook(module, args, kwargs, output) -> None:
            seen[name] = (float(output.fvu.detach()), float((output.latent_acts.detach() > 0).sum(-1).float().mean()))
            done[0] += output.latent_acts.shape[0] if name == hookpoints[0] else 0
            if len(seen) == len(hookpoints) and progress is not None:
                fvu = [seen[h][0] for h in hookpoints]
                with redirect_stdout(streams[0]), redirect_stderr(streams[1]):
                    progress(Progress(trainer.global_step + 1, steps, done[0],
                                      done[0] / max(time.perf_counter() - t0, 1e-9), sum(fvu), sum(fvu),
                                      sum(seen[h][1] for h in hookpoints) / len(hookpoints),
                                      1 - sum(fvu) / len(fvu)))
                seen.clear()
        return hook

    for h in hookpoints:
        trainer.saes[h].register_forward_hook(record(h), with_kwargs=True)
    while trainer.global_step < steps:
        end = min((trainer.global_step // t.checkpoint_every + 1) * t.checkpoint_every, steps)
        trainer.dataset = ds.select(range(end * t.batch))
        trainer.fit()  # trains steps global_step .. end - 1, then saves
        if stop_after is not None and trainer.global_step >= stop_after:
            break
    return trainer.global_step, hookpoints
