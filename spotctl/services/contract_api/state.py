"""The contract API's state over a simulated world: what the API adds to it.

:class:`ContractAPI` keeps the **ordered notice log** (every notice that appears
in ``world.contract.notices()`` is appended once, with the next cursor),
**reclaims** with per-instance receipts, and a deterministic **delivery
receipt** per notice. The world advances with the wall clock — on every request
and on the server's 1 s ticker (:mod:`.handler`) — under one lock; a long-poll
waits on a condition that is notified when the log grows. Requests are checked
here (:meth:`ContractAPI.validate`); a refusal is an :class:`ApiError` carrying
its HTTP status, which the handler sends as is.

The world is passed in (any object with the simulator's ``advance``, ``now``,
``seed``, ``pools``, ``cloud``, ``contract`` and ``provider``); this module does
not import the simulator.
"""

from __future__ import annotations

import math
import re
import threading
import time
import zlib
from types import SimpleNamespace
from typing import TypeGuard

from spotctl.core.models import Notice
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.timefmt import iso as _iso

from .world import World

MIN_NOTICE_SECONDS = 120
MAX_LEAD_SECONDS = 86400
MAX_WAIT = 60.0
_INSTANCE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_DRILL = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_REQUEST_KEYS = {"instance_ids", "notice_seconds", "advisory_lead_seconds", "drill_id", "reason"}
_KEEP_RECLAIMS = 10000


def iso(t: float | None) -> str | None:
    """RFC 3339 UTC with milliseconds (the API's one timestamp format; :func:`spotctl.core.timefmt.iso`)."""
    return _iso(t, "milliseconds")


class ApiError(Exception):
    """A refused request: its HTTP status, the error code and message of the body, extra headers."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


def _int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


class ContractAPI:
    """The API's state over one world. Thread-safe; every method takes the lock."""

    def __init__(self, world: World, *, clock: Clock | None = None, max_wait: float = MAX_WAIT,
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

    def _append(self, n: Notice | SimpleNamespace, *, source: str = "provider") -> dict:
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
            raise bad_request("the body must be a JSON object")
        unknown = sorted(set(body) - _REQUEST_KEYS)
        if unknown:
            raise bad_request(f"unknown field(s): {', '.join(unknown)}")
        ids = body.get("instance_ids")
        if not isinstance(ids, list) or not 1 <= len(ids) <= 100:
            raise bad_request("instance_ids must be a list of 1 to 100 instance ids")
        if not all(isinstance(i, str) and _INSTANCE.fullmatch(i) for i in ids):
            raise bad_request("every instance id must be 1-64 characters of letters, digits, '.', '_' or '-'")
        if len(set(ids)) != len(ids):
            raise bad_request("instance_ids must not repeat")
        ns = body.get("notice_seconds")
        if not _int(ns) or not MIN_NOTICE_SECONDS <= ns <= MAX_LEAD_SECONDS:
            raise bad_request(f"notice_seconds must be an integer from {MIN_NOTICE_SECONDS} to {MAX_LEAD_SECONDS}")
        lead = body.get("advisory_lead_seconds", 0)
        if not _int(lead) or not 0 <= lead <= MAX_LEAD_SECONDS:
            raise bad_request(f"advisory_lead_seconds must be an integer from 0 to {MAX_LEAD_SECONDS}")
        drill = body.get("drill_id")
        if "drill_id" in body and not (isinstance(drill, str) and _DRILL.fullmatch(drill)):
            raise bad_request("drill_id must be 1-64 characters of letters, digits, '.', '_', ':' or '-'")
        reason = body.get("reason")
        if "reason" in body and not (isinstance(reason, str) and len(reason) <= 200):
            raise bad_request("reason must be a string of at most 200 characters")
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
