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

Each format is one record of the registry :data:`circuitgraph.spec.dictionaries.DICTIONARY_FORMATS`,
whose functions are the ones below (``detect_<format>``, ``load_<format>``, ``files_<format>``,
registered on the record when this module is imported, :func:`~circuitgraph.spec.dictionaries.implement_format`):
:func:`detect_format` tries the records' detectors in order, :func:`load_dictionaries` calls the
record's loader (the format can also be given, as the spec's ``transcoders.format``) and
:func:`dictionary_footprint` reads the record's layer files' headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph._io import read_json_file, safetensors_header
from circuitgraph.dictionaries.clt import load_clt_dir, read_config_yaml
from circuitgraph.dictionaries.gemmascope2 import load_gemmascope2_clt_dir
from circuitgraph.dictionaries.layer_formats import load_eleuther_dir, load_gemmascope_dir, load_transcoder_set_dir
from circuitgraph.dictionaries.protocol import Dictionary
from circuitgraph.dictionaries.stored import LAZY_ENCODER_BYTES
from circuitgraph.dictionaries.transcoders import TranscoderSet
from circuitgraph.errors import LoadError
from circuitgraph.spec.dictionaries import DICTIONARY_FORMATS, format_names, implement_format

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["FORMATS", "detect_format", "dictionary_footprint", "load_dictionaries"]

#: the built-in formats' names (the registry: :data:`circuitgraph.spec.dictionaries.DICTIONARY_FORMATS`)
FORMATS = format_names()


# ------------------------------------------------------------------ detection, one function per format
def _config_kind(path: Path) -> str | None:
    cfg = path / "config.yaml"
    return read_config_yaml(cfg).get("model_kind") if cfg.is_file() else None


def _plain(path: Path) -> bool:
    """No circuit-tracer config.yaml and not a GemmaScope-2 CLT folder (the other formats' ground)."""
    return not (path / "config.yaml").is_file() and not detect_gemmascope2_clt(path)


def _layer_dirs(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.is_dir() and p.name.startswith("layer_")]


def detect_circuit_tracer_clt(path: Path) -> bool:
    return _config_kind(path) == "cross_layer_transcoder"


def detect_circuit_tracer_transcoder_set(path: Path) -> bool:
    return _config_kind(path) == "transcoder_set"


def detect_gemmascope2_clt(path: Path) -> bool:
    return (not (path / "config.yaml").is_file() and (path / "config.json").is_file()
            and next(path.glob("params_layer_*.safetensors"), None) is not None)


def detect_saelens(path: Path) -> bool:
    return _plain(path) and any((p / "cfg.json").is_file() for p in _layer_dirs(path))


def detect_gemmascope(path: Path) -> bool:
    dirs = _layer_dirs(path) if _plain(path) else []
    return (not any((p / "cfg.json").is_file() for p in dirs)
            and any(next(p.rglob("params.npz"), None) for p in dirs))


def detect_gemmascope2(path: Path) -> bool:
    dirs = _layer_dirs(path) if _plain(path) else []
    return (not any((p / "cfg.json").is_file() for p in dirs) and not any(next(p.rglob("params.npz"), None) for p in dirs)
            and any(next(p.rglob("params.safetensors"), None) for p in dirs))


def detect_eleuther_topk(path: Path) -> bool:
    return _plain(path) and not _layer_dirs(path) and any(
        (p / "cfg.json").is_file() and (p / "sae.safetensors").is_file() for p in path.iterdir() if p.is_dir())


def detect_format(path: str | Path) -> str:
    """The format of dictionary directory ``path`` (one-line LoadError when none fits)."""
    path = Path(path)
    if not path.is_dir():
        raise LoadError(f"transcoder directory {path} does not exist; give the folder that holds the dictionary")
    kind = _config_kind(path)
    if kind is not None and kind not in ("cross_layer_transcoder", "transcoder_set"):
        raise LoadError(f"{path / 'config.yaml'}: model_kind {kind!r} is not supported; expected cross_layer_transcoder "
                        "or transcoder_set")
    for record in DICTIONARY_FORMATS.values():
        if record.function("detect")(path):
            return record.name
    if _plain(path) and _layer_dirs(path):
        return "saelens"  # its loader names what is missing
    raise LoadError(
        f"{path}: no dictionary format recognised; expected "
        + ", ".join(r.layout for r in DICTIONARY_FORMATS.values()) + "; see docs/dictionaries.md"
    )


