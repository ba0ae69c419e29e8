"""Which on-disk dictionary format a directory holds, and loading it.

=============================  =================================================================
format                         directory layout
=============================  =================================================================
``saelens``                    ``layer_<i>/cfg.json`` + ``layer_<i>/sae_weights.safetensors``
                               (sae-lens ``save_model``), one folder per layer
``circuit_tracer_clt``         ``config.yaml`` (``model_kind: cross_layer_transcoder``) +
                               ``W_enc_<i>.safetensors`` + ``W_dec_<i>.safetensors``
``circuit_tracer_transcoder_set``  ``config.yaml`` (``model_kind: transcoder_set``) +
                               ``layer_<i>.safetensors`` (or the files its ``transcoders:`` lists)
``gemmascope``                 ``layer_<i>/.../params.npz``
``gemmascope2``                ``layer_<i>/.../params.safetensors``
``eleuther_topk``              ``<hookpoint>/cfg.json`` + ``<hookpoint>/sae.safetensors`` (sparsify)
=============================  =================================================================

(see :mod:`circuitgraph.dictionaries.layer_formats` for the tensors of the last four).

:func:`detect_format` names the format from the files present; :func:`load_dictionaries`
loads it (the format can also be given, as the spec's ``transcoders.format``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from circuitgraph.errors import LoadError

__all__ = ["FORMATS", "detect_format", "load_dictionaries"]

FORMATS = ("saelens", "circuit_tracer_clt", "circuit_tracer_transcoder_set", "gemmascope", "gemmascope2",
           "eleuther_topk")


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
        if kind == "transcoder_set":
            return "circuit_tracer_transcoder_set"
        raise LoadError(f"{cfg}: model_kind {kind!r} is not supported; expected cross_layer_transcoder or "
                        "transcoder_set")
    layer_dirs = [p for p in path.iterdir() if p.is_dir() and p.name.startswith("layer_")]
    if layer_dirs:
        if any((p / "cfg.json").is_file() for p in layer_dirs):
            return "saelens"
        if any(next(p.rglob("params.npz"), None) for p in layer_dirs):
            return "gemmascope"
        if any(next(p.rglob("params.safetensors"), None) for p in layer_dirs):
            return "gemmascope2"
        return "saelens"  # its loader names what is missing
    if any((p / "cfg.json").is_file() and (p / "sae.safetensors").is_file() for p in path.iterdir() if p.is_dir()):
        return "eleuther_topk"
    raise LoadError(
        f"{path}: no dictionary format recognised; expected layer_<i>/cfg.json + sae_weights.safetensors "
        "(sae-lens), config.yaml + W_enc_<i>/W_dec_<i>.safetensors (circuit-tracer CLT) or + layer_<i>.safetensors "
        "(circuit-tracer transcoder_set), layer_<i>/.../params.npz or params.safetensors (GemmaScope / -2), "
        "<hookpoint>/cfg.json + sae.safetensors (EleutherAI sparsify); see docs/dictionaries.md"
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
    path = Path(path)
    if fmt == "circuit_tracer_transcoder_set":
        from circuitgraph.dictionaries.clt import read_config_yaml
        from circuitgraph.dictionaries.layer_formats import load_transcoder_set_dir

        return load_transcoder_set_dir(path, adapter, read_config_yaml(path / "config.yaml"), layers=layers,
                                       dtype=dtype)
    if fmt in ("gemmascope", "gemmascope2"):
        from circuitgraph.dictionaries.layer_formats import load_gemmascope_dir

        return load_gemmascope_dir(path, adapter, version=1 if fmt == "gemmascope" else 2, layers=layers,
                                   dtype=dtype)
    if fmt == "eleuther_topk":
        from circuitgraph.dictionaries.layer_formats import load_eleuther_dir

        return load_eleuther_dir(path, adapter, layers=layers, dtype=dtype)
    from circuitgraph.dictionaries.transcoders import TranscoderSet

    return TranscoderSet.from_dir(path, adapter, layers=layers, dtype=dtype)
