"""Loading models: a local directory, a TransformerLens pretrained name, or the built-in demo."""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file

from circuitgraph._hub import require_hub
from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.adapters.files import (
    hf_weight_files,
    model_folder_format,
    read_json_file,
    safetensors_header,
)
from circuitgraph.adapters.gguf import gguf_folder, is_gguf_file, read_record, warning_text
from circuitgraph.adapters.hf_config import FAMILIES, load_snapshot, unsupported_model_type_message
from circuitgraph.adapters.model_config import MAX_CONFIG_BYTES, check_config_against_weights, read_model_config
from circuitgraph.adapters.model_sources import implement_model_source, model_source
from circuitgraph.adapters.native_transformer import NativeConfig, NativeTransformer, native_unsupported
from circuitgraph.adapters.pretrained import fetch
from circuitgraph.adapters.tokenizer import Tokenizer, resolve_tokenizer_dir
from circuitgraph.builtin import BUILTIN_MODELS
from circuitgraph.dictionaries.hub import _cache_dir, _offline
from circuitgraph.errors import DequantisedWeightsWarning, LoadError, one_line, spec_field
from circuitgraph.spec.model import ModelSpec

__all__ = ["MODEL_BACKENDS", "folder_backend", "load_model_dir", "load_hf_dir", "load_model_name", "resolve_model_name",
           "load_builtin_model", "load_pretrained", "torch_dtype", "resolve_device", "load_model_spec"]

#: how a TransformerLens folder's model runs (the spec's ``model: {backend: ...}``)
ModelBackend = Literal["auto", "native", "transformer_lens"]
MODEL_BACKENDS: tuple[str, ...] = ("auto", "native", "transformer_lens")

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


def load_model_dir(
    path: str | Path, *, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False,
    backend: ModelBackend = "auto", source: Mapping[str, Any] | None = None,
) -> ModelAdapter:
    """Load ``DIR/config.json`` (HookedTransformerConfig fields) + ``DIR/model.safetensors``
    (a HookedTransformer state dict) + optional ``DIR/tokenizer/``.

    config.json is read through an allow-list (:mod:`circuitgraph.adapters.model_config`):
    ``tokenizer_name`` and ``trust_remote_code`` pass only with ``trust_remote_code=True``
    (the spec's ``model: {trust_remote_code: true}``), so a model folder cannot run code.

    ``backend``: ``auto`` runs the model with circuitgraph's torch-only HookedTransformer
    (:mod:`circuitgraph.adapters.native_transformer`, no transformer_lens import) when the config is
    in its whitelist, with TransformerLens otherwise; ``native`` / ``transformer_lens`` force one
    (``native`` on a config outside the whitelist is a one-line error naming the field).

    A GGUF file (``*.gguf``) is dequantised to float32 once into a cached Hugging Face folder
    (:func:`circuitgraph.adapters.gguf.gguf_folder`) and loaded from there.

    ``source``: the adapter's source record (default ``{"path": path}``; a built-in model's
    loader gives its own), final when the adapter is made.
    """
    path = Path(path)
    record = dict(source) if source is not None else {"path": str(path)}
    if is_gguf_file(path):
        if backend == "native":
            raise LoadError(f"{path} is a GGUF file, loaded as a Hugging Face model: model: {{backend: native}} runs "
                            "TransformerLens folders only; use backend: auto")
        return _named(load_hf_dir(gguf_folder(path), dtype=dtype, device=device, source=record), path.stem)
    if path.is_file():
        raise LoadError(f"model path {path} is a file; give a model folder or a GGUF checkpoint (*.gguf)")
    if not path.is_dir():
        raise LoadError(f"model directory {path} does not exist")
    if model_folder_format(path) == "huggingface":
        if backend == "native":
            raise LoadError(f"model directory {path} is a Hugging Face folder: model: {{backend: native}} runs "
                            "TransformerLens folders only; use backend: auto")
        return load_hf_dir(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code, source=record)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    for f in (cfg_file, weights):
        if not f.is_file():
            raise LoadError(f"model directory {path} has no {f.name}; expected config.json and model.safetensors")
    raw = read_model_config(cfg_file, trust_remote_code=trust_remote_code)

    table = safetensors_header(weights)
    shapes = {k: v["shape"] for k, v in table.items()}
    check_config_against_weights(raw, sum(_numel(s) for s in shapes.values()), path)
    raw["dtype"] = torch_dtype(dtype)
    raw["device"] = resolve_device(device)
    # every parameter comes from model.safetensors (a missing one is an error below), so
    # TransformerLens's random initialisation would only cost time (seconds for GPT-2 sizes)
    raw["init_weights"] = False
    native = _choose_backend(raw, backend, cfg_file) == "native"
    model = _build_native(raw, cfg_file) if native else _build_transformer_lens(raw, cfg_file)
    cfg = model.cfg
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    wrong = [f"{k} is {list(shapes[k])}, config.json implies {list(expected[k])}"
             for k in shapes if k in expected and tuple(shapes[k]) != expected[k]]
    params = {name for name, _ in model.named_parameters()}
    wrong += [f"{k} holds {table[k]['dtype']} numbers, a weight must be floating point (F16, BF16, F32, F64)"
              for k in table if k in params and table[k]["dtype"] not in ("F16", "BF16", "F32", "F64")]
    if wrong:
        raise LoadError(f"{weights} does not match config.json: {'; '.join(wrong[:3])}"
                        + (f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""))
    state = _load_safetensors(weights)
    state = {k: v.to(cfg.dtype) if v.is_floating_point() else v for k, v in state.items()}
    # assign: the module takes the loaded tensors (its own, never-initialised storage is dropped),
    # so the weights are in memory once, not twice (12 GB instead of 6 GB at Llama-1B size)
    result = model.load_state_dict(state, strict=False, assign=True)
    del state
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
    return ModelAdapter(model, tokenizer=tokenizer, source=record, format="transformer_lens")


