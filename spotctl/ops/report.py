"""``spotctl report``: savings, demand and waits, interruptions, notice SLOs, advisory precision, drill
scores and contract degradations over a window, from what the region's state database recorded.

This reads the window's rows (:func:`spotctl.state.history.window_rows`, each read bounded by the window
through an index) and the drills started in it, and hands them to the pure
:func:`spotctl.core.report.build`. It writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from types import SimpleNamespace
from typing import Any, cast

from spotctl.core.config import RegionConfig
from spotctl.core.errors import UsageError
from spotctl.core.report import build
from spotctl.state import history
from spotctl.state.store import Store

from . import drill_record
from .audit import parse_since
from .runtime import Runtime

log = logging.getLogger(__name__)

#: The longest window a report covers (what the history tables keep).
MAX_WINDOW_S = history.KEEP_SECONDS


def window(since: str, until: str | None, *, last_pass: float | None, now: float) -> tuple[float, float]:
    """``[start, end]``: ``until`` is ``now``, ``last-pass`` (default: the state's last recorded pass, so that a
    simulation's kept state reports its own day), an ISO 8601 time or epoch seconds; ``since`` a duration
    before the end (``7d``), an ISO 8601 time or epoch seconds."""
    if until is None or until == "last-pass":
        end = last_pass if last_pass is not None else now
    elif until == "now":
        end = now
    else:
        parsed = parse_since(until, now)
        if parsed is None:
            raise UsageError("--until: empty", hint="now, last-pass, an ISO 8601 time or epoch seconds")
        end = parsed
    start = parse_since(since, end)
    if start is None:
        raise UsageError("--since: empty", hint="a duration (30m, 2h, 7d), an ISO 8601 time or epoch seconds")
    if start >= end:
        raise UsageError(f"--since: the window is empty (it starts at or after its end, {end:.0f})",
                         hint="give a start before --until")
    if end - start > MAX_WINDOW_S:
        raise UsageError(f"--since: a window longer than {MAX_WINDOW_S // 86400} days",
                         hint=f"the state keeps prices and waits for {MAX_WINDOW_S // 86400} days")
    return start, end


def drills_in(store: Store, region: RegionConfig, start: float, end: float) -> list[dict[str, Any]]:
    """The drills started in the window, each scored as ``exercise-reclaim report`` scores it."""
    rt = cast(Runtime, SimpleNamespace(store=store, region=region, now=lambda: end))
    out = []
    for drill_id in json.loads(store.get_value(drill_record.INDEX_KEY) or "[]"):
        d = drill_record.load(rt, drill_id)
        if not start <= float(d.get("started_at") or 0) <= end:
            continue
        r = drill_record.report(rt, drill_id)
        out.append({k: r.get(k) for k in ("id", "pool", "status", "started_at", "finished_at", "score", "checks",
                                          "passed")} | {"victims": len(r.get("victims") or [])})
    return sorted(out, key=lambda d: d["started_at"])


def report(store: Store, region: RegionConfig, *, since: str, until: str | None = None,
           now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    last = history.last_recorded(store)
    start, end = window(since, until, last_pass=last, now=now)
    t0 = time.perf_counter()
    rows = history.window_rows(store, start, end)
    drills = drills_in(store, region, start, end)
    log.info("report: %s rows read in %.1f ms", {k: len(v) for k, v in rows.items()}, (time.perf_counter() - t0) * 1e3)
    out = build(region=region.name, start=start, end=end, rows=rows, drills=drills,
                on_demand={name: p.on_demand_price for name, p in region.pools.items()},
                currency=region.policy.currency)
    out["last_pass_at"] = last
    out["state_db"] = str(store.path)
    out["stale_s"] = round(now - last, 1) if last is not None and until in (None, "last-pass") else None
    return out


def write_document(path: str, text: str) -> int:
    """Write a report document atomically (a temporary file beside it, then renamed): the bytes written.
    A path that cannot be written is a usage error naming it, and leaves no partial file."""
    import os
    import tempfile

    data = text.encode("utf-8")
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise UsageError(f"--output: {path} is a directory", hint="name a file, e.g. report.html")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".report-", dir=os.path.dirname(target))
    except OSError as e:
        raise UsageError(f"--output: cannot write {path}: {e.strerror}", hint="name a file in a writable directory") \
            from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UsageError(f"--output: cannot write {path}: {e.strerror}", hint="name a file in a writable directory") \
            from None
    return len(data)
