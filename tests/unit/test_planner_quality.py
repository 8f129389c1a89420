"""What the launch decision buys for its price (issue 18): RAM-bound work on RAM-rich nodes, the most work under a
spend cap, nodes whose work ends at about the same time, long calendar windows kept for long work."""

from __future__ import annotations

from spotctl.core.config import Policy
from spotctl.core.models import Reservation
from spotctl.core.plan_input import duration_band
from spotctl.core.planner import plan

from ..factories import NOW, hosts, job, plan_input, pool


def launches(p):
    return sorted((a.pool, a.count, a.units) for a in p.actions if a.kind == "launch")


def test_ram_bound_work_goes_to_the_ram_rich_pool_though_its_vcpu_cost_more():
    # per vCPU "cpu" is the cheaper pool (1.0/32 vs 1.0/16); a 2 vCPU / 60 GiB job fits 1 per cpu node, 4 per mem node
    pools = [pool("cpu", vcpu=32, ram=65536), pool("mem", vcpu=16, ram=262144)]
    inp = plan_input(pools, hosts("cpu", 8, vcpu=128, ram=524288) + hosts("mem", 8, vcpu=128, ram=1048576),
                     [job(i, vcpu=2, ram=61440) for i in range(8)], prices={"cpu": 1.0, "mem": 1.0})
    assert launches(plan(inp)) == [("mem", 2, 8)]


def test_cpu_bound_work_still_goes_to_the_cheap_vcpu_pool():
    pools = [pool("cpu", vcpu=32, ram=65536), pool("mem", vcpu=16, ram=262144)]
    inp = plan_input(pools, hosts("cpu", 8, vcpu=128, ram=524288) + hosts("mem", 8, vcpu=128, ram=1048576),
                     [job(i, vcpu=8, ram=8192) for i in range(8)], prices={"cpu": 1.0, "mem": 1.0})
    assert launches(plan(inp)) == [("cpu", 2, 8)]


def test_under_a_spend_cap_the_plan_buys_the_most_work_for_the_money():
    # 3.0/h buys 3 mem nodes (12 jobs) or 3 cpu nodes (3 jobs): the cap is spent on the pool that packs most
    pools = [pool("cpu", vcpu=32, ram=65536), pool("mem", vcpu=16, ram=262144)]
    inp = plan_input(pools, hosts("cpu", 8, vcpu=128, ram=524288) + hosts("mem", 8, vcpu=128, ram=1048576),
                     [job(i, vcpu=2, ram=61440) for i in range(40)], prices={"cpu": 1.0, "mem": 1.0},
                     policy=Policy(spend_cap_per_hour=3.0))
    p = plan(inp)
    assert launches(p) == [("mem", 3, 12)]
    assert sum(a.price * a.count for a in p.actions if a.kind == "launch") <= 3.0


def test_a_pool_that_packs_worse_as_demand_is_taken_gives_way_to_the_next():
    # "mem" is best for the RAM-bound jobs, "cpu" for the CPU-bound ones: each kind ends up on its own pool
    pools = [pool("cpu", vcpu=32, ram=65536), pool("mem", vcpu=16, ram=262144)]
    units = [job(i, vcpu=2, ram=61440) for i in range(8)] + [job(100 + i, vcpu=16, ram=4096) for i in range(8)]
    inp = plan_input(pools, hosts("cpu", 8, vcpu=128, ram=524288) + hosts("mem", 8, vcpu=128, ram=1048576),
                     units, prices={"cpu": 1.0, "mem": 1.0})
    assert launches(plan(inp)) == [("cpu", 4, 8), ("mem", 2, 8)]


def test_long_work_fills_nodes_of_its_own_and_short_work_does_not_ride_on_them():
    # 8 jobs of 8 h (2 vCPU) and 8 of 10 min (6 vCPU) on 8-vCPU nodes. Largest first would give each node one
    # of each: 8 nodes that all live 8 h (64 node-hours). Longest first: 2 nodes of four 8-hour jobs, and 8 of
    # the short jobs that end after 10 min (about 17 node-hours)
    units = [job(i, vcpu=6, seconds=600) for i in range(8)] + [job(100 + i, vcpu=2, seconds=8 * 3600)
                                                               for i in range(8)]
    inp = plan_input([pool("p1", vcpu=8)], hosts("p1", 8), units)
    [a] = [a for a in plan(inp).actions if a.kind == "launch"]
    longest = sorted(seconds for n, _, seconds in a.inputs["segments"] for _ in range(n))
    assert longest == [600] * 8 + [8 * 3600] * 2


def test_long_calendar_windows_are_kept_for_the_work_that_needs_them():
    # "long" keeps its hosts for a day, "short" loses them in 2 h; "long" is cheaper but has room for 2 nodes
    # only. The 6 h jobs can only run on "long": its room is theirs, and the 30-minute jobs go to "short".
    pools = [pool("long", vcpu=8), pool("short", vcpu=8)]
    all_hosts = hosts("long", 1, vcpu=16, ram=65536) + hosts("short", 4, vcpu=16, ram=65536)
    res = [Reservation(id="r1", pool="short", hosts=tuple(h.name for h in all_hosts if h.pool == "short"),
                       start=NOW + 2 * 3600, end=NOW + 10 * 3600)]
    units = [job(i, vcpu=8, seconds=1800) for i in range(2)] + [job(100 + i, vcpu=8, seconds=6 * 3600)
                                                                for i in range(2)]
    inp = plan_input(pools, all_hosts, units, reservations=res, prices={"long": 0.5, "short": 1.0})
    p = plan(inp)
    assert launches(p) == [("long", 2, 2), ("short", 2, 2)]
    assert p.demand["unplaced"] == 0


def test_duration_bands_double():
    assert [duration_band(s) for s in (0, 899, 900, 1799, 1800, 3600, 7200, 8 * 3600)] == [0, 0, 1, 1, 2, 3, 4, 6]


def test_a_pool_just_reclaimed_is_not_the_first_choice_and_a_failed_pool_is_tried_again_after_its_ttl():
    from dataclasses import replace

    pools = [pool("a", vcpu=8), pool("b", vcpu=8)]
    units = [job(i, vcpu=8) for i in range(3)]
    all_hosts = hosts("a", 4) + hosts("b", 4)
    # "a" is 10 % cheaper, but a node of it was just reclaimed (risk x1.25): "b" goes first
    inp = plan_input(pools, all_hosts, units, prices={"a": 0.9, "b": 1.0})
    assert launches(plan(inp)) == [("a", 3, 3)]
    assert launches(plan(replace(inp, recent_reclaims={"a": 1}))) == [("b", 3, 3)]
    # "a" failed to launch: skipped until its TTL, the work goes to "b" in the same plan; after the TTL, "a" again
    failed = plan_input(pools, all_hosts, units, prices={"a": 0.9, "b": 1.0}, failures={"a": NOW + 600})
    p = plan(failed)
    assert launches(p) == [("b", 3, 3)] and "a: skipped, launch failed recently" in p.explain
    later = plan_input(pools, all_hosts, units, prices={"a": 0.9, "b": 1.0}, failures={"a": NOW + 600},
                       now=NOW + 601)
    assert launches(plan(later)) == [("a", 3, 3)]
