"""Transcoders named by an sae-lens registry release: ``transcoders: {release: R}``.

sae-lens's pretrained directory (the ``pretrained_saes.yaml`` shipped with sae-lens, which
``sae_lens.loading.pretrained_saes_directory`` reads; circuitgraph parses only release ``R``'s
block of it, without importing sae-lens) says, for release ``R``: the Hugging Face
repository (``repo_id``), the model it was trained on (``model``), how its files are laid out
(``conversion_func``) and its dictionaries (``saes``: id -> path).  circuitgraph reads that
entry, picks one dictionary per layer (the registry's, or ``ids`` when a layer has several),
fetches exactly the files those dictionaries need with ``huggingface_hub.hf_hub_download``
(the cache named by ``HF_HUB_CACHE`` / ``HF_HOME`` when the run starts; ``HF_HUB_OFFLINE=1``:
cached files only) and loads them with circuitgraph's own loaders, so shapes come from the
files, never from names:

=============================  ====================================  ==========================
``conversion_func``            files fetched per dictionary          loaded as
=============================  ====================================  ==========================
(none: sae-lens format)        ``<path>/cfg.json``,                  ``SAE.load_from_disk`` +
                               ``<path>/sae_weights.safetensors``    the hooks in ``cfg.json``
``gemma_2_transcoder``         ``<path>/params.npz``                 ``gemmascope`` (reads
                                                                     ``ln2.hook_normalized``, as
                                                                     sae-lens's config says)
``gemma_3`` (GemmaScope-2)     ``<path>/config.json``,               ``gemmascope2`` (hooks from
                               ``<path>/params.safetensors``         ``config.json``; matrices
                                                                     read by feature)
``mwhanna_transcoder``         ``<path>`` (``layer_<l>.safetensors``) circuit-tracer
                                                                     ``transcoder_set`` file,
                                                                     ``mlp.hook_in`` ->
                                                                     ``hook_mlp_out``
``mntss_clt_layer_transcoder`` the repository (a circuit-tracer CLT) the whole cross-layer
                                                                     transcoder (exact; sae-lens
                                                                     sums its decoders)
other                          sae-lens's own ``SAE.from_pretrained`` then the sae-lens checks
=============================  ====================================  ==========================

The release's model must be the spec's model (names compared through TransformerLens's
official names).  A file missing from the cache is one line naming the repository, the file
and the ``huggingface-cli download REPO FILE`` command.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from circuitgraph.dictionaries.gemmascope2 import read_config_json, tl_hooks
from circuitgraph.dictionaries.hub import _file, load_hf_dictionaries
from circuitgraph.dictionaries.layer_formats import gemmascope_files, transcoder_files
from circuitgraph.dictionaries.transcoders import TranscoderSet, _from_sae, load_sae_folder
from circuitgraph.errors import LoadError

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = ["ReleaseEntry", "release_entry", "release_layers", "load_release"]

#: conversions circuitgraph reads itself (the rest go through sae-lens's own loader)
OWN_CONVERSIONS = (None, "gemma_2_transcoder", "gemma_3", "mwhanna_transcoder", "mntss_clt_layer_transcoder")


@dataclass
class ReleaseEntry:
    """One release of sae-lens's pretrained directory (the fields of sae-lens's
    ``PretrainedSAELookup`` that circuitgraph uses)."""

    release: str
    repo_id: str
    model: str
    conversion_func: str | None
    saes_map: dict[str, str]  # id -> path in the repository
    neuronpedia_id: dict[str, str | None]
    config_overrides: Any


def _registry_yaml() -> str:
    """The text of sae-lens's ``pretrained_saes.yaml``, read from the installed package without
    importing sae-lens (its import pulls in the training stack: seconds per run)."""
    spec = importlib.util.find_spec("sae_lens")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "pretrained_saes.yaml"
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise LoadError("sae-lens's registry (sae_lens/pretrained_saes.yaml) is not installed; "
                    "pip install sae-lens, or give the dictionaries with transcoders: {path: DIR} / {hf: ORG/REPO}")


def _blocks(text: str) -> dict[str, tuple[int, int]]:
    """Top-level release names -> their (start, end) line range in the YAML text."""
    lines = text.splitlines()
    starts = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"^([^\s#][^:]*):\s*$", line))]
    return {name: (i, starts[k + 1][0] if k + 1 < len(starts) else len(lines)) for k, (i, name) in enumerate(starts)}


def release_entry(release: str) -> ReleaseEntry:
    """The registry entry of ``release`` (one-line LoadError naming close names).  Only that
    release's block of the YAML is parsed, exactly as sae-lens's
    ``get_pretrained_saes_directory`` reads it (ids, paths, model, repo_id, conversion_func)."""
    text = _registry_yaml()
    blocks = _blocks(text)
    if release not in blocks:
        close = difflib.get_close_matches(release, list(blocks), n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see sae_lens's pretrained_saes.yaml for the names"
        raise LoadError(f"transcoders.release {release!r} is not in sae-lens's registry; {hint}")
    start, end = blocks[release]
    value = yaml.safe_load("\n".join(text.splitlines()[start:end]))[release]
    saes = value.get("saes") or []
    return ReleaseEntry(
        release=release, repo_id=str(value["repo_id"]), model=str(value["model"]),
        conversion_func=value.get("conversion_func"),
        saes_map={str(h["id"]): str(h["path"]) for h in saes},
        neuronpedia_id={str(h["id"]): h.get("neuronpedia") for h in saes},
        config_overrides=value.get("config_overrides"))


def _official(name: str) -> str:
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        return get_official_model_name(name)
    except Exception:  # noqa: BLE001 - not a TransformerLens name: compare it as written
        return name


def check_release_model(entry: Any, adapter: ModelAdapter) -> None:
    """The release was trained on the spec's model, or a one-line LoadError naming both."""
    src = getattr(adapter, "source", {}) or {}
    have = src.get("name") or getattr(adapter.model.cfg, "model_name", None) or src.get("path") or "?"
    want = _official(str(entry.model))
    if _official(str(have)).lower() != want.lower():
        given = f"model: {{name: {src['name']}}}" if src.get("name") else \
            (f"model: {{path: {src['path']}}} (model_name {adapter.model.cfg.model_name!r})" if src.get("path")
             else f"model {have!r}")
        raise LoadError(f"transcoders.release {entry.release!r} is for model {entry.model!r} ({want}), the spec's "
                        f"model is {given}; use model: {{name: {entry.model}}} or transcoders trained for your model")


