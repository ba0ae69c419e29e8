"""Reading input files defensively: bounded sizes, one-line errors, no code execution.

Every reader here turns a broken file (truncated, garbage, wrong types, wrong encoding,
oversized) into a :class:`~circuitgraph.errors.LoadError` that names the file, what is wrong
and the fix.  None of them imports torch, so ``circuitgraph validate`` and ``--dry-run``
can check a whole bundle (:func:`check_input_files`) without building a model.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from circuitgraph._io import (  # re-exported: the hardened readers' old home
    MAX_JSON_BYTES,
    _regular_file,
    read_json_file,
    safetensors_header,
    safetensors_shapes,
)
from circuitgraph.adapters.dictionary_sources import existing_dictionary_folder
from circuitgraph.adapters.gguf import is_gguf_file, read_gguf_summary
from circuitgraph.adapters.hf_config import FAMILIES, unsupported_model_type_message
from circuitgraph.adapters.model_config import MAX_CONFIG_BYTES, check_config_against_weights, read_model_config
from circuitgraph.adapters.model_sources import existing_model_folder
from circuitgraph.adapters.tokenizer import Tokenizer, resolve_tokenizer_dir
from circuitgraph.errors import LoadError, one_line
from circuitgraph.spec import Spec

__all__ = [
    "read_json_file",
    "safetensors_header",
    "safetensors_shapes",
    "read_direction_file",
    "check_transcoder_dir",
    "check_input_files",
    "check_hf_model_folder",
    "model_folder_format",
    "hf_weight_files",
    "existing_model_folder",  # re-exported: the source records' (adapters.model_sources, adapters.dictionary_sources)
    "existing_dictionary_folder",
    "MAX_JSON_BYTES",
    "MAX_DIRECTION_BYTES",
]

#: a direction file (one d_model vector) larger than this is refused
MAX_DIRECTION_BYTES = 256 << 20


def read_direction_file(path: str | os.PathLike[str], where: str) -> Any:
    """A direction file (.npy, .pt, .safetensors, .json) as a 1-D float64 numpy array.

    Files are loaded without pickle (``allow_pickle=False``, ``weights_only=True``), sizes are
    capped, and anything but one finite numeric vector is a LoadError.
    """
    path = Path(path)
    _regular_file(path, MAX_DIRECTION_BYTES, f"{where}.file:")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            value = np.load(path, allow_pickle=False)
        elif suffix == ".pt":
            import torch  # only for .pt files: `circuitgraph validate` reads headers without torch

            value = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(value, torch.Tensor):
                raise LoadError(f"{where}.file: {path} holds a {type(value).__name__}, not a tensor; save one tensor "
                                "with torch.save(vector, path)")
            if value.is_complex():
                raise LoadError(f"{where}.file: {path} holds complex numbers; a direction is real")
            value = value.detach().to(torch.float64).numpy()
        elif suffix == ".safetensors":
            try:
                header = safetensors_header(path)
            except LoadError as exc:
                raise LoadError(f"{where}.file: {exc}") from None
            if len(header) != 1:
                raise LoadError(f"{where}.file: {path} holds {len(header)} tensors; expected exactly one")

            value = next(iter(load_file(str(path)).values()))
        else:
            value = read_json_file(path, f"{where}.file:", MAX_DIRECTION_BYTES)
            if not isinstance(value, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in value
            ):
                raise LoadError(f"{where}.file: {path} must hold a JSON list of numbers, e.g. [0.1, -0.2, ...]")
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy/torch/safetensors raise many types on bad files
        raise LoadError(f"{where}.file: cannot read {path} ({type(exc).__name__}: {one_line(exc, limit=200, typed=False)}); save one "
                        "vector of d_model numbers") from None
    try:
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"dtype {array.dtype}")
        array = array.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise LoadError(f"{where}.file: {path} does not hold numbers ({one_line(exc, limit=200, typed=False)}); save one vector of d_model "
                        "numbers") from None
    squeezed = array.reshape(-1) if array.ndim == 0 or max(array.shape, default=0) == array.size else None
    if squeezed is None:
        raise LoadError(f"{where}.file: {path} holds an array of shape {list(array.shape)}; a direction is one "
                        "vector of d_model numbers")
    return squeezed


def check_transcoder_dir(path: str | os.PathLike[str]) -> dict[int, Path]:
    """``{layer: folder}`` of a transcoder folder, every ``layer_<i>`` entry checked.

    An entry named ``layer_<i>`` that is not a readable folder with a JSON-object ``cfg.json``
    and a valid ``sae_weights.safetensors`` is an error: skipping it would silently replace
    that layer's transcoder by the MLP's neurons.
    """
    path = Path(path)
    try:
        entries = sorted(os.listdir(path))
    except FileNotFoundError:
        raise LoadError(f"transcoder folder {path} does not exist") from None
    except OSError as exc:
        raise LoadError(f"cannot read transcoder folder {path}: {exc.strerror or one_line(exc, limit=200, typed=False)}") from None
    found: dict[int, Path] = {}
    for name in entries:
        m = re.fullmatch(r"layer_(\d+)", name)
        if not m:
            continue
        sub = path / name
        if not sub.is_dir():
            raise LoadError(f"{sub} is not a folder (a broken link or a file?); each layer_<i> must be a folder "
                            "with cfg.json and sae_weights.safetensors, or be removed")
        if not os.access(sub, os.R_OK | os.X_OK):
            raise LoadError(f"{sub} cannot be read (permissions); fix its permissions or remove it")
        cfg = read_json_file(sub / "cfg.json", "transcoder config")
        if not isinstance(cfg, dict):
            raise LoadError(f"{sub / 'cfg.json'} must hold a JSON object (sae-lens save_model output)")
        for key in ("d_in", "d_sae", "d_out"):
            value = cfg.get(key)
            if value is None and key == "d_out":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
                raise LoadError(f"{sub / 'cfg.json'}: {key} is {str(value)[:40]}; expected a positive integer "
                                "(sae-lens save_model output)")
        safetensors_header(sub / "sae_weights.safetensors")
        layer = int(m.group(1))
        if layer in found:
            raise LoadError(f"{path} has two folders for layer {layer} ({found[layer].name}, {name}); keep one")
        found[layer] = sub
    return found


def check_hf_model_folder(path: str | os.PathLike[str]) -> bool:
    """For ``circuitgraph validate``: whether ``path`` is a Hugging Face model folder (config.json
    with ``model_type``); if so, that its family is supported (the one-line error names the
    supported ones), that its safetensors files (one, or the shards of its index) have valid
    headers and that a root ``tokenizer.json`` is a tokenizer. Nothing is built; no torch."""
    path = Path(path)
    if model_folder_format(path) != "huggingface":
        return False
    raw = read_json_file(path / "config.json", "model config", MAX_CONFIG_BYTES)
    if raw.get("model_type") not in FAMILIES:
        raise LoadError(unsupported_model_type_message(raw.get("model_type"), path / "config.json"))
    for f in hf_weight_files(path):
        safetensors_header(f)
    if (path / "tokenizer.json").is_file():
        Tokenizer.from_dir(path)
    return True


def model_folder_format(path: str | Path) -> str:
    """``huggingface`` when ``DIR/config.json`` names a ``model_type`` (what ``save_pretrained``
    writes), else ``transformer_lens`` (HookedTransformerConfig fields)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        return "transformer_lens"  # reported by the loader: no config.json
    raw = read_json_file(cfg_file, "model config", MAX_CONFIG_BYTES)
    return "huggingface" if isinstance(raw, dict) and "model_type" in raw else "transformer_lens"


