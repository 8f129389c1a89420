#!/usr/bin/python3
"""A stand-in for the Neutron API, for a test cloud whose servers boot with ``networks="none"``.

Nova (Zed) still asks the network service about such servers: ``GET /servers/{id}``
lists security groups, and delete calls ``deallocate_for_instance`` which lists the
instance's ports. Without a ``network`` endpoint those calls fail with HTTP 500.
This server answers every collection GET with an empty list, a GET of one item with
404 and every DELETE with 204 — all Nova needs when no ports exist. It is NOT Neutron
and does not check tokens; it listens on loopback only.

Usage: neutron_stub.py HOST PORT
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, code: int, body: object = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        parts = [p for p in urlparse(self.path).path.split("/") if p]
        if not parts:
            host, port = self.server.server_address[:2]
            return self._send(200, {"versions": [{"id": "v2.0", "status": "CURRENT", "links": [
                {"rel": "self", "href": f"http://{host}:{port}/v2.0/"}]}]})
        if parts == ["v2.0"]:
            return self._send(200, {"resources": []})
        if len(parts) >= 3:
            return self._send(404, {"NeutronError": {"type": "NotFound", "message": "stub: no such item", "detail": ""}})
        key = parts[-1].removesuffix(".json").replace("-", "_")
        return self._send(200, {key: []})

    def do_DELETE(self) -> None:  # noqa: N802
        self._send(204)

    def do_PUT(self) -> None:  # noqa: N802
        self._send(404, {"NeutronError": {"type": "NotFound", "message": "stub: read-only", "detail": ""}})

    do_POST = do_PUT

    def log_message(self, fmt: str, *args: object) -> None:
        sys.stderr.write(f"{self.log_date_time_string()} {fmt % args}\n")


if __name__ == "__main__":
    ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
