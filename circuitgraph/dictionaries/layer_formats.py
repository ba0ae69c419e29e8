"""Per-layer transcoders in the published layouts other than sae-lens's.

Each reader returns a :class:`~circuitgraph.dictionaries.TranscoderSet` of plain-tensor
:class:`~circuitgraph.dictionaries.TranscoderLayer` objects (sae-lens orientation:
``W_enc (d_model, d_sae)``, ``W_dec (d_sae, d_model)``, ``W_skip (d_out, d_in)``, skip =
``x @ W_skip.T``) with the format's own activation:

``circuit_tracer_transcoder_set``
    ``config.yaml`` (``model_kind: transcoder_set``, ``feature_input_hook``,
    ``feature_output_hook``, optional ``transcoders:`` list of per-layer files relative to the
    folder) and ``layer_<i>.safetensors`` with ``W_enc (d_sae, d_model)``, ``W_dec (d_sae,
    d_model)``, ``b_enc``, ``b_dec``, optional ``activation_function.threshold`` (JumpReLU
    ``h * (h > t)``, else ReLU) and ``W_skip (d_model, d_model)``; when ``transcoders:`` lists
    ``.npz`` files they are GemmaScope files, ``params.safetensors``-style files with ``w_enc``
    keys GemmaScope-2 files (circuit-tracer's own dispatch, by content here).
``gemmascope``
    ``layer_<i>/.../params.npz`` with ``W_enc (d_model, d_sae)``, ``W_dec (d_sae, d_model)``,
    ``b_enc``, ``b_dec``, ``threshold``: JumpReLU ``h * (h > t)``.
``gemmascope2``
    ``layer_<i>/.../params.safetensors`` with ``w_enc (d_model, d_sae)``, ``w_dec (d_sae,
    d_model)``, ``b_enc``, ``b_dec``, ``threshold``, optional ``affine_skip_connection (d_in,
    d_out)``: JumpReLU.
``eleuther_topk``
    EleutherAI sparsify: ``<hookpoint>/cfg.json`` (``d_in``, ``num_latents``, ``k``,
    ``transcode: true``, ``skip_connection``) + ``<hookpoint>/sae.safetensors`` with
    ``encoder.weight (num_latents, d_in)``, ``encoder.bias``, ``W_dec (num_latents, d_in)``,
    ``b_dec``, optional ``W_skip (d_in, d_in)``; activation: top-k of ``relu(h)``.  The hookpoint
    folder names the layer (``layers.<i>.mlp``, ``h.<i>.mlp``, ``blocks.<i>.mlp``).

Input hooks that read the MLP's *input* (``mlp.hook_in``: ``gamma2 * P(x)/sigma2 + beta2``;
GemmaScope and sparsify transcoders read it) are folded exactly into the encoder at load
time so the transcoder reads ``ln2.hook_normalized``: ``W_enc <- gamma * W_enc``, ``b_enc <-
b_enc + beta . W_enc`` (and for a skip path ``W_skip <- W_skip * gamma``, ``b_dec <- b_dec +
W_skip beta``).  Output hooks ``hook_mlp_out`` and ``mlp.hook_out`` are the same site for
models without post-MLP norms; with post-norms ``mlp.hook_out`` is the MLP output before the
post-norm (``output_site: before_post_norm``), which the engine maps through the frozen norm.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open

from circuitgraph._io import read_json_file
from circuitgraph.dictionaries.clt import InputSite, hook_site, output_hook_name, output_site
from circuitgraph.dictionaries.gemmascope2 import per_layer_folders, read_config_json, tl_hooks
from circuitgraph.dictionaries.mlp_input import fold_input, fold_mlp_input, mlp_input_norm
from circuitgraph.dictionaries.stored import StoredRows, check_finite
from circuitgraph.dictionaries.transcoders import TranscoderLayer, TranscoderSet
from circuitgraph.errors import LoadError, ShapeMismatchError

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["load_transcoder_set_dir", "load_gemmascope_dir", "load_eleuther_dir", "transcoder_files",
           "gemmascope_files", "LAYER_DIR_FORMATS"]

LAYER_DIR_FORMATS = ("circuit_tracer_transcoder_set", "gemmascope", "gemmascope2", "eleuther_topk")



def _finite(t: torch.Tensor | None, where: Path, name: str) -> None:
    if t is not None:
        check_finite(t, str(where), name)


def _shape(m: Any) -> tuple[int, ...]:
    """A matrix's shape in circuitgraph's orientation (a stored encoder / decoder is feature-major)."""
    if isinstance(m, StoredRows):
        n, *rest = m.shape()
        return (*rest, n) if m.key in _ENCODER_KEYS else (n, *rest)
    return tuple(m.shape)


def _make_layer(adapter: ModelAdapter, layer: int, where: Path, *, W_enc: torch.Tensor | StoredRows,
                b_enc: torch.Tensor, W_dec: torch.Tensor | StoredRows, b_dec: torch.Tensor,
                threshold: torch.Tensor | None = None, W_skip: torch.Tensor | None = None, site: InputSite, hook_out: str, activation: str, topk: int | None = None,
                architecture: str, dtype: torch.dtype, lazy: bool = False):
    """Check shapes and values against the model, fold an MLP-input site, build the layer.

    ``W_enc`` ``(d_model, d_sae)`` / ``W_dec`` ``(d_sae, d_model)`` are tensors (npz files) or
    :class:`StoredRows` left in their safetensors file: a stored decoder is read by active rows;
    a stored encoder is read whole when activations are computed (kept unless ``lazy``).  Small
    stored dictionaries (not ``lazy``) are checked for NaN/inf at load; large ones as they are read."""
    f = adapter.facts
    D = f.d_model
    if not 0 <= layer < f.n_layers:
        raise ShapeMismatchError(f"{where}: layer {layer}, the model has {f.n_layers} layers "
                                 f"(0-{f.n_layers - 1}); use the transcoders trained for this model")
    d_sae = _shape(W_enc)[1]
    shapes = {"W_enc": (W_enc, (D, d_sae)), "W_dec": (W_dec, (d_sae, D)), "b_enc": (b_enc, (d_sae,)),
              "b_dec": (b_dec, (D,)), "threshold": (threshold, (d_sae,)), "W_skip": (W_skip, (D, D))}
    for name, (t, shape) in shapes.items():
        if t is not None and _shape(t) != shape:
            raise ShapeMismatchError(f"{where}: {name} has shape {list(_shape(t))} (in circuitgraph's orientation), "
                                     f"expected {list(shape)} for d_model {D}, d_sae {d_sae}")
        if isinstance(t, StoredRows):
            if not lazy:  # small: read once now, so that a bad value fails before any output
                t.all()
        else:
            _finite(t, where, name)
    out_site = output_site(hook_out, str(where), post_norms=f.post_norms)
    f64 = torch.float64
    b_enc, b_dec = b_enc.to(f64), b_dec.to(f64)
    threshold = None if threshold is None else threshold.to(f64)
    W_skip = None if W_skip is None else W_skip.to(f64)
    W_enc = W_enc if isinstance(W_enc, StoredRows) else W_enc.to(f64)
    W_dec = W_dec if isinstance(W_dec, StoredRows) else W_dec.to(f64)
    enc_scale = None
    if site == "mlp_input":
        if isinstance(W_enc, StoredRows):  # gamma scales every row as it is read; beta: one read of the encoder now
            enc_scale, beta = mlp_input_norm(adapter, layer)
            shift = None if beta is None else fold_input(W_enc.all().T, None, beta)[1]
        else:
            W_enc, shift = fold_mlp_input(adapter, layer, W_enc)
        b_enc = b_enc if shift is None else b_enc + shift
        if W_skip is not None:  # skip = x @ W_skip.T
            folded, shift = fold_mlp_input(adapter, layer, W_skip.T)
            W_skip, b_dec = folded.T, (b_dec if shift is None else b_dec + shift)
        site = "normalized"
    hook_in = adapter.hook_resid_mid(layer) if site == "raw" else adapter.hook_norm_normalized("ln2", layer)
    def back(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).contiguous()

    def back_optional(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else back(t)

    def back_matrix(m: torch.Tensor | StoredRows) -> torch.Tensor | StoredRows:
        if isinstance(m, StoredRows):
            m.dtype, m.bytes_read = dtype, 0
            return m
        return back(m)

    return TranscoderLayer(
        layer=layer, W_enc=back_matrix(W_enc), b_enc=back(b_enc), W_dec=back_matrix(W_dec), b_dec=back(b_dec),
        W_skip=back_optional(W_skip), threshold=back_optional(threshold), input_site=site, hook_in=hook_in,
        hook_out=output_hook_name(layer, out_site), architecture=architecture, source=str(where),
        activation_kind=activation, topk=topk, output_site=out_site, enc_scale=back_optional(enc_scale), lazy=lazy,
    )


#: the large matrices of each safetensors layout, read by feature: key -> stored dimension of the features
#: (circuit-tracer ``W_enc (d_sae, d_model)``, GemmaScope-2 ``w_enc (d_model, d_sae)``, sparsify ``encoder.weight``)
_STORED = {"W_enc": 0, "W_dec": 0, "w_enc": 1, "w_dec": 0, "encoder.weight": 0}
_ENCODER_KEYS = ("W_enc", "w_enc", "encoder.weight")


def _load(path: Path) -> dict[str, Any]:
    """A layer file's tensors: small ones read, the large matrices of a safetensors file left in it
    (:class:`StoredRows`, feature-major); a GemmaScope ``.npz`` is read whole (it cannot be mapped)."""
    if not path.is_file():
        raise LoadError(f"{path} is missing; copy the layer's file into the folder (or fix the config)")
    try:
        if path.suffix == ".npz":
            with np.load(path) as z:
                return {k: torch.from_numpy(z[k].copy()) for k in z.files}

        out: dict[str, Any] = {}
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                out[k] = StoredRows(path, k, feature_dim=_STORED[k]) if k in _STORED else f.get_tensor(k)
        return out
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"{path}: not readable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                        "re-export it") from None


def _need(t: dict, keys: tuple[str, ...], where: Path) -> None:
    missing = [k for k in keys if k not in t]
    if missing:
        raise LoadError(f"{where}: tensors {missing} are missing (it has {sorted(t)}); "
                        "this is not the layout its folder says")


def _lazy(loaded: dict[int, dict[str, Any]], lazy: bool | None) -> bool:
    """Whether stored encoders are re-read on every use instead of kept: as for cross-layer
    transcoders, when the encoders together exceed 1 GiB (unless ``lazy`` says)."""
    if lazy is not None:
        return lazy
    total = sum(m.n_features * m.nbytes_per_feature() for t in loaded.values() for k in _ENCODER_KEYS
                if isinstance(m := t.get(k), StoredRows))
    return total > 2**30


def _from_tensors(adapter: ModelAdapter, layer: int, where: Path, t: dict, site: InputSite, hook_out: str, dtype: torch.dtype,
                  lazy: bool = False):
    """One layer from a circuit-tracer / GemmaScope / GemmaScope-2 file (dispatch on its keys)."""
    if "w_enc" in t:  # GemmaScope-2
        _need(t, ("w_enc", "w_dec", "b_enc", "b_dec", "threshold"), where)
        skip = t.get("affine_skip_connection")
        return _make_layer(adapter, layer, where, W_enc=t["w_enc"], b_enc=t["b_enc"], W_dec=t["w_dec"],
                           b_dec=t["b_dec"], threshold=t["threshold"], W_skip=None if skip is None else skip.T,
                           site=site, hook_out=hook_out, activation="jump_relu",
                           architecture="gemmascope2_jumprelu_transcoder", dtype=dtype, lazy=lazy)
    if where.suffix == ".npz":  # GemmaScope: W_enc stored (d_model, d_sae)
        _need(t, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), where)
        return _make_layer(adapter, layer, where, W_enc=t["W_enc"], b_enc=t["b_enc"], W_dec=t["W_dec"],
                           b_dec=t["b_dec"], threshold=t["threshold"], site=site, hook_out=hook_out,
                           activation="jump_relu", architecture="gemmascope_jumprelu_transcoder", dtype=dtype)
    _need(t, ("W_enc", "W_dec", "b_enc", "b_dec"), where)  # circuit-tracer: W_enc stored (d_sae, d_model)
    thr = t.get("activation_function.threshold")
    return _make_layer(adapter, layer, where, W_enc=t["W_enc"], b_enc=t["b_enc"], W_dec=t["W_dec"],
                       b_dec=t["b_dec"], threshold=thr, W_skip=t.get("W_skip"), site=site, hook_out=hook_out,
                       activation="jump_relu" if thr is not None else "relu",
                       architecture="circuit_tracer_" + ("jumprelu" if thr is not None else "relu") + "_transcoder"
                       + ("_skip" if "W_skip" in t else ""), dtype=dtype, lazy=lazy)


def _select(layers: dict[int, Any], wanted: list[int] | None, path: Path) -> dict[int, Any]:
    if wanted is None:
        return layers
    missing = [l for l in wanted if l not in layers]
    if missing:
        raise LoadError(f"transcoders for layers {missing} requested, {path} has layers {sorted(layers)}")
    return {l: layers[l] for l in wanted}


def load_transcoder_set_dir(path: Path, adapter: ModelAdapter, config: dict, *, layers: list[int] | None = None,
                            dtype: torch.dtype = torch.float32, lazy: bool | None = None,
                            source: dict[str, Any] | None = None):
    """circuit-tracer's per-layer ``transcoder_set`` folder; ``source``: its source record
    (default ``{"path": path}`` and the config's ``scan``)."""

    cfg_path = path / "config.yaml"
    site = hook_site(str(config.get("feature_input_hook", "")), str(cfg_path))
    hook_out = str(config.get("feature_output_hook", "hook_mlp_out"))
    listed = config.get("transcoders")
    if listed is not None:
        files = {}
        for i, entry in enumerate(listed):
            if str(entry).startswith("hf://"):
                raise LoadError(f"{cfg_path}: transcoders[{i}] is the hub file {entry}; download it next to "
                                "config.yaml and list the local file name instead")
            files[i] = (path / str(entry)).resolve() if not Path(str(entry)).is_absolute() else Path(str(entry))
    else:
        found = {int(m.group(1)): p for p in path.glob("layer_*.safetensors")
                 if (m := re.fullmatch(r"layer_(\d+)\.safetensors", p.name))}
        if not found:
            raise LoadError(f"{path}: no layer_<i>.safetensors files next to config.yaml (model_kind: transcoder_set)")
        top = max(found)
        missing = [i for i in range(top + 1) if i not in found]
        if missing:
            raise LoadError(f"{path / f'layer_{missing[0]}.safetensors'} is missing: circuit-tracer's transcoder_set "
                            f"needs layer_0 .. layer_{top}; copy it into {path}")
        files = found
    files = _select(files, layers, path)
    scan = config.get("scan")
    return transcoder_files(files, adapter, site=site, hook_out=hook_out, dtype=dtype,
                            source=source if source is not None else {"path": str(path), **({"scan": scan} if scan else {})},
                            format="circuit_tracer_transcoder_set", lazy=lazy)


def transcoder_files(files: dict[int, Path], adapter: ModelAdapter, *, site: InputSite, hook_out: str, dtype: torch.dtype,
                     source: dict[str, Any], format: str, lazy: bool | None = None):
    """A :class:`TranscoderSet` from one file per layer (circuit-tracer ``layer_<i>.safetensors``,
    GemmaScope ``params.npz`` or GemmaScope-2 ``params.safetensors``; the tensors say which), each
    reading input ``site`` (see :data:`~circuitgraph.dictionaries.clt.INPUT_HOOK_SITES`) and writing ``hook_out``; safetensors files stay on disk
    (read by feature, ``lazy`` as in :func:`_lazy`)."""
    loaded = {l: _load(p) for l, p in sorted(files.items())}
    lz = _lazy(loaded, lazy)
    out = {l: _from_tensors(adapter, l, files[l], t, site, hook_out, dtype, lz) for l, t in loaded.items()}
    return TranscoderSet(out, source, format=format)


def _layer_files(path: Path, name: str) -> dict[int, Path]:
    found: dict[int, Path] = {}
    for sub in path.iterdir():
        m = re.fullmatch(r"layer_(\d+)", sub.name)
        if not (m and sub.is_dir()):
            continue
        cands = sorted(sub.rglob(name))
        if not cands:
            raise LoadError(f"{sub} has no {name}; the GemmaScope layout is layer_<i>/.../{name}")
        if len(cands) > 1:
            raise LoadError(f"{sub} has {len(cands)} {name} files ({', '.join(str(c.relative_to(sub)) for c in cands[:3])}"
                            "...); keep the one width / L0 you want")
        found[int(m.group(1))] = cands[0]
    return found


def load_gemmascope_dir(path: Path, adapter: ModelAdapter, *, version: int, layers: list[int] | None = None,
                        dtype: torch.dtype = torch.float32, input_hook: str | None = None, lazy: bool | None = None):
    """GemmaScope (``params.npz``) or GemmaScope-2 (``params.safetensors``) per-layer transcoders.

    GemmaScope folders hold no hook names: they read ``ln2.hook_normalized`` (the pre-MLP
    RMSNorm's normalised input before its weight) and write ``hook_mlp_out``, as sae-lens's
    ``gemma_2_transcoder`` conversion and circuit-tracer's Gemma-2 hook map say (``input_hook``
    overrides the input).

    GemmaScope-2 folders are the published ``layer_<i>_width_<w>_l0_<s>[_affine]/`` (or
    ``layer_<i>/...``); each one's ``config.json`` names its hook points
    (:mod:`circuitgraph.dictionaries.gemmascope2`), e.g. ``post_feedforward_layernorm.output`` =
    ``hook_mlp_out`` or ``mlp.output`` = ``mlp.hook_out`` (before the post-MLP norm)."""
    if version == 1:
        files = _select(_layer_files(path, "params.npz"), layers, path)
        return gemmascope_files(files, adapter, version=1, dtype=dtype, input_hook=input_hook or GEMMASCOPE_INPUT_HOOK,
                                source={"path": str(path)}, where=path, lazy=lazy)

    folders = _select(per_layer_folders(path), layers, path)
    if not folders:
        raise LoadError(f"{path}: no layer_<i>_width_<w>_l0_<s>/params.safetensors folders (GemmaScope-2 layout)")
    hooks = {l: tl_hooks(read_config_json(d / "config.json"), d / "config.json", l,
                         (input_hook or "mlp.hook_in", "hook_mlp_out"))
             for l, d in folders.items()}
    if len(set(hooks.values())) > 1:
        raise LoadError(f"{path}: the layers' config.json name different hook points ({sorted(set(hooks.values()))}); "
                        "use one transcoder family for every layer")
    h_in, h_out = next(iter(hooks.values()))
    return gemmascope_files({l: d / "params.safetensors" for l, d in folders.items()}, adapter, version=2,
                            dtype=dtype, input_hook=h_in, hook_out=h_out, source={"path": str(path)}, where=path,
                            lazy=lazy)


#: what GemmaScope (1) transcoders read: sae-lens's ``gemma_2_transcoder`` conversion config and
#: circuit-tracer's Gemma-2 hook map (``pre_feedforward_layernorm``'s ``_norm`` output)
GEMMASCOPE_INPUT_HOOK = "ln2.hook_normalized"


def gemmascope_files(files: dict[int, Path], adapter: ModelAdapter, *, version: int, dtype: torch.dtype,
                     source: dict[str, Any], where: Path, input_hook: str = GEMMASCOPE_INPUT_HOOK, lazy: bool | None = None,
                     hook_out: str = "hook_mlp_out"):
    """GemmaScope (``params.npz``) / GemmaScope-2 (``params.safetensors``) files, one per layer
    (from a folder, or fetched from the hub by the sae-lens registry)."""
    return transcoder_files(files, adapter, site=hook_site(input_hook, str(where)), hook_out=hook_out, dtype=dtype,
                            source=source, format="gemmascope" if version == 1 else "gemmascope2", lazy=lazy)


def load_eleuther_dir(path: Path, adapter: ModelAdapter, *, layers: list[int] | None = None,
                      dtype: torch.dtype = torch.float32,
                      lazy: bool | None = None):
    """EleutherAI sparsify TopK (skip) transcoders, one ``<hookpoint>/`` folder per layer."""
    found: dict[int, Path] = {}
    for sub in sorted(path.iterdir()):
        if not (sub / "cfg.json").is_file():
            continue
        m = re.fullmatch(r"(?:model\.)?(?:layers|h|blocks|transformer\.h)\.(\d+)\.mlp", sub.name)
        if not m:
            raise LoadError(f"{sub}: hookpoint {sub.name!r} is not an MLP (expected layers.<i>.mlp, h.<i>.mlp or "
                            "blocks.<i>.mlp); only transcoders of MLPs are supported")
        found[int(m.group(1))] = sub
    found = _select(found, layers, path)
    cfgs, loaded = {}, {}
    for l, sub in sorted(found.items()):
        cfg = read_json_file(sub / "cfg.json", "sparsify cfg.json")
        if not cfg.get("transcode", False):
            raise LoadError(f"{sub / 'cfg.json'}: transcode is false: this is a sparse autoencoder, not a transcoder")
        if cfg.get("activation", "topk") != "topk":
            raise LoadError(f"{sub / 'cfg.json'}: activation {cfg.get('activation')!r} is not supported (topk only)")
        cfgs[l], loaded[l] = cfg, _load(sub / "sae.safetensors")
        _need(loaded[l], ("encoder.weight", "encoder.bias", "W_dec", "b_dec"), sub / "sae.safetensors")
    lz = _lazy(loaded, lazy)
    out = {}
    for l, t in loaded.items():
        out[l] = _make_layer(adapter, l, found[l] / "sae.safetensors", W_enc=t["encoder.weight"], b_enc=t["encoder.bias"],
                             W_dec=t["W_dec"], b_dec=t["b_dec"], W_skip=t.get("W_skip"), site="mlp_input",
                             hook_out="hook_mlp_out", activation="topk", topk=int(cfgs[l]["k"]),
                             architecture="eleuther_topk_" + ("skip_" if "W_skip" in t else "") + "transcoder",
                             dtype=dtype, lazy=lz)
    if not out:
        raise LoadError(f"{path}: no <hookpoint>/cfg.json folders (EleutherAI sparsify layout)")
    return TranscoderSet(out, {"path": str(path)}, format="eleuther_topk")
