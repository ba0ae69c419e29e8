"""Trained weights -> circuit-tracer 0.5.0's on-disk layouts (read by circuitgraph and circuit-tracer as they are).

``transcoder_set`` (per-layer and skip transcoders)::

    config.yaml            model_kind: transcoder_set, feature_input_hook, feature_output_hook, scan
    layer_<l>.safetensors  W_enc (F, D), W_dec (F, D), b_enc (F,), b_dec (D,),
                           [activation_function.threshold (F,)], [W_skip (D, D), used as x @ W_skip.T]

``cross_layer_transcoder``::

    config.yaml            model_kind: cross_layer_transcoder, feature_input_hook, feature_output_hook, scan
    W_enc_<l>.safetensors  W_enc_<l> (F, D), b_enc_<l> (F,), b_dec_<l> (D,), [threshold_<l> (F,)]
    W_dec_<l>.safetensors  W_dec_<l> (F, n_layers - l, D)

TopK dictionaries: circuit-tracer 0.5.0 has no TopK activation (its loaders pick JumpReLU when a
threshold is stored, else ReLU), so no circuit-tracer layout can hold one (:data:`CIRCUIT_TRACER_TOPK`).
Per-layer and skip TopK transcoders are written in EleutherAI sparsify's published layout, which
circuitgraph reads (``eleuther_topk``) and circuit-tracer refuses (no ``config.yaml``) instead of
misreading::

    layers.<l>.mlp/cfg.json          activation: topk, k, num_latents, d_in, transcode: true, skip_connection
    layers.<l>.mlp/sae.safetensors   encoder.weight (F, D), encoder.bias (F,), W_dec (F, D), b_dec (D,),
                                     [W_skip (D, D), used as m @ W_skip.T]

These read the MLP's *input* ``m = gamma * n + beta`` (``n`` = ``ln2.hook_normalized``), so the
trained encoder is written unfolded: ``encoder.weight = W_enc / gamma``, ``encoder.bias = b_enc -
encoder.weight @ beta`` (and ``W_skip / gamma``, ``b_dec - (W_skip / gamma) @ beta``); circuitgraph's
reader folds it back.  A TopK cross-layer transcoder keeps the CLT layout with circuitgraph's
``config.yaml`` extension ``activation_function: topk``, ``topk: K``; circuit-tracer's ``load_clt``
ignores ``config.yaml`` and would read it as ReLU, which :func:`circuit_tracer_refusal` says.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from circuitgraph.errors import SpecError
from circuitgraph.training.activation_stream import INPUT_HOOK, OUTPUT_HOOK
from circuitgraph.training.dictionary import DictionaryWeights

__all__ = ["write_dictionaries", "circuit_tracer_refusal", "CIRCUIT_TRACER_TOPK", "sparsify_cfg"]

CIRCUIT_TRACER_TOPK = ("circuit-tracer 0.5.0 cannot read TopK dictionaries: it has no TopK activation (its "
                       "transcoder_set and cross_layer_transcoder loaders use JumpReLU when a threshold is stored, "
                       "else ReLU, so they would compute other features); only circuitgraph reads them")


def circuit_tracer_refusal(w: DictionaryWeights) -> str | None:
    """Why circuit-tracer 0.5.0 cannot read these dictionaries as they are, or None when it can."""
    return CIRCUIT_TRACER_TOPK if w.topk is not None else None


def sparsify_cfg(d_in: int, width: int, k: int, *, skip: bool) -> dict:
    """A sparsify ``cfg.json`` (``SparseCoderConfig`` fields plus ``d_in``) of a TopK transcoder."""
    return {"activation": "topk", "expansion_factor": max(width // d_in, 1), "normalize_decoder": True,
            "num_latents": width, "k": k, "multi_topk": False, "skip_connection": skip, "transcode": True,
            "d_in": d_in}


def _unfold(M: torch.Tensor, b: torch.Tensor, gamma: torch.Tensor | None, beta: torch.Tensor | None,
            where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M', b')`` with ``m @ M'.T + b' == n @ M.T + b`` for ``m = gamma * n + beta`` (float64)."""
    M, b = M.double(), b.double()
    if gamma is not None:
        if bool((gamma == 0).any()):
            raise SpecError(f"{where}: the MLP input norm has zero weights, so a TopK transcoder cannot be written "
                            "in sparsify's layout (it reads the MLP input); use activation relu or jump_relu")
        M = M / gamma.double()[None, :]
    if beta is not None:
        b = b - M @ beta.double()
    return M, b


def write_dictionaries(w: DictionaryWeights, layers: list[int], folder: Path, *, scan: str,
                       norms: list[tuple[torch.Tensor | None, torch.Tensor | None]] | None = None) -> Path:
    """Write ``w`` (trained for ``layers``) into ``folder`` in the layout of its kind (see the module
    docstring); ``norms`` (per layer ``(gamma, beta)`` of ln2) is needed by per-layer TopK."""
    folder.mkdir(parents=True, exist_ok=True)
    clt = w.kind == "cross_layer_transcoder"
    c = lambda t: t.detach().cpu().float().contiguous()  # noqa: E731
    if w.topk is not None and not clt:
        if norms is None:
            raise ValueError("per-layer TopK transcoders need the ln2 norms to be written in sparsify's layout")
        for i, l in enumerate(layers):
            sub = folder / f"layers.{l}.mlp"
            sub.mkdir(parents=True, exist_ok=True)
            enc, b_enc = _unfold(w.W_enc[i], w.b_enc[i], *norms[i], where=str(sub))
            t = {"encoder.weight": c(enc), "encoder.bias": c(b_enc), "W_dec": c(w.W_dec[i]), "b_dec": c(w.b_dec[i])}
            if w.W_skip is not None:
                t["W_skip"], t["b_dec"] = map(c, _unfold(w.W_skip[i], w.b_dec[i], *norms[i], where=str(sub)))
            save_file(t, str(sub / "sae.safetensors"))
            cfg = sparsify_cfg(w.W_enc.shape[2], w.W_enc.shape[1], w.topk, skip=w.W_skip is not None)
            (sub / "cfg.json").write_text(json.dumps(cfg) + "\n", encoding="utf-8")
        return folder
    config = {"model_kind": "cross_layer_transcoder" if clt else "transcoder_set",
              "feature_input_hook": INPUT_HOOK, "feature_output_hook": OUTPUT_HOOK, "scan": scan}
    if w.topk is not None:
        config |= {"activation_function": "topk", "topk": int(w.topk)}
    for i, l in enumerate(layers):
        if clt:
            enc = {f"W_enc_{l}": c(w.W_enc[i]), f"b_enc_{l}": c(w.b_enc[i]), f"b_dec_{l}": c(w.b_dec[i])}
            if w.threshold is not None:
                enc[f"threshold_{l}"] = c(w.threshold[i])
            save_file(enc, str(folder / f"W_enc_{l}.safetensors"))
            save_file({f"W_dec_{l}": c(w.W_dec[i])}, str(folder / f"W_dec_{l}.safetensors"))
        else:
            t = {"W_enc": c(w.W_enc[i]), "W_dec": c(w.W_dec[i]), "b_enc": c(w.b_enc[i]), "b_dec": c(w.b_dec[i])}
            if w.threshold is not None:
                t["activation_function.threshold"] = c(w.threshold[i])
            if w.W_skip is not None:
                t["W_skip"] = c(w.W_skip[i])
            save_file(t, str(folder / f"layer_{l}.safetensors"))
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return folder
