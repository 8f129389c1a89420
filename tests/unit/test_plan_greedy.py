"""The price-greedy reference planner (issue 18): within headroom, limits, quota, spend cap and budget; blind to
the calendar and to risk (it places work a reservation will cut, where spotctl's planner does not)."""

from __future__ import annotations

from spotctl.core import plan_greedy
from spotctl.core.budget import Bucket
from spotctl.core.config import Policy
from spotctl.core.models import Quota, Shape
from spotctl.core.planner import plan

from ..factories import NOW, hosts, job, plan_input, pool, reservation


def launches(p, pool_name=None):
    return sum(a.count for a in p.actions if a.kind == "launch" and (pool_name is None or a.pool == pool_name))


def test_greedy_respects_headroom_limits_quota_spend_cap_and_budget():
    units = [job(i, vcpu=8) for i in range(40)]
    hs = hosts("p1", 10)
    assert launches(plan_greedy.plan(plan_input([pool(max_nodes=7)], hs, units))) == 7
    assert launches(plan_greedy.plan(plan_input([pool()], hs, units, quota=Quota(instances=3)))) == 3
    assert launches(plan_greedy.plan(plan_input([pool()], hs, units, quota=Quota(vcpu=20)))) == 2
    assert launches(plan_greedy.plan(plan_input([pool()], hs, units, policy=Policy(spend_cap_per_hour=4.5)))) == 4
    assert launches(plan_greedy.plan(plan_input([pool()], hs, units, budget=Bucket(0.01, 10, 10.0, NOW)))) == 8
    # headroom host by host: 2 hosts of 64 vCPU hold 8 nodes each; nothing fits on full hosts
    assert launches(plan_greedy.plan(plan_input([pool()], hosts("p1", 2), units))) == 16
    assert launches(plan_greedy.plan(plan_input([pool()], hosts("p1", 3, used=Shape(58, 0, 0)), units))) == 0


def test_greedy_goes_to_the_cheapest_pool_and_skips_a_failed_one():
    cheap, dear = pool("cheap"), pool("dear")
    hs = hosts("cheap", 2) + hosts("dear", 2)
    units = [job(i) for i in range(4)]
    prices = {"cheap": 1.0, "dear": 3.0}
    assert launches(plan_greedy.plan(plan_input([cheap, dear], hs, units, prices=prices)), "cheap") == 2
    failed = plan_greedy.plan(plan_input([cheap, dear], hs, units, prices=prices, failures={"cheap": NOW + 600}))
    assert launches(failed, "cheap") == 0 and launches(failed, "dear") == 2


def test_greedy_ignores_the_calendar_where_spotctl_does_not():
    # the cheap pool's only host is reserved in 2 h: a 2 h job cannot finish there (and drain) in time
    cheap, dear = pool("cheap", boot=60), pool("dear", boot=60)
    hs = hosts("cheap", 1) + hosts("dear", 1)
    res = [reservation("cheap", ["cheap-h0"], NOW + 7200, NOW + 9 * 3600)]
    pol = Policy(drain_seconds=120, calendar_advisory_seconds=3600)
    inp = plan_input([cheap, dear], hs, [job(1, seconds=7200)], reservations=res, policy=pol,
                     prices={"cheap": 1.0, "dear": 1.5})
    assert launches(plan(inp), "cheap") == 0 and launches(plan(inp), "dear") == 1
    greedy = plan_greedy.plan(inp)
    assert launches(greedy, "cheap") == 1 and launches(greedy, "dear") == 0
    # the blind input has no calendar nor risk, and the rest as it was
    blind = plan_greedy.blind(inp)
    assert blind.calendars == {} and blind.host_reclaims == {} and blind.advisories == {}
    assert blind.headroom == inp.headroom and blind.quota == inp.quota and blind.policy == inp.policy
