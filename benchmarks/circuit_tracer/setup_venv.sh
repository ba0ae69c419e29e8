#!/usr/bin/env bash
# Create (or reuse) a separate virtualenv holding circuit-tracer 0.5.0, for
# side-by-side comparison with circuitgraph.  circuit-tracer pins
# transformers<=4.57.3 and transformer-lens 3.2.x, which conflict with the
# system packages, hence its own venv OUTSIDE the repository.
#
# Usage: bash benchmarks/circuit_tracer/setup_venv.sh [VENV]   (default /work/ct-venv)
#
# Idempotent: an existing venv with the right versions is left untouched.
# torch==2.13.0 is installed FIRST and pinned through a constraints file, so
# that pip never replaces it with a (multi-GB) CUDA build.
set -euo pipefail

VENV="${1:-/work/ct-venv}"
PY="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
CT_VERSION="${CT_VERSION:-0.5.0}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup_venv] creating $VENV"
    "$PY" -m venv "$VENV"
fi

have() {  # have PKG VERSION -> 0 when installed at that exact version
    "$VENV/bin/python" - "$1" "$2" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
v = version(sys.argv[1]).split("+")[0]
sys.exit(0 if v == sys.argv[2] else 1)
PYEOF
}

if have torch "$TORCH_VERSION" && have circuit-tracer "$CT_VERSION"; then
    echo "[setup_venv] $VENV already has torch $TORCH_VERSION and circuit-tracer $CT_VERSION"
    exit 0
fi

"$VENV/bin/python" -m pip install --upgrade --quiet pip
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"

if ! have torch "$TORCH_VERSION"; then
    echo "[setup_venv] installing torch==$TORCH_VERSION"
    "$VENV/bin/python" -m pip install "torch==$TORCH_VERSION"
fi
echo "[setup_venv] installing circuit-tracer==$CT_VERSION"
"$VENV/bin/python" -m pip install -c "$CONSTRAINTS" "circuit-tracer==$CT_VERSION"

"$VENV/bin/python" - <<'PYEOF'
from importlib.metadata import version
for p in ("torch", "circuit-tracer", "transformer-lens", "transformers"):
    print(f"[setup_venv] {p} {version(p)}")
PYEOF
