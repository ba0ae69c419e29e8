"""Transcoders in sae-lens's format (read from their files, or by sae-lens) checked against the model.

A transcoder of layer ``l`` reads the MLP input side of block ``l`` and writes its output:

* input hook ``blocks.l.ln2.hook_normalized`` (``input_site="normalized"``): TransformerLens's
  ``P(x)/sigma2`` at resid_mid, i.e. before ln2's gamma/beta (identical to the MLP input for
  folded models);
* input hook ``blocks.l.hook_resid_mid`` or ``blocks.l.hook_mlp_in`` (``input_site="raw"``):
  the raw residual stream at resid_mid;
* input hook ``blocks.l.mlp.hook_in`` (the MLP's input ``gamma2 * P(x)/sigma2 + beta2``, as
  circuit-tracer-style transcoders read it): folded exactly into ``W_enc``/``b_enc`` (and the
  skip path) by :func:`circuitgraph.dictionaries.mlp_input.fold_mlp_input`, so the layer reads
  ``ln2.hook_normalized``; sae-lens's own ``encode`` still sees the MLP input it was trained on;
* output hook ``blocks.l.hook_mlp_out``.

Supported: ReLU transcoders, JumpReLU transcoders, and skip transcoders (``W_skip``), as
written by sae-lens's ``save_model`` (``cfg.json`` + ``sae_weights.safetensors``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from circuitgraph._finite import first_nonfinite
from circuitgraph._hub import require_hub
from circuitgraph.adapters.files import check_transcoder_dir
from circuitgraph.dictionaries import saelens_native
from circuitgraph.dictionaries.clt import INPUT_HOOK_SITES, OUTPUT_HOOKS, ReadSite, output_hook_name, output_site
from circuitgraph.dictionaries.mlp_input import fold_input, fold_mlp_input, mlp_input_norm
from circuitgraph.dictionaries.stored import LAZY_ENCODER_BYTES, StoredRows
from circuitgraph.errors import LoadError, NumericalError, ShapeMismatchError

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter

__all__ = ["TranscoderLayer", "TranscoderSet"]


def _block_hook(hook: str, allowed: Iterable[str]) -> tuple[int, str] | None:
    """``(layer, block-relative hook)`` of a full hook name ``blocks.<l>.<hook>`` whose hook is one
    of ``allowed`` (:data:`~circuitgraph.dictionaries.clt.INPUT_HOOK_SITES`, ``OUTPUT_HOOKS``), else None."""
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook)
    return (int(m.group(1)), m.group(2)) if m and m.group(2) in allowed else None


class TranscoderLayer:
    """One layer's transcoder: plain tensors (sae-lens orientation), plus the sae-lens object
    that produced them when there is one (or, for a folder read without sae-lens, a
    :class:`~circuitgraph.dictionaries.saelens_native.NativeTranscoder` with the same ``encode``).

    ``W_enc`` ``(d_in, d_sae)`` and ``W_dec`` ``(d_sae, d_out)`` are either tensors or
    :class:`~circuitgraph.dictionaries.stored.StoredRows` left in their safetensors file
    (lazy: the engine reads the encoder when it computes activations -- kept after the first
    read unless ``lazy`` -- and only the decoder rows of active features); ``enc_scale``
    ``(d_in,)`` multiplies every encoder row as it is read (an MLP-input norm's gamma folded in).
    The ``W_enc`` / ``W_dec`` attributes always give the whole matrix as a tensor."""

    def __init__(self, layer: int, W_enc: Any, b_enc: torch.Tensor, W_dec: Any, b_dec: torch.Tensor,
                 W_skip: torch.Tensor | None, threshold: torch.Tensor | None,
                 input_site: ReadSite, hook_in: str, hook_out: str, architecture: str,
                 source: str, sae: Any = None, activation_kind: str = "saelens", topk: int | None = None,
                 sae_input: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
                 output_site: str = "mlp_out", *, enc_scale: torch.Tensor | None = None, lazy: bool = False):
        self.layer = layer
        self._enc = W_enc  # (d_in, d_sae) tensor, or StoredRows (d_sae, d_in) feature-major
        self.b_enc = b_enc  # (d_sae,)
        self._dec = W_dec  # (d_sae, d_out) tensor or StoredRows
        self.b_dec = b_dec  # (d_out,)
        self.W_skip = W_skip  # (d_out, d_in)
        self.threshold = threshold  # (d_sae,) for JumpReLU
        self.input_site: ReadSite = input_site
        self.hook_in = hook_in
        self.hook_out = hook_out
        self.architecture = architecture
        self.source = source
        self.sae = sae
        #: without a sae-lens object: "relu" max(h, 0); "jump_relu" h * (h > threshold) (circuit-tracer,
        #: GemmaScope); "topk" the top-k of max(h, 0) per position (EleutherAI sparsify)
        self.activation_kind = activation_kind
        self.topk = topk
        #: ``(gamma, beta)`` of ln2 when an ``mlp.hook_in`` dictionary was folded: the sae-lens object
        #: gets ``gamma * x + beta`` (the MLP input it reads) from ``x`` = ``ln2.hook_normalized``
        self.sae_input = sae_input
        #: "mlp_out" (writes hook_mlp_out) or "before_post_norm" (writes the MLP output before a
        #: post-MLP norm, circuit-tracer's mlp.hook_out on Gemma-2-style models)
        self.output_site = output_site
        self.enc_scale = enc_scale
        self.lazy = lazy
        self._enc_cache: torch.Tensor | None = None
        #: lazy stored encoder: ``(sorted feature ids, their encoder rows)`` of the features active in the
        #: last :meth:`activation` call that was not a subset of them (read from the one whole-encoder read
        #: that computed the activations, so the engine's per-feature reads cost no second file read)
        self._active_rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def __repr__(self) -> str:
        return (f"TranscoderLayer(layer={self.layer}, d_sae={self.d_sae}, architecture={self.architecture!r}, "
                f"hook_in={self.hook_in!r}, hook_out={self.hook_out!r}, stored={self.stored})")

    @property
    def stored(self) -> bool:
        """True when the matrices stay in their file (read by feature)."""
        return isinstance(self._dec, StoredRows)

    @property
    def d_sae(self) -> int:
        return int(self._enc.n_features if isinstance(self._enc, StoredRows) else self._enc.shape[1])

    @property
    def W_enc(self) -> torch.Tensor:
        """``(d_in, d_sae)``; for a stored encoder, the whole matrix read from the file."""
        if not isinstance(self._enc, StoredRows):
            return self._enc
        if self._enc_cache is not None:
            return self._enc_cache
        if self._enc.feature_dim == 1 and not self._enc.tail:  # stored (d_in, d_sae): read as it lies
            W = self._enc.stored_matrix()
            W = W * self.enc_scale[:, None] if self.enc_scale is not None else W
        else:
            W = self._enc.all()
            W = (W * self.enc_scale if self.enc_scale is not None else W).T
        if not self.lazy:
            self._enc_cache = W
        return W

    @property
    def W_dec(self) -> torch.Tensor:
        """``(d_sae, d_out)``; for a stored decoder, the whole matrix read from the file."""
        return self._dec.all() if isinstance(self._dec, StoredRows) else self._dec

    def encoder_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Encoder directions ``(n, d_in)`` of features ``idx``."""
        if not isinstance(self._enc, StoredRows) or self._enc_cache is not None:
            return self.W_enc[:, idx].T.contiguous()  # laid out as rows read from a file: the same sums
        if self._active_rows is not None:
            ids, kept = self._active_rows
            want = torch.as_tensor(idx, dtype=torch.long).reshape(-1).to(ids.device)
            at = torch.searchsorted(ids, want).clamp(max=max(len(ids) - 1, 0))
            if len(ids) and bool((ids[at] == want).all()):
                return kept[at]
        rows = self._enc.rows(idx)
        return rows * self.enc_scale if self.enc_scale is not None else rows

    def decoder_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Decoder rows ``(n, d_out)`` of features ``idx`` (only these are read from a stored decoder)."""
        if isinstance(self._dec, StoredRows):
            return self._dec.rows(idx)
        return self._dec[torch.as_tensor(idx, dtype=torch.long, device=self._dec.device)]

    def in_memory(self) -> TranscoderLayer:
        """The same layer with its matrices read into memory (the eager path)."""
        enc = self.W_enc.clone() if isinstance(self._enc, StoredRows) else self._enc
        return TranscoderLayer(
            self.layer, enc, self.b_enc, self.W_dec, self.b_dec, self.W_skip, self.threshold, self.input_site,
            self.hook_in, self.hook_out, self.architecture, self.source, self.sae, self.activation_kind, self.topk,
            self.sae_input, self.output_site,
        )

    def resident_bytes(self) -> int:
        """Bytes this layer holds in memory now (stored matrices count only if cached)."""
        ts = [self.b_enc, self.b_dec, self.W_skip, self.threshold, self.enc_scale, self._enc_cache,
              *(self._active_rows or ())]
        if not isinstance(self._enc, StoredRows):
            ts.append(self._enc)
        if not isinstance(self._dec, StoredRows):
            ts.append(self._dec)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W_enc + b_enc`` for inputs ``x (..., d_in)`` (a lazy stored encoder is read once per call)."""
        return self._pre_activation(x, self.W_enc)

    def _pre_activation(self, x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        return x.to(W.dtype) @ W + self.b_enc

    def _keep_active_rows(self, acts: torch.Tensor, W: torch.Tensor) -> None:
        """After a lazy read of the whole encoder ``W``: keep the rows of the features ``acts`` shows
        active (unless a previous call already kept all of them), and nothing else of ``W``."""
        ids = (acts != 0).reshape(-1, acts.shape[-1]).any(0).nonzero().flatten().cpu()
        if self._active_rows is not None and bool(torch.isin(ids, self._active_rows[0]).all()):
            return
        self._active_rows = (ids, W[:, ids.to(W.device)].T.contiguous())

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations: the sae-lens object's own ``encode`` (its exact nonlinearity), or
        the format's activation (``activation_kind``) for dictionaries read without sae-lens."""
        with torch.no_grad():
            if self.sae is not None:
                x = x.to(self.W_enc.dtype)
                if self.sae_input is not None:
                    gamma, beta = (None if t is None else t.to(device=x.device, dtype=x.dtype) for t in self.sae_input)
                    x = x * gamma if gamma is not None else x
                    x = x + beta if beta is not None else x
                return self.sae.encode(x)
            W = self.W_enc  # a lazy stored encoder: read whole once here, dropped on return
            acts = self._activate(self._pre_activation(x, W))
            if isinstance(self._enc, StoredRows) and self._enc_cache is None:
                self._keep_active_rows(acts, W)
            return acts

    def _activate(self, h: torch.Tensor) -> torch.Tensor:
        if self.activation_kind == "jump_relu":
            if self.threshold is None:
                raise LoadError(f"{self.source}: a jump_relu transcoder needs its threshold")
            return h * (h > self.threshold)
        if self.activation_kind == "saelens":  # a sae-lens folder read lazily: its encode, without the object
            acts = torch.relu(h)
            return acts * (h > self.threshold).to(acts.dtype) if self.threshold is not None else acts
        h = torch.relu(h)
        if self.activation_kind == "topk":
            if self.topk is None:
                raise LoadError(f"{self.source}: a topk transcoder needs topk")
            top = h.topk(min(int(self.topk), h.shape[-1]), dim=-1).indices
            return h * torch.zeros_like(h).scatter_(-1, top, 1.0)
        return h

    def reconstruction(self, acts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``acts @ W_dec + b_dec`` (+ skip), reading only the decoder rows of active features."""
        if isinstance(self._dec, StoredRows):
            active = (acts != 0).reshape(-1, acts.shape[-1]).any(0).nonzero().flatten()
            dec = self.decoder_rows(active.cpu()).to(device=acts.device, dtype=acts.dtype)
            out = acts[..., active] @ dec + self.b_dec.to(acts.dtype)
        else:
            out = acts @ self._dec + self.b_dec
        if self.W_skip is not None:
            out = out + x.to(self.W_skip.dtype) @ self.W_skip.T
        return out

    def to(self, dtype: torch.dtype) -> TranscoderLayer:
        conv = lambda t: None if t is None else t.to(dtype)  # noqa: E731
        keep = lambda m: dataclasses.replace(m, dtype=dtype, bytes_read=0) if isinstance(m, StoredRows) \
            else m.to(dtype)  # noqa: E731
        sae = self.sae.to(dtype=dtype) if self.sae is not None else None
        return TranscoderLayer(
            self.layer, keep(self._enc), self.b_enc.to(dtype), keep(self._dec), self.b_dec.to(dtype),
            conv(self.W_skip), conv(self.threshold), self.input_site, self.hook_in, self.hook_out,
            self.architecture, self.source, sae, self.activation_kind, self.topk, self.sae_input, self.output_site,
            enc_scale=conv(self.enc_scale), lazy=self.lazy,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "architecture": self.architecture,
            "d_sae": self.d_sae,
            "hook_in": self.hook_in,
            "hook_out": self.hook_out,
            "output_site": self.output_site,
            "stored": self.stored,
            "skip": self.W_skip is not None,
            "source": self.source,
        }


def load_sae_folder(path: str | Path, device: str = "cpu", *, stored: bool = False) -> Any:
    """The transcoder in a sae-lens ``save_model`` folder, as ``SAE.load_from_disk(path, device=device)``
    gives it: read natively (no sae-lens import) when :func:`~circuitgraph.dictionaries.saelens_native.read_folder`
    recognises the folder exactly, else by sae-lens itself (which raises what it always raised).
    ``stored``: the native reader leaves ``W_enc`` / ``W_dec`` in the file (read by feature)."""
    native = saelens_native.read_folder(path, device=device, stored=stored)
    if native is not None:
        return native
    from sae_lens import SAE

    return SAE.load_from_disk(str(path), device=device)


def _matrix_shape(m: Any, encoder: bool) -> tuple[int, ...]:
    """A matrix's shape in sae-lens's orientation (a stored one is feature-major)."""
    if isinstance(m, StoredRows):
        n, rest = m.shape()[0], m.shape()[1:]
        return (*rest, n) if encoder else (n, *rest)
    return tuple(m.shape)


def _from_sae(sae: Any, *, where: str, expected_layer: int | None, adapter: ModelAdapter,
              lazy: bool = False) -> TranscoderLayer:
    """One layer from a sae-lens transcoder object; ``W_enc`` / ``W_dec`` may be
    :class:`StoredRows` (a folder read with ``stored``): the layer then reads its encoder when it
    computes activations (kept unless ``lazy``) and only the decoder rows of active features, and
    applies sae-lens's ``encode`` itself."""
    cfg = sae.cfg
    arch = cfg.architecture() if callable(getattr(cfg, "architecture", None)) else str(getattr(cfg, "architecture", ""))
    if not hasattr(sae, "W_enc") or not hasattr(sae, "W_dec") or "transcoder" not in arch:
        raise LoadError(f"{where}: architecture {arch!r} is not a transcoder (expected transcoder, "
                        "skip_transcoder, jumprelu_transcoder or jumprelu_skip_transcoder)")
    meta = cfg.metadata
    hook_in = getattr(meta, "hook_name", None)
    hook_out = getattr(meta, "hook_name_out", None)
    if not hook_in or not hook_out:
        raise LoadError(f"{where}: cfg metadata must give hook_name and hook_name_out")
    read = _block_hook(hook_in, INPUT_HOOK_SITES)
    if read is None:
        raise LoadError(
            f"{where}: input hook {hook_in!r} is not supported; expected blocks.<l>.ln2.hook_normalized, "
            "blocks.<l>.hook_resid_mid, blocks.<l>.hook_mlp_in or blocks.<l>.mlp.hook_in"
        )
    layer, site = read[0], INPUT_HOOK_SITES[read[1]]
    written = _block_hook(hook_out, OUTPUT_HOOKS)
    if written is None:
        raise LoadError(f"{where}: output hook {hook_out!r} is not supported; expected blocks.<l>.hook_mlp_out or "
                        "blocks.<l>.mlp.hook_out")
    if written[0] != layer:
        raise LoadError(f"{where}: reads layer {layer} ({hook_in}) but writes layer {written[0]} ({hook_out}); "
                        "cross-layer transcoders are not supported")
    if expected_layer is not None and expected_layer != layer:
        raise LoadError(f"{where}: directory says layer {expected_layer} but its hooks are for layer {layer}")
    facts = adapter.facts

    # where it writes, as the per-layer formats and CLTs decide it: mlp.hook_out on a post-norm model
    # (Gemma-2's ln2_post) is the MLP's output before that norm, the same hook as hook_mlp_out otherwise
    out_site = output_site(written[1], where, post_norms=facts.post_norms)
    hook_out = output_hook_name(layer, out_site)
    if not (0 <= layer < facts.n_layers):
        raise ShapeMismatchError(
            f"{where}: hooks {hook_in} / {hook_out} refer to layer {layer}, the model has "
            f"{facts.n_layers} layers (0-{facts.n_layers - 1})"
        )
    for hook in (hook_in, hook_out) if site != "mlp_input" else (hook_out,):
        if not adapter.has_hook(hook):
            raise ShapeMismatchError(f"{where}: hook {hook!r} does not exist in the model")
    if getattr(cfg, "normalize_activations", "none") not in ("none", None):
        raise LoadError(f"{where}: normalize_activations={cfg.normalize_activations!r} is not supported "
                        "(only 'none'); fold the normalisation into the weights first")
    stored = isinstance(sae.W_enc, StoredRows)
    W_enc, W_dec = (m if isinstance(m, StoredRows) else m.detach() for m in (sae.W_enc, sae.W_dec))
    d_in, d_sae = _matrix_shape(W_enc, True)
    if _matrix_shape(W_dec, False)[0] != d_sae:
        raise ShapeMismatchError(f"{where}: W_dec has {_matrix_shape(W_dec, False)[0]} rows, W_enc has {d_sae} features")
    d_out = _matrix_shape(W_dec, False)[1]
    if d_in != facts.d_model or d_out != facts.d_model:
        raise ShapeMismatchError(
            f"{where}: layer {layer} transcoder has d_in={d_in}, d_out={d_out}; "
            f"the model's d_model is {facts.d_model} (expected d_in = d_out = {facts.d_model})"
        )
    W_skip = getattr(sae, "W_skip", None)
    threshold = getattr(sae, "threshold", None)
    tensors = {"W_enc": W_enc, "b_enc": sae.b_enc, "W_dec": W_dec, "b_dec": sae.b_dec}
    if W_skip is not None:
        tensors["W_skip"] = W_skip
    if threshold is not None:
        tensors["threshold"] = threshold
    for name, t in tensors.items():
        if isinstance(t, StoredRows):
            continue  # large (lazy): checked as it is read
        bad = first_nonfinite(t)
        if bad is not None:
            raise NumericalError(f"{where}: {name} holds NaN or inf (first at index {bad})")
    sae.eval()
    b_enc, b_dec = sae.b_enc.detach(), sae.b_dec.detach()
    W_skip = None if W_skip is None else W_skip.detach()
    sae_input = None
    enc_scale = None
    if site == "mlp_input":  # the features read ln2.hook_normalized: ln2's gamma and beta folded in
        if isinstance(W_enc, StoredRows):  # gamma scales every encoder row as it is read; beta: one read now
            dt = b_enc.dtype
            gamma, beta = mlp_input_norm(adapter, layer)
            enc_scale = None if gamma is None else gamma.to(dt)
            if beta is not None:
                b_enc = (b_enc.double() + fold_input(W_enc.stored_matrix(), None, beta)[1]).to(dt)
                W_enc.bytes_read = 0
        else:  # fold gamma/beta into the encoder (sae-lens's encode sees the folded input: sae_input)
            dt = W_enc.dtype
            folded, shift = fold_mlp_input(adapter, layer, W_enc)
            W_enc, b_enc = folded.to(dt), (b_enc if shift is None else (b_enc.double() + shift).to(dt))
            sae_input = mlp_input_norm(adapter, layer)
        if W_skip is not None:  # sae-lens skip: x @ W_skip.T
            folded, shift = fold_mlp_input(adapter, layer, W_skip.T)
            W_skip, b_dec = folded.T.to(dt).contiguous(), (b_dec if shift is None else (b_dec.double() + shift).to(dt))
        site, hook_in = "normalized", adapter.hook_norm_normalized("ln2", layer)
    return TranscoderLayer(
        layer=layer,
        W_enc=W_enc,
        b_enc=b_enc,
        W_dec=W_dec,
        b_dec=b_dec,
        W_skip=W_skip,
        threshold=None if threshold is None else threshold.detach(),
        input_site=site,
        hook_in=hook_in,
        hook_out=hook_out,
        architecture=arch,
        source=where,
        sae=None if stored else sae,  # stored: the layer applies sae-lens's encode (activation_kind "saelens")
        sae_input=sae_input,
        output_site=out_site,
        enc_scale=enc_scale,
        lazy=lazy,
    )


class TranscoderSet:
    """Per-layer transcoders, keyed by layer, behind the dictionary protocol shared with
    :class:`~circuitgraph.dictionaries.clt.CrossLayerTranscoder`: a feature of layer ``l``
    writes into the MLP output of layer ``l`` only."""

    kind: Literal["per_layer"] = "per_layer"

    def __init__(self, layers: dict[int, TranscoderLayer], source: dict[str, Any], format: str = "saelens"):
        self.layers = dict(sorted(layers.items()))
        self.source = source
        self.format = format

    # ------------------------------------------------------------------ dictionary protocol
    def output_layers(self, layer: int) -> range:
        return range(layer, layer + 1)

    def decoder_rows(self, layer: int, idx: torch.Tensor) -> torch.Tensor:
        """``(n, 1, d_model)``: the decoder rows of features ``idx`` (one output layer)."""
        return self.layers[layer].decoder_rows(idx).unsqueeze(1)

    def decoder_bias(self, out_layer: int) -> torch.Tensor:
        return self.layers[out_layer].b_dec

    def skip_weight(self, out_layer: int) -> torch.Tensor | None:
        return self.layers[out_layer].W_skip

    def output_site(self, out_layer: int) -> str:
        """``mlp_out`` or ``before_post_norm`` (see :func:`~circuitgraph.dictionaries.clt.output_site`)."""
        return self.layers[out_layer].output_site

    def source_layers(self, out_layer: int) -> list[int]:
        """Encoder layers whose features write into MLP output ``out_layer``."""
        return [out_layer] if out_layer in self.layers else []

    def reconstruct_at(self, out_layer: int, acts: dict[int, torch.Tensor],
                       inputs: dict[int, torch.Tensor]) -> torch.Tensor:
        """The reconstruction of MLP output ``out_layer`` (decoder, ``b_dec`` and skip)."""
        return self.layers[out_layer].reconstruction(acts[out_layer], inputs[out_layer])

    def reconstruct(self, acts: dict[int, torch.Tensor], inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """``{l: reconstruction (..., pos, d_model)}`` from ``{l: acts}`` and ``{l: inputs}``."""
        return {l: self.layers[l].reconstruction(a, inputs[l]) for l, a in acts.items()}

    def __contains__(self, layer: object) -> bool:
        return layer in self.layers

    def __getitem__(self, layer: int) -> TranscoderLayer:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    def in_memory(self) -> TranscoderSet:
        """The same transcoders with every matrix read into memory (the eager path)."""
        return TranscoderSet({k: v.in_memory() for k, v in self.layers.items()}, self.source, self.format)

    def resident_bytes(self) -> int:
        """Bytes held in memory now (matrices left in their files are not counted)."""
        return sum(v.resident_bytes() for v in self.layers.values())

    def to(self, dtype: torch.dtype) -> TranscoderSet:
        return TranscoderSet({k: v.to(dtype) for k, v in self.layers.items()}, self.source, self.format)

    def with_source(self, source: dict[str, Any]) -> TranscoderSet:
        """The same transcoders (their layers shared) made with the source record ``source``: a
        loader that knows more of where the files came from than the format's reader records it
        once, on a new object."""
        return TranscoderSet(self.layers, source, self.format)

    def describe(self) -> dict[str, Any]:
        out = {"source": self.source, "format": self.format, "kind": "transcoder_set",
               "layers": [t.describe() for t in self.layers.values()]}
        if isinstance(self.source, dict) and self.source.get("scan"):
            out["scan"] = self.source["scan"]
        return out

    @classmethod
    def from_dir(cls, path: str | Path, adapter: ModelAdapter, *, layers: list[int] | None = None,
                 dtype: torch.dtype | None = None, lazy: bool | None = None) -> TranscoderSet:
        """Load ``DIR/layer_<i>/`` folders (sae-lens ``save_model`` output): read directly from
        their files (:mod:`~circuitgraph.dictionaries.saelens_native`), with sae-lens only for a
        folder that reader does not recognise.

        ``lazy`` (default: when the encoders together exceed 1 GiB, as for cross-layer
        transcoders; CPU, natively read folders): the encoders and decoders stay in their
        memory-mapped files (:class:`StoredRows`); each layer's encoder is read whole when its
        activations are computed and dropped after (only the rows of the active features are
        kept), and decoder rows are read for active features only."""
        path = Path(path)
        if not path.is_dir():
            raise LoadError(f"transcoder directory {path} does not exist")
        # every layer_<i> entry must load: skipping a broken one would silently give that layer neurons
        found = check_transcoder_dir(path)
        if not found:
            raise LoadError(f"transcoder directory {path} has no layer_<i>/ folders")
        if layers is not None:
            missing = [lyr for lyr in layers if lyr not in found]
            if missing:
                raise LoadError(f"transcoders for layers {missing} requested, {path} has layers {sorted(found)}")
            found = {lyr: found[lyr] for lyr in layers}
        out = {}
        for _lyr, sub in sorted(found.items()):
            for fname in ("cfg.json", "sae_weights.safetensors"):
                if not (sub / fname).is_file():
                    raise LoadError(f"{sub} has no {fname} (expected sae-lens save_model output)")
        if lazy is None:
            sizes = [saelens_native.encoder_bytes(sub) for sub in found.values()]
            lazy = sum(s or 0 for s in sizes) > LAZY_ENCODER_BYTES
        for lyr, sub in sorted(found.items()):
            adapter.check_layer(lyr, what=f"transcoder folder {sub.name}: layer")
            try:
                sae = load_sae_folder(sub, device=str(adapter.device), stored=lazy)
            except Exception as exc:  # noqa: BLE001
                raise LoadError(f"{sub}: sae-lens could not load it ({type(exc).__name__}: {exc})") from None
            if dtype is not None:
                sae = sae.to(dtype=dtype)
            out[lyr] = _from_sae(sae, where=str(sub), expected_layer=lyr, adapter=adapter, lazy=lazy)
        return cls(out, {"path": str(path)})

    @classmethod
    def from_release(cls, release: str, ids: dict[int, str], adapter: ModelAdapter,
                     dtype: torch.dtype | None = None, source: dict[str, Any] | None = None) -> TranscoderSet:
        """sae-lens pretrained transcoders (needs the Hugging Face hub); ``source``: its source
        record (default ``{"release": release, "ids": ...}``)."""
        from sae_lens import SAE

        require_hub(f"transcoders: {{release: {release}}}")  # one line at once, not a minute of retries

        out = {}
        for lyr, sae_id in sorted(ids.items()):
            adapter.check_layer(int(lyr), what="transcoder ids: layer")
            try:
                sae = SAE.from_pretrained(release, sae_id, device=str(adapter.device))
            except Exception as exc:  # noqa: BLE001
                msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise LoadError(
                    f"could not load sae-lens release {release!r} id {sae_id!r} ({type(exc).__name__}: {msg}); "
                    "this needs the Hugging Face hub, or save the transcoders locally and use transcoders: {path: DIR}"
                ) from None
            if isinstance(sae, tuple):
                sae = sae[0]
            if dtype is not None:
                sae = sae.to(dtype=dtype)
            out[int(lyr)] = _from_sae(sae, where=f"{release}/{sae_id}", expected_layer=int(lyr), adapter=adapter)
        return cls(out, source if source is not None else {"release": release, "ids": {str(k): v for k, v in ids.items()}})
