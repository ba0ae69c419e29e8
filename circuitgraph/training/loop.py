"""The training loop: batches of windows in a seeded order, Adam, checkpoints, resume.

Step ``s`` trains on windows ``order(s)`` (a permutation of the training windows per epoch, from
the seed), so a run resumed from a checkpoint (parameters, optimiser state, step) sees the same
batches as an uninterrupted one and, on CPU, ends with the same weights.  A checkpoint is written
to a temporary file and renamed, so a kill never leaves a half-written one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.training.activation_stream import layer_activations
from circuitgraph.training.dictionary import TrainableDictionary

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["LoopConfig", "Progress", "train_loop", "batch_ids", "CHECKPOINT"]

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    batch: int
    lr: float
    sparsity: float
    seed: int
    checkpoint_every: int
    skip_first: bool


@dataclass(frozen=True)
class Progress:
    """One step's numbers (training batch, normalised units)."""

    step: int
    steps: int
    tokens: int
    tokens_per_s: float
    loss: float
    mse: float
    l0: float
    explained_variance: float


def batch_ids(step: int, n_windows: int, batch: int, seed: int) -> torch.Tensor:
    per_epoch = max(n_windows // batch, 1)
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(n_windows, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch + 1))
    return perm[k * batch:(k + 1) * batch]


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train_loop(adapter: ModelAdapter, windows: torch.Tensor, layers: list[int], module: TrainableDictionary,
               cfg: LoopConfig, out_dir: Path, *, resume: bool = True,
               progress: Callable[[Progress], None] | None = None, stop_after: int | None = None) -> int:
    """Train ``module`` in place; returns the step reached (``cfg.steps`` unless ``stop_after``
    stopped it early, as a kill would, after the checkpoint of that step)."""
    device = adapter.device
    module.to(device)
    opt = torch.optim.Adam(module.parameters(), lr=cfg.lr)
    ckpt = out_dir / CHECKPOINT
    step = 0
    if resume and ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    else:  # the normalising scales and the decoder bias, from the first batch
        x, y = layer_activations(adapter, windows[batch_ids(0, len(windows), cfg.batch, cfg.seed)], layers,
                                 skip_first=cfg.skip_first)
        module.s_in.copy_(x.norm(dim=-1).pow(2).mean(dim=1).sqrt().clamp(min=1e-8))
        module.s_out.copy_(y.norm(dim=-1).pow(2).mean(dim=1).sqrt().clamp(min=1e-8))
        with torch.no_grad():  # the decoder bias starts at the mean output (normalised units)
            module.b_dec.copy_(y.mean(dim=1) / module.s_out[:, None])
    t0, tokens_done = time.perf_counter(), 0
    while step < cfg.steps:
        tokens = windows[batch_ids(step, len(windows), cfg.batch, cfg.seed)]
        x, y = layer_activations(adapter, tokens, layers, skip_first=cfg.skip_first)
        x = x / module.s_in[:, None, None]
        y = y / module.s_out[:, None, None]
        a, recon = module(x)
        mse = (recon - y).pow(2).sum(-1).mean(-1).sum()
        sparse = (a * module.decoder_norms()[:, None, :]).sum(-1).mean(-1).sum()
        loss = mse + cfg.sparsity * sparse
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        tokens_done += x.shape[1]
        if progress is not None:
            with torch.no_grad():
                var = (y - y.mean(1, keepdim=True)).pow(2).sum(-1).mean(-1).sum()
                progress(Progress(step, cfg.steps, tokens_done, tokens_done / max(time.perf_counter() - t0, 1e-9),
                                  float(loss), float(mse), float((a > 0).sum(-1).float().mean()),
                                  float(1 - mse / var)))
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            _save(ckpt, {"module": module.state_dict(), "optimizer": opt.state_dict(), "step": step})
        if stop_after is not None and step >= stop_after:
            break
    return step
