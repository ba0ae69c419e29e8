"""The model adapter: the only place that knows TransformerLens names and architecture facts.

The engine never reads ``model.cfg`` or builds hook names itself; it asks the adapter for
weights (as plain tensors, grouped-query heads already expanded) and hook names.

Norms are written ``N(x) = gamma * P(x) / sigma(x) + beta`` with ``P`` the mean-removal for
LayerNorm and the identity for RMSNorm (``beta = 0``).  For folded norms (TransformerLens
``LNPre``/``RMSPre``) ``gamma = 1`` and ``beta = 0``: the weights were folded into the next
layer, and :attr:`ArchitectureFacts.ln_folded` records it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from circuitgraph.adapters.hf_config import GPT_OSS_ALPHA, GPT_OSS_LIMIT
from circuitgraph.adapters.native_transformer import NativeTransformer
from circuitgraph.errors import AttributionError, LoadError

__all__ = ["ArchitectureFacts", "NormWeights", "ModelAdapter"]

NormKind = Literal["layernorm", "rmsnorm", "none"]
QKNorm = Literal["none", "per_head", "whole"]


@dataclass(frozen=True)
class ArchitectureFacts:
    """What the engine needs to know about a model, recorded once at load time."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    norm: NormKind
    ln_folded: bool
    gated_mlp: bool
    act_fn: str
    positional: Literal["learned", "rotary", "none"]
    grouped_query: bool
    post_norms: bool
    parallel_attn_mlp: bool
    attn_scores_soft_cap: float | None
    output_logits_soft_cap: float | None
    attention_sinks: bool
    #: query/key norms: ``per_head`` (Qwen3, Gemma-3: one sigma per head and position), ``whole`` (OLMo-2,
    #: OLMoE: one sigma per position over the whole q or k projection), ``none``
    qk_norm: QKNorm = "none"
    #: mixture of experts: experts per MoE layer (0 = dense MLPs), experts routed per token; each expert
    #: has ``d_mlp`` neurons, and neuron ``i`` of expert ``e`` is index ``e * d_mlp + i``
    num_experts: int = 0
    experts_per_token: int = 0
    #: False where the blocks have no norm on their inputs (OLMo-2: norms on the outputs only)
    input_norms: bool = True

    @property
    def n_neurons(self) -> int:
        """Neuron indices per MLP layer: ``d_mlp``, or ``num_experts * d_mlp`` for MoE layers."""
        return self.d_mlp * max(1, self.num_experts)
    #: no MLP layers (TransformerLens ``attn_only``): resid_post(l) = resid_mid(l)
    attn_only: bool = False
    #: causal attention (each position reads itself and earlier ones); False for bidirectional
    #: attention (TransformerLens ``attention_dir="bidirectional"``, tracr-compiled models): a
    #: frozen pattern may read later positions, and a reader sees writers at every position
    causal: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NormWeights:
    """gamma and beta of one norm site (beta None for RMSNorm / folded); ``center`` = LayerNorm."""

    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    center: bool

    def reader_direction(self, w: torch.Tensor) -> torch.Tensor:
        """``P(gamma * w)``: the residual direction read by ``w . N(x)`` (before ``1/sigma``).

        ``w`` has shape ``(..., d_model)`` and is not modified (the result may be ``w`` itself when
        there is neither gamma nor centring). The one implementation: the engine's readers, its
        frozen propagation and the queries all call it.
        """
        if self.gamma is not None:
            g = w * self.gamma
            if self.center:
                g -= g.mean(-1, keepdim=True)  # g is a new tensor here
            return g
        return w - w.mean(-1, keepdim=True) if self.center else w

    def reader_constant(self, w: torch.Tensor) -> torch.Tensor:
        """``w . beta``: the constant part of ``w . N(x)``."""
        if self.beta is None:
            return torch.zeros(w.shape[:-1], dtype=w.dtype, device=w.device)
        return w @ self.beta


