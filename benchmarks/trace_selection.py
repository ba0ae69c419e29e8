#!/usr/bin/env python
"""What a ``max_feature_nodes`` selection spends its engine calls on: one line per call.

    python benchmarks/trace_selection.py BENCH_ONE_ARGS...   (the arguments of bench_one.py)

Runs ``benchmarks/bench_one.py`` with :func:`circuitgraph.attribution.engine.compute_dense_rows`
wrapped: each call prints the seconds since start, its number of rows, its seconds, the
positions of its readers (min / median) and how many read each residual location.  Stop it
with Ctrl-C (or ``timeout``) once the pattern is clear: on long prompts it is what tells where
the rows of the most influential features lie and what each costs.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_one

from circuitgraph.attribution import engine, feature_selection

T0 = time.perf_counter()
_compute = engine.compute_dense_rows


def _traced(col, *, batch_size, reader_subset=None, **kwargs):
    t = time.perf_counter()
    out = _compute(col, batch_size=batch_size, reader_subset=reader_subset, **kwargs)
    readers = col.readers
    subset = list(range(len(readers.rows))) if reader_subset is None else list(reader_subset)
    locs = collections.Counter(int(readers.locs[i]) for i in subset)
    pos = sorted(readers.positions[i] for i in subset)
    print(f"[{time.perf_counter() - T0:8.1f} s] {len(subset):5d} rows in {time.perf_counter() - t:6.1f} s; "
          f"positions min {pos[0]} median {pos[len(pos) // 2]}; readers per location {dict(sorted(locs.items()))}",
          flush=True)
    return out


feature_selection.compute_dense_rows = _traced

if __name__ == "__main__":
    sys.argv = ["bench_one.py", *sys.argv[1:]]
    bench_one.main()
