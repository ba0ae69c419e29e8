"""Dictionaries named by a Hugging Face repository: ``transcoders: {hf: ORG/REPO}``.

``ORG/REPO`` (optionally ``ORG/REPO/SUBFOLDER`` and ``@REVISION``, circuit-tracer's
convention) is resolved through ``huggingface_hub``, so the Hugging Face cache is used as it
is (``HF_HOME`` / ``HF_HUB_CACHE``; with ``HF_HUB_OFFLINE=1`` nothing is downloaded and only
cached files are used).  The repository holds one of the folder layouts of
:mod:`circuitgraph.dictionaries.formats`; a circuit-tracer ``config.yaml`` whose
``transcoders:`` lists ``hf://ORG/REPO/FILE`` URIs has each listed file resolved the same way.
A file that is not there gives one line naming the file and how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from circuitgraph._hub import require_hub
from circuitgraph.dictionaries.clt import CrossLayerTranscoder, read_config_yaml
from circuitgraph.dictionaries.formats import detect_format, load_dictionaries
from circuitgraph.dictionaries.layer_formats import load_transcoder_set_dir
from circuitgraph.errors import LoadError

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["parse_hf_ref", "resolve_hf_dictionary", "load_hf_dictionaries"]


def parse_hf_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``ORG/REPO[/SUBFOLDER][@REVISION]`` or ``hf://...`` -> (repo_id, subfolder, revision)."""
    ref = ref[len("hf://"):] if ref.startswith("hf://") else ref
    path, _, revision = ref.partition("@")
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2:
        raise LoadError(f"transcoders.hf {ref!r} is not a repository; give ORG/REPO (optionally ORG/REPO/SUBFOLDER "
                        "and @REVISION)")
    return "/".join(parts[:2]), "/".join(parts[2:]) or None, revision or None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _cache_dir() -> str | None:
    """The hub cache named by the environment now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _how(repo: str, filename: str) -> str:
    args = f"{repo}{' ' + filename if filename else ''}"
    return (f"download it with `huggingface-cli download {args}` (or `hf download {args}`)"
            + (" (HF_HUB_OFFLINE is set: only cached files are used)" if _offline() else ""))


def _file(repo: str, filename: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    require_hub(f"{repo}/{filename}")
    try:
        return Path(hf_hub_download(repo, filename, revision=revision, local_files_only=_offline(),
                                    cache_dir=_cache_dir()))
    except Exception as exc:  # noqa: BLE001
        kind = type(exc).__name__
        raise LoadError(f"{repo}/{filename} is not available ({kind}); {_how(repo, filename)}") from None


def resolve_hf_dictionary(ref: str) -> tuple[Path, dict[str, Any] | None]:
    """The local folder of a hub dictionary (and, for circuit-tracer's ``transcoder_set`` with
    listed ``hf://`` files, its config with those files resolved to local paths)."""
    from huggingface_hub import snapshot_download

    repo, sub, revision = parse_hf_ref(ref)
    require_hub(f"transcoders: {{hf: {ref}}}")
    try:
        root = Path(snapshot_download(repo, revision=revision, local_files_only=_offline(), cache_dir=_cache_dir(),
                                      allow_patterns=None if sub is None else [f"{sub}/*"]))
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"the repository {repo} is not available ({type(exc).__name__}); "
                        f"{_how(repo, (sub + '/') if sub else '')}".rstrip()) from None
    folder = root / sub if sub else root
    if not folder.is_dir():
        raise LoadError(f"{repo} has no folder {sub!r}; check transcoders.hf, or "
                        f"{_how(repo, (sub + '/') if sub else '')}")
    cfg = folder / "config.yaml"
    if not cfg.is_file():
        return folder, None

    config = read_config_yaml(cfg)
    listed = config.get("transcoders")
    if config.get("model_kind") in ("transcoder_set", "cross_layer_transcoder") and listed:
        local = []
        for entry in listed:
            entry = str(entry)
            if entry.startswith("hf://"):
                r, file_path, rev = parse_hf_ref(entry)
                if not file_path:
                    raise LoadError(f"{cfg}: transcoders entry {entry!r} names no file")
                local.append(str(_file(r, file_path, rev)))
            else:
                p = folder / entry
                if not p.is_file():
                    raise LoadError(f"{repo}/{(sub + '/') if sub else ''}{entry} is missing; "
                                    f"{_how(repo, ((sub + '/') if sub else '') + entry)}")
                local.append(str(p))
        config = {**config, "transcoders": local}
    return folder, config


def load_hf_dictionaries(ref: str, adapter: ModelAdapter, *, format: str | None = None, layers: list[int] | None = None,
                         dtype: torch.dtype = torch.float32,
                         check: Callable[[Path], str | None] = lambda folder: None) -> Dictionary:
    """Resolve ``ref`` in the Hugging Face cache and load the dictionary it holds, made with its
    source record ``{"hf": ref, "scan": ...}``; ``check``: the model-fit check of the resolved
    folder, run before any weight is read (a mismatch it returns is recorded in the source)."""
    folder, config = resolve_hf_dictionary(ref)
    repo, sub, revision = parse_hf_ref(ref)
    scan = (config or {}).get("scan") or (f"{repo}//{sub}" if sub else repo) + (f"@{revision}" if revision else "")
    mismatch = check(folder)
    source = {"hf": ref, "scan": scan, **({"model_mismatch": mismatch} if mismatch is not None else {})}
    try:
        out: Dictionary
        if config is not None and detect_format(folder) == "circuit_tracer_transcoder_set":
            if format not in (None, "circuit_tracer_transcoder_set"):
                raise LoadError(f"{ref}: transcoders.format is {format!r} but the repository holds a circuit-tracer "
                                "transcoder_set; set format: circuit_tracer_transcoder_set")
            out = load_transcoder_set_dir(folder, adapter, config, layers=layers, dtype=dtype, source=source)
        elif config is not None and config.get("transcoders"):  # a CLT config listing (GemmaScope-2) files
            out = load_dictionaries(folder, adapter, format=format, layers=layers, dtype=dtype, config=config,
                                    source=source)
        else:
            out = load_dictionaries(folder, adapter, format=format, layers=layers, dtype=dtype, source=source)
    except LoadError as exc:
        msg = str(exc)
        if " is missing" in msg and "huggingface-cli" not in msg:
            name = msg.split(" is missing")[0].rsplit("/", 1)[-1]
            msg = f"{msg.split(';')[0]}; {_how(repo, ((sub + '/') if sub else '') + name)}"
        raise type(exc)(msg) from None
    if isinstance(out, CrossLayerTranscoder):  # its describe() names the scan its config.yaml gave (or the repository)
        clt = cast(CrossLayerTranscoder, out)  # pyright keeps the protocol's with_source on the narrowed type
        return clt.with_source(source, config={**clt.config, "scan": scan})
    return out
