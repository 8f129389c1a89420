"""The provider contract API (``docs/contract/openapi.yaml``) served from a simulated world.

:class:`ContractAPI` keeps what the API adds to the world: the **ordered
notice log** (every notice that appears in ``world.contract.notices()`` is
appended once, with the next cursor), **reclaims** with per-instance receipts,
and a deterministic **delivery receipt** per notice. The world advances with
the wall clock — on every request and on a 1 s ticker — under one lock; a
long-poll waits on a condition that the ticker notifies when the log grows.

:func:`make_server` binds a threaded ``http.server`` to it (loopback by
default); ``spotctl sim serve`` runs it until Ctrl-C or SIGTERM.

Besides the contract's ``/v1/...`` operations, the simulator serves
``GET /sim/v1/world`` (world time, pools, instances): a simulator extension,
not part of the contract.

The world is passed in (any object with the simulator's ``advance``, ``now``,
``seed``, ``pools``, ``cloud`` and ``contract``); this module does not import
the simulator.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import threading
import time
import zlib
from types import SimpleNamespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from spotctl.core.ports import Clock, SystemClock
from spotctl.core.secrets import SecretFile
from spotctl.core.timefmt import iso as _iso

log = logging.getLogger(__name__)

MIN_NOTICE_SECONDS = 120
MAX_LEAD_SECONDS = 86400
MAX_PAGE = 1000
DEFAULT_PAGE = 500
MAX_WAIT = 60.0
_CURSOR = re.compile(r"[A-Za-z0-9._-]{1,64}")
_INSTANCE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_DRILL = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_RECLAIM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_REQUEST_KEYS = {"instance_ids", "notice_seconds", "advisory_lead_seconds", "drill_id", "reason"}
_MAX_BODY = 256 * 1024
_KEEP_RECLAIMS = 10000


def iso(t: float | None) -> str | None:
    """RFC 3339 UTC with milliseconds (the API's one timestamp format; :func:`spotctl.core.timefmt.iso`)."""
    return _iso(t, "milliseconds")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def _bad(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class ContractAPI:
    """The API's state over one world. Thread-safe; every method takes the lock."""

    def __init__(self, world, *, clock: Clock | None = None, max_wait: float = MAX_WAIT,
                 provider: str = "spotctl-sim"):
        self.world = world
        self.clock = clock or SystemClock()
        self.max_wait = max(0.0, min(float(max_wait), MAX_WAIT))
        self.provider = provider
        self.cond = threading.Condition(threading.RLock())
        self.epoch = str(int(self.clock.now()))  # cursors from another server run are recognised as such
        self.log: list[dict] = []  # entries in cursor order
        self.by_id: dict[str, dict] = {}  # notice id -> log entry
        self.extra: dict[str, dict] = {}  # advisories this API issued itself (reclaims with advisory lead), in force
        self.reclaims: dict[str, dict] = {}
        self.pending: list[tuple[float, str, int]] = []  # (due, reclaim id, receipt index): hard notices to issue
        self.idem: dict[str, str] = {}
        self.counter = 0
        self.first_card: tuple[str, float] | None = None
        self.sync()

    # --- the clock ---------------------------------------------------------------

    def sync(self) -> None:
        """Advance the world to now; log new notices; issue due hard notices; update receipts."""
        with self.cond:
            now = self.clock.now()
            w = self.world
            if now - w.now >= 0.05:
                w.advance(now)
            self._issue_due()
            before = len(self.log)
            for n in w.contract.notices():
                if n.id not in self.by_id:
                    self._append(n)
            self._update_receipts()
            for aid, entry in list(self.extra.items()):
                if not self._alive(entry["instance_id"]) or entry.get("_until", math.inf) <= w.now:
                    del self.extra[aid]
            if len(self.log) != before:
                self.cond.notify_all()

    def _delivery(self, nid: str) -> float:
        """Deterministic delivery latency of a notice to its node (50–500 ms)."""
        return 0.05 + (zlib.crc32(f"{self.world.seed}:{nid}".encode()) % 451) / 1000.0

    def _append(self, n, *, source: str = "provider") -> dict:
        seq = len(self.log) + 1
        delivered = n.delivered_at if n.delivered_at is not None else n.issued_at + self._delivery(n.id)
        entry = {
            "cursor": f"{self.epoch}.{seq}", "id": n.id, "instance_id": n.instance_id, "pool": n.pool,
            "kind": str(n.kind), "issued_at": n.issued_at, "deadline": n.deadline, "delivered_at": delivered,
            "reason": n.reason, "_seq": seq, "_source": source,
        }
        self.log.append(entry)
        self.by_id[n.id] = entry
        return entry

    def _alive(self, iid: str) -> bool:
        return any(i.id == iid for i in self.world.cloud.instances())

    @staticmethod
    def public(entry: dict) -> dict:
        d = {k: v for k, v in entry.items() if not k.startswith("_")}
        for k in ("issued_at", "deadline", "delivered_at"):
            d[k] = iso(d[k])
        return d

    # --- rate card -------------------------------------------------------------------

    def rate_card(self) -> tuple[dict, str]:
        self.sync()
        with self.cond:
            rc = self.world.contract.rate_card()
            if self.first_card is None or self.first_card[0] != rc.version:
                self.first_card = (rc.version, self.world.now)
        frm, until = iso(rc.valid_from), iso(rc.valid_until)
        pools = [{"pool": p, "price": float(price), "currency": rc.currency, "unit": "node-hour",
                  "valid_from": frm, "valid_until": until, "version": rc.version}
                 for p, price in sorted(rc.prices.items())]
        refresh = max(1, int(round((rc.valid_until - rc.valid_from)))) if math.isfinite(rc.valid_until) else 300
        body = {"version": rc.version, "currency": rc.currency, "unit": "node-hour", "valid_from": frm,
                "valid_until": until, "refresh_seconds": refresh, "pools": pools}
        return body, f'"{rc.version}"'

    # --- notices -----------------------------------------------------------------------

    def _start(self, after: str | None) -> tuple[int, bool]:
        """Index in the log after ``after``, and whether the cursor was unknown (reset)."""
        if after is None:
            return 0, False
        epoch, _, seq = after.rpartition(".")
        if epoch == self.epoch and seq.isdigit() and int(seq) <= len(self.log):
            return int(seq), False
        return 0, True

    def poll(self, after: str | None, wait: float, limit: int) -> dict:
        self.sync()
        deadline = time.monotonic() + min(wait, self.max_wait)
        with self.cond:
            start, reset = self._start(after)
            while len(self.log) <= start:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            page = self.log[start:start + limit]
            more = start + limit < len(self.log)
            if page:
                nxt = page[-1]["cursor"]
            elif reset or after is None:
                nxt = f"{self.epoch}.{start}"
            else:
                nxt = after
            return {"notices": [self.public(e) for e in page], "next_cursor": nxt, "more": more, "reset": reset}

    def active(self) -> dict:
        self.sync()
        with self.cond:
            out = []
            for n in self.world.contract.notices():
                entry = self.by_id.get(n.id) or self._append(n)
                out.append(entry)
            out.extend(self.extra.values())
            out.sort(key=lambda e: e["_seq"])
            return {"as_of": iso(self.world.now), "notices": [self.public(e) for e in out]}

    # --- reclaims ------------------------------------------------------------------------

    @staticmethod
    def validate(body: object) -> dict:
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object")
        unknown = sorted(set(body) - _REQUEST_KEYS)
        if unknown:
            raise _bad(f"unknown field(s): {', '.join(unknown)}")
        ids = body.get("instance_ids")
        if not isinstance(ids, list) or not 1 <= len(ids) <= 100:
            raise _bad("instance_ids must be a list of 1 to 100 instance ids")
        if not all(isinstance(i, str) and _INSTANCE.fullmatch(i) for i in ids):
            raise _bad("every instance id must be 1-64 characters of letters, digits, '.', '_' or '-'")
        if len(set(ids)) != len(ids):
            raise _bad("instance_ids must not repeat")
        ns = body.get("notice_seconds")
        if not _int(ns) or not MIN_NOTICE_SECONDS <= ns <= MAX_LEAD_SECONDS:
            raise _bad(f"notice_seconds must be an integer from {MIN_NOTICE_SECONDS} to {MAX_LEAD_SECONDS}")
        lead = body.get("advisory_lead_seconds", 0)
        if not _int(lead) or not 0 <= lead <= MAX_LEAD_SECONDS:
            raise _bad(f"advisory_lead_seconds must be an integer from 0 to {MAX_LEAD_SECONDS}")
        drill = body.get("drill_id")
        if "drill_id" in body and not (isinstance(drill, str) and _DRILL.fullmatch(drill)):
            raise _bad("drill_id must be 1-64 characters of letters, digits, '.', '_', ':' or '-'")
        reason = body.get("reason")
        if "reason" in body and not (isinstance(reason, str) and len(reason) <= 200):
            raise _bad("reason must be a string of at most 200 characters")
        return {"instance_ids": ids, "notice_seconds": ns, "advisory_lead_seconds": lead, "drill_id": drill,
                "reason": reason}

    def reclaim(self, body: object, idempotency_key: str | None = None) -> dict:
        req = self.validate(body)
        self.sync()
        with self.cond:
            if idempotency_key is not None and idempotency_key in self.idem:
                rec = self.reclaims.get(self.idem[idempotency_key])
                if rec is not None:
                    return self._public_reclaim(rec)
            w = self.world
            self.counter += 1
            rid = f"rcl-{self.counter:06d}"
            reason = req["reason"] or (f"reclaim drill {req['drill_id']}" if req["drill_id"] else "reclaim drill")
            live = {i.id for i in w.cloud.instances()}
            rec = {"id": rid, "state": "in_progress", "created_at": w.now, "drill_id": req["drill_id"],
                   "notice_seconds": req["notice_seconds"], "advisory_lead_seconds": req["advisory_lead_seconds"],
                   "reason": reason, "instances": []}
            lead = req["advisory_lead_seconds"]
            for i, iid in enumerate(req["instance_ids"]):
                r = {"instance_id": iid, "state": "failed", "advisory_id": None, "advisory_issued_at": None,
                     "notice_id": None, "notice_issued_at": None, "deadline": None, "delivered_at": None,
                     "deleted_at": None, "capacity_freed_at": None, "error": None}
                rec["instances"].append(r)
                if iid not in live:
                    r["error"] = f"no live spot instance {iid}"
                    continue
                if lead > 0:
                    self._advise(rec, r, i, iid)
                    self.pending.append((w.now + lead, rid, i))
                else:
                    self._notice(rec, r)
            self.reclaims[rid] = rec
            if len(self.reclaims) > _KEEP_RECLAIMS:
                self.reclaims.pop(next(iter(self.reclaims)))
            if idempotency_key is not None:
                self.idem[idempotency_key] = rid
            self._update_receipts()
            self.cond.notify_all()
            return self._public_reclaim(rec)

    def _advise(self, rec: dict, r: dict, i: int, iid: str) -> None:
        w = self.world
        pool = next((x.pool for x in w.cloud.instances() if x.id == iid), None)
        due = w.now + rec["advisory_lead_seconds"]
        aid = f"adv-{rec['id']}-{i + 1}"
        n = SimpleNamespace(id=aid, instance_id=iid, pool=pool, kind="advisory", issued_at=w.now,
                            deadline=due + rec["notice_seconds"], delivered_at=None,
                            reason=f"{rec['reason']}: a hard notice follows at {iso(due)}")
        entry = self._append(n, source="reclaim")
        entry["_until"] = due + rec["notice_seconds"]
        self.extra[aid] = entry
        r.update(state="advised", advisory_id=aid, advisory_issued_at=w.now)

    def _notice(self, rec: dict, r: dict) -> None:
        w = self.world
        try:
            n = w.provider.reclaim(r["instance_id"], float(rec["notice_seconds"]), f"{rec['reason']} ({rec['id']})")
            w.changed()
        except Exception as e:  # the instance went away meanwhile (NotFoundError) or the world refused
            r.update(state="failed", error=getattr(e, "message", None) or str(e))
            return
        entry = self.by_id.get(n.id) or self._append(n)
        r.update(state="noticed", notice_id=n.id, notice_issued_at=n.issued_at, deadline=n.deadline,
                 delivered_at=entry["delivered_at"])

    def _issue_due(self) -> None:
        if not self.pending:
            return
        now = self.world.now
        due = [p for p in self.pending if p[0] <= now]
        if not due:
            return
        self.pending = [p for p in self.pending if p[0] > now]
        for _, rid, i in sorted(due):
            rec = self.reclaims.get(rid)
            if rec is not None:
                self._notice(rec, rec["instances"][i])

    def _update_receipts(self) -> None:
        w = self.world
        open_ = [rec for rec in self.reclaims.values() if rec["state"] == "in_progress"]
        if not open_:
            return
        live = {i.id for i in w.cloud.instances()}
        for rec in open_:
            for r in rec["instances"]:
                if r["state"] in ("noticed", "advised") and r["instance_id"] not in live:
                    if r["state"] == "advised":
                        r.update(state="failed", error="the instance was gone before the hard notice")
                        continue
                    r.update(state="deleted", deleted_at=min(w.now, r["deadline"] or w.now))
                if r["state"] == "deleted" and w.cloud.released(r["instance_id"]):
                    r.update(state="freed", capacity_freed_at=w.now)
            states = {r["state"] for r in rec["instances"]}
            if states <= {"freed", "failed"}:
                rec["state"] = "completed" if "freed" in states else "failed"

    def get_reclaim(self, rid: str) -> dict:
        self.sync()
        with self.cond:
            rec = self.reclaims.get(rid)
            if rec is None:
                raise ApiError(404, "not_found", f"no reclaim {rid}")
            return self._public_reclaim(rec)

    @staticmethod
    def _public_reclaim(rec: dict) -> dict:
        d = dict(rec, created_at=iso(rec["created_at"]))
        d["instances"] = [
            {k: (iso(v) if k.endswith("_at") or k == "deadline" else v) for k, v in r.items()}
            for r in rec["instances"]]
        return d

    # --- status -----------------------------------------------------------------------------

    def status(self) -> dict:
        body, _ = self.rate_card()
        with self.cond:
            w = self.world
            hard = [e for e in self.log if e["kind"] == "hard"]
            leads = [e["deadline"] - e["issued_at"] for e in hard if e["deadline"] is not None]
            deliveries = [e["delivered_at"] - e["issued_at"] for e in self.log if e["delivered_at"] is not None]
            advisories = sum(1 for e in self.log if e["kind"] == "advisory")
            min_lead = round(min(leads), 3) if leads else None
            max_delivery = round(max(deliveries), 3) if deliveries else None
            hard_state = "met" if (min_lead is None or min_lead >= MIN_NOTICE_SECONDS) and (
                max_delivery is None or max_delivery <= 1.0) else "degraded"
            age = round(w.now - self.first_card[1], 3) if self.first_card else 0.0
            # each term from what this server observed; nothing observed is "unknown", not "met"
            warned = {e["instance_id"] for e in self.log if e["kind"] != "hard"}
            unwarned = [e for e in hard if e["instance_id"] not in warned and "drill" not in (e.get("reason") or "")]
            adv_state = ("unknown" if not hard and not advisories else
                         "degraded" if hard and len(unwarned) * 2 > len(hard) else "met")
            stale = age > body["refresh_seconds"] + 60
            pools = w.region.pools
            leases = w.cloud.reservations(pools, w.now, w.now + 24 * 3600)
            terms = [
                {"term": "hard_notice", "state": hard_state if hard else "unknown",
                 "detail": f"hard notices carry at least {MIN_NOTICE_SECONDS} s of lead time, delivered within 1 s",
                 "evidence": {"hard_notices": len(hard), "min_lead_seconds": min_lead,
                              "max_delivery_seconds": max_delivery}},
                {"term": "advisory", "state": adv_state, "detail": "advisories are issued when reclaim risk rises",
                 "evidence": {"advisories": advisories, "hard_without_advisory": len(unwarned)}},
                {"term": "rate_card", "state": "degraded" if stale else "met",
                 "detail": f"rate card {body['version']}, refreshed every {body['refresh_seconds']} s",
                 "evidence": {"version": body["version"], "age_seconds": age,
                              "refresh_seconds": body["refresh_seconds"]}},
                {"term": "reservations", "state": "met",
                 "detail": "reservation data is served by Blazar (simulated leases in this region), read now",
                 "evidence": {"leases_next_24h": len(leases)}},
                {"term": "reclaim_api", "state": "met", "detail": "POST /v1/reclaims is accepting requests",
                 "evidence": {"reclaims": len(self.reclaims)}},
            ]
            return {"as_of": iso(w.now), "provider": self.provider, "terms": terms}

    # --- simulator extension ---------------------------------------------------------------

    def world_view(self) -> dict:
        self.sync()
        with self.cond:
            w = self.world
            return {
                "region": getattr(getattr(w, "region", None), "name", None), "seed": w.seed, "now": iso(w.now),
                "pools": sorted(w.pools),
                "instances": [{"id": i.id, "name": i.name, "pool": i.pool, "status": i.status, "host": i.host}
                              for i in sorted(w.cloud.instances(), key=lambda x: (x.created_at, x.id))],
                "notices_in_force": len(w.contract.notices()) + len(self.extra), "log_length": len(self.log),
                "reclaims": len(self.reclaims),
            }


# --- HTTP ------------------------------------------------------------------------------------

_ROUTES = {  # path -> allowed methods
    "/v1/rate-card": ("GET",), "/v1/notices": ("GET",), "/v1/notices/active": ("GET",),
    "/v1/reclaims": ("POST",), "/v1/status": ("GET",), "/sim/v1/world": ("GET",),
}
_QUERY = {"/v1/notices": {"after", "wait", "limit"}}


class ContractServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, api: ContractAPI, token: str | SecretFile | None):
        self.api = api
        self.token = token  # a SecretFile is read on each request: a rotated token file takes effect at once
        self._stop = threading.Event()
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

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


def make_server(world, host: str = "127.0.0.1", port: int = 8787, *, token: str | SecretFile | None = None,
                max_wait: float = MAX_WAIT, clock: Clock | None = None) -> ContractServer:
    """A contract API server over ``world``, bound (port 0 = any free port) but not yet serving."""
    return ContractServer((host, port), ContractAPI(world, clock=clock, max_wait=max_wait), token)


class _Handler(BaseHTTPRequestHandler):
    server: ContractServer
    protocol_version = "HTTP/1.1"
    server_version = "spotctl-contract-sim/1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        log.debug("contract API: %s %s", self.address_string(), format % args)

    def _send(self, status: int, body: dict | None, headers: dict | None = None) -> None:
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
                raise _bad("If-None-Match is too long")
            if inm is not None and _etag_matches(inm, etag):
                self._send(304, None, {"ETag": etag})
            else:
                self._send(200, body, {"ETag": etag, "Cache-Control": "no-cache"})
        elif path == "/v1/notices":
            after = query.get("after")
            if after is not None and not _CURSOR.fullmatch(after):
                raise _bad("after must be a cursor returned by this API")
            wait = _number(query.get("wait"), "wait", 0.0, MAX_WAIT, 0.0)
            limit = _integer(query.get("limit"), "limit", 1, MAX_PAGE, DEFAULT_PAGE)
            self._send(200, api.poll(after, wait, limit))
        elif path == "/v1/notices/active":
            self._send(200, api.active())
        elif path == "/v1/reclaims":
            key = self.headers.get("Idempotency-Key")
            if key is not None and not 1 <= len(key) <= 128:
                raise _bad("Idempotency-Key must be 1 to 128 characters")
            rec = api.reclaim(self._json(), key)
            self._send(202, rec, {"Location": f"/v1/reclaims/{rec['id']}"})
        elif path == "/v1/status":
            self._send(200, api.status())
        elif path == "/sim/v1/world":
            self._send(200, api.world_view())

    def _auth(self) -> None:
        token = self.server.token
        if isinstance(token, SecretFile):
            token = token.value()  # ConfigError (unreadable or empty now): a 500, logged
        if not token:
            return
        got = self.headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode("utf-8", "replace"),
                                                                    token.encode()):
            raise ApiError(401, "unauthorized", "a valid bearer token is required",
                           {"WWW-Authenticate": 'Bearer realm="spot-contract"'})

    @staticmethod
    def _query(qs: str, allowed: set[str]) -> dict[str, str]:
        try:
            parsed = parse_qs(qs, keep_blank_values=True, strict_parsing=False, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise _bad("the query string is not valid UTF-8") from None
        unknown = sorted(set(parsed) - allowed)
        if unknown:
            raise _bad(f"unknown query parameter(s): {', '.join(unknown)}")
        out = {}
        for k, vs in parsed.items():
            if len(vs) != 1:
                raise _bad(f"{k} may be given once")
            out[k] = vs[0]
        return out

    def _json(self) -> object:
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _bad("bad Content-Length") from None
        if n > _MAX_BODY:
            raise _bad("the body is too large")
        raw = self.rfile.read(n) if n > 0 else b""
        self._body_read = True
        if ctype != "application/json":
            raise _bad("the body must be application/json")
        try:
            return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError):
            raise _bad("the body is not valid JSON") from None

    def __getattr__(self, name: str):
        # Every method (GET, POST, QUERY, ...) goes through one router: 405 with Allow for known paths.
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _number(v: str | None, name: str, lo: float, hi: float, default: float) -> float:
    if v is None:
        return default
    try:
        x = float(v)
    except ValueError:
        raise _bad(f"{name} must be a number from {lo:g} to {hi:g}") from None
    if not math.isfinite(x) or not lo <= x <= hi:
        raise _bad(f"{name} must be a number from {lo:g} to {hi:g}")
    return x