def _choose_backend(raw: dict[str, Any], backend: str, cfg_file: Path) -> str:
    """``native`` or ``transformer_lens`` for a TransformerLens folder's config ``raw``."""
    if backend not in MODEL_BACKENDS:
        raise LoadError(f"model backend {backend!r} is not one of {', '.join(MODEL_BACKENDS)}")
    if backend == "transformer_lens":
        return backend
    unsupported = native_unsupported(raw)
    if backend == "native" and unsupported is not None:
        raise LoadError(f"{cfg_file}: model: {{backend: native}} cannot run this model: {unsupported}; "
                        "use backend: auto or transformer_lens")
    return "native" if unsupported is None else "transformer_lens"


def folder_backend(path: str | Path, backend: str = "auto", *, trust_remote_code: bool = False) -> str:
    """What :func:`load_model_dir` will run the model folder ``path`` with: ``native`` or
    ``transformer_lens`` (Hugging Face folders, configs outside the native whitelist); reads only
    config.json. A folder that cannot be read says ``transformer_lens`` (the load reports it)."""
    path = Path(path)
    try:
        if is_gguf_file(path) or model_folder_format(path) == "huggingface":
            return "transformer_lens"
        return _choose_backend(read_model_config(path / "config.json", trust_remote_code=trust_remote_code),
                               backend, path / "config.json")
    except LoadError:
        return "transformer_lens"


def _build_native(raw: dict[str, Any], cfg_file: Path) -> NativeTransformer:
    try:
        return NativeTransformer(NativeConfig.from_kwargs(**raw))
    except Exception as exc:  # noqa: BLE001 - the config's own problem, as TransformerLens would report it
        raise LoadError(f"{cfg_file}: invalid HookedTransformerConfig: {one_line(exc, limit=300, typed=False)}") from None


def _build_transformer_lens(raw: dict[str, Any], cfg_file: Path) -> Any:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    try:
        cfg = HookedTransformerConfig(**raw)
    except Exception as exc:  # noqa: BLE001 - surface TL's message as a load error
        raise LoadError(f"{cfg_file}: invalid HookedTransformerConfig: {one_line(exc, limit=300, typed=False)}") from None
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens prints on device moves
            return HookedTransformer(cfg, move_to_device=False)
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"{cfg_file}: TransformerLens cannot build this model: {one_line(exc, limit=300, typed=False)}") from None


