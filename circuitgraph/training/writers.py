"""Trained weights -> circuit-tracer 0.5.0's on-disk layouts (read by circuitgraph and circuit-tracer as they are).

``transcoder_set`` (per-layer and skip transcoders)::

    config.yaml            model_kind: transcoder_set, feature_input_hook, feature_output_hook, scan
    layer_<l>.safetensors  W_enc (F, D), W_dec (F, D), b_enc (F,), b_dec (D,),
                           [activation_function.threshold (F,)], [W_skip (D, D), used as x @ W_skip.T]

``cross_layer_transcoder``::

    config.yaml            model_kind: cross_layer_transcoder, feature_input_hook, feature_output_hook, scan
    W_enc_<l>.safetensors  W_enc_<l> (F, D), b_enc_<l> (F,), b_dec_<l> (D,), [threshold_<l> (F,)]
    W_dec_<l>.safetensors  W_dec_<l> (F, n_layers - l, D)
"""

from __future__ import annotations

from pathlib import Path

import yaml
from safetensors.torch import save_file

from circuitgraph.training.activation_stream import INPUT_HOOK, OUTPUT_HOOK
from circuitgraph.training.dictionary import DictionaryWeights

__all__ = ["write_dictionaries"]


def write_dictionaries(w: DictionaryWeights, layers: list[int], folder: Path, *, scan: str) -> Path:
    """Write ``w`` (trained for ``layers``) into ``folder`` in circuit-tracer's layout of its kind."""
    folder.mkdir(parents=True, exist_ok=True)
    clt = w.kind == "cross_layer_transcoder"
    config = {"model_kind": "cross_layer_transcoder" if clt else "transcoder_set",
              "feature_input_hook": INPUT_HOOK, "feature_output_hook": OUTPUT_HOOK, "scan": scan}
    for i, l in enumerate(layers):
        c = lambda t: t.detach().cpu().float().contiguous()  # noqa: E731
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
