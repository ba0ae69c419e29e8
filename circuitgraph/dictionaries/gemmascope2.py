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

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from circuitgraph._io import read_json_file
from circuitgraph.dictionaries.clt import CrossLayerTranscoder, fold_layer_input, hook_site, output_site
from circuitgraph.dictionaries.mlp_input import mlp_input_norm
from circuitgraph.dictionaries.stored import StoredRows, check_finite
from circuitgraph.errors import LoadError, ShapeMismatchError

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["HF_HOOKS", "clt_layer_files", "load_gemmascope2_clt_dir", "per_layer_folders", "read_config_json", "tl_hooks"]

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
        data = read_json_file(path, "GemmaScope-2 config.json")
    except LoadError as exc:
        raise LoadError(f"{path}: not valid JSON ({exc}); re-download it") from None
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


def load_gemmascope2_clt_dir(path: Path, adapter: ModelAdapter, *, dtype: Any = None, lazy: bool | None = None,
                             files: dict[int, Path] | None = None, ct_config: dict[str, Any] | None = None,
                             format: str = "gemmascope2_clt") -> Any:
    """A GemmaScope-2 cross-layer transcoder folder (``config.json`` + ``params_layer_<i>.safetensors``)
    as a :class:`~circuitgraph.dictionaries.clt.CrossLayerTranscoder`: the same engine, queries and
    checks as circuit-tracer's CLT layout, its matrices left in the files and read by feature.

    ``files`` / ``ct_config``: the layer files a circuit-tracer ``config.yaml`` lists
    (``model_kind: cross_layer_transcoder`` with ``transcoders: [...]``, as circuit-tracer's
    ``load_gemma_scope_2_clt`` reads them), whose ``feature_input_hook`` / ``feature_output_hook``
    then give the hooks."""
    dtype = dtype or torch.float32
    cfg_path = path / ("config.yaml" if ct_config is not None else "config.json")
    config = read_config_json(path / "config.json") if ct_config is None else {}
    if config.get("type", "clt") != "clt":
        raise LoadError(f"{cfg_path}: type {config.get('type')!r}; a GemmaScope-2 cross-layer transcoder folder has "
                        "type clt (per-layer transcoders are layer_<i>_width_*/params.safetensors folders)")
    if ct_config is not None:
        hook_in = str(ct_config.get("feature_input_hook", "hook_resid_mid"))
        hook_out = str(ct_config.get("feature_output_hook", "hook_mlp_out"))
    else:
        hook_in, hook_out = tl_hooks(config, cfg_path, None)
    f = adapter.facts
    L, D = f.n_layers, f.d_model
    site = hook_site(hook_in, str(cfg_path))
    out_site = output_site(hook_out, str(cfg_path), post_norms=f.post_norms)
    files = clt_layer_files(path) if files is None else files
    if files and max(files) >= L:
        raise ShapeMismatchError(f"{files[max(files)]}: the CLT has layer {max(files)}, the model has {L} layers "
                                 f"(0-{L - 1}); use the CLT trained for this model")
    norms = None
    if site == "mlp_input":
        norms = [mlp_input_norm(adapter, layer) for layer in range(L)]
    b_enc, b_dec, thr, skips, enc, dec = [], [], [], [], [], []
    d_tc = None
    for layer in range(L):
        p = files.get(layer, path / f"params_layer_{layer}.safetensors")
        if not p.is_file():
            raise LoadError(f"{p} is missing: a GemmaScope-2 CLT for this {L}-layer model needs params_layer_0 .. "
                            f"params_layer_{L - 1}.safetensors; download it into {path}")
        try:
            with safe_open(str(p), framework="pt") as fh:
                keys = set(fh.keys())
                need = {"w_enc", "w_dec", "b_enc", "b_dec", "threshold"}
                if not need <= keys:
                    raise LoadError(f"{p}: tensors {sorted(need - keys)} are missing (it has {sorted(keys)}); "
                                    "this is not a GemmaScope-2 CLT layer file")
                shape = tuple(fh.get_slice("w_enc").get_shape())
                dshape = tuple(fh.get_slice("w_dec").get_shape())
                be, bd, th = fh.get_tensor("b_enc"), fh.get_tensor("b_dec"), fh.get_tensor("threshold")
                sk = fh.get_tensor("affine_skip_connection") if "affine_skip_connection" in keys else None
        except LoadError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise LoadError(f"{p}: not a readable safetensors file ({type(exc).__name__}); re-download it") from None
        if len(shape) != 2 or shape[0] != D:
            raise ShapeMismatchError(f"{p}: w_enc has shape {list(shape)}, expected [{D}, d_sae] (the model's "
                                     f"d_model is {D})")
        d_tc = shape[1] if d_tc is None else d_tc
        if shape[1] != d_tc:
            raise ShapeMismatchError(f"{p}: w_enc has {shape[1]} features, layer 0 has {d_tc}; every layer of a CLT "
                                     "has the same width")
        if dshape != (d_tc, L, D):
            raise ShapeMismatchError(f"{p}: w_dec has shape {list(dshape)}, expected [{d_tc}, {L}, {D}] (features, "
                                     "every output layer, d_model)")
        for name, t, want in (("b_enc", be, (d_tc,)), ("b_dec", bd, (D,)), ("threshold", th, (d_tc,)),
                              ("affine_skip_connection", sk, (D, D))):
            if t is not None and tuple(t.shape) != want:
                raise ShapeMismatchError(f"{p}: {name} has shape {list(t.shape)}, expected {list(want)}")
            if t is not None:
                check_finite(t, str(p), name)
        if layer > 0 and (sk is None) != (len(skips) == 0):
            raise LoadError(f"{p}: affine_skip_connection is in some layers only; give it in every layer or none")
        e = StoredRows(p, "w_enc", feature_dim=1, dtype=dtype)  # stored (d_model, d_sae)
        be, bd, sk = fold_layer_input(norms, layer, be, bd, sk, e)
        enc.append(e)
        dec.append(StoredRows(p, "w_dec", tail=(slice(layer, None),), dtype=dtype))  # output layers layer..L-1
        b_enc.append(be.to(dtype))
        b_dec.append(bd.to(dtype))
        thr.append(th.to(dtype))
        if sk is not None:
            skips.append(sk.to(dtype))  # x @ affine_skip_connection, the CLT's x @ W_skip
    if d_tc is None:
        raise LoadError(f"{path}: a GemmaScope-2 CLT for a model without layers; check the model")
    if lazy is None:
        lazy = L * int(d_tc) * D * torch.tensor([], dtype=dtype).element_size() > 2**30
    return CrossLayerTranscoder(
        path, n_layers=L, d_transcoder=int(d_tc), d_model=D, b_enc=torch.stack(b_enc), b_dec=torch.stack(b_dec),
        threshold=torch.stack(thr), W_skip=skips or None, activation_function="jump_relu", topk=None,
        feature_input_hook=hook_in, feature_output_hook=hook_out, dtype=dtype, source={"path": str(path)},
        config={"model_kind": "cross_layer_transcoder", **config, **(ct_config or {})}, lazy=lazy,
        input_norms=norms, out_site=out_site, stores=(enc, dec), format=format,
    )
