#!/usr/bin/env bash
# Fetch the JavaScript libraries that circuit-tracer's bundled attribution-graph frontend loads
# from CDNs (d3 v7, d3-jetpack, d3-collection's nest, dagre, pako) into .viewer-libs/, with npm,
# so the frontend can be shown offline in headless Chromium (tests/test_viewer.py,
# scripts/make_report_screenshots.py).  Idempotent; needs npm.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${CIRCUITGRAPH_VIEWER_LIBS:-.viewer-libs}"
if [ -f "$DEST/d3.min.js" ] && [ -f "$DEST/d3-jetpack.js" ] && [ -f "$DEST/d3-collection.min.js" ] \
   && [ -f "$DEST/dagre.min.js" ] && [ -f "$DEST/pako.min.js" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm not found; install it (Debian: apt-get install npm)" >&2
  exit 1
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent d3@7.9.0 d3-jetpack@2.3.0 d3-collection@1.0.7 dagre@0.8.5 pako@2.1.0 >/dev/null)
mkdir -p "$DEST"
for pkg in "$WORK"/*.tgz; do
  name="$(basename "$pkg" .tgz)"
  mkdir -p "$WORK/$name"
  tar xzf "$pkg" -C "$WORK/$name"
done
cp "$WORK"/d3-7.9.0/package/dist/d3.min.js "$DEST/d3.min.js"
cp "$WORK"/d3-jetpack-2.3.0/package/build/d3-jetpack.cjs "$DEST/d3-jetpack.js"
cp "$WORK"/d3-collection-1.0.7/package/dist/d3-collection.min.js "$DEST/d3-collection.min.js"
cp "$WORK"/dagre-0.8.5/package/dist/dagre.min.js "$DEST/dagre.min.js"
cp "$WORK"/pako-2.1.0/package/dist/pako.min.js "$DEST/pako.min.js"
echo "wrote $DEST/ (d3 7.9.0, d3-jetpack 2.3.0, d3-collection 1.0.7, dagre 0.8.5, pako 2.1.0)"
