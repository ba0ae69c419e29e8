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
``gemmascope2``                ``layer_<i>_width_<w>_l0_<s>[_affine]/params.safetensors`` (+ ``config.json``),
                               or ``layer_<i>/.../params.safetensors``
``gemmascope2_clt``            ``config.json`` + ``params_layer_<i>.safetensors`` (GemmaScope-2 ``clt/`` folders)
``eleuther_topk``              ``<hookpoint>/cfg.json`` + ``<hookpoint>/sae.safetensors`` (sparsify)
=============================  =================================================================

(see :mod:`circuitgraph.dictionaries.layer_formats` for the tensors of the last four).

:func:`detect_format` names the format from the files present; :func:`load_dictionaries`
loads it (the format can also be given, as the spec's ``transcoders.format``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from circuitgraph._io import safetensors_header
from circuitgraph.dictionaries.clt import load_clt_dir, read_config_yaml
from circuitgraph.dictionaries.gemmascope2 import load_gemmascope2_clt_dir
from circuitgraph.dictionaries.layer_formats import load_eleuther_dir, load_gemmascope_dir, load_transcoder_set_dir
from circuitgraph.dictionaries.transcoders import TranscoderSet
from circuitgraph.errors import LoadError

__all__ = ["FORMATS", "detect_format", "dictionary_footprint", "load_dictionaries"]

FORMATS = ("saelens", "circuit_tracer_clt", "circuit_tracer_transcoder_set", "gemmascope", "gemmascope2",
           "gemmascope2_clt", "eleuther_topk")


def detect_format(path: str | Path) -> str:
    """The format of dictionary directory ``path`` (one-line LoadError when none fits)."""
    path = Path(path)
    if not path.is_dir():
        raise LoadError(f"transcoder directory {path} does not exist; give the folder that holds the dictionary")
    cfg = path / "config.yaml"
    if cfg.is_file():
        kind = read_config_yaml(cfg).get("model_kind")
        if kind == "cross_layer_transcoder":
            return "circuit_tracer_clt"
        if kind == "transcoder_set":
            return "circuit_tracer_transcoder_set"
        raise LoadError(f"{cfg}: model_kind {kind!r} is not supported; expected cross_layer_transcoder or "
                        "transcoder_set")
    if (path / "config.json").is_file() and next(path.glob("params_layer_*.safetensors"), None):
        return "gemmascope2_clt"
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
        "(circuit-tracer transcoder_set), layer_<i>/.../params.npz or layer_<i>_width_<w>_l0_<s>/params.safetensors "
        "(GemmaScope / -2), config.json + params_layer_<i>.safetensors (GemmaScope-2 CLT), "
        "<hookpoint>/cfg.json + sae.safetensors (EleutherAI sparsify); see docs/dictionaries.md"
    )


def _listed_files(path: Path, config: dict[str, Any]) -> dict[int, Path]:
    """The layer files a circuit-tracer ``config.yaml`` lists (``transcoders:``), relative to ``path``."""
    out = {}
    for i, entry in enumerate(config["transcoders"]):
        if str(entry).startswith("hf://"):
            raise LoadError(f"{path / 'config.yaml'}: transcoders[{i}] is the hub file {entry}; download it next to "
                            "config.yaml and list the local file name instead (or use transcoders: {hf: REPO})")
        out[i] = Path(str(entry)) if Path(str(entry)).is_absolute() else path / str(entry)
    return out


def load_dictionaries(path: str | Path, adapter: Any, *, format: str | None = None,
                      layers: list[int] | None = None, dtype: torch.dtype = torch.float32,
                      lazy: bool | None = None, config: dict[str, Any] | None = None) -> Any:
    """Load the dictionary in ``path`` (its format detected unless given) for ``adapter``'s model.

    Returns a :class:`~circuitgraph.dictionaries.TranscoderSet` or a
    :class:`~circuitgraph.dictionaries.CrossLayerTranscoder`; both record ``format``.  Safetensors
    layouts stay on disk: decoder rows are read for the active features only, and ``lazy``
    (default: when the encoders together exceed 1 GiB) re-reads each encoder when it is needed
    instead of keeping it (sae-lens folders and GemmaScope ``.npz`` files are read whole).
    ``config``: a circuit-tracer ``config.yaml`` already read (its hub files resolved)."""
    found = detect_format(path)
    fmt = format or found
    if format is not None and format != found:
        raise LoadError(f"{path}: transcoders.format is {format!r} but the directory holds the {found!r} layout; "
                        f"set format: {found} or point path at a {format} directory")
    if fmt == "circuit_tracer_clt":
        if layers is not None and sorted(layers) != list(range(adapter.facts.n_layers)):
            raise LoadError(f"{path}: a cross-layer transcoder covers every layer; remove transcoders.layers "
                            f"(got {list(layers)})")

        config = config or read_config_yaml(Path(path) / "config.yaml")
        if config.get("transcoders"):  # circuit-tracer's config listing GemmaScope-2 CLT layer files

            return load_gemmascope2_clt_dir(Path(path), adapter, dtype=dtype, lazy=lazy, ct_config=config,
                                            files=_listed_files(Path(path), config), format="circuit_tracer_clt")
        return load_clt_dir(path, adapter, dtype=dtype, lazy=lazy)
    if fmt == "gemmascope2_clt":
        if layers is not None and sorted(layers) != list(range(adapter.facts.n_layers)):
            raise LoadError(f"{path}: a cross-layer transcoder covers every layer; remove transcoders.layers "
                            f"(got {list(layers)})")
        return load_gemmascope2_clt_dir(Path(path), adapter, dtype=dtype, lazy=lazy)
    path = Path(path)
    if fmt == "circuit_tracer_transcoder_set":
        return load_transcoder_set_dir(path, adapter, read_config_yaml(path / "config.yaml"), layers=layers,
                                       dtype=dtype, lazy=lazy)
    if fmt in ("gemmascope", "gemmascope2"):
        return load_gemmascope_dir(path, adapter, version=1 if fmt == "gemmascope" else 2, layers=layers,
                                   dtype=dtype, lazy=lazy)
    if fmt == "eleuther_topk":
        return load_eleuther_dir(path, adapter, layers=layers, dtype=dtype, lazy=lazy)

    return TranscoderSet.from_dir(path, adapter, layers=layers, dtype=dtype)