def _qk_norm_kind(model: Any) -> str:
    """How TransformerLens normalises queries and keys (``AbstractAttention``): ``use_qk_norm``
    applies an RMSNorm of length ``d_head`` per head; the OLMo family (``q_norm`` of length
    ``n_heads * d_head``) one over the whole projection."""
    if getattr(model.cfg, "use_qk_norm", False):
        return "per_head"
    q_norm = getattr(model.blocks[0].attn, "q_norm", None) if len(model.blocks) else None
    if q_norm is not None:
        return "whole"
    return "none"


_NORM_KINDS: dict[Any, NormKind] = {"LN": "layernorm", "LNPre": "layernorm", "RMS": "rmsnorm",
                                     "RMSPre": "rmsnorm", None: "none"}

_UNSUPPORTED_ARCH = {"BertForMaskedLM", "T5ForConditionalGeneration"}
#: TransformerLens architectures whose ``ln1`` / ``ln2`` normalise the attention / MLP *output*
#: (TransformerLens's POST_NORM_ARCHITECTURES): the adapter presents them as post-norms
#: (``ln1_post`` / ``ln2_post``) of blocks without input norms
_OUTPUT_NORM_ARCH = {"Olmo2ForCausalLM", "Olmo3ForCausalLM"}
#: where a model format comes from: a TransformerLens folder / name, or a Hugging Face folder / snapshot
ModelFormat = Literal["transformer_lens", "huggingface"]
ModelBackendName = Literal["native", "transformer_lens"]


@dataclass(frozen=True)
class _VirtualHookPoint:
    """What a virtual hook's function receives as ``hook`` (TransformerLens passes a HookPoint)."""

    name: str


