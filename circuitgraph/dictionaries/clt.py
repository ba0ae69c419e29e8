"""Cross-layer transcoders (CLTs) in circuit-tracer 0.5.0's on-disk format.

A CLT feature ``j`` of layer ``l`` reads the residual stream at layer ``l`` (the encoder row
``W_enc_l[j]`` through the input hook) and writes ``a_j * W_dec_l[j, k - l]`` into the MLP
output of every layer ``k >= l``.  The reconstruction of MLP output ``k`` is

    recon_k = sum_{l <= k} sum_j a_{l,j} W_dec_l[j, k - l] + b_dec_k (+ x_k @ W_skip_k)

Directory layout (exactly what ``CrossLayerTranscoder.to_safetensors`` writes, plus the
``config.yaml`` circuit-tracer's hub loader reads)::

    config.yaml               model_kind: cross_layer_transcoder
                              feature_input_hook: hook_resid_mid   (relative to blocks.<l>)
                              feature_output_hook: hook_mlp_out
                              [activation_function: relu | jump_relu | topk]  [topk: K]
                              [scan: ...]  [model_name: ...]
    W_enc_<i>.safetensors     W_enc_<i> (d_transcoder, d_model), b_enc_<i> (d_transcoder,),
                              b_dec_<i> (d_model,), [threshold_<i> (d_transcoder,)],
                              [W_skip_<i> (d_model, d_model), used as x @ W_skip_<i>]
    W_dec_<i>.safetensors     W_dec_<i> (d_transcoder, n_layers - i, d_model)

for ``i = 0 .. n_layers - 1``.  Activations follow circuit-tracer: ReLU ``max(h, 0)``;
JumpReLU (a ``threshold_<i>`` tensor is present) ``h * (h > threshold)``; TopK (this format
extension: ``activation_function: topk`` with ``topk: K``) keeps the K largest ``h`` per
position and zeroes the rest.

``feature_input_hook`` is ``hook_resid_mid`` / ``hook_mlp_in`` (the raw residual stream),
``ln2.hook_normalized`` or ``mlp.hook_in`` (the MLP's input ``gamma2 * P(x)/sigma2 + beta2``;
folded exactly into the encoder by :mod:`circuitgraph.dictionaries.mlp_input`: ``gamma`` scales
each encoder row as it is read, ``beta . W_enc`` joins ``b_enc`` at load -- one read of each
encoder when the norm has a bias --, and the skip path is folded the same way).

Reading is lazy: encoder matrices are read from the memory-mapped files one layer at a time
when activations are computed (never all at once), decoder rows only for the features that
are active (safetensors slices), so memory grows with the active features, not the width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import safe_open

from circuitgraph._io import read_yaml_file
from circuitgraph.adapters.architecture import ModelAdapter
from circuitgraph.dictionaries.mlp_input import fold_input, mlp_input_norm
from circuitgraph.dictionaries.stored import StoredRows, check_finite
from circuitgraph.errors import LoadError, ShapeMismatchError

__all__ = ["CLTLayer", "CrossLayerTranscoder", "load_clt_dir", "output_hook_name", "output_site", "read_config_yaml",
           "hook_site", "INPUT_HOOK_SITES", "OUTPUT_HOOKS"]

Activation = Literal["relu", "jump_relu", "topk"]

#: the dictionaries' input hooks (relative to ``blocks.<l>``; circuit-tracer's ``feature_input_hook``,
#: sae-lens's ``hook_name`` after ``blocks.<l>.``) -> how the feature reads the residual: the one table
#: of every dictionary format (:func:`hook_site`)
#: how a dictionary's features read the residual: ``raw`` (resid_mid, mlp_in), ``normalized`` (ln2's
#: output) or ``mlp_input`` (the MLP's input, folded at load so that the features read ``normalized``)
InputSite = Literal["raw", "normalized", "mlp_input"]
#: what a loaded dictionary's features read (an ``mlp_input`` site is folded into ``normalized``)
ReadSite = Literal["raw", "normalized"]

INPUT_HOOK_SITES: dict[str, InputSite] = {
    "hook_resid_mid": "raw",
    "hook_mlp_in": "raw",
    "ln2.hook_normalized": "normalized",
    "mlp.hook_in": "mlp_input",  # folded into the encoder at load: features read ln2.hook_normalized
}
#: the output hooks a dictionary may write (relative to ``blocks.<l>``; :func:`output_site`)
OUTPUT_HOOKS = ("hook_mlp_out", "mlp.hook_out")


def read_config_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml_file(path, "dictionary config")
    if not isinstance(data, dict):
        raise LoadError(f"{path}: expected a mapping (model_kind, feature_input_hook, ...), got "
                        f"{type(data).__name__}")
    return data


def output_site(hook: str, where: str, *, post_norms: bool) -> str:
    """Where a dictionary writes, from its block-relative output hook: ``mlp_out``
    (``hook_mlp_out``: what the block adds to the residual stream) or ``before_post_norm``
    (``mlp.hook_out`` on a model with post-MLP norms, Gemma-2's ``ln2_post``: the MLP's own
    output, which the frozen post-norm then maps linearly, ``gamma * P(v) / sigma``).  Without
    post-norms the two hooks hold the same value (``mlp_out``)."""
    if hook not in OUTPUT_HOOKS:
        raise LoadError(f"{where}: feature_output_hook {hook!r} is not supported; expected hook_mlp_out or "
                        "mlp.hook_out (relative to blocks.<layer>)")
    return "before_post_norm" if hook == "mlp.hook_out" and post_norms else "mlp_out"


def output_hook_name(layer: int, site: str) -> str:
    """The hook name a dictionary of output site ``site`` writes at (``mlp.hook_out`` is virtual:
    see :meth:`~circuitgraph.adapters.ModelAdapter.hook_mlp_out_before_post_norm`)."""
    return (ModelAdapter.hook_mlp_out_before_post_norm(layer) if site == "before_post_norm"
            else ModelAdapter.hook_mlp_out(layer))


def hook_site(hook: str, where: str, *, sites: dict[str, InputSite] = INPUT_HOOK_SITES) -> InputSite:
    """The input site of a block-relative feature input hook, or a one-line LoadError."""
    if hook not in sites:
        raise LoadError(f"{where}: feature_input_hook {hook!r} is not supported; expected one of "
                        f"{', '.join(sites)} (relative to blocks.<layer>)")
    return sites[hook]


@dataclass
class CLTLayer:
    """The reading side of one encoder layer of a CLT (what a feature node reads)."""

    layer: int
    parent: CrossLayerTranscoder

    @property
    def d_sae(self) -> int:
        return self.parent.d_transcoder

    @property
    def hook_in(self) -> str:
        return self.parent.hook_in(self.layer)

    @property
    def hook_out(self) -> str:
        return self.parent.hook_out(self.layer)

    @property
    def input_site(self) -> ReadSite:
        return self.parent.input_site

    @property
    def output_site(self) -> str:
        return self.parent.output_site(self.layer)

    @property
    def b_enc(self) -> torch.Tensor:
        return self.parent.b_enc[self.layer]

    @property
    def threshold(self) -> torch.Tensor | None:
        return None if self.parent.threshold is None else self.parent.threshold[self.layer]

    @property
    def W_enc(self) -> torch.Tensor:
        """``(d_model, d_sae)`` (sae-lens orientation); reads the whole layer from disk."""
        return self.parent.encoder(self.layer).T

    def encoder_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Encoder rows ``(n, d_model)`` of features ``idx``."""
        return self.parent.encoder_rows(self.layer, idx)

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        return self.parent.pre_activation(self.layer, x)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        return self.parent.activate(self.layer, self.pre_activation(x))

    @property
    def architecture(self) -> str:
        return f"cross_layer_{self.parent.activation_function}"


