"""The contract API over HTTP: the server, its request handler and the checks of its inputs.

:class:`ContractServer` is a threaded ``http.server`` bound to one
:class:`~.state.ContractAPI` (loopback by default), with a ticker that advances
the world every second; :func:`make_server` builds one. ``_Handler`` routes
every method through one router (405 with ``Allow`` on known paths), checks the
bearer token (a :class:`~spotctl.core.secrets.SecretFile` is re-read on each
request), parses the query and the JSON body, and sends the state's answers
or its :class:`~.state.ApiError` as the JSON error body of
``docs/contract/openapi.yaml``.

Besides the contract's ``/v1/...`` operations it serves ``GET /sim/v1/world``
(world time, pools, instances): a simulator extension, not part of the contract.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NoReturn
from urllib.parse import parse_qs, urlsplit

from spotctl.core.ports import Clock
from spotctl.core.secrets import SecretFile, secret_value

from .._serving import base_url, bearer_matches
from .state import MAX_WAIT, ApiError, ContractAPI, bad_request
from .world import World

log = logging.getLogger(__name__)

DEFAULT_PORT = 8787
MAX_PAGE = 1000
DEFAULT_PAGE = 500
_CURSOR = re.compile(r"[A-Za-z0-9._-]{1,64}")
_RECLAIM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_BODY = 256 * 1024
_ROUTES = {  # path -> allowed methods
    "/v1/rate-card": ("GET",), "/v1/notices": ("GET",), "/v1/notices/active": ("GET",),
    "/v1/reclaims": ("POST",), "/v1/status": ("GET",), "/sim/v1/world": ("GET",),
}
_QUERY = {"/v1/notices": {"after", "wait", "limit"}}


class ContractServer(ThreadingHTTPServer):
    """The threaded HTTP server over one :class:`ContractAPI`, with the ticker that moves its world."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ContractAPI, token: str | SecretFile | None):
        self.api = api
        self.token = token  # a SecretFile is read on each request: a rotated token file takes effect at once
        self._stop = threading.Event()
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        return base_url(self)

    def serve(self) -> None:
        """Serve until :meth:`shutdown`; the world ticks every second meanwhile."""
        ticker = threading.Thread(target=self._tick, name="contract-api-ticker", daemon=True)
        ticker.start()
        try:
            self.serve_forever(poll_interval=0.2)
        finally:
            self._stop.set()
            with self.api.cond:
                self.api.cond.notify_all()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.api.sync()
            except Exception:  # keep serving; the next request or tick retries
                log.exception("contract API: advancing the simulated world failed")


def make_server(world: World, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, token: str | SecretFile | None = None,
                max_wait: float = MAX_WAIT, clock: Clock | None = None) -> ContractServer:
    """A contract API server over ``world``, bound (port 0 = any free port) but not yet serving."""
    return ContractServer((host, port), ContractAPI(world, clock=clock, max_wait=max_wait), token)


