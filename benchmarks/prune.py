#!/usr/bin/env python3
"""Pruning by retention (issue 14, item 3): on a state database aged by 45 simulated days (``benchmarks/aged.py``,
a third of it past the default 30-day retention), how fast ``spotctl state prune`` catches up, whether the prune
at the end of a pass keeps to its time budget, and what it costs once there is nothing left to prune.

Targets:

- ``prune in a pass, catching up``: the slowest of the bounded prunes (``pass_budget_seconds`` 0.2 s) run
  until the backlog is gone: ≤ 0.25 s (a table's batches start at 50 rows and grow to 200, each begun only when
  its estimate from the earlier ones fits in what is left of the budget).
- ``prune in a pass, steady``: the prune of a pass once the aged database is pruned, against the same call
  on a fresh database in the same run: ≤ 20 ms (the fresh figure is in the detail).
- ``state prune throughput``: rows deleted per second by a full prune of the backlog: ≥ 10,000 rows/s (a year
  of a 100k-node region, about 4M rows, in under 7 minutes).
- ``prune in a pass, SQLite work at the end vs start``: SQLite VM steps of the prune of each pass of a ``spotctl
  simulate`` (demo region, retention of a day; --quick: 2 h over 14 h) over its last seventh against the
  seventh after the retention first passed: ≤ 1.2x (deterministic: the steps, not the time, are counted).

    .venv/bin/python benchmarks/prune.py [--quick]
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from aged import age

from spotctl.core.config import Retention
from spotctl.ops import prune as ops_prune
from spotctl.sim.generate import GEN_START
from spotctl.state.store import Store

RET = Retention.of()
DAYS = 45  # of history: 15 days of it past the default 30-day retention


def _aged(tmp: Path, name: str, nodes: int, days: float) -> Store:
    store = Store.open(tmp / f"{name}.db", "gen")
    if days:
        age(store, nodes, now=GEN_START, days=days)
    return store


def _steady_ms(store: Store, runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ops_prune.run(store, RET, GEN_START, budget_s=RET.pass_budget_seconds, resume=True,
                      batch=ops_prune.PASS_BATCH)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _sim_prune_steps(hours: float, retention: dict[str, float] | None = None) -> tuple[list[int], dict[str, int]]:
    """SQLite VM steps (counted by ``set_progress_handler``, per 10) of the prune at the end of each pass of a
    ``spotctl simulate --hours H --seed 1`` of the demo region, in this process; the rows each table holds
    at the end. ``retention``: the demo region's ``[regions.demo.retention]`` replaced (days, 0.2 s budget)."""
    import dataclasses

    from spotctl.core.config import load_config
    from spotctl.ops import reconcile
    from spotctl.ops.simulate import simulate
    from spotctl.wiring import sim_world_factory

    region = load_config(env={}).region("demo")
    if retention:
        region = dataclasses.replace(region, retention=dataclasses.replace(region.retention, **retention))
    steps: list[int] = []
    real = reconcile.prune_in_pass
    left: dict[str, int] = {}

    def counted(rt, seq, budget_s=None):
        n = [0]

        def tick() -> int:
            n[0] += 1
            return 0

        rt.store.conn.set_progress_handler(tick, 10)
        try:
            return real(rt, seq, budget_s)
        finally:
            rt.store.conn.set_progress_handler(None, 0)
            steps.append(n[0] * 10)
            left.clear()
            left.update(rt.store.counts())

    reconcile.prune_in_pass = counted  # the pass calls it through the module: every pass's prune is counted
    try:
        with tempfile.TemporaryDirectory() as d:
            simulate(region, sim_world_factory, hours=hours, seed=1, state_dir=d)
    finally:
        reconcile.prune_in_pass = real
    return steps, left


