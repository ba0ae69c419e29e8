"""Comparing two graphs: nodes and edges matched by identity, with what changed.

:func:`diff_graphs` puts two graphs side by side (two prompts of a task, a clean and a
corrupted prompt, two checkpoints or dictionaries, or dataset aggregates):

* **nodes** are matched by a key (``match``):

  - ``position`` (default): ``(kind, layer, position, index)``, the node id itself;
  - ``from_end``: ``(kind, layer, position - n_positions, index)``: positions counted from the
    prompt's end (``-1`` is the last token), so prompts of different lengths line up at the end;
  - ``identity``: ``(kind, layer, index)``, position-free as in dataset aggregation
    (:mod:`circuitgraph.datasets.reduce`): a node's values are summed over its positions;

  each key has its ``token`` (the token string of an embedding or logit), ``activation``,
  ``influence`` (circuit-tracer's influence on the targets,
  :func:`~circuitgraph.queries.influence.node_influence`: unsigned; an aggregate's mean
  influence) and ``effect`` (the *signed* exact total effect on the weighted targets,
  :func:`~circuitgraph.queries.influence.total_effects`; an aggregate's mean direct effect: its
  mean edges into the targets times their weights) in ``a`` and ``b`` (0 where absent), their
  differences ``b - a``, ``sign_flip`` (the effect is non-zero in both with opposite signs) and
  ``present`` (``both``, ``a`` or ``b``);
* **edges** are matched by their (source key, target key), weights summed over merged
  positions: ``weight_a``, ``weight_b``, ``difference = weight_b - weight_a``, ``sign_flip``,
  ``present``, ranked by ``|difference|``;
* the **top changes** are the nodes ranked by the size of their signed change,
  ``|effect_b - effect_a|`` (or sign flips first, ``sort="flip"``): a node whose effect goes from
  +2.6 to -2.9 is a change of -5.5, where its unsigned influence barely moves.

Graphs of different models or dictionaries (from their metadata) are refused unless
``allow_different``; a dataset aggregate records neither, so it is not checked (``notes``
says so).

    >>> d = diff_graphs(clean, corrupted)                   # doctest: +SKIP
    >>> d.top_changes(5)                                    # doctest: +SKIP
    >>> d.only_in_a(), d.edges                              # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from circuitgraph._io import atomic_write_text
from circuitgraph.errors import QueryError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.queries._base import format_table
from circuitgraph.queries._sparse import target_weight_vector
from circuitgraph.queries.influence import node_influence, total_effects

__all__ = ["Match", "MATCHES", "Sort", "SORTS", "GraphDiff", "diff_graphs", "graph_identity", "sign_flips"]

Match = Literal["position", "identity", "from_end"]
MATCHES: tuple[str, ...] = ("position", "identity", "from_end")
#: how changes are ranked: by ``|b - a|``, or sign flips first (then by ``|b - a|``)
Sort = Literal["change", "flip"]
SORTS: tuple[str, ...] = ("change", "flip")
_KEY = ("kind", "layer", "position", "index")


def graph_identity(graph: AttributionGraph) -> dict[str, Any] | None:
    """``{model, dictionaries}`` from a graph's metadata, or ``None`` when it records neither
    (a dataset aggregate)."""
    model, tcs = graph.metadata.model, graph.metadata.transcoders
    if model is None:
        return None
    dictionaries = None
    if tcs is not None:
        dictionaries = {"format": tcs.get("format"), "source": tcs.get("source"),
                        "kind": tcs.get("kind")}
    return {"model": model.get("name"), "n_layers": model.get("n_layers"), "dictionaries": dictionaries}


def _aggregate_position(graph: AttributionGraph) -> str | None:
    agg = graph.metadata.aggregate
    return agg.get("position") if agg is not None else None


def _n_positions(graph: AttributionGraph) -> int:
    tokens = graph.metadata.prompt_tokens
    if tokens:
        return len(tokens)
    return max((n.position for n in graph.nodes), default=-1) + 1


def _positions(graph: AttributionGraph, match: str, which: str) -> np.ndarray | None:
    """Each node's key position (``None`` column for identity)."""
    agg = _aggregate_position(graph)
    pos = np.fromiter((n.position for n in graph.nodes), dtype=np.int64, count=graph.n_nodes)
    if match == "identity":
        return None
    if agg == "free":
        raise QueryError(f"graph {which} is a position-free dataset aggregate (aggregate: {{position: free}}); "
                         "compare it with match='identity'")
    if agg == "from_end":
        if match == "position":
            raise QueryError(f"graph {which} is a dataset aggregate by position from the end; compare it with "
                             "match='from_end' or 'identity'")
        return pos  # already -1 - position_from_end
    if match == "from_end":
        return pos - _n_positions(graph)
    return pos


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:  # pragma: no cover - pandas is in the notebook, dataset and test extras
        raise QueryError("comparing graphs needs pandas: pip install 'circuitgraph-lm[notebook]'") from None
    return pandas


