"""Every place a spec names a unit by its index: a feature, an MLP neuron or an attention head.

:func:`unit_references` walks a loaded spec (targets, queries, checks, steering, the features
section: every model it holds) and yields one :class:`UnitReference` per index it names:

* ``feature`` / ``neuron`` targets (``{layer, position, index}``);
* node ids ``kind/layer/position/index`` (a ``node``, ``source`` or ``target`` field, and the
  ``id`` list of a node filter);
* node filters with a ``kind`` and an ``index`` (each kind of the filter, each index, the
  filter's layer range or every layer);
* ``{kind, layer, index}`` units and ``{layer, head}`` heads (``de_embedding``), ``qk``'s
  ``layer`` and ``head`` (one or a list).

The preflight checks (:mod:`circuitgraph.pipeline.preflight`) compare them with the sizes the
model's ``config.json`` and the dictionaries' config files state, before any weights are read.
Only the spec is read here (no files, no torch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel

from circuitgraph.spec.filters import NodeFilter
from circuitgraph.spec.queries import QK, HeadRef, UnitRef
from circuitgraph.spec.targets import FeatureTarget, NeuronTarget

__all__ = ["UnitReference", "unit_references", "UNIT_KINDS"]

#: the node kinds whose index counts units of a layer (features, MLP neurons, attention heads)
UNIT_KINDS: tuple[str, ...] = ("feature", "neuron", "attention_head")
_ID_FIELDS = ("node", "source", "target")


@dataclass(frozen=True)
class UnitReference:
    """One unit the spec names: ``where`` (the spec location), ``kind`` (one of :data:`UNIT_KINDS`),
    ``layers`` (the layer, or the layers a filter ranges over; ``None``: every layer) and ``index``."""

    where: str
    kind: str
    layers: tuple[int, int] | None
    index: int


def _parse_id(text: str) -> tuple[str, int, int] | None:
    """``(kind, layer, index)`` of a node id of a unit kind, else None (not an id, or another kind)."""
    parts = text.split("/")
    if len(parts) != 4 or parts[0] not in UNIT_KINDS:
        return None
    try:
        return parts[0], int(parts[1]), int(parts[3])
    except ValueError:
        return None


def _of_filter(f: NodeFilter, where: str) -> Iterator[UnitReference]:
    ids = f.id or ()
    for j, text in enumerate(ids):
        parsed = _parse_id(text)
        if parsed is not None:
            kind, layer, index = parsed
            yield UnitReference(f"{where}.id[{j}]" if len(ids) > 1 else f"{where}.id", kind, (layer, layer), index)
    if f.index is None or f.kind is None:
        return  # an index without a kind may be any kind's: nothing to compare it with
    for kind in f.kind:
        if kind in UNIT_KINDS:
            for index in f.index:
                yield UnitReference(f"{where}.index", kind, f.layer, index)


def _of_model(obj: BaseModel, where: str) -> Iterator[UnitReference]:
    if isinstance(obj, NodeFilter):
        yield from _of_filter(obj, where)
        return
    if isinstance(obj, (FeatureTarget, NeuronTarget)):
        kind = "feature" if isinstance(obj, FeatureTarget) else "neuron"
        loc = getattr(obj, kind)
        yield UnitReference(f"{where}.{kind}.index", kind, (loc.layer, loc.layer), loc.index)
        return
    if isinstance(obj, UnitRef):
        yield UnitReference(f"{where}.index", obj.kind, (obj.layer, obj.layer), obj.index)
        return
    if isinstance(obj, HeadRef):
        yield UnitReference(f"{where}.head", "attention_head", (obj.layer, obj.layer), obj.head)
        return
    if isinstance(obj, QK):
        heads = (obj.head,) if isinstance(obj.head, int) else tuple(obj.head)
        for h in heads:
            yield UnitReference(f"{where}.head", "attention_head", (obj.layer, obj.layer), h)
        return
    for field in type(obj).model_fields:
        value = getattr(obj, field)
        if field in _ID_FIELDS and isinstance(value, str):
            parsed = _parse_id(value)
            if parsed is not None:
                kind, layer, index = parsed
                yield UnitReference(f"{where}.{field}", kind, (layer, layer), index)
            continue
        yield from _walk(value, f"{where}.{field}" if where else field)


def _walk(value: object, where: str) -> Iterator[UnitReference]:
    if isinstance(value, BaseModel):
        yield from _of_model(value, where)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _walk(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{where}.{key}")


def unit_references(spec: BaseModel) -> list[UnitReference]:
    """Every feature, neuron and head index ``spec`` names (see the module docstring)."""
    return list(_walk(spec, ""))
