"""``spotctl bundle serve`` (issue 16): the HTTPS endpoint node agents fetch their region's bundle from, on
aiohttp (it hands the application the verified peer certificate, through the transport).

Every connection is mutual TLS: the client's X.509 SVID is checked against the SPIFFE trust bundle in the
handshake (no certificate, another CA, an expired one: no connection), then its SPIFFE ID against the
patterns allowed to GET (agents) and to PUT (the contract pipeline): 403 otherwise. A GET answers the
served bundle with its ETag (its SHA-256), 304 to a matching If-None-Match; a PUT is accepted only when
the bundle verifies (trusted signature, digests, files, expiry, region) with a higher revision than the
served one, and is written atomically before it is served. Each publish, rejection and refusal is an audit
record of the region, its actor the SPIFFE ID. The SVID and trust bundle files are re-read when they change
(:class:`~spotctl.bundles.spiffe.RotatingContext`). The API: ``docs/bundles/openapi.yaml``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotctl.core.bundle import BundleError

from .archive import Parts, unpack
from .bundle import describe, verify
from .spiffe import RotatingContext, SvidFiles, allowed, spiffe_id

log = logging.getLogger(__name__)
CONTENT_TYPE = "application/vnd.spotctl.bundle+gzip"
MAX_BODY = 64 * 1024 * 1024


@dataclass
class Served:
    data: bytes
    etag: str
    info: dict[str, Any]
    published_by: str | None
    published_at: float | None


class BundleServer:
    """The served bundle of one region, and the rules of who may read and replace it."""

    def __init__(self, region: str, data_dir: Path, trusted_keys: list[Any], get: list[str], put: list[str],
                 audit: Callable[..., None] | None = None, clock: Callable[[], float] = time.time):
        self.region, self.dir = region, Path(data_dir)
        self.trusted, self.get_patterns, self.put_patterns = trusted_keys, get, put
        self.audit = audit or (lambda **kw: None)
        self.clock = clock
        self.dir.mkdir(parents=True, exist_ok=True)
        self.served: Served | None = self._load()

    @property
    def path(self) -> Path:
        return self.dir / f"{self.region}.bundle"

    def _load(self) -> Served | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            unpack(data)
        except BundleError as e:  # serve nothing rather than fail to start; the next publish replaces it
            log.warning("bundle serve: the kept bundle %s is unreadable (%s); serving none until a publish",
                        self.path, e.message)
            return None
        meta = {}
        try:
            import json

            meta = json.loads((self.dir / f"{self.region}.meta.json").read_text())
        except (OSError, ValueError):
            pass
        return self._served(data, meta.get("published_by"), meta.get("published_at"))

    def _served(self, data: bytes, by: str | None, at: float | None, parts: Parts | None = None) -> Served:
        return Served(data, f'"{hashlib.sha256(data).hexdigest()}"', describe(parts or data), by, at)

    def status(self) -> dict[str, Any]:
        s = self.served
        if s is None:
            return {"region": self.region, "served": False}
        i = s.info
        return {"region": self.region, "served": True, "revision": i["revision"], "created": i["created"],
                "expires": i["expires"], "etag": s.etag, "size": len(s.data),
                "signatures": i["signatures"], "published_by": s.published_by, "published_at": s.published_at}

    def publish(self, data: bytes, by: str) -> dict[str, Any]:
        """Accept ``data`` when it verifies with a higher revision than the served one (BundleError else)."""
        last = self.served.info["revision"] if self.served else None
        parts = unpack(data)  # once: verified and described from the same parts
        ok = verify(parts, self.trusted, now=self.clock(), last_revision=last, region=self.region)
        if last is not None and ok.revision <= last:
            from spotctl.core.bundle import BundleRollback

            raise BundleRollback(f"revision {ok.revision} is not newer than the served {last}",
                                 hint="publish a higher revision (`spotctl bundle build --revision N`)")
        import json

        now = self.clock()
        for name, blob in ((f"{self.region}.bundle", data),
                           (f"{self.region}.meta.json", json.dumps({"published_by": by, "published_at": now}).encode())):
            tmp = self.dir / f".{name}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / name)
        self.served = self._served(data, by, now, parts)
        return {"accepted_revision": ok.revision, "keyids": list(ok.keyids)}

    # -- aiohttp -------------------------------------------------------------------------------

    def app(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY)
        base = "/v1/regions/{region}/bundle"
        app.router.add_get(base, self._get)
        app.router.add_put(base, self._put)
        app.router.add_get(base + "/status", self._status)
        return app

    def _peer(self, request: Any) -> str | None:
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
        try:
            return spiffe_id(ssl_obj.getpeercert(True) if ssl_obj else None)
        except Exception:
            return None

    def _refuse(self, request: Any, sid: str | None, verb: str, status: int, code: str, message: str) -> Any:
        from aiohttp import web

        self.audit(actor=sid or "unknown", action=f"bundle.{verb}", target=self.region, result="refused",
                   inputs={"status": status, "code": code, "reason": message, "path": request.path})
        return web.json_response({"error": {"code": code, "message": message}}, status=status)

    def _check(self, request: Any, verb: str, patterns: list[str]) -> tuple[str | None, Any]:
        sid = self._peer(request)
        if sid is None:
            return None, self._refuse(request, None, verb, 403, "forbidden", "the client certificate names no SPIFFE ID")
        if not allowed(sid, patterns):  # before the region: who may not ask learns nothing of what is served
            return sid, self._refuse(request, sid, verb, 403, "forbidden", f"{sid} may not {verb} this bundle")
        if request.match_info["region"] != self.region:
            from aiohttp import web

            return sid, web.json_response({"error": {"code": "not_found", "message": "no such region"}}, status=404)
        return sid, None

    async def _get(self, request: Any) -> Any:
        from aiohttp import web

        _, refusal = self._check(request, "fetch", self.get_patterns)
        if refusal is not None:
            return refusal
        s = self.served
        if s is None:
            return web.json_response({"error": {"code": "not_found", "message": "no bundle published yet"}}, status=404)
        headers = {"ETag": s.etag, "X-Spotctl-Revision": str(s.info["revision"]), "Cache-Control": "no-cache"}
        tags = [t.strip().removeprefix("W/") for t in request.headers.get("If-None-Match", "").split(",")]
        if s.etag in tags or "*" in tags:  # the weak comparison If-None-Match calls for (RFC 9110 13.1.2)
            return web.Response(status=304, headers=headers)
        return web.Response(body=s.data, content_type=CONTENT_TYPE, headers=headers)

    async def _status(self, request: Any) -> Any:
        from aiohttp import web

        _, refusal = self._check(request, "status", self.get_patterns + self.put_patterns)
        if refusal is not None:
            return refusal
        return web.json_response(self.status())

    async def _put(self, request: Any) -> Any:
        from aiohttp import web

        sid, refusal = self._check(request, "publish", self.put_patterns)
        if refusal is not None:
            return refusal
        data = await request.read()
        import asyncio

        try:  # verifying and writing a large bundle takes milliseconds: not in the loop that answers the agents
            out = await asyncio.to_thread(self.publish, data, sid or "unknown")
        except BundleError as e:
            status = 409 if e.code == "bundle_rollback" else 422
            return self._refuse(request, sid, "publish", status, e.code, e.message)
        self.audit(actor=sid, action="bundle.publish", target=self.region, result="ok",
                   inputs={"revision": out["accepted_revision"], "keyids": out["keyids"], "size": len(data)})
        return web.json_response({"region": self.region, **out})


def run(server: BundleServer, files: SvidFiles, host: str, port: int, *, ready: Callable[[str], None] | None = None,
        ) -> None:
    """Serve until SIGINT/SIGTERM (KeyboardInterrupt)."""
    import asyncio

    from aiohttp import web

    files.check()
    rotating = RotatingContext(files, on_error=lambda m: log.warning("bundle serve: SVID rotation: %s", m))

    async def main() -> None:
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=rotating.outer, backlog=2048)
        await site.start()
        addr = runner.addresses[0] if runner.addresses else (host, port)
        if ready:
            ready(f"https://{addr[0]}:{addr[1]}")
        try:
            while True:
                await asyncio.sleep(3600)
        finally:
            await runner.cleanup()

    asyncio.run(main())
