"""A reclaim drill end to end on the simulator, with its score and guardrails."""

from __future__ import annotations

import pytest

from spotctl.core.errors import RefusedError, UsageError
from spotctl.ops import drill

from .conftest import advance


def ticker(rt, world, step=15):
    def tick():
        rt.clock.advance(step)
        world.advance(rt.clock.now())
    return tick


def busiest_pool(rt):
    from collections import Counter

    return Counter(n.pool for n in rt.store.nodes(live_only=True) if n.state.value == "active").most_common(1)[0][0]


def started(make_rt, count=1, advisory_lead=0):
    """A demo region running for 15 minutes, and a drill started on its busiest pool."""
    rt, world = make_rt()
    advance(rt, world, 900, step=60)
    pool = busiest_pool(rt)
    d = drill.start(rt, drill.select(rt, pool, count=count, percent=None, notice=150, advisory_lead=advisory_lead))
    return rt, world, pool, d


def test_a_drill_end_to_end_is_scored(make_rt):
    rt, world = make_rt()
    advance(rt, world, 900, step=60)
    pool = busiest_pool(rt)
    sel = drill.select(rt, pool, count=2, percent=None, notice=150, advisory_lead=0)
    assert len(sel["victims"]) == 2
    d = drill.start(rt, sel)
    rep = drill.run(rt, d, tick=ticker(rt, world))
    assert rep["status"] == "done" and rep["checks"] == 10
    assert rep["score"] == 100.0, rep
    for v in rep["victims"]:
        assert v["drained_before_deadline"] and v["capacity_returned_by_deadline"]
        assert v["notice_lead_s"] >= 120 and v["delivery_latency_s"] <= 1.0 and v["jobs_lost"] == 0
        assert 0 < v["left_at_receipt_s"] <= v["notice_lead_s"]
        assert v["final_state"] == "gone"
    assert [a["action"] for a in rt.store.audit_query(action="drill.*")][0] == "drill.start"
    assert rt.store.audit_query(action="drill.finish")[0]["inputs"]["score"] == 100.0
    assert drill.report(rt, d["id"]) == rep
    assert drill.drills(rt)[0]["id"] == d["id"]


def test_guardrails(make_rt):
    rt, world = make_rt()
    advance(rt, world, 900, step=60)
    pool = busiest_pool(rt)
    live = len([n for n in rt.store.nodes(live_only=True) if n.pool == pool])
    with pytest.raises(RefusedError, match="at most 25%"):
        drill.select(rt, pool, count=live, percent=None, notice=150, advisory_lead=0)
    with pytest.raises(UsageError):
        drill.select(rt, pool, count=1, percent=None, notice=60, advisory_lead=0)
    with pytest.raises(UsageError):
        drill.select(rt, pool, count=1, percent=10, notice=150, advisory_lead=0)
    d = drill.start(rt, drill.select(rt, pool, count=1, percent=None, notice=150, advisory_lead=0))
    with pytest.raises(RefusedError, match="one drill at a time"):
        drill.select(rt, pool, count=1, percent=None, notice=150, advisory_lead=0)
    drill.run(rt, d, tick=ticker(rt, world))
    drill.select(rt, pool, count=1, percent=None, notice=150, advisory_lead=0)  # allowed again


def test_a_drill_with_an_advisory_lead_advises_first_on_the_demo_region(make_rt):
    """--advisory-lead reaches the provider: an advisory per victim now, its hard notice later."""
    rt, world, pool, d = started(make_rt, advisory_lead=300)
    rep = drill.run(rt, d, tick=ticker(rt, world))
    (victim,) = d["victims"]
    kinds = {n["kind"]: n for n in rt.store.notices() if n["instance_id"] == victim["instance_id"]}
    adv = kinds["advisory"]
    assert adv["issued_at"] == victim["reclaimed_at"] and adv["deadline"] - adv["issued_at"] == 300 + 150
    (v,) = rep["victims"]
    assert rep["status"] == "done" and v["advisory"] == adv["id"] and v["final_state"] == "gone"
    assert v["drained_before_deadline"] and v["capacity_returned_by_deadline"]
    if "hard" in kinds:  # the hard notice came before the node was gone: its checks count
        assert v["notice"] == kinds["hard"]["id"] and v["unchecked"] == []
    else:  # given back on the advisory alone: the hard notice's checks were not exercised, not "passed"
        assert v["notice"] is None and v["unchecked"] == ["delivery_latency", "notice_lead"]
        assert rep["checks"] == 3 and rep["score"] == 100.0