def _integer(v: str | None, name: str, lo: int, hi: int, default: int) -> int:
    if v is None:
        return default
    if not re.fullmatch(r"[+-]?[0-9]{1,10}", v.strip()):
        raise _bad(f"{name} must be an integer from {lo} to {hi}")
    x = int(v)
    if not lo <= x <= hi:
        raise _bad(f"{name} must be an integer from {lo} to {hi}")
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



# --- running it (``spotctl sim serve`` / ``spotctl sim status``) ---------------------------------

DEFAULT_PORT = 8787


class _Terminated(Exception):
    """SIGTERM: stop serving and exit 0."""


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def region_endpoint(region) -> tuple[str | None, int | None, str | SecretFile | None]:
    """Host, port and token of the region's ``[contract]`` table (what ``sim serve`` defaults to); a
    ``token_file`` is returned as a :class:`SecretFile`, which the server re-reads when it is rotated."""
    sec = region.section("contract") or {}
    host = port = None
    if sec.get("url"):
        u = urlsplit(sec["url"])
        host = u.hostname
        try:
            port = u.port
        except ValueError:
            port = None
    token: str | SecretFile | None = sec.get("token") or None
    if not token and sec.get("token_file"):
        token = SecretFile(sec["token_file"], setting=f"regions.{region.name}.contract.token_file")
        token.value()  # a missing or empty file is a ConfigError before the server starts
    return host, port, token


