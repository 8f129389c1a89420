"""What the reference servers share: the base URL a bound server answers on, and the bearer-token check."""

from __future__ import annotations

import hmac
from socketserver import TCPServer


def base_url(server: TCPServer) -> str:
    """``http://HOST:PORT`` of a bound server (an IPv6 host in brackets; port 0 resolved to the bound port)."""
    host, port = server.server_address[:2]
    name = host.decode() if isinstance(host, bytes) else str(host)
    name = f"[{name}]" if ":" in name else name
    return f"http://{name}:{port}"


def bearer_matches(authorization: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (compared in constant time)."""
    scheme, _, value = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode("utf-8", "replace"),
                                                              token.encode())
