"""Which on-disk dictionary format a directory holds, and loading it.

=============================  =================================================================
format                         directory layout
=============================  =================================================================
``saelens``                    ``layer_<i>/cfg.json`` + ``layer_<i>/sae_weights.safetensors``
                               (sae-lens ``save_model``), one folder per layer
``circuit_tracer_clt``         ``config.yaml`` (``model_kind: cross_layer_transcoder``) +
                               ``W_enc_<i>.safetensors`` + ``W_dec_<i>.safetensors``
=============================  =================================================================

:func:`detect_format` names the format from the files present; :func:`load_dictionaries`
loads it (the format can also be given, as the spec's ``transcoders.format``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from circuitgraph.errors import LoadError

__all__ = ["FORMATS", "detect_format", "load_dictionaries"]

FORMATS = ("saelens", "circuit_tracer_clt")


def detect_format(path: str | Path) -> str:
    """The format of dictionary directory ``path`` (one-line LoadError when none fits)."""
    path = Path(path)
    if not path.is_dir():
        raise LoadError(f"transcoder directory {path} does not exist; give the folder that holds the dictionary")
    cfg = path / "config.yaml"
    if cfg.is_file():
        from circuitgraph.dictionaries.clt import read_config_yaml

        kind = read_config_yaml(cfg).get("model_kind")
        if kind == "cross_layer_transcoder":
            return "circuit_tracer_clt"
        raise LoadError(f"{cfg}: model_kind {kind!r} is not supported; expected cross_layer_transcoder")
    if any(p.is_dir() and p.name.startswith("layer_") for p in path.iterdir()):
        return "saelens"
    raise LoadError(
        f"{path}: no dictionary format recognised; expected layer_<i>/cfg.json + sae_weights.safetensors "
        "(sae-lens) or config.yaml + W_enc_<i>.safetensors + W_dec_<i>.safetensors (circuit-tracer CLT)"
    )


def load_dictionaries(path: str | Path, adapter: Any, *, format: str | None = None,
                      layers: list[int] | None = None, dtype: torch.dtype = torch.float32) -> Any:
    """Load the dictionary in ``path`` (its format detected unless given) for ``adapter``'s model.

    Returns a :class:`~circuitgraph.dictionaries.TranscoderSet` or a
    :class:`~circuitgraph.dictionaries.CrossLayerTranscoder`; both record ``format``."""
    found = detect_format(path)
    fmt = format or found
    if format is not None and format != found:
        raise LoadError(f"{path}: transcoders.format is {format!r} but the directory holds the {found!r} layout; "
                        f"set format: {found} or point path at a {format} directory")
    if fmt == "circuit_tracer_clt":
        from circuitgraph.dictionaries.clt import load_clt_dir

        if layers is not None and sorted(layers) != list(range(adapter.facts.n_layers)):
            raise LoadError(f"{path}: a cross-layer transcoder covers every layer; remove transcoders.layers "
                            f"(got {list(layers)})")
        return load_clt_dir(path, adapter, dtype=dtype)
    from circuitgraph.dictionaries.transcoders import TranscoderSet

    return TranscoderSet.from_dir(path, adapter, layers=layers, dtype=dtype)
