"""The edge plan and the memory guard of the engine: how many edges a sweep can make at most,
what they cost at the peak, and the refusal (with advice that works) of a sweep that would not
fit.  ``circuitgraph run --dry-run`` reports the same plan
(:mod:`circuitgraph.pipeline.estimate`, which also checks the files' sizes before loading).

The plan is made where the numbers are known exactly: after the forward pass and the
node tables (which features are active at which position, which neurons, heads, errors),
the process's resident memory is *measured*, and the edge sweep still to come is bounded
from above: a reader can only have edges from writers at or below its residual location and
at or before its position, so its causal writer count bounds its edges.  With
``max_feature_nodes`` only the rows of the selected features (and the other readers) are
computed; the bound takes the ``max_feature_nodes`` feature rows with the most possible
edges.  Edges cost ``EDGE_PEAK_BYTES`` each at the peak of a full-graph run (stored as int32
target, int32 source and float32 weight, written straight into their buffers, plus pruning's
working copies) and ``MFN_EDGE_PEAK_BYTES`` with ``max_feature_nodes`` (the ranking rounds and the
folding of unselected features), measured on the benchmark runs (docs/benchmarks).  A run that
would not fit is refused with the advice that would make it fit (computed, not guessed:
``max_feature_nodes`` only for transcoder features, ``neuron_top_k`` only for neurons, each
with the largest value whose estimate fits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import psutil
import torch

# the engine's sizes are read from their modules when a plan is made (tests and benchmarks set them)
from circuitgraph.attribution import engine, feature_selection
from circuitgraph.attribution.later_stages import LaterStages
from circuitgraph.errors import ResourceError
from circuitgraph.residual import ResidualLocation

if TYPE_CHECKING:
    from circuitgraph.attribution.nodes_builder import Collected, GraphOptions

__all__ = ["EdgePlan", "plan_edges", "check_plan", "check_rows", "device_working_set", "available_memory",
           "process_memory", "EDGE_PEAK_BYTES", "MFN_EDGE_PEAK_BYTES", "FLOAT64_EXTRA_BYTES", "USABLE"]

#: peak bytes per edge of a full graph (attribution, scores, pruning, export): 12 stored (the engine
#: writes them straight into their buffers, no concatenation) + pruning's index arrays; measured
#: 16.2 on the 6-layer side-by-side benchmark (69 M edges: 1.55 GB peak, 0.43 GB before the edges),
#: with margin
EDGE_PEAK_BYTES = 24
#: with max_feature_nodes, per edge of the computed rows before the unselected features are
#: folded: the rows are kept as the engine's dense blocks (4 bytes an entry; 12 as squeezed int32
#: target, int32 source, float32 weight), ranked and folded part by part, never concatenated whole:
#: an upper bound for either
MFN_EDGE_PEAK_BYTES = 16
#: more per edge when edges are accumulated in float64 (``graph: {dtype: float64}``)
FLOAT64_EXTRA_BYTES = 16
#: share of the available memory a run may plan to use
USABLE = 0.85
#: the later stages (scores, pruning, queries, exports) on top of the edges: a fixed allowance
#: plus a share of what is held after the forward pass (their Python objects and strings)
LATER_STAGES_BYTES = 128 * 1024**2
LATER_STAGES_SHARE = 0.1


def available_memory() -> int:
    """Bytes of memory available to this process."""
    return int(psutil.virtual_memory().available)


def process_memory() -> int:
    """Resident memory of this process now, in bytes."""
    return int(psutil.Process().memory_info().rss)


@dataclass
class EdgePlan:
    """How many edges the sweep can produce at most, and what they cost at the peak.

    ``n_edges_upper``: the sum over the computed rows of their causal writer counts.
    ``base``: the process's resident memory when the plan was made (model, dictionaries,
    forward pass, node tables: measured).  ``limit``: the memory the run may use in all."""

    n_nodes: int
    n_feature_nodes: int
    n_neuron_nodes: int
    n_rows: int
    n_edges_upper: int
    bytes_per_edge: int
    max_feature_nodes: int | None
    base: int
    limit: int
    advice: list[str] = field(default_factory=list)
    #: with max_feature_nodes: the edges if the narrowest feature rows were selected (which rows
    #: are selected is known only as they are computed); else equal to ``n_edges_upper``
    n_edges_lower: int | None = None
    #: the fewest possible edges of one feature row (what the remaining rows are assumed to add)
    min_row_edges: int = 0
    #: with max_feature_nodes: the edges left after folding (upper and lower bound: a folded row
    #: has at most one edge per kept writer and per remainder node it can see) and their bytes each
    #: in the later stages; the working copies of the largest part of computed rows
    n_edges_folded_upper: int = 0
    n_edges_folded_lower: int = 0
    folded_bytes_per_edge: int = 0
    bytes_part: int = 0
    #: the most bytes of computed rows held in memory (the rest go to temporary files)
    rows_in_memory: int | None = None
    #: with max_neuron_nodes (fewer than the neurons): how many neuron rows are computed
    max_neuron_nodes: int | None = None
    #: what the stages after the sweep add (queries and checks on the full graph, the pruned
    #: graph and its exports); ``None``: the sweep alone
    stages: LaterStages | None = None
    #: what the node tables cost per node (measured: the resident memory they added), by which
    #: the advice lowers the base when it lowers the number of nodes (neuron_top_k)
    bytes_per_node: int = 0
    #: the process's peak before the plan (loading the model: the dry run measures it), which
    #: the run's peak is at least
    floor: int = 0
    #: the neuron_top_k the node tables were made with to plan a neuron graph whose every neuron
    #: would not fit (:func:`neuron_probe_top_k`; the edge bound is the probe's)
    probe_top_k: int | None = None
    #: the neurons a probe left out, and what each is counted at in the base
    unseen_neurons: int = 0
    unseen_node_bytes: int = 0

    def node_savings(self, neurons: int) -> int:
        """What the node tables shrink by with ``neurons`` neuron nodes instead of the plan's: the
        neurons a probe left out first (at what they were counted), then the collected ones."""
        drop = max(0, self.n_neuron_nodes - neurons)
        unseen = min(drop, self.unseen_neurons)
        return unseen * self.unseen_node_bytes + (drop - unseen) * self.bytes_per_node

    def _full_bytes(self, edges: int, bytes_per_edge: int) -> int:
        """A full graph of ``edges`` edges at its peak: the stages on it (``bytes_per_edge`` an
        edge), or the exports (the full graph resident, the pruned graph's edges, at most the
        full graph's and the kept-edge cap, being written), or the heaviest probed check (the
        graph held, and the check's forward passes' working set)."""
        st = self.stages
        if st is None:
            return edges * bytes_per_edge
        kept = edges if st.kept_cap is None else min(edges, st.kept_cap)
        return max(edges * bytes_per_edge, edges * st.resident_edge_bytes + kept * st.kept_edge_bytes,
                   edges * st.check_edge_bytes + st.check_bytes)

    @property
    def selecting(self) -> bool:
        """Only the rows of selected features and/or neurons are computed (then folded)."""
        return self.max_feature_nodes is not None or self.max_neuron_nodes is not None

    def _edge_bytes(self, computed: int, folded: int) -> int:
        if not self.selecting:
            return self._full_bytes(computed, self.bytes_per_edge)
        # the computed rows (while they are ranked and folded), or the folded graph (later stages)
        held = computed * self.bytes_per_edge
        if self.rows_in_memory is not None:
            held = min(held, self.rows_in_memory * self.bytes_per_edge // 12)
        return max(held + self.bytes_part, self._full_bytes(folded, self.folded_bytes_per_edge))

    @property
    def bytes_exports(self) -> int:
        """What the exports add to the peak above the stages on the full graph, at their bound
        (pruning keeps as many edges as it may)."""
        edges, bpe = ((self.n_edges_upper, self.bytes_per_edge) if not self.selecting
                      else (self.n_edges_folded_upper, self.folded_bytes_per_edge))
        st = self.stages
        if st is None:
            return 0
        kept = edges if st.kept_cap is None else min(edges, st.kept_cap)
        return max(0, edges * st.resident_edge_bytes + kept * st.kept_edge_bytes - edges * bpe)

    @property
    def n_edges_final(self) -> int:
        """The most edges the full graph can hold (after folding, with max_feature_nodes)."""
        return self.n_edges_upper if not self.selecting else self.n_edges_folded_upper

    @property
    def export_fits(self) -> bool:
        """An unpruned graph's JSON/Neuronpedia export accepts every edge it can hold."""
        st = self.stages
        return st is None or st.export_limit is None or self.n_edges_final <= st.export_limit

    @property
    def bytes_edges(self) -> int:
        return self._edge_bytes(self.n_edges_upper, self.n_edges_folded_upper)

    @property
    def bytes_fixed(self) -> int:
        """Everything but the edges: the measured base and the later stages' allowance."""
        fixed = self.stages.fixed if self.stages is not None else 0
        return int(self.base * (1 + LATER_STAGES_SHARE)) + LATER_STAGES_BYTES + fixed

    @property
    def bytes_peak(self) -> int:
        return max(self.bytes_fixed + self.bytes_edges, self.floor)

    @property
    def bytes_peak_lower(self) -> int:
        if self.n_edges_lower is None:
            return self.bytes_peak
        return max(self.bytes_fixed + self._edge_bytes(self.n_edges_lower, self.n_edges_folded_lower), self.floor)

    @property
    def fits(self) -> bool:
        """The upper bound fits (and the exports accept the graph): the run fits."""
        return self.bytes_peak <= self.limit and self.export_fits

    @property
    def may_fit(self) -> bool:
        """Some selection of the feature rows fits (equal to :attr:`fits` without max_feature_nodes);
        the run then checks its memory as the rows are computed."""
        return self.bytes_peak_lower <= self.limit and self.export_fits

    def refusal(self) -> str:
        advice = "; or ".join(self.advice or [_LAST_RESORT])
        if not self.export_fits:
            return (f"the unpruned graph could hold up to {self.n_edges_final:,} edges, more than the "
                    f"{self.stages.export_limit:,} its JSON/Neuronpedia export writes (export.max_json_edges); "
                    + advice)
        return (f"the graph could hold up to {self.n_edges_upper:,} edges; with what is already in memory "
                f"({_gb(self.base)}) the run would need about {_gb(self.bytes_peak)}, more than the "
                f"{_gb(self.limit)} it may use; " + advice)


