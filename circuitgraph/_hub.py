"""Is the Hugging Face hub reachable?  Asked once, in about a second, before a hub name is used.

Without a network huggingface_hub retries each request with back-off ("Retrying in 8s"...) for
about a minute before it gives up.  :func:`require_hub` opens one TCP connection to the hub's
endpoint (``HF_ENDPOINT``, default ``https://huggingface.co``), or to the proxy that
``HTTPS_PROXY`` / ``HTTP_PROXY`` names for it, with a short timeout, and raises one line
saying what to do when it cannot.  With ``HF_HUB_OFFLINE=1`` nothing is asked: only cached
files are used.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from urllib.parse import urlsplit

from circuitgraph.errors import LoadError

__all__ = ["hub_offline", "hub_endpoint", "require_hub", "PROBE_TIMEOUT_S"]

#: seconds the connection to the hub (or its proxy) may take
PROBE_TIMEOUT_S = 2.0
_reachable: set[tuple[str, int]] = set()


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set (cached files only)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT``, else huggingface_hub's default."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _target(endpoint: str) -> tuple[str, int, str]:
    """``(host, port, what)`` to connect to: the endpoint, or the proxy used for it."""
    parts = urlsplit(endpoint)
    host = parts.hostname or "huggingface.co"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if p.hostname:
            return p.hostname, p.port or 8080, f"the proxy {p.hostname}:{p.port or 8080} for {endpoint}"
    return host, port, endpoint


def require_hub(what: str) -> None:
    """Return when the hub can be reached (or ``HF_HUB_OFFLINE`` is set); else raise a one-line
    :class:`~circuitgraph.errors.LoadError` for ``what`` (e.g. ``"model: {name: gpt2}"``) saying
    to set ``HF_HUB_OFFLINE=1`` or use a local folder."""
    if hub_offline():
        return
    host, port, shown = _target(hub_endpoint())
    if (host, port) in _reachable:
        return
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or type(exc).__name__)
        raise LoadError(
            f"{what} needs the Hugging Face hub, and {shown} cannot be reached ({reason}, within "
            f"{PROBE_TIMEOUT_S:g} s); set HF_HUB_OFFLINE=1 to use the files already in the Hugging Face cache, or "
            "save them locally and give a folder (model: {path: DIR}, transcoders: {path: DIR})"
        ) from None
    _reachable.add((host, port))
