"""The explorer's HTTP server: the standard library's ``ThreadingHTTPServer``, the page's static
files from the package, the JSON API of :mod:`circuitgraph.serve.api`, and the raw files under
``PATH``.

Only what lies under ``PATH`` is served: API names are looked up in the catalog (never opened as
paths), and ``/files/REL`` refuses ``..``, absolute paths, backslashes and NUL (403), and anything
that does not resolve, symbolic links followed, inside ``PATH`` (403; 404 when it does not exist).
The server binds to ``127.0.0.1`` unless told otherwise, and on a loopback address answers only
requests whose ``Host`` is a loopback name (a web page elsewhere cannot reach it through DNS
rebinding).
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from circuitgraph.serve.api import VIEWS, ApiError, Download, Explorer
from circuitgraph.serve.catalog import Catalog, inside

__all__ = ["make_server", "running_server", "ExplorerServer", "DEFAULT_HOST", "DEFAULT_PORT", "STATIC_FILES"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
_LOG = logging.getLogger(__name__)
_STATIC = resources.files("circuitgraph.serve") / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
          ".json": "application/json", ".csv": "text/csv; charset=utf-8"}
#: the page's files (the folder is flat): every asset is in the package, nothing is fetched
STATIC_FILES = frozenset(p.name for p in _STATIC.iterdir() if p.is_file() and not p.name.startswith("."))
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


class ExplorerServer(http.server.ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` holding the :class:`Explorer` its handlers answer from."""

    daemon_threads = True
    #: closing the server (Ctrl-C) does not wait for the handler threads: a keep-alive connection's
    #: thread may still be reading its socket, and it ends with the process anyway
    block_on_close = False

    def __init__(self, address: tuple[str, int], explorer: Explorer):
        self.explorer = explorer
        self.loopback = address[0] in ("127.0.0.1", "localhost", "::1")
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


def make_server(path: str | os.PathLike[str], *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                features: list[str | os.PathLike[str]] = ()) -> ExplorerServer:
    """The explorer of ``path`` (a graph file, a dataset run, a features folder or a folder of them),
    bound to ``host:port`` (``port=0``: any free port; the chosen one is in ``server.url``)."""
    explorer = Explorer(Catalog(path, features=list(features)))
    return ExplorerServer((host, port), explorer)


@contextmanager
def running_server(path: str | os.PathLike[str], **kwargs: Any) -> Iterator[ExplorerServer]:
    """:func:`make_server` serving in a background thread while the block runs (tests, scripts)."""
    server = make_server(path, **{"port": 0, **kwargs})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _split(path: str) -> tuple[str, dict[str, list[str]]]:
    raw, _, query = path.partition("?")
    raw = raw.partition("#")[0]
    try:
        params = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=64)
    except ValueError as exc:
        raise ApiError(400, f"bad query string: {exc}") from None
    return raw, params


