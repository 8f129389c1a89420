"""The simulation report's figures (spotctl.core.sim_report): each share has its numerator and
denominator, a share of demand never exceeds 100 %, and a share of nothing is None."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spotctl.core import sim_report
from spotctl.core.sim_report import Counters
from spotctl.core.stats import percentile

REASONS = st.dictionaries(st.sampled_from(["held (JobHeldUser)", "waiting on dependency",
                                           "does not tolerate the spot taint"]), st.integers(0, 50), max_size=3)


@st.composite
def counters(draw) -> Counters:
    completed, running, requeued = (draw(st.integers(0, 500)) for _ in range(3))
    pending, abandoned = draw(st.integers(0, 300)), draw(st.integers(0, 300))
    held, withdrawn = draw(REASONS), draw(REASONS)
    started = completed + running + requeued
    excluded = sum(held.values()) + sum(withdrawn.values())
    arrived = started + pending + abandoned + excluded
    released = draw(st.integers(0, pending + started))  # excluded when they arrived, demand later
    return Counters(arrived=arrived, queued_at_start=draw(st.integers(0, arrived)),
                    excluded_at_arrival=excluded + released, started=started, completed=completed,
                    running=running, requeued=requeued, pending=pending, abandoned=abandoned, held=held,
                    withdrawn=withdrawn, waits=draw(st.lists(st.floats(0, 86400), max_size=50)))


@given(counters())
def test_demand_shares_are_of_servable_and_add_up(c):
    d = sim_report.demand(c)
    assert d["arrived"] == d["started"] + d["pending"] + d["abandoned"] + d["excluded"]
    assert d["servable"] == d["arrived"] - d["excluded"]
    both = {k: c.held.get(k, 0) + c.withdrawn.get(k, 0) for k in sorted({*c.held, *c.withdrawn})}
    assert d["excluded_by_reason"] == {k: n for k, n in both.items() if n}
    assert sum(d["excluded_by_reason"].values()) == d["excluded"] == d["still_held"] + d["withdrawn"]
    if d["servable"]:
        served, pending, abandoned = d["served_pct"], d["pending_pct"], d["abandoned_pct"]
        assert served is not None and pending is not None and abandoned is not None
        assert 0.0 <= served <= 100.0
        assert abs(served + pending + abandoned - 100.0) < 0.02
    else:
        assert d["served_pct"] is None


@given(counters())
def test_waits_are_nearest_rank_percentiles(c):
    w = sim_report.waits(c)
    if not c.waits:
        assert w == {"p50": 0.0, "p95": 0.0, "max": 0.0}
    else:
        assert w["p50"] == percentile(c.waits, 0.5) and w["p95"] == percentile(c.waits, 0.95)
        assert w["max"] == max(c.waits)


def test_the_old_over_100_percent_case():
    """15 excluded at arrival, 7 of them released and started: 197 started of 200 servable, not of 193."""
    c = Counters(arrived=208, excluded_at_arrival=15, started=197, completed=164, running=33, pending=3,
                 held={"held (JobHeldUser)": 3}, withdrawn={"does not tolerate the spot taint": 5})
    d = sim_report.demand(c)
    assert (d["excluded"], d["servable"], d["served_pct"], d["excluded_pct"]) == (8, 200, 98.5, 3.85)


def test_a_share_of_nothing_is_none():
    assert sim_report.share(0, 0) is None and sim_report.share(1, 4) == 25.0
    d = sim_report.demand(Counters())
    assert d["served_pct"] is None and d["excluded_pct"] is None


def test_hard_notices_end_one_way_each():
    n = sim_report.notices(Counters(notices={"hard": 10, "advisory": 4, "calendar": 14}, hard_handled=6,
                                    hard_missed=1, hard_open=2))
    assert n["calendar"] == 14 and n["advisory"] == 4
    assert (n["due_in_window"], n["unscored"], n["handled_pct"]) == (8, 1, 75.0)
    assert n["hard"] == n["handled_before_deadline"] + n["missed"] + n["open_at_end"] + n["unscored"]


def test_cost_and_node_hours():
    c = Counters(cost={"b": 1.23456, "a": 2.0}, node_seconds={"a": 3600.0, "b": 1800.0}, currency="EUR")
    assert sim_report.cost(c) == {"total": 3.2346, "currency": "EUR", "by_pool": {"a": 2.0, "b": 1.2346},
                                  "node_hours_total": 1.5}
    assert sim_report.node_hours(c) == {"a": 1.0, "b": 0.5}
