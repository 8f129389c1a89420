"""`spotctl report` over a window with a reclaim drill: the drill's score as `exercise-reclaim report` gives
it, and its hard notices in the notice SLOs and the interruptions."""

from __future__ import annotations

from spotctl.ops import drill
from spotctl.ops.report import report

from .conftest import advance
from .test_drill import busiest_pool, ticker


def test_a_drill_in_the_window_is_reported_with_its_score(make_rt):
    rt, world = make_rt()
    advance(rt, world, 900, step=60)
    pool = busiest_pool(rt)
    d = drill.start(rt, drill.select(rt, pool, count=2, percent=None, notice=150, advisory_lead=0))
    scored = drill.run(rt, d, tick=ticker(rt, world))
    advance(rt, world, 120, step=60)  # a pass after the drill: the window ends at the last one
    r = report(rt.store, rt.region, since="2h", now=rt.now())
    assert r["drills"]["count"] == 1 and r["drills"]["mean_score"] == scored["score"]
    (row,) = r["drills"]["drills"]
    assert (row["id"], row["pool"], row["score"], row["checks"], row["victims"]) == (
        d["id"], pool, scored["score"], scored["checks"], 2)
    slo = r["notices"]["slo"]
    assert slo["hard_notices"] >= 2 and slo["lead_s"]["met"] == slo["lead_s"]["samples"] >= 2
    assert slo["empty_s"]["samples"] >= 2 and slo["empty_s"]["met"] >= 2
    assert r["interruptions"][pool]["after_notice"] >= 2 and r["interruptions"][pool]["band"] is not None
    # a window before the drill has none of it
    early = report(rt.store, rt.region, since="10m", until=str(d["started_at"] - 1), now=rt.now())
    assert early["drills"]["count"] == 0 and early["notices"]["slo"]["hard_notices"] == 0
