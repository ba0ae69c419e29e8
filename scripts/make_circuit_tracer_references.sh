#!/usr/bin/env bash
# Regenerate tests/data/circuit_tracer/*.json: circuit-tracer's own Neuronpedia files
# (create_graph_files, node_threshold 0.8, edge_threshold 0.98, its default top logits) for
# the two shipped fixtures.  Needs circuit-tracer 0.5.0 in a virtualenv: the python given as
# $1, else $CIRCUITGRAPH_CT_PYTHON, else .venv-ct/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-${CIRCUITGRAPH_CT_PYTHON:-.venv-ct/bin/python}}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
for name in example-gpt2 example-llama; do
  B="examples/fixtures/$name"
  "$PY" benchmarks/circuit_tracer/run_ct.py --model "$B/model" --transcoders "$B/transcoders" \
    --tokens "$B/prompt.json" --out "$OUT/$name/graph.npz" --prune-out "$OUT/$name/prune" --slug ct
  cp "$OUT/$name/prune/ct.json" "tests/data/circuit_tracer/$name.json"
done
echo "wrote tests/data/circuit_tracer/example-gpt2.json and example-llama.json"
