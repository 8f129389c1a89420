"""``spotctl simulate``: replay hours of the demo region on a virtual clock.

The reconciler runs against a fresh simulated world exactly as the timer would
(one pass per interval), and the world reports cost, demand served, wait
times, interruptions and notices handled before their deadline (each figure
defined, and how they add up, in :mod:`spotctl.core.sim_report`); this adds the
reconciler's own tallies. Nothing of the region's real state is touched: the
simulation keeps its own state database.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from spotctl.core.config import RegionConfig
from spotctl.core.errors import UsageError
from spotctl.core.ports import FixedClock
from spotctl.state.store import Store

from .reconcile import PassResult, run_pass
from .relay import queued_kinds
from .runtime import Planner, Runtime, default_planner

# A fixed default start keeps a simulation reproducible for a seed: Monday 2026-01-05 00:00 UTC.
DEFAULT_START = 1767571200.0

WorldFactory = Callable[[RegionConfig, float, int], tuple]


def simulate(region: RegionConfig, build: WorldFactory, *, hours: float, seed: int | None, interval: int = 60,
             start: float | None = None, state_dir: str | Path | None = None,
             progress: Callable[[str], None] = lambda _: None, planner: Planner = default_planner,
             on_pass: Callable[[float, PassResult], None] | None = None) -> dict:
    """Replay ``hours`` of ``region`` (a world from ``build``) one reconcile pass per ``interval`` seconds, and
    report. ``planner``: what the passes plan with (a variant behind :func:`spotctl.core.planner.plan`'s
    interface, for benchmarks and what-if studies; spotctl's planner by default); ``on_pass``: called with the
    virtual time and the result of every pass (what a benchmark measures beyond the world's report)."""
    if not 0 < hours <= 24 * 14:
        raise UsageError(f"--hours must be in (0, 336], got {hours}")
    if not 10 <= interval <= 3600:
        raise UsageError(f"--interval must be between 10 and 3600 seconds, got {interval}")
    seed = region.seed if seed is None else seed
    start = DEFAULT_START if start is None else start
    end = start + hours * 3600
    world, cloud, contract, schedulers = build(region, start, seed)
    clock = FixedClock(start)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="spotctl-sim-") as tmp:
        db = Path(state_dir or tmp) / f"simulate-{region.name}-{seed}.db"
        if db.exists():
            db.unlink()
        # a simulation runs no relay: the region queues what its config says it would deliver, no more
        store = Store.open(db, region.name, outbox_kinds=queued_kinds(region))
        try:
            rt = Runtime(region=region, store=store, cloud=cloud, contract=contract, schedulers=schedulers,
                         clock=clock, actor="spotctl-simulate", concurrent_observe=False,
                         planner=planner)
            passes = 0
            statuses: dict[str, int] = {}
            kinds: dict[str, int] = {}
            failed: dict[str, int] = {}
            next_report = start + 3600
            t = start
            while t < end:
                t = min(end, t + interval)
                world.advance(t)
                clock.t = t
                r = run_pass(rt)
                passes += 1
                if on_pass is not None:
                    on_pass(t, r)
                statuses[r.status] = statuses.get(r.status, 0) + 1
                for o in r.outcomes:
                    kinds[o.kind] = kinds.get(o.kind, 0) + (o.done if o.kind == "launch" else 1)
                    if o.status == "failed":
                        failed[o.kind] = failed.get(o.kind, 0) + 1
                if t >= next_report:
                    progress(f"simulated {int((t - start) / 3600)}/{hours:g} h: {passes} passes")
                    next_report += 3600
            ok, bad, n = store.verify_audit()
            report = world.report()
            report["reconciler"] = {
                "passes": passes, "interval_s": interval, "pass_status": statuses, "actions": kinds,
                "failed_actions": failed, "tokens_used": store.tokens_used_total(),
                "audit": {"records": n, "chain_ok": ok, "first_bad": bad["id"] if bad else None},
                "outbox_rows": store.counts()["outbox"], "outbox_kinds": sorted(queued_kinds(region)),
            }
            report["wall_seconds"] = round(time.perf_counter() - t0, 2)
            if state_dir:
                report["state_db"] = str(db)
            return report
        finally:
            store.close()
