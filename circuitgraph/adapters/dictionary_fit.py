"""Does a dictionary fit its model?  Read from the dictionary's config files, without its weights.

A dictionary folder's config files say which model it was trained on (sae-lens ``cfg.json``:
``model_name``, or ``metadata.model_name``; circuit-tracer ``config.yaml``: ``model_name``),
how wide its input is (``d_in``) and which hooks it reads (``hook_name``).
:func:`read_declared` collects what they say; :func:`model_mismatch` compares the model name
with the spec's model, and :func:`shape_problems` the widths and hook layers with the model's
``d_model`` and ``n_layers``.

The name rule: names are compared without case and without an organisation prefix
(``openai-community/gpt2`` is ``gpt2``), and with TransformerLens's aliases (``gpt2-small`` is
``gpt2``).  A dictionary fits when its name is one of the model's names: the spec's
``model.name``, the model folder's name, the built-in model's name, or the ``model_name`` in the
model's config.  A dictionary that names no model fits (unknown, not wrong); its shapes must
still fit.  ``transcoders: {allow_model_mismatch: true}`` accepts a name that differs (the graph's
metadata records that it did); shapes can never be overridden.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitgraph._io import read_json_file, read_yaml_file
from circuitgraph.adapters.files import safetensors_shapes
from circuitgraph.errors import CircuitGraphError, LoadError
from circuitgraph.spec.model import ModelSpec

__all__ = ["DeclaredDictionary", "read_declared", "model_names", "model_mismatch", "shape_problems", "fit_problems"]

_LAYER_DIR = re.compile(r"^layer_(\d+)(?:\D.*)?$")
_HOOK_LAYER = re.compile(r"(?:^|\.)blocks\.(\d+)\.")
#: at most this many per-layer config files are read (a folder with more is not a dictionary)
_MAX_FILES = 512


@dataclass
class DeclaredDictionary:
    """What a dictionary folder's config files declare (each value with the file that says it)."""

    model_names: dict[str, str] = field(default_factory=dict)  #: file -> model_name
    d_in: dict[str, int] = field(default_factory=dict)  #: file -> input width
    hook_layers: dict[str, tuple[str, int]] = field(default_factory=dict)  #: file -> (input hook, its layer)
    layers: dict[str, int] = field(default_factory=dict)  #: file -> the layer its folder or file name says
    #: layer -> (features in that layer's dictionary, the file that says so): sae-lens ``d_sae``, sparsify
    #: ``num_latents``, a CLT's ``W_enc_<layer>`` rows
    widths: dict[int, tuple[int, str]] = field(default_factory=dict)


def _read_json(path: Path) -> Any:
    try:
        return read_json_file(path, "dictionary config")
    except LoadError:
        return None  # the loader reports an unreadable file with its own message


def _read_yaml(path: Path) -> Any:
    try:
        return read_yaml_file(path, "dictionary config")
    except LoadError:
        return None  # the loader reports a broken config.yaml with its own message


def _name_of(cfg: dict[str, Any]) -> str | None:
    meta = cfg.get("metadata")
    for holder in (cfg, meta if isinstance(meta, dict) else {}):
        name = holder.get("model_name")
        if isinstance(name, str) and name.strip():
            return name.strip()
    return None


def _note_cfg(out: DeclaredDictionary, rel: str, cfg: Any, layer: int | None) -> None:
    if not isinstance(cfg, dict):
        return
    name = _name_of(cfg)
    if name:
        out.model_names[rel] = name
    d_in = cfg.get("d_in")
    if isinstance(d_in, int) and not isinstance(d_in, bool):
        out.d_in[rel] = d_in
    meta = cfg.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    hook = meta.get("hook_name", cfg.get("hook_name"))
    if isinstance(hook, str):
        m = _HOOK_LAYER.search(hook)
        if m:
            out.hook_layers[rel] = (hook, int(m.group(1)))
    if layer is not None:
        out.layers[rel] = layer
    width = next((cfg[k] for k in ("d_sae", "num_latents") if isinstance(cfg.get(k), int)
                  and not isinstance(cfg.get(k), bool) and cfg[k] > 0), None)
    at = layer if layer is not None else out.hook_layers[rel][1] if rel in out.hook_layers else None
    if width is not None and at is not None:
        out.widths[at] = (int(width), rel)


def read_declared(path: str | Path) -> DeclaredDictionary:
    """What the config files of dictionary folder ``path`` declare: sae-lens ``layer_<i>/cfg.json``
    (and sparsify's ``<hookpoint>/cfg.json``), circuit-tracer ``config.yaml`` (with the input width
    from the first encoder file's header), and a top-level ``config.json``.  Unreadable files are
    skipped: loading the dictionary reports them."""
    path = Path(path)
    out = DeclaredDictionary()
    if not path.is_dir():
        return out
    for name, reader in (("config.yaml", _read_yaml), ("config.json", _read_json)):
        cfg = reader(path / name) if (path / name).is_file() else None
        if isinstance(cfg, dict):
            _note_cfg(out, name, cfg, None)
            if name == "config.yaml":  # a CLT stores W_enc_<i> as (d_transcoder, d_model)
                for n, f in enumerate(sorted(path.glob("W_enc_*.safetensors"))[:_MAX_FILES]):
                    try:
                        w = safetensors_shapes(f).get(f.stem)
                    except CircuitGraphError:  # the loader reports a broken file
                        w = None
                    if w and len(w) == 2:
                        if n == 0:
                            out.d_in[f.name] = int(w[1])
                        suffix = f.stem[len("W_enc_"):]
                        if suffix.isdigit():
                            out.widths[int(suffix)] = (int(w[0]), f.name)
    subs = sorted(p for p in path.iterdir() if p.is_dir())[:_MAX_FILES]
    for sub in subs:
        cfg_file = sub / "cfg.json"
        if not cfg_file.is_file():
            continue
        m = _LAYER_DIR.match(sub.name)
        _note_cfg(out, f"{sub.name}/cfg.json", _read_json(cfg_file), int(m.group(1)) if m else None)
    return out


