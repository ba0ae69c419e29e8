#!/usr/bin/env python
"""Show that the test suite catches wrong numbers: apply one deliberate mistake at a time to a
COPY of the code and check that a fast subset of the tests fails on each.

    python scripts/mutation_check.py                 # every mutation, the default subset
    python scripts/mutation_check.py --list          # the mutations
    python scripts/mutation_check.py --only reversed-decoder-rows wrong-head
    python scripts/mutation_check.py --tests tests/test_edges_independent.py

For each mutation the repository's ``circuitgraph/``, ``tests/`` and ``examples/`` are copied to
a temporary directory, one exact piece of source text is replaced (it must occur exactly once,
so a mutation cannot silently stop applying when the code changes; tests/test_mutation_check.py
checks that too), and pytest runs the subset there with ``-x``.  The unmutated copy is run first
and must pass.  Prints one line per mutation (caught / NOT CAUGHT, the first failing test; a pytest run
that ends in anything but test failures is an ERROR, not a catch) and exits 1 if any mutation
is not caught.  The working tree is never modified.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the fast subset: the engine's identities and the independent edge check
DEFAULT_TESTS = ["tests/test_edges_independent.py", "tests/test_attribution.py"]


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # relative to the repository
    find: str
    replace: str


MUTATIONS = [
    Mutation(
        "reversed-decoder-rows",
        "the transcoder's decoder rows in reverse order (each feature writes another feature's row; "
        "the error node absorbs the difference, so completeness still holds)",
        "circuitgraph/attribution/nodes_builder.py",
        'st["dec"][layer] = (active, b.c(b.tc.decoder_rows(layer, active.cpu())))',
        'st["dec"][layer] = (active, b.c(b.tc.decoder_rows(layer, active.cpu())).flip(0))',
    ),
    Mutation(
        "ln1-sigma-for-ln2",
        "a feature's reader direction divided by ln1's sigma instead of ln2's (wrong norm scale)",
        "circuitgraph/attribution/nodes_builder.py",
        "    tc, norm, device, dtype = b.tc[layer], fm.ln2[layer], b.device, b.dtype\n",
        "    tc, norm, device, dtype = b.tc[layer], fm.ln1[layer], b.device, b.dtype\n",
    ),
    Mutation(
        "neuron-ln1-sigma",
        "a neuron's reader direction divided by ln1's sigma instead of ln2's (wrong norm scale)",
        "circuitgraph/attribution/nodes_builder.py",
        "    g = g / fm.ln2[layer].sigma[t]\n",
        "    g = g / fm.ln1[layer].sigma[t]\n",
    ),
    Mutation(
        "wrong-head",
        "each head's output vector given to the next head's node (labels shifted; the sum is unchanged)",
        "circuitgraph/attribution/nodes_builder.py",
        'heads = torch.einsum("thk,hkd->thd", z, w["W_O"])  # (T, H, d_model)',
        'heads = torch.einsum("thk,hkd->thd", z, w["W_O"]).roll(1, dims=1)  # (T, H, d_model)',
    ),
    Mutation(
        "off-by-one-position",
        "feature writers registered one position early",
        "circuitgraph/attribution/nodes_builder.py",
        "            b.writers.add_scaled(loc, t, rows, scales, basis, at)\n",
        "            b.writers.add_scaled(loc, t - 1, rows, scales, basis, at)\n",
    ),
    Mutation(
        "transposed-attention-map",
        "frozen attention propagated with A instead of A^T (the OV map applied from the wrong side)",
        "circuitgraph/attribution/frozen_model.py",
        "At = self.pattern(layer, T).transpose(1, 2)",
        "At = self.pattern(layer, T)",
    ),
    Mutation(
        "transposed-skip",
        "the skip transcoder's W_skip used untransposed (the error node's skip path)",
        "circuitgraph/attribution/nodes_builder.py",
        "b.c(lin.tc_input[layer]) @ b.c(W_skip).T, slice(0, T))",
        "b.c(lin.tc_input[layer]) @ b.c(W_skip), slice(0, T))",
    ),
    Mutation(
        "no-centring",
        "LayerNorm's centring left out of the feature reader direction",
        "circuitgraph/attribution/nodes_builder.py",
        "g = NormWeights(None, None, norm.center).reader_direction(W)",
        "g = NormWeights(None, None, False).reader_direction(W)",
    ),
]


def apply(root: Path, m: Mutation) -> None:
    """Replace ``m.find`` (which must occur exactly once) in the copy under ``root``."""
    path = root / m.path
    text = path.read_text()
    n = text.count(m.find)
    if n != 1:
        raise SystemExit(f"mutation {m.name}: the text to replace occurs {n} times in {m.path} (expected once); "
                         "update scripts/mutation_check.py to the current code")
    path.write_text(text.replace(m.find, m.replace))


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in ("circuitgraph", "tests", "examples"):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")


def run_tests(root: Path, tests: list[str], timeout: float) -> tuple[int, str, float]:
    """(pytest's exit code, first failing test or what went wrong, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_WAIT_POLICY": "PASSIVE"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    seconds = time.perf_counter() - t0
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.M)
    if proc.returncode not in (0, 1):  # not a test failure: collection error, usage error, crash
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        failed = [f"pytest exit {proc.returncode}: {' | '.join(tail)}"]
    return proc.returncode, (failed[0] if failed else ""), seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    ap.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="pytest arguments (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    args = ap.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:26s} {m.path}: {m.what}")
        return 0
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"unknown mutation(s) {sorted(unknown)}; see --list", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="circuitgraph-mutation-") as tmp:
        base = Path(tmp) / "base"
        copy_tree(base)
        for m in chosen:  # fail early, before any test run, if a mutation no longer applies
            apply_root = Path(tmp) / "probe"
            shutil.copytree(base / "circuitgraph", apply_root / "circuitgraph")
            apply(apply_root, m)
            shutil.rmtree(apply_root)
        code, first, seconds = run_tests(base, args.tests, args.timeout)
        print(f"{'unmutated':26s} {'passes' if code == 0 else 'FAILS: ' + first} ({seconds:.0f} s)", flush=True)
        if code != 0:
            return 1
        missed, broken = [], []
        for m in chosen:
            root = Path(tmp) / m.name
            copy_tree(root)
            apply(root, m)
            code, first, seconds = run_tests(root, args.tests, args.timeout)
            status = {0: "NOT CAUGHT", 1: f"caught by {first}"}.get(code, f"ERROR (not a test failure): {first}")
            print(f"{m.name:26s} {status} ({seconds:.0f} s)", flush=True)
            (missed if code == 0 else broken if code != 1 else []).append(m.name)
            shutil.rmtree(root)
    caught = len(chosen) - len(missed) - len(broken)
    print(f"{caught} of {len(chosen)} mutations caught" + (f"; missed: {missed}" if missed else "")
          + (f"; errors: {broken}" if broken else ""))
    return 1 if missed or broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
