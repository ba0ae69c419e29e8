"""Compile a tracr RASP program into a model folder and its ground-truth circuit.

Run::

    python scripts/compile_tracr.py reverse --max-seq-len 5 --out out/tracr/reverse
    python scripts/compile_tracr.py frac_prevs --vocab a b x --causal --out out/tracr/frac_prevs

writes ``OUT/model/`` (``model: {path: OUT/model}`` loads it) and ``OUT/circuit.json`` (see
:mod:`circuitgraph.testing.tracr`).  Programs: those of ``tracr.compiler.lib`` listed in
``LIBRARY_PROGRAMS`` (reverse, frac_prevs, sort, hist, length); from Python, any RASP program
through ``circuitgraph.testing.tracr.compile_program``.  Needs tracr (``pip install tracr-pypi``).
"""

from __future__ import annotations

import argparse
import sys
import time

from circuitgraph.testing.tracr import LIBRARY_PROGRAMS, compile_program, library_program, tracr_unavailable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", choices=sorted(LIBRARY_PROGRAMS))
    parser.add_argument("--out", required=True, help="output folder (model/ and circuit.json are written there)")
    parser.add_argument("--max-seq-len", type=int, default=5, help="longest input, BOS not counted (default 5)")
    parser.add_argument("--vocab", nargs="+", help="input vocabulary (default: the program's); integers for sort")
    parser.add_argument("--causal", action="store_true", help="causal attention (default: bidirectional, as tracr)")
    args = parser.parse_args(argv)
    reason = tracr_unavailable()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    program, vocab = library_program(args.program, args.max_seq_len)
    if args.vocab:
        vocab = {int(v) for v in args.vocab} if args.program == "sort" else set(args.vocab)
    start = time.perf_counter()
    compiled = compile_program(program, vocab, args.max_seq_len, args.out, causal=args.causal)
    n = len(compiled.circuit["edges"])
    print(f"{args.program}: {compiled.model_dir} ({len(compiled.vocab)} tokens, "
          f"{compiled.assembled.model_config.num_layers} layers), circuit.json with {n} true edges, "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
