"""Headless Chromium for tests and screenshots: the HTML report, and Neuronpedia exports shown in
circuit-tracer's bundled attribution-graph frontend.

* :func:`find_chromium` / :func:`run_chromium` -- Debian's ``chromium`` (or Chrome) with the
  flags a sandboxed CI machine needs (``--headless --no-sandbox --disable-gpu
  --disable-background-networking --disable-component-update --no-first-run`` and a fresh
  ``--user-data-dir``), to dump the DOM after scripts ran or to take a screenshot.
* :func:`playwright_unavailable` / :func:`playwright_chromium` -- the same Chromium driven by
  Playwright for Python (real clicks and key presses; used by the explorer's tests and
  screenshots); Playwright's own browsers are never downloaded.
* :func:`serve_viewer` -- circuit-tracer's frontend (``circuit_tracer/frontend/assets`` of the
  circuit-tracer 0.5.0 virtualenv, see :mod:`circuitgraph.testing.circuit_tracer`) served on
  ``127.0.0.1`` with graph files, as its ``local_server`` serves them.  The frontend loads
  d3, d3-jetpack, dagre and pako from CDNs; offline they come from the npm packages that
  ``scripts/fetch_viewer_libs.sh`` puts in ``.viewer-libs/`` (or ``$CIRCUITGRAPH_VIEWER_LIBS``).
  Two small adaptations are made to that copy (documented in docs/reports.md): the npm
  d3-jetpack build is loaded onto the page's d3 v7 (with ``d3.nest`` from d3-collection), and
  ``d3.conventions`` gains the ``drawAxis`` helper of the transformer-circuits build of jetpack.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from circuitgraph.testing.circuit_tracer import circuit_tracer_python

__all__ = [
    "find_chromium",
    "chromium_unavailable",
    "run_chromium",
    "viewer_unavailable",
    "serve_viewer",
    "playwright_unavailable",
    "playwright_chromium",
    "VIEWER_LIB_FILES",
]

REPO = Path(__file__).resolve().parents[2]
VIEWER_LIBS_ENV = "CIRCUITGRAPH_VIEWER_LIBS"
#: the files scripts/fetch_viewer_libs.sh writes (npm package, file inside it)
VIEWER_LIB_FILES = ("d3.min.js", "d3-jetpack.js", "d3-collection.min.js", "dagre.min.js", "pako.min.js")
_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--no-first-run", "--hide-scrollbars")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary, or None."""
    for name in _CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_unavailable() -> str | None:
    """Why headless-browser tests cannot run here (None when they can)."""
    if find_chromium() is None:
        return ("Chromium is not installed (Debian: `apt-get install chromium`; scripts/install.sh does it "
                "in CI)")
    return None


def run_chromium(url: str, *, dump_dom: bool = False, screenshot: str | os.PathLike[str] | None = None,
                 window: tuple[int, int] = (1280, 1600), budget_ms: int = 10_000, timeout: float = 120) -> str:
    """Load ``url`` in headless Chromium, let its scripts run for ``budget_ms`` of virtual time,
    and return the DOM (``dump_dom``) or write a PNG screenshot.  Returns stdout."""
    binary = find_chromium()
    if binary is None:
        raise RuntimeError(chromium_unavailable())
    with tempfile.TemporaryDirectory(prefix="cg-chromium-") as profile:
        argv = [binary, *_FLAGS, f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}",
                f"--virtual-time-budget={budget_ms}"]
        if dump_dom:
            argv.append("--dump-dom")
        if screenshot is not None:
            argv.append(f"--screenshot={os.fspath(screenshot)}")
        done = subprocess.run([*argv, url], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


# --------------------------------------------------------------------------- Playwright
def playwright_unavailable() -> str | None:
    """Why Playwright cannot drive Chromium here (None when it can)."""
    reason = chromium_unavailable()
    if reason:
        return reason
    try:
        import playwright.sync_api  # noqa: F401 - the test extra
    except ImportError:
        return ("Playwright for Python is not installed (pip install playwright, in the test extra; it drives the "
                "system's Chromium and needs no browser download)")
    return None


@contextmanager
def playwright_chromium() -> Iterator[object]:
    """A headless ``playwright`` Browser running the system's Chromium (:func:`find_chromium`)."""
    reason = playwright_unavailable()
    if reason:
        raise RuntimeError(reason)
    from playwright.sync_api import sync_playwright

    flags = [f for f in _FLAGS if f != "--headless"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), headless=True, args=flags)
        try:
            yield browser
        finally:
            browser.close()


# --------------------------------------------------------------------------- the viewer
def _viewer_libs() -> Path:
    env = os.environ.get(VIEWER_LIBS_ENV)
    return Path(env) if env else REPO / ".viewer-libs"


