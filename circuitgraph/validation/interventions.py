"""Interventions on the real model: visible objects, applied by a scoped context manager.

A :class:`Unit` is one thing that can be edited in the real TransformerLens model, at one
position (or every position) and one index (or every index):

==============  ==========================================  ==============================
site            where (adapter hook)                        value edited
==============  ==========================================  ==============================
``embed``       ``hook_embed``                              token embedding vector
``pos_embed``   ``hook_pos_embed``                          learned positional vector
``resid_pre``   ``hook_resid_pre(l)`` (``l = n_layers``:    the residual stream
                ``hook_resid_post(n_layers - 1)``)
``attn``        ``hook_attn_out(l)``                        a whole attention layer's output
``head``        ``hook_z(l)``, head ``index``               one head's ``z`` vector
``mlp``         ``hook_mlp_out(l)``                         a whole MLP's output
``neuron``      ``hook_mlp_post(l)``                        neuron activation
``pre``         ``hook_mlp_pre(l)``                         GELU/ReLU pre-activation
``gate``        ``hook_mlp_pre(l)`` (gated MLPs)            gate pre-activation
``value``       ``hook_mlp_pre_linear(l)`` (gated MLPs)     value (linear branch)
``feature``     spliced into ``hook_mlp_out(l)`` (*)        transcoder feature activation
``error``       spliced into ``hook_mlp_out(l)`` (*)        transcoder error vector
==============  ==========================================  ==============================

(*) or into the MLP output before the post-MLP norm (the virtual ``mlp.hook_out``, see
:meth:`~circuitgraph.adapters.ModelAdapter.hook_mlp_out_before_post_norm`) for dictionaries
that write there (circuit-tracer's ``feature_output_hook: mlp.hook_out`` on Gemma-2-style models).

Features are *spliced*: the real MLP output is kept and only the feature's contribution
changes, ``mlp_out' = mlp_out + (a_j' - a_j) W_dec[j]``, in every MLP output the feature
writes (a cross-layer transcoder feature of layer ``l``: every layer ``k >= l``, with its
decoder row for ``k``), with ``a_j`` the transcoder's
activation on the live input of that forward pass (the same as the transcoder
reconstruction plus the error, with the feature changed).  The error is
``e = mlp_out - reconstruction`` and is spliced the same way.

An :class:`Intervention` applies one mode to a set of units (minus ``exclude``):

* ``zero``: the value becomes 0;
* ``scale``: multiplied by ``scale``;
* ``set``: set to ``value`` (for vector units, which have activation 1 in the graph, the
  vector is scaled by ``value``);
* ``add``: ``value`` added (for vector units, activation 1 becomes ``1 + value``: the vector is
  scaled by ``1 + value``);
* ``mean``: its mean over ``reference`` prompts (per position when every reference prompt
  has the run's length, else over every position but the first; see ``pooling``);
* ``patch``: its value on ``patch`` (a prompt of the same length).

:func:`intervene` installs the edits as TransformerLens hooks for the duration of a ``with``
block, and always removes them::

    iv = Intervention.zero([Unit("neuron", 0, 3, 5)])
    with intervene(adapter, iv, n_pos=len(tokens)) as model:
        logits = model(torch.tensor([tokens]))

Masks are boolean and edits are ``torch.where(mask, new, old)``: no arithmetic with
infinities anywhere (``0 * inf`` is NaN).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from circuitgraph._results import Tabular
from circuitgraph.adapters.sites import POSITION_SITES, SITES, VECTOR_SITES, Site
from circuitgraph.dictionaries.clt import output_hook_name
from circuitgraph.dictionaries.protocol import require_dictionary
from circuitgraph.errors import ValidationRunError
from circuitgraph.graph.nodes import NodeId
from circuitgraph.validation._common import markdown_table
from circuitgraph.validation.metrics import Metric, next_token_loss

if TYPE_CHECKING:
    from circuitgraph.adapters.architecture import ModelAdapter
    from circuitgraph.dictionaries.protocol import Dictionary

__all__ = [
    "Site",
    "SITES",
    "Mode",
    "Unit",
    "Intervention",
    "InterventionResult",
    "RowsOutput",
    "intervene",
    "run_rows",
    "measure_intervention",
    "site_values",
    "site_width",
]

Mode = Literal["zero", "mean", "scale", "set", "patch", "add"]
MODES: tuple[str, ...] = ("zero", "mean", "scale", "set", "patch", "add")

#: graph node kind -> intervention site
NODE_SITES: dict[str, Site] = {"embedding": "embed", "positional": "pos_embed", "feature": "feature", "error": "error",
              "neuron": "neuron", "attention_head": "head", "mlp": "mlp"}


@dataclass(frozen=True, order=True)
class Unit:
    """One editable unit: ``site``, ``layer`` (-1 for embeddings), ``position`` (``None`` = every
    position) and ``index`` (feature/neuron/head index; ``None`` = every index; 0 for sites with
    one unit per position)."""

    site: Site
    layer: int
    position: int | None = None
    index: int | None = 0

    def __post_init__(self) -> None:
        if self.site not in SITES:
            raise ValidationRunError(f"unknown intervention site {self.site!r}; expected one of {', '.join(SITES)}")

    def __str__(self) -> str:
        pos = "*" if self.position is None else self.position
        idx = "*" if self.index is None else self.index
        return f"{self.site}/{self.layer}/{pos}/{idx}"

    @classmethod
    def from_node(cls, node_id: NodeId | str, *, part: Literal["post", "gate", "value"] = "post") -> Unit:
        """The unit of a graph node.  ``part`` picks the gate (``hook_pre``) or the value
        (``hook_pre_linear``) of a gated neuron instead of its activation."""
        if isinstance(node_id, str):
            node_id = NodeId.parse(node_id)
        site = NODE_SITES.get(node_id.kind)
        if site is None:
            raise ValidationRunError(
                f"node {node_id}: {node_id.kind} nodes cannot be intervened on (they are constants or "
                f"readouts); interventions take {', '.join(sorted(NODE_SITES))} nodes"
            )
        if part != "post":
            if site != "neuron":
                raise ValidationRunError(f"node {node_id}: part={part!r} applies only to gated neurons")
            site = part
        index = 0 if site in POSITION_SITES else node_id.index
        return cls(site, node_id.layer, node_id.position, index)


@dataclass(frozen=True)
class Intervention:
    """One mode applied to ``units`` minus ``exclude`` (see the module docstring).

    ``reference``: token lists for ``mean``; ``patch``: the token list for ``patch``;
    ``pooling`` (mean only): ``position`` (mean per position; every reference prompt must have
    the run's length), ``all`` (mean over every position but the first) or ``auto`` (per
    position when the lengths allow it).
    """

    units: tuple[Unit, ...]
    mode: Mode = "zero"
    scale: float | None = None
    value: float | None = None
    reference: tuple[tuple[int, ...], ...] = ()
    patch: tuple[int, ...] | None = None
    exclude: tuple[Unit, ...] = ()
    pooling: Literal["auto", "position", "all"] = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "units", tuple(self.units))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "reference", tuple(tuple(int(t) for t in r) for r in self.reference))
        if self.patch is not None:
            object.__setattr__(self, "patch", tuple(int(t) for t in self.patch))
        if self.mode not in MODES:
            raise ValidationRunError(f"unknown intervention mode {self.mode!r}; expected one of {', '.join(MODES)}")
        need = {"scale": ("scale", self.scale), "set": ("value", self.value), "patch": ("patch", self.patch),
                "add": ("value", self.value)}
        if self.mode in need and need[self.mode][1] is None:
            raise ValidationRunError(f"mode {self.mode} needs {need[self.mode][0]}=...; give it or choose another mode")
        if self.mode == "mean" and not self.reference:
            raise ValidationRunError("mode mean needs reference prompts (token lists) to average over")

    # convenience constructors ---------------------------------------------------------
    @classmethod
    def zero(cls, units: Sequence[Unit], **kw: Any) -> Intervention:
        return cls(tuple(units), "zero", **kw)

    @classmethod
    def scaled(cls, units: Sequence[Unit], scale: float, **kw: Any) -> Intervention:
        return cls(tuple(units), "scale", scale=float(scale), **kw)

    @classmethod
    def set_to(cls, units: Sequence[Unit], value: float, **kw: Any) -> Intervention:
        return cls(tuple(units), "set", value=float(value), **kw)

    @classmethod
    def added(cls, units: Sequence[Unit], value: float, **kw: Any) -> Intervention:
        return cls(tuple(units), "add", value=float(value), **kw)

    @classmethod
    def mean(cls, units: Sequence[Unit], reference: Sequence[Sequence[int]], **kw: Any) -> Intervention:
        return cls(tuple(units), "mean", reference=tuple(tuple(r) for r in reference), **kw)

    @classmethod
    def patched(cls, units: Sequence[Unit], source: Sequence[int], **kw: Any) -> Intervention:
        return cls(tuple(units), "patch", patch=tuple(source), **kw)

    def resolved_pooling(self, n_pos: int) -> str | None:
        """The pooling a mean intervention uses on an ``n_pos``-token prompt (``None`` for other modes)."""
        if self.mode != "mean":
            return None
        if self.pooling != "auto":
            return self.pooling
        return "position" if all(len(r) == n_pos for r in self.reference) else "all"

    @property
    def _key(self) -> tuple:
        """Interventions with equal keys share one replacement rule (their masks are merged)."""
        return (self.mode, self.scale, self.value, self.reference, self.patch, self.pooling)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "units": [str(u) for u in self.units]}
        if self.exclude:
            out["exclude"] = [str(u) for u in self.exclude]
        if self.scale is not None:
            out["scale"] = self.scale
        if self.value is not None:
            out["value"] = self.value
        if self.reference:
            out["n_reference_prompts"] = len(self.reference)
            out["pooling"] = self.pooling
        if self.patch is not None:
            out["patch_tokens"] = list(self.patch)
        return out


# ---------------------------------------------------------------------------- sites
def site_width(adapter: ModelAdapter, site: str, layer: int, transcoders: Dictionary | None = None) -> int:
    """Number of indices of a site (1 for one-unit-per-position sites)."""
    f = adapter.facts
    if site == "head":
        return f.n_heads
    if site in ("neuron", "pre", "gate", "value"):
        return f.d_mlp
    if site == "feature":
        return require_dictionary(transcoders, "a feature unit")[layer].d_sae
    return 1


def _check_unit(adapter: ModelAdapter, unit: Unit, n_pos: int, transcoders: Dictionary | None) -> None:
    f = adapter.facts
    where = f"unit {unit}"
    if unit.site in ("embed", "pos_embed"):
        if unit.layer != -1:
            raise ValidationRunError(f"{where}: embeddings live at layer -1, got layer {unit.layer}")
        if unit.site == "pos_embed" and f.positional != "learned":
            raise ValidationRunError(f"{where}: this model has {f.positional} positions, no positional embedding")
    else:
        top = f.n_layers if unit.site == "resid_pre" else f.n_layers - 1
        if not 0 <= unit.layer <= top:
            extra = f", or {f.n_layers} for the final residual" if top > f.n_layers - 1 else ""
            raise ValidationRunError(f"{where}: layer {unit.layer} requested, the model has {f.n_layers} layers "
                                     f"(0-{f.n_layers - 1}{extra})")
    if unit.site in ("neuron", "pre", "gate", "value") and f.num_experts:
        raise ValidationRunError(f"{where}: this model's MLPs are mixtures of experts, whose neurons have no "
                                 "dense hook to intervene on; use site 'mlp' (the layer's output) or a transcoder")
    if unit.site in ("gate", "value") and not f.gated_mlp:
        raise ValidationRunError(f"{where}: gates and values exist only in gated MLPs; this model's MLP is "
                                 f"{f.act_fn}; use site 'pre' (hook_pre) or 'neuron' (hook_post)")
    if unit.site == "pre" and f.gated_mlp:
        raise ValidationRunError(f"{where}: in a gated MLP hook_pre is the gate; use site 'gate' or 'value'")
    if unit.site in ("feature", "error") and (transcoders is None or unit.layer not in transcoders):
        raise ValidationRunError(f"{where}: features and errors need layer {unit.layer}'s transcoder; none is loaded")
    if unit.position is not None and not 0 <= unit.position < n_pos:
        raise ValidationRunError(f"{where}: position {unit.position} is outside a {n_pos}-token prompt (0-{n_pos - 1})")
    width = site_width(adapter, unit.site, unit.layer, transcoders)
    if unit.index is not None and not 0 <= unit.index < width:
        raise ValidationRunError(f"{where}: index {unit.index} is out of range for {unit.site} (0-{width - 1})")


def _view(site: str, x: torch.Tensor) -> torch.Tensor:
    """Hook tensor -> ``(batch, pos, n, e)``."""
    if site == "head":
        return x
    if site in VECTOR_SITES:
        return x.unsqueeze(2)
    return x.unsqueeze(-1)


def _unview(site: str, v: torch.Tensor) -> torch.Tensor:
    if site == "head":
        return v
    if site in VECTOR_SITES:
        return v.squeeze(2)
    return v.squeeze(-1)


def dictionary_out_hook(adapter: ModelAdapter, transcoders: Dictionary, layer: int) -> str:
    """Where the dictionary's MLP output ``layer`` is spliced: ``hook_mlp_out``, or the virtual
    ``mlp.hook_out`` before the post-MLP norm for dictionaries that write there (the edit is then
    normalised by the post-norm, with sigma frozen or recomputed as the run has it)."""
    return output_hook_name(layer, transcoders.output_site(layer))


def _needed_hooks(adapter: ModelAdapter, site: str, layer: int, transcoders: Dictionary | None) -> set[str]:
    if site == "feature":
        return {require_dictionary(transcoders, "a feature unit")[layer].hook_in}
    if site == "error":  # the reconstruction of MLP output `layer` reads every source layer's input
        d = require_dictionary(transcoders, "an error unit")
        return {d[l].hook_in for l in d.source_layers(layer)} | {dictionary_out_hook(adapter, d, layer)}
    return {adapter.hook_site(site, layer)}


def site_values(adapter: ModelAdapter, site: str, layer: int, cache: dict[str, torch.Tensor],
                transcoders: Dictionary | None = None,
                ) -> torch.Tensor:
    """The values of every unit of a site, ``(batch, pos, n, e)``, from hook values in ``cache``
    (each ``(batch, pos, ...)``)."""
    if site == "feature":
        reader = require_dictionary(transcoders, "a feature unit")[layer]
        x = cache[reader.hook_in]
        return _view("feature", reader.activation(x).to(x.dtype))
    if site == "error":
        d = require_dictionary(transcoders, "an error unit")
        src = d.source_layers(layer)
        inputs = {l: cache[d[l].hook_in] for l in src}
        acts = {l: d[l].activation(inputs[l]) for l in src}
        out = cache[dictionary_out_hook(adapter, d, layer)]
        return _view("error", out - d.reconstruct_at(layer, acts, inputs).to(out.dtype))
    return _view(site, cache[adapter.hook_site(site, layer)])


@torch.no_grad()
def _cache_run(adapter: ModelAdapter, tokens: Sequence[int], names: set[str]) -> dict[str, torch.Tensor]:
    toks = torch.tensor([list(tokens)], dtype=torch.long, device=adapter.device)
    _, cache = adapter.run_with_cache(toks, names)
    return {k: v.detach() for k, v in cache.items()}


# ---------------------------------------------------------------------------- compiled plans
@dataclass
class _Edit:
    mode: str
    scale: float | None
    value: float | None
    vector: bool
    mask: torch.Tensor  # (B, pos, n, 1) bool
    ref: torch.Tensor | None = None  # (1, pos or 1, n, e)

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        if self.mode == "zero":
            new = torch.zeros((), dtype=v.dtype, device=v.device)
        elif self.mode in ("scale", "set", "add"):
            amount = self.scale if self.mode == "scale" else self.value
            if amount is None:  # Intervention checks this when it is made
                raise ValidationRunError(f"mode {self.mode} needs {'scale' if self.mode == 'scale' else 'value'}")
            if self.mode == "scale":
                new = v * amount
            elif self.mode == "set":
                new = v * amount if self.vector else torch.full((), amount, dtype=v.dtype, device=v.device)
            else:
                new = v * (1 + amount) if self.vector else v + amount
        else:
            if self.ref is None:
                raise ValidationRunError(f"mode {self.mode} needs its reference values")
            new = self.ref.to(device=v.device, dtype=v.dtype)
        return torch.where(self.mask, new, v)


@dataclass
class _Plan:
    edits: dict[tuple[str, int], list[_Edit]] = field(default_factory=dict)


def _unit_index(unit: Unit, n_pos: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ts = torch.arange(n_pos) if unit.position is None else torch.tensor([unit.position])
    ns = torch.arange(width) if unit.index is None else torch.tensor([unit.index])
    tt, nn = torch.meshgrid(ts, ns, indexing="ij")
    return tt.flatten(), nn.flatten()


def _compile(adapter: ModelAdapter, rows: Sequence[Sequence[Intervention]], n_pos: int, transcoders: Dictionary | None,
             broadcast: bool = False, ref_cache: dict | None = None) -> _Plan:
    """Masks per (intervention key, site, layer) for every row, and the reference values
    (memoised in ``ref_cache`` across the batches of one run)."""
    plan = _Plan()
    B = 1 if broadcast else len(rows)
    device = adapter.device
    groups: dict[tuple, dict[tuple[str, int], torch.Tensor]] = {}
    order: list[tuple] = []
    ivs_by_key: dict[tuple, Intervention] = {}
    for b, row in enumerate(rows):
        for iv in row:
            if not iv.units:
                raise ValidationRunError("an intervention with no units; select at least one unit")
            for u in iv.units + iv.exclude:
                _check_unit(adapter, u, n_pos, transcoders)
            key = iv._key
            if key not in groups:
                groups[key] = {}
                order.append(key)
                ivs_by_key[key] = iv
            masks = groups[key]
            local: dict[tuple[str, int], torch.Tensor] = {}
            for u in iv.units:
                sl = (u.site, u.layer)
                width = site_width(adapter, u.site, u.layer, transcoders)
                if sl not in local:
                    local[sl] = torch.zeros(n_pos, width, dtype=torch.bool)
                t_idx, n_idx = _unit_index(u, n_pos, width)
                local[sl][t_idx, n_idx] = True
            for u in iv.exclude:
                sl = (u.site, u.layer)
                if sl in local:
                    t_idx, n_idx = _unit_index(u, n_pos, site_width(adapter, u.site, u.layer, transcoders))
                    local[sl][t_idx, n_idx] = False
            for sl, m in local.items():
                if sl not in masks:
                    masks[sl] = torch.zeros(B, n_pos, m.shape[1], 1, dtype=torch.bool)
                masks[sl][0 if broadcast else b, :, :, 0] |= m
    for key in order:
        iv = ivs_by_key[key]
        ref_cache = {} if ref_cache is None else ref_cache
        missing = [sl for sl in groups[key] if (key, sl) not in ref_cache]
        for sl, ref in _references(adapter, iv, missing, n_pos, transcoders).items():
            ref_cache[(key, sl)] = ref
        refs = {sl: ref_cache[(key, sl)] for sl in groups[key] if (key, sl) in ref_cache}
        for sl, mask in groups[key].items():
            edit = _Edit(iv.mode, iv.scale, iv.value, sl[0] in VECTOR_SITES, mask.to(device), refs.get(sl))
            plan.edits.setdefault(sl, []).append(edit)
    return plan


def _references(adapter: ModelAdapter, iv: Intervention, sites: list[tuple[str, int]], n_pos: int,
                transcoders: Dictionary | None) -> dict[tuple[str, int], torch.Tensor]:
    if iv.mode not in ("mean", "patch") or not sites:
        return {}
    names: set[str] = set()
    for site, layer in sites:
        names |= _needed_hooks(adapter, site, layer, transcoders)
    if iv.mode == "patch":
        patch = iv.patch
        if patch is None:  # Intervention checks this when it is made
            raise ValidationRunError("mode patch needs patch=...")
        if len(patch) != n_pos:
            raise ValidationRunError(
                f"the patch prompt has {len(patch)} tokens and the prompt it is patched into has {n_pos}; "
                "positions must line up, so give two prompts of the same token length (check how each "
                "word tokenizes, e.g. swap a noun for another single-token noun)"
            )
        cache = _cache_run(adapter, patch, names)
        return {sl: site_values(adapter, sl[0], sl[1], cache, transcoders) for sl in sites}
    pooling = iv.resolved_pooling(n_pos)
    if pooling == "position" and not all(len(r) == n_pos for r in iv.reference):
        lengths = sorted({len(r) for r in iv.reference})
        raise ValidationRunError(
            f"mean pooling per position needs reference prompts of the prompt's length {n_pos}; got lengths "
            f"{lengths}; use pooling='all' or reference prompts of that length"
        )
    sums: dict[tuple[str, int], torch.Tensor] = {}
    count = 0
    for ref in iv.reference:
        cache = _cache_run(adapter, ref, names)
        for sl in sites:
            v = site_values(adapter, sl[0], sl[1], cache, transcoders).double()  # (1, T, n, e)
            if pooling == "all":
                v = v[:, 1:] if v.shape[1] > 1 else v
                v = v.sum(1, keepdim=True)
            sums[sl] = v if sl not in sums else sums[sl] + v
        count += (max(len(ref) - 1, 1) if pooling == "all" else 1)
    return {sl: (s / count) for sl, s in sums.items()}


@contextlib.contextmanager
def _install(adapter: ModelAdapter, plan: _Plan, transcoders: Dictionary | None, capture: set[str],
             captured: dict[str, torch.Tensor]) -> Iterator[Any]:
    """Install the plan's edits (then the capture hooks) and remove them all on exit."""
    hooks: list[tuple[str, Any]] = []
    # Splices: a feature edit of layer l changes every MLP output its decoder writes
    # (l only for per-layer transcoders, l..L-1 for a cross-layer transcoder) by
    # (a' - a) W_dec; an error edit of layer k changes MLP output k.  Activations are those of
    # the live inputs of this forward pass, computed once per layer.
    splice_out: dict[int, list[tuple[str, int]]] = {}
    in_layers: set[int] = set()
    for site, layer in plan.edits:
        if site == "feature":
            in_layers.add(layer)
            for k in require_dictionary(transcoders, "a feature or error intervention").output_layers(layer):
                splice_out.setdefault(k, []).append((site, layer))
        elif site == "error":
            in_layers |= set(require_dictionary(transcoders, "a feature or error intervention").source_layers(layer))
            splice_out.setdefault(layer, []).append((site, layer))
    inner: dict[str, Any] = {}
    for layer in sorted(in_layers):
        def grab(value, hook, layer=layer):
            inner[f"tc_in{layer}"] = value
            inner.pop(f"acts{layer}", None)
            inner.pop(f"edited{layer}", None)
            return value
        hooks.append((require_dictionary(transcoders, "a feature or error intervention")[layer].hook_in, grab))

    def live_acts(layer: int, dtype: torch.dtype) -> torch.Tensor:
        if f"acts{layer}" not in inner:
            inner[f"acts{layer}"] = require_dictionary(transcoders, "a feature or error intervention")[layer].activation(inner[f"tc_in{layer}"]).to(dtype)
        return inner[f"acts{layer}"]

    def feature_delta(layer: int, k: int, dtype: torch.dtype) -> torch.Tensor | None:
        """(a' - a) W_dec[layer -> k] for the edited features of ``layer``; only changed rows are read."""
        if f"edited{layer}" not in inner:
            acts = live_acts(layer, dtype)
            v = _view("feature", acts)
            for e in plan.edits[("feature", layer)]:
                v = e.apply(v)
            diff = _unview("feature", v) - acts
            changed = (diff != 0).reshape(-1, diff.shape[-1]).any(0).nonzero().flatten()
            dec = require_dictionary(transcoders, "a feature or error intervention").decoder_rows(layer, changed.cpu()).to(device=diff.device, dtype=dtype)
            inner[f"edited{layer}"] = (diff[..., changed], dec)
        diff, dec = inner[f"edited{layer}"]
        if diff.shape[-1] == 0:
            return None
        return diff @ dec[:, k - layer]

    by_hook: dict[str, list[tuple[str, int]]] = {}
    for site, layer in plan.edits:
        if site not in ("feature", "error"):
            by_hook.setdefault(adapter.hook_site(site, layer), []).append((site, layer))
    for k in splice_out:
        by_hook.setdefault(dictionary_out_hook(adapter, require_dictionary(transcoders, "a feature or error intervention"), k), [])
    for name, sls in by_hook.items():
        def edit(value, hook, sls=sls):
            for site, layer in sls:
                v = _view(site, value)
                for e in plan.edits[(site, layer)]:
                    v = e.apply(v)
                value = _unview(site, v)
            return value

        ks = [k for k in splice_out if dictionary_out_hook(adapter, require_dictionary(transcoders, "a feature or error intervention"), k) == name]
        if ks:
            k = ks[0]

            def edit_mlp(value, hook, k=k, splice=splice_out[k], rest=edit):
                # splices first (relative to the real output), then whole-vector edits
                delta = torch.zeros_like(value)
                for site, layer in splice:
                    if site == "feature":
                        d = feature_delta(layer, k, value.dtype)
                        if d is not None:
                            delta = delta + d
                    else:
                        tcs = require_dictionary(transcoders, "a feature or error intervention")
                        src = tcs.source_layers(k)
                        acts = {l: live_acts(l, value.dtype) for l in src}
                        inputs = {l: inner[f"tc_in{l}"] for l in src}
                        err = value - tcs.reconstruct_at(k, acts, inputs).to(value.dtype)
                        v = _view("error", err)
                        for e in plan.edits[(site, layer)]:
                            v = e.apply(v)
                        delta = delta + (_unview("error", v) - err)
                return rest(value + delta, hook)

            hooks.append((name, edit_mlp))
        else:
            hooks.append((name, edit))

    def keep(value, hook):
        captured[hook.name] = value.detach()
        return value

    hooks += [(n, keep) for n in sorted(capture)]
    with adapter.hooks(hooks) as model:
        yield model


