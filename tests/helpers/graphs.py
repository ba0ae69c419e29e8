"""Graphs shared by the query tests (cached per session) and dense or brute-force references.

* hand-built DAGs with features, error nodes, embeddings and logit targets whose
  pre-activations satisfy completeness (so identities can be checked exactly);
* graphs built by ``attribute`` from tiny models (LayerNorm/GELU and RMSNorm/gated), in
  float64, with neurons, or with small ReLU transcoders given as plain tensors (no sae-lens
  import: the engine's own tests cover sae-lens loading);
* circuit-tracer's graphs (the session fixture ``circuit_tracer_graphs`` in conftest.py);
* dense influence / total-effect matrices, every path by enumeration, and one query spec of each kind."""

from __future__ import annotations

import functools

import numpy as np

from circuitgraph.graph.graph import AttributionGraph
from circuitgraph.graph.nodes import Node, NodeId
from circuitgraph.spec import queries as sq

PROMPT = [1, 5, 7, 2, 9, 3, 11]


# ------------------------------------------------------------------ hand-built graphs
def random_dag(seed: int = 0, *, n_layers: int = 3, n_pos: int = 3, feats_per_site: int = 2, n_targets: int = 2,
               density: float = 0.5, with_errors: bool = True) -> AttributionGraph:
    """A random layered DAG shaped like an attribution graph; completeness holds exactly.

    Features read from every earlier writer at an earlier or equal position; logits read
    from everything at the last position.  ``pre = sum(incoming) + constant``; a feature's
    activation is its pre-activation (an active ReLU).
    """
    rng = np.random.default_rng(seed)
    nodes: list[Node] = []
    writers: list[int] = []
    edges: dict[tuple[int, int], float] = {}
    for p in range(n_pos):
        nodes.append(Node(NodeId("embedding", -1, p, 10 + p), activation=1.0))
        writers.append(len(nodes) - 1)

    def add_reader(nid: NodeId, cands: list[int]) -> int:
        row = len(nodes)
        total = 0.0
        for s in cands:
            if rng.random() < density:
                w = float(rng.normal())
                edges[(row, s)] = w
                total += w
        const = float(rng.normal() * 0.1)
        pre = total + const
        nodes.append(Node(nid, activation=pre, pre_activation=pre, constant=const))
        return row

    for layer in range(n_layers):
        new = []
        for p in range(n_pos):
            cands = [w for w in writers if nodes[w].position <= p]
            for i in range(feats_per_site):
                new.append(add_reader(NodeId("feature", layer, p, i), cands))
            if with_errors:
                nodes.append(Node(NodeId("error", layer, p, 0), activation=1.0))
                new.append(len(nodes) - 1)
        writers += new
    targets = []
    for j in range(n_targets):
        row = add_reader(NodeId("logit", n_layers, n_pos - 1, 20 + j), list(writers))
        targets.append((nodes[row].id, float(0.6 if j == 0 else 0.4 / max(1, n_targets - 1))))
    keys = list(edges)
    return AttributionGraph(nodes, [k[0] for k in keys], [k[1] for k in keys], [edges[k] for k in keys],
                            targets=targets)


def chain_graph() -> AttributionGraph:
    """e -> f (2), f -> T (3), e -> T (1); pre_f = 4 (constant 2), pre_T = 4.5 (constant 0.5)."""
    e = Node(NodeId("embedding", -1, 0, 1), 1.0)
    f = Node(NodeId("feature", 0, 0, 7), 4.0, pre_activation=4.0, constant=2.0)
    t = Node(NodeId("logit", 1, 0, 3), 4.5, pre_activation=4.5, constant=0.5)
    return AttributionGraph([e, f, t], [1, 2, 2], [0, 1, 0], [2.0, 3.0, 1.0], targets=[(t.id, 1.0)])


# ------------------------------------------------------------------ circuit-tracer graphs
def load_ct_graph(circuit_tracer_graphs: dict, name: str) -> tuple[AttributionGraph, object]:
    """circuit-tracer's graph on case ``name`` as an AttributionGraph, nodes in its order
    (features, error[layer][position], tokens, logits), and the CircuitTracerGraph itself."""
    _, ct = circuit_tracer_graphs[name]
    return ct.to_graph(), ct