@functools.lru_cache(maxsize=1)
def circuit_tracer_frontend() -> Path | None:
    """``circuit_tracer/frontend/assets`` of the circuit-tracer virtualenv, or None."""
    python = circuit_tracer_python()
    if not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('circuit_tracer').submodule_search_locations[0])"],
        capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        return None
    assets = Path(done.stdout.strip()) / "frontend" / "assets"
    return assets if (assets / "index.html").is_file() else None


def viewer_unavailable() -> str | None:
    """Why the viewer cannot be shown here (None when it can)."""
    reason = chromium_unavailable()
    if reason:
        return reason
    if circuit_tracer_frontend() is None:
        return ("circuit-tracer 0.5.0 (its bundled frontend) is not installed: run scripts/install_circuit_tracer.sh "
                "(creates .venv-ct) or set CIRCUITGRAPH_CT_PYTHON")
    libs = _viewer_libs()
    missing = [f for f in VIEWER_LIB_FILES if not (libs / f).is_file()]
    if missing:
        return (f"the frontend's JavaScript libraries are missing from {libs.name}/ ({', '.join(missing)}): "
                "run scripts/fetch_viewer_libs.sh (needs npm)")
    return None


_SHIMS = """
(function () {
  // transformer-circuits' jetpack build gives d3.conventions a drawAxis helper; the npm build does not
  var conventions = d3.conventions;
  d3.conventions = function (c) {
    c = conventions(c || {});
    c.drawAxis = function (svg) {
      svg = svg || c.svg;
      svg.append('g').attr('class', 'x axis').attr('transform', 'translate(0,' + c.height + ')').call(c.xAxis);
      svg.append('g').attr('class', 'y axis').call(c.yAxis);
    };
    return c;
  };
})();
"""


def _build_viewer(root: Path, docs: Mapping[str, Mapping]) -> None:
    assets, libs = circuit_tracer_frontend(), _viewer_libs()
    assert assets is not None
    shutil.copytree(assets, root, dirs_exist_ok=True)
    (root / "lib").mkdir(exist_ok=True)
    for name in ("d3.min.js", "d3-collection.min.js", "dagre.min.js", "pako.min.js"):
        shutil.copy(libs / name, root / "lib" / name)
    # the npm UMD build of d3-jetpack replaces window.d3 with a fresh object; extend the page's d3
    jetpack = (libs / "d3-jetpack.js").read_text(encoding="utf-8")
    (root / "lib" / "d3-jetpack.js").write_text(jetpack.replace("factory(global.d3 = {},", "factory(global.d3 = global.d3 || {},"),
                                                encoding="utf-8")
    (root / "lib" / "shims.js").write_text(_SHIMS, encoding="utf-8")
    index = (root / "index.html").read_text(encoding="utf-8")
    local = ("<script src='./lib/d3.min.js'></script>\n"
             "<script>var __d3 = d3; window.d3 = {};</script>\n"
             "<script src='./lib/d3-collection.min.js'></script>\n"
             "<script>__d3.nest = d3.nest; window.d3 = __d3;</script>\n"
             "<script src='./lib/d3-jetpack.js'></script>\n"
             "<script src='./lib/shims.js'></script>\n"
             "<script src='./lib/dagre.min.js'></script>\n"
             "<script src='./lib/pako.min.js'></script>\n")
    index = re.sub(r"<script src='https?://[^']+'></script>\n", "", index)
    index = index.replace("<script src='./feature_examples/", local + "<script src='./feature_examples/", 1)
    (root / "index.html").write_text(index, encoding="utf-8")
    for sub in ("data", "graph_data"):
        (root / sub).mkdir(exist_ok=True)
    graphs = []
    for slug, doc in docs.items():
        text = json.dumps(doc)
        (root / "data" / f"{slug}.json").write_text(text, encoding="utf-8")
        (root / "graph_data" / f"{slug}.json").write_text(text, encoding="utf-8")
        graphs.append(dict(doc["metadata"], slug=slug))
    (root / "data" / "graph-metadata.json").write_text(json.dumps({"graphs": graphs}), encoding="utf-8")


@contextmanager
def serve_viewer(docs: Mapping[str, Mapping]) -> Iterator[str]:
    """Serve circuit-tracer's frontend with the Neuronpedia documents ``{slug: doc}``; yields the
    base URL (open ``{url}/index.html?slug=SLUG``)."""
    reason = viewer_unavailable()
    if reason:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix="cg-viewer-") as tmp:
        root = Path(tmp)
        _build_viewer(root, docs)
        handler = functools.partial(_QuietHandler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        pass
