"""Reading a features folder: DataFrames, one feature's dashboard, labels, a summary.

    >>> fd = open_features("out/demo_features")                       # doctest: +SKIP
    >>> fd.features.sort_values("density").tail()                     # doctest: +SKIP
    >>> fd.dashboard(1, 453)["examples"][0]["text"]                    # doctest: +SKIP

:meth:`FeatureDashboards.dashboard` is the one JSON form of a feature's dashboard that the
HTML report and the Neuronpedia export embed (and the explorer serves).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from circuitgraph.errors import LoadError
from circuitgraph.export.labels import load_feature_labels

__all__ = ["FEATURE_FILES", "FeatureDashboards", "open_features"]

#: the files a finished features run has written
FEATURE_FILES = ("features.json", "features.parquet", "examples.parquet")


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
        self.info: dict[str, Any] = json.loads((self.directory / "features.json").read_text(encoding="utf-8"))
        self._frames: dict[str, Any] = {}
        self._by_feature: dict[tuple[int, int], Any] | None = None
        labels = self.directory / "labels.csv"
        self.labels: dict[tuple[int, int], str] = load_feature_labels(labels) if labels.is_file() else {}

    def _frame(self, name: str) -> Any:
        if name not in self._frames:
            import pyarrow.parquet as pq

            self._frames[name] = pq.read_table(self.directory / f"{name}.parquet").to_pandas()
        return self._frames[name]

    @property
    def features(self) -> Any:
        """One row per feature (``features.parquet`` as a DataFrame)."""
        return self._frame("features")

    @property
    def examples(self) -> Any:
        """One row per top example (``examples.parquet`` as a DataFrame)."""
        return self._frame("examples")

    def __contains__(self, key: object) -> bool:
        return key in self._index()

    def _index(self) -> dict[tuple[int, int], Any]:
        if self._by_feature is None:
            df = self.features
            self._by_feature = {(int(l), int(i)): r for r, (l, i) in enumerate(zip(df["layer"], df["index"]))}
        return self._by_feature

    def dashboard(self, layer: int, index: int) -> dict[str, Any] | None:
        """One feature's dashboard as JSON values, or ``None`` when the folder has no such feature::

            {layer, index, label, n_tokens, n_active, density, max_activation, mean_active_activation,
             quantiles: {"q0.5": ...}, top_output_tokens, bottom_output_tokens, top_input_tokens,
             examples: [{rank, row_id, row, position, activation, tokens, start, activations, text}]}
        """
        row = self._index().get((int(layer), int(index)))
        if row is None:
            return None
        r = self.features.iloc[row]
        qcols = [c for c in self.features.columns if c.startswith("q")]
        out: dict[str, Any] = {"layer": int(layer), "index": int(index), "label": self.labels.get((layer, index), "")}
        for key in ("n_tokens", "n_active", "density", "max_activation", "mean_active_activation"):
            out[key] = _plain(r[key])
        out["quantiles"] = {c: _plain(r[c]) for c in qcols}
        for key in ("top_output_tokens", "bottom_output_tokens", "top_input_tokens"):
            out[key] = [_plain(dict(t)) for t in r[key]]
        sel = self._examples_of(int(layer), int(index))
        out["examples"] = [
            {"rank": int(e["rank"]), "row_id": str(e["row_id"]), "row": int(e["row"]), "position": int(e["position"]),
             "activation": float(e["activation"]), "tokens": [int(t) for t in e["tokens"]], "start": int(e["start"]),
             "activations": [float(a) for a in e["activations"]], "text": str(e["text"])}
            for _, e in sel.iterrows()]
        return out

    def _examples_of(self, layer: int, index: int) -> Any:
        """The example rows of one feature (the file is sorted by layer, index, rank)."""
        ex = self.examples
        if "_keys" not in self._frames:
            self._frames["_keys"] = ex["layer"].to_numpy(np.int64) * (1 << 32) + ex["index"].to_numpy(np.int64)
        keys = self._frames["_keys"]
        key = layer * (1 << 32) + index
        lo, hi = np.searchsorted(keys, key, side="left"), np.searchsorted(keys, key, side="right")
        return ex.iloc[lo:hi]

    def summary_lines(self, top: int = 10) -> list[str]:
        """A short report: what ran, densities, the most frequent and strongest features."""
        df = self.features
        info = self.info
        n = len(df)
        lines = [f"features {self.directory}: {n} features in layers {info.get('layers')} over {info.get('n_rows')} "
                 f"rows ({int(df['n_tokens'].iloc[0]) if n else 0} tokens); top_k {info.get('top_k')}, context "
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
        return lines

    def _line(self, r: Any) -> str:
        key = (int(r["layer"]), int(r["index"]))
        label = self.labels.get(key)
        first = self._examples_of(*key)
        text = str(first["text"].iloc[0]).replace("\n", "\\n") if len(first) else ""
        promoted = ", ".join(repr(t["token"]) for t in list(r["top_output_tokens"])[:3])
        return (f"  L{key[0]} #{key[1]}" + (f" ({label})" if label else "")
                + f": density {r['density']:.4g}, max {r['max_activation']:.4g}, mean {r['mean_active_activation']:.4g}"
                + f"; promotes {promoted}; top example: {text[:80]!r}")


def open_features(directory: str | Path) -> FeatureDashboards:
    """Open the output folder of a features run (``export: {features: DIR}``)."""
    return FeatureDashboards(directory)
