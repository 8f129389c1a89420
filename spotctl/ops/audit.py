"""``spotctl audit``: list, show, verify and export the region's audit trail.

The trail lives in the region's state database (``audit`` table, hash-chained:
each record carries the SHA-256 of the previous one) and, once relayed, at the
audit log service. ``verify`` walks the local chain (from the checkpoint the last
successful verify left, or ``full``) and, when the region has an audit service,
checks that every record the relay delivered is stored there with the same hash.
Every read streams in chunks: memory does not grow with the history.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

from spotctl.core.errors import UsageError
from spotctl.state.audit import CHUNK, AuditFilter
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


def _public(rec: dict, delivered: bool = False) -> dict:
    d = {"seq": rec["seq"], "id": rec["id"], "at": rec["at"], "time": iso(rec["at"]), "actor": rec["actor"],
         "action": rec["action"], "target": rec["target"], "result": rec["result"], "inputs": rec["inputs"],
         "prev_hash": rec["prev_hash"], "hash": rec["hash"]}
    if delivered:
        d["delivered_at"] = rec.get("delivered_at")
    return d


@contextlib.contextmanager
def listing(store: Store, *, now: float, since: str | None = None, actor: str | None = None,
            action: str | None = None, node: str | None = None, limit: int | None = None) -> Iterator[dict]:
    """Records matching the filters, oldest first (the newest ``limit`` when limited), as
    ``{"region", "count", "records"}`` where ``records`` is an iterator read chunk by chunk (constant
    memory; the newest ``limit`` are found with ``ORDER BY seq DESC LIMIT``), all in one read snapshot
    held while the caller writes them out."""
    where = AuditFilter(parse_since(since, now), actor, action, node)
    with store.audit_snapshot():
        after = store.audit_newest_from(limit, where) if limit is not None else 0  # read from the end
        count = store.audit_count(where, after_seq=after)
        if not count:
            records: Iterator[dict] = iter(())
        elif limit is not None and limit <= CHUNK:
            newest = list(store.iter_audit(where, after_seq=after))
            records = reversed(list(store.with_delivery(reversed(newest), newest_first=True)))
        else:
            records = store.with_delivery(store.iter_audit(where, after_seq=after))
        yield {"region": store.region, "count": count, "records": (_public(r, True) for r in records)}


def list_records(store: Store, *, now: float, since: str | None = None, actor: str | None = None,
                 action: str | None = None, node: str | None = None, limit: int | None = None) -> dict:
    """:func:`listing` as one dict with a list (for small results: it holds every record listed)."""
    with listing(store, now=now, since=since, actor=actor, action=action, node=node, limit=limit) as d:
        return {**d, "records": list(d["records"])}


def show(store: Store, record_id: str) -> dict:
    rec = store.audit_record(record_id)
    return {"region": store.region, **_public({**rec, "delivered_at": store.audit_delivered_at(rec["id"])}, True)}


def verify(store: Store, service: AuditService | None = None, *, full: bool = False,
           now: float | None = None) -> dict:
    """Walk the local chain (:meth:`Store.check_audit_chain`: from the checkpoint on, or ``full``), save
    the new checkpoint when it held; then compare what was delivered with what the service stores."""
    import time

    check = store.check_audit_chain(full=full)
    w = check.walk
    first_bad = None if w.first_bad is None else _bad(w.first_bad, w.reason or "")
    checkpoint: dict[str, Any] = {"seq": None, "saved": False, "problem": None}
    mark = check.checkpoint
    if mark is not None:
        problem = store.save_audit_checkpoint(mark, time.time() if now is None else now)
        checkpoint = {"seq": mark.seq, "saved": problem is None, "problem": problem}
    result: dict[str, Any] = {"region": store.region, "ok": check.ok, "mode": check.mode, "from_seq": check.from_seq,
                              "records": w.checked, "first_bad": first_bad, "local_ok": check.ok,
                              "checkpoint": checkpoint, "service": None}
    if service is not None:
        result["service"] = _against_service(store, service)
        result["ok"] = result["ok"] and result["service"]["ok"]
    return result


def _bad(rec: Mapping, reason: str) -> dict:
    return {"id": rec["id"], "seq": rec["seq"], "action": rec["action"], "target": rec["target"], "reason": reason}


def _against_service(store: Store, service: AuditService) -> dict:
    """Every record the relay delivered must be stored at the service with the same hash (compared in
    SQL: constant memory whatever the history)."""
    pairs = ((str(rec.get("id")), str(rec.get("hash"))) for rec in service.records(store.region))
    d = store.audit_against(pairs)
    return {"url": service.url, "ok": not d["missing_count"] and not d["mismatched_count"], **d}


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
    with store.audit_snapshot():  # one consistent view, read chunk by chunk
        recs = store.iter_audit(AuditFilter(parse_since(since, now), actor, action, node))
        yield from (_jsonl(recs) if fmt == "jsonl" else _csv(recs))


def _jsonl(recs: Iterable[dict]) -> Iterator[str]:
    for r in recs:
        yield json.dumps(_public(r), sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


def _csv(recs: Iterable[dict]) -> Iterator[str]:
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
