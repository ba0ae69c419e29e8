#!/usr/bin/env bash
# Install circuitgraph and everything it needs on a fresh Debian/Ubuntu machine with Python 3.11:
# the Graphviz `dot` binary (for SVG/PNG diagrams), the CPU build of torch, and the package
# itself with its test and dataset extras (pyarrow, pandas, duckdb, ray).  Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v dot >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq graphviz >/dev/null
  else
    echo "warning: Graphviz 'dot' not found and apt-get unavailable; SVG/PNG export will fail" >&2
  fi
fi

PY="${PYTHON:-python3}"
# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[test,dataset]"