# ------------------------------------------------------------------ attributed graphs
class _ReluEncoder:
    """Stands in for the sae-lens object: ``encode(x) = relu(x W_enc + b_enc)``."""

    def __init__(self, W_enc, b_enc):
        self.W_enc, self.b_enc = W_enc, b_enc

    def encode(self, x):
        import torch

        return torch.relu(x @ self.W_enc + self.b_enc)

    def to(self, dtype=None, **_):
        return _ReluEncoder(self.W_enc.to(dtype), self.b_enc.to(dtype))


def stub_transcoders(model, tokens, *, d_sae: int = 24, active_frac: float = 0.3,
                     seed: int = 0):
    """ReLU transcoders reading ``ln2.hook_normalized``, as plain tensors (float64)."""
    import torch

    from circuitgraph.dictionaries import TranscoderLayer, TranscoderSet

    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed + 7)
    hooks = [f"blocks.{layer}.ln2.hook_normalized" for layer in range(cfg.n_layers)]
    _, cache = model.run_with_cache(torch.tensor([tokens]), names_filter=lambda n: n in hooks)
    layers = {}
    for layer in range(cfg.n_layers):
        x = cache[hooks[layer]][0].double()
        W_enc = torch.randn(cfg.d_model, d_sae, generator=gen, dtype=torch.float64) / cfg.d_model**0.5
        b_enc = -torch.quantile(x @ W_enc, 1 - active_frac, dim=0)
        W_dec = torch.randn(d_sae, cfg.d_model, generator=gen, dtype=torch.float64) / d_sae**0.5
        b_dec = 0.1 * torch.randn(cfg.d_model, generator=gen, dtype=torch.float64)
        layers[layer] = TranscoderLayer(layer, W_enc, b_enc, W_dec, b_dec, None, None, "normalized", hooks[layer],
                                        f"blocks.{layer}.hook_mlp_out", "transcoder", "test stub",
                                        _ReluEncoder(W_enc, b_enc))
    return TranscoderSet(layers, {"path": "test stub"})

ARCHS = {"ln-gelu": dict(norm="LN", mlp="gelu", positional="learned"),
         "rms-gated": dict(norm="RMS", mlp="gated", positional="rotary")}


@functools.cache
def attributed(arch: str, granularity: str = "neurons") -> AttributionGraph:
    """A float64 graph of a tiny model on :data:`PROMPT` (cached): ``neurons`` (top 4 per
    position, rest in a remainder), ``transcoders`` (stub ReLU transcoders), or ``heads``
    (neurons + attention heads as nodes in layer 1)."""
    import torch

    from circuitgraph.adapters import ModelAdapter
    from circuitgraph.attribution import attribute
    from circuitgraph.testing.synthetic import tiny_model

    model = tiny_model(seed=1, **ARCHS[arch]).to(torch.float64)
    adapter = ModelAdapter(model)
    if granularity == "transcoders":
        return attribute(adapter, PROMPT, stub_transcoders(model, PROMPT), dtype=torch.float64)
    if granularity == "heads":
        return attribute(adapter, PROMPT, dtype=torch.float64, neuron_top_k=4, attention={0: "frozen", 1: "heads"})
    return attribute(adapter, PROMPT, dtype=torch.float64, neuron_top_k=4)


# ------------------------------------------------------------------ dense references
def dense_influence(g: AttributionGraph) -> np.ndarray:
    A = np.abs(g.dense_adjacency())
    A = A / np.maximum(A.sum(1, keepdims=True), 1e-10)
    w = np.zeros(g.n_nodes)
    for t, wt in g.targets:
        w[g.index_of(t)] += wt
    eye = np.eye(g.n_nodes)
    return w @ (np.linalg.inv(eye - A) - eye)


def dense_total_effect(g: AttributionGraph) -> np.ndarray:
    """``TE[T, s] = ((I - E D^-1)^-1 E)[T, s]`` for every target row T."""
    E = g.dense_adjacency()
    d = np.array([n.pre_activation if n.pre_activation is not None else n.activation for n in g.nodes])
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0)
    TE = np.linalg.inv(np.eye(g.n_nodes) - E * inv[None, :]) @ E
    return np.stack([TE[g.index_of(t)] for t in g.target_ids])


