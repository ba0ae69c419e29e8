#!/usr/bin/env bash
# Install circuitgraph and everything it needs on a fresh Debian/Ubuntu machine with Python 3.11,
# into a virtual environment of its own (default: <repo>/.venv), so that it works on a stock
# Debian/Ubuntu Python, which refuses `pip install` into the system Python (PEP 668).
#
# What it installs:
#   system packages (apt-get, only those missing):
#     graphviz      the `dot` binary (SVG/PNG diagrams)
#     python3-venv  only if `python3 -m venv` cannot create an environment
#     chromium, npm headless-browser checks of the HTML report, the explorer and the Neuronpedia
#                   export in circuit-tracer's frontend (npm fetches that frontend's libraries)
#   into the virtual environment (pip):
#     torch==2.13.0 (CPU), then this package with its test, dataset, tracr, gguf and train-sparsify extras
#     (pytest, hypothesis, matplotlib, ruff, pyright with its Node.js wheel, playwright for the browser
#     tests; pandas, pyarrow, duckdb,
#     ray; tracr-pypi with jax and dm-haiku on CPU, about 90 MB, for the compiled ground-truth models;
#     gguf and accelerate for GGUF checkpoints and the real-model tests' fetch of SmolLM2-135M-Instruct;
#     eai-sparsify for `circuitgraph train` with backend sparsify)
#
# Environment variables:
#   CIRCUITGRAPH_VENV=DIR          the virtual environment (default .venv in the repository)
#   CIRCUITGRAPH_SKIP_BROWSER=1    no Chromium, npm or viewer libraries (the browser tests then skip)
#   PYTHON=python3.11              the interpreter that creates the environment
#
# Afterwards use the environment's interpreter: `.venv/bin/python -m circuitgraph ...`
# (or `. .venv/bin/activate`). Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
VENV="${CIRCUITGRAPH_VENV:-.venv}"
SKIP_BROWSER="${CIRCUITGRAPH_SKIP_BROWSER:-0}"

say() { echo "[install] $*"; }

apt_install() {  # apt_install PKG... : install Debian packages, as root or through sudo
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "warning: $* not found and apt-get unavailable; install them yourself" >&2
    return 1
  fi
  local sudo=""
  if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  say "apt-get install $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
if [ "$SKIP_BROWSER" != "1" ]; then
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  apt_install "${missing[@]}" || echo "warning: SVG/PNG export and the browser checks will fail or skip" >&2
fi
if [ "$SKIP_BROWSER" != "1" ]; then
  # the JavaScript libraries circuit-tracer's frontend loads from CDNs, for the offline viewer check
  bash scripts/fetch_viewer_libs.sh || echo "warning: could not fetch the viewer's libraries; the viewer check will skip" >&2
else
  say "CIRCUITGRAPH_SKIP_BROWSER=1: no Chromium, npm or viewer libraries"
fi

# the virtual environment: a stock Debian Python needs python3-venv (ensurepip) for it
if [ ! -x "$VENV/bin/python" ]; then
  say "creating the virtual environment $VENV with $("$PY" -c 'import sys; print(sys.executable)')"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    apt_install "python${ver}-venv" || apt_install python3-venv
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"

# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build
say "pip install torch==2.13.0 (CPU) and circuitgraph-lm[test,dataset,tracr,gguf,train-sparsify] into $VENV"
"$VPY" -m pip install -q "torch==2.13.0"
"$VPY" -m pip install -q -e ".[test,dataset,tracr,gguf,train-sparsify]"
say "done: run circuitgraph with $VENV/bin/python -m circuitgraph (or . $VENV/bin/activate)"
