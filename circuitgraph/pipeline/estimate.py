"""Memory estimates: before a run (from the spec's sizes) and before the edge sweep (from counts).

A run that would not fit is refused with a clear message and a suggestion, instead of being
killed by the operating system half way.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitgraph.errors import ResourceError

__all__ = ["RunEstimate", "estimate_run", "available_memory", "check_edge_memory", "EDGE_BYTES"]

#: bytes per stored edge: int32 target + int32 source + float32 weight, plus working copies
EDGE_BYTES = 24


def available_memory() -> int:
    """Bytes of memory available to this process (psutil when present, else /proc/meminfo)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * 1024**3  # pragma: no cover


def _safetensors_bytes(path: Path) -> int:
    """Tensor bytes in a safetensors file, from its header (no tensor is read)."""
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    total = 0
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        total += end - start
    return total


@dataclass
class RunEstimate:
    n_pos: int
    n_layers: int
    d_model: int
    d_sae: int | None
    n_feature_nodes: int
    n_nodes: int
    n_edges_upper: int
    bytes_model: int
    bytes_transcoders: int
    bytes_edges: int
    bytes_peak: int
    available: int
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.bytes_peak <= 0.8 * self.available

    def lines(self) -> list[str]:
        gb = lambda b: f"{b / 1024**3:.2f} GB"  # noqa: E731
        out = [
            f"prompt: {self.n_pos} tokens; model: {self.n_layers} layers, d_model {self.d_model}"
            + (f"; transcoders: d_sae {self.d_sae}" if self.d_sae else ""),
            f"estimated nodes: {self.n_nodes} (feature nodes {self.n_feature_nodes}); "
            f"edges at most {self.n_edges_upper:,}",
            f"memory: model {gb(self.bytes_model)}, transcoders {gb(self.bytes_transcoders)}, "
            f"edges {gb(self.bytes_edges)}; peak about {gb(self.bytes_peak)} of {gb(self.available)} available",
            "fits: yes" if self.fits else "fits: NO - " + _suggestion(),
        ]
        return out + [f"note: {n}" for n in self.notes]


def _suggestion() -> str:
    return ("set graph.max_feature_nodes (keep only the most influential features), shorten the prompt, "
            "prune with a coarser granularity (graph.mlp: mlp), or use a machine with more memory")


def estimate_run(spec: Any, *, active_fraction: float = 0.02) -> RunEstimate:
    """Estimate from the spec alone: config sizes, transcoder file sizes and the prompt length.

    The number of active features is not known before the forward pass; it is assumed to be
    ``active_fraction`` of the dictionary per token (``max_feature_nodes`` caps it).
    """
    from circuitgraph.adapters.tokenizer import Tokenizer, resolve_tokenizer_dir

    from circuitgraph.builtin import BUILTIN_MODELS

    m = spec.model
    notes: list[str] = []
    if m.source == "name":
        raise ResourceError("dry-run needs the model's config: only local (path/builtin) models are estimated")
    if m.source == "builtin":
        model_dir = Path(BUILTIN_MODELS[m.builtin]()) / "model"
    else:
        model_dir = Path(m.path)
    cfg = json.loads((model_dir / "config.json").read_text())
    L, D = int(cfg["n_layers"]), int(cfg["d_model"])
    bytes_model = _safetensors_bytes(model_dir / "model.safetensors")
    prompt = spec.prompt
    if hasattr(prompt, "tokens"):
        n_pos = len(prompt.tokens)
    else:
        tok_dir = resolve_tokenizer_dir(model_dir / "tokenizer")
        n_pos = len(Tokenizer.from_dir(tok_dir).encode(prompt.text)) + 1 if tok_dir else len(prompt.text.split()) + 1
    d_sae, bytes_tc, tc_layers = None, 0, 0
    t = spec.transcoders
    if t is not None and t.source in ("path", "builtin"):
        from circuitgraph.builtin import builtin_dictionary_dir

        tc_dir = Path(t.path) if t.source == "path" else builtin_dictionary_dir(t.builtin)
        if (tc_dir / "config.yaml").is_file():
            d_sae, bytes_tc, tc_layers, note = _clt_estimate(tc_dir, L, D, n_pos, active_fraction)
            notes.append(note)
        for sub in sorted(tc_dir.glob("layer_*")):
            bytes_tc += _safetensors_bytes(sub / "sae_weights.safetensors")
            d_sae = int(json.loads((sub / "cfg.json").read_text())["d_sae"])
            tc_layers += 1
    elif t is not None:
        notes.append("hub transcoders: sizes unknown before download")
    if d_sae:
        n_feat = int(active_fraction * d_sae * tc_layers * max(n_pos - 1, 1))
        notes.append(f"assumes {active_fraction:.0%} of features active per token")
    else:
        n_feat = int(cfg.get("d_mlp", 4 * D)) * L * max(n_pos - 1, 1)
        notes.append("no transcoders: every neuron is a node (set graph.neuron_top_k to cap it)")
    if spec.graph.max_feature_nodes:
        n_feat_rows = min(n_feat, spec.graph.max_feature_nodes)
    else:
        n_feat_rows = n_feat
    n_nodes = n_feat + (L + 1) * n_pos + 10
    n_edges = n_feat_rows * n_nodes // 2 + 10 * n_nodes
    bytes_edges = n_edges * EDGE_BYTES
    bytes_peak = int(bytes_model * 2 + bytes_tc * 2 + bytes_edges + 64 * 1024**2)
    return RunEstimate(n_pos, L, D, d_sae, n_feat, n_nodes, n_edges, bytes_model, bytes_tc, bytes_edges,
                       bytes_peak, available_memory(), notes)