# ------------------------------------------------------------------ brute force
def all_paths(g: AttributionGraph, sources, targets, *, through=(), avoid=None, max_length=None):
    """Every path (as rows) from a source row to a target row, by depth-first search."""
    out_edges: dict[int, list[int]] = {}
    for s, t in zip(g.edge_source.tolist(), g.edge_target.tolist(), strict=False):
        out_edges.setdefault(s, []).append(t)
    avoid = np.zeros(g.n_nodes, dtype=bool) if avoid is None else avoid
    found = []

    def walk(path: list[int]) -> None:
        v = path[-1]
        if len(path) > 1 and v in targets and all(m[path].any() for m in through):
            found.append(list(path))
        if max_length is not None and len(path) - 1 >= max_length:
            return
        for t in out_edges.get(v, ()):
            if not avoid[t]:
                walk(path + [t])

    for s in sources:
        if not avoid[s]:
            walk([s])
    return found


def brute_value(g: AttributionGraph, rows: list[int], rank: str) -> float:
    E = g.dense_adjacency()
    if rank == "normalized":
        A = np.abs(E) / np.maximum(np.abs(E).sum(1, keepdims=True), 1e-10)
        return float(np.prod([A[v, u] for u, v in zip(rows[:-1], rows[1:], strict=False)]))
    d = [n.pre_activation if n.pre_activation is not None else n.activation for n in g.nodes]
    value = E[rows[1], rows[0]]
    for u, v in zip(rows[1:-1], rows[2:], strict=False):
        value *= E[v, u] / d[u]
    return float(value)


def rows_of(g: AttributionGraph, res) -> list[list[int]]:
    return [[g.index_of(n) for n in p.nodes] for p in res.paths]


def spec_items(g: AttributionGraph) -> list:
    """One item of every query kind, valid for the ln-gelu transcoder graph."""
    feature = next(n.id for n in g.nodes if n.kind == "feature" and n.layer == 1)
    edge = max(zip(g.edge_source, g.edge_target, g.edge_weight, strict=False), key=lambda x: abs(x[2]))
    return [
        sq.TopPathsQuery(top_paths={"source": {"kind": "embedding"}, "k": 3, "expand_heads": True}),
        sq.TopPathsQuery(top_paths={"source": {"kind": "embedding"}, "target": {"kind": "feature", "layer": 1},
                                    "rank": "normalized", "method": "beam", "beam_width": 5, "max_length": 3,
                                    "through": [{"kind": "feature", "layer": 0}], "avoid": [{"position": 0}]}),
        sq.InfluenceQuery(influence={"top_k": 5, "signed": True}),
        sq.DirectLogitAttributionQuery(direct_logit_attribution={"target": 1, "kinds": ["feature", "error"]}),
        sq.LogitLensQuery(logit_lens={"tokens": [3, 4], "position": -2}),
        sq.CongruenceQuery(congruence={"tokens": [3, 4], "kind": "feature", "mode": "cosine"}),
        sq.NeighboursQuery(neighbours={"node": str(feature), "direction": "both", "top_k": 3}),
        sq.SubgraphQuery(subgraph={"filter": {"kind": "feature", "layer": 0}}),
        sq.SupernodesQuery(supernodes={"groups": {"early": {"layer": 0}, "late": {"layer": 1}}}),
        sq.ScoresQuery(scores=None),
        sq.HeadSplitQuery(head_split={"source": str(g.nodes[edge[0]].id), "target": str(g.nodes[edge[1]].id)}),
        sq.VirtualWeightsQuery(virtual_weights={"source": {"kind": "feature", "layer": 0},
                                                "target": {"kind": "logit"}, "top_k": 4}),
        sq.DeEmbeddingQuery(de_embedding={"node": {"kind": "feature", "layer": 1, "index": feature.index},
                                          "head": {"layer": 0, "head": 1}}),
        sq.DeEmbeddingQuery(de_embedding={"node": str(feature), "top_k": 3}),
        sq.QKQuery(qk={"layer": 1, "head": [0, 2], "query_position": -1, "key_position": "top", "top_k": 3}),
        sq.QKQuery(qk={"layer": 0, "head": 1, "query_position": 3, "key_position": -4}),
    ]