@contextlib.contextmanager
def intervene(adapter: ModelAdapter, interventions: Intervention | Sequence[Intervention], *, n_pos: int,
              transcoders: Dictionary | None = None, capture: Sequence[str] = (),
              captured: dict[str, torch.Tensor] | None = None) -> Iterator[Any]:
    """Scoped: the real model runs with ``interventions`` applied to every batch row of an
    ``n_pos``-token input.  Yields the model; every hook is removed on exit, even on error.

    Mean and patch values are computed (clean runs) on entry.  ``capture``: hook names whose
    values (after every edit) each forward pass stores into ``captured``.
    """
    ivs = [interventions] if isinstance(interventions, Intervention) else list(interventions)
    plan = _compile(adapter, [ivs], n_pos, transcoders, broadcast=True)
    with _install(adapter, plan, transcoders, set(capture), {} if captured is None else captured) as model:
        yield model


# ---------------------------------------------------------------------------- measuring
@dataclass
class RowsOutput:
    """Per-row results of :func:`run_rows`: ``metric (rows,)``, ``readouts (rows, n_readouts)``,
    ``loss (rows,)`` (next-token loss, when asked), all float64 on the CPU."""

    metric: torch.Tensor
    readouts: torch.Tensor
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


@torch.no_grad()
def run_rows(adapter: ModelAdapter, tokens: Sequence[int], rows: Sequence[Sequence[Intervention]], metric: Metric, *,
             transcoders: Dictionary | None = None, batch_size: int = 32, with_loss: bool = False,
             keep_logits: bool = False) -> RowsOutput:
    """Run ``tokens`` once per row, each row with its own interventions (an empty row is the
    clean run), batched, and read ``metric`` off each run."""
    toks = torch.as_tensor(list(tokens), dtype=torch.long, device=adapter.device)
    T = int(toks.shape[0])
    need = metric.hook_names(adapter, transcoders)
    metrics, reads, losses, logit_list = [], [], [], []
    rows = list(rows)
    ref_cache: dict = {}
    for start in range(0, max(len(rows), 1), batch_size):
        chunk = rows[start:start + batch_size]
        if not chunk:
            break
        plan = _compile(adapter, chunk, T, transcoders, ref_cache=ref_cache)
        captured: dict[str, torch.Tensor] = {}
        with _install(adapter, plan, transcoders, need, captured) as model:
            logits = model(toks.unsqueeze(0).expand(len(chunk), -1))
        vals = metric.values(logits, captured, adapter, transcoders)
        reads.append(vals.cpu())
        metrics.append(metric.combine(vals).cpu())
        if with_loss:
            losses.append(next_token_loss(logits, toks).cpu())
        if keep_logits:
            logit_list.append(logits.detach().cpu())
    return RowsOutput(
        torch.cat(metrics), torch.cat(reads),
        torch.cat(losses) if with_loss else None,
        torch.cat(logit_list) if keep_logits else None,
    )


