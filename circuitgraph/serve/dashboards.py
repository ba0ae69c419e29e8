"""Read a feature-dashboards folder (``export: {features: DIR}``) for the explorer.

The folder holds (docs/explorer.md, "Feature dashboards"):

* ``features.parquet``: one row per ``(layer, index)``: ``n_tokens``, ``n_active``, ``density``,
  ``max_activation``, ``mean_active_activation``, the activation quantiles (columns ``q0.5``,
  ``q0.99``...), and ``top_output_tokens`` / ``bottom_output_tokens`` / ``top_input_tokens``
  (lists of ``{token, token_id, value}``);
* ``examples.parquet``: the top activating tokens of each feature, one row each: ``layer,
  index, rank, row_id, position, activation, tokens, text`` (``text``: the decoded context with
  the activating token between ``«`` and ``»``), and optionally ``row``, ``start``,
  ``activations``;
* ``labels.csv`` (optional): ``layer, index, label``;
* ``features.json`` (optional here): ``units`` says what the rows are: ``features`` (the
  default), ``neurons`` or ``heads``.  A heads folder has a row per (head, ``metric``) and
  examples with ``key_position``, ``attention``, ``score``, ``norm`` and the key's window; its
  dashboard has one section per metric.

Every column but ``layer`` and ``index`` is optional: what a folder lacks is left out of the
dashboards.  The tables are read once (pyarrow, the ``dataset`` extra) and indexed by
``(layer, index)``; a dashboard is plain JSON.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitgraph._io import read_json_file
from circuitgraph.errors import LoadError
from circuitgraph.export.labels import load_feature_labels
from circuitgraph.spec.features import UNIT_NODE_KINDS

__all__ = ["FeatureDashboards", "folder_units", "is_features_folder", "split_marked_text", "FEATURES_FILE",
           "EXAMPLES_FILE", "LABELS_FILE", "UNITS_OF_NODE_KIND"]

FEATURES_FILE = "features.parquet"
EXAMPLES_FILE = "examples.parquet"
LABELS_FILE = "labels.csv"

#: the columns of features.parquet a dashboard shows as numbers (when present)
STAT_COLUMNS = ("n_tokens", "n_pairs", "n_active", "density", "max_activation", "mean_active_activation")
#: the token-list columns of features.parquet
TOKEN_COLUMNS = ("top_output_tokens", "bottom_output_tokens", "top_input_tokens", "top_gate_tokens")
#: the columns of examples.parquet a dashboard passes on (when present)
EXAMPLE_COLUMNS = ("rank", "row_id", "row", "position", "start", "activation", "tokens", "activations", "text",
                   "key_position", "attention", "score", "norm", "key_tokens", "key_start", "key_activations",
                   "key_text")
#: the folder units whose dashboards a graph node of each kind has (the spec's units, inverted)
UNITS_OF_NODE_KIND = {kind: units for units, kind in UNIT_NODE_KINDS.items()}
_QUANTILE = re.compile(r"^q(\d+(\.\d+)?|\.\d+)$")
#: pairs of markers around the activating token in an example's ``text``, tried in order
TEXT_MARKERS = (("«", "»"), ("⟦", "⟧"), ("[[", "]]"), ("<<", ">>"))


def is_features_folder(path: Path) -> bool:
    """A folder with a ``features.parquet``."""
    return path.is_dir() and (path / FEATURES_FILE).is_file()


def folder_units(path: Path) -> str:
    """What a features folder's rows are (``features.json``'s ``units``; ``features`` when it
    does not say)."""
    try:
        info = read_json_file(path / "features.json", "features.json")
    except LoadError:
        return "features"
    units = info.get("units") if isinstance(info, dict) else None
    return units if units in ("features", "neurons", "heads") else "features"


def split_marked_text(text: str) -> dict[str, str] | None:
    """``{"before", "token", "after"}`` of an example's text whose activating token is marked
    (``«token»``, or one of the other :data:`TEXT_MARKERS`); None when no marker is found."""
    for left, right in TEXT_MARKERS:
        start = text.find(left)
        if start < 0:
            continue
        end = text.find(right, start + len(left))
        if end < 0:
            continue
        return {"before": text[:start], "token": text[start + len(left):end], "after": text[end + len(right):]}
    return None


def _plain(value: Any) -> Any:
    """A pyarrow/numpy value as JSON types (non-finite floats become None)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if hasattr(value, "item"):
        return _plain(value.item())
    return value


