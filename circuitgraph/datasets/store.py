"""Reading a dataset run's outputs: DataFrames, DuckDB, and the aggregate as a graph.

    >>> ds = open_dataset("out/demo_dataset")                          # doctest: +SKIP
    >>> ds.manifest.groupby("status").size()                           # doctest: +SKIP
    >>> ds.sql("select * from nodes order by sum_influence desc limit 5").df()   # doctest: +SKIP
    >>> g = ds.graph()          # an AttributionGraph: paths, neighbours, to_dot, render  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from circuitgraph._io import ParquetFrames, read_json_file
from circuitgraph.errors import LoadError
from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.metadata import GraphMetadata
from circuitgraph.graph.nodes import Node, NodeAttrs, NodeId
from circuitgraph.spec.kinds import OUTPUT_KINDS, TOKEN_KINDS

__all__ = ["open_dataset", "Dataset", "AggregateGraph"]

_TABLES = ("manifest", "nodes", "edges")


class AggregateGraph(AttributionGraph):
    """The aggregate of a dataset as an :class:`AttributionGraph`.

    One node per identity (``position`` 0, or ``-1 - position_from_end`` when aggregated by
    position, so ``-1`` is the last token); a node's ``activation`` and an edge's weight are
    their **mean over the aggregated prompts** (a prompt without the node or edge counts as 0),
    so ``weight * n_aggregated == sum_weight``.  The counts and sums are kept: each node's
    ``attrs`` holds ``n_prompts``, ``sum_activation``, ``sum_influence``, ``sum_direct_effect``
    (and ``influence``, the mean); :attr:`edge_n_prompts`, :attr:`edge_sum_weight` and
    :attr:`edge_sum_abs_weight` are parallel to the edge arrays.  Targets are the ``logit``
    and ``target`` nodes, weighted by the share of prompts they occur in.
    """

    edge_n_prompts: np.ndarray
    edge_sum_weight: np.ndarray
    edge_sum_abs_weight: np.ndarray


def _node_ids(df: Any, prefix: str, by_position: bool) -> list[Any]:
    kinds = df[f"{prefix}kind"].tolist()
    layers = df[f"{prefix}layer"].tolist()
    indices = df[f"{prefix}index"].tolist()
    positions = (-1 - df[f"{prefix}position_from_end"]).tolist() if by_position else [0] * len(kinds)
    return [NodeId(k, int(l), int(p), int(i)) for k, l, p, i in zip(kinds, layers, positions, indices, strict=False)]


class Dataset:
    """A dataset run's output folder (see :func:`open_dataset`)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        missing = [f"{name}.parquet" for name in _TABLES if not (self.directory / f"{name}.parquet").is_file()]
        if missing or not (self.directory / "aggregate.json").is_file():
            raise LoadError(f"{self.directory} is not a finished dataset run (missing "
                            f"{', '.join(missing) or 'aggregate.json'}); run the dataset spec to (re)build it")
        self.info: dict[str, Any] = read_json_file(self.directory / "aggregate.json", "aggregate.json")
        self._frames = ParquetFrames(self.directory)
        self._connection: Any = None


    @property
    def manifest(self) -> Any:
        """One row per prompt: id, row, status, error, timings, scores, node and edge counts."""
        return self._frames["manifest"]

    @property
    def nodes(self) -> Any:
        """The aggregate over nodes: kind, layer, index[, position_from_end], n_prompts, sums."""
        return self._frames["nodes"]

    @property
    def edges(self) -> Any:
        """The aggregate over edges: source_*, target_* identities, n_prompts, sums."""
        return self._frames["edges"]

    @property
    def n_aggregated(self) -> int:
        """How many prompts the aggregate is over (the ``ok`` ones)."""
        return int(self.info["n_aggregated"])

    @property
    def connection(self) -> Any:
        """A DuckDB connection with views ``manifest``, ``nodes`` and ``edges`` over the Parquet files."""
        if self._connection is None:
            try:
                import duckdb
            except ImportError:
                raise LoadError("querying a dataset with SQL needs duckdb: pip install 'circuitgraph-lm[dataset]'") from None
            con = duckdb.connect()
            for name in _TABLES:
                path = str(self.directory / f"{name}.parquet").replace("'", "''")
                con.execute(f"create view {name} as select * from read_parquet('{path}')")
            self._connection = con
        return self._connection

    def sql(self, query: str) -> Any:
        """Run SQL over ``manifest``, ``nodes`` and ``edges``; returns a DuckDB relation (``.df()``, ``.fetchall()``)."""
        return self.connection.sql(query)

    def token_str(self, token: int) -> str:
        return self.info.get("token_strs", {}).get(str(token), f"<{token}>")

    def graph(self) -> AggregateGraph:
        """The aggregate as an :class:`AggregateGraph` (mean weights, counts kept)."""
        by_position = self.info.get("position") == "from_end"
        n = max(self.n_aggregated, 1)
        nodes_df, edges_df = self.nodes, self.edges
        ids = _node_ids(nodes_df, "", by_position)
        nodes = []
        for i, node_id in enumerate(ids):
            count = int(nodes_df["n_prompts"].iat[i])
            attrs: NodeAttrs = {
                "n_prompts": count,
                "sum_activation": float(nodes_df["sum_activation"].iat[i]),
                "sum_influence": float(nodes_df["sum_influence"].iat[i]),
                "sum_direct_effect": float(nodes_df["sum_direct_effect"].iat[i]),
                "influence": float(nodes_df["sum_influence"].iat[i]) / n,
            }
            label = f"n={count}"
            if node_id.kind in TOKEN_KINDS:
                attrs["token_str"] = self.token_str(node_id.index)
            elif node_id.kind == "target":
                label = f"{self.info.get('target_labels', {}).get(str(node_id.index), label)} (n={count})"
            nodes.append(Node(node_id, activation=attrs["sum_activation"] / n, label=label, attrs=attrs))
        index = {node_id: i for i, node_id in enumerate(ids)}
        src = [index[s] for s in _node_ids(edges_df, "source_", by_position)]
        tgt = [index[t] for t in _node_ids(edges_df, "target_", by_position)]
        sum_weight = edges_df["sum_weight"].to_numpy(dtype=np.float64)
        targets = [(nd.id, nd.attrs["n_prompts"] / n) for nd in nodes if nd.kind in OUTPUT_KINDS]
        graph = AggregateGraph(
            nodes=nodes,
            edge_target=np.asarray(tgt, dtype=np.int64),
            edge_source=np.asarray(src, dtype=np.int64),
            edge_weight=sum_weight / n,
            targets=targets,
            metadata=GraphMetadata.for_aggregate(
                dataset=str(self.directory), aggregate={k: self.info[k] for k in ("graph", "position", "n_aggregated")},
                n_layers=self.info.get("n_layers"), prompt=f"aggregate of {self.n_aggregated} prompts"),
        )
        graph.edge_n_prompts = edges_df["n_prompts"].to_numpy(dtype=np.int64)
        graph.edge_sum_weight = sum_weight
        graph.edge_sum_abs_weight = edges_df["sum_abs_weight"].to_numpy(dtype=np.float64)
        return graph

    def summary_lines(self, top: int = 10) -> list[str]:
        """A short report: prompt counts, score distribution, failures, top nodes and edges."""
        m = self.manifest
        ok = m[m["status"] == "ok"]
        lines = [f"dataset {self.directory}: {len(m)} prompts, {len(ok)} ok, {len(m) - len(ok)} failed; aggregate "
                 f"over the {self.info['graph']} graphs, position {self.info['position']}"]
        for col in ("replacement_score", "completeness_score"):
            if len(ok):
                q = ok[col].quantile([0.0, 0.25, 0.5, 0.75, 1.0]).tolist()
                lines.append(f"{col}: mean {ok[col].mean():.4f}, min {q[0]:.4f}, q25 {q[1]:.4f}, median {q[2]:.4f}, "
                             f"q75 {q[3]:.4f}, max {q[4]:.4f}")
        if len(ok):
            lines.append(f"nodes per graph: median {ok['n_nodes'].median():.0f}; edges per graph: median "
                         f"{ok['n_edges'].median():.0f}; seconds per prompt: median {ok['time_total'].median():.3f}")
        for _, r in m[m["status"] != "ok"].head(top).iterrows():
            lines.append(f"failed row {r['row']} (id {r['id']}): {r['error']}")
        nodes = self.nodes.sort_values(["sum_influence", "n_prompts"], ascending=False, kind="stable").head(top)
        lines.append(f"{len(self.nodes)} node identities, {len(self.edges)} edge identities; top nodes by influence:")
        key = [c for c in ("kind", "layer", "index", "position_from_end") if c in nodes.columns]
        for _, r in nodes.iterrows():
            ident = "/".join(str(r[c]) for c in key)
            token = f" {self.token_str(int(r['index']))!r}" if r["kind"] in TOKEN_KINDS else ""
            lines.append(f"  {ident}{token}: in {r['n_prompts']}/{self.n_aggregated} prompts, mean influence "
                         f"{r['sum_influence'] / max(self.n_aggregated, 1):.4f}, mean activation "
                         f"{r['sum_activation'] / max(self.n_aggregated, 1):.4g}")
        edges = self.edges.sort_values("sum_abs_weight", ascending=False, kind="stable").head(top)
        lines.append("top edges by summed |weight|:")
        for _, r in edges.iterrows():
            s = "/".join(str(r[f"source_{c}"]) for c in key)
            t = "/".join(str(r[f"target_{c}"]) for c in key)
            lines.append(f"  {s} -> {t}: in {r['n_prompts']} prompts, mean weight "
                         f"{r['sum_weight'] / max(self.n_aggregated, 1):.4g}")
        return lines


def open_dataset(directory: str | Path) -> Dataset:
    """Open the output folder of a dataset run (``export: {dataset: DIR}``)."""
    return Dataset(directory)