_LAST_RESORT = "shorten the prompt or use a machine with more memory"


def _gb(b: float) -> str:
    return f"{b / 1024**3:.3f} GB"


def _counts(col: Collected, n_locs: int, n_pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(writer counts (n_locs, n_pos), reader locs, reader positions, reader kinds)."""
    return col.count_tables(n_locs, n_pos)


@dataclass(frozen=True)
class _Reach:
    """Per residual location ``locs[loc]``: the highest location whose writers at *other positions*
    a reader there can see, -1 for none; ``causal``: only earlier positions (else every other one,
    bidirectional attention)."""

    locs: np.ndarray
    causal: bool = True


def _reach(options: GraphOptions, n_locs: int, causal: bool = True) -> _Reach:
    """Other positions are only reached through a frozen attention layer ``m`` (it reads
    ``resid_pre(m) = 2m`` and writes ``resid_mid(m) = 2m + 1``); head nodes stop paths."""
    reach = np.full(n_locs, -1, dtype=np.int64)
    for m, mode in options.attention.items():
        mid = ResidualLocation.resid_mid(m)
        if mode == "frozen" and mid < n_locs:
            reach[mid:] = np.maximum(reach[mid:], int(ResidualLocation.resid_pre(m)))
    return _Reach(reach, causal)


def _row_bounds(counts: np.ndarray, locs: np.ndarray, positions: np.ndarray, reach: _Reach) -> np.ndarray:
    """Per reader: the writers it can see (its possible edges): at its own position every writer
    at or below its location; at earlier positions (every other position when attention is
    bidirectional) those at or below ``reach.locs[loc]``."""
    if not locs.size:
        return np.zeros(0, dtype=np.int64)
    same = counts.cumsum(0)  # (loc, pos): writers at or below loc at that position
    r = reach.locs[locs]
    out = same[locs, positions].copy()
    if not reach.causal:
        ok = r >= 0
        out[ok] += same[r[ok]].sum(1) - same[r[ok], positions[ok]]
        return out
    earlier = same.cumsum(1)  # ... at or before that position
    ok = (r >= 0) & (positions >= 1)
    out[ok] += earlier[r[ok], positions[ok] - 1]
    return out


def _rows_total(bounds: np.ndarray, is_feature: np.ndarray, max_feature_nodes: int | None) -> tuple[int, int, int]:
    """(edges upper bound, rows, edges lower bound) when at most ``max_feature_nodes`` feature rows
    are computed: the upper bound takes the rows with the most possible edges (whichever are
    selected, there are no more), the lower one the rows with the fewest."""
    feat = np.sort(bounds[is_feature])[::-1]
    other = bounds[~is_feature]
    k = feat.size if max_feature_nodes is None else min(max_feature_nodes, feat.size)
    lower = int(other.sum() + (feat[feat.size - k:].sum() if k else 0))
    return int(other.sum() + feat[:k].sum()), int(other.size + k), lower


#: resident bytes per neuron node of the node tables (its reader and writer vectors, the node
#: record): measured 10.6 KB on SmolLM2-135M (d_model 576; 645,120 neurons at 15 tokens: 8.2 GB)
NEURON_NODE_BYTES = 12 * 1024
#: resident bytes per candidate neuron of ``max_neuron_nodes`` (held as arrays: its entries of
#: :class:`~circuitgraph.attribution.node_table.NeuronCandidates`, its reader entry in the reader
#: table's typed arrays with a lazy direction, its writer scale; no ``d_model`` vector, no node
#: record): measured 148 bytes (SwiGLU) on 516,096 candidates of a 4-layer model (d_mlp 2048, 64
#: tokens), with margin
NEURON_CANDIDATE_BYTES = 192
#: the share of the memory a run may use that advice planned from other node tables than the
#: run's leaves free (a probe's neuron_top_k; max_neuron_nodes planned from the activations, its
#: base from the loading peak): measured, the run's own plan was up to 3.5% above such a dry
#: run's (SmolLM2, 64 tokens, a probe's neuron_top_k advice), and measured peaks stayed below the
#: plans (docs/benchmarks/memory.md); about three times the worst error
ADVICE_MARGIN = 0.1


def neuron_probe_top_k(n_sites: int, d_mlp: int, d_model: int, room: int) -> int | None:
    """When the node tables of every neuron (``n_sites`` (layer, position) sites of ``d_mlp``)
    would take more than half of ``room``, the ``neuron_top_k`` whose tables take a quarter of it, to collect the nodes with
    instead (a probe: its plan gives the advice, up to that value); else ``None``."""
    per_node = NEURON_NODE_BYTES * max(d_model, 1) // 576
    if n_sites <= 0 or n_sites * d_mlp * per_node <= room // 2:
        return None
    # a quarter of the room: the probe serves only the neuron_top_k advice (max_neuron_nodes is
    # planned from the activations), and the dry run itself must stay within its budget
    return max(1, min(d_mlp, room // 4 // (n_sites * per_node)))


def plan_edges(col: Collected, options: GraphOptions, n_locs: int, n_pos: int, *, limit: int | None = None,
               base: int | None = None, rss_before_nodes: int | None = None,
               unseen_neurons: int = 0, floor: int = 0) -> EdgePlan:
    """The edge plan of collected nodes (see the module docstring), with advice if it does not fit.
    ``rss_before_nodes``: the resident memory before the node tables were made (what they cost
    per node scales the advice's base when it lowers the number of nodes).  ``unseen_neurons``:
    neurons the spec asks for that a probe (:func:`neuron_probe_top_k`) did not collect: their
    node tables are added to the base (the plan is the spec's), the advice stays within the probe.
    ``floor``: the process's peak before the plan (the dry run's loading peak): the memory a run
    holds before its node tables may stay that high (the allocator keeps freed pages), so the
    base is counted from it."""
    counts, locs, positions, kinds = _counts(col, n_locs, n_pos)
    reach = _reach(options, n_locs, col.frozen.adapter.facts.causal)
    bounds = _row_bounds(counts, locs, positions, reach)
    is_feature = kinds == "feature"
    n_feat = int(is_feature.sum())
    mfn = options.max_feature_nodes
    mnn = getattr(options, "max_neuron_nodes", None)
    by_feature = mfn is not None and mfn < n_feat
    by_neuron = mnn is not None and mnn < int((kinds == "neuron").sum())
    selecting = by_feature or by_neuron
    # the rows that are selected (features, neurons or both: each limit applies to its kind; the
    # bounds take the widest / narrowest rows of either kind, whichever are selected)
    selectable = (is_feature & by_feature) | ((kinds == "neuron") & by_neuron)
    n_selected = (mfn if by_feature and mfn is not None else 0) + (mnn if by_neuron and mnn is not None else 0)
    total, rows, lower = _rows_total(bounds, selectable, n_selected if selecting else None)
    held = 0
    if base is None:
        base = process_memory()
        # a budget lowers what the run may use, never raises it above what is available
        usable = int(USABLE * (available_memory() + base))
        limit = usable if limit is None else min(int(limit), usable)
        held = engine.held_writer_bytes(col)  # the writer vectors a short prompt's sweep holds
        base += held
    limit = int(USABLE * (available_memory() + base)) if limit is None else int(limit)
    # 8-byte weights (graph: {dtype: float64}): the stored copy and its working copies
    extra = FLOAT64_EXTRA_BYTES if "float64" in str(options.dtype) else 0
    stages = getattr(options, "stages", None)
    # a full-graph edge at the heaviest stage on the full graph: the sweep's, or a later stage's
    full_bpe = max(EDGE_PEAK_BYTES, stages.full_edge_bytes if stages is not None else 0) + extra
    bpe = (MFN_EDGE_PEAK_BYTES + extra) if selecting else full_bpe
    plan = EdgePlan(len(col.nodes), n_feat, int((kinds == "neuron").sum()), rows, total, bpe,
                    mfn if by_feature else None, base, limit, n_edges_lower=lower if selecting else None,
                    min_row_edges=int(bounds[selectable].min()) if selectable.any() else 0, stages=stages,
                    max_neuron_nodes=mnn if by_neuron else None)
    if selecting:
        kinds_selected = tuple(k for k, on in (("feature", by_feature), ("neuron", by_neuron)) if on)
        cap = _folded_row_cap(col, counts, locs, positions, reach, n_locs, n_pos, kinds_selected)
        plan.n_edges_folded_upper, _, plan.n_edges_folded_lower = _rows_total(
            np.minimum(bounds, cap + n_selected), selectable, n_selected)
        plan.folded_bytes_per_edge = full_bpe
        widest = int(bounds[selectable].max())
        plan.bytes_part = _part_bytes(getattr(options, "batch_size", 256), n_selected, widest, extra)

        plan.rows_in_memory = feature_selection.ROWS_IN_MEMORY_BYTES
    # the neurons' node tables at their recorded cost: the freed pages of loading, which the
    # allocator keeps, can hide them from the measured memory (and make it differ between the dry
    # run and the run), so the base is at least what the process held before them (or its loading
    # peak) plus their recorded cost
    per_neuron = (NEURON_CANDIDATE_BYTES if _compact_candidates(col, options)
                  else NEURON_NODE_BYTES * col.frozen.adapter.facts.d_model // 576)
    if rss_before_nodes is not None:
        plan.bytes_per_node = per_neuron  # what the advice saves per neuron it drops
        modelled = max(rss_before_nodes, floor) + plan.n_neuron_nodes * per_neuron + held
        plan.base = max(plan.base, modelled)
    plan.floor = floor
    if unseen_neurons:
        # the spec's own node tables: the probe's, and every neuron it left out at the recorded cost
        plan.unseen_neurons, plan.unseen_node_bytes = unseen_neurons, per_neuron
        plan.base += unseen_neurons * per_neuron
        plan.n_nodes += unseen_neurons
        plan.n_neuron_nodes += unseen_neurons
    if not plan.fits:
        candidates = (None if n_feat or plan.max_neuron_nodes is not None
                      else _neuron_candidates(col, options, counts, locs, positions, kinds, reach, n_locs, n_pos))
        plan.advice = _advice(plan, counts, locs, positions, kinds, bounds, reach, extra,
                              candidates=candidates, floor=max(rss_before_nodes or 0, floor),
                              # a probe's neuron_top_k is the dry run's, not the spec's
                              instead_of_top_k=getattr(options, "neuron_top_k", None) is not None and not unseen_neurons,
                              cap=_folded_row_cap(col, counts, locs, positions, reach, n_locs, n_pos)
                              if n_feat else None, batch_size=getattr(options, "batch_size", None),
                              full_bpe=full_bpe,
                              # with max_neuron_nodes, the advice lowers it (the neurons' folded-row cap)
                              neuron_setting="max_neuron_nodes" if plan.max_neuron_nodes is not None else None,
                              neuron_cap=_folded_row_cap(col, counts, locs, positions, reach, n_locs, n_pos,
                                                         ("neuron",)) if plan.max_neuron_nodes is not None
                              else None)
    return plan


def _compact_candidates(col: Collected, options: GraphOptions) -> bool:
    """The neurons are ``max_neuron_nodes`` candidates held compactly (dense MLP layers)."""
    return getattr(options, "max_neuron_nodes", None) is not None and not col.frozen.adapter.facts.num_experts


@dataclass(frozen=True)
class _Candidates:
    """The graph a ``max_neuron_nodes`` run would collect, planned without collecting it: every
    active neuron of a neuron layer at a node position is a candidate.  Per (layer, position)
    site of candidates: its reader location and position, how many it has (``weight``), the
    possible edges of each of their rows (``bound``) and what a folded row keeps (``cap``, less
    the selected rows it can see); the other readers' ``other_bound`` / ``other_cap``; the
    writer vectors a short prompt's sweep would hold (``held``, as ``engine.held_writer_bytes``)."""

    weight: np.ndarray
    bound: np.ndarray
    cap: np.ndarray
    other_bound: np.ndarray
    other_cap: np.ndarray
    held: int

    @property
    def n(self) -> int:
        return int(self.weight.sum())


def _neuron_candidates(col: Collected, options: GraphOptions, counts: np.ndarray, locs: np.ndarray,
                       positions: np.ndarray,
                       kinds: np.ndarray, reach: _Reach, n_locs: int, n_pos: int) -> _Candidates | None:
    """:class:`_Candidates` of the collected nodes' neuron layers (``neuron_top_k``, a probe or
    every neuron), from the activations alone; ``None`` without dense neuron layers (MoE layers'
    candidates are not held compactly)."""
    fm = col.frozen
    layers = sorted(l for l, mode in options.mlp.items() if mode == "neurons")
    if not layers or fm.adapter.facts.num_experts or fm.adapter.facts.attn_only:
        return None
    min_pos = 0 if getattr(options, "bos_nodes", False) else 1
    neuron_writers = col.feature_writer_counts(n_locs, n_pos, ("neuron", "remainder"))
    all_counts = counts.copy()
    cand = np.zeros_like(counts)
    read_loc = {}
    for layer in layers:
        w = int(ResidualLocation.resid_post(layer))
        active = (fm.lin.mlp_post[layer][min_pos:] != 0).sum(-1).cpu().numpy().astype(np.int64)
        cand[w, min_pos:] = active
        all_counts[w] += cand[w] - neuron_writers[w]
        read_loc[w] = int(fm.mlp_input_location(layer))
    site_w, site_pos = np.nonzero(cand)
    site_loc = np.array([read_loc[w] for w in site_w.tolist()], dtype=np.int64)
    others = all_counts - cand
    sites = (cand > 0).astype(np.int64)
    keep = kinds != "neuron"

    def cap(l: np.ndarray, p: np.ndarray) -> np.ndarray:
        return _row_bounds(others, l, p, reach) + _row_bounds(sites, l, p, reach)

    held = int(all_counts.sum()) * fm.adapter.facts.d_model * torch.empty((), dtype=fm.dtype).element_size()
    return _Candidates(cand[site_w, site_pos], _row_bounds(all_counts, site_loc, site_pos, reach),
                       cap(site_loc, site_pos), _row_bounds(all_counts, locs[keep], positions[keep], reach),
                       cap(locs[keep], positions[keep]), held if held <= engine.HELD_WRITERS_BYTES else 0)


def _top_weighted(values: np.ndarray, weight: np.ndarray, k: int) -> int:
    """The sum of the ``k`` largest values of a multiset (``values[i]`` ``weight[i]`` times)."""
    order = np.argsort(-values, kind="stable")
    v, w = values[order], weight[order]
    full = np.cumsum(w)
    n = int(np.searchsorted(full, k, side="left"))  # sites taken whole before the one that completes k
    total = int((v[:n] * w[:n]).sum())
    if n < v.size:
        total += int(v[n]) * (k - (int(full[n - 1]) if n else 0))
    return total


def _largest_max_neuron_nodes(plan: EdgePlan, c: _Candidates, floor: int, batch: int, extra: int,
                              full_bpe: int) -> int:
    """The largest ``max_neuron_nodes`` whose plan (the same bound :func:`plan_edges` makes of the
    run's candidates: its widest selected rows, the folded graph, the candidates' node tables at
    :data:`NEURON_CANDIDATE_BYTES`) fits the memory the run may use less :data:`ADVICE_MARGIN`
    (0: none)."""
    n = c.n
    if n < 2:
        return 0
    # the run's base: what the process held before its node tables, the candidates at their cost,
    # the writer vectors a short prompt's sweep holds; the plan's other nodes are in ``floor``
    base = max(floor, plan.base - plan.node_savings(0)) + n * NEURON_CANDIDATE_BYTES + c.held
    fixed = int(base * (1 + LATER_STAGES_SHARE)) + LATER_STAGES_BYTES + (plan.stages.fixed if plan.stages else 0)
    room = int(plan.limit * (1 - ADVICE_MARGIN)) - fixed
    if room <= 0:
        return 0
    widest = int(c.bound.max())
    bpe = MFN_EDGE_PEAK_BYTES + extra
    other_computed = int(c.other_bound.sum())

    def need(k: int) -> float:
        computed = (other_computed + _top_weighted(c.bound, c.weight, k)) * bpe
        computed = min(computed, feature_selection.ROWS_IN_MEMORY_BYTES * bpe // 12)
        folded = (int(np.minimum(c.other_bound, c.other_cap + k).sum())
                  + _top_weighted(np.minimum(c.bound, c.cap + k), c.weight, k))
        return max(computed + _part_bytes(batch, k, widest, extra), _full_graph_bytes(plan, folded, full_bpe))

    return _largest_fitting(n - 1, need, room)


def _full_graph_bytes(plan: EdgePlan, edges: int, bytes_per_edge: int) -> float:
    """What ``edges`` edges of the full graph cost at the peak with the later stages (infinite
    when an unpruned export would refuse that many): the advice's measure."""
    st = plan.stages
    if st is not None and st.export_limit is not None and edges > st.export_limit:
        return float("inf")
    return plan._full_bytes(edges, bytes_per_edge)


def _folded_row_cap(col: Collected, counts: np.ndarray, locs: np.ndarray, positions: np.ndarray, reach: _Reach,
                    n_locs: int, n_pos: int, kinds: tuple[str, ...] = ("feature",)) -> np.ndarray:
    """Per reader, the edges its row can keep after the unselected features (``kinds``) are
    folded, less the selected ones it can see: one per other writer and one per (layer, position)
    remainder node it can see."""
    features = col.feature_writer_counts(n_locs, n_pos, kinds)
    others = counts - features
    sites = (features > 0).astype(np.int64)
    return _row_bounds(others, locs, positions, reach) + _row_bounds(sites, locs, positions, reach)


#: the setting the advice names for neuron graphs: ``neuron_top_k`` (the top neurons per
#: position); with ``max_neuron_nodes`` (neurons selected by influence, like max_feature_nodes)
#: the advice computes it as it computes max_feature_nodes (see :func:`_advice`)
NEURON_ADVICE = "neuron_top_k"


def _advice(plan: EdgePlan, counts: np.ndarray, locs: np.ndarray, positions: np.ndarray, kinds: np.ndarray,
            bounds: np.ndarray, reach: _Reach, extra: int = 0, cap: np.ndarray | None = None,
            batch_size: int | None = None, full_bpe: int | None = None,
            neuron_setting: str | None = None, neuron_cap: np.ndarray | None = None,
            candidates: _Candidates | None = None, floor: int = 0, instead_of_top_k: bool = False) -> list[str]:
    """Changes of the spec that would make the run fit, each checked with the same bound (the
    later stages and the exports' limit included).  ``neuron_setting``: the setting named for
    neuron graphs (default :data:`NEURON_ADVICE`): ``neuron_top_k``, or a selection of neuron
    rows like ``max_feature_nodes`` (``max_neuron_nodes``), whose folded rows are capped by
    ``neuron_cap`` (per reader, as ``cap`` for features)."""
    full_bpe = EDGE_PEAK_BYTES + extra if full_bpe is None else full_bpe
    room = plan.limit - plan.bytes_fixed
    # advice planned from other node tables than the run will make (a probe's, whose neurons it
    # keeps are not the run's) leaves ADVICE_MARGIN of the limit free
    probe_room = int(plan.limit * (1 - ADVICE_MARGIN)) - plan.bytes_fixed if plan.unseen_neurons else room
    out: list[str] = []
    is_feature = kinds == "feature"
    batch = batch_size or 256
    if candidates is not None:
        # neurons selected by influence (max_neuron_nodes), planned from the activations: the
        # advice for a neuron graph first, as its candidates cost ~1 KB each instead of their tables
        k = _largest_max_neuron_nodes(plan, candidates, floor, batch, extra, full_bpe)
        if k >= 1:
            out.append(f"set graph.max_neuron_nodes: {k} (or less; neurons kept by influence on the targets"
                       + ("; instead of neuron_top_k)" if instead_of_top_k else ")"))
    if is_feature.any() and cap is not None:
        k = _largest_selection(plan, bounds, is_feature, cap, room, batch, extra, full_bpe)
        if k >= 1:
            out.append(f"set graph.max_feature_nodes: {k} (or less)")
    is_neuron = kinds == "neuron"
    setting = neuron_setting or NEURON_ADVICE
    if is_neuron.any() and plan.max_neuron_nodes is None and setting == "neuron_top_k":
        k = _largest_neuron_top_k(counts, locs, positions, kinds, reach, probe_room,
                                  lambda edges, neurons: _full_graph_bytes(plan, edges, full_bpe)
                                  - plan.node_savings(neurons) * (1 + LATER_STAGES_SHARE))
        if k:
            out.append(f"set graph.neuron_top_k: {k} (or less)")
    elif is_neuron.any() and neuron_cap is not None:
        # neurons selected by influence like features (max_neuron_nodes): the same bound, with the
        # neurons' folded-row cap (_folded_row_cap of the neuron writers)
        k = _largest_selection(plan, bounds, is_neuron, neuron_cap, room, batch, extra, full_bpe)
        if k >= 1:
            out.append(f"set graph.{setting}: {k} (or less)")
    # whole-MLP nodes: no MLP readers at all (only the targets read)
    coarse = counts.copy()
    mlp_locs = np.unique(locs[is_feature | is_neuron]) + 1
    for loc in mlp_locs:
        coarse[loc] = np.minimum(coarse[loc], 1)
    keep = ~(is_feature | is_neuron)
    if (is_feature | is_neuron).any() and _full_graph_bytes(
            plan, int(_row_bounds(coarse, locs[keep], positions[keep], reach).sum()), full_bpe) <= room:
        out.append("set graph.mlp: mlp (one node per MLP output)")
    st = plan.stages
    if st is not None and st.export_limit is not None and plan.n_edges_final > st.export_limit:
        out.append("prune the graph (prune: {node_threshold: 0.8, edge_threshold: 0.98}: the JSON then keeps at "
                   "most export.max_json_edges edges) or write export.graph (.npz) instead of JSON")
    return out


def _largest_selection(plan: EdgePlan, bounds: np.ndarray, selectable: np.ndarray, cap: np.ndarray, room: int,
                       batch: int, extra: int, full_bpe: int) -> int:
    """The largest number of ``selectable`` rows (max_feature_nodes; max_neuron_nodes) whose
    computed rows and folded graph fit ``room`` (the same bound as plan_edges'; 0: none)."""
    rows = np.sort(bounds[selectable])[::-1]
    computed = int(bounds[~selectable].sum()) + np.cumsum(rows)  # [k - 1]: with k selected rows

    def need(k: int) -> float:
        folded, _, _ = _rows_total(np.minimum(bounds, cap + k), selectable, k)
        part = _part_bytes(batch, k, int(rows[0]), extra)
        return max(int(computed[k - 1]) * (MFN_EDGE_PEAK_BYTES + extra) + part,
                   _full_graph_bytes(plan, folded, full_bpe))

    return _largest_fitting(max(rows.size - 1, 1) if rows.size > 1 else rows.size, need, room)


def _largest_neuron_top_k(counts: np.ndarray, locs: np.ndarray, positions: np.ndarray, kinds: np.ndarray,
                          reach: _Reach, room: int, edge_bytes: Callable[[int, int], float]) -> int:
    """The largest ``neuron_top_k`` whose bound fits ``room`` (0: none); ``edge_bytes(edges,
    neurons)``: what a graph of that many edges and neuron nodes costs beyond the room's base."""
    is_neuron = kinds == "neuron"
    per_site = np.zeros_like(counts)
    np.add.at(per_site, (locs[is_neuron], positions[is_neuron]), 1)
    read_locs = np.unique(locs[is_neuron])
    site_loc, site_pos = np.nonzero(per_site)
    other = ~is_neuron

    def need(k: int) -> int:
        c = counts.copy()
        readers = np.minimum(per_site, k)
        for loc in read_locs:  # the neurons of a layer read at loc and write at loc + 1 (+1 remainder)
            c[loc + 1] -= per_site[loc] - readers[loc] - (per_site[loc] > k)
        per_reader = _row_bounds(c, site_loc, site_pos, reach)
        total = (readers[site_loc, site_pos] * per_reader).sum() + _row_bounds(c, locs[other], positions[other],
                                                                                 reach).sum()
        # the neuron nodes: the kept neurons and one remainder per site that loses some
        return edge_bytes(int(total), int(readers.sum() + (per_site > k).sum()))

    return _largest_fitting(int(per_site.max(initial=0)), need, room)


def _largest_fitting(hi: int, need: Callable[[int], float], room: int) -> int:
    """The largest ``k`` in ``0..hi`` with ``need(k) <= room`` (``need`` grows with ``k``; 0 when
    none fits), by bisection."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _part_bytes(batch_size: int, max_feature_nodes: int, widest: int, extra: int) -> int:
    """The working copies of one engine call with ``max_feature_nodes``: at most ``batch_size``
    rows (and no more than the selected features) of the widest row's width, split at
    ``PART_EDGES_DENSE`` possible edges (a single row wider than that is one call).  The rows are
    kept as dense blocks: 4 bytes an entry (8 in float64), counted twice for slack, plus the
    per-chunk transients of the engine and of the fold (the edge block, the gather buffer, the
    fold's reordered and float64 copies of one block), a few times ``WRITER_CHUNK_BYTES``."""
    part_edges = min(min(batch_size, max_feature_nodes) * widest, max(feature_selection.PART_EDGES_DENSE, widest))
    entry = 4 + extra // 4
    return part_edges * 2 * entry + 6 * min(engine.WRITER_CHUNK_BYTES, part_edges * entry)


def check_plan(plan: EdgePlan) -> None:
    """Refuse an edge sweep that cannot fit (:class:`ResourceError` with working advice).  With
    ``max_feature_nodes`` a run is refused here only when even the narrowest rows would not fit;
    :func:`check_rows` then watches the memory as the selected rows are computed."""
    if not plan.may_fit:
        raise ResourceError(plan.refusal())


def check_rows(plan: EdgePlan, rows_done: int, edges_done: int, rows_total: int) -> None:
    """The guard while ``max_feature_nodes`` rows are computed: stop as soon as the run cannot fit
    any more, i.e. when the edges computed so far plus the remaining rows at their fewest
    possible edges (:attr:`EdgePlan.min_row_edges`) would pass the memory the run may use.  (The
    rows computed first are the most influential and usually the widest, so their mean width is
    no guide to the rest.)"""
    if rows_done <= 0 or rows_done >= rows_total:
        return
    held = (edges_done + (rows_total - rows_done) * plan.min_row_edges) * plan.bytes_per_edge
    if plan.rows_in_memory is not None:  # the rest of the computed rows goes to temporary files
        held = min(held, plan.rows_in_memory * plan.bytes_per_edge // 12)
    need = plan.bytes_fixed + held
    if need <= plan.limit:
        return
    width = edges_done / rows_done
    k = int((plan.limit - plan.bytes_fixed) / max(width * plan.bytes_per_edge, 1.0)) - (
        plan.n_rows - (plan.max_feature_nodes or 0) - (plan.max_neuron_nodes or 0))
    key = "max_feature_nodes" if plan.max_neuron_nodes is None else (
        "max_neuron_nodes" if plan.max_feature_nodes is None else "max_feature_nodes + max_neuron_nodes")
    advice = f"set graph.{key}: {max(k, 1)} (or less)" if k >= 1 else _LAST_RESORT
    raise ResourceError(
        f"after {rows_done} of the {rows_total} rows ({edges_done:,} edges), the run would need at least "
        f"{_gb(need)}, more than the {_gb(plan.limit)} it may use; {advice}")


def device_working_set(largest_block: int, n_pos: int, d_model: int, options: GraphOptions) -> int:
    """Bytes the edge sweep allocates on the model's device per batch of readers: the gradient
    block ``(batch, pos, d_model)`` (three copies while it steps down a layer) and the largest
    per-location edge block ``(positions, batch, writers)`` (``largest_block`` position x writer
    slots) with its non-zero indices."""
    elt = 8 if "64" in str(options.dtype) else 4
    B = options.batch_size
    return 3 * B * n_pos * d_model * elt + largest_block * B * (elt + 3 * 8)