class _Handler(BaseHTTPRequestHandler):
    server: ContractServer
    protocol_version = "HTTP/1.1"
    server_version = "spotctl-contract-sim/1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("contract API: %s %s", self.address_string(), format % args)

    def _send(self, status: int, body: dict[str, object] | None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        if status != 304:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, e: ApiError) -> None:
        self._send(e.status, {"error": {"code": e.code, "message": e.message}}, e.headers)

    def _dispatch(self) -> None:
        try:
            self._route()
        except ApiError as e:
            self._drain_body()
            self._error(e)
        except Exception:
            log.exception("contract API: %s %s failed", self.command, self.path)
            self._drain_body()
            self._error(ApiError(500, "internal", "internal error"))

    def _drain_body(self) -> None:
        if getattr(self, "_body_read", True):
            return
        self._body_read = True
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = 0
        if 0 < n <= _MAX_BODY and "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            self.rfile.read(n)
        else:
            self.close_connection = True

    def _route(self) -> None:
        self._body_read = (self.headers.get("Content-Length") or "0").strip() == "0" \
            and "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower()
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        methods = _ROUTES.get(path)
        rid = None
        if methods is None and path.startswith("/v1/reclaims/"):
            rid = path[len("/v1/reclaims/"):]
            methods = ("GET",)
        if methods is None:
            raise ApiError(404, "not_found", f"no such path {path}")
        if self.command not in methods:
            raise ApiError(405, "method_not_allowed", f"{self.command} is not allowed on {path}",
                           {"Allow": ", ".join(methods)})
        self._auth()
        query = self._query(parts.query, _QUERY.get(path, set()))
        api = self.server.api
        if rid is not None:
            if "/" in rid or not _RECLAIM_ID.fullmatch(rid):
                raise ApiError(404, "not_found", f"no reclaim {rid!r}")
            self._send(200, api.get_reclaim(rid))
        elif path == "/v1/rate-card":
            body, etag = api.rate_card()
            inm = self.headers.get("If-None-Match")
            if inm is not None and len(inm) > 256:
                raise bad_request("If-None-Match is too long")
            if inm is not None and _etag_matches(inm, etag):
                self._send(304, None, {"ETag": etag})
            else:
                self._send(200, body, {"ETag": etag, "Cache-Control": "no-cache"})
        elif path == "/v1/notices":
            after = query.get("after")
            if after is not None and not _CURSOR.fullmatch(after):
                raise bad_request("after must be a cursor returned by this API")
            wait = _number(query.get("wait"), "wait", 0.0, MAX_WAIT, 0.0)
            limit = _integer(query.get("limit"), "limit", 1, MAX_PAGE, DEFAULT_PAGE)
            self._send(200, api.poll(after, wait, limit))
        elif path == "/v1/notices/active":
            self._send(200, api.active())
        elif path == "/v1/reclaims":
            key = self.headers.get("Idempotency-Key")
            if key is not None and not 1 <= len(key) <= 128:
                raise bad_request("Idempotency-Key must be 1 to 128 characters")
            rec = api.reclaim(self._json(), key)
            self._send(202, rec, {"Location": f"/v1/reclaims/{rec['id']}"})
        elif path == "/v1/status":
            self._send(200, api.status())
        elif path == "/sim/v1/world":
            self._send(200, api.world_view())

    def _auth(self) -> None:
        token = secret_value(self.server.token)  # ConfigError (unreadable or empty now): a 500, logged
        if not token:
            return
        if not bearer_matches(self.headers.get("Authorization", ""), token):
            raise ApiError(401, "unauthorized", "a valid bearer token is required",
                           {"WWW-Authenticate": 'Bearer realm="spot-contract"'})

    @staticmethod
    def _query(qs: str, allowed: set[str]) -> dict[str, str]:
        try:
            parsed = parse_qs(qs, keep_blank_values=True, strict_parsing=False, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise bad_request("the query string is not valid UTF-8") from None
        unknown = sorted(set(parsed) - allowed)
        if unknown:
            raise bad_request(f"unknown query parameter(s): {', '.join(unknown)}")
        out: dict[str, str] = {}
        for k, vs in parsed.items():
            if len(vs) != 1:
                raise bad_request(f"{k} may be given once")
            out[k] = vs[0]
        return out

    def _json(self) -> object:
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise bad_request("bad Content-Length") from None
        if n > _MAX_BODY:
            raise bad_request("the body is too large")
        raw = self.rfile.read(n) if n > 0 else b""
        self._body_read = True
        if ctype != "application/json":
            raise bad_request("the body must be application/json")
        try:
            return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError):
            raise bad_request("the body is not valid JSON") from None

    def __getattr__(self, name: str) -> Callable[[], None]:
        # Every method (GET, POST, QUERY, ...) goes through one router: 405 with Allow for known paths.
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _number(v: str | None, name: str, lo: float, hi: float, default: float) -> float:
    if v is None:
        return default
    try:
        x = float(v)
    except ValueError:
        raise bad_request(f"{name} must be a number from {lo:g} to {hi:g}") from None
    if not math.isfinite(x) or not lo <= x <= hi:
        raise bad_request(f"{name} must be a number from {lo:g} to {hi:g}")
    return x


def _integer(v: str | None, name: str, lo: int, hi: int, default: int) -> int:
    if v is None:
        return default
    if not re.fullmatch(r"[+-]?[0-9]{1,10}", v.strip()):
        raise bad_request(f"{name} must be an integer from {lo} to {hi}")
    x = int(v)
    if not lo <= x <= hi:
        raise bad_request(f"{name} must be an integer from {lo} to {hi}")
    return x


def _etag_matches(header: str, etag: str) -> bool:
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*":
            return True
        if tag.startswith("W/"):
            tag = tag[2:]
        if tag == etag:
            return True
    return False