def _clt_estimate(path: Path, L: int, D: int, n_pos: int, active_fraction: float) -> tuple[int, int, int, str]:
    """(d_transcoder, bytes held in memory, layers, note) for a circuit-tracer CLT directory.

    Decoders are read lazily (only the rows of active features, ``n_layers - l`` vectors each)
    and encoders one layer at a time when the encoders together exceed 1 GiB, so the
    memory is the biases + the largest encoder layer (or all encoders when small) + the active
    decoder rows, not the files' size."""
    from safetensors import safe_open

    enc = path / "W_enc_0.safetensors"
    if not enc.is_file():
        return 0, 0, 0, f"{enc} is missing (the run will fail; see docs/dictionaries.md)"
    with safe_open(str(enc), framework="pt") as f:
        d_tc = int(f.get_slice("W_enc_0").get_shape()[0])
    elt = 4
    enc_layer = d_tc * D * elt
    enc_bytes = enc_layer if L * enc_layer > 2**30 else L * enc_layer
    n_active = int(active_fraction * d_tc * max(n_pos - 1, 1))  # per layer
    dec_bytes = sum(min(n_active, d_tc) * (L - l) * D * elt for l in range(L))
    on_disk = sum(_safetensors_bytes(p) for p in path.glob("W_*.safetensors"))
    total = enc_bytes + dec_bytes + 2 * L * (d_tc + D) * elt
    note = (f"cross-layer transcoder: {on_disk / 1024**2:.1f} MiB on disk, ~{total / 1024**2:.1f} MiB read into "
            "memory (lazy decoder rows of the active features" + (", one encoder layer at a time)"
                                                                    if enc_bytes == enc_layer else ")"))
    return d_tc, total, L, note


def check_edge_memory(n_edges_upper: int, *, limit: int | None = None) -> None:
    """Refuse an edge sweep whose worst-case sparse storage would not fit."""
    need = n_edges_upper * EDGE_BYTES
    avail = available_memory() if limit is None else limit
    if need > 0.8 * avail:
        raise ResourceError(
            f"the graph could hold up to {n_edges_upper:,} edges (~{need / 1024**3:.1f} GB), more than the "
            f"{avail / 1024**3:.1f} GB of memory available; {_suggestion()}"
        )


def edge_upper_bound(locs: list[int], positions: list[int], writer_groups: dict[int, list], n_locs: int,
                     n_pos: int) -> int:
    """Worst-case number of edges: for each reader, the writers at or below its location and
    at or before its position."""
    import numpy as np

    counts = np.zeros((n_locs, n_pos), dtype=np.int64)
    for loc, groups in writer_groups.items():
        for pos, rows, _ in groups:
            counts[loc, pos] += len(rows)
    cum = counts.cumsum(0).cumsum(1)
    return int(sum(cum[l, p] for l, p in zip(locs, positions)))