class ModelAdapter:
    """Wraps a TransformerLens ``HookedTransformer`` and records its architecture facts.

    ``format`` says where it came from (``transformer_lens``: a TransformerLens folder or name;
    ``huggingface``: a Hugging Face folder or snapshot, ``family`` its row of
    :data:`circuitgraph.adapters.hf_config.FAMILIES`)."""

    def __init__(self, model: Any, *, tokenizer: Any = None, source: dict[str, Any] | None = None,
                 format: ModelFormat = "transformer_lens", family: str | None = None,
                 quantisation: dict[str, Any] | None = None):
        cfg = model.cfg
        if getattr(cfg, "original_architecture", None) in _UNSUPPORTED_ARCH:
            raise LoadError(
                f"architecture {cfg.original_architecture} is not a pre-norm decoder; "
                "circuitgraph supports pre-norm causal transformers (GPT-2, Llama, Gemma, ...)"
            )
        if cfg.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre", None):
            raise LoadError(
                f"normalization_type {cfg.normalization_type!r} is not supported; "
                "expected LN, LNPre, RMS, RMSPre or None (no norms)"
            )
        if getattr(cfg, "attention_dir", "causal") not in ("causal", "bidirectional"):
            raise LoadError(f"attention_dir {cfg.attention_dir!r} is not supported; expected causal or bidirectional")
        if cfg.positional_embedding_type not in ("standard", "rotary"):
            raise LoadError(
                f"positional_embedding_type {cfg.positional_embedding_type!r} is not supported; "
                "expected 'standard' (learned) or 'rotary'"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.source = dict(source or {})
        self.format = format
        #: the row of circuitgraph.adapters.hf_config.FAMILIES (config.json model_type), None otherwise
        self.family = family
        #: the quantised checkpoint the weights were dequantised from (a GGUF file's type and tensor
        #: types, circuitgraph.adapters.gguf), None for weights as published
        self.quantisation = dict(quantisation) if quantisation is not None else None
        #: which implementation runs the forward: ``native`` (circuitgraph's torch-only HookedTransformer,
        #: circuitgraph.adapters.native_transformer) or ``transformer_lens``
        self.backend: ModelBackendName = "native" if isinstance(model, NativeTransformer) else "transformer_lens"
        output_norms = getattr(cfg, "original_architecture", None) in _OUTPUT_NORM_ARCH
        n_kv = cfg.n_key_value_heads if cfg.n_key_value_heads is not None else cfg.n_heads
        soft = lambda v: None if v is None or v <= 0 else float(v)  # noqa: E731
        self.facts = ArchitectureFacts(
            n_layers=cfg.n_layers,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            n_kv_heads=n_kv,
            d_head=cfg.d_head,
            d_mlp=cfg.d_mlp,
            d_vocab=cfg.d_vocab,
            n_ctx=cfg.n_ctx,
            norm=_NORM_KINDS[cfg.normalization_type],
            ln_folded=cfg.normalization_type in ("LNPre", "RMSPre"),
            gated_mlp=bool(cfg.gated_mlp),
            act_fn=str(cfg.act_fn),
            positional="learned" if cfg.positional_embedding_type == "standard" else "rotary",
            grouped_query=n_kv != cfg.n_heads,
            post_norms=bool(cfg.use_normalization_before_and_after) or output_norms,
            parallel_attn_mlp=bool(cfg.parallel_attn_mlp),
            attn_scores_soft_cap=soft(getattr(cfg, "attn_scores_soft_cap", -1.0)),
            output_logits_soft_cap=soft(getattr(cfg, "output_logits_soft_cap", -1.0)),
            attention_sinks=bool(getattr(cfg, "use_attention_sinks", False)),
            qk_norm=_qk_norm_kind(model),
            num_experts=int(getattr(cfg, "num_experts", None) or 0),
            experts_per_token=int(getattr(cfg, "experts_per_token", None) or 0),
            attn_only=bool(getattr(cfg, "attn_only", False)),
            causal=getattr(cfg, "attention_dir", "causal") == "causal",
            input_norms=not output_norms,
        )
        #: GPT-OSS experts (TransformerLens ``GptOssMoE``): biased, clamped SwiGLU, softmax after the top-k
        self._gpt_oss = bool(self.facts.num_experts) and type(model.blocks[0].mlp).__name__ == "GptOssMoE"
        if self.facts.parallel_attn_mlp and self.facts.post_norms:
            raise LoadError("parallel attention/MLP blocks with post-norms are not supported")

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        return str(self.model.cfg.model_name)

    @property
    def device(self) -> torch.device:
        return self.model.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.W_E.dtype

    # ------------------------------------------------------------------ hook names
    @staticmethod
    def hook_resid_pre(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_pre"

    @staticmethod
    def hook_resid_mid(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_mid"

    @staticmethod
    def hook_resid_post(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_post"

    def _norm_module_name(self, site: str) -> str | None:
        """TransformerLens's module of a norm site; None for a site the model does not have
        (the input norms of a model with output norms only, OLMo-2)."""
        if self.facts.input_norms:
            return site
        return {"ln1": None, "ln2": None, "ln1_post": "ln1", "ln2_post": "ln2"}.get(site, site)

    def hook_norm_scale(self, site: str, layer: int | None = None) -> str:
        """``site`` in ln1, ln2, ln1_post, ln2_post, ln_final (a site the model has: :meth:`has_norm`)."""
        if site == "ln_final":
            return "ln_final.hook_scale"
        return f"blocks.{layer}.{self._norm_module_name(site)}.hook_scale"

    def hook_norm_normalized(self, site: str, layer: int | None = None) -> str:
        """``P(x)/sigma`` of a norm site; for a site the model does not have, a name no hook has
        (:meth:`has_hook` is false), never another norm's hook."""
        if site == "ln_final":
            return "ln_final.hook_normalized"
        return f"blocks.{layer}.{self._norm_module_name(site)}.hook_normalized"

    @staticmethod
    def block_hook(layer: int, name: str) -> str:
        """The hook ``name`` of block ``layer``, ``name`` relative to the block as dictionary configs
        give it (``ln2.hook_normalized``, ``mlp.hook_in``, ``hook_mlp_out``)."""
        return f"blocks.{layer}.{name}"

    @staticmethod
    def hook_pattern(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_pattern"

    @staticmethod
    def hook_attn_scores(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_attn_scores"

    @staticmethod
    def hook_qk(layer: int, side: str, rotated: bool = False) -> str:
        """The queries (``side="q"``) or keys (``"k"``) of ``layer``'s attention, after the rotary
        embedding when ``rotated``."""
        return f"blocks.{layer}.attn.hook_{'rot_' if rotated else ''}{side}"

    @staticmethod
    def hook_qk_input(layer: int, side: str) -> str:
        """The residual stream the queries (``side="q"``) or keys (``"k"``) read, with
        ``use_split_qkv_input``."""
        return f"blocks.{layer}.hook_{side}_input"

    @staticmethod
    def hook_v(layer: int) -> str:
        """The values of ``layer``'s attention ``(batch, pos, n_kv_heads, d_head)`` (one per key-value
        head: grouped-query heads share them)."""
        return f"blocks.{layer}.attn.hook_v"

    @staticmethod
    def hook_z(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_z"

    @staticmethod
    def hook_attn_out(layer: int) -> str:
        return f"blocks.{layer}.hook_attn_out"

    @staticmethod
    def hook_mlp_out(layer: int) -> str:
        return f"blocks.{layer}.hook_mlp_out"

    @staticmethod
    def hook_mlp_pre(layer: int) -> str:
        """GELU/ReLU: the neuron pre-activation; gated: the gate pre-activation."""
        return f"blocks.{layer}.mlp.hook_pre"

    @staticmethod
    def hook_mlp_pre_linear(layer: int) -> str:
        """Gated MLPs only: the linear (value) branch, without b_in."""
        return f"blocks.{layer}.mlp.hook_pre_linear"

    @staticmethod
    def hook_mlp_post(layer: int) -> str:
        return f"blocks.{layer}.mlp.hook_post"

    def hook_site(self, site: str, layer: int) -> str:
        """The hook whose activation is an intervention site's (:mod:`circuitgraph.adapters.sites`)
        at ``layer``: the one site-to-hook translation. ``resid_pre`` past the last block is the
        final residual (``resid_post`` of the last block); a feature or an error edits the MLP's
        output; ``pre`` and ``gate`` the gate's pre-activation, ``value`` the linear branch's."""
        if site == "embed":
            return self.hook_embed()
        if site == "pos_embed":
            return self.hook_pos_embed()
        if site == "resid_pre":
            return self.hook_resid_pre(layer) if layer < self.facts.n_layers else self.hook_resid_post(layer - 1)
        if site == "attn":
            return self.hook_attn_out(layer)
        if site == "head":
            return self.hook_z(layer)
        if site in ("mlp", "feature", "error"):
            return self.hook_mlp_out(layer)
        if site == "neuron":
            return self.hook_mlp_post(layer)
        if site in ("pre", "gate"):
            return self.hook_mlp_pre(layer)
        if site == "value":
            return self.hook_mlp_pre_linear(layer)
        raise AttributionError(f"unknown intervention site {site!r}")

    @staticmethod
    def hook_embed() -> str:
        return "hook_embed"

    @staticmethod
    def hook_pos_embed() -> str:
        return "hook_pos_embed"

    @staticmethod
    def hook_mlp_out_before_post_norm(layer: int) -> str:
        """circuit-tracer's ``mlp.hook_out``: the MLP's own output, *before* a post-MLP norm
        (Gemma-2's ``ln2_post``).  TransformerLens has no hook there: on models with post-norms it
        is a virtual hook that :meth:`hooks` and :meth:`run_with_cache` provide (a forward
        pre-hook on the block's ``ln2_post`` module, whose input is that value); on models
        without post-norms it is the same value as :meth:`hook_mlp_out`."""
        return f"blocks.{layer}.mlp.hook_out"

    @staticmethod
    def hook_qk_norm_scale(side: Literal["q", "k"], layer: int) -> str:
        """sigma of the query (``q``) or key (``k``) norm: ``(batch * pos * heads, 1)`` for per-head
        norms (TransformerLens flattens the heads before the norm), ``(batch, pos, 1)`` for norms over
        the whole projection."""
        return f"blocks.{layer}.attn.{side}_norm.hook_scale"

    @staticmethod
    def hook_qk_normalized(side: Literal["q", "k"], layer: int) -> str:
        """The query (``q``) or key (``k``) norm's output before its weight, ``P(x) / sigma``."""
        return f"blocks.{layer}.attn.{side}_norm.hook_normalized"

    @staticmethod
    def hook_expert_weights(layer: int) -> str:
        """MoE: the router's softmax over every expert ``(batch * pos, num_experts)`` (before the top-k)."""
        return f"blocks.{layer}.mlp.hook_expert_weights"

    @staticmethod
    def hook_expert_indices(layer: int) -> str:
        """MoE: the chosen experts ``(batch * pos, experts_per_token)``, best first."""
        return f"blocks.{layer}.mlp.hook_expert_indices"

    @staticmethod
    def hook_expert(layer: int, expert: int, what: Literal["gate", "pre", "post"]) -> str:
        """MoE: one expert's gate pre-activation, linear branch or activation ``act(gate) * linear``,
        over the tokens routed to it only (``(n_routed, d_mlp)``, see :meth:`moe_activations`)."""
        return f"blocks.{layer}.mlp.experts.{expert}.hook_{what}"

    def moe_hooks(self, layer: int) -> set[str]:
        """Every hook :meth:`moe_activations` reads for ``layer``."""
        names = {self.hook_expert_weights(layer), self.hook_expert_indices(layer)}
        for e in range(self.facts.num_experts):
            names |= {self.hook_expert(layer, e, w) for w in ("gate", "pre", "post")}
        return names

    def expert_value_map(self, layer: int, gate: torch.Tensor, linear: torch.Tensor,
                         b_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, offset)`` with an expert neuron's ``act(gate) * value`` equal to
        ``scale * (W_in[:, i] . x) + offset`` once its gate (and clamp) is frozen; ``gate`` and
        ``linear`` are its recorded gate pre-activation and value branch (``hook_gate``, ``hook_pre``,
        the value including ``b_in``), ``b_in`` its value bias.

        SwiGLU experts (Mixtral, OLMoE, Qwen3-MoE): ``scale = act(gate)``, ``offset = 0``. GPT-OSS:
        ``glu(min(gate, 7)) * (clamp(value, -7, 7) + 1)``: ``scale = glu`` and ``offset = glu * (b_in + 1)``
        where the value is inside the clamp; where it is clamped the neuron reads nothing
        (``scale = 0``, ``offset`` = its value)."""
        if not self._gpt_oss:
            return self.mlp_act_fn(layer)(gate), torch.zeros_like(gate)
        g = gate.clamp(max=GPT_OSS_LIMIT)
        glu = g * torch.sigmoid(g * GPT_OSS_ALPHA)
        live = (linear > -GPT_OSS_LIMIT) & (linear < GPT_OSS_LIMIT)
        scale = torch.where(live, glu, torch.zeros_like(glu))
        offset = torch.where(live, glu * (b_in + 1), glu * (linear.clamp(-GPT_OSS_LIMIT, GPT_OSS_LIMIT) + 1))
        return scale, offset

    def moe_activations(self, cache: dict[str, torch.Tensor], layer: int, n_pos: int) -> dict[str, torch.Tensor]:
        """The routing and the expert neurons of MoE layer ``layer`` on one prompt (batch 1), from
        TransformerLens's MoE hooks in ``cache`` (names as :meth:`moe_hooks`, batch dimension kept).

        Returns ``indices (pos, k)`` and ``weights (pos, k)`` (the chosen experts and their routing
        weights, renormalised over the top k where the model does), ``routing (pos, num_experts)``
        (the weight of every expert, 0 where not chosen), and over the flat neuron index
        ``e * d_mlp + i``: ``gate`` (gate pre-activation), ``linear`` (value branch), ``post``
        (``act(gate) * linear``) and ``activation`` (``routing weight * post``, what the neuron
        writes with ``W_out``), each ``(pos, num_experts * d_mlp)``, 0 for experts not chosen.

        TransformerLens's ``MoE.forward`` runs expert ``e`` on the rows ``torch.where(mask[e])`` of
        the one-hot mask ``(experts, k, tokens)``: ordered by top-k slot, then token; its hooks'
        rows are mapped back to positions in that order."""
        f = self.facts
        E, d = f.num_experts, f.d_mlp
        indices = cache[self.hook_expert_indices(layer)].reshape(n_pos, -1)
        probs = cache[self.hook_expert_weights(layer)].reshape(n_pos, E)
        weights = probs.gather(1, indices)  # GPT-OSS: its hook holds the routing weights themselves
        if self.model.cfg.norm_topk_prob and not self._gpt_oss:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(self.dtype)
        routing = torch.zeros(n_pos, E, dtype=self.dtype, device=weights.device).scatter(1, indices, weights)
        out = {w: torch.zeros(n_pos, E * d, dtype=self.dtype, device=weights.device) for w in ("gate", "linear", "post")}
        mask = torch.nn.functional.one_hot(indices, num_classes=E).permute(2, 1, 0)  # (E, k, pos)
        for e in range(E):
            _, tok = torch.where(mask[e])
            if not tok.numel():  # GPT-OSS skips an expert no token chose (no hook call)
                continue
            for key, what in (("gate", "gate"), ("linear", "pre"), ("post", "post")):
                value = cache[self.hook_expert(layer, e, what)].reshape(-1, d)
                out[key][tok, e * d:(e + 1) * d] = value.to(self.dtype)
        out["activation"] = out["post"] * routing.repeat_interleave(d, dim=1)
        out.update(indices=indices, weights=weights, routing=routing)
        return out

    def _virtual_layer(self, name: str) -> int | None:
        """The layer of a virtual ``blocks.<l>.mlp.hook_out`` hook on a post-norm model, else None."""
        m = re.fullmatch(r"blocks\.(\d+)\.mlp\.hook_out", name)
        if m and self.facts.post_norms and int(m.group(1)) < self.facts.n_layers:
            return int(m.group(1))
        return None

    def hook_alias(self, name: str) -> str | None:
        """The hook that carries ``name``'s value on a model without it, ``""`` where the value does
        not exist (nothing to hook), None where ``name`` is a real hook or unknown.

        Norm-free models: ``ln1/ln2/ln_final.hook_normalized`` are the identity of their input
        (resid_pre, resid_mid, the last resid_post).  Attention-only models: ``hook_resid_mid`` is
        ``hook_resid_post`` and the MLP hooks (``hook_mlp_out``, ``mlp.hook_*``) do not exist."""
        if name in self.model.hook_dict:
            return None
        m = re.fullmatch(r"blocks\.(\d+)\.(hook_resid_mid|hook_mlp_out|mlp\.hook_\w+|ln[12]\.hook_normalized)", name)
        if name == "ln_final.hook_normalized" and self.facts.norm == "none":
            return self.hook_resid_post(self.facts.n_layers - 1)
        if m is None:
            return None
        layer, what = int(m.group(1)), m.group(2)
        if self.facts.attn_only:
            if what in ("hook_resid_mid", "ln2.hook_normalized"):
                return self.hook_resid_post(layer)
            if what == "hook_mlp_out" or what.startswith("mlp."):
                return ""
        if self.facts.norm == "none" and what.endswith("hook_normalized"):
            return self.hook_resid_pre(layer) if what.startswith("ln1") else self.hook_resid_mid(layer)
        return None

    def transformer_lens_model(self) -> Any:
        """The model as a TransformerLens ``HookedTransformer``, for the callers that need its own
        options (``use_split_qkv_input``): the model itself, or for the native backend its conversion
        (:meth:`NativeTransformer.to_transformer_lens`: same config and weights), built once per
        dtype and device."""
        if not isinstance(self.model, NativeTransformer):
            return self.model
        key = (self.dtype, self.device)
        cached = getattr(self, "_tl_model", None)
        if cached is None or cached[0] != key:
            cached = (key, self.model.to_transformer_lens())
            self._tl_model = cached
        return cached[1]

    def has_hook(self, name: str) -> bool:
        return name in self.model.hook_dict or self._virtual_layer(name) is not None or bool(self.hook_alias(name))

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[str, Callable]]) -> Iterator[Any]:
        """Scoped forward hooks, as TransformerLens's ``model.hooks``, plus the aliases of models
        without norms or MLPs (:meth:`hook_alias`) and the virtual
        ``blocks.<l>.mlp.hook_out`` of post-norm models (see :meth:`hook_mlp_out_before_post_norm`):
        its function gets ``(mlp_output, hook)`` and may return a replacement, which the post-norm
        then normalises.  Every hook is removed on exit, even on error."""
        real, handles = [], []
        try:
            for name, fn in fwd_hooks:
                alias = self.hook_alias(name)
                if alias == "":  # the value does not exist in this model (an attention-only model's MLP)
                    continue
                if alias is not None:  # the function sees the name it asked for
                    point = _VirtualHookPoint(name)
                    real.append((alias, lambda value, hook, fn=fn, point=point: fn(value, point)))
                    continue
                layer = self._virtual_layer(name)
                if layer is None:
                    real.append((name, fn))
                    continue
                point = _VirtualHookPoint(name)

                def pre(module: Any, args: tuple, fn: Callable = fn, point: _VirtualHookPoint = point) -> Any:
                    out = fn(args[0], point)
                    return None if out is None else (out, *args[1:])

                module = getattr(self.model.blocks[layer], self._norm_module_name("ln2_post"))
                handles.append(module.register_forward_pre_hook(pre))
            with self.model.hooks(fwd_hooks=real):
                yield self.model
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def run_with_cache(self, tokens: torch.Tensor, names: set[str] | Sequence[str]) -> tuple[torch.Tensor, dict]:
        """``(logits, {name: value})`` of one forward pass on ``tokens (batch, pos)``, for hook
        names including the virtual ``mlp.hook_out`` ones."""
        cache: dict[str, torch.Tensor] = {}

        def keep(value: torch.Tensor, hook: Any) -> torch.Tensor:
            cache[hook.name] = value.detach()
            return value

        with self.hooks([(n, keep) for n in sorted(set(names))]) as model:
            logits = model(tokens)
        return logits, cache

    def check_layer(self, layer: int, what: str = "layer") -> None:
        n = self.facts.n_layers
        if not (0 <= layer < n):
            raise AttributionError(f"{what} {layer} requested, the model has {n} layers (0-{n - 1})")

    # ------------------------------------------------------------------ weights
    def _norm(self, module: Any) -> NormWeights:
        gamma = getattr(module, "w", None)
        beta = getattr(module, "b", None)
        return NormWeights(
            gamma=None if gamma is None else gamma.detach(),
            beta=None if beta is None else beta.detach(),
            center=self.facts.norm == "layernorm",
        )

    def has_norm(self, site: str, layer: int | None = None) -> bool:
        """Whether the model has the norm ``site`` (ln1, ln2, ln1_post, ln2_post, ln_final; it has a
        ``hook_scale``). False everywhere on norm-free models, for ln2 on attention-only ones and for
        the input norms of a model with output norms only (OLMo-2): such a site is the identity
        (sigma = 1)."""
        if self.facts.norm == "none":
            return False
        if self.facts.attn_only and site in ("ln2", "ln2_post"):
            return False
        if site in ("ln1_post", "ln2_post"):
            return self.facts.post_norms
        return self._norm_module_name(site) is not None

    def norm(self, site: str, layer: int | None = None) -> NormWeights:
        """Weights of a norm site: ln1, ln2, ln1_post, ln2_post (per layer) or ln_final. A site the
        model does not have (:meth:`has_norm`) is the identity: no gamma, no beta, no centring (sigma 1)."""
        if not self.has_norm(site, layer):
            return NormWeights(gamma=None, beta=None, center=False)
        if site == "ln_final":
            return self._norm(self.model.ln_final)
        return self._norm(getattr(self.model.blocks[layer], self._norm_module_name(site)))

    @property
    def W_E(self) -> torch.Tensor:
        return self.model.W_E.detach()

    @property
    def W_pos(self) -> torch.Tensor | None:
        return self.model.W_pos.detach() if self.facts.positional == "learned" else None

    @property
    def W_U(self) -> torch.Tensor:
        return self.model.W_U.detach()

    @property
    def b_U(self) -> torch.Tensor:
        return self.model.b_U.detach()

    def attn_weights(self, layer: int) -> dict[str, torch.Tensor]:
        """``W_V (n_heads, d_model, d_head)``, ``b_V (n_heads, d_head)``, ``W_O (n_heads, d_head,
        d_model)``, ``b_O (d_model,)``; grouped-query heads expanded to one per query head."""
        attn = self.model.blocks[layer].attn
        return {
            "W_V": attn.W_V.detach(),
            "b_V": attn.b_V.detach(),
            "W_O": attn.W_O.detach(),
            "b_O": attn.b_O.detach(),
        }

    def mlp_weights(self, layer: int) -> dict[str, torch.Tensor]:
        """``W_in (d_model, d_mlp)``, ``b_in``, ``W_out (d_mlp, d_model)``, ``b_out`` and, for
        gated MLPs, ``W_gate (d_model, d_mlp)``."""
        mlp = self.model.blocks[layer].mlp
        out = {
            "W_in": mlp.W_in.detach(),
            "b_in": mlp.b_in.detach(),
            "W_out": mlp.W_out.detach(),
            "b_out": mlp.b_out.detach(),
        }
        if self.facts.gated_mlp:
            out["W_gate"] = mlp.W_gate.detach()
        return out

    def mlp_act_fn(self, layer: int):
        mlp = self.model.blocks[layer].mlp
        return mlp.experts[0].act_fn if self.facts.num_experts else mlp.act_fn

    def qk_norm(self, side: Literal["q", "k"], layer: int) -> NormWeights:
        """gamma of the query or key norm of ``layer`` (RMSNorm: no beta, no centring); length
        ``d_head`` for per-head norms, the whole projection's for ``whole``."""
        module = getattr(self.model.blocks[layer].attn, f"{side}_norm")
        return NormWeights(gamma=module.w.detach(), beta=None, center=False)

    def expert_weights(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert of MoE layer ``layer``: ``W_gate``, ``W_in (d_model, d_mlp)``, ``W_out (d_mlp,
        d_model)`` and ``b_gate``, ``b_in``, ``b_out`` (zeros for TransformerLens's ``MoEGatedMLP``, which
        has none; GPT-OSS's experts have them)."""
        e = self.model.blocks[layer].mlp.experts[expert]
        out = {"W_gate": e.W_gate.weight.detach().T, "W_in": e.W_in.weight.detach().T,
               "W_out": e.W_out.weight.detach().T}
        zeros = lambda n: torch.zeros(n, dtype=self.dtype, device=self.device)  # noqa: E731
        for key, lin, n in (("b_gate", e.W_gate, self.facts.d_mlp), ("b_in", e.W_in, self.facts.d_mlp),
                            ("b_out", e.W_out, self.facts.d_model)):
            out[key] = lin.bias.detach() if lin.bias is not None else zeros(n)
        return out

    def expert_neuron_weights(self, layer: int, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """``W_in (d_model, n)``, ``W_out (n, d_model)`` and ``b_in (n,)`` of the flat expert neuron indices ``idx``
        (``expert * d_mlp + neuron``), in the order given."""
        d = self.facts.d_mlp
        experts = idx // d
        W_in = torch.empty(self.facts.d_model, idx.numel(), dtype=self.dtype, device=self.device)
        W_out = torch.empty(idx.numel(), self.facts.d_model, dtype=self.dtype, device=self.device)
        b_in = torch.empty(idx.numel(), dtype=self.dtype, device=self.device)
        for e in experts.unique().tolist():
            sel = (experts == e).nonzero().flatten()
            w = self.expert_weights(layer, e)
            W_in[:, sel] = w["W_in"][:, idx[sel] - e * d]
            W_out[sel] = w["W_out"][idx[sel] - e * d]
            b_in[sel] = w["b_in"][idx[sel] - e * d]
        return {"W_in": W_in, "W_out": W_out, "b_in": b_in}

    def describe(self) -> dict[str, Any]:
        """Identity for metadata: name, source and facts."""
        out = {"name": self.name, "source": self.source, "format": self.format, "backend": self.backend,
               "architecture": self.facts.to_dict()}
        if self.family is not None:
            out["family"] = self.family
        if self.quantisation is not None:
            out["quantisation"] = self.quantisation
        return out
