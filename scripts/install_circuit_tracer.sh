#!/usr/bin/env bash
# Create (or reuse) circuit-tracer 0.5.0's own virtual environment, used by the tests that
# compare circuitgraph with circuit-tracer and by benchmarks/circuit_tracer/.
#
# circuit-tracer pins transformers<=4.57.3 and brings an older transformer-lens, which conflict
# with circuitgraph's own packages, hence a separate venv (default: <repo>/.venv-ct, gitignored).
# The tests find its interpreter at <repo>/.venv-ct/bin/python, or at $CIRCUITGRAPH_CT_PYTHON.
#
# Usage: bash scripts/install_circuit_tracer.sh [VENV]
#
# Idempotent: a venv that already has the right versions is left untouched.  torch==2.13.0 is
# installed first and pinned through a constraints file, so pip never replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:-$PWD/.venv-ct}"
PY="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
CT_VERSION="0.5.0"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[install_circuit_tracer] creating $VENV"
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
    echo "[install_circuit_tracer] $VENV already has torch $TORCH_VERSION and circuit-tracer $CT_VERSION"
    exit 0
fi

"$VENV/bin/python" -m pip install --upgrade --quiet pip
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"

if ! have torch "$TORCH_VERSION"; then
    echo "[install_circuit_tracer] installing torch==$TORCH_VERSION"
    "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
fi
echo "[install_circuit_tracer] installing circuit-tracer==$CT_VERSION"
"$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" "circuit-tracer==$CT_VERSION"

"$VENV/bin/python" - <<'PYEOF'
from importlib.metadata import version
for p in ("torch", "circuit-tracer", "transformer-lens", "transformers"):
    print(f"[install_circuit_tracer] {p} {version(p)}")
PYEOF