@dataclass(repr=False)
class InterventionResult(Tabular):
    """The target metric before and after one intervention on the real model."""

    intervention: Intervention
    metric: Metric
    before: float
    after: float
    readouts_before: list[float]
    readouts_after: list[float]

    @property
    def change(self) -> float:
        return self.after - self.before

    def to_dict(self) -> dict[str, Any]:
        return {
            "intervention": self.intervention.to_dict(),
            "metric": self.metric.to_dict(),
            "before": self.before,
            "after": self.after,
            "change": self.change,
            "readouts_before": self.readouts_before,
            "readouts_after": self.readouts_after,
        }

    def table(self, max_rows: int = 10) -> str:
        return markdown_table(["mode", "units", "before", "after", "change"],
                              [[self.intervention.mode, len(self.intervention.units), self.before, self.after,
                                self.change]], max_rows)


def measure_intervention(adapter: ModelAdapter, tokens: Sequence[int], intervention: Intervention, metric: Metric, *,
                         transcoders: Dictionary | None = None) -> InterventionResult:
    """The metric on ``tokens`` without and with ``intervention`` (real model)."""
    out = run_rows(adapter, tokens, [[], [intervention]], metric, transcoders=transcoders)
    return InterventionResult(intervention, metric, float(out.metric[0]), float(out.metric[1]),
                              out.readouts[0].tolist(), out.readouts[1].tolist())