@dataclass
class FeatureDashboards:
    """The dashboards of one features folder, indexed by ``(layer, index)``."""

    directory: Path
    stats: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    examples: dict[tuple[int, int], list[dict[str, Any]]] = field(default_factory=dict)
    labels: dict[tuple[int, int], str] = field(default_factory=dict)
    quantile_columns: tuple[str, ...] = ()
    units: str = "features"
    #: heads: per (layer, index), the metrics in the file's order (its rows' ``metric``)
    metrics: dict[tuple[int, int], list[str]] = field(default_factory=dict)

    @classmethod
    def open(cls, directory: str | Path) -> FeatureDashboards:
        """Read ``directory`` (see the module docstring); :class:`LoadError` naming what is wrong."""
        directory = Path(directory)
        if not is_features_folder(directory):
            raise LoadError(f"{directory} is not a features folder (no {FEATURES_FILE}); give the folder a "
                            "features run wrote")
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise LoadError("reading feature dashboards needs pyarrow: pip install 'circuitgraph-lm[dataset]'") from None
        out = cls(directory, units=folder_units(directory))
        table = _read(pq, directory / FEATURES_FILE)
        columns = table.column_names
        _require(columns, ("layer", "index"), directory / FEATURES_FILE)
        heads = out.units == "heads" and "metric" in columns
        out.quantile_columns = tuple(sorted((c for c in columns if _QUANTILE.match(c)), key=lambda c: float(c[1:])))
        keep = [c for c in (*STAT_COLUMNS, *out.quantile_columns, *TOKEN_COLUMNS) if c in columns]
        for row in table.select(["layer", "index", *keep, *(["metric"] if heads else [])]).to_pylist():
            key = (int(row["layer"]), int(row["index"]))
            record = {c: _plain(row[c]) for c in keep}
            if heads:  # a head's stats: {metric: stats}
                out.stats.setdefault(key, {})[str(row["metric"])] = record
                out.metrics.setdefault(key, []).append(str(row["metric"]))
            else:
                out.stats[key] = record
        if (directory / EXAMPLES_FILE).is_file():
            ex = _read(pq, directory / EXAMPLES_FILE)
            _require(ex.column_names, ("layer", "index"), directory / EXAMPLES_FILE)
            keep_ex = [c for c in (*EXAMPLE_COLUMNS, *(["metric"] if heads else [])) if c in ex.column_names]
            for row in ex.select(["layer", "index", *keep_ex]).to_pylist():
                record = {c: _plain(row[c]) for c in keep_ex}
                if isinstance(record.get("text"), str):
                    record["marked"] = split_marked_text(record["text"])
                out.examples.setdefault((int(row["layer"]), int(row["index"])), []).append(record)
            for rows in out.examples.values():
                rows.sort(key=lambda r: (str(r.get("metric", "")), r.get("rank") if isinstance(r.get("rank"), int)
                                         else 0))
        if (directory / LABELS_FILE).is_file():
            out.labels = load_feature_labels(directory / LABELS_FILE)
        return out

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self.stats or key in self.examples or key in self.labels

    def layers(self) -> dict[int, int]:
        """``{layer: number of features}`` of the folder."""
        counts: dict[int, int] = {}
        for layer, _ in sorted(set(self.stats) | set(self.examples)):
            counts[layer] = counts.get(layer, 0) + 1
        return counts

    def listing(self, layer: int, offset: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        """The features of ``layer`` by index, ``limit`` from ``offset``: index, label and the
        numbers a list shows (density, max_activation, n_active when present)."""
        keys = sorted(k for k in set(self.stats) | set(self.examples) if k[0] == layer)[offset:offset + limit]
        out = []
        for key in keys:
            stats = self.stats.get(key, {})
            out.append({"layer": key[0], "index": key[1], "label": self.labels.get(key, ""),
                        **{c: stats[c] for c in ("density", "max_activation", "n_active") if c in stats}})
        return out

    def label(self, layer: int, index: int) -> str:
        return self.labels.get((layer, index), "")

    def dashboard(self, layer: int, index: int, *, max_examples: int | None = None) -> dict[str, Any] | None:
        """The dashboard of feature ``index`` of ``layer`` (None when the folder has nothing on it)."""
        key = (int(layer), int(index))
        if key not in self:
            return None
        examples = self.examples.get(key, [])
        if self.units == "heads" and key in self.metrics:
            sections = []
            for metric in self.metrics[key]:
                stats = dict(self.stats[key][metric])
                mine = [e for e in examples if e.get("metric") == metric]
                sections.append({"metric": metric, "stats": {c: stats.pop(c) for c in STAT_COLUMNS if c in stats},
                                 "quantiles": {c: stats.pop(c) for c in self.quantile_columns if c in stats},
                                 "examples": mine if max_examples is None else mine[:max_examples],
                                 "n_examples": len(mine)})
            return {"units": "heads", "layer": key[0], "index": key[1], "label": self.labels.get(key, ""),
                    "metrics": sections, "source": self.directory.name}
        stats = dict(self.stats.get(key, {}))
        return {
            "units": self.units,
            "layer": key[0],
            "index": key[1],
            "label": self.labels.get(key, ""),
            "stats": {c: stats.pop(c) for c in STAT_COLUMNS if c in stats},
            "quantiles": {c: stats.pop(c) for c in self.quantile_columns if c in stats},
            "tokens": {c: stats.pop(c) for c in TOKEN_COLUMNS if c in stats},
            "examples": examples if max_examples is None else examples[:max_examples],
            "n_examples": len(examples),
            "source": self.directory.name,
        }


def _read(pq: Any, path: Path) -> Any:
    try:
        return pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError and others: one LoadError
        raise LoadError(f"cannot read {path}: {' '.join(str(exc).split())[:300]}") from None


def _require(columns: list[str], needed: tuple[str, ...], path: Path) -> None:
    missing = [c for c in needed if c not in columns]
    if missing:
        raise LoadError(f"{path} lacks the column(s) {', '.join(missing)}; it needs one row per (layer, index)")
