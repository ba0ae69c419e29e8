"""What the engine, the queries and the checks need of a dictionary: the :class:`Dictionary`
protocol.  Per-layer transcoders (:class:`~circuitgraph.dictionaries.TranscoderSet`) and
cross-layer transcoders (:class:`~circuitgraph.dictionaries.CrossLayerTranscoder`) implement it;
a new kind of dictionary implements it too, and nothing else changes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from circuitgraph.errors import SpecError

__all__ = ["Dictionary", "require_dictionary"]


@runtime_checkable
class Dictionary(Protocol):
    """A set of sparse dictionaries over a model's MLPs.

    ``layers`` maps each encoder layer to its reader (``hook_in``, ``input_site``, ``d_sae``,
    ``b_enc``, ``encoder_rows(idx)``, ``pre_activation(x)``, ``activation(x)``); a feature of
    encoder layer ``l`` writes the MLP outputs ``output_layers(l)`` (``l`` only, or ``l ..
    n_layers - 1`` for a cross-layer transcoder) with ``decoder_rows(l, idx)`` ``(n, n_out,
    d_model)``.  ``kind``, ``format`` and ``layers`` are read-only here (plain attributes in
    the implementations)."""

    @property
    def kind(self) -> Literal["per_layer", "cross_layer"]: ...

    @property
    def format(self) -> str: ...

    @property
    def layers(self) -> Mapping[int, Any]: ...

    #: where the dictionaries came from (the loaders record it; the graph's metadata shows it)
    source: dict[str, Any]

    def __contains__(self, layer: object) -> bool: ...

    def __getitem__(self, layer: int) -> Any: ...

    def __len__(self) -> int: ...

    def output_layers(self, layer: int) -> range: ...

    def decoder_rows(self, layer: int, idx: torch.Tensor) -> torch.Tensor: ...

    def decoder_bias(self, out_layer: int) -> torch.Tensor: ...

    def skip_weight(self, out_layer: int) -> torch.Tensor | None: ...

    def output_site(self, out_layer: int) -> str: ...

    def source_layers(self, out_layer: int) -> list[int]: ...

    def reconstruct_at(self, out_layer: int, acts: dict[int, torch.Tensor],
                       inputs: dict[int, torch.Tensor]) -> torch.Tensor: ...

    def reconstruct(self, acts: dict[int, torch.Tensor], inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]: ...

    def to(self, dtype: torch.dtype) -> Dictionary: ...

    def with_source(self, source: dict[str, Any]) -> Dictionary:
        """The same dictionary made with the source record ``source`` (the loaders of the spec's
        sources record where it came from this way; nothing is re-read)."""
        ...

    def describe(self) -> dict[str, Any]: ...


def require_dictionary(dictionaries: Dictionary | None, where: str) -> Dictionary:
    """``dictionaries``, or a :class:`~circuitgraph.errors.SpecError` saying that ``where`` (a
    feature or error unit, a feature node) needs the run's dictionaries and it has none."""
    if dictionaries is None:
        raise SpecError(f"{where} needs the run's dictionaries (the spec's transcoders:), and this run has none")
    return dictionaries
