"""Feature descriptions for diagrams: ``(layer, index) -> label`` from a file.

Accepted files:

* CSV with a header naming ``layer``, ``index`` (or ``feature``) and ``label`` (or
  ``description`` / ``explanation``);
* JSON: a list of objects with those keys, or ``{"explanations": [...]}``; this covers
  Neuronpedia's explanation exports, whose ``layer`` is a source id such as ``"6-res-jb"``
  or ``"6-transcoder-hp"`` (the leading number is the layer) and whose ``index`` is a string.

Every row must name a layer, an index and a non-empty label; the first bad row is reported
with its number and the fix.

A features folder (``export: {features: DIR}``, docs/features.md) may hold ``DIR/labels.csv``:
giving the folder reads that file.  :func:`apply_feature_labels` puts labels on a graph's
nodes (``label`` and ``attrs["description"]``), so every diagram, report table and export
made from the graph names them.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitgraph._io import read_json_file, read_text_file
from circuitgraph.errors import ExportError, LoadError
from circuitgraph.spec.kinds import ACTIVATION_KINDS

if TYPE_CHECKING:
    from circuitgraph.graph.graph import AttributionGraph

__all__ = ["load_feature_labels", "apply_feature_labels", "LABELS_FILE"]

#: the labels file of a features folder
LABELS_FILE = "labels.csv"

_INDEX_KEYS = ("index", "feature", "feature_index")
_LABEL_KEYS = ("label", "description", "explanation", "clerp")


def load_feature_labels(path: str | os.PathLike[str]) -> dict[tuple[int, int], str]:
    """Read a descriptions file (see the module docstring); later rows win over earlier ones."""
    p = Path(path)
    if p.is_dir():
        if not (p / LABELS_FILE).is_file():
            raise ExportError(f"feature labels: the folder {p} has no {LABELS_FILE}; add one (layer,index,label) or "
                              "give a labels file")
        p = p / LABELS_FILE
    if not p.is_file():
        raise ExportError(f"feature labels file not found: {p}; give a CSV or JSON of layer, index, label")
    if p.suffix.lower() == ".csv":
        try:
            text = read_text_file(p, "feature labels file")
        except LoadError as exc:
            raise ExportError(str(exc)) from None
        rows: Iterable[Mapping[str, Any]] = list(csv.DictReader(text.splitlines()))
    else:
        try:
            data = read_json_file(p, "feature labels file")
        except LoadError as exc:
            raise ExportError(f"feature labels file {p} is not valid JSON ({exc}); give a CSV or a JSON list") from None
        if isinstance(data, Mapping) and isinstance(data.get("explanations"), list):
            data = data["explanations"]
        if not isinstance(data, list):
            raise ExportError(f"feature labels file {p}: expected a list of {{layer, index, label}} objects")
        rows = data
    out: dict[tuple[int, int], str] = {}
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise ExportError(f"feature labels file {p}, row {i}: expected an object with layer, index, label")
        keys = {str(k).strip().lower(): v for k, v in row.items()}
        layer = _layer(keys.get("layer"))
        index = next((keys[k] for k in _INDEX_KEYS if keys.get(k) not in (None, "")), None)
        label = next((keys[k] for k in _LABEL_KEYS if keys.get(k) not in (None, "")), None)
        try:
            index = int(str(index).strip()) if index is not None else None
        except ValueError:
            index = None
        if layer is None or index is None or not isinstance(label, str) or not label.strip():
            raise ExportError(
                f"feature labels file {p}, row {i}: needs a layer (a number, or a source id starting with "
                f"one), an index and a non-empty label; got {dict(row)!r}"
            )
        out[(layer, index)] = label.strip()
    return out


def _layer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = re.match(r"\s*(-?\d+)", str(value)) if value is not None else None
    return int(match.group(1)) if match else None


def apply_feature_labels(graph: AttributionGraph, labels: Mapping[tuple[int, int], str],
                         kinds: Collection[str] = ACTIVATION_KINDS) -> int:
    """Label the nodes of ``kinds`` whose ``(layer, index)`` has a label, in place: ``node.label``
    (drawn by the diagrams, the Neuronpedia ``clerp``) and ``node.attrs["description"]`` (what
    report tables and path listings show next to the id).  Returns how many nodes were labelled."""
    n = 0
    for node in graph.nodes:
        if node.kind in kinds:
            text = labels.get((node.layer, node.index))
            if text:
                node.label = str(text)
                node.attrs["description"] = str(text)
                n += 1
    return n
