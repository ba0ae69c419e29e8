"""Transcoders loaded through sae-lens and checked against the model.

A transcoder of layer ``l`` reads the MLP input side of block ``l`` and writes its output:

* input hook ``blocks.l.ln2.hook_normalized`` (``input_site="normalized"``): TransformerLens's
  ``P(x)/sigma2`` at resid_mid, i.e. before ln2's gamma/beta (identical to the MLP input for
  folded models);
* input hook ``blocks.l.hook_resid_mid`` or ``blocks.l.hook_mlp_in`` (``input_site="raw"``):
  the raw residual stream at resid_mid;
* output hook ``blocks.l.hook_mlp_out``.

Supported: ReLU transcoders, JumpReLU transcoders, and skip transcoders (``W_skip``), as
written by sae-lens's ``save_model`` (``cfg.json`` + ``sae_weights.safetensors``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from circuitgraph.errors import LoadError, NumericalError, ShapeMismatchError

__all__ = ["TranscoderLayer", "TranscoderSet"]

_IN_HOOKS = {
    r"blocks\.(\d+)\.ln2\.hook_normalized": "normalized",
    r"blocks\.(\d+)\.hook_resid_mid": "raw",
    r"blocks\.(\d+)\.hook_mlp_in": "raw",
}
_OUT_HOOK = r"blocks\.(\d+)\.hook_mlp_out"


@dataclass
class TranscoderLayer:
    """One layer's transcoder as plain tensors plus the sae-lens object that produced them."""

    layer: int
    W_enc: torch.Tensor  # (d_in, d_sae)
    b_enc: torch.Tensor  # (d_sae,)
    W_dec: torch.Tensor  # (d_sae, d_out)
    b_dec: torch.Tensor  # (d_out,)
    W_skip: torch.Tensor | None  # (d_out, d_in)
    threshold: torch.Tensor | None  # (d_sae,) for JumpReLU
    input_site: Literal["normalized", "raw"]
    hook_in: str
    hook_out: str
    architecture: str
    source: str
    sae: Any = field(default=None, repr=False)
    #: without a sae-lens object: "relu" max(h, 0); "jump_relu" h * (h > threshold) (circuit-tracer,
    #: GemmaScope); "topk" the top-k of max(h, 0) per position (EleutherAI sparsify)
    activation_kind: str = "saelens"
    topk: int | None = None
    #: "mlp_out" (writes hook_mlp_out) or "before_post_norm" (writes the MLP output before a
    #: post-MLP norm, circuit-tracer's mlp.hook_out on Gemma-2-style models)
    output_site: str = "mlp_out"

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    def encoder_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Encoder directions ``(n, d_in)`` of features ``idx``."""
        return self.W_enc[:, idx].T

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W_enc + b_enc`` for inputs ``x (..., d_in)``."""
        return x.to(self.W_enc.dtype) @ self.W_enc + self.b_enc

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations: the sae-lens object's own ``encode`` (its exact nonlinearity), or
        the format's activation (``activation_kind``) for dictionaries read without sae-lens."""
        with torch.no_grad():
            if self.sae is not None:
                return self.sae.encode(x.to(self.W_enc.dtype))
            h = self.pre_activation(x)
            if self.activation_kind == "jump_relu":
                return h * (h > self.threshold)
            h = torch.relu(h)
            if self.activation_kind == "topk":
                top = h.topk(min(int(self.topk), h.shape[-1]), dim=-1).indices
                return h * torch.zeros_like(h).scatter_(-1, top, 1.0)
            return h

    def reconstruction(self, acts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = acts @ self.W_dec + self.b_dec
        if self.W_skip is not None:
            out = out + x.to(self.W_skip.dtype) @ self.W_skip.T
        return out

    def to(self, dtype: torch.dtype) -> "TranscoderLayer":
        conv = lambda t: None if t is None else t.to(dtype)  # noqa: E731
        sae = self.sae.to(dtype=dtype) if self.sae is not None else None
        return TranscoderLayer(
            self.layer, conv(self.W_enc), conv(self.b_enc), conv(self.W_dec), conv(self.b_dec),
            conv(self.W_skip), conv(self.threshold), self.input_site, self.hook_in, self.hook_out,
            self.architecture, self.source, sae, self.activation_kind, self.topk, self.output_site,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "architecture": self.architecture,
            "d_sae": self.d_sae,
            "hook_in": self.hook_in,
            "hook_out": self.hook_out,
            "output_site": self.output_site,
            "skip": self.W_skip is not None,
            "source": self.source,
        }


def _match_layer(pattern: str, hook: str) -> int | None:
    m = re.fullmatch(pattern, hook)
    return int(m.group(1)) if m else None


def _from_sae(sae: Any, *, where: str, expected_layer: int | None, adapter: Any) -> TranscoderLayer:
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
    site, layer = None, None
    for pattern, kind in _IN_HOOKS.items():
        lyr = _match_layer(pattern, hook_in)
        if lyr is not None:
            site, layer = kind, lyr
    if site is None:
        raise LoadError(
            f"{where}: input hook {hook_in!r} is not supported; expected blocks.<l>.ln2.hook_normalized, "
            "blocks.<l>.hook_resid_mid or blocks.<l>.hook_mlp_in"
        )
    out_layer = _match_layer(_OUT_HOOK, hook_out)
    if out_layer is None:
        raise LoadError(f"{where}: output hook {hook_out!r} is not supported; expected blocks.<l>.hook_mlp_out")
    if out_layer != layer:
        raise LoadError(f"{where}: reads layer {layer} ({hook_in}) but writes layer {out_layer} ({hook_out}); "
                        "cross-layer transcoders are not supported")
    if expected_layer is not None and expected_layer != layer:
        raise LoadError(f"{where}: directory says layer {expected_layer} but its hooks are for layer {layer}")
    facts = adapter.facts
    if not (0 <= layer < facts.n_layers):
        raise ShapeMismatchError(
            f"{where}: hooks {hook_in} / {hook_out} refer to layer {layer}, the model has "
            f"{facts.n_layers} layers (0-{facts.n_layers - 1})"
        )
    for hook in (hook_in, hook_out):
        if not adapter.has_hook(hook):
            raise ShapeMismatchError(f"{where}: hook {hook!r} does not exist in the model")
    if getattr(cfg, "normalize_activations", "none") not in ("none", None):
        raise LoadError(f"{where}: normalize_activations={cfg.normalize_activations!r} is not supported "
                        "(only 'none'); fold the normalisation into the weights first")
    W_enc, W_dec = sae.W_enc.detach(), sae.W_dec.detach()
    d_in, d_sae = W_enc.shape
    if W_dec.shape[0] != d_sae:
        raise ShapeMismatchError(f"{where}: W_dec has {W_dec.shape[0]} rows, W_enc has {d_sae} features")
    d_out = W_dec.shape[1]
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
        if not torch.isfinite(t).all():
            bad = (~torch.isfinite(t)).nonzero()[0].tolist()
            raise NumericalError(f"{where}: {name} holds NaN or inf (first at index {bad})")
    sae.eval()
    return TranscoderLayer(
        layer=layer,
        W_enc=W_enc,
        b_enc=sae.b_enc.detach(),
        W_dec=W_dec,
        b_dec=sae.b_dec.detach(),
        W_skip=None if W_skip is None else W_skip.detach(),
        threshold=None if threshold is None else threshold.detach(),
        input_site=site,
        hook_in=hook_in,
        hook_out=hook_out,
        architecture=arch,
        source=where,
        sae=sae,
    )


class TranscoderSet:
    """Per-layer transcoders, keyed by layer, behind the dictionary protocol shared with
    :class:`~circuitgraph.dictionaries.clt.CrossLayerTranscoder`: a feature of layer ``l``
    writes into the MLP output of layer ``l`` only."""

    kind = "per_layer"

    def __init__(self, layers: dict[int, TranscoderLayer], source: dict[str, Any], format: str = "saelens"):
        self.layers = dict(sorted(layers.items()))
        self.source = source
        self.format = format

    # ------------------------------------------------------------------ dictionary protocol
    def output_layers(self, layer: int) -> range:
        return range(layer, layer + 1)

    def decoder_rows(self, layer: int, idx: torch.Tensor) -> torch.Tensor:
        """``(n, 1, d_model)``: the decoder rows of features ``idx`` (one output layer)."""
        return self.layers[layer].W_dec[idx].unsqueeze(1)

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

    def __contains__(self, layer: int) -> bool:
        return layer in self.layers

    def __getitem__(self, layer: int) -> TranscoderLayer:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    def to(self, dtype: torch.dtype) -> "TranscoderSet":
        return TranscoderSet({k: v.to(dtype) for k, v in self.layers.items()}, self.source, self.format)

    def describe(self) -> dict[str, Any]:
        out = {"source": self.source, "format": self.format, "kind": "transcoder_set",
               "layers": [t.describe() for t in self.layers.values()]}
        if isinstance(self.source, dict) and self.source.get("scan"):
            out["scan"] = self.source["scan"]
        return out

    @classmethod
    def from_dir(cls, path: str | Path, adapter: Any, *, layers: list[int] | None = None,
                 dtype: torch.dtype | None = None) -> "TranscoderSet":
        """Load ``DIR/layer_<i>/`` folders (sae-lens ``save_model`` output)."""
        from sae_lens import SAE

        from circuitgraph.adapters.files import check_transcoder_dir

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
        for lyr, sub in sorted(found.items()):
            for fname in ("cfg.json", "sae_weights.safetensors"):
                if not (sub / fname).is_file():
                    raise LoadError(f"{sub} has no {fname} (expected sae-lens save_model output)")
            adapter.check_layer(lyr, what=f"transcoder folder {sub.name}: layer")
            try:
                sae = SAE.load_from_disk(str(sub), device=str(adapter.device))
            except Exception as exc:  # noqa: BLE001
                raise LoadError(f"{sub}: sae-lens could not load it ({type(exc).__name__}: {exc})") from None
            if dtype is not None:
                sae = sae.to(dtype=dtype)
            out[lyr] = _from_sae(sae, where=str(sub), expected_layer=lyr, adapter=adapter)
        return cls(out, {"path": str(path)})

    @classmethod
    def from_release(cls, release: str, ids: dict[int, str], adapter: Any,
                     dtype: torch.dtype | None = None) -> "TranscoderSet":
        """sae-lens pretrained transcoders (needs the Hugging Face hub)."""
        from sae_lens import SAE

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
        return cls(out, {"release": release, "ids": {str(k): v for k, v in ids.items()}})