# ------------------------------------------------------------------ loading, one function per format
def _listed_files(path: Path, config: dict[str, Any]) -> dict[int, Path]:
    """The layer files a circuit-tracer ``config.yaml`` lists (``transcoders:``), relative to ``path``."""
    out = {}
    for i, entry in enumerate(config["transcoders"]):
        if str(entry).startswith("hf://"):
            raise LoadError(f"{path / 'config.yaml'}: transcoders[{i}] is the hub file {entry}; download it next to "
                            "config.yaml and list the local file name instead (or use transcoders: {hf: REPO})")
        out[i] = Path(str(entry)) if Path(str(entry)).is_absolute() else path / str(entry)
    return out


def load_saelens(path: Path, adapter: ModelAdapter, *, layers: list[int] | None, dtype: torch.dtype, lazy: bool | None,
                 config: dict[str, Any] | None) -> Any:
    return TranscoderSet.from_dir(path, adapter, layers=layers, dtype=dtype, lazy=lazy)


def load_circuit_tracer_clt(path: Path, adapter: ModelAdapter, *, layers: list[int] | None, dtype: torch.dtype,
                            lazy: bool | None, config: dict[str, Any] | None) -> Any:
    config = config or read_config_yaml(path / "config.yaml")
    if config.get("transcoders"):  # circuit-tracer's config listing GemmaScope-2 CLT layer files
        return load_gemmascope2_clt_dir(path, adapter, dtype=dtype, lazy=lazy, ct_config=config,
                                        files=_listed_files(path, config), format="circuit_tracer_clt")
    return load_clt_dir(path, adapter, dtype=dtype, lazy=lazy)


def load_gemmascope2_clt(path: Path, adapter: ModelAdapter, *, layers: list[int] | None, dtype: torch.dtype,
                         lazy: bool | None, config: dict[str, Any] | None) -> Any:
    return load_gemmascope2_clt_dir(path, adapter, dtype=dtype, lazy=lazy)


def load_circuit_tracer_transcoder_set(path: Path, adapter: ModelAdapter, *, layers: list[int] | None,
                                       dtype: torch.dtype,
                                       lazy: bool | None, config: dict[str, Any] | None) -> Any:
    return load_transcoder_set_dir(path, adapter, read_config_yaml(path / "config.yaml"), layers=layers,
                                   dtype=dtype, lazy=lazy)


def load_gemmascope(path: Path, adapter: ModelAdapter, *, layers: list[int] | None, dtype: torch.dtype,
                    lazy: bool | None,
                    config: dict[str, Any] | None) -> Any:
    return load_gemmascope_dir(path, adapter, version=1, layers=layers, dtype=dtype, lazy=lazy)


def load_gemmascope2(path: Path, adapter: ModelAdapter, *, layers: list[int] | None, dtype: torch.dtype,
                     lazy: bool | None,
                     config: dict[str, Any] | None) -> Any:
    return load_gemmascope_dir(path, adapter, version=2, layers=layers, dtype=dtype, lazy=lazy)


def load_eleuther_topk(path: Path, adapter: ModelAdapter, *, layers: list[int] | None, dtype: torch.dtype,
                       lazy: bool | None, config: dict[str, Any] | None) -> Any:
    return load_eleuther_dir(path, adapter, layers=layers, dtype=dtype, lazy=lazy)