def load_hf_dir(path: str | Path, *, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False,
                fold_ln: bool = False, center_writing_weights: bool = False, center_unembed: bool = False,
                name: str | None = None, source: Mapping[str, Any] | None = None) -> ModelAdapter:
    """A Hugging Face model folder as ``save_pretrained`` writes it (config.json with
    ``model_type``, one or sharded ``*.safetensors``, tokenizer files at the root), or a hub
    snapshot: its family is the row of :data:`circuitgraph.adapters.hf_config.FAMILIES` for
    ``model_type``. The tokenizer is read with the ``tokenizers`` library (no code runs); only
    with ``trust_remote_code`` may transformers run code the folder ships.  ``source``: the
    adapter's source record (default ``{"path": path}``)."""
    path = Path(path)
    raw = read_json_file(path / "config.json", "model config", MAX_CONFIG_BYTES)
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise LoadError(unsupported_model_type_message(model_type, path / "config.json"))
    try:
        files = hf_weight_files(path)
    except LoadError as exc:
        if name is None:
            raise
        raise LoadError(f"model {name!r}: its snapshot has no weights ({exc}); download them with "
                        f"`huggingface-cli download {name}`") from None
    for f in files:
        safetensors_header(f)  # a truncated or garbage shard is one line here, not a traceback later
    try:
        model = load_snapshot(str(path), dtype=torch_dtype(dtype), device=resolve_device(device), fold_ln=fold_ln,
                              center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                              name=name or str(path), trust_remote_code=trust_remote_code, hf_tokenizer=False)
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"could not build the {FAMILIES[model_type].name} model in {path} "
                        f"({type(exc).__name__}: {one_line(exc, limit=300, typed=False)}); check that its config.json and *.safetensors "
                        "are what save_pretrained wrote") from None
    model.eval()
    tokenizer = None
    if (path / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_dir(path)
    elif any((path / f).is_file() for f in ("tokenizer.model", "vocab.json")):  # no fast-tokenizer file
        from transformers import AutoTokenizer

        hf_tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                               **({"trust_remote_code": True} if trust_remote_code else {}))
        tokenizer = Tokenizer.from_hf(hf_tok)
    record = read_record(path)
    quantisation = record.get("gguf") if record is not None else None
    if isinstance(quantisation, dict):  # weights dequantised from a GGUF file (circuitgraph.adapters.gguf)
        warnings.warn(warning_text(quantisation), DequantisedWeightsWarning, stacklevel=2)
    else:
        quantisation = None
    return ModelAdapter(model, tokenizer=tokenizer, source=dict(source or {"path": str(path)}), format="huggingface",
                        family=model_type, quantisation=quantisation)


def load_pretrained(name: str, *, dtype: str = "float32", device: str = "cpu",
                    weights_dtype: str | None = None) -> ModelAdapter:
    """A pretrained model of :data:`circuitgraph.spec.pretrained.PRETRAINED_MODELS` by name, fetched into
    the cache on first use (:func:`circuitgraph.adapters.pretrained.fetch`); ``weights_dtype``: the
    dtype its source record says its weights have (the spec's ``model.dtype``; none by default)."""
    return _named(load_hf_dir(fetch(name), dtype=dtype, device=device,
                              source=_with_weights({"pretrained": name}, weights_dtype)), name)


def _with_weights(source: dict[str, Any], weights_dtype: str | None) -> dict[str, Any]:
    """A source record, with the weights' dtype last when one is given."""
    return source if weights_dtype is None else {**source, "weights_dtype": weights_dtype}


def _named(adapter: ModelAdapter, name: str) -> ModelAdapter:
    """The model's name in the graph's metadata: a folder's config gives none (TransformerLens says "custom")."""
    adapter.model.cfg.model_name = name
    return adapter


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _load_safetensors(weights: Path) -> dict[str, torch.Tensor]:

    try:
        return load_file(str(weights), device="cpu")
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"{weights} is not a readable safetensors file ({one_line(exc, limit=300, typed=False)}); "
                        "re-save the weights with safetensors.torch.save_file") from None


