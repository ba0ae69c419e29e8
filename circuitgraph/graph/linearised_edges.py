"""Edges kept apart from a graph's exact edges: the linearised query and key edges into heads.

A graph built with ``graph: {component_inputs: true, head_inputs: [value, query, key]}`` holds,
besides its exact edges (the value edges into heads among them), a head's query and key edges:
first-order effects at the prompt (docs/maths.md, section 11).  They are not part of the
adjacency that completeness, influence, pruning and ``top_paths`` use; they travel with the
graph through pruning and subgraphs (between kept nodes) and into the exports, each one
labelled with its kind and ``linearised: true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["LinearisedEdges", "LINEARISED_EDGE_KINDS", "LINEARISED_ATTRS"]

#: the kinds, in the order of their codes (``LinearisedEdges.kind``)
LINEARISED_EDGE_KINDS = ("query", "key")
#: the node attributes (:data:`~circuitgraph.graph.nodes.NodeAttrs`) that carry each kind's per-head
#: sums with the nodes (and so through a graph file): ``kind -> (total's key, constant's key)``
LINEARISED_ATTRS: dict[str, tuple[Literal["query_total", "key_total"], Literal["query_constant", "key_constant"]]] = {
    "query": ("query_total", "query_constant"),
    "key": ("key_total", "key_constant"),
}


@dataclass
class LinearisedEdges:
    """Coordinate arrays like the graph's own (rows of its node list) plus each edge's kind code
    (an index into :data:`LINEARISED_EDGE_KINDS`).  ``totals[kind][row]``: what the edges of that
    kind into head ``row`` sum to with ``constants[kind][row]`` (``sum_s dT/da_s a_s``)."""

    target: np.ndarray
    source: np.ndarray
    weight: np.ndarray
    kind: np.ndarray
    constants: dict[str, dict[int, float]]
    totals: dict[str, dict[int, float]]

    def __post_init__(self) -> None:
        self.target = np.asarray(self.target, dtype=np.int64)
        self.source = np.asarray(self.source, dtype=np.int64)
        self.weight = np.asarray(self.weight, dtype=np.float64)
        self.kind = np.asarray(self.kind, dtype=np.int8)
        if not (self.target.shape == self.source.shape == self.weight.shape == self.kind.shape):
            raise ValueError("linearised edge arrays must have the same length")

    @classmethod
    def from_kinds(cls, edges: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                   constants: dict[str, dict[int, float]], totals: dict[str, dict[int, float]]) -> LinearisedEdges:
        """From ``kind -> (target, source, weight)``."""
        kinds = [k for k in LINEARISED_EDGE_KINDS if k in edges]
        return cls(np.concatenate([edges[k][0] for k in kinds]) if kinds else np.zeros(0),
                   np.concatenate([edges[k][1] for k in kinds]) if kinds else np.zeros(0),
                   np.concatenate([edges[k][2] for k in kinds]) if kinds else np.zeros(0),
                   np.concatenate([np.full(len(edges[k][0]), LINEARISED_EDGE_KINDS.index(k)) for k in kinds])
                   if kinds else np.zeros(0), dict(constants), dict(totals))

    def __len__(self) -> int:
        return int(self.target.size)

    @property
    def kinds(self) -> list[str]:
        """The kinds this graph has (asked for), whether or not any edge of them is left."""
        return [k for k in LINEARISED_EDGE_KINDS if k in self.totals]

    def kind_names(self) -> np.ndarray:
        """Each edge's kind as a string."""
        return np.asarray(LINEARISED_EDGE_KINDS, dtype=object)[self.kind]

    def remap(self, new_row: np.ndarray, source_row: np.ndarray | None = None) -> LinearisedEdges:
        """The edges into kept heads, renumbered by ``new_row`` (old row -> new row, -1 when
        dropped); their sources by ``source_row`` (default ``new_row``: edges from dropped nodes are
        dropped; pruning maps a dropped writer to its remainder node, and edges that meet there are
        summed, so each head's sums still hold).  The per-head sums follow their heads."""
        nr = np.asarray(new_row, dtype=np.int64)
        sr = nr if source_row is None else np.asarray(source_row, dtype=np.int64)
        keep = (nr[self.target] >= 0) & (sr[self.source] >= 0) if len(self) else np.zeros(0, dtype=bool)
        t, s, w, k = nr[self.target[keep]], sr[self.source[keep]], self.weight[keep], self.kind[keep]
        if source_row is not None and t.size:  # several dropped writers may share a remainder: sum them
            key = np.stack([k.astype(np.int64), t, s], axis=1)
            uniq, inv = np.unique(key, axis=0, return_inverse=True)
            w = np.bincount(inv.reshape(-1), weights=w, minlength=len(uniq))
            k, t, s = uniq[:, 0].astype(np.int8), uniq[:, 1], uniq[:, 2]

        def rows(d: dict[int, float]) -> dict[int, float]:
            return {int(nr[r]): v for r, v in d.items() if r < nr.size and nr[r] >= 0}

        return LinearisedEdges(t, s, w, k, {kk: rows(v) for kk, v in self.constants.items()},
                               {kk: rows(v) for kk, v in self.totals.items()})

    def max_violation(self) -> float:
        """The largest ``|total - (sum of edges + constant)|`` over heads and kinds, relative to
        ``max(|total|, sum |edges|, |constant|, 1e-12)`` (the identity of each kind, checked on build)."""
        worst = 0.0
        for code, kind in enumerate(LINEARISED_EDGE_KINDS):
            totals = self.totals.get(kind)
            if not totals:
                continue
            m = self.kind == code
            n = max(max(totals) + 1, int(self.target[m].max(initial=-1)) + 1)
            s = np.bincount(self.target[m], weights=self.weight[m], minlength=n)
            a = np.bincount(self.target[m], weights=np.abs(self.weight[m]), minlength=n)
            for row, total in totals.items():
                c = self.constants[kind].get(row, 0.0)
                scale = max(abs(total), a[row], abs(c), 1e-12)
                worst = max(worst, abs(total - s[row] - c) / scale)
        return worst

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready columns (rows of the graph's node list)."""
        return {"target": self.target.tolist(), "source": self.source.tolist(), "weight": self.weight.tolist(),
                "kind": self.kind_names().tolist(),
                "constants": {k: {str(r): v for r, v in d.items()} for k, d in self.constants.items()},
                "totals": {k: {str(r): v for r, v in d.items()} for k, d in self.totals.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinearisedEdges:
        """Inverse of :meth:`to_dict`."""
        codes = [LINEARISED_EDGE_KINDS.index(k) for k in d.get("kind", [])]
        return cls(np.asarray(d.get("target", []), dtype=np.int64), np.asarray(d.get("source", []), dtype=np.int64),
                   np.asarray(d.get("weight", []), dtype=np.float64), np.asarray(codes, dtype=np.int8),
                   {k: {int(r): float(v) for r, v in m.items()} for k, m in d.get("constants", {}).items()},
                   {k: {int(r): float(v) for r, v in m.items()} for k, m in d.get("totals", {}).items()})
