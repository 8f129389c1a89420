"""A small Kubernetes API client over ``requests``: :class:`Connection` (where the server is and how to
authenticate), :class:`Api` (one request, a paginated list, a watch stream) and :func:`translate` (an
error answer as a spotctl error).

Errors follow the one HTTP rule of :mod:`spotctl.adapters._http`: 401/403 → AuthError, 404 →
NotFoundError, 400/422 → RefusedError, 409/410/429/5xx/timeouts → TemporaryError, connection refused →
UnavailableError. Tokens are never logged; a token file is re-read when it changes (rotation), and
credentials that expire (a kubeconfig's exec plugin) are refreshed by their :class:`Credentials`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from spotctl import __version__
from spotctl.core import deadline
from spotctl.core.errors import AuthError, NotFoundError, RefusedError, SpotctlError, TemporaryError
from spotctl.core.secrets import SecretFile

from .. import _http

if TYPE_CHECKING:  # pragma: no cover
    import requests


class Credentials(Protocol):
    """Credentials that change while the client lives (a kubeconfig's exec plugin or auth provider)."""

    def authorization(self) -> str | None:
        """The ``Authorization`` header value now (refreshed first when it has expired)."""
        ...

    def cert(self) -> tuple[str, str] | None:
        """The client certificate and key files now, when the credentials are a certificate."""
        ...

    def invalidate(self) -> None:
        """The server refused the credentials (401): get new ones before the next request."""
        ...


@dataclass
class Connection:
    """Where the API server is and how to authenticate to it (never logged: it may hold a token)."""

    server: str
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    ca_file: str | None = None
    verify: bool = True
    client_cert: str | None = None
    client_key: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    credentials: Credentials | None = field(default=None, repr=False)  # used when there is no token (file)
    source: str = ""  # for messages: which kubeconfig/context or "in-cluster"


class Expired(Exception):
    """The resourceVersion is too old (410): relist."""


class Dropped(Exception):
    """The watch stream broke off: reconnect from the last resourceVersion."""


class Api:
    """A small Kubernetes API client over requests: auth, TLS, timeouts and error translation."""

    def __init__(self, conn: Connection, timeout: float = 10.0):
        import requests

        self.conn = conn
        self.base = conn.server.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        # as many pooled connections as a storm's drain fan-out has workers (ops.act.DRAIN_WORKERS)
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=32)
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)
        self.session.headers["Accept"] = "application/json"
        self.session.headers["User-Agent"] = f"spotctl/{__version__}"
        self.session.verify = conn.ca_file if (conn.verify and conn.ca_file) else conn.verify
        if conn.client_cert:
            self.session.cert = (conn.client_cert, conn.client_key) if conn.client_key else conn.client_cert
        if conn.username is not None:
            self.session.auth = (conn.username, conn.password or "")
        self._token_file = (SecretFile(conn.token_file, setting=f"the Kubernetes token file ({conn.source})")
                            if conn.token_file and not conn.token else None)

    def _authorization(self) -> str | None:
        """The ``Authorization`` header: the token, else the token file (re-read when it changes: service-account
        tokens rotate), else the refreshing credentials (an exec plugin's token, run again once it expires)."""
        if self.conn.token:
            return f"Bearer {self.conn.token}"
        if self._token_file is not None:
            return f"Bearer {self._token_file.value()}"
        return self.conn.credentials.authorization() if self.conn.credentials is not None else None

    def _token(self) -> str | None:
        """The bearer token, if the credentials are one."""
        auth = self._authorization()
        return auth[7:].strip() if auth and auth[:7].lower() == "bearer " else None

    def _headers(self, extra: dict | None = None) -> dict:
        h = dict(extra or {})
        auth = self._authorization()
        if auth:
            h["Authorization"] = auth
        return h

    def _send(self, method: str, path: str, what: str, timeout: tuple[float, float], **kw: Any) -> requests.Response:
        """One request (no retry, no sleep: the next pass asks again); no answer is an error by the rule of ``_http``."""
        creds = self.conn.credentials
        cert = creds.cert() if creds is not None and not self.conn.token and self._token_file is None else None
        if cert is not None:
            kw["cert"] = cert
        r: requests.Response = _http.send(self.session, method, self.base + path, what=f"kubernetes: {what}",
                                          peer=f"the Kubernetes API at {self.base}", timeout=timeout,
                                          tls_hint="check the CA (certificate-authority) and client certificate",
                                          **kw)
        if r.status_code == 401 and creds is not None:
            creds.invalidate()  # the next request gets new credentials (what client-go does on a 401)
        return r

    def request(self, method: str, path: str, *, params: dict | None = None, body: Any = None,
                content_type: str = "application/json", ok: tuple[int, ...] = ()) -> tuple[int, dict]:
        """Send one request; return (status, JSON body). Statuses in ``ok`` are returned, not raised."""
        data = None if body is None else json.dumps(body)
        headers = self._headers({"Content-Type": content_type} if data is not None else None)
        t = deadline.bounded(self.timeout)  # inside a pass's observe: no longer than the time left
        r = self._send(method, path, f"{method} {path}", (min(t, 5.0), t), params=params, data=data,
                       headers=headers)
        try:
            payload = r.json() if r.content else {}
        except ValueError:
            payload = {"message": r.text[:200]}
        if r.status_code < 300 or r.status_code in ok:
            return r.status_code, payload
        raise translate(r.status_code, payload, f"{method} {path}", self.base)

    def list_all(self, path: str, params: dict | None, page_size: int) -> tuple[list[dict], str]:
        """Every item of a collection, paginated; the resourceVersion of the first page. An expired continue
        token (410) lists again from the start, twice at most."""
        params = dict(params or {}, limit=str(page_size))
        for _attempt in range(3):
            items: list[dict] = []
            rv, cont = None, None
            try:
                while True:
                    page_params = dict(params, **({"continue": cont} if cont else {}))
                    _, page = self.request("GET", path, params=page_params)
                    meta = page.get("metadata") or {}
                    rv = rv or meta.get("resourceVersion")
                    items.extend(page.get("items") or [])
                    cont = meta.get("continue")
                    if not cont:
                        return items, str(rv or "")
            except TemporaryError as e:
                if "HTTP 410" not in e.message:
                    raise
        raise TemporaryError(f"Kubernetes: listing {path} kept expiring mid-way; try again")

    def watch(self, path: str, params: dict, idle: float, limit: float) -> Iterator[dict]:
        """Open a watch stream; yield decoded events until the stream is quiet ``idle`` seconds, ends,
        or ``limit`` seconds pass. Raises Expired (410) and Dropped (connection broke off)."""
        import requests

        params = dict(params, watch="true", allowWatchBookmarks="true", timeoutSeconds=str(max(1, int(limit))))
        r = self._send("GET", path, f"WATCH {path}", (min(self.timeout, 5.0), max(self.timeout, limit + 5)),
                       params=params, headers=self._headers(), stream=True)
        with r:
            if r.status_code == 410:
                raise Expired()
            if r.status_code >= 300:
                try:
                    payload = r.json()
                except ValueError:
                    payload = {}
                raise translate(r.status_code, payload, f"WATCH {path}", self.base)
            sock = getattr(getattr(r.raw, "connection", None), "sock", None)
            if sock is not None:
                sock.settimeout(idle)  # from now on a quiet stream means "caught up"
            end = time.monotonic() + limit
            try:
                for line in r.iter_lines():
                    if not line:
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise Dropped() from None
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        if obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone"):
                            raise Expired()
                        raise translate(int(obj.get("code") or 500), obj, f"WATCH {path}", self.base)
                    yield event
                    if time.monotonic() >= end:
                        return
            except requests.exceptions.ConnectionError as e:
                if "timed out" in str(e).lower():
                    return  # quiet for `idle` seconds: caught up
                raise Dropped() from None
            except requests.exceptions.RequestException:  # ChunkedEncodingError and the like
                raise Dropped() from None


def translate(status: int, payload: dict, what: str, base: str) -> SpotctlError:
    """An HTTP error status (with its metav1.Status body) as a spotctl error: the class by the rule of
    ``_http`` (410 — an expired resourceVersion or continue token — is a TemporaryError: list again)."""
    message = payload.get("message") if isinstance(payload, dict) else None
    detail = f"{what}: HTTP {status}" + (f" {message}" if message else "")
    text = {AuthError: f"Kubernetes API {base} refused the credentials ({detail})",
            NotFoundError: f"Kubernetes: {detail}",
            RefusedError: f"Kubernetes API {base} rejected the request ({detail})",
            }.get(_http.error_class(status), f"Kubernetes API {base}: {detail}")
    return _http.status_error(status, text,
                              auth_hint="check the token, exec plugin or client certificate in the kubeconfig, "
                                        "and the RBAC rules")
