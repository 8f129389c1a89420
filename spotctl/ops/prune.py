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
PASS_BATCH = 200  # most rows per write transaction of the prune in a pass: a few milliseconds, well inside its budget
FIRST_BATCH = 50  # a table's first batch in a budgeted prune, before its cost per row is known; doubled after each
DEFAULT_RATE = 5e-4  # s per row assumed of a table not measured yet when no other table is (50 rows: 25 ms)
MIN_RATE = 1e-7  # s per row: the least a measure is taken for
MARGIN = 2.0  # a batch is begun only when twice its estimate fits in what is left of the budget
BATCH_SHARE = 0.125  # and is estimated at most an eighth of the budget: what a slow one overshoots by is small
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
        batch: int | None = None, progress: Callable[[dict[str, int]], None] | None = None,
        stop: Callable[[], bool] | None = None) -> tuple[dict[str, int], bool]:
    """Prune every table, a batch at a time, round-robin so that each table gets its turn. Returns (rows
    deleted per table, whether all is done).

    With ``budget_s`` (monotonic seconds, the passes) a table's batches start at :data:`FIRST_BATCH` rows
    and double up to ``batch``, each sized from the table's seconds per row measured on earlier batches
    (kept on the store, :meth:`Store.prune_rates`) to at most :data:`BATCH_SHARE` of the budget: a batch
    whose estimate (with :data:`MARGIN`) does not fit in what is left of the budget is not begun. Without it, batches of ``batch`` (:data:`BATCH`) rows until all is done, or
    until ``stop()`` says so between two batches (a signal to ``state prune``).

    ``resume`` (the passes): walk the transitions and the delivered outbox rows on from where the last
    pass's walk ended, so that what they keep (a large fleet's old transitions of live nodes, 90 days of
    delivered audit records' rows) is not read again by every pass, and read the sizes of the plans
    recorded since the last check only. Those rows go with their node or audit record; a row written (or
    delivered) late with an older time is left to ``state prune``, which walks the whole table."""
    cut, caps = cutoffs(retention, now), _plan_caps(retention)
    deleted = dict.fromkeys(TABLES, 0)
    saved = {t: _saved_cursor(store, t) for t in SCANNED} if resume else {}
    cursors: dict[str, Any] = dict(saved)
    most = batch or BATCH
    rates = store.prune_rates()
    size = dict.fromkeys(TABLES, min(FIRST_BATCH, most) if budget_s is not None else most)
    todo = list(TABLES)
    t0 = last = time.monotonic()
    try:
        while todo:
            ran = False
            for table in list(todo):
                if stop is not None and stop():
                    return deleted, False
                n = size[table]
                if budget_s is not None:
                    rate = rates.get(table, max(rates.values(), default=DEFAULT_RATE))
                    n = min(n, int((budget_s - (time.monotonic() - t0)) / (rate * MARGIN)),
                            int(budget_s * BATCH_SHARE / rate))
                    if n < 1:  # not even a row of it fits in what is left: the next pass goes on
                        continue
                t1 = time.monotonic()
                counts, cursors[table], done = store.prune_step(table, n, cutoff=cut.get(table, 0.0),
                                                                cursor=cursors.get(table), cached=resume, now=now,
                                                                **caps)
                ran = True
                seen = max((time.monotonic() - t1) / n, MIN_RATE)  # a clock that stood still measured nothing
                # up at once, down by half the gap: a slow batch is believed, a fast one only slowly
                rates[table] = seen if table not in rates else max(seen, (rates[table] + seen) / 2)
                size[table] = min(most, size[table] * 2)
                for k, v in counts.items():
                    deleted[k] = deleted.get(k, 0) + v
                if done:
                    todo.remove(table)
            if not ran:
                return deleted, False
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
    for it; RefusedError, exit 6, naming the holder when it stays busy), records a ``state.prune`` audit
    record ``started`` with the policy, deletes everything due, and records a second one with the counts:
    ``ok``, or ``partial`` when SIGINT or SIGTERM came (the batch under way is finished, no other begun;
    ``interrupted`` in the result names the signal). A kill -9 leaves the ``started`` record alone."""
    if dry_run:
        return {"region": store.region, "dry_run": True, "tables": report(store, retention, now)}
    policy = {t: _retention_text(t, retention) for t in TABLES}
    with _locked(store, wait, f"state prune, by {actor}", lock_wait), _Signals() as signals:
        t0 = time.perf_counter()
        first = store.audit(actor=actor, action="state.prune", target=store.region, result="started",
                            inputs={"retention": policy}, at=now)

        def said(deleted: dict[str, int]) -> None:
            if progress is not None:
                progress(f"pruning: {sum(deleted.values())} rows deleted so far "
                         f"({', '.join(f'{k} {v}' for k, v in deleted.items() if v) or 'none yet'})")

        deleted, done = run(store, retention, now, progress=said, stop=signals.came)
        duration = round(time.perf_counter() - t0, 3)
        left = {t: store.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in deleted}
        rec = store.audit(actor=actor, action="state.prune", target=store.region, result="ok" if done else "partial",
                          inputs={"deleted": deleted, "retention": policy, "started": first["id"],
                                  **({"interrupted": signals.name} if signals.name else {})}, at=now)
    return {"region": store.region, "dry_run": False, "duration_s": duration, "audit_record": rec["id"],
            "started_record": first["id"], "interrupted": signals.name, "deleted_total": sum(deleted.values()),
            "tables": [{"table": t, "retention": policy[t], "deleted": deleted.get(t, 0),
                        "rows": left[t]} for t in deleted]}


class _Signals:
    """SIGINT and SIGTERM held off while a prune runs (main thread only): the first of them is noted, and
    the prune stops between two batches; the handlers of before are put back after."""

    WHICH = ("SIGINT", "SIGTERM")

    def __init__(self) -> None:
        self.name: str | None = None
        self._old: dict[int, Any] = {}

    def came(self) -> bool:
        return self.name is not None

    def __enter__(self) -> _Signals:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in self.WHICH:
                num = getattr(signal, name)
                self._old[num] = signal.signal(num, self._note)
        return self

    def _note(self, signum: int, frame: object) -> None:
        import signal

        self.name = self.name or signal.Signals(signum).name
        log.warning("%s: the prune stops after the batch under way", self.name)

    def __exit__(self, *exc: object) -> None:
        import signal

        for num, old in self._old.items():
            signal.signal(num, old)


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

