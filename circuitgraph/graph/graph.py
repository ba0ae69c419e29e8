"""The attribution graph: a node table plus sparse, exact edges.

Edges are stored as three parallel arrays in coordinate form (``target``, ``source``,
``weight``: rows = targets, columns = sources, as in circuit-tracer's adjacency), indexed
by node row.  Rows are an implementation detail: every public accessor takes and returns
:class:`NodeId` values.  A dense matrix is only built on request, together with the index
that maps its rows to nodes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from circuitgraph.errors import CircuitGraphError, QueryError
from circuitgraph.graph.edges import grouped, incoming_sums
from circuitgraph.graph.linearised_edges import LinearisedEdges
from circuitgraph.graph.metadata import GraphMetadata
from circuitgraph.graph.nodes import Node, NodeId, file_attrs
from circuitgraph.spec.graph import GraphSpec

if TYPE_CHECKING:
    import networkx

    from circuitgraph.attribution.context import AttributionContext

__all__ = ["AttributionGraph", "CompletenessReport", "GRAPH_EXPORTS", "register_graph_exports"]

#: the dense-matrix limit of a graph that was not given one (the spec's default, stated there)
DEFAULT_MAX_DENSE_NODES: int = GraphSpec.model_fields["max_dense_nodes"].default

#: the functions behind the graph's file and display methods (:meth:`AttributionGraph.to_json`,
#: ``from_json``, ``to_dot``, ``render``, the notebook views): ``circuitgraph.export`` registers
#: them when it is imported (:func:`register_graph_exports`), so the graph imports nothing from
#: the package that imports it.  The methods are kept for the documented API; the free functions
#: of ``circuitgraph.export`` (``graph_to_json``, ``graph_from_json``, ``graph_to_dot``,
#: ``render_graph``, ``export.html.graph_html``/``graph_svg``) are the implementation.
GRAPH_EXPORTS: dict[str, Callable[..., Any]] = {}
_EXPORT_NAMES = ("to_json", "from_json", "to_dot", "render", "html", "svg")


def register_graph_exports(**functions: Callable[..., Any]) -> None:
    """Register the functions behind the graph's file and display methods (by the names of
    :data:`GRAPH_EXPORTS`: ``to_json``, ``from_json``, ``to_dot``, ``render``, ``html``, ``svg``)."""
    unknown = set(functions) - set(_EXPORT_NAMES)
    if unknown:
        raise ValueError(f"unknown graph export {sorted(unknown)}; expected {', '.join(_EXPORT_NAMES)}")
    GRAPH_EXPORTS.update(functions)


def _export(name: str) -> Callable[..., Any]:
    """The function registered for ``name`` (a clear error when ``circuitgraph.export`` is not imported)."""
    try:
        return GRAPH_EXPORTS[name]
    except KeyError:
        raise CircuitGraphError(
            f"AttributionGraph's {name} is circuitgraph.export's: `import circuitgraph.export` first (a run, "
            "load_graph and every exporter import it), or call its function directly") from None


@dataclass(frozen=True)
class CompletenessReport:
    """Result of :meth:`AttributionGraph.check_completeness`.

    ``max_violation`` is the largest ``|pre - (sum of edges + constant)|`` divided by the
    node's scale ``max(|pre|, sum |edges|, |constant|, 1e-12)``; ``worst`` names that node.
    """

    max_violation: float
    max_abs_violation: float
    worst: NodeId | None
    n_readers: int

    def ok(self, tol: float = 1e-5) -> bool:
        return self.max_violation <= tol

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_relative_violation": self.max_violation,
            "max_abs_violation": self.max_abs_violation,
            "worst_node": str(self.worst) if self.worst is not None else None,
            "n_readers": self.n_readers,
        }


@dataclass(repr=False)
class AttributionGraph:
    """Nodes keyed by value, with sparse exact edges.

    Attributes:
        nodes: node records in a stable order (row ``i`` of the edge arrays is ``nodes[i]``).
        edge_target, edge_source: row indices of each edge (int32 while every row fits, else int64).
        edge_weight: the edge weights (float32 or float64).
        targets: the target (output) nodes of the analysis with their weights
            (used by influence and pruning; weights default to 1).
        metadata: spec, model, transcoders, prompt, versions, exactness checks: a
            :class:`~circuitgraph.graph.metadata.GraphMetadata` (the JSON object, a ``dict``, with
            typed attributes such as ``metadata.n_layers``; a plain dict given here is wrapped).
        context: the live linearisation that produced the graph (not serialised); some
            queries and validation checks need it, and say so when it is missing.
        edges_unique: every (target, source) pair occurs at most once (true of graphs built by
            the engine), so queries need not sum duplicates.
        max_dense_nodes: the most nodes :meth:`dense_adjacency` densifies by default (a run sets
            its spec's ``graph.max_dense_nodes``; a graph file read back keeps it; None: the spec's
            default).
        linearised_edges: the linearised query and key edges into heads
            (``graph.head_inputs``), kept apart from the exact edges above: completeness, influence,
            pruning and paths use the exact edges only (:mod:`circuitgraph.graph.linearised_edges`).
    """

    nodes: list[Node]
    edge_target: np.ndarray
    edge_source: np.ndarray
    edge_weight: np.ndarray
    targets: list[tuple[NodeId, float]] = field(default_factory=list)
    metadata: GraphMetadata = field(default_factory=GraphMetadata)
    context: AttributionContext | None = field(default=None, repr=False, compare=False)
    edges_unique: bool = field(default=False, repr=False, compare=False)
    max_dense_nodes: int | None = field(default=None, repr=False, compare=False)
    linearised_edges: LinearisedEdges | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "metadata" and not isinstance(value, GraphMetadata):  # a plain dict: given typed attributes
            value = GraphMetadata(value or {})
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        # row indices: int32 when every row fits (half the memory of int64), else int64
        index_dtype = np.int32 if len(self.nodes) < 2**31 - 1 else np.int64
        self.edge_target = np.asarray(self.edge_target, dtype=index_dtype)
        self.edge_source = np.asarray(self.edge_source, dtype=index_dtype)
        self.edge_weight = np.asarray(self.edge_weight)
        if not (self.edge_target.shape == self.edge_source.shape == self.edge_weight.shape):
            raise ValueError("edge arrays must have the same length")
        self._index: dict[NodeId, int] = {}
        for i, node in enumerate(self.nodes):
            if node.id in self._index:
                raise ValueError(f"duplicate node id {node.id}")
            self._index[node.id] = i
        self._csr_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._csc_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._nx_cache: networkx.DiGraph | None = None
        # values derived from the edges by queries (name -> (edge_target, edge_weight, value))
        self._derived: dict[str, tuple[np.ndarray, np.ndarray, Any]] = {}

    # ----------------------------------------------------------------- basics
    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def model_n_layers(self) -> int | None:
        """The model's number of blocks as the run recorded it (``metadata["model"]["n_layers"]``),
        or None (a hand-built graph)."""
        return self.metadata.n_layers

    @property
    def n_edges(self) -> int:
        return int(self.edge_weight.shape[0])

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._index

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def node_ids(self) -> list[NodeId]:
        return [n.id for n in self.nodes]

    def index_of(self, node_id: NodeId | str) -> int:
        """Row of a node; raises :class:`QueryError` naming the id if it is not in the graph."""
        if isinstance(node_id, str):
            try:
                node_id = NodeId.parse(node_id)
            except ValueError as exc:
                raise QueryError(str(exc)) from None
        try:
            return self._index[node_id]
        except KeyError:
            raise QueryError(f"node {node_id} is not in the graph ({self.n_nodes} nodes)") from None

    def node(self, node_id: NodeId | str) -> Node:
        return self.nodes[self.index_of(node_id)]

    @property
    def target_ids(self) -> list[NodeId]:
        return [t for t, _ in self.targets]

    # ----------------------------------------------------------------- derived values
    def derived(self, name: str) -> Any:
        """A value computed from the edges and kept with :meth:`store_derived` (e.g. the node
        influence that scores and pruning share), or None: never stored, or the edge arrays
        were replaced since (nothing in circuitgraph changes them in place)."""
        hit = self._derived.get(name)
        if hit is not None and hit[0] is self.edge_target and hit[1] is self.edge_weight:
            return hit[2]
        return None

    def store_derived(self, name: str, value: Any) -> None:
        """Keep ``value``, computed from the current edge arrays, under ``name``."""
        self._derived[name] = (self.edge_target, self.edge_weight, value)

    # ----------------------------------------------------------------- sparse views
    def csr_order(self) -> tuple[np.ndarray, np.ndarray]:
        """(order, indptr): edges sorted by target row."""
        if self._csr_cache is None:
            self._csr_cache = grouped(self.edge_target, self.n_nodes)
        return self._csr_cache

    def csc_order(self) -> tuple[np.ndarray, np.ndarray]:
        """(order, indptr): edges sorted by source row."""
        if self._csc_cache is None:
            self._csc_cache = grouped(self.edge_source, self.n_nodes)
        return self._csc_cache

    def in_edges(self, node_id: NodeId | str) -> list[tuple[NodeId, float]]:
        """Incoming edges of a node as ``(source id, weight)``, strongest first."""
        row = self.index_of(node_id)
        order, indptr = self.csr_order()
        sel = order[indptr[row] : indptr[row + 1]]
        sel = sel[np.argsort(-np.abs(self.edge_weight[sel]), kind="stable")]
        return [(self.nodes[s].id, float(w)) for s, w in zip(self.edge_source[sel], self.edge_weight[sel], strict=False)]

    def out_edges(self, node_id: NodeId | str) -> list[tuple[NodeId, float]]:
        """Outgoing edges of a node as ``(target id, weight)``, strongest first."""
        col = self.index_of(node_id)
        order, indptr = self.csc_order()
        sel = order[indptr[col] : indptr[col + 1]]
        sel = sel[np.argsort(-np.abs(self.edge_weight[sel]), kind="stable")]
        return [(self.nodes[t].id, float(w)) for t, w in zip(self.edge_target[sel], self.edge_weight[sel], strict=False)]

    def edge_weight_between(self, source: NodeId | str, target: NodeId | str) -> float:
        """The weight of the edge ``source -> target`` (0.0 if absent)."""
        s, t = self.index_of(source), self.index_of(target)
        order, indptr = self.csr_order()
        sel = order[indptr[t] : indptr[t + 1]]
        hit = sel[self.edge_source[sel] == s]
        return float(self.edge_weight[hit].sum()) if hit.size else 0.0

    def dense_adjacency(self, max_nodes: int | None = None, dtype: Any = np.float64) -> np.ndarray:
        """Dense ``(n, n)`` adjacency, rows = targets, in the order of :attr:`nodes`.

        Refuses above ``max_nodes`` so a large graph is never densified by accident; the default
        is :attr:`max_dense_nodes` (the spec's ``graph.max_dense_nodes``).
        """
        if max_nodes is None:
            max_nodes = self.max_dense_nodes or DEFAULT_MAX_DENSE_NODES
        if self.n_nodes > max_nodes:
            raise QueryError(
                f"dense adjacency of {self.n_nodes} nodes refused (max_nodes={max_nodes}); "
                "use the sparse accessors or raise max_nodes="
            )
        a = np.zeros((self.n_nodes, self.n_nodes), dtype=dtype)
        np.add.at(a, (self.edge_target, self.edge_source), self.edge_weight.astype(dtype))
        return a

    def _incoming(self) -> tuple[np.ndarray, np.ndarray]:
        """(sum, sum of |w|) of the incoming edge weights per node, float64, in one chunked
        pass over the edges; cached while the edge arrays are the same objects."""
        cached = getattr(self, "_incoming_cache", None)
        if cached is not None and cached[0] is self.edge_target and cached[1] is self.edge_weight:
            return cached[2]
        sums, abs_sums = incoming_sums(self.edge_target, self.edge_weight, self.n_nodes)
        self._incoming_cache = (self.edge_target, self.edge_weight, (sums, abs_sums))
        return sums, abs_sums

    def adopt_incoming_sums(self, sums: np.ndarray, abs_sums: np.ndarray) -> None:
        """Take the per-node (sum, sum of |w|) of the incoming edges from whoever made the edges
        (the engine sums each row as it writes it), so that :meth:`check_completeness` and the
        queries need no pass over the edges; kept while the edge arrays are the same objects."""
        sums = np.asarray(sums, dtype=np.float64)
        abs_sums = np.asarray(abs_sums, dtype=np.float64)
        if sums.shape != (self.n_nodes,) or abs_sums.shape != (self.n_nodes,):
            raise ValueError(f"incoming sums must have one value per node ({self.n_nodes})")
        self._incoming_cache = (self.edge_target, self.edge_weight, (sums, abs_sums))

    def incoming_sums(self) -> np.ndarray:
        """Sum of incoming edge weights per node (float64)."""
        return self._incoming()[0].copy()

    def incoming_abs_sums(self) -> np.ndarray:
        """Sum of the absolute incoming edge weights per node (float64)."""
        return self._incoming()[1].copy()

    # ----------------------------------------------------------------- checks
    def check_completeness(self) -> CompletenessReport:
        """Check ``pre_activation == sum(incoming edges) + constant`` for every reader node."""
        sums, abs_sums = self._incoming()
        worst, worst_rel, worst_abs, n = None, 0.0, 0.0, 0
        for i, node in enumerate(self.nodes):
            if node.pre_activation is None or node.constant is None:
                continue
            n += 1
            err = abs(node.pre_activation - (sums[i] + node.constant))
            scale = max(abs(node.pre_activation), abs_sums[i], abs(node.constant), 1e-12)
            rel = err / scale
            if rel > worst_rel or worst is None:
                worst, worst_rel = node.id, rel
            worst_abs = max(worst_abs, err)
        return CompletenessReport(float(worst_rel), float(worst_abs), worst, n)

    # ----------------------------------------------------------------- conversions
    @property
    def nx(self) -> networkx.DiGraph:
        """The graph as a networkx DiGraph (:meth:`to_networkx`, built once, on first use)."""
        if self._nx_cache is None:
            self._nx_cache = self.to_networkx()
        return self._nx_cache

    def to_networkx(self) -> networkx.DiGraph:
        """A ``networkx.DiGraph`` keyed by the string node ids (``"feature/1/4/17"``).

        Node attributes: ``kind``, ``layer``, ``position``, ``index``, ``activation``,
        ``pre_activation``, ``constant``, ``label``, ``attrs`` (the node's attribute dict) and
        ``target_weight`` on target nodes.  Edge attribute: ``weight`` (repeated source ->
        target pairs are summed).  Graph attributes: ``metadata`` and ``targets`` (a list of
        ``[node id, weight]``).  :meth:`from_networkx` reads it back.

        networkx is an optional extra (``pip install 'circuitgraph-lm[networkx]'``): the graph's own
        algorithms are vectorised over its edge arrays (:mod:`circuitgraph.graph.edges`); this
        conversion is for running networkx's on it.
        """
        try:
            import networkx as nx
        except ImportError:  # pragma: no cover - networkx is in the networkx and test extras
            raise QueryError("converting a graph to networkx needs the networkx package: "
                             "pip install 'circuitgraph-lm[networkx]'") from None
        g = nx.DiGraph(metadata=self.metadata, targets=[[str(t), float(w)] for t, w in self.targets])
        weights = dict((t, float(w)) for t, w in self.targets)
        for node in self.nodes:
            data = dict(kind=node.kind, layer=node.layer, position=node.position, index=node.index,
                        activation=node.activation, pre_activation=node.pre_activation,
                        constant=node.constant, label=node.label, attrs=node.attrs)
            if node.id in weights:
                data["target_weight"] = weights[node.id]
            g.add_node(str(node.id), **data)
        ids = [str(n.id) for n in self.nodes]
        for s, t, w in zip(self.edge_source.tolist(), self.edge_target.tolist(),
                           self.edge_weight.astype(np.float64).tolist(), strict=False):
            if g.has_edge(ids[s], ids[t]):
                g[ids[s]][ids[t]]["weight"] += w
            else:
                g.add_edge(ids[s], ids[t], weight=w)
        return g

    @classmethod
    def from_networkx(cls, g: networkx.DiGraph) -> AttributionGraph:
        """The inverse of :meth:`to_networkx`: nodes keyed by string ids (or :class:`NodeId`
        values), ``weight`` on edges; missing node attributes get defaults (activation 1)."""
        nodes = []
        for key, data in g.nodes(data=True):
            nid = key if isinstance(key, NodeId) else NodeId.parse(str(key))
            nodes.append(Node(nid, float(data.get("activation", 1.0)), data.get("pre_activation"),
                              data.get("constant"), data.get("label", "") or "", file_attrs(data.get("attrs"))))
        row = {n.id: i for i, n in enumerate(nodes)}

        def parse(key: Any) -> NodeId:
            return key if isinstance(key, NodeId) else NodeId.parse(str(key))

        edges = [(row[parse(s)], row[parse(t)], float(d.get("weight", 0.0))) for s, t, d in g.edges(data=True)]
        stored = g.graph.get("targets")
        if stored is not None:
            targets = [(parse(t), float(w)) for t, w in stored]
        else:
            targets = [(n.id, float(g.nodes[k]["target_weight"])) for k, n in zip(g.nodes, nodes, strict=False)
                       if "target_weight" in g.nodes[k]]
        return cls(nodes, np.array([t for _, t, _ in edges], dtype=np.int64),
                   np.array([s for s, _, _ in edges], dtype=np.int64),
                   np.array([w for _, _, w in edges], dtype=np.float64), targets=targets,
                   metadata=GraphMetadata(g.graph.get("metadata") or {}))

    # ----------------------------------------------------------------- display
    def __repr__(self) -> str:
        name, prompt = self.metadata.model_name, self.metadata.prompt
        text = ""
        if prompt is not None:
            text = " " + repr(prompt if len(prompt) <= 40 else prompt[:39] + "…")
        on = f" ({name})" if name else ""
        return (f"<AttributionGraph{on}{text}: {self.n_nodes} nodes, {self.n_edges} edges, "
                f"{len(self.targets)} target{'s' if len(self.targets) != 1 else ''}>")

    def _repr_html_(self) -> str | None:
        # the diagram needs circuitgraph.export; without it a notebook shows repr()
        return GRAPH_EXPORTS["html"](self) if "html" in GRAPH_EXPORTS else None

    def _repr_svg_(self) -> str | None:
        return GRAPH_EXPORTS["svg"](self) if "svg" in GRAPH_EXPORTS else None

    def subgraph(self, keep: Iterable[NodeId]) -> AttributionGraph:
        """The induced subgraph on ``keep`` (no remainder bookkeeping; see queries.prune for that)."""
        keep_rows = sorted({self.index_of(k) for k in keep})
        remap = -np.ones(self.n_nodes, dtype=np.int64)
        remap[keep_rows] = np.arange(len(keep_rows))
        mask = (remap[self.edge_source] >= 0) & (remap[self.edge_target] >= 0)
        keep_set = {self.nodes[r].id for r in keep_rows}
        return AttributionGraph(
            nodes=[self.nodes[r] for r in keep_rows],
            edge_target=remap[self.edge_target[mask]],
            edge_source=remap[self.edge_source[mask]],
            edge_weight=self.edge_weight[mask],
            targets=[(t, w) for t, w in self.targets if t in keep_set],
            metadata=GraphMetadata(self.metadata),
            context=self.context,
            max_dense_nodes=self.max_dense_nodes,
            linearised_edges=None if self.linearised_edges is None else self.linearised_edges.remap(remap),
        )

    def to_json(self, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> str:
        """Serialise to our JSON schema (schemas/graph.schema.json).  With ``path``: write the
        file and return the path; without: return the JSON text.  A thin method over
        :func:`circuitgraph.export.graph_to_json` (registered when ``circuitgraph.export`` is imported)."""
        text = _export("to_json")(self, path, **kwargs)
        return os.fspath(path) if path is not None else text

    @classmethod
    def from_json(cls, source: str) -> AttributionGraph:
        """Load a graph written by :meth:`to_json` (a path or a JSON string): a thin method over
        :func:`circuitgraph.export.graph_from_json`."""
        return _export("from_json")(source)

    def to_dot(self, **kwargs: Any) -> str:
        """Graphviz DOT text (no binary needed): a thin method over :func:`circuitgraph.export.graph_to_dot`."""
        return _export("to_dot")(self, **kwargs)

    def render(self, path: str, **kwargs: Any) -> str:
        """Render an SVG/PNG diagram through the ``dot`` binary; returns the path written (a thin
        method over :func:`circuitgraph.export.render_graph`)."""
        return _export("render")(self, path, **kwargs)
