"""Held-out metrics of trained dictionaries (model units, from the exported weights).

Per layer: the explained variance of the MLP output ``1 - sum ||y - y_hat||^2 / sum ||y - mean(y)||^2``,
L0 (mean active features per token), dead features (never active on the held-out tokens) and dense
features (active on more than :data:`DENSE` of them).  The replacement model's next-token loss:
the model's own CE, the CE with the dictionaries' reconstructions spliced in for the MLP outputs
of the trained layers, and the CE with those MLPs zero-ablated; ``loss_recovered`` =
``(ce_zero - ce_spliced) / (ce_zero - ce_model)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.training.activation_stream import layer_activations, next_token_loss, spliced
from circuitgraph.training.dictionary import DictionaryWeights, activate, apply_weights

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["evaluate", "splice_function", "DENSE"]

#: a feature active on more than this fraction of tokens counts as dense
DENSE = 0.1


def splice_function(w: DictionaryWeights):
    """``replace(i, inputs)`` for :func:`circuitgraph.training.activation_stream.spliced`: the reconstruction
    of output ``i`` from the inputs ``(B, T, D)`` of layers ``<= i``."""
    def act(j: int, x: torch.Tensor) -> torch.Tensor:
        h = x.float() @ w.W_enc[j].T.to(x.device) + w.b_enc[j].to(x.device)
        return activate(h, None if w.threshold is None else w.threshold[j].to(x.device), w.topk)

    def replace(i: int, inputs: dict[int, torch.Tensor]) -> torch.Tensor:
        x = inputs[i].float()
        out = w.b_dec[i].to(x.device).expand_as(x).clone()
        if w.kind == "cross_layer_transcoder":
            for j in range(i + 1):
                out = out + act(j, inputs[j]) @ w.W_dec[j][:, i - j].to(x.device)
        else:
            out = out + act(i, x) @ w.W_dec[i].to(x.device)
        if w.W_skip is not None:
            out = out + x @ w.W_skip[i].T.to(x.device)
        return out

    return replace


def evaluate(adapter: ModelAdapter, w: DictionaryWeights, windows: torch.Tensor, layers: list[int], *, batch: int,
             skip_first: bool) -> dict[str, Any]:
    """The metrics (see the module docstring) on the held-out ``windows``."""
    n, F = len(layers), w.b_enc.shape[1]
    sse = torch.zeros(n, dtype=torch.float64)
    sy = torch.zeros(n, w.b_dec.shape[1], dtype=torch.float64)
    syy = torch.zeros(n, dtype=torch.float64)
    fired = torch.zeros(n, F, dtype=torch.float64)
    l0 = torch.zeros(n, dtype=torch.float64)
    count = 0
    ce = {"model": 0.0, "spliced": 0.0, "zero_ablated": 0.0}
    start = 1 if skip_first else 0
    replace = splice_function(w)
    for b in range(0, len(windows), batch):
        tokens = windows[b:b + batch]
        x, y = layer_activations(adapter, tokens, layers, skip_first=skip_first)
        x, y = x.cpu(), y.cpu()
        a, recon = apply_weights(w, x)
        sse += (recon - y).double().pow(2).sum((1, 2))
        sy += y.double().sum(1)
        syy += y.double().pow(2).sum((1, 2))
        active = a > 0
        fired += active.double().sum(1)
        l0 += active.double().sum((1, 2))
        count += x.shape[1]
        k = len(tokens)
        ce["model"] += k * next_token_loss(adapter, tokens)
        with spliced(adapter, layers, replace, start=start):
            ce["spliced"] += k * next_token_loss(adapter, tokens)
        with spliced(adapter, layers, None, start=start):
            ce["zero_ablated"] += k * next_token_loss(adapter, tokens)
    total_var = syy - sy.pow(2).sum(-1) / count
    ev = 1 - sse / total_var
    freq = fired / count
    ce = {k: v / len(windows) for k, v in ce.items()}
    gap = ce["zero_ablated"] - ce["model"]
    return {
        "held_out_tokens": count,
        "layers": {str(l): {"explained_variance": float(ev[i]), "l0": float(l0[i] / count),
                            "dead_fraction": float((fired[i] == 0).double().mean()),
                            "dense_fraction": float((freq[i] > DENSE).double().mean())}
                   for i, l in enumerate(layers)},
        "ce_loss": ce,
        "loss_recovered": float((ce["zero_ablated"] - ce["spliced"]) / gap) if gap != 0 else None,
    }
