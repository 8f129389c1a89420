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

        self.metrics = metrics = BundleMetrics(self.region)
        metrics.revision(self.served)

        @web.middleware
        async def measured(request: Any, handler: Any) -> Any:
            t0 = time.perf_counter()
            path = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
            status = 500
            try:
                resp = await handler(request)
                status = resp.status
                return resp
            except web.HTTPException as e:
                status = e.status
                raise
            finally:
                metrics.request(request.method, path, status, time.perf_counter() - t0)

        app = web.Application(client_max_size=MAX_BODY, middlewares=[measured])
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
        self.metrics.sent(len(s.data))
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
        self.metrics.revision(self.served)
        self.audit(actor=sid, action="bundle.publish", target=self.region, result="ok",
                   inputs={"revision": out["accepted_revision"], "keyids": out["keyids"], "size": len(data)})
        return web.json_response({"region": self.region, **out})


class BundleMetrics:
    """The bundle server's own metrics (``prometheus_client``, in memory from the server's start; families
    declared in :mod:`spotctl.core.metrics`), served on ``--metrics-listen``."""

    def __init__(self, region: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        from spotctl.core.metrics import BY_NAME

        def spec(name: str) -> dict[str, Any]:
            f = BY_NAME[name]
            return {"name": f.name, "documentation": f.help, "labelnames": ["region", *f.labels],
                    "registry": self.registry}

        self.region = region
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(**spec("spotctl_bundle_requests"))
        self._duration = Histogram(**spec("spotctl_bundle_request_duration_seconds"),
                                   buckets=BY_NAME["spotctl_bundle_request_duration_seconds"].buckets)
        self._bytes = Counter(**spec("spotctl_bundle_sent_bytes"))
        self._revision = Gauge(**spec("spotctl_bundle_revision"))

    def request(self, method: str, path: str, status: int, seconds: float) -> None:
        self._requests.labels(self.region, method, path, str(status)).inc()
        self._duration.labels(self.region, path).observe(seconds)

    def sent(self, n: int) -> None:
        self._bytes.labels(self.region).inc(n)

    def revision(self, served: Served | None) -> None:
        if served is not None:
            self._revision.labels(self.region).set(float(served.info["revision"]))

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def run(server: BundleServer, files: SvidFiles, host: str, port: int, *, ready: Callable[[str], None] | None = None,
        metrics: tuple[str, int] | None = None, metrics_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM (KeyboardInterrupt); with ``metrics`` (host, port), ``/metrics`` in plain
    HTTP there (Prometheus scrapes it without a client certificate: keep it on loopback or a private net)."""
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
        mrunner = None
        if metrics is not None:
            async def scrape(request: Any) -> Any:
                body, ctype = server.metrics.exposition()
                return web.Response(body=body, headers={"Content-Type": ctype})

            mapp = web.Application()
            mapp.router.add_get("/metrics", scrape)
            mrunner = web.AppRunner(mapp, access_log=None)
            await mrunner.setup()
            await web.TCPSite(mrunner, metrics[0], metrics[1]).start()
            maddr = mrunner.addresses[0] if mrunner.addresses else metrics
            if metrics_ready:
                metrics_ready(f"http://{maddr[0]}:{maddr[1]}/metrics")
        try:
            while True:
                await asyncio.sleep(3600)
        finally:
            if mrunner is not None:
                await mrunner.cleanup()
            await runner.cleanup()

    asyncio.run(main())
