"""GemmaScope-2's published transcoder layouts (``google/gemma-scope-2-<size>-<pt|it>``).

Per-layer transcoders (``transcoder/`` and ``transcoder_all/`` folders of the repository)::

    layer_<i>_width_<w>_l0_<s>[_affine]/config.json
    layer_<i>_width_<w>_l0_<s>[_affine]/params.safetensors
        w_enc (d_model, d_sae), b_enc (d_sae,), threshold (d_sae,), w_dec (d_sae, d_model),
        b_dec (d_model,), [affine_skip_connection (d_model, d_model), used as x @ A]

Cross-layer transcoders (``clt/`` folder)::

    width_<w>_l0_<s>[_affine]/config.json
    width_<w>_l0_<s>[_affine]/params_layer_<i>.safetensors      for i = 0 .. n_layers - 1
        w_enc (d_model, d_sae), b_enc (d_sae,), threshold (d_sae,), b_dec (d_model,),
        w_dec (d_sae, n_layers, d_model): the decoder of layer i writes output layers i..n_layers-1
        ([:, i:], as circuit-tracer's ``load_gemma_scope_2_clt`` reads it; entries below i are unused),
        [affine_skip_connection (d_model, d_model), used as x @ A]

``config.json`` gives the Hugging Face hook points (``hf_hook_point_in`` /
``hf_hook_point_out``), ``architecture: jump_relu``, ``affine_connection`` and ``type``
(``transcoder`` | ``clt``).  The hook points are named in the Gemma-2/3 Hugging Face modules:
``model.layers.<l>.pre_feedforward_layernorm.output`` is the MLP's input (``mlp.hook_in``:
TransformerLens's ``ln2`` output), ``model.layers.<l>.post_feedforward_layernorm.output`` what
the block adds (``hook_mlp_out``), ``model.layers.<l>.mlp.output`` the MLP's output before the
post-norm (``mlp.hook_out``).  Activation: JumpReLU ``h * (h > threshold)``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from circuitgraph.errors import LoadError

__all__ = ["HF_HOOKS", "read_config_json", "tl_hooks", "per_layer_folders", "clt_layer_files"]

#: Hugging Face hook point (Gemma-2/3 module names, ``<l>`` the layer) -> TransformerLens-side hook
#: relative to ``blocks.<l>`` (circuit-tracer's names)
HF_HOOKS = {
    "pre_feedforward_layernorm.output": "mlp.hook_in",
    "post_feedforward_layernorm.output": "hook_mlp_out",
    "mlp.output": "mlp.hook_out",
    "pre_feedforward_layernorm.input": "hook_resid_mid",
}


def read_config_json(path: Path) -> dict[str, Any]:
    """``config.json`` of a GemmaScope-2 folder ({} when absent: sae-lens infers the defaults too)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"{path}: not valid JSON ({type(exc).__name__}); re-download it") from None
    if not isinstance(data, dict):
        raise LoadError(f"{path}: expected a JSON object with hf_hook_point_in / hf_hook_point_out")
    return data


def _tl_hook(point: str, where: Path, key: str, layer: int | None) -> tuple[str, int]:
    m = re.fullmatch(r"(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.(.+)", point)
    if not m or m.group(2) not in HF_HOOKS:
        raise LoadError(f"{where}: {key} {point!r} is not an MLP hook point circuitgraph maps; expected "
                        "model.layers.<l>." + " / ".join(HF_HOOKS))
    found = int(m.group(1))
    if layer is not None and found != layer:
        raise LoadError(f"{where}: {key} {point!r} is for layer {found}, the folder is layer {layer}")
    return HF_HOOKS[m.group(2)], found


def tl_hooks(config: dict[str, Any], where: Path, layer: int | None,
             default: tuple[str, str] = ("mlp.hook_in", "hook_mlp_out")) -> tuple[str, str]:
    """``(feature_input_hook, feature_output_hook)`` (block-relative) from config.json's hook
    points; a CLT's config names layer 0's (or any) layer, so ``layer`` is None there."""
    if not config:
        return default
    arch = config.get("architecture", "jump_relu")
    if arch != "jump_relu":
        raise LoadError(f"{where}: architecture {arch!r} is not supported; GemmaScope-2 transcoders are jump_relu")
    hin = config.get("hf_hook_point_in")
    hout = config.get("hf_hook_point_out")
    if not hin or not hout:
        return default
    h_in, l_in = _tl_hook(str(hin), where, "hf_hook_point_in", layer)
    h_out, l_out = _tl_hook(str(hout), where, "hf_hook_point_out", layer)
    if layer is None and l_in != l_out:
        raise LoadError(f"{where}: hf_hook_point_in is layer {l_in}, hf_hook_point_out layer {l_out}; expected one layer")
    return h_in, h_out


_LAYER_FOLDER = re.compile(r"layer_(\d+)(?:_width_[^/]+)?")


def per_layer_folders(path: Path) -> dict[int, Path]:
    """``{layer: folder}`` of GemmaScope-2 per-layer transcoders under ``path``: folders named
    ``layer_<i>_width_<w>_l0_<s>[_affine]`` (the published names) or ``layer_<i>`` holding
    ``params.safetensors`` (at any depth).  One variant per layer: several -> one-line error."""
    found: dict[int, list[Path]] = {}
    for p in sorted(path.rglob("params.safetensors")):
        rel = p.parent.relative_to(path)
        layer = next((int(m.group(1)) for part in rel.parts if (m := _LAYER_FOLDER.fullmatch(part))), None)
        if layer is not None:
            found.setdefault(layer, []).append(p.parent)
    for layer, folders in found.items():
        if len(folders) > 1:
            names = ", ".join(str(f.relative_to(path)) for f in folders[:4])
            raise LoadError(f"{path}: layer {layer} has {len(folders)} transcoders ({names}); keep one width / L0 "
                            "per layer (download one variant: huggingface-cli download REPO --include "
                            "'FOLDER/layer_*_width_16k_l0_small/*')")
    return {layer: folders[0] for layer, folders in sorted(found.items())}


def clt_layer_files(path: Path) -> dict[int, Path]:
    """``{layer: params_layer_<i>.safetensors}`` of a GemmaScope-2 CLT folder."""
    return {int(m.group(1)): p for p in path.glob("params_layer_*.safetensors")
            if (m := re.fullmatch(r"params_layer_(\d+)\.safetensors", p.name))}
