"""``spotctl audit``: list, show, verify and export the region's audit trail.

The trail lives in the region's state database (``audit`` table, hash-chained:
each record carries the SHA-256 of the previous one) and, once relayed, at the
audit log service. ``verify`` walks the local chain and, when the region has an
audit service, checks that every record the relay delivered is stored there
with the same hash.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

from spotctl.core.audit import walk
from spotctl.core.errors import UsageError
from spotctl.state.store import Store, iso

EXPORT_COLUMNS = ("seq", "id", "at", "time", "actor", "action", "target", "result", "inputs", "prev_hash", "hash")
_REL = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class AuditService(Protocol):
    """What ``verify`` needs from the audit log service (``spotctl.adapters.audit_http.AuditClient``)."""

    url: str

    def records(self, region: str | None = None) -> Iterator[dict]: ...


def _cut(text: str, limit: int = 60) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 1] + "…'"


def parse_since(text: str | None, now: float) -> float | None:
    """``2h``/``30m``/``7d`` ago, an ISO 8601 time (UTC unless it says otherwise), or epoch seconds."""
    if not text:
        return None
    t = text.strip()
    m = _REL.match(t)
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        value = float(t)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or not 0 <= value <= 32503680000:  # 1970 .. 3000
            raise UsageError(f"--since: {_cut(text)} is not a time",
                             hint="epoch seconds between 0 and 32503680000, a duration (30m, 2h, 7d) or ISO 8601")
        return value
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since: cannot read {_cut(text)}",
                         hint="use a duration (30m, 2h, 7d), an ISO 8601 time or epoch seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _public(rec: dict, delivered: dict[str, float | None] | None = None) -> dict:
    d = {"seq": rec["seq"], "id": rec["id"], "at": rec["at"], "time": iso(rec["at"]), "actor": rec["actor"],
         "action": rec["action"], "target": rec["target"], "result": rec["result"], "inputs": rec["inputs"],
         "prev_hash": rec["prev_hash"], "hash": rec["hash"]}
    if delivered is not None:
        d["delivered_at"] = delivered.get(rec["id"])
    return d


def list_records(store: Store, *, now: float, since: str | None = None, actor: str | None = None,
                 action: str | None = None, node: str | None = None, limit: int | None = None) -> dict:
    """Records matching the filters, oldest first (the newest ``limit`` when limited)."""
    recs = store.audit_query(since=parse_since(since, now), actor=actor, action=action, target=node)
    if limit is not None and limit >= 0:
        recs = recs[-limit:] if limit else []
    delivered = store.audit_delivered()
    return {"region": store.region, "count": len(recs), "records": [_public(r, delivered) for r in recs]}


def show(store: Store, record_id: str) -> dict:
    rec = store.audit_record(record_id)
    return {"region": store.region, **_public(rec, store.audit_delivered())}


def verify(store: Store, service: AuditService | None = None) -> dict:
    """Walk the local chain (:func:`spotctl.core.audit.walk`); then compare what was delivered with what
    the service stores."""
    chain = walk(store.audit_records())
    first_bad = None if chain.first_bad is None else _bad(chain.first_bad, chain.reason or "")
    local = chain.verified
    result: dict[str, Any] = {"region": store.region, "ok": first_bad is None, "records": chain.checked, "first_bad": first_bad,
              "local_ok": first_bad is None, "service": None}
    if service is not None:
        result["service"] = _against_service(store, service, local if first_bad is None else
                                             {r["id"]: r["hash"] for r in store.audit_records()})
        result["ok"] = result["ok"] and result["service"]["ok"]
    return result


def _bad(rec: Mapping, reason: str) -> dict:
    return {"id": rec["id"], "seq": rec["seq"], "action": rec["action"], "target": rec["target"], "reason": reason}


def _against_service(store: Store, service: AuditService, local: dict[str, str]) -> dict:
    delivered = store.audit_delivered()
    remote: dict[str, str] = {}
    for rec in service.records(store.region):
        remote.setdefault(str(rec.get("id")), str(rec.get("hash")))
    missing, mismatched = [], []
    pending = 0
    for rid, h in local.items():
        if delivered.get(rid) is None:
            pending += 1
            continue
        if rid not in remote:
            missing.append(rid)
        elif remote[rid] != h:
            mismatched.append(rid)
    unknown = sum(1 for rid in remote if rid not in local)
    return {"url": service.url, "ok": not missing and not mismatched, "checked": len(local) - pending,
            "pending": pending, "missing": missing[:20], "missing_count": len(missing),
            "mismatched": mismatched[:20], "mismatched_count": len(mismatched), "unknown_locally": unknown}


def service_history(service: AuditService, region: str, *, max_records: int = 5000,
                    budget_seconds: float = 3.0) -> dict | None:
    """What the audit service already holds for a region: {"count", "complete", "head"} (head: the newest
    record received), or None when it holds nothing. Bounded: at most ``max_records`` records and about
    ``budget_seconds`` of paging (``complete`` is False when it stopped early: the count is a lower bound)."""
    import time

    stop = time.monotonic() + budget_seconds
    count, head, complete = 0, None, True
    for rec in service.records(region):
        count += 1
        head = rec
        if count >= max_records or time.monotonic() > stop:
            complete = False
            break
    if not count:
        return None
    return {"count": count, "complete": complete, "head": head if isinstance(head, dict) else {}}


def export(store: Store, fmt: str, *, now: float, since: str | None = None, actor: str | None = None,
           action: str | None = None, node: str | None = None) -> Iterator[str]:
    """The records as JSON lines or CSV (with a header), chunk by chunk."""
    if fmt not in ("jsonl", "csv"):
        raise UsageError(f"--format must be jsonl or csv, got {fmt!r}")
    recs = store.audit_query(since=parse_since(since, now), actor=actor, action=action, target=node)
    if fmt == "jsonl":
        for r in recs:
            yield json.dumps(_public(r), sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"
        return
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(EXPORT_COLUMNS)
    for r in recs:
        d = _public(r)
        d["inputs"] = json.dumps(d["inputs"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        w.writerow([d[c] for c in EXPORT_COLUMNS])
        if buf.tell() > 65536:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()