_LAYER = re.compile(r"(?:^|[^a-z0-9])(?:blocks|layers|layer|h)[._]?(\d+)(?=\D|$)", re.IGNORECASE)


def _layer_of(sae_id: str, path: str) -> int | None:
    for text in (path, sae_id):
        m = _LAYER.search(text)
        if m:
            return int(m.group(1))
    return None


def release_layers(entry: Any, ids: dict[int, str] | None = None, layers: list[int] | None = None) -> dict[int, str]:
    """``{layer: sae id}``: one dictionary per layer from the registry's ``saes`` (the layer read
    from each path / id as sae-lens does), or the ``ids`` given; restricted to ``layers``."""
    where = f"transcoders.release {entry.release!r}"
    if ids:
        unknown = [v for v in ids.values() if v not in entry.saes_map]
        if unknown:
            some = ", ".join(list(entry.saes_map)[:4])
            raise LoadError(f"transcoders.ids {unknown[:3]} are not ids of {where} (its ids are like {some}); "
                            "fix ids, or remove them to use the release's one dictionary per layer")
        chosen = {int(k): v for k, v in ids.items()}
    else:
        by_layer: dict[int, list[str]] = {}
        for sae_id, path in entry.saes_map.items():
            layer = _layer_of(sae_id, str(path))
            if layer is None:
                raise LoadError(f"{where}: cannot tell the layer of its dictionary {sae_id!r}; give transcoders.ids: "
                                "{LAYER: ID} for the layers you want")
            by_layer.setdefault(layer, []).append(sae_id)
        wanted = sorted(by_layer) if layers is None else list(layers)
        several = {l: by_layer[l] for l in wanted if len(by_layer.get(l, ())) > 1}
        if several:
            l, options = next(iter(several.items()))
            raise LoadError(f"{where} has {len(options)} dictionaries for layer {l} ({', '.join(options[:4])}"
                            f"{', ...' if len(options) > 4 else ''}); choose one per layer with transcoders.ids: "
                            f"{{{l}: {options[0]}, ...}}")
        chosen = {l: by_layer[l][0] for l in wanted if l in by_layer}
    if layers is not None:
        missing = [l for l in layers if l not in chosen]
        if missing:
            raise LoadError(f"transcoders.layers {missing}: {where} has no dictionary for them (it has layers "
                            f"{sorted(chosen)}); choose layers it covers")
        chosen = {l: chosen[l] for l in layers}
    if not chosen:
        raise LoadError(f"{where} lists no dictionaries")
    return dict(sorted(chosen.items()))