def sign_flips(a: Any, b: Any) -> Any:
    """Where ``a`` and ``b`` are both non-zero with opposite signs (arrays or pandas columns)."""
    return (np.sign(a) * np.sign(b)) < 0


def _direct_effects(graph: AttributionGraph) -> np.ndarray:
    """Each node's edges into the targets times the targets' weights (a dataset aggregate's mean
    direct effect: its edges are mean weights)."""
    w = target_weight_vector(graph)
    tgt, src = np.asarray(graph.edge_target), np.asarray(graph.edge_source)
    return np.bincount(src, weights=np.asarray(graph.edge_weight, dtype=np.float64) * w[tgt],
                       minlength=graph.n_nodes)


def _frames(graph: AttributionGraph, match: str, which: str) -> tuple[Any, Any]:
    pd = _pandas()
    pos = _positions(graph, match, which)
    n = graph.n_nodes
    aggregate = graph.metadata.aggregate is not None
    stored = [nd.attrs.get("influence") for nd in graph.nodes]
    if aggregate and all(value is not None for value in stored):
        influence = np.asarray(stored, dtype=np.float64)
    else:
        influence = node_influence(graph) if graph.targets and n else np.zeros(n)
    if not (graph.targets and n):
        effect = np.zeros(n)
    elif aggregate:
        effect = _direct_effects(graph)
    else:
        weights = np.array([wt for _, wt in graph.targets], dtype=np.float64)
        effect = weights @ total_effects(graph)
    nodes = pd.DataFrame({
        "kind": [nd.kind for nd in graph.nodes],
        "layer": [nd.layer for nd in graph.nodes],
        "position": pos if pos is not None else np.full(n, -(10**9), dtype=np.int64),
        "index": [nd.index for nd in graph.nodes],
        "activation": np.asarray([nd.activation for nd in graph.nodes], dtype=np.float64),
        "influence": np.asarray(influence, dtype=np.float64),
        "effect": np.asarray(effect, dtype=np.float64),
        "token": [str(nd.attrs.get("token_str", "")) for nd in graph.nodes],
    })
    node_sums = nodes.groupby(list(_KEY), sort=False, as_index=False).agg(
        activation=("activation", "sum"), influence=("influence", "sum"), effect=("effect", "sum"),
        token=("token", "first"))
    src, tgt = np.asarray(graph.edge_source), np.asarray(graph.edge_target)
    edges = pd.DataFrame({
        **{f"source_{c}": nodes[c].to_numpy()[src] for c in _KEY},
        **{f"target_{c}": nodes[c].to_numpy()[tgt] for c in _KEY},
        "weight": np.asarray(graph.edge_weight, dtype=np.float64),
    })
    keys = [f"source_{c}" for c in _KEY] + [f"target_{c}" for c in _KEY]
    edge_sums = edges.groupby(keys, sort=False, as_index=False)["weight"].sum()
    return node_sums, edge_sums


def _key_id(kind: Any, layer: Any, position: Any, index: Any, match: str) -> str:
    pos = "*" if match == "identity" else str(int(position))
    return f"{kind}/{int(layer)}/{pos}/{int(index)}"