def _flat(quick: bool) -> dict:
    """The prune's SQLite work per pass, steady: the first seventh of the run once the retention has passed
    (rows are due from then on) against the last seventh; and before it, when nothing is due yet."""
    hours, days = (14.0, 2 / 24) if quick else (168.0, 1.0)  # --quick: 2 h retention over 14 h
    window, skip = int(hours * 60 / 7), int(days * 1440)  # passes of a minute: a seventh of the run; the retention
    steps, left = _sim_prune_steps(hours, {f"{t}_days": days for t in ("nodes", "transitions", "actions",
                                                                       "notices", "passes", "outbox")})
    before, first, last = (statistics.mean(steps[:skip]), statistics.mean(steps[skip:skip + window]),
                           statistics.mean(steps[-window:]))
    ratio = last / first if first else float("inf")
    span = f"{days * 24:g} h" if quick else f"{days:g} day"
    return {"name": f"prune in a pass, SQLite work at the end vs start of simulate --hours {hours:g}",
            "value": round(ratio, 2), "unit": "x", "target": "<= 1.2", "pass": ratio <= 1.2,
            "detail": f"VM steps per pass, retention {span}: {last:.0f} over the last {window} passes vs {first:.0f} "
                      f"over the {window} after the retention ({before:.0f} before it, nothing due); max {max(steps)}; "
                      "rows at the end: " + ", ".join(f"{k} {v}" for k, v in left.items())}


def bench(quick: bool = False) -> list[dict]:
    nodes = 2_000 if quick else 10_000
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fresh = _aged(tmp, "fresh", nodes, 0)
        fresh_ms = _steady_ms(fresh)
        fresh.close()

        # the passes catch up on the backlog, 0.2 s at a time
        store = _aged(tmp, "pass", nodes, DAYS)
        slowest, calls, pass_rows = 0.0, 0, 0
        while True:
            t0 = time.perf_counter()
            deleted, done = ops_prune.run(store, RET, GEN_START, budget_s=RET.pass_budget_seconds, resume=True,
                                          batch=ops_prune.PASS_BATCH)
            slowest = max(slowest, time.perf_counter() - t0)
            calls += 1
            pass_rows += sum(deleted.values())
            if done:
                break
        steady_ms = _steady_ms(store)
        store.close()

        # the same backlog, pruned by one `spotctl state prune` (no budget, the whole table walked)
        store = _aged(tmp, "cli", nodes, DAYS)
        t0, c0 = time.perf_counter(), time.process_time()
        deleted, _ = ops_prune.run(store, RET, GEN_START)
        full_s, full_cpu = time.perf_counter() - t0, time.process_time() - c0
        total = sum(deleted.values())
        store.close()
    rate = total / full_s if full_s > 0 else float("inf")
    logging.disable(logging.WARNING)  # the simulated world's contract flips, logged as warnings
    try:
        flat = _flat(quick)
    finally:
        logging.disable(logging.NOTSET)
    return [
        {"name": f"prune in a pass, catching up ({nodes // 1000}k nodes, {DAYS} days)", "value": round(slowest, 3),
         "unit": "s", "target": "<= 0.25", "pass": slowest <= 0.25,
         "detail": f"{calls} passes' prunes deleted {pass_rows} rows; budget {RET.pass_budget_seconds} s, "
                   f"batches of {ops_prune.FIRST_BATCH} rows growing to {ops_prune.PASS_BATCH}"},
        {"name": f"prune in a pass, steady ({nodes // 1000}k nodes, aged)", "value": round(steady_ms, 2), "unit": "ms",
         "target": "<= 20", "pass": steady_ms <= 20,
         "detail": f"median of 15 once pruned; the same call on a fresh database {fresh_ms:.2f} ms "
                   f"({steady_ms / fresh_ms if fresh_ms else float('inf'):.1f}x)"},
        {"name": f"state prune throughput ({nodes // 1000}k nodes, {DAYS} days)", "value": round(rate),
         "unit": "rows/s", "target": ">= 10000", "pass": rate >= 10_000,
         "detail": f"{total} rows in {full_s:.2f} s, {full_cpu:.2f} s of CPU "
                   f"({', '.join(f'{k} {v}' for k, v in deleted.items() if v)})"},
        flat,
    ]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _rows

    sys.exit(_rows.main(bench, __doc__))