def _unquote(segment: str) -> str:
    return urllib.parse.unquote(segment, errors="strict")


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ExplorerServer
    server_version = "circuitgraph-explorer"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        _LOG.debug("%s - %s", self.address_string(), format % args)

    # ------------------------------------------------------------------ responses
    def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        self._send(status, data, "application/json; charset=utf-8")

    def _error(self, status: int, message: str, detail: dict[str, Any] | None = None) -> None:
        self._json(status, {**(detail or {}), "error": " ".join(message.split())})

    # ------------------------------------------------------------------ routing
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        try:
            if self.server.loopback and not self._loopback_host():
                raise ApiError(403, "this explorer answers requests for 127.0.0.1 or localhost only")
            if not self.path.startswith("/"):
                raise ApiError(400, "the request target must be a path starting with /")
            raw, query = _split(self.path)
            self._route(raw, query)
        except ApiError as exc:
            self._error(exc.status, exc.message, exc.detail)
        except UnicodeDecodeError:
            self._error(400, "the request's percent-encoded path is not UTF-8")
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 - a bug: answer 500 with one line and keep serving
            _LOG.exception("explorer request %s failed", self.path)
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")

    def _loopback_host(self) -> bool:
        host = (self.headers.get("Host") or "").strip().lower()
        if host.startswith("["):
            name = host[: host.find("]") + 1]
        else:
            name = host.rsplit(":", 1)[0] if ":" in host else host
        return name in _LOOPBACK_NAMES

    def _route(self, raw: str, query: dict[str, list[str]]) -> None:
        api: Explorer = self.server.explorer
        if raw in ("/", "/index.html"):
            return self._static("index.html")
        if raw.startswith("/static/"):
            return self._static(_unquote(raw[len("/static/"):]))
        if raw.startswith("/files/"):
            return self._file(raw[len("/files/"):])
        parts = raw.split("/")
        if len(parts) < 3 or parts[1] != "api":
            raise ApiError(404, f"no such page {raw[:200]!r}; the explorer is at / and its API under /api/")
        endpoint, rest = parts[2], parts[3:] if parts[3:] != [""] else []
        name = _unquote("/".join(rest))
        view = VIEWS.get(endpoint)
        if view is None:
            raise ApiError(404, f"no API endpoint {endpoint[:60]!r}; see docs/explorer.md")
        if view.path == "none":
            if rest:
                self._not_found(raw)
            answer = view.method(api, query)
        elif not rest and view.path != "segments":
            raise ApiError(404, f"/api/{endpoint}/ needs a name after it")
        elif view.path == "name":
            answer = view.method(api, name, query)
        elif view.path == "node":
            # NAME may hold slashes; the node id is always its last four segments (kind/layer/position/index)
            if len(rest) < 5:
                raise ApiError(400, "a node is /api/node/NAME/KIND/LAYER/POSITION/INDEX")
            answer = view.method(api, _unquote("/".join(rest[:-4])), _unquote("/".join(rest[-4:])), query)
        else:
            answer = view.method(api, [_unquote(r) for r in rest], query)
        if isinstance(answer, Download):
            safe = answer.filename.replace('"', "")
            return self._send(200, answer.data, answer.content_type,
                              {"Content-Disposition": f'attachment; filename="{safe}"'})
        return self._json(200, answer)

    @staticmethod
    def _not_found(raw: str) -> Any:
        raise ApiError(404, f"no such page {raw[:200]!r}")

    # ------------------------------------------------------------------ files
    def _static(self, name: str) -> None:
        if name not in STATIC_FILES:
            raise ApiError(404, f"no static file {name[:100]!r}")
        data = (_STATIC / name).read_bytes()
        self._send(200, data, _TYPES.get(Path(name).suffix, "application/octet-stream"))

    def _file(self, raw: str) -> None:
        """A file under PATH, by its relative path (every other path is refused)."""
        try:
            rel = _unquote(raw)
        except UnicodeDecodeError:
            raise ApiError(400, "the file path is not UTF-8") from None
        parts = rel.split("/")
        if not rel or "\x00" in rel or "\\" in rel or rel.startswith("/") or any(p in ("..", ".") for p in parts) \
                or (len(rel) > 1 and rel[1] == ":"):
            raise ApiError(403, "only files under the served path, by their relative path, are served")
        catalog = self.server.explorer.catalog
        root = catalog.root
        target = (catalog.root_dir / rel) if root.is_file() else (root / rel)
        if not os.path.lexists(target):
            raise ApiError(404, f"no file {rel[:200]!r} under the served path")
        allowed = target.resolve() == root if root.is_file() else inside(target, root)
        if not allowed:
            raise ApiError(403, f"{rel[:200]!r} is outside the served path")
        if not target.is_file():
            raise ApiError(404, f"{rel[:200]!r} is not a file")
        data = target.read_bytes()
        self._send(200, data, _TYPES.get(target.suffix.lower(), "application/octet-stream"),
                   {"Content-Disposition": f'attachment; filename="{target.name}"'.replace("\r", "").replace("\n", "")})
