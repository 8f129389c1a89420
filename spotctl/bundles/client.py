"""The client side of ``bundle publish``, ``fetch`` and ``status`` (issue 16): HTTPS with the caller's X.509
SVID (mutual TLS), the server's certificate checked against the trust bundle and its SPIFFE ID against
``server_id`` (a pattern; default: any ID of a trusted CA). One bounded attempt per call."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from spotctl.core.bundle import BundleError, BundleRollback
from spotctl.core.errors import AuthError, NotFoundError, RefusedError, TemporaryError, UnavailableError

from .server import CONTENT_TYPE
from .spiffe import SvidFiles, allowed, spiffe_id


class BundleClient:
    def __init__(self, url: str, files: SvidFiles, region: str, *, server_id: str = "spiffe://**",
                 timeout: float = 10.0):
        files.check()
        self.base = url.rstrip("/") + f"/v1/regions/{region}/bundle"
        self.files, self.server_id, self.timeout = files, server_id, timeout

    def _request(self, method: str, suffix: str = "", **kw: Any) -> Any:
        import httpx

        ctx = self.files.context(server=False)
        try:
            with httpx.Client(verify=ctx, timeout=self.timeout) as c:
                r = c.request(method, self.base + suffix, **kw)
                stream = r.extensions.get("network_stream")
                ssl_obj = stream.get_extra_info("ssl_object") if stream is not None else None
                peer = ssl_obj.getpeercert(True) if ssl_obj is not None else None
        except httpx.ConnectError as e:
            raise UnavailableError(f"bundle server {self.base}: cannot connect or the TLS handshake failed ({e})",
                                   hint="check the URL, the SVID files and that the server trusts their CA") from None
        except (httpx.RemoteProtocolError, httpx.ReadError):  # TLS 1.3: a refused client certificate shows here
            raise UnavailableError(f"bundle server {self.base}: the connection was closed at the TLS handshake: "
                                   "the server refused this SVID (expired, or not of a trust domain it trusts)",
                                   hint="check the SVID's dates and CA against the server's trust bundle") from None
        except httpx.TimeoutException:
            raise TemporaryError(f"bundle server {self.base}: no answer within {self.timeout:g} s") from None
        except httpx.HTTPError as e:
            raise UnavailableError(f"bundle server {self.base}: {type(e).__name__}: {e}") from None
        if peer is not None:
            sid = spiffe_id(peer)
            if not allowed(sid, [self.server_id]):
                raise AuthError(f"the bundle server is {sid}, not {self.server_id}")
        return r

    @staticmethod
    def _error(r: Any) -> Exception:
        try:
            err = r.json().get("error", {})
        except ValueError:
            err = {}
        msg = f"bundle server answered {r.status_code}: {err.get('message') or r.text[:200]}"
        if r.status_code == 403:
            return AuthError(msg, hint="the server's allowed SPIFFE ID patterns do not name this SVID")
        if r.status_code == 404:
            return NotFoundError(msg)
        if r.status_code == 409:
            return BundleRollback(msg)
        if r.status_code == 422:  # refused by the server's verification: the same error as a local verify
            from spotctl.core import bundle as b

            kinds = {k.code: k for k in (b.BundleInvalid, b.BundleUntrusted, b.BundleDigest, b.BundleFiles,
                                         b.BundleExpired, b.BundleRollback)}
            return kinds.get(err.get("code"), BundleError)(msg)
        if r.status_code >= 500:
            return TemporaryError(msg)
        return RefusedError(msg)

    def publish(self, data: bytes) -> dict[str, Any]:
        r = self._request("PUT", content=data, headers={"Content-Type": CONTENT_TYPE})
        if r.status_code != 200:
            raise self._error(r)
        return dict(r.json())

    def status(self) -> dict[str, Any]:
        r = self._request("GET", "/status")
        if r.status_code != 200:
            raise self._error(r)
        return dict(r.json())

    def fetch(self, etag: str | None) -> tuple[bytes | None, str | None]:
        """The served bundle and its ETag; ``(None, etag)`` when unchanged (304)."""
        r = self._request("GET", headers={"If-None-Match": etag} if etag else {})
        if r.status_code == 304:
            return None, etag
        if r.status_code != 200:
            raise self._error(r)
        return r.content, r.headers.get("ETag")


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
