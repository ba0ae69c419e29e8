"""Loading models: a local directory, a TransformerLens pretrained name, or the built-in demo."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import torch

from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.adapters.tokenizer import Tokenizer, resolve_tokenizer_dir
from circuitgraph.errors import LoadError

__all__ = ["load_model_dir", "load_model_name", "load_builtin_model", "torch_dtype", "resolve_device"]

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    key = str(name).replace("torch.", "")
    if key not in _DTYPES:
        raise LoadError(f"dtype {name!r} is not supported; expected one of {', '.join(_DTYPES)}")
    return _DTYPES[key]


def resolve_device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LoadError(f"device {device!r} requested but CUDA is not available; use device: cpu")
    return device


def load_model_dir(path: str | Path, *, dtype: str = "float32", device: str = "cpu") -> ModelAdapter:
    """Load ``DIR/config.json`` (HookedTransformerConfig fields) + ``DIR/model.safetensors``
    (a HookedTransformer state dict) + optional ``DIR/tokenizer/``."""
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    path = Path(path)
    if not path.is_dir():
        raise LoadError(f"model directory {path} does not exist")
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    for f in (cfg_file, weights):
        if not f.is_file():
            raise LoadError(f"model directory {path} has no {f.name}; expected config.json and model.safetensors")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise LoadError(f"{cfg_file} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise LoadError(f"{cfg_file} must hold a JSON object of HookedTransformerConfig fields")
    raw = dict(raw)
    raw.pop("n_params", None)
    raw["dtype"] = torch_dtype(dtype)
    raw["device"] = resolve_device(device)
    import dataclasses

    known = {f.name for f in dataclasses.fields(HookedTransformerConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise LoadError(f"{cfg_file}: unknown HookedTransformerConfig fields {unknown}")
    try:
        cfg = HookedTransformerConfig(**raw)
    except Exception as exc:  # noqa: BLE001 - surface TL's message as a load error
        raise LoadError(f"{cfg_file}: invalid HookedTransformerConfig: {exc}") from None
    with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens prints on device moves
        model = HookedTransformer(cfg, move_to_device=False)
    state = load_file(str(weights), device="cpu")
    state = {k: v.to(cfg.dtype) if v.is_floating_point() else v for k, v in state.items()}
    result = model.load_state_dict(state, strict=False)
    buffers = {name for name, _ in model.named_buffers()}
    missing = [k for k in result.missing_keys if k not in buffers]
    if missing or result.unexpected_keys:
        raise LoadError(
            f"{weights} does not match config.json: missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]}"
        )
    torch.nn.Module.to(model, raw["device"])
    model.eval()
    tok_dir = resolve_tokenizer_dir(path / "tokenizer")
    tokenizer = Tokenizer.from_dir(tok_dir) if tok_dir is not None else None
    return ModelAdapter(model, tokenizer=tokenizer, source={"path": str(path)})


def load_model_name(
    name: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    fold_ln: bool = False,
    center_writing_weights: bool = False,
    center_unembed: bool = False,
) -> ModelAdapter:
    """A TransformerLens pretrained model by name (needs the Hugging Face hub)."""
    from transformer_lens import HookedTransformer

    try:
        model = HookedTransformer.from_pretrained(
            name,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            dtype=torch_dtype(dtype),
            device=resolve_device(device),
        )
    except Exception as exc:  # noqa: BLE001
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LoadError(
            f"could not load pretrained model {name!r} ({type(exc).__name__}: {msg}); "
            "this needs the Hugging Face hub: check the name and your connection, "
            "or save the model locally and use model: {path: DIR}"
        ) from None
    model.eval()
    tokenizer = Tokenizer.from_hf(model.tokenizer) if model.tokenizer is not None else None
    return ModelAdapter(model, tokenizer=tokenizer, source={"name": name, "fold_ln": fold_ln})


def load_builtin_model(name: str, *, dtype: str = "float32", device: str = "cpu") -> tuple[ModelAdapter, Path]:
    """The built-in model ``name``; returns the adapter and the bundle folder (with transcoders/)."""
    from circuitgraph.builtin import BUILTIN_MODELS

    if name not in BUILTIN_MODELS:
        raise LoadError(f"unknown built-in model {name!r}; available: {', '.join(sorted(BUILTIN_MODELS))}")
    bundle = Path(BUILTIN_MODELS[name]())
    adapter = load_model_dir(bundle / "model", dtype=dtype, device=device)
    adapter.source = {"builtin": name}
    return adapter, bundle


def describe_model(adapter: ModelAdapter) -> dict[str, Any]:
    return adapter.describe()