def test_a_drill_stopped_by_ctrl_c_ends_aborted_with_its_partial_score_and_frees_the_region(make_rt):
    """Issue 11, item 1: whatever stops a drill, it ends `aborted` (audited, scored), never `running` for good,
    and the next drill in the region is not refused."""
    rt, world, pool, d = started(make_rt, count=2)
    ticks = []

    def tick():
        ticks.append(1)
        if len(ticks) == 2:
            raise KeyboardInterrupt
        ticker(rt, world)()

    with pytest.raises(KeyboardInterrupt):
        drill.run(rt, d, tick=tick)
    st = drill.status(rt, d["id"])
    assert st["status"] == "aborted" and st["abort_reason"] == "interrupted"
    fin = rt.store.audit_query(action="drill.finish")
    assert fin and fin[-1]["result"] == "aborted" and fin[-1]["inputs"]["drill"] == d["id"]
    assert drill.report(rt, d["id"])["status"] == "aborted"
    drill.select(rt, pool, count=1, percent=None, notice=150, advisory_lead=0)  # not refused


def test_abort_ends_a_drill_whose_process_died_and_refuses_one_still_running(make_rt):
    import subprocess
    import sys

    rt, world, pool, d = started(make_rt)
    # its owner is this (live) process: refused, the drill goes on
    with pytest.raises(RefusedError, match="still run by process"):
        drill.abort(rt, d["id"])
    # the owner dies (kill -9 leaves the row as it was): the next drill is refused with the way out ...
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    saved = drill.load(rt, d["id"])
    saved["owner"]["pid"] = dead.pid
    drill._save(rt, saved)
    with pytest.raises(RefusedError) as e:
        drill.select(rt, pool, count=1, percent=None, notice=150, advisory_lead=0)
    assert f"exercise-reclaim abort {d['id']}" in (e.value.hint or "")
    # ... which ends it aborted, audited, and frees the region
    rep = drill.abort(rt, d["id"])
    assert rep["status"] == "aborted" and "is gone" in rep["abort_reason"]
    assert [r["result"] for r in rt.store.audit_query(action="drill.abort")] == ["aborted"]
    with pytest.raises(RefusedError, match="not running"):
        drill.abort(rt, d["id"])
    drill.select(rt, pool, count=1, percent=None, notice=150, advisory_lead=0)


def test_right_after_the_first_pass_a_drill_waits_for_the_pools_nodes_to_boot(make_rt):
    """Issue 13, item 1: the demo's VMs boot for 90 s; a drill then waits for them (bounded, a pass at a
    time, none while they are not due), or refuses saying when they will be ready."""
    from spotctl.ops.reconcile import run_pass

    rt, world = make_rt()
    run_pass(rt)
    pool = "gp-rsv-az2"
    boot = rt.region.pool(pool).boot_seconds
    with pytest.raises(RefusedError, match="expected active at") as e:
        drill.select(rt, pool, count=2, percent=None, notice=150, advisory_lead=0)
    ready_at = e.value.details["ready_at"]
    assert 0 < ready_at - rt.now() <= boot and e.value.details["active"] == 0
    with pytest.raises(RefusedError, match="expected active at"):  # too short a wait: refused at once
        drill.select_when_ready(rt, pool, 2, None, 150, 0, wait_ready=10, tick=ticker(rt, world, 5))
    def passes():
        return rt.store.conn.execute("SELECT count(*) FROM passes").fetchone()[0]

    before = passes()
    seen = []
    sel = drill.select_when_ready(rt, pool, 2, None, 150, 0, wait_ready=300, tick=ticker(rt, world, 5),
                                  progress=seen.append)
    assert len(sel["victims"]) == 2 and ready_at <= rt.now() <= ready_at + 5
    assert seen and all(s["ready_at"] == ready_at and s["active"] == 0 for s in seen)
    assert passes() - before <= 3  # one at once, then only when they were due (not one per tick)


def test_a_wave_the_budget_cannot_cover_yet_waits_for_its_tokens(make_rt):
    from spotctl.core.budget import Priority

    rt, world, _, d = started(make_rt, count=1)
    b = rt.region.budget
    rt.store.take_tokens(b.burst, Priority.RECLAIM, b.rate, b.burst, rt.now())  # higher classes used it all
    t0 = rt.now()
    rep = drill.run(rt, d, tick=ticker(rt, world))
    assert rep["status"] == "done" and rep["score"] == 100.0, rep
    (wave,) = rt.store.audit_query(action="drill.reclaim")
    assert wave["at"] > t0  # sent once the bucket had refilled above the drill class's reserve
    assert drill.load(rt, d["id"])["waiting_for"] is None
