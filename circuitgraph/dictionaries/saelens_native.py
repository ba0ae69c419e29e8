"""sae-lens ``save_model`` folders (``cfg.json`` + ``sae_weights.safetensors``) read without sae-lens.

Importing sae-lens takes about half a second; a local transcoder folder needs none of it.
:func:`read_folder` replicates what ``sae_lens.SAE.load_from_disk`` (sae-lens 6.x) does for the
four transcoder architectures -- ``transcoder``, ``skip_transcoder``, ``jumprelu_transcoder``,
``jumprelu_skip_transcoder`` -- and returns a :class:`NativeTranscoder` with the attributes
:func:`circuitgraph.dictionaries.transcoders._from_sae` reads (``cfg``, ``W_enc``, ``b_enc``,
``W_dec``, ``b_dec``, ``W_skip``, ``threshold``) and the same ``encode`` / ``to`` / ``eval``:

* every tensor is read with ``safe_open(..., device=device)`` and cast to ``cfg.json``'s dtype,
  as sae-lens's disk loader does (a dtype requested later is a second cast, as ``SAE.to`` does);
* ``encode`` is sae-lens's transcoder ``encode`` with its identity hooks left out:
  ``relu(x @ W_enc + b_enc)``, times ``(pre > threshold)`` cast to the dtype for JumpReLU.

Whatever it does not recognise exactly -- another architecture, a config key or value that sae-lens
treats otherwise (``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``, a
pre-6.0 config, ``model_from_pretrained_kwargs``), a missing, extra or misshapen tensor (e.g.
``log_threshold`` or ``scaling_factor``), an unreadable file -- gives ``None``: the caller then
loads the folder with sae-lens itself, so such a folder loads (or fails) exactly as before.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeGuard

import torch
from safetensors import safe_open

from circuitgraph._io import read_json_file
from circuitgraph.dictionaries.stored import StoredRows

__all__ = ["NativeTranscoder", "read_folder"]

#: architecture -> (skip connection, JumpReLU threshold)
ARCHITECTURES = {
    "transcoder": (False, False),
    "skip_transcoder": (True, False),
    "jumprelu_transcoder": (False, True),
    "jumprelu_skip_transcoder": (True, True),
}
#: sae-lens's DTYPE_MAP (sae_lens.constants) and its reverse (dtype_to_str)
_DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "torch.float32": torch.float32, "torch.float64": torch.float64, "torch.float16": torch.float16,
    "torch.bfloat16": torch.bfloat16,
}
_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}
#: the keys sae-lens 6.x's TranscoderConfig.to_dict writes (every field, metadata, architecture)
_CFG_KEYS = {"d_in", "d_sae", "d_out", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
             "reshape_activations", "metadata", "architecture"}


class NativeMetadata:
    """``cfg.metadata``: the keys of ``cfg.json``'s metadata; a missing one reads ``None``
    (as sae-lens's ``SAEMetadata``)."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> None:
        return None


class NativeConfig:
    """The parts of sae-lens's transcoder config that circuitgraph reads."""

    def __init__(self, architecture: str, d_in: int, d_sae: int, d_out: int, dtype: str, device: str,
                 metadata: dict[str, Any]):
        self._architecture = architecture
        self.d_in, self.d_sae, self.d_out = d_in, d_sae, d_out
        self.dtype = dtype
        self.device = device
        self.apply_b_dec_to_input = False
        self.normalize_activations = "none"
        self.reshape_activations = "none"
        self.metadata = NativeMetadata(metadata)

    def architecture(self) -> str:
        return self._architecture


class NativeTranscoder:
    """A sae-lens transcoder's tensors and inference ``encode``, read from its folder."""

    # set from the file's tensors (every architecture has these; ``threshold`` only jump-ReLU's)
    W_enc: torch.Tensor
    b_enc: torch.Tensor

    def __init__(self, cfg: NativeConfig, tensors: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.dtype = _DTYPES[cfg.dtype]
        self.device = torch.device(cfg.device)
        self._names = tuple(tensors)
        for name, t in tensors.items():
            setattr(self, name, t)
        self.training = False

    def __repr__(self) -> str:
        return f"NativeTranscoder({self.cfg.architecture()!r}, d_sae={self.cfg.d_sae}, dtype={self.cfg.dtype})"

    def eval(self) -> NativeTranscoder:
        self.training = False
        return self

    def to(self, *args: Any, **kwargs: Any) -> NativeTranscoder:
        """In place, as ``SAE.to`` (an ``nn.Module``): casts every tensor, returns ``self``."""
        device, dtype = None, None
        for arg in args:
            if isinstance(arg, (torch.device, str)):
                device = arg
            elif isinstance(arg, torch.dtype):
                dtype = arg
            elif isinstance(arg, torch.Tensor):
                device, dtype = arg.device, arg.dtype
        device = kwargs.get("device", device)
        dtype = kwargs.get("dtype", dtype)
        if device is not None:
            self.device = torch.device(device)
            self.cfg.device = str(self.device)
        if dtype is not None:
            self.cfg.dtype = _DTYPE_NAMES[dtype] if dtype in _DTYPE_NAMES else str(dtype)
            self.dtype = dtype
        for name in self._names:
            t = getattr(self, name)
            if isinstance(t, StoredRows):  # left in its file: read (and cast) as it is used, on the CPU
                t.dtype = dtype if dtype is not None else t.dtype
            else:
                setattr(self, name, t.to(device=device, dtype=dtype))
        return self

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """sae-lens's ``Transcoder.encode`` / ``JumpReLUTranscoder.encode`` (eval mode)."""
        hidden_pre = x.to(self.dtype) @ self.W_enc + self.b_enc
        acts = torch.relu(hidden_pre)
        threshold = getattr(self, "threshold", None)
        if threshold is not None:
            acts = acts * (hidden_pre > threshold).to(self.dtype)
        return acts


def _positive_int(value: Any) -> TypeGuard[int]:
    return type(value) is int and value > 0


def _sae_lens_6(metadata: dict[str, Any]) -> bool:
    """True when sae-lens would not treat the config as pre-6.0 (``handle_config_defaulting``):
    a plain ``X.Y.Z`` version with ``X >= 6`` (anything else is left to sae-lens)."""
    version = metadata.get("sae_lens_version")
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version) if isinstance(version, str) else None
    return m is not None and int(m.group(1)) >= 6


def _config(cfg: Any, device: str) -> NativeConfig | None:
    if not isinstance(cfg, dict) or not set(cfg) <= _CFG_KEYS:
        return None
    arch = cfg.get("architecture")
    metadata = cfg.get("metadata")
    if arch not in ARCHITECTURES or not isinstance(metadata, dict) or not _sae_lens_6(metadata):
        return None
    if metadata.get("model_from_pretrained_kwargs"):  # sae-lens warns about these: let it
        return None
    if cfg.get("apply_b_dec_to_input", True) is not False:  # sae-lens refuses it for transcoders
        return None
    if cfg.get("normalize_activations", "none") != "none" or cfg.get("reshape_activations", "none") != "none":
        return None
    d_in, d_sae, d_out = (cfg.get(k) for k in ("d_in", "d_sae", "d_out"))
    if not (_positive_int(d_in) and _positive_int(d_sae) and _positive_int(d_out)):
        return None
    dtype = cfg.get("dtype", "float32")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        return None
    return NativeConfig(arch, d_in, d_sae, d_out, dtype=dtype, device=device, metadata=metadata)


def encoder_bytes(path: str | Path) -> int | None:
    """Bytes of the encoder ``W_enc`` that a folder's ``cfg.json`` declares (``d_in * d_sae`` in its
    dtype), without reading the weights; ``None`` when the config is not one :func:`read_folder` reads."""
    try:
        cfg = _config(read_json_file(Path(path) / "cfg.json", "sae-lens cfg.json"), "cpu")
    except Exception:  # noqa: BLE001
        return None
    if cfg is None:
        return None
    return cfg.d_in * cfg.d_sae * torch.tensor([], dtype=_DTYPES[cfg.dtype]).element_size()


def read_folder(path: str | Path, device: str = "cpu", *, stored: bool = False) -> NativeTranscoder | None:
    """The transcoder in sae-lens folder ``path`` on ``device``, as ``SAE.load_from_disk(path,
    device=device)`` gives it; ``None`` when the folder is anything this reader does not fully
    understand (the caller then loads it with sae-lens).

    ``stored`` (CPU only): ``W_enc`` and ``W_dec`` stay in the memory-mapped file as
    :class:`~circuitgraph.dictionaries.stored.StoredRows` (read by feature, cast to the config's
    dtype as they are read); the vectors (``b_enc``, ``b_dec``, ``threshold``) and ``W_skip`` are read."""
    try:
        path = Path(path)
        cfg = _config(read_json_file(path / "cfg.json", "sae-lens cfg.json"), str(device))
        if cfg is None:
            return None
        skip, jump = ARCHITECTURES[cfg.architecture()]
        shapes = {"W_enc": (cfg.d_in, cfg.d_sae), "b_enc": (cfg.d_sae,), "W_dec": (cfg.d_sae, cfg.d_out),
                  "b_dec": (cfg.d_out,)}
        if skip:
            shapes["W_skip"] = (cfg.d_out, cfg.d_in)
        if jump:
            shapes["threshold"] = (cfg.d_sae,)
        dtype = _DTYPES[cfg.dtype]
        tensors = {}
        stored = stored and torch.device(device).type == "cpu"
        weights = path / "sae_weights.safetensors"
        with safe_open(str(weights), framework="pt", device=str(device)) as f:
            if set(f.keys()) != set(shapes):
                return None
            for name, shape in shapes.items():
                if stored and name in ("W_enc", "W_dec"):
                    sl = f.get_slice(name)
                    if tuple(sl.get_shape()) != shape or sl.get_dtype() not in ("F16", "BF16", "F32", "F64"):
                        return None
                    tensors[name] = StoredRows(weights, name, feature_dim=1 if name == "W_enc" else 0, dtype=dtype)
                    continue
                t = f.get_tensor(name)
                if tuple(t.shape) != shape or not t.is_floating_point():
                    return None
                tensors[name] = t.to(dtype=dtype)
        return NativeTranscoder(cfg, tensors)
    except Exception:  # noqa: BLE001 - sae-lens loads it, or reports what is wrong, as it always has
        return None
