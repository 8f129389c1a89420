#!/usr/bin/env python3
"""Pruning by retention (issue 14, item 3): on a state database aged by 45 simulated days (``benchmarks/aged.py``,
a third of it past the default 30-day retention), how fast ``spotctl state prune`` catches up, whether the prune
at the end of a pass keeps to its time budget, and what it costs once there is nothing left to prune.

Targets:

- ``prune in a pass, catching up``: the slowest of the bounded prunes (``pass_budget_seconds`` 0.2 s) run
  until the backlog is gone: ≤ 0.25 s (the budget and one batch of 200 rows).
- ``prune in a pass, steady``: the prune of a pass once the aged database is pruned, against the same call
  on a fresh database in the same run: ≤ 20 ms (the fresh figure is in the detail).
- ``state prune throughput``: rows deleted per second by a full prune of the backlog: ≥ 10,000 rows/s (a year
  of a 100k-node region, about 4M rows, in under 7 minutes).

    .venv/bin/python benchmarks/prune.py [--quick]
"""

from __future__ import annotations

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
    return [
        {"name": f"prune in a pass, catching up ({nodes // 1000}k nodes, {DAYS} days)", "value": round(slowest, 3),
         "unit": "s", "target": "<= 0.25", "pass": slowest <= 0.25,
         "detail": f"{calls} passes' prunes deleted {pass_rows} rows; budget {RET.pass_budget_seconds} s, "
                   f"batches of {ops_prune.PASS_BATCH} rows"},
        {"name": f"prune in a pass, steady ({nodes // 1000}k nodes, aged)", "value": round(steady_ms, 2), "unit": "ms",
         "target": "<= 20", "pass": steady_ms <= 20,
         "detail": f"median of 15 once pruned; the same call on a fresh database {fresh_ms:.2f} ms "
                   f"({steady_ms / fresh_ms if fresh_ms else float('inf'):.1f}x)"},
        {"name": f"state prune throughput ({nodes // 1000}k nodes, {DAYS} days)", "value": round(rate),
         "unit": "rows/s", "target": ">= 10000", "pass": rate >= 10_000,
         "detail": f"{total} rows in {full_s:.2f} s, {full_cpu:.2f} s of CPU "
                   f"({', '.join(f'{k} {v}' for k, v in deleted.items() if v)})"},
    ]


def main() -> int:
    rows = bench(quick="--quick" in sys.argv)
    for r in rows:
        print(f"{'PASS' if r['pass'] else 'FAIL'}  {r['name']}: {r['value']} {r['unit']} (target {r['target']}) "
              f"— {r['detail']}")
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
