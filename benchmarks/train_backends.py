"""One ``circuitgraph train`` run of a TopK transcoder set with a chosen backend, for the side-by-side
of circuitgraph's own trainer and eai-sparsify in docs/training.md.  Run each backend in its own
process under ``/usr/bin/time -v`` (CPU seconds and peak RSS of the whole run)::

    python benchmarks/train_backends.py --backend sparsify --text FILE... --out DIR [--layers 0 1 2 3]

Prints one JSON line: training seconds, tokens/s, held-out explained variance and L0 per layer,
and the held-out next-token losses (model, spliced, zero-ablated MLPs).
"""

from __future__ import annotations

import argparse
import json
import time

from circuitgraph.adapters.loading import load_pretrained
from circuitgraph.spec.train import load_train_spec
from circuitgraph.training import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["circuitgraph", "sparsify"], required=True)
    ap.add_argument("--activation", default="topk")
    ap.add_argument("--kind", default="transcoder")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a pretrained model name")
    ap.add_argument("--text", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16_128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-tokens", type=int, default=2048)
    a = ap.parse_args()
    spec = load_train_spec({"format_version": 1, "model": {"pretrained": a.model}, "train": {
        "text": a.text, "output": a.out, "backend": a.backend, "kind": a.kind, "activation": a.activation,
        "k": a.k, "layers": a.layers, "width": a.width, "tokens": a.tokens, "context": a.context, "batch": a.batch,
        "eval_tokens": a.eval_tokens, "checkpoint_every": 10, "resume": False}})
    t0 = time.perf_counter()
    adapter = load_pretrained(a.model)
    m = train(spec, adapter=adapter)
    e = m["eval"]
    print(json.dumps({
        "backend": a.backend, "activation": a.activation, "kind": a.kind, "layers": a.layers, "width": a.width,
        "k": a.k, "train_tokens": m["train_tokens"], "train_seconds": round(m["seconds"], 1),
        "tokens_per_s": round(m["train_tokens"] / m["seconds"], 1), "total_seconds": round(time.perf_counter() - t0, 1),
        "explained_variance": {l: round(v["explained_variance"], 4) for l, v in e["layers"].items()},
        "l0": {l: round(v["l0"], 2) for l, v in e["layers"].items()},
        "dead": {l: round(v["dead_fraction"], 3) for l, v in e["layers"].items()},
        "ce_loss": {k: round(v, 4) for k, v in e["ce_loss"].items()}, "loss_recovered": e["loss_recovered"]}))


if __name__ == "__main__":
    main()
