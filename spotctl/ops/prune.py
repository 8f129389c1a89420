"""Pruning a region's state database by its retention policy (``[regions.R.retention]``): ``spotctl
state prune [--dry-run]`` (everything due, under the region lock, one audit record with the counts),
the bounded prune at the end of every pass (:func:`prune_in_pass`: at most
``pass_budget_seconds``, counts in the pass's summary, no audit record), and ``spotctl state check``.

What a table keeps whatever its age (live nodes and everything of theirs, resumable actions,
undelivered outbox rows, unacknowledged audit records, ...) is said in :mod:`spotctl.state.prune`, which
deletes a batch per write transaction: a prune killed at any point loses nothing it should keep, and the
next one finishes the job.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from spotctl.core.config import Retention
from spotctl.core.errors import RefusedError, SpotctlError
from spotctl.state.prune import TABLES
from spotctl.state.store import Store

from .runtime import LockWait, Runtime, describe_holder, lock_busy

log = logging.getLogger(__name__)

DAY = 86_400.0
BATCH = 1_000  # rows per write transaction of `state prune` (tens of milliseconds each)
PASS_BATCH = 200  # rows per write transaction of the prune in a pass: a few milliseconds, well inside its budget
PROGRESS_EVERY_S = 2.0

#: The retention each table's age is measured against (reclaims go with the nodes they were of).
_DAYS = {"nodes": "nodes_days", "transitions": "transitions_days", "reclaims": "nodes_days",
         "actions": "actions_days", "notices": "notices_days", "outbox": "outbox_days", "passes": "passes_days",
         "audit": "audit_days"}


def cutoffs(retention: Retention, now: float) -> dict[str, float]:
    """Per table, the time before which a done-with row may go."""
    return {table: now - float(getattr(retention, attr)) * DAY for table, attr in _DAYS.items()}


def _plan_caps(retention: Retention) -> dict[str, int]:
    return {"keep_rows": int(retention.plans_max), "keep_bytes": int(retention.plans_max_mib * (1 << 20))}


def _retention_text(table: str, retention: Retention) -> str:
    if table == "plans":
        return f"newest {retention.plans_max}, at most {retention.plans_max_mib:g} MiB"
    return f"{float(getattr(retention, _DAYS[table])):g} days"


def report(store: Store, retention: Retention, now: float) -> list[dict[str, Any]]:
    """What a prune now would do, per table: rows, eligible, kept and why (reads only)."""
    cut = cutoffs(retention, now)
    return [{"table": t, "retention": _retention_text(t, retention),
             **store.prune_report(t, cutoff=cut.get(t, 0.0), transitions_cutoff=cut["transitions"],
                                  **_plan_caps(retention))} for t in TABLES]


def run(store: Store, retention: Retention, now: float, *, budget_s: float | None = None, resume: bool = False,
        batch: int | None = None, progress: Callable[[dict[str, int]], None] | None = None
        ) -> tuple[dict[str, int], bool]:
    """Prune every table, a batch at a time, round-robin so that each table gets its turn; stop when
    ``budget_s`` (monotonic seconds) is used up. Returns (rows deleted per table, whether all is done).

    ``resume`` (the passes): walk the transitions and the delivered outbox rows on from where the last
    pass's walk ended, so that what they keep (a large fleet's old transitions of live nodes, 90 days of
    delivered audit records' rows) is not read again by every pass. Those rows go with their node or
    audit record; a row written (or delivered) late with an older time is left to ``state prune``, which
    walks the whole table."""
    cut, caps = cutoffs(retention, now), _plan_caps(retention)
    deleted = dict.fromkeys(TABLES, 0)
    saved = {t: _saved_cursor(store, t) for t in SCANNED} if resume else {}
    cursors: dict[str, Any] = dict(saved)
    todo = list(TABLES)
    t0 = last = time.monotonic()
    longest = 0.0  # the longest batch so far: the next one is not begun unless it would fit in the budget too
    try:
        while todo:
            for table in list(todo):
                if budget_s is not None and time.monotonic() - t0 + longest >= budget_s:
                    return deleted, False
                t1 = time.monotonic()
                counts, cursors[table], done = store.prune_step(table, batch or BATCH, cutoff=cut.get(table, 0.0),
                                                                cursor=cursors.get(table), **caps)
                longest = max(longest, time.monotonic() - t1)
                for k, n in counts.items():
                    deleted[k] = deleted.get(k, 0) + n
                if done:
                    todo.remove(table)
            if progress is not None and time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                progress(deleted)
        return deleted, True
    finally:
        for t in SCANNED if resume else ():
            mark = cursors.get(t)
            if mark is not None and mark != saved.get(t):
                with contextlib.suppress(SpotctlError):  # only a shortcut: without it the next walk starts afresh
                    store.set_value(CURSOR_KEY.format(table=t), f"{mark[0]!r} {mark[1]}", now)


SCANNED = ("transitions", "outbox")  # the tables walked on from the last pass's mark
CURSOR_KEY = "prune.{table}.after"  # kv: "<time> <id>" of the last row the passes' walk of the table reached


def _saved_cursor(store: Store, table: str) -> tuple[float, int] | None:
    """A passes' walk's mark, read as any DB value is: a bad one is ignored (walk from the start)."""
    parts = (store.get_value(CURSOR_KEY.format(table=table)) or "").split(" ")
    try:
        at, seq = float(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None
    return (at, seq) if math.isfinite(at) and seq >= 0 else None


def prune_in_pass(rt: Runtime, seq: int | None, budget_s: float | None = None) -> dict[str, Any]:
    """The prune at the end of a pass (``seq``: its row; None, a dry run: nothing): within the region's
    ``pass_budget_seconds`` (0: never), counts added to the pass's summary as ``pruned``. A failure is
    logged (a warning), never raised: the pass is over and did its work; the next pass prunes again."""
    retention = rt.region.retention
    budget = retention.pass_budget_seconds if budget_s is None else budget_s
    if seq is None or budget <= 0:
        return {}
    t0 = time.perf_counter()
    try:
        deleted, done = run(rt.store, retention, rt.now(), budget_s=budget, resume=True, batch=PASS_BATCH)
        summary: dict[str, Any] = {"rows": {k: v for k, v in deleted.items() if v}, "done": done,
                                   "duration_s": round(time.perf_counter() - t0, 4)}
        if summary["rows"] or not done:
            rt.store.note_pass(seq, "pruned", summary)
    except SpotctlError as e:
        log.warning("pass %s: pruning the state database failed: %s", seq, e)
        return {"error": str(e)[:300]}
    log.info("pass %s: pruned %s in %.1f ms%s", seq, summary["rows"] or "nothing", summary["duration_s"] * 1000,
             "" if done else " (time budget used; the next pass goes on)")
    return summary


def prune(store: Store, retention: Retention, *, now: float, actor: str, dry_run: bool = False, wait: float = 0.0,
          lock_wait: LockWait | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``spotctl state prune``: the dry run reports; else, under the region lock (waiting up to ``wait`` s
    for it; RefusedError, exit 6, naming the holder when it stays busy), deletes everything due and
    records one ``state.prune`` audit record with the counts."""
    if dry_run:
        return {"region": store.region, "dry_run": True, "tables": report(store, retention, now)}
    with _locked(store, wait, f"state prune, by {actor}", lock_wait):
        t0 = time.perf_counter()

        def said(deleted: dict[str, int]) -> None:
            if progress is not None:
                progress(f"pruning: {sum(deleted.values())} rows deleted so far "
                         f"({', '.join(f'{k} {v}' for k, v in deleted.items() if v) or 'none yet'})")

        deleted, _ = run(store, retention, now, progress=said)
        duration = round(time.perf_counter() - t0, 3)
        left = {t: store.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in deleted}
        rec = store.audit(actor=actor, action="state.prune", target=store.region, result="ok",
                          inputs={"deleted": deleted, "retention": {t: _retention_text(t, retention) for t in deleted}},
                          at=now)
    return {"region": store.region, "dry_run": False, "duration_s": duration, "audit_record": rec["id"],
            "deleted_total": sum(deleted.values()),
            "tables": [{"table": t, "retention": _retention_text(t, retention), "deleted": deleted.get(t, 0),
                        "rows": left[t]} for t in deleted]}