@dataclass
class GraphDiff:
    """Two graphs compared (see the module docstring).  ``nodes`` and ``edges`` are pandas
    DataFrames, one row per matched key; ``notes`` says what was not checked."""

    match: str
    nodes: Any
    edges: Any
    names: tuple[str, str] = ("a", "b")
    identities: tuple[Any, Any] = (None, None)
    notes: list[str] = field(default_factory=list)

    def only_in_a(self) -> Any:
        """The nodes present in ``a`` only."""
        return self.nodes[self.nodes["present"] == "a"]

    def only_in_b(self) -> Any:
        return self.nodes[self.nodes["present"] == "b"]

    def top_changes(self, k: int = 10, sort: Sort = "change") -> Any:
        """The ``k`` nodes with the largest signed change ``|effect_b - effect_a|`` (``sort="flip"``:
        sign flips first); ties by node id."""
        return _ranked(self.nodes, "effect_difference", ["node"], sort).head(k)

    def top_edge_changes(self, k: int = 10, sort: Sort = "change") -> Any:
        """The ``k`` edges with the largest ``|weight_b - weight_a|`` (``sort="flip"``: sign flips
        first); ties by source and target."""
        return _ranked(self.edges, "difference", ["source", "target"], sort).head(k)

    def to_dict(self, *, top: int = 20, max_rows: int | None = None, sort: Sort = "change") -> dict[str, Any]:
        """JSON-able: summary counts, the top changes, every node and edge (up to ``max_rows``)."""
        def records(df: Any) -> list[dict[str, Any]]:
            df = df if max_rows is None else df.head(max_rows)
            out = []
            for rec in df.to_dict(orient="records"):
                out.append({k: (v.item() if hasattr(v, "item") else v) for k, v in rec.items()})
            return out

        return {
            "format": "circuitgraph.diff",
            "match": self.match,
            "names": list(self.names),
            "identities": list(self.identities),
            "notes": list(self.notes),
            "counts": self.counts(),
            "ranked_by": "abs_effect_difference" if sort == "change" else "sign_flip_then_abs_effect_difference",
            "top_changes": records(self.top_changes(top, sort)),
            "top_edge_changes": records(self.top_edge_changes(top, sort)),
            "nodes": records(self.nodes),
            "edges": records(self.edges),
        }

    def to_json(self, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> str:
        """The :meth:`to_dict` document as JSON text; written atomically to ``path`` when given."""
        text = json.dumps(self.to_dict(**kwargs), indent=1, allow_nan=False) + "\n"
        if path is not None:
            atomic_write_text(path, text)
        return text

    def counts(self) -> dict[str, int]:
        n, e = self.nodes["present"], self.edges["present"]
        return {"nodes_both": int((n == "both").sum()), "nodes_only_a": int((n == "a").sum()),
                "nodes_only_b": int((n == "b").sum()), "edges_both": int((e == "both").sum()),
                "edges_only_a": int((e == "a").sum()), "edges_only_b": int((e == "b").sum()),
                "node_sign_flips": int(self.nodes["sign_flip"].sum()),
                "edge_sign_flips": int(self.edges["sign_flip"].sum())}

    def table(self, max_rows: int = 10, sort: Sort = "change") -> str:
        """The top node changes: effect a -> b, the signed change, a flip flag, influence a -> b."""
        top = self.top_changes(max_rows, sort)
        return format_table(["node", "present", "effect a -> b", "change", "flip", "influence a -> b"],
                            [[r.node, r.present, _arrow(r.effect_a, r.effect_b), _signed(r.effect_difference),
                              _flag(r.sign_flip), _arrow(r.influence_a, r.influence_b, signed=False)]
                             for r in top.itertuples()], max_rows=max_rows)

    def edge_table(self, max_rows: int = 10, sort: Sort = "change") -> str:
        """The top edge changes: weight a -> b, the signed change, a flip flag."""
        top = self.top_edge_changes(max_rows, sort)
        return format_table(["source", "target", "present", "weight a -> b", "change", "flip"],
                            [[r.source, r.target, r.present, _arrow(r.weight_a, r.weight_b),
                              _signed(r.difference), _flag(r.sign_flip)] for r in top.itertuples()],
                            max_rows=max_rows)

    def summary_lines(self, top: int = 10, sort: Sort = "change") -> list[str]:
        c = self.counts()
        a, b = self.names
        by = "|effect b - effect a|" if sort == "change" else "sign flips first, then |effect b - effect a|"
        by_edge = "|weight b - weight a|" if sort == "change" else "sign flips first, then |weight b - weight a|"
        lines = [f"a: {a}", f"b: {b}", f"match: {self.match}",
                 f"nodes: {c['nodes_both']} in both, {c['nodes_only_a']} only in a, {c['nodes_only_b']} only in b; "
                 f"{c['node_sign_flips']} flip the sign of their effect",
                 f"edges: {c['edges_both']} in both, {c['edges_only_a']} only in a, {c['edges_only_b']} only in b; "
                 f"{c['edge_sign_flips']} flip sign",
                 f"top {top} node changes by {by} (effect: signed total effect on the targets):"]
        lines += ["  " + line for line in self.table(top, sort).splitlines()]
        lines.append(f"top {top} edge changes by {by_edge}:")
        lines += ["  " + line for line in self.edge_table(top, sort).splitlines()]
        lines += [f"note: {n}" for n in self.notes]
        return lines


def _signed(x: float) -> str:
    return f"{x:+.4g}"


def _arrow(a: float, b: float, signed: bool = True) -> str:
    return f"{a:+.4g} -> {b:+.4g}" if signed else f"{a:.4g} -> {b:.4g}"


def _flag(flip: bool) -> str:
    return "FLIP" if flip else ""


def _ranked(df: Any, column: str, ties: list[str], sort: str) -> Any:
    """``df`` ordered by ``|column|`` (descending; ``sort="flip"``: sign flips first), ties by ``ties``."""
    if sort not in SORTS:
        raise QueryError(f"sort {sort!r}: expected one of {', '.join(SORTS)}")
    df = df.assign(_abs=df[column].abs(), _flip=df["sign_flip"].astype(bool))
    keys = (["_flip"] if sort == "flip" else []) + ["_abs", *ties]
    ascending = ([False] if sort == "flip" else []) + [False] + [True] * len(ties)
    return df.sort_values(keys, ascending=ascending, kind="stable").drop(columns=["_abs", "_flip"])


def diff_graphs(a: AttributionGraph, b: AttributionGraph, *, match: Match = "position",
                allow_different: bool = False, names: tuple[str, str] | None = None) -> GraphDiff:
    """Compare graph ``a`` with graph ``b`` (see the module docstring)."""
    pd = _pandas()
    if match not in MATCHES:
        raise QueryError(f"match {match!r}: expected one of {', '.join(MATCHES)}")
    pa, pb = a.metadata.prompt, b.metadata.prompt
    names = names or (pa if pa is not None else "a", pb if pb is not None else "b")
    ida, idb = graph_identity(a), graph_identity(b)
    notes = []
    if ida is None or idb is None:
        which = " and ".join(w for w, i in (("a", ida), ("b", idb)) if i is None)
        notes.append(f"the model and dictionaries of {which} are not recorded (a dataset aggregate): not compared")
    elif ida != idb and not allow_different:
        what = "models" if (ida["model"], ida["n_layers"]) != (idb["model"], idb["n_layers"]) else "dictionaries"
        got = (f"{ida['model']} vs {idb['model']}" if what == "models"
               else f"{json.dumps(ida['dictionaries'], default=str)} vs {json.dumps(idb['dictionaries'], default=str)}")
        raise QueryError(f"the graphs come from different {what} ({got}); pass allow_different=True "
                         "(--allow-different-models) to compare them anyway")
    elif ida != idb:
        notes.append("the graphs come from different models or dictionaries (allowed)")
    na, ea = _frames(a, match, "a")
    nb, eb = _frames(b, match, "b")
    key = list(_KEY)
    nodes = pd.merge(na, nb, on=key, how="outer", suffixes=("_a", "_b"), indicator=True)
    nodes["present"] = nodes["_merge"].map({"both": "both", "left_only": "a", "right_only": "b"}).astype(str)
    nodes = nodes.drop(columns="_merge")
    nodes["token"] = nodes["token_a"].fillna(nodes["token_b"]).fillna("")
    nodes = nodes.drop(columns=["token_a", "token_b"])
    for col in ("activation", "influence", "effect"):
        nodes[[f"{col}_a", f"{col}_b"]] = nodes[[f"{col}_a", f"{col}_b"]].fillna(0.0)
        nodes[f"{col}_difference"] = nodes[f"{col}_b"] - nodes[f"{col}_a"]
    nodes["sign_flip"] = sign_flips(nodes["effect_a"], nodes["effect_b"])
    nodes.insert(0, "node", [_key_id(*row, match=match) for row in nodes[key].itertuples(index=False)])
    if match == "identity":
        nodes["position"] = None
    nodes = nodes.sort_values("node", kind="stable").reset_index(drop=True)

    ekey = [f"source_{c}" for c in _KEY] + [f"target_{c}" for c in _KEY]
    edges = pd.merge(ea, eb, on=ekey, how="outer", suffixes=("_a", "_b"), indicator=True)
    edges["present"] = edges["_merge"].map({"both": "both", "left_only": "a", "right_only": "b"}).astype(str)
    edges = edges.drop(columns="_merge")
    edges[["weight_a", "weight_b"]] = edges[["weight_a", "weight_b"]].fillna(0.0)
    edges["difference"] = edges["weight_b"] - edges["weight_a"]
    edges["sign_flip"] = sign_flips(edges["weight_a"], edges["weight_b"])
    edges.insert(0, "source", [_key_id(*r, match=match) for r in edges[ekey[:4]].itertuples(index=False)])
    edges.insert(1, "target", [_key_id(*r, match=match) for r in edges[ekey[4:]].itertuples(index=False)])
    edges = edges.drop(columns=ekey)
    edges = edges.assign(_abs=edges["difference"].abs()).sort_values(
        ["_abs", "source", "target"], ascending=[False, True, True], kind="stable").drop(columns="_abs")
    edges = edges.reset_index(drop=True)
    return GraphDiff(match, nodes, edges, names, (ida, idb), notes)
