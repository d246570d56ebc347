"""HTTP over a Unix domain socket: a tiny client for the worker's API (stdlib only)."""

from __future__ import annotations

import http.client
import json
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None = None):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def request(
    path: str, method: str, url: str, body: dict | None = None, timeout: float | None = None
) -> tuple[int, dict | bytes, str]:
    """One request; returns (status, JSON-decoded or raw body, content type)."""
    conn = UnixHTTPConnection(path, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, url, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        ctype = resp.getheader("Content-Type", "")
        if ctype.startswith("application/json"):
            return resp.status, json.loads(data or b"{}"), ctype
        return resp.status, data, ctype
    finally:
        conn.close()