def resolve_model_name(name: str) -> str:
    """TransformerLens's official name for ``name``: its own names and aliases, or a family
    name matched case-insensitively to an official name or its last part (``llama-3.2-1b`` ->
    ``meta-llama/Llama-3.2-1B``, ``gemma-2-2b`` -> ``google/gemma-2-2b``, ``qwen3-0.6b`` ->
    ``Qwen/Qwen3-0.6B``)."""
    # re-exported by loading_from_pretrained (every 3.x) without being in its __all__
    from transformer_lens.loading_from_pretrained import (
        OFFICIAL_MODEL_NAMES,  # pyright: ignore[reportPrivateImportUsage]
        get_official_model_name,
    )

    try:
        return get_official_model_name(name)
    except ValueError:
        pass
    low = name.lower()
    hits = [n for n in OFFICIAL_MODEL_NAMES if n.lower() == low or n.split("/")[-1].lower() == low]
    if len(hits) == 1:
        return hits[0]
    family = sorted(n for n in OFFICIAL_MODEL_NAMES if n.split("/")[-1].lower().startswith(low))
    close = family[:8] or difflib.get_close_matches(name, OFFICIAL_MODEL_NAMES, n=5, cutoff=0.5)
    raise LoadError(f"model name {name!r} is not a TransformerLens model; "
                    + (f"did you mean one of {', '.join(close)}?" if close else
                       "see transformer_lens.loading_from_pretrained.OFFICIAL_MODEL_NAMES"))


def _hub_config(repo: str) -> dict[str, Any] | None:
    """``repo``'s config.json from the Hugging Face cache (or the hub unless HF_HUB_OFFLINE is
    set); None when it cannot be had."""
    from huggingface_hub import hf_hub_download


    try:
        cfg = read_json_file(hf_hub_download(repo, "config.json", cache_dir=_cache_dir(), local_files_only=_offline()),
                             "model config")
    except Exception:  # noqa: BLE001 - not reachable / not cached: the caller says what to do
        return None
    return cfg if isinstance(cfg, dict) else None


def _snapshot(repo: str) -> str:
    """The local snapshot folder of ``repo`` with its config, weights and tokenizer files (fetched
    into the cache unless HF_HUB_OFFLINE is set)."""
    from huggingface_hub import snapshot_download


    try:
        return snapshot_download(repo, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"],
                                 cache_dir=_cache_dir(), local_files_only=_offline())
    except Exception as exc:  # noqa: BLE001
        where = "the local Hugging Face cache (HF_HUB_OFFLINE is set)" if _offline() else "the hub"
        raise LoadError(f"model {repo!r}: its files could not be read from {where} ({type(exc).__name__}: "
                        f"{one_line(exc, limit=300, typed=False)[:200]}); download it with `huggingface-cli download {repo}`, or save it "
                        "locally and use model: {path: DIR}") from None


def _family_snapshot(name: str) -> tuple[str, str | None]:
    """``(name, snapshot folder)`` for a hub name: the snapshot when its config.json's
    ``model_type`` is a supported family (``ORG/REPO`` as given, or TransformerLens's official
    name of an alias); ``(official name, None)`` for TransformerLens's own loader."""
    cfg = _hub_config(name) if "/" in name else None
    if cfg is not None and cfg.get("model_type") in FAMILIES:
        return name, _snapshot(name)
    try:
        official = resolve_model_name(name)
    except LoadError:
        if "/" not in name:
            raise
        if cfg is not None:
            raise LoadError(unsupported_model_type_message(cfg.get("model_type"), f"{name}: config.json")) from None
        where = "in the local Hugging Face cache (HF_HUB_OFFLINE is set)" if _offline() else "on the hub"
        raise LoadError(f"model {name!r}: no config.json {where}, and it is not a TransformerLens name; check the "
                        f"name, download it with `huggingface-cli download {name}`, or save it locally and use "
                        "model: {path: DIR}") from None
    cfg = _hub_config(official)
    if cfg is not None and cfg.get("model_type") in FAMILIES:
        return official, _snapshot(official)
    return official, None


