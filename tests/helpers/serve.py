"""Plain HTTP requests to a test server of the explorer."""

from __future__ import annotations

import http.client
import json


def request(server, path: str, host: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    """GET ``path`` exactly as given (no client-side normalisation of ``..``)."""
    h, p = server.server_address[:2]
    conn = http.client.HTTPConnection(h, p, timeout=60)
    conn.putrequest("GET", path, skip_host=True)
    conn.putheader("Host", host or f"127.0.0.1:{p}")
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    conn.close()
    return resp.status, body, headers


def get_json(server, path: str, status: int = 200):
    code, body, headers = request(server, path)
    assert code == status, (path, code, body[:300])
    assert headers["content-type"].startswith("application/json")
    return json.loads(body)