class CrossLayerTranscoder:
    """A CLT behind the dictionary protocol (see :mod:`circuitgraph.dictionaries`)."""

    kind: Literal["cross_layer"] = "cross_layer"

    def __init__(self, path: Path, *, n_layers: int, d_transcoder: int, d_model: int,
                 b_enc: torch.Tensor, b_dec: torch.Tensor, threshold: torch.Tensor | None,
                 W_skip: list[torch.Tensor] | None, activation_function: Activation, topk: int | None,
                 feature_input_hook: str, feature_output_hook: str, dtype: torch.dtype,
                 source: dict[str, Any], config: dict[str, Any], lazy: bool = True,
                 input_norms: list[tuple[torch.Tensor | None, torch.Tensor | None]] | None = None,
                 out_site: str = "mlp_out", stores: tuple[list[StoredRows], list[StoredRows]] | None = None,
                 format: str = "circuit_tracer_clt"):
        self.path = Path(path)
        self.n_layers = n_layers
        self.d_transcoder = d_transcoder
        self.d_model = d_model
        self.b_enc = b_enc  # (n_layers, d_transcoder)
        self.b_dec_all = b_dec  # (n_layers, d_model)
        self.threshold = threshold  # (n_layers, d_transcoder) or None
        self.W_skip = W_skip  # per layer (d_model, d_model), used as x @ W_skip[l], or None
        self.activation_function: Activation = activation_function
        self.topk = topk
        self.feature_input_hook = feature_input_hook
        self.feature_output_hook = feature_output_hook
        # mlp.hook_in: (gamma, beta) of each layer's ln2, gamma applied to encoder rows as they are read
        # (beta is already in b_enc, the skip path folded at load): the features read ln2.hook_normalized
        self.input_norms = input_norms
        site = INPUT_HOOK_SITES[feature_input_hook]
        self.input_site: ReadSite = "normalized" if site == "mlp_input" else site
        self.dtype = dtype
        self.source = source
        self.config = config
        self.lazy = lazy
        self.out_site = out_site
        self._enc: dict[int, torch.Tensor] = {}
        self.layers = {l: CLTLayer(l, self) for l in range(n_layers)}
        self.format = format
        if stores is None:  # circuit-tracer's files: W_enc_<l> (F, D) and W_dec_<l> (F, L - l, D)
            stores = ([StoredRows(self.path / f"W_enc_{l}.safetensors", f"W_enc_{l}", dtype=dtype) for l in range(n_layers)],
                      [StoredRows(self.path / f"W_dec_{l}.safetensors", f"W_dec_{l}", dtype=dtype) for l in range(n_layers)])
        #: per encoder layer: the encoder (features x d_model) and the decoder (features x L - l x d_model)
        #: left in their files, read by feature
        self.enc_rows, self.dec_rows = stores

    # ----------------------------------------------------------------- container protocol
    def __contains__(self, layer: object) -> bool:
        return layer in self.layers

    def __getitem__(self, layer: int) -> CLTLayer:
        return self.layers[layer]

    def __len__(self) -> int:
        return self.n_layers

    def hook_in(self, layer: int) -> str:
        if self.input_norms is not None:
            return ModelAdapter.block_hook(layer, "ln2.hook_normalized")
        return ModelAdapter.block_hook(layer, self.feature_input_hook)

    def _fold_rows(self, layer: int, rows: torch.Tensor) -> torch.Tensor:
        """Encoder rows ``(n, d_model)`` as read from the file -> the rows applied to
        ``ln2.hook_normalized`` (``gamma * row``) for an ``mlp.hook_in`` CLT."""
        if self.input_norms is None or self.input_norms[layer][0] is None:
            return rows

        return fold_input(rows.T, self.input_norms[layer][0], None)[0].T.to(self.dtype)

    def hook_out(self, layer: int) -> str:
        return output_hook_name(layer, self.out_site)

    def output_site(self, out_layer: int) -> str:
        """``mlp_out`` or ``before_post_norm`` (see :func:`output_site`)."""
        return self.out_site

    # ----------------------------------------------------------------- reading the files
    def encoder(self, layer: int) -> torch.Tensor:
        """The encoder of ``layer`` ``(d_transcoder, d_model)`` (kept in memory only when not lazy)."""
        if layer in self._enc:
            return self._enc[layer]
        W = self._fold_rows(layer, self.enc_rows[layer].all())
        if not self.lazy:
            self._enc[layer] = W
        return W

    def encoder_rows(self, layer: int, idx: torch.Tensor) -> torch.Tensor:
        if layer in self._enc:
            return self._enc[layer][idx]
        return self._fold_rows(layer, self.enc_rows[layer].rows(idx))

    def decoder_rows(self, layer: int, idx: torch.Tensor) -> torch.Tensor:
        """Decoder rows of features ``idx`` of ``layer``: ``(n, n_layers - layer, d_model)``,
        entry ``[:, k - layer]`` writing into MLP output ``k`` (only these rows are read)."""
        return self.dec_rows[layer].rows(idx)

    def output_layers(self, layer: int) -> range:
        return range(layer, self.n_layers)

    def decoder_bias(self, out_layer: int) -> torch.Tensor:
        return self.b_dec_all[out_layer]

    def skip_weight(self, out_layer: int) -> torch.Tensor | None:
        """The skip path of ``out_layer`` as ``(d_out, d_in)`` (out = x @ W.T, sae-lens orientation)."""
        return None if self.W_skip is None else self.W_skip[out_layer].T

    # ----------------------------------------------------------------- maths
    def pre_activation(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``x @ W_enc_l^T + b_enc_l`` for ``x (..., d_model)``."""
        W = self.encoder(layer)
        return x.to(self.dtype) @ W.T + self.b_enc[layer]

    def activate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        if self.activation_function == "jump_relu":
            if self.threshold is None:
                raise LoadError(f"{self.path}: a jump_relu CLT needs its thresholds")
            return h * (h > self.threshold[layer])
        if self.activation_function == "topk":
            if self.topk is None:
                raise LoadError(f"{self.path}: a topk CLT needs topk")
            k = min(int(self.topk), h.shape[-1])
            top = h.topk(k, dim=-1).indices
            gate = torch.zeros_like(h).scatter_(-1, top, 1.0)
            return h * gate
        return torch.relu(h)

    def source_layers(self, out_layer: int) -> list[int]:
        """Encoder layers whose features write into MLP output ``out_layer``: ``0 .. out_layer``."""
        return list(range(out_layer + 1))

    def reconstruct_at(self, out_layer: int, acts: dict[int, torch.Tensor],
                       inputs: dict[int, torch.Tensor]) -> torch.Tensor:
        """The reconstruction of MLP output ``out_layer``: ``sum_{l <= k} a_l W_dec_l[:, k - l] + b_dec_k``
        (+ skip), reading only the active features' decoder rows."""
        k = out_layer
        ref = inputs[k]
        out = self.b_dec_all[k].to(ref.dtype).expand(*ref.shape[:-1], self.d_model).clone()
        for l in range(k + 1):
            a = acts[l]
            active = (a != 0).reshape(-1, a.shape[-1]).any(0).nonzero().flatten()
            if active.numel():
                dec = self.decoder_rows(l, active.cpu()).to(device=a.device, dtype=ref.dtype)
                out = out + a[..., active].to(ref.dtype) @ dec[:, k - l]
        if self.W_skip is not None:
            out = out + ref @ self.W_skip[k].to(ref.dtype)
        return out

    def reconstruct(self, acts: dict[int, torch.Tensor], inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """MLP-output reconstructions ``{k: (..., pos, d_model)}`` from activations ``{l: (..., pos, d_sae)}``
        and inputs ``{l: (..., pos, d_model)}``: every source layer ``l <= k`` contributes, plus
        ``b_dec_k`` and the skip path.  Only active features' decoder rows are read."""
        ref = next(iter(inputs.values()))
        out = {k: self.b_dec_all[k].to(ref.dtype).expand(*ref.shape[:-1], self.d_model).clone()
               for k in range(self.n_layers)}
        for l, a in acts.items():
            active = (a != 0).reshape(-1, a.shape[-1]).any(0).nonzero().flatten()
            if active.numel() == 0:
                continue
            dec = self.decoder_rows(l, active).to(device=a.device, dtype=ref.dtype)  # (n, n_out, d)
            sub = a[..., active].to(ref.dtype)
            for j, k in enumerate(self.output_layers(l)):
                out[k] = out[k] + sub @ dec[:, j]
        if self.W_skip is not None:
            for k in range(self.n_layers):
                out[k] = out[k] + inputs[k].to(ref.dtype) @ self.W_skip[k].to(ref.dtype)
        return out

    # ----------------------------------------------------------------- bookkeeping
    def with_source(self, source: dict[str, Any], *, config: dict[str, Any] | None = None) -> CrossLayerTranscoder:
        """The same dictionary (its tensors, stored rows and cached encoders shared) made with the
        source record ``source`` (and ``config``, default its own): a loader that knows more of
        where the files came from than the format's reader records it once, on a new object."""
        new = CrossLayerTranscoder(
            self.path, n_layers=self.n_layers, d_transcoder=self.d_transcoder, d_model=self.d_model,
            b_enc=self.b_enc, b_dec=self.b_dec_all, threshold=self.threshold, W_skip=self.W_skip,
            activation_function=self.activation_function, topk=self.topk,
            feature_input_hook=self.feature_input_hook, feature_output_hook=self.feature_output_hook,
            dtype=self.dtype, source=source, config=self.config if config is None else config, lazy=self.lazy,
            input_norms=self.input_norms, out_site=self.out_site, format=self.format,
            stores=(self.enc_rows, self.dec_rows),
        )
        new._enc = self._enc
        return new

    def to(self, dtype: torch.dtype) -> CrossLayerTranscoder:
        conv = lambda t: None if t is None else t.to(dtype)  # noqa: E731
        new = CrossLayerTranscoder(
            self.path, n_layers=self.n_layers, d_transcoder=self.d_transcoder, d_model=self.d_model,
            b_enc=self.b_enc.to(dtype), b_dec=self.b_dec_all.to(dtype), threshold=conv(self.threshold),
            W_skip=None if self.W_skip is None else [w.to(dtype) for w in self.W_skip],
            activation_function=self.activation_function, topk=self.topk,
            feature_input_hook=self.feature_input_hook, feature_output_hook=self.feature_output_hook,
            dtype=dtype, source=self.source, config=self.config, lazy=self.lazy, input_norms=self.input_norms,
            out_site=self.out_site, format=self.format,
            stores=([dataclasses.replace(m, dtype=dtype, bytes_read=0) for m in self.enc_rows],
                    [dataclasses.replace(m, dtype=dtype, bytes_read=0) for m in self.dec_rows]),
        )
        new._enc = {k: v.to(dtype) for k, v in self._enc.items()}
        return new

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": self.format,
            "kind": "cross_layer_transcoder",
            "activation_function": self.activation_function,
            "d_transcoder": self.d_transcoder,
            "n_layers": self.n_layers,
            "feature_input_hook": self.feature_input_hook,
            "feature_output_hook": self.feature_output_hook,
            "output_site": self.out_site,
            "skip": self.W_skip is not None,
            "scan": self.config.get("scan"),
            "layers": [{"layer": l, "architecture": self.layers[l].architecture, "d_sae": self.d_transcoder,
                        "hook_in": self.hook_in(l), "hook_out": self.hook_out(l),
                        "output_layers": [l, self.n_layers - 1]} for l in self.layers],
        }

    def resident_bytes(self) -> int:
        """Bytes held in memory now (biases, thresholds, skip, cached encoders)."""
        ts = [self.b_enc, self.b_dec_all, self.threshold, *(self.W_skip or []), *self._enc.values()]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def fold_layer_input(norms: list | None, layer: int, b_enc: torch.Tensor, b_dec: torch.Tensor,
                     W_skip: torch.Tensor | None, encoder: StoredRows) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """A CLT reading ``mlp.hook_in``: ln2's beta into ``b_enc`` (one read of the stored encoder,
    ``(features, d_model)``), gamma and beta into the skip path ``x @ W_skip`` (see
    :mod:`circuitgraph.dictionaries.mlp_input`; gamma reaches the encoder rows as they are read)."""
    if norms is None:
        return b_enc, b_dec, W_skip

    gamma, beta = norms[layer]
    if beta is not None:
        shift = fold_input(dataclasses.replace(encoder, dtype=torch.float64).all().T, None, beta)[1]
        b_enc = b_enc.double() + shift if shift is not None else b_enc
    if W_skip is not None:
        W_skip, shift = fold_input(W_skip, gamma, beta)
        b_dec = b_dec.double() + shift if shift is not None else b_dec
    return b_enc, b_dec, W_skip


def load_clt_dir(path: str | Path, adapter: ModelAdapter, *, dtype: torch.dtype = torch.float32,
                 config: dict[str, Any] | None = None, lazy: bool | None = None) -> CrossLayerTranscoder:
    """Load and check a circuit-tracer CLT directory against the model of ``adapter``.

    Shapes, hooks and biases are checked here; the (large) encoder and decoder matrices are
    checked for NaN/inf as they are read (a whole encoder layer, or the active decoder rows).
    ``lazy`` (default: when the encoders together exceed 1 GiB) re-reads each encoder layer from
    the memory-mapped file when it is needed instead of keeping it; decoders are always lazy."""
    path = Path(path)
    cfg_path = path / "config.yaml"
    if config is None:
        if not cfg_path.is_file():
            raise LoadError(f"{cfg_path} is missing; a circuit-tracer CLT directory needs config.yaml with "
                            "model_kind: cross_layer_transcoder, feature_input_hook and feature_output_hook")
        config = read_config_yaml(cfg_path)
    kind = config.get("model_kind")
    if kind != "cross_layer_transcoder":
        raise LoadError(f"{cfg_path}: model_kind is {kind!r}, expected cross_layer_transcoder")
    hook_in = str(config.get("feature_input_hook", "hook_resid_mid"))
    hook_out = str(config.get("feature_output_hook", "hook_mlp_out"))
    site = hook_site(hook_in, str(cfg_path))
    f = adapter.facts
    out_site = output_site(hook_out, str(cfg_path), post_norms=f.post_norms)
    L, D = f.n_layers, f.d_model
    read_hook = "ln2.hook_normalized" if site == "mlp_input" else hook_in  # mlp.hook_in is folded
    norms = None
    if site == "mlp_input":
        norms = [mlp_input_norm(adapter, layer) for layer in range(L)]
    for layer in range(L):
        for h in (adapter.block_hook(layer, read_hook),):
            if not adapter.has_hook(h):
                raise ShapeMismatchError(f"{cfg_path}: feature_input_hook {hook_in!r} gives {h}, which the "
                                         "model does not have; fix feature_input_hook")
    act = str(config.get("activation_function", "")) or None
    topk = config.get("topk")
    extra = sorted(int(p.stem.split("_")[-1]) for p in path.glob("W_enc_*.safetensors")
                   if p.stem.split("_")[-1].isdigit())
    if extra and extra[-1] >= L:
        raise ShapeMismatchError(f"{path / f'W_enc_{extra[-1]}.safetensors'}: the CLT has layer {extra[-1]}, "
                                 f"the model has {L} layers (0-{L - 1}); use the CLT trained for this model")
    b_enc, b_dec, thr, skips = [], [], [], []
    d_tc = None
    for layer in range(L):
        for kind_ in ("W_enc", "W_dec"):
            p = path / f"{kind_}_{layer}.safetensors"
            if not p.is_file():
                raise LoadError(f"{p} is missing: a CLT for this {L}-layer model needs W_enc_0..W_enc_{L - 1} and "
                                f"W_dec_0..W_dec_{L - 1}.safetensors; copy the missing file into {path}")
        p = path / f"W_enc_{layer}.safetensors"
        try:
            with safe_open(str(p), framework="pt") as fh:
                keys = set(fh.keys())
                need = {f"W_enc_{layer}", f"b_enc_{layer}", f"b_dec_{layer}"}
                if not need <= keys:
                    raise LoadError(f"{p}: tensors {sorted(need - keys)} are missing (it has {sorted(keys)}); "
                                    "re-export with CrossLayerTranscoder.to_safetensors")
                shape = tuple(fh.get_slice(f"W_enc_{layer}").get_shape())
                be, bd = fh.get_tensor(f"b_enc_{layer}"), fh.get_tensor(f"b_dec_{layer}")
                th = fh.get_tensor(f"threshold_{layer}") if f"threshold_{layer}" in keys else None
                sk = fh.get_tensor(f"W_skip_{layer}") if f"W_skip_{layer}" in keys else None
        except LoadError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise LoadError(f"{p}: not a readable safetensors file ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); re-export it") from None
        if len(shape) != 2 or shape[1] != D:
            raise ShapeMismatchError(f"{p}: W_enc_{layer} has shape {list(shape)}, expected "
                                     f"[d_transcoder, {D}] (the model's d_model is {D})")
        if d_tc is None:
            d_tc = shape[0]
        if shape[0] != d_tc:
            raise ShapeMismatchError(f"{p}: W_enc_{layer} has {shape[0]} features, layer 0 has {d_tc}; "
                                     "every layer of a CLT has the same width")
        if tuple(be.shape) != (d_tc,) or tuple(bd.shape) != (D,):
            raise ShapeMismatchError(f"{p}: b_enc_{layer} {list(be.shape)} / b_dec_{layer} {list(bd.shape)}, "
                                     f"expected [{d_tc}] / [{D}]")
        if th is not None and tuple(th.reshape(-1).shape) != (d_tc,):
            raise ShapeMismatchError(f"{p}: threshold_{layer} has shape {list(th.shape)}, expected [{d_tc}]")
        if sk is not None and tuple(sk.shape) != (D, D):
            raise ShapeMismatchError(f"{p}: W_skip_{layer} has shape {list(sk.shape)}, expected [{D}, {D}]")
        if layer > 0 and (th is None) != (len(thr) == 0):
            raise LoadError(f"{p}: threshold_{layer} is in some layers only; a JumpReLU CLT needs one in every "
                            "W_enc_<i>.safetensors")
        if layer > 0 and (sk is None) != (len(skips) == 0):
            raise LoadError(f"{p}: W_skip_{layer} is in some layers only; give it in every layer or none")
        dp = path / f"W_dec_{layer}.safetensors"
        try:
            with safe_open(str(dp), framework="pt") as fh:
                if f"W_dec_{layer}" not in fh.keys():
                    raise LoadError(f"{dp}: tensor W_dec_{layer} is missing (it has {sorted(fh.keys())})")
                dshape = tuple(fh.get_slice(f"W_dec_{layer}").get_shape())
        except LoadError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise LoadError(f"{dp}: not a readable safetensors file ({type(exc).__name__}); re-export it") from None
        if dshape != (d_tc, L - layer, D):
            raise ShapeMismatchError(f"{dp}: W_dec_{layer} has shape {list(dshape)}, expected "
                                     f"[{d_tc}, {L - layer}, {D}] (features, output layers {layer}..{L - 1}, d_model)")
        for name, t in ((f"b_enc_{layer}", be), (f"b_dec_{layer}", bd), (f"threshold_{layer}", th),
                        (f"W_skip_{layer}", sk)):
            if t is not None:
                check_finite(t, str(p), name)
        be, bd, sk = fold_layer_input(norms, layer, be, bd, sk, StoredRows(p, f"W_enc_{layer}"))
        b_enc.append(be.to(dtype))
        b_dec.append(bd.to(dtype))
        if th is not None:
            thr.append(th.reshape(-1).to(dtype))
        if sk is not None:
            skips.append(sk.to(dtype))
    if act is None:
        act = "jump_relu" if thr else "relu"
    if act not in ("relu", "jump_relu", "topk"):
        raise LoadError(f"{cfg_path}: activation_function {act!r} is not supported; use relu, jump_relu or topk")
    if act == "jump_relu" and not thr:
        raise LoadError(f"{cfg_path}: activation_function jump_relu needs threshold_<i> in every W_enc_<i>.safetensors")
    if act == "topk" and (not isinstance(topk, int) or topk <= 0):
        raise LoadError(f"{cfg_path}: activation_function topk needs topk: K (a positive integer), got {topk!r}")
    if d_tc is None:
        raise LoadError(f"{cfg_path}: a CLT for a model without layers; check the model")
    if lazy is None:
        lazy = L * int(d_tc) * D * torch.tensor([], dtype=dtype).element_size() > 2**30
    return CrossLayerTranscoder(
        path, n_layers=L, d_transcoder=int(d_tc), d_model=D, b_enc=torch.stack(b_enc), b_dec=torch.stack(b_dec),
        threshold=torch.stack(thr) if thr else None, W_skip=skips or None, activation_function=act,
        topk=int(topk) if act == "topk" and isinstance(topk, int) else None, feature_input_hook=hook_in, feature_output_hook=hook_out,
        dtype=dtype, source={"path": str(path)}, config=dict(config), lazy=lazy, input_norms=norms,
        out_site=out_site,
    )