def hf_weight_files(path: Path) -> list[Path]:
    """The safetensors files of a Hugging Face folder: ``model.safetensors``, or the shards
    ``model.safetensors.index.json`` lists (each checked to exist)."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if index.is_file():
        table = read_json_file(index, "safetensors index")
        weight_map = table.get("weight_map") if isinstance(table, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise LoadError(f"{index} lists no shards; re-save the model with save_pretrained")
        shards = sorted({str(v) for v in weight_map.values()})
        bad = [s for s in shards if Path(s).name != s or not (path / s).is_file()]
        if bad:
            raise LoadError(f"{index} lists shard {bad[0]!r}, which is not a file in {path}; copy every shard "
                            "next to the index")
        return [path / s for s in shards]
    if single.is_file():
        return [single]
    pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
    hint = (f" (it has {pickles[0]}: pickled weights are not read; re-save with save_pretrained, which writes "
            "safetensors)") if pickles else ""
    raise LoadError(f"model directory {path} has no model.safetensors or model.safetensors.index.json{hint}")


def check_input_files(spec: Spec) -> None:
    """Read the headers of every file a spec's run would load (model config, weights table,
    tokenizer, transcoder folders, direction files), without building anything.

    Used by ``circuitgraph validate`` and ``run --dry-run`` so that a broken bundle is
    reported there, in one line, rather than after minutes of work.
    """
    m = spec.model
    if m.path is not None and is_gguf_file(m.path):
        read_gguf_summary(m.path)  # its header: a truncated or foreign file is one line here
    model_dir = existing_model_folder(m)
    if model_dir is not None and check_hf_model_folder(model_dir):
        model_dir = None  # a Hugging Face folder: checked from its config.json and file headers
    if model_dir is not None:
        cfg = read_model_config(model_dir / "config.json", trust_remote_code=m.trust_remote_code)
        shapes = safetensors_shapes(model_dir / "model.safetensors")
        n = 0
        for shape in shapes.values():
            k = 1
            for d in shape:
                k *= d
            n += k
        check_config_against_weights(cfg, n, model_dir)
        tok_dir = resolve_tokenizer_dir(model_dir / "tokenizer")
        if tok_dir is not None:
            Tokenizer.from_dir(tok_dir)
    tc_dir = existing_dictionary_folder(spec.transcoders)
    if tc_dir is not None:
        check_transcoder_dir(tc_dir)
    for i, target in enumerate(spec.targets):
        if target.kind == "direction" and target.params.file is not None:
            read_direction_file(target.params.file, f"targets[{i}].direction")