def check(store: Store) -> dict[str, Any]:
    """``spotctl state check``: the whole database checked (:meth:`Store.full_check`); the problems found."""
    problems = list(store.full_check())
    return {"path": str(store.path), "ok": not problems, "problems": problems}


class _locked:
    """The region lock around a whole prune (RefusedError naming the holder when it stays busy)."""

    def __init__(self, store: Store, wait: float, purpose: str, shown: LockWait | None):
        self.store, self.wait, self.purpose, self.shown = store, wait, purpose, shown

    def __enter__(self) -> None:
        t0 = time.monotonic()
        shown = self.shown if self.wait > 0 else None

        def on_wait(elapsed: float) -> None:
            if shown is not None:
                shown.waiting(elapsed, self.wait, describe_holder(self.store.lock_holder(), time.time()))

        try:
            got = self.store.try_lock(self.wait, purpose=self.purpose, on_wait=on_wait)
        finally:
            if shown is not None:
                shown.done()
        if not got:
            holder, waited = self.store.lock_holder(), time.monotonic() - t0
            raise RefusedError(lock_busy(holder, waited, self.wait),
                               details={"holder": holder, "waited_s": round(waited, 3)},
                               hint="try again when it is done, or wait longer with --wait SECONDS")

    def __exit__(self, *exc: object) -> None:
        self.store.unlock()