def load_model_name(
    name: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    fold_ln: bool = False,
    center_writing_weights: bool = False,
    center_unembed: bool = False,
    trust_remote_code: bool = False,
    weights_dtype: str | None = None,
) -> ModelAdapter:
    """A TransformerLens pretrained model by name, or by a family name such as ``llama-3.2-1b``
    (:func:`resolve_model_name`), from the hub or the local Hugging Face cache
    (``HF_HUB_OFFLINE=1``: cached files only); its source record names the model as resolved
    (and ``weights_dtype`` when given, as :func:`load_pretrained`)."""
    from transformer_lens import HookedTransformer

    require_hub(f"model: {{name: {name}}}")  # one line at once, not a minute of retries
    # ORG/REPO of any supported family: read from its own files (the hub or the local cache)
    name, snapshot = _family_snapshot(name)
    if snapshot is not None:
        return load_hf_dir(snapshot, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                           fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                           center_unembed=center_unembed, name=name,
                           source=_with_weights({"name": name, "fold_ln": fold_ln}, weights_dtype))
    try:
        model = HookedTransformer.from_pretrained(
            name,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            # TransformerLens types dtype by its default ("float32") and takes a torch.dtype too
            # (float64 has no name in its table)
            dtype=torch_dtype(dtype),  # pyright: ignore[reportArgumentType]
            device=resolve_device(device),
            trust_remote_code=trust_remote_code,
        )
    except Exception as exc:  # noqa: BLE001
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            from transformer_lens.loading_from_pretrained import get_official_model_name

            repo = get_official_model_name(name)
            raise LoadError(
                f"could not load pretrained model {name!r}: it is not (completely) in the local Hugging Face cache "
                f"and HF_HUB_OFFLINE is set ({type(exc).__name__}: {msg[:200]}); download it with "
                f"`huggingface-cli download {repo}`, "
                "or save the model locally and use model: {path: DIR}"
            ) from None
        raise LoadError(
            f"could not load pretrained model {name!r} ({type(exc).__name__}: {msg}); "
            "this needs the Hugging Face hub: check the name and your connection, "
            "or save the model locally and use model: {path: DIR}"
        ) from None
    model.eval()
    tokenizer = Tokenizer.from_hf(model.tokenizer) if model.tokenizer is not None else None
    return ModelAdapter(model, tokenizer=tokenizer, source=_with_weights({"name": name, "fold_ln": fold_ln}, weights_dtype),
                        format="transformer_lens")


def load_builtin_model(name: str, *, dtype: str = "float32", device: str = "cpu",
                       backend: ModelBackend = "auto", weights_dtype: str | None = None) -> tuple[ModelAdapter, Path]:
    """The built-in model ``name``; returns the adapter (its source record ``{"builtin": name}``,
    and ``weights_dtype`` when given) and the bundle folder (with transcoders/)."""
    if name not in BUILTIN_MODELS:
        raise LoadError(f"unknown built-in model {name!r}; available: {', '.join(sorted(BUILTIN_MODELS))}")
    bundle = Path(BUILTIN_MODELS[name]())
    adapter = load_model_dir(bundle / "model", dtype=dtype, device=device, backend=backend,
                             source=_with_weights({"builtin": name}, weights_dtype))
    return adapter, bundle


# ------------------------------------------------------------------ the spec's model sources' loaders
def _from_path(m: ModelSpec, dtype: str, weights_dtype: str | None = None) -> ModelAdapter:
    path = Path(spec_field(m.path, "model.path"))
    return load_model_dir(path, dtype=dtype, device=m.device, trust_remote_code=m.trust_remote_code,
                          backend=m.backend, source=_with_weights({"path": str(path)}, weights_dtype))


def _from_name(m: ModelSpec, dtype: str, weights_dtype: str | None = None) -> ModelAdapter:
    return load_model_name(spec_field(m.name, "model.name"), dtype=dtype, device=m.device, fold_ln=m.fold_ln,
                           center_writing_weights=m.center_writing_weights, center_unembed=m.center_unembed,
                           trust_remote_code=m.trust_remote_code, weights_dtype=weights_dtype)


def _from_pretrained(m: ModelSpec, dtype: str, weights_dtype: str | None = None) -> ModelAdapter:
    return load_pretrained(spec_field(m.pretrained, "model.pretrained"), dtype=dtype, device=m.device,
                           weights_dtype=weights_dtype)


def _from_builtin(m: ModelSpec, dtype: str, weights_dtype: str | None = None) -> ModelAdapter:
    return load_builtin_model(spec_field(m.builtin, "model.builtin"), dtype=dtype, device=m.device, backend=m.backend,
                              weights_dtype=weights_dtype)[0]


#: each source's loader, registered on its record (:data:`circuitgraph.adapters.model_sources.MODEL_SOURCES`)
implement_model_source("path", _from_path)
implement_model_source("name", _from_name)
implement_model_source("pretrained", _from_pretrained)
implement_model_source("builtin", _from_builtin)


def load_model_spec(m: ModelSpec, *, dtype: str, weights_dtype: str | None = None) -> ModelAdapter:
    """The model a spec's ``model:`` section names (:class:`circuitgraph.spec.model.ModelSpec`),
    loaded in ``dtype`` by its source's record; its source record also says the dtype of its
    weights (``weights_dtype``, when given), made once with the adapter."""
    return model_source(m).load(m, dtype, weights_dtype)