# ---------------------------------------------------------------------------- names
def _plain(name: str) -> str:
    return name.strip().rstrip("/").rsplit("/", 1)[-1].lower()


def _aliases(name: str) -> set[str]:
    """``name`` and the TransformerLens names it stands for (official name and aliases)."""
    out = {_plain(name)}
    try:
        # re-exported by loading_from_pretrained (every 3.x) without being in its __all__
        from transformer_lens.loading_from_pretrained import MODEL_ALIASES  # pyright: ignore[reportPrivateImportUsage]
    except Exception:  # noqa: BLE001 - without TransformerLens names are compared as written
        return out
    for official, aliases in MODEL_ALIASES.items():
        group = {_plain(official), *(_plain(a) for a in aliases)}
        if out & group:
            out |= group
    return out


def model_names(model_spec: ModelSpec, config_name: str | None) -> dict[str, str]:
    """The names the spec's model goes by, ``{where it comes from: name}``."""
    out: dict[str, str] = {}
    if getattr(model_spec, "name", None):
        out["model.name"] = str(model_spec.name)
    path = getattr(model_spec, "path", None)
    if path is not None:
        out["the model folder's name"] = Path(path).name
    if getattr(model_spec, "builtin", None):
        out["model.builtin"] = str(model_spec.builtin)
    if config_name:
        out["the model config's model_name"] = str(config_name)
    return out


def model_mismatch(declared: DeclaredDictionary, names: dict[str, str], where: str) -> str | None:
    """``None`` when every model the dictionary names is one of ``names`` (or it names none); else
    one sentence naming both."""
    # a name written the same way matches without TransformerLens's alias table (importing it costs seconds)
    plain = {_plain(n) for n in names.values()}
    unmatched = {f: n for f, n in declared.model_names.items() if _plain(n) not in plain}
    mine: set[str] = set()
    for n in names.values() if unmatched else ():
        mine |= _aliases(n)
    bad = {f: n for f, n in unmatched.items() if not (_aliases(n) & mine)}
    if not bad:
        return None
    file, theirs = next(iter(bad.items()))
    ours = ", ".join(f"{v!r} ({k})" for k, v in names.items()) or "unnamed"
    return (f"{where + ': ' if where else ''}the dictionary was trained on model {theirs!r} ({file} says "
            f"model_name), the spec's model is {ours}")


def shape_problems(declared: DeclaredDictionary, d_model: int | None, n_layers: int | None,
                   where: str) -> list[str]:
    """Input widths that are not ``d_model`` and hook / folder layers beyond ``n_layers``."""
    out = []
    lead = f"{where}: " if where else ""
    if d_model is not None:
        for f, d in declared.d_in.items():
            if d != d_model:
                layer = declared.layers.get(f, declared.hook_layers.get(f, (None, None))[1])
                which = f"the layer {layer} dictionary ({f})" if layer is not None else f
                out.append(f"{lead}{which} has d_in={d}, the model's d_model is {d_model} (expected d_in = "
                           f"{d_model}); the dictionary is for another model")
    if n_layers is not None:
        layers: Iterable[tuple[str, str, int]] = [
            *((f, f"input hook {h!r}", lyr) for f, (h, lyr) in declared.hook_layers.items()),
            *((f, "its folder name", lyr) for f, lyr in declared.layers.items()),
        ]
        seen = set()
        for f, what, lyr in layers:
            if lyr >= n_layers and f not in seen:
                seen.add(f)
                out.append(f"{lead}{f} is for layer {lyr} ({what}), the model has {n_layers} layers "
                           f"(0-{n_layers - 1})")
    return out


#: what to do about a dictionary of another model
MISMATCH_FIX = ("use transcoders trained for this model, or set transcoders: {allow_model_mismatch: true} if it is "
                "the same model under another name")


def fit_problems(declared: DeclaredDictionary, model_spec: ModelSpec, *, config_name: str | None, d_model: int | None,
                 n_layers: int | None, allow_model_mismatch: bool, where: str) -> tuple[list[str], str | None]:
    """``(problems, note)``: the shape problems and, unless allowed, the name mismatch (each one
    sentence starting with ``where``); ``note`` is the allowed mismatch, for the graph's metadata."""
    problems = shape_problems(declared, d_model, n_layers, where)
    names = model_names(model_spec, config_name)
    if names.get("the model folder's name") == "model":  # the usual bundle layout names nothing
        names.pop("the model folder's name")
    mismatch = model_mismatch(declared, names, where)
    if mismatch is None:
        return problems, None
    if allow_model_mismatch:
        return problems, f"{mismatch}; used anyway (transcoders.allow_model_mismatch: true)"
    return problems + [f"{mismatch}; {MISMATCH_FIX}"], None
