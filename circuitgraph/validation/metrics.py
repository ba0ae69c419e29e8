"""What an intervention is measured by: the graph's targets read off the real model.

A :class:`Metric` is a weighted sum of :class:`Readout` values, each read from one forward
pass (logits, or a hook value captured after every edit):

* ``logit``: ``logits[pos, v]`` (minus the mean logit when ``relative_to_mean``);
* ``logit_diff``: ``logits[pos, a] - logits[pos, b]``;
* ``feature``: a transcoder feature's *pre-activation* ``x . W_enc[:, j] + b_enc[j]``
  (the graph attributes pre-activations);
* ``neuron``: ``hook_pre`` for GELU/ReLU MLPs, ``hook_post`` for gated MLPs (the value
  the graph's neuron reader carries);
* ``direction``: ``vector . x`` at a residual site.

These are exactly the values the graph's target nodes hold, so a metric built with
:meth:`Metric.from_graph` measures in the real model what the graph explains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from circuitgraph.errors import ValidationRunError
from circuitgraph.spec.kinds import ACTIVATION_KINDS

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.adapters.tokenizer import Tokenizer
    from circuitgraph.dictionaries.protocol import Dictionary
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["Readout", "Metric", "next_token_loss"]

ReadoutKind = Literal["logit", "logit_diff", "feature", "neuron", "direction"]


@dataclass(frozen=True)
class Readout:
    """One scalar read from a forward pass (see the module docstring).

    ``position`` may be negative (counted from the end).  ``weight`` is the readout's weight
    in the metric (the graph's target weight).
    """

    kind: ReadoutKind
    position: int = -1
    tokens: tuple[int, ...] = ()
    relative_to_mean: bool = False
    layer: int | None = None
    index: int | None = None
    site: str | None = None
    vector: tuple[float, ...] | None = None
    weight: float = 1.0
    name: str = ""

    @property
    def unit_layer(self) -> int:
        """The layer of a feature, neuron or direction readout (a :class:`ValidationRunError` when
        the readout has none)."""
        if self.layer is None:
            raise ValidationRunError(f"a {self.kind} readout needs a layer")
        return self.layer

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "position": self.position, "weight": self.weight}
        if self.tokens:
            out["tokens"] = list(self.tokens)
        if self.relative_to_mean:
            out["relative_to_mean"] = True
        for key in ("layer", "index", "site"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.name:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Metric:
    """A weighted sum of readouts: ``metric = sum_i weight_i * readout_i``."""

    readouts: tuple[Readout, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.readouts:
            raise ValidationRunError("a metric needs at least one readout (a logit, logit_diff, feature, ...)")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def logit(cls, token: int, position: int = -1, *, relative_to_mean: bool = False, name: str = "") -> Metric:
        return cls((Readout("logit", position, (int(token),), relative_to_mean, name=name),), name=name)

    @classmethod
    def logit_diff(cls, a: int, b: int, position: int = -1, *, name: str = "") -> Metric:
        """``logit(a) - logit(b)``, the paired logit-difference metric of patching."""
        return cls((Readout("logit_diff", position, (int(a), int(b)), name=name),), name=name)

    @classmethod
    def from_targets(cls, targets: Sequence[Any]) -> Metric:
        """From :class:`~circuitgraph.attribution.ResolvedTarget` values (their weights kept)."""
        readouts = []
        for t in targets:
            vec = None
            if t.vector is not None:
                vec = tuple(float(v) for v in torch.as_tensor(t.vector).flatten().tolist())
            readouts.append(Readout(t.kind, t.position, tuple(int(v) for v in t.tokens), bool(t.relative_to_mean),
                                    t.layer, t.index, t.site, vec, float(t.weight), t.name))
        return cls(tuple(readouts), name="graph targets")

    @classmethod
    def from_graph(cls, graph: AttributionGraph) -> Metric:
        """The graph's targets, weighted as in the graph (needs the graph's live context)."""
        ctx = getattr(graph, "context", None)
        if ctx is None or not getattr(ctx, "targets", None):
            raise ValidationRunError(
                "the graph has no live targets to measure; pass metric=Metric.logit_diff(a, b) "
                "or rebuild the graph with circuitgraph.attribution.attribute"
            )
        return cls.from_targets(ctx.targets)

    # ------------------------------------------------------------------ evaluation
    def describe(self, tokenizer: Tokenizer | None = None) -> str:
        tok = (lambda i: repr(tokenizer.token_str(i))) if tokenizer is not None else (lambda i: f"<{i}>")
        parts = []
        for r in self.readouts:
            if r.kind == "logit":
                s = f"logit {tok(r.tokens[0])}" + (" (rel. mean)" if r.relative_to_mean else "")
            elif r.kind == "logit_diff":
                s = f"logit {tok(r.tokens[0])} - logit {tok(r.tokens[1])}"
            elif r.kind in ACTIVATION_KINDS:
                s = f"{r.kind} L{r.layer} #{r.index}"
            else:
                s = r.name or f"direction at {r.site} L{r.layer}"
            s += f" @{r.position}"
            parts.append(s if r.weight == 1.0 else f"{r.weight:.3g} x {s}")
        return " + ".join(parts)

    def hook_names(self, adapter: ModelAdapter, transcoders: Dictionary | None = None) -> set[str]:
        """Hooks whose (edited) values the readouts need."""
        names: set[str] = set()
        for r in self.readouts:
            if r.kind == "feature":
                names.add(_transcoder(transcoders, r.unit_layer).hook_in)
            elif r.kind == "neuron":
                names.add(_neuron_hook(adapter, r.unit_layer))
            elif r.kind == "direction":
                names.add(_resid_hook(adapter, r.site, r.unit_layer))
        return names

    def values(self, logits: torch.Tensor, captured: dict[str, torch.Tensor], adapter: ModelAdapter,
               transcoders: Dictionary | None = None) -> torch.Tensor:
        """Per-readout values ``(batch, n_readouts)`` in float64 from ``logits (batch, pos, d_vocab)``."""
        T = logits.shape[1]
        cols = []
        for r in self.readouts:
            p = r.position + T if r.position < 0 else r.position
            if not 0 <= p < T:
                raise ValidationRunError(f"metric readout at position {r.position} is outside a {T}-token prompt")
            if r.kind == "logit":
                row = logits[:, p].double()
                v = row[:, r.tokens[0]]
                if r.relative_to_mean:
                    v = v - row.mean(-1)
            elif r.kind == "logit_diff":
                row = logits[:, p].double()
                v = row[:, r.tokens[0]] - row[:, r.tokens[1]]
            elif r.kind == "feature":
                tc = _transcoder(transcoders, r.unit_layer)
                x = captured[tc.hook_in][:, p]
                v = (x.to(tc.W_enc.dtype) @ tc.W_enc[:, r.index] + tc.b_enc[r.index]).double()
            elif r.kind == "neuron":
                v = captured[_neuron_hook(adapter, r.unit_layer)][:, p, r.index].double()
            else:
                x = captured[_resid_hook(adapter, r.site, r.unit_layer)][:, p].double()
                v = x @ torch.tensor(r.vector, dtype=torch.float64, device=x.device)
            cols.append(v)
        return torch.stack(cols, dim=-1)

    def combine(self, values: torch.Tensor) -> torch.Tensor:
        """``(batch, n_readouts) -> (batch,)``: the weighted sum."""
        w = torch.tensor([r.weight for r in self.readouts], dtype=values.dtype, device=values.device)
        return values @ w

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "readouts": [r.to_dict() for r in self.readouts]}


def _transcoder(transcoders: Dictionary | None, layer: int) -> Any:
    if transcoders is None or layer not in transcoders:
        raise ValidationRunError(f"a feature readout at layer {layer} needs that layer's transcoder; none is loaded")
    return transcoders[layer]


def _neuron_hook(adapter: ModelAdapter, layer: int) -> str:
    """A neuron readout's hook: the MLP's activation of a gated MLP, else its pre-activation."""
    return adapter.hook_mlp_post(layer) if adapter.facts.gated_mlp else adapter.hook_mlp_pre(layer)


def _resid_hook(adapter: ModelAdapter, site: str | None, layer: int) -> str:
    if site == "resid_pre":
        return adapter.hook_resid_pre(layer)
    if site == "resid_mid":
        return adapter.hook_resid_mid(layer)
    if site == "resid_post":
        return adapter.hook_resid_post(layer)
    raise ValidationRunError(f"direction readout: unknown residual site {site!r} (resid_pre, resid_mid, resid_post)")


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy per batch row: ``logits (batch, pos, d_vocab)``, ``tokens (pos,)``
    or ``(batch, pos)``; position ``t`` predicts token ``t + 1``."""
    if tokens.ndim == 1:
        tokens = tokens.unsqueeze(0).expand(logits.shape[0], -1)
    lp = F.log_softmax(logits[:, :-1].double(), dim=-1)
    nll = -lp.gather(-1, tokens[:, 1:].to(lp.device).unsqueeze(-1)).squeeze(-1)
    return nll.mean(-1)
