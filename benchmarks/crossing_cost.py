#!/usr/bin/env python
"""What one frozen attention crossing costs per row, by step: the floor of exact long-prompt rows.

    python benchmarks/crossing_cost.py [--positions 2048] [--rows 47] [--d-model 768] [--heads 12]

A row whose reader sits at position ``p`` crosses every frozen attention layer below its own
with a gradient at every position up to ``p``: ``W_O`` (``p d^2`` multiply-adds), the causal
pattern product (``p^2 d / 2``) and ``W_V`` (``p d^2``).  This times those steps as
:meth:`circuitgraph.attribution.frozen_model.FrozenLinearModel._attention_out` runs them (the same
GEMMs, layouts and causal blocks, on random tensors of the same shapes) and prints milliseconds
per row for each, with the GFLOP/s reached.
"""

from __future__ import annotations

import argparse
import time

import torch

from circuitgraph.attribution.frozen_model import CAUSAL_BLOCK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=47, help="rows in the batch (a 2,048-token engine call held 45-57)")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T, D, H = args.rows, args.positions, args.d_model, args.heads
    dh = D // H
    G = torch.randn(B, T, D)
    W_O, W_V = torch.randn(H * dh, D), torch.randn(H * dh, D)
    A = torch.rand(H, T, T).tril_()
    buf0, buf1 = torch.empty(B * T * D), torch.empty(B * T * D)

    def crossing() -> dict[str, float]:
        t = {"start": time.perf_counter()}
        u = torch.mm(G.view(B * T, D), W_O.T, out=buf0.view(B * T, D))
        t["W_O"] = time.perf_counter()
        up = buf1.view(H, T, B, dh)
        up.copy_(u.view(B, T, H, dh).permute(2, 1, 0, 3))
        up = up.view(H, T, B * dh)
        t["copy in"] = time.perf_counter()
        At, v = A.transpose(1, 2), buf0.view(H, T, B * dh)
        for s0 in range(0, T, CAUSAL_BLOCK):
            s1 = min(T, s0 + CAUSAL_BLOCK)
            torch.bmm(At[:, s0:s1, s0:], up[:, s0:], out=v[:, s0:s1])
        t["pattern"] = time.perf_counter()
        vp = buf1.view(B, T, H, dh)
        vp.copy_(v.view(H, T, B, dh).permute(2, 1, 0, 3))
        t["copy out"] = time.perf_counter()
        out = torch.mm(vp.view(B * T, H * dh), W_V, out=buf0.view(B * T, D))
        t["W_V"] = time.perf_counter()
        G.add_(out.view(B, T, D))
        t["add"] = time.perf_counter()
        keys = list(t)
        return {k: t[k] - t[p] for p, k in zip(keys, keys[1:], strict=False)}

    crossing()  # first touch of the buffers
    steps = crossing()
    pattern_flop = sum(2 * H * min(CAUSAL_BLOCK, T - s0) * (T - s0) * B * dh for s0 in range(0, T, CAUSAL_BLOCK))
    flops = {"W_O": 2 * B * T * D * D, "pattern": pattern_flop, "W_V": 2 * B * T * D * D}
    print(f"{B} rows, {T} positions, d_model {D}, {H} heads, {torch.get_num_threads()} threads")
    for name, s in steps.items():
        rate = f"  {flops[name] / s / 1e9:6.1f} GFLOP/s" if name in flops else ""
        print(f"  {name:9s} {1e3 * s / B:7.2f} ms per row{rate}")
    total = sum(steps.values())
    print(f"  total     {1e3 * total / B:7.2f} ms per row and crossing ({sum(flops.values()) / B / 1e9:.1f} GFLOP)")


if __name__ == "__main__":
    main()