def load_release(release: str, adapter: ModelAdapter, *, ids: dict[int, str] | None = None,
                 layers: list[int] | None = None,
                 dtype: torch.dtype = torch.float32, check_model: bool = True) -> Dictionary:
    """Resolve ``release`` in sae-lens's registry, fetch its files and load them (see the module doc);
    ``check_model=False`` (the spec's ``allow_model_mismatch``) skips :func:`check_release_model`."""
    entry = release_entry(release)
    if check_model:
        check_release_model(entry, adapter)
    conv = entry.conversion_func
    repo = entry.repo_id
    revision = (entry.config_overrides or {}).get("revision") if isinstance(entry.config_overrides, dict) else None
    if conv == "mntss_clt_layer_transcoder":  # the repository is a circuit-tracer CLT: load it whole, exactly

        if ids or layers:
            raise LoadError(f"transcoders.release {release!r} is a cross-layer transcoder ({repo}), which covers every "
                            "layer; remove transcoders.ids / transcoders.layers")
        out = load_hf_dictionaries(repo, adapter, dtype=dtype)
        return out.with_source({"release": release, "repo_id": repo, "scan": out.source.get("scan")})
    chosen = release_layers(entry, ids, layers)
    n = adapter.facts.n_layers
    beyond = [l for l in chosen if not 0 <= l < n]
    if beyond:
        raise LoadError(f"transcoders.release {release!r} has dictionaries for layers up to {max(chosen)}, the model "
                        f"has {n} layers (0-{n - 1}); use the model the release was trained on ({entry.model}) or "
                        "choose transcoders.layers")
    source = {"release": release, "repo_id": repo, "conversion": conv,
              "ids": {str(l): i for l, i in chosen.items()}}
    paths = {l: str(entry.saes_map[i]) for l, i in chosen.items()}
    if conv == "gemma_2_transcoder":
        # hooks as sae-lens's gemma_2_transcoder config gives them (and circuit-tracer's Gemma-2 hook map):
        # ln2.hook_normalized (the pre-MLP RMSNorm's x / rms, before its weight) -> hook_mlp_out
        files = {l: _file(repo, f"{p}/params.npz", revision) for l, p in paths.items()}
        return gemmascope_files(files, adapter, version=1, dtype=dtype, source=source, where=Path(repo))
    if conv == "gemma_3":  # GemmaScope-2: <path>/config.json (hook points) + <path>/params.safetensors
        return _gemma_scope_2(release, repo, revision, paths, adapter, source, dtype)
    if conv == "mwhanna_transcoder":
        files = {l: _file(repo, p, revision) for l, p in paths.items()}
        return transcoder_files(files, adapter, site="mlp_input", hook_out="hook_mlp_out", dtype=dtype,
                                source=source, format="circuit_tracer_transcoder_set")

    if conv is None:  # sae-lens's own format, as save_model writes it

        out = {}
        for l, p in paths.items():
            cfg = _file(repo, f"{p}/cfg.json", revision)
            weights = _file(repo, f"{p}/sae_weights.safetensors", revision)
            if weights.parent != cfg.parent:  # one snapshot folder holds both
                raise LoadError(f"{repo}/{p}: cfg.json and sae_weights.safetensors are in different snapshots; "
                                f"download the folder again with `huggingface-cli download {repo} --include '{p}/*'`")
            try:
                sae = load_sae_folder(cfg.parent, device=str(adapter.device))
            except Exception as exc:  # noqa: BLE001
                msg = str(exc).splitlines()[0] if str(exc) else ""
                raise LoadError(f"{repo}/{p}: sae-lens could not load it ({type(exc).__name__}: {msg[:200]}); "
                                "check that the release holds transcoders") from None
            out[l] = _from_sae(sae.to(dtype=dtype), where=f"{repo}/{p}", expected_layer=l, adapter=adapter)
        return TranscoderSet(out, source, format="saelens")
    return TranscoderSet.from_release(release, chosen, adapter, dtype=dtype, source=source)


def _gemma_scope_2(release: str, repo: str, revision: str | None, paths: dict[int, str], adapter: ModelAdapter,
                   source: dict[str, Any], dtype: torch.dtype) -> Any:
    """GemmaScope-2 per-layer transcoders (sae-lens's ``gemma_3`` conversion, folders
    ``transcoder[_all]/layer_<l>_width_<w>_l0_<s>[_affine]``): each folder's ``config.json`` names
    its hook points (:func:`~circuitgraph.dictionaries.gemmascope2.tl_hooks`), ``params.safetensors``
    is read by feature, as ``transcoders: {path: DIR}`` reads the same folders."""
    where = f"transcoders.release {release!r}"
    for p in paths.values():
        if not re.fullmatch(r"(?:.*/)?layer_\d+[^/]*", p) or "clt" in p.split("/")[0]:
            raise LoadError(f"{where}: dictionary {p!r} is not a GemmaScope-2 per-layer transcoder folder "
                            "(transcoder/layer_<l>_width_<w>_l0_<s>); for a GemmaScope-2 cross-layer transcoder use "
                            f"transcoders: {{hf: {repo}/{p.rsplit('/', 1)[0] if '/' in p else p}}} (the whole CLT)")
    hooks = {}
    files = {}
    for l, p in paths.items():
        cfg = _file(repo, f"{p}/config.json", revision)
        hooks[l] = tl_hooks(read_config_json(cfg), Path(f"{repo}/{p}/config.json"), l)
        files[l] = _file(repo, f"{p}/params.safetensors", revision)
    if len(set(hooks.values())) > 1:
        raise LoadError(f"{where}: the chosen dictionaries' config.json name different hook points "
                        f"({sorted(set(hooks.values()))}); choose one transcoder family for every layer with "
                        "transcoders.ids")
    h_in, h_out = next(iter(hooks.values()))
    return gemmascope_files(files, adapter, version=2, dtype=dtype, input_hook=h_in, hook_out=h_out, source=source,
                            where=Path(repo))
