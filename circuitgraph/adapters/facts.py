"""What the engine knows about a model's architecture (:class:`ArchitectureFacts`), recorded once
when the model is loaded (:class:`circuitgraph.adapters.architecture.ModelAdapter`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["ArchitectureFacts", "NormKind", "QKNorm"]

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