def populate(world, count: int) -> list[str]:
    """Launch ``count`` spot instances in the world, round-robin over its pools (skipping full pools)."""
    from spotctl.core.errors import CapacityError

    names = sorted(world.pools)
    made: list[str] = []
    full: set[str] = set()
    i = 0
    while len(made) < count and len(full) < len(names):
        name = names[i % len(names)]
        i += 1
        if name in full:
            continue
        try:
            inst = world.cloud.create_instance(world.pools[name], f"sim-spot-{len(made) + 1:03d}",
                                               f"sim-serve-{len(made) + 1:03d}")
        except CapacityError:
            full.add(name)
            continue
        made.append(inst.id)
    return made


def serve_region(region, world_factory, *, host: str | None = None, port: int | None = None,
                 seed: int | None = None, token: str | None = None, instances: int = 6,
                 max_wait: float = MAX_WAIT, announce: Callable[[str], None] = print,
                 warn: Callable[[str], None] = print, clock: Clock | None = None) -> dict:
    """Serve the contract API of ``region``'s simulator until Ctrl-C (KeyboardInterrupt) or SIGTERM.

    Host, port and token default to the region's ``[contract]`` table (so ``spotctl plan``
    on the same config reaches this server), else ``127.0.0.1:8787`` without auth. A
    non-loopback host is refused unless given explicitly (``host``), and then warned about.
    """
    import signal

    from spotctl.core.errors import RefusedError, UnavailableError

    cfg_host, cfg_port, cfg_token = region_endpoint(region)
    if host is None:
        host = cfg_host or "127.0.0.1"
        if not is_loopback(host):
            raise RefusedError(f"refusing to serve the simulator on non-loopback host {host} "
                               f"(from the region's [contract] url)",
                               hint=f"pass --host {host} to expose it anyway")
    elif not is_loopback(host):
        warn(f"serving the simulated contract API on non-loopback host {host}: anyone who can reach it "
             "can read the feed" + ("" if (token or cfg_token) else " and reclaim instances (no --token)"))
    port = cfg_port if port is None else port
    port = DEFAULT_PORT if port is None else port
    token = token if token is not None else cfg_token
    clock = clock or SystemClock()
    start = clock.now()
    # Start the world a minute back and advance it, so that events due at its start (reservations
    # taking hosts) have run before the instances are placed.
    world, *_ = world_factory(region, start - 60.0, region.seed if seed is None else seed)
    world.advance(start)
    made = populate(world, instances)
    try:
        server = make_server(world, host, port, token=token or None, max_wait=max_wait, clock=clock)
    except OSError as e:
        raise UnavailableError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None

    def on_term(signum, frame):
        raise _Terminated()

    old = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    # how it stopped, as it happened: SIGTERM (a service manager), Ctrl-C / SIGINT (an operator), or the
    # server shutting itself down
    stopped = "shut down"
    try:
        # announced inside the try: a Ctrl-C as soon as the URL is out is a clean stop too
        announce(f"serving region {region.name!r} (seed {world.seed}, {len(made)} instances) at {server.url}"
                 + (" (bearer token required)" if token else "") + "; Ctrl-C to stop")
        server.serve()
    except _Terminated:
        stopped = "terminated"
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        server.server_close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return {"url": server.url, "region": region.name, "seed": world.seed, "stopped": stopped,
            "served_seconds": round(clock.now() - start, 3), "notices_logged": len(server.api.log),
            "reclaims": len(server.api.reclaims)}
