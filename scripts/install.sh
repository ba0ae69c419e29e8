#!/usr/bin/env bash
# Install circuitgraph and everything it needs on a fresh Debian/Ubuntu machine with Python 3.11:
# Graphviz, Chromium and npm, the CPU build of torch, and the package itself with its test
# and dataset extras (pyarrow, pandas, duckdb, ray).  Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# system packages: Graphviz `dot` (diagrams), Chromium (headless checks of the HTML report and of
# Neuronpedia exports in circuit-tracer's frontend) and npm (fetches that frontend's libraries)
missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "warning: ${missing[*]} not found and apt-get unavailable; SVG/PNG export and browser checks will fail or skip" >&2
  fi
fi
# the JavaScript libraries circuit-tracer's frontend loads from CDNs, for the offline viewer check
bash scripts/fetch_viewer_libs.sh || echo "warning: could not fetch the viewer's libraries; the viewer check will skip" >&2

PY="${PYTHON:-python3}"
# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[test,dataset]"