def load_dictionaries(path: str | Path, adapter: ModelAdapter, *, format: str | None = None,
                      layers: list[int] | None = None, dtype: torch.dtype = torch.float32,
                      lazy: bool | None = None, config: dict[str, Any] | None = None,
                      source: Mapping[str, Any] | None = None, model_mismatch: str | None = None) -> Dictionary:
    """Load the dictionary in ``path`` (its format detected unless given) for ``adapter``'s model.

    Returns a :class:`~circuitgraph.dictionaries.TranscoderSet` or a
    :class:`~circuitgraph.dictionaries.CrossLayerTranscoder` (any :class:`Dictionary`); both
    record ``format``.  Safetensors layouts stay on disk: decoder rows are read for the active
    features only, and ``lazy`` (default: when the encoders together exceed 1 GiB) re-reads each
    encoder when it is needed instead of keeping it (sae-lens folders and GemmaScope ``.npz``
    files are read whole).  ``config``: a circuit-tracer ``config.yaml`` already read (its hub
    files resolved).

    ``source``: the dictionary's source record (default: the format reader's, ``{"path": path}``
    and what its files add); ``model_mismatch``: a model mismatch the spec allowed, recorded last
    in it.  The dictionary returned is made with its final record (nothing patches it later)."""
    found = detect_format(path)
    fmt = format or found
    if format is not None and format != found:
        raise LoadError(f"{path}: transcoders.format is {format!r} but the directory holds the {found!r} layout; "
                        f"set format: {found} or point path at a {format} directory")
    record = DICTIONARY_FORMATS[fmt]
    if record.cross_layer and layers is not None and sorted(layers) != list(range(adapter.facts.n_layers)):
        raise LoadError(f"{path}: a cross-layer transcoder covers every layer; remove transcoders.layers "
                        f"(got {list(layers)})")
    loaded: Dictionary = record.function("load")(Path(path), adapter, layers=layers, dtype=dtype, lazy=lazy,
                                                 config=config)
    if source is None and model_mismatch is None:
        return loaded
    final = dict(loaded.source if source is None else source)
    if model_mismatch is not None:
        final["model_mismatch"] = model_mismatch
    return loaded.with_source(final)


# ------------------------------------------------------------------ the dry run's footprint
def _listed_or(path: Path, pattern: str) -> list[Path]:
    listed = read_config_yaml(path / "config.yaml").get("transcoders")
    if listed:  # layer files listed by a circuit-tracer config
        return [path / str(e) for e in listed if not str(e).startswith("hf://")]
    return sorted(path.glob(pattern))


def files_saelens(path: Path) -> list[Path]:
    return sorted(path.glob("layer_*/sae_weights.safetensors"))


def files_circuit_tracer_clt(path: Path) -> list[Path]:
    return _listed_or(path, "W_*.safetensors")


def files_circuit_tracer_transcoder_set(path: Path) -> list[Path]:
    return _listed_or(path, "layer_*.safetensors")


def files_gemmascope(path: Path) -> list[Path]:
    return sorted(path.glob("layer_*/**/params.npz"))


def files_gemmascope2(path: Path) -> list[Path]:
    return sorted(path.glob("layer_*/**/params.safetensors"))


def files_gemmascope2_clt(path: Path) -> list[Path]:
    return sorted(path.glob("params_layer_*.safetensors"))


def files_eleuther_topk(path: Path) -> list[Path]:
    return sorted(path.glob("*/sae.safetensors"))


def _header(path: Path) -> dict[str, tuple[tuple[int, ...], int]]:
    """``{tensor: (shape, bytes)}`` of a safetensors file, from its checked header (nothing else is read)."""
    return {k: (m["shape"], m["data_offsets"][1] - m["data_offsets"][0]) for k, m in safetensors_header(path).items()}