def _header(path: Path) -> dict[str, tuple[tuple[int, ...], int]]:
    """``{tensor: (shape, bytes)}`` of a safetensors file, from its checked header (nothing else is read)."""
    return {k: (m["shape"], m["data_offsets"][1] - m["data_offsets"][0]) for k, m in safetensors_header(path).items()}


def _layer_files(path: Path, fmt: str) -> list[Path]:
    if fmt == "circuit_tracer_clt":
        listed = read_config_yaml(path / "config.yaml").get("transcoders")
        if listed:  # GemmaScope-2 layer files listed by a circuit-tracer config
            return [path / str(e) for e in listed if not str(e).startswith("hf://")]
        return sorted(path.glob("W_*.safetensors"))
    if fmt == "gemmascope2_clt":
        return sorted(path.glob("params_layer_*.safetensors"))
    if fmt == "circuit_tracer_transcoder_set":
        listed = read_config_yaml(path / "config.yaml").get("transcoders")
        if listed:
            return [path / str(e) for e in listed if not str(e).startswith("hf://")]
        return sorted(path.glob("layer_*.safetensors"))
    if fmt == "gemmascope":
        return sorted(path.glob("layer_*/**/params.npz"))
    if fmt == "gemmascope2":
        return sorted(path.glob("layer_*/**/params.safetensors"))
    if fmt == "eleuther_topk":
        return sorted(path.glob("*/sae.safetensors"))
    return sorted(path.glob("layer_*/sae_weights.safetensors"))


def dictionary_footprint(path: str | Path, *, active_fraction: float = 0.0, n_pos: int = 1) -> tuple[int | None, int, int, str]:
    """``(d_sae, bytes on disk, bytes read into memory, note)`` of the dictionary in ``path``,
    from the files' headers (nothing is loaded): what ``--dry-run`` counts.

    Safetensors layouts (circuit-tracer CLT and transcoder_set, GemmaScope-2, EleutherAI) stay
    on disk (:class:`~circuitgraph.dictionaries.stored.StoredRows`): memory holds the biases and
    thresholds, the encoders (one layer at a time when they exceed 1 GiB together) and the decoder
    rows of the active features (``active_fraction`` of each layer's features at ``n_pos``
    positions); sae-lens folders and GemmaScope ``.npz`` files are read whole."""
    path = Path(path)
    fmt = detect_format(path)
    files = _layer_files(path, fmt)
    on_disk = sum(p.stat().st_size for p in files if p.is_file())
    if fmt in ("saelens", "gemmascope") or not files:
        d_sae = None
        if fmt == "saelens" and files:
            d_sae = int(json.loads((files[0].parent / "cfg.json").read_text())["d_sae"])
        return d_sae, on_disk, on_disk, f"{fmt} dictionary: {on_disk / 1024**2:.1f} MiB, read whole"
    enc_keys = {"W_enc", "w_enc", "encoder.weight"}
    enc_layers, dec_row_bytes, small, d_sae = [], [], 0, None
    for p in files:
        if not p.is_file():
            continue
        for key, (shape, nbytes) in _header(p).items():
            base = key.rsplit("_", 1)[0] if fmt == "circuit_tracer_clt" else key
            if base in enc_keys:
                enc_layers.append(nbytes)
                if d_sae is None:
                    d_sae = shape[1] if key == "w_enc" else shape[0]
            elif base in ("W_dec", "w_dec"):
                n_rows = shape[0]
                dec_row_bytes.append((n_rows, nbytes // max(n_rows, 1)))
            else:
                small += nbytes
    enc_total = sum(enc_layers)
    enc_bytes = max(enc_layers, default=0) if enc_total > 2**30 else enc_total
    dec_bytes = sum(min(int(active_fraction * n * max(n_pos - 1, 1)), n) * row for n, row in dec_row_bytes)
    total = small + enc_bytes + dec_bytes
    kind = "cross-layer transcoder" if fmt.endswith("_clt") else f"{fmt} transcoders"
    note = (f"{kind}: {on_disk / 1024**2:.1f} MiB on disk, ~{total / 1024**2:.1f} MiB read into memory "
            "(lazy decoder rows of the active features" + (", one encoder layer at a time)"
                                                            if enc_bytes < enc_total else ")"))
    return d_sae, on_disk, total, note
