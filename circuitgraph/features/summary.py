"""Reading a features folder: DataFrames, one feature's dashboard, labels, a summary.

    >>> fd = open_features("out/demo_features")                       # doctest: +SKIP
    >>> fd.features.sort_values("density").tail()                     # doctest: +SKIP
    >>> fd.dashboard(1, 453)["examples"][0]["text"]                    # doctest: +SKIP

:meth:`FeatureDashboards.dashboard` is the one JSON form of a feature's dashboard that the
HTML report and the Neuronpedia export embed (and the explorer serves).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from circuitgraph._io import ParquetFrames, read_json_file
from circuitgraph.errors import LoadError
from circuitgraph.export.labels import load_feature_labels

__all__ = ["FEATURE_FILES", "FeatureDashboards", "open_features"]

#: the files a finished features run has written
FEATURE_FILES = ("features.json", "features.parquet", "examples.parquet")
#: the token-list columns a features or neurons folder may have
_TOKEN_COLUMNS = ("top_output_tokens", "bottom_output_tokens", "top_input_tokens", "top_gate_tokens")
#: an example's columns, and a head example's extra ones
_EXAMPLE_KEYS = ("rank", "row_id", "row", "position", "activation", "tokens", "start", "activations", "text")
_HEAD_KEYS = ("key_position", "attention", "score", "norm", "key_tokens", "key_start", "key_activations", "key_text")


def _plain(value: Any) -> Any:
    """numpy / pyarrow values as JSON values (NaN as None)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class FeatureDashboards:
    """A features run's output folder (see :func:`open_features`)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        missing = [name for name in FEATURE_FILES if not (self.directory / name).is_file()]
        if missing:
            raise LoadError(f"{self.directory} is not a finished features folder (missing {', '.join(missing)}); run "
                            "a spec with dataset:, features: and export: {features: DIR} to build it")
        self.info: dict[str, Any] = read_json_file(self.directory / "features.json", "features.json")
        self._frames = ParquetFrames(self.directory)
        #: the examples' ``(layer, index)`` keys, sorted (the file's order), for :meth:`_examples_of`
        self._example_keys: np.ndarray | None = None
        self._by_feature: dict[tuple[int, int], Any] | None = None
        #: what the rows are: ``features`` (transcoder features), ``neurons`` or ``heads``
        self.units: str = self.info.get("units", "features")
        labels = self.directory / "labels.csv"
        self.labels: dict[tuple[int, int], str] = load_feature_labels(labels) if labels.is_file() else {}


    @property
    def features(self) -> Any:
        """One row per feature (``features.parquet`` as a DataFrame)."""
        return self._frames["features"]

    @property
    def examples(self) -> Any:
        """One row per top example (``examples.parquet`` as a DataFrame)."""
        return self._frames["examples"]

    def __contains__(self, key: object) -> bool:
        return key in self._index()

    def _index(self) -> dict[tuple[int, int], Any]:
        """``(layer, index)`` -> the first of its rows in ``features.parquet`` (a head has one row
        per metric, consecutive)."""
        if self._by_feature is None:
            df = self.features
            self._by_feature = {}
            for r, (l, i) in enumerate(zip(df["layer"], df["index"], strict=False)):
                self._by_feature.setdefault((int(l), int(i)), r)
        return self._by_feature

    def _section(self, r: Any, examples: Any) -> dict[str, Any]:
        """One ``features.parquet`` row and its examples as JSON values."""
        out: dict[str, Any] = {}
        for key in ("n_tokens", "n_pairs", "n_active", "density", "max_activation", "mean_active_activation"):
            if key in r.index:
                out[key] = _plain(r[key])
        out["quantiles"] = {c: _plain(r[c]) for c in self.features.columns if c.startswith("q")}
        for key in _TOKEN_COLUMNS:
            if key in r.index:
                out[key] = [_plain(dict(t)) for t in r[key]]
        keys = _EXAMPLE_KEYS + (_HEAD_KEYS if "key_position" in examples.columns else ())
        out["examples"] = [{k: _plain(e[k]) for k in keys} for _, e in examples.iterrows()]
        for e in out["examples"]:
            e["row_id"] = str(e["row_id"])
        return out

    def dashboard(self, layer: int, index: int) -> dict[str, Any] | None:
        """One unit's dashboard as JSON values, or ``None`` when the folder has no such unit.
        A feature's or a neuron's::

            {units, layer, index, label, n_tokens, n_active, density, max_activation, mean_active_activation,
             quantiles: {"q0.5": ...}, top_output_tokens, bottom_output_tokens, top_input_tokens,
             (neurons of gated MLPs: top_gate_tokens),
             examples: [{rank, row_id, row, position, activation, tokens, start, activations, text}]}

        A head's: ``{units, layer, index, label, metrics: [{metric, n_pairs, n_active, ..., quantiles,
        examples: [{..., key_position, attention, score, norm, key_tokens, key_start,
        key_activations, key_text}]}]}``, one section per metric.
        """
        row = self._index().get((int(layer), int(index)))
        if row is None:
            return None
        out: dict[str, Any] = {"units": self.units, "layer": int(layer), "index": int(index),
                               "label": self.labels.get((layer, index), "")}
        sel = self._examples_of(int(layer), int(index))
        if self.units != "heads":
            out.update(self._section(self.features.iloc[row], sel))
            return out
        out["metrics"] = []
        df = self.features
        while row < len(df) and int(df["layer"].iloc[row]) == layer and int(df["index"].iloc[row]) == index:
            r = df.iloc[row]
            metric = str(r["metric"])
            out["metrics"].append({"metric": metric, **self._section(r, sel[sel["metric"] == metric])})
            row += 1
        return out

    def _examples_of(self, layer: int, index: int) -> Any:
        """The example rows of one feature (the file is sorted by layer, index, rank)."""
        ex = self.examples
        if self._example_keys is None:
            self._example_keys = ex["layer"].to_numpy(np.int64) * (1 << 32) + ex["index"].to_numpy(np.int64)
        keys = self._example_keys
        key = layer * (1 << 32) + index
        lo, hi = np.searchsorted(keys, key, side="left"), np.searchsorted(keys, key, side="right")
        return ex.iloc[lo:hi]

    def summary_lines(self, top: int = 10) -> list[str]:
        """A short report: what ran, densities, the most frequent and strongest features."""
        df = self.features
        info = self.info
        n = len(df)
        seen = "n_pairs" if "n_pairs" in df.columns else "n_tokens"
        word = {"features": "features", "neurons": "neurons", "heads": "head rankings (head x metric)"}[self.units]
        lines = [f"features {self.directory}: {n} {word} in layers {info.get('layers')} over {info.get('n_rows')} "
                 f"rows ({int(df[seen].iloc[0]) if n else 0} {seen[2:]}); top_k {info.get('top_k')}, context "
                 f"{info.get('context')}; {len(self.examples)} examples"]
        if n:
            alive = df[df["n_active"] > 0]
            lines.append(f"active at least once: {len(alive)} of {n} features; density median "
                         f"{alive['density'].median() if len(alive) else 0:.4g}, max "
                         f"{df['density'].max():.4g}")
            if self.labels:
                lines.append(f"labels: {len(self.labels)} from labels.csv")
            shown = alive.sort_values(["density", "layer", "index"], ascending=[False, True, True], kind="stable")
            lines.append("most frequent features:")
            lines += [self._line(r) for _, r in shown.head(top).iterrows()]
            shown = alive.sort_values(["max_activation", "layer", "index"], ascending=[False, True, True],
                                      kind="stable")
            lines.append("strongest features (max activation):")
            lines += [self._line(r) for _, r in shown.head(top).iterrows()]
        if self.units != "features":
            lines = lines[:1] + [line.replace(" features", f" {self.units}") for line in lines[1:]]
        return lines

    def _line(self, r: Any) -> str:
        key = (int(r["layer"]), int(r["index"]))
        label = self.labels.get(key)
        first = self._examples_of(*key)
        if "metric" in r.index:
            first = first[first["metric"] == r["metric"]]
        text = str(first["text"].iloc[0]).replace("\n", "\\n") if len(first) else ""
        promoted = ", ".join(repr(t["token"]) for t in list(r["top_output_tokens"])[:3]) \
            if "top_output_tokens" in r.index else ""
        return (f"  L{key[0]} #{key[1]}" + (f" {r['metric']}" if "metric" in r.index else "")
                + (f" ({label})" if label else "")
                + f": density {r['density']:.4g}, max {r['max_activation']:.4g}, mean {r['mean_active_activation']:.4g}"
                + (f"; promotes {promoted}" if promoted else "") + f"; top example: {text[:80]!r}")


def open_features(directory: str | Path) -> FeatureDashboards:
    """Open the output folder of a features run (``export: {features: DIR}``)."""
    return FeatureDashboards(directory)