def dictionary_footprint(path: str | Path, *, active_fraction: float = 0.0, n_pos: int = 1) -> tuple[int | None, int, int, str]:
    """``(d_sae, bytes on disk, bytes read into memory, note)`` of the dictionary in ``path``,
    from the files' headers (nothing is loaded): what ``--dry-run`` counts.

    Safetensors layouts (circuit-tracer CLT and transcoder_set, GemmaScope-2, EleutherAI) stay
    on disk (:class:`~circuitgraph.dictionaries.stored.StoredRows`): memory holds the biases and
    thresholds, the encoders (one layer at a time when they exceed 1 GiB together) and the decoder
    rows of the active features (``active_fraction`` of each layer's features at ``n_pos``
    positions), and for per-layer transcoders read lazily the encoder rows of those features;
    GemmaScope ``.npz`` files are read whole, sae-lens folders too unless their encoders
    together exceed ``LAZY_ENCODER_BYTES`` (then read lazily, like the safetensors layouts)."""
    path = Path(path)
    fmt = detect_format(path)
    record = DICTIONARY_FORMATS[fmt]
    files = record.function("layer_files")(path)
    on_disk = sum(p.stat().st_size for p in files if p.is_file())
    whole = record.footprint == "whole"
    if fmt == "saelens" and files:  # lazy by size (TranscoderSet.from_dir)
        whole = sum(_header(p).get("W_enc", ((), 0))[1] for p in files if p.is_file()) <= LAZY_ENCODER_BYTES
    if whole or not files:
        d_sae = None
        if fmt == "saelens" and files:
            d_sae = int(read_json_file(files[0].parent / "cfg.json", "sae-lens cfg.json")["d_sae"])
        return d_sae, on_disk, on_disk, f"{fmt} dictionary: {on_disk / 1024**2:.1f} MiB, read whole"
    enc_keys = {"W_enc", "w_enc", "encoder.weight"}
    enc_layers, dec_row_bytes, small, d_sae, d_in = [], [], 0, None, 0
    for p in files:
        if not p.is_file():
            continue
        for key, (shape, nbytes) in _header(p).items():
            base = key.rsplit("_", 1)[0] if fmt == "circuit_tracer_clt" else key
            if base in enc_keys:
                enc_layers.append(nbytes)
                if d_sae is None:
                    d_sae = shape[1] if key == "w_enc" or fmt == "saelens" else shape[0]
                    d_in = shape[0] if key == "w_enc" or fmt == "saelens" else shape[1]
            elif base in ("W_dec", "w_dec"):
                n_rows = shape[0]
                dec_row_bytes.append((n_rows, nbytes // max(n_rows, 1)))
            else:
                small += nbytes
    enc_total = sum(enc_layers)
    lazy = enc_total > LAZY_ENCODER_BYTES
    enc_bytes = max(enc_layers, default=0) if lazy else enc_total
    n_active = [min(int(active_fraction * n * max(n_pos - 1, 1)), n) for n, _ in dec_row_bytes]
    dec_bytes = sum(k * row for k, (_, row) in zip(n_active, dec_row_bytes, strict=False))
    if lazy and not record.cross_layer and d_sae is not None:  # the active features' encoder rows are kept
        dec_bytes += sum(n_active) * d_in * 4
    total = small + enc_bytes + dec_bytes
    kind = "cross-layer transcoder" if record.cross_layer else f"{fmt} transcoders"
    note = (f"{kind}: {on_disk / 1024**2:.1f} MiB on disk, ~{total / 1024**2:.1f} MiB read into memory "
            "(lazy decoder rows of the active features" + (", one encoder layer at a time)"
                                                            if enc_bytes < enc_total else ")"))
    return d_sae, on_disk, total, note


# ------------------------------------------------------------------ the built-in formats' functions
#: each built-in record of the spec's registry gets its functions here, when this module is imported
implement_format('saelens', detect=detect_saelens, load=load_saelens, layer_files=files_saelens)
implement_format('circuit_tracer_clt', detect=detect_circuit_tracer_clt, load=load_circuit_tracer_clt, layer_files=files_circuit_tracer_clt)
implement_format('circuit_tracer_transcoder_set', detect=detect_circuit_tracer_transcoder_set, load=load_circuit_tracer_transcoder_set, layer_files=files_circuit_tracer_transcoder_set)
implement_format('gemmascope', detect=detect_gemmascope, load=load_gemmascope, layer_files=files_gemmascope)
implement_format('gemmascope2', detect=detect_gemmascope2, load=load_gemmascope2, layer_files=files_gemmascope2)
implement_format('gemmascope2_clt', detect=detect_gemmascope2_clt, load=load_gemmascope2_clt, layer_files=files_gemmascope2_clt)
implement_format('eleuther_topk', detect=detect_eleuther_topk, load=load_eleuther_topk, layer_files=files_eleuther_topk)
