"""The graduated, time-boxed response to advisories and calendar reclaims (no thrash)."""

from __future__ import annotations

from dataclasses import replace

from spotctl.core.config import Policy
from spotctl.core.models import NodeState, NodeUsage, Notice, NoticeKind, Scheduler, Shape
from spotctl.core.planner import plan

from ..factories import NOW, hosts, node, plan_input, pool

POL = Policy(advisory_prespin_seconds=300, advisory_drain_seconds=900, advisory_timeout_seconds=3600,
             advisory_prespin_lead_seconds=1800, advisory_drain_margin_seconds=600, drain_seconds=120,
             calendar_advisory_seconds=3600)


def busy(n):
    return NodeUsage(node=n.id, scheduler=Scheduler.SLURM, used=Shape(4, 8192), running=1, last_busy_at=NOW)


def world(n, notices=(), now=NOW, host_reclaims=None):
    pools = [pool("risky"), pool("safe")]
    inp = plan_input(pools, hosts("risky", 2, spot=1) + hosts("safe", 2), [], nodes=[n], usage=[busy(n)],
                     notices=list(notices), policy=POL, prices={"risky": 1.0, "safe": 2.0}, now=now)
    if host_reclaims:
        inp = replace(inp, host_reclaims=host_reclaims)
    return plan(inp)


def kinds(p):
    return [(a.kind, a.pool, a.priority.name.lower()) for a in p.actions]


def test_advisory_without_deadline_cordons_prespins_drains_then_gives_up():
    adv = Notice(id="adv1", instance_id="i1", kind=NoticeKind.ADVISORY, issued_at=NOW, deadline=None, reason="surge")
    n = node(1, pool_name="risky")
    # t+0: stop new placements only
    assert kinds(world(n, [adv])) == [("cordon", "risky", "reclaim")]
    advised = replace(n, state=NodeState.ADVISED, cordoned=True)
    # t+5 min: a replacement is pre-spun elsewhere, at replacement priority; no second cordon
    p = world(advised, [adv], now=NOW + 400)
    assert kinds(p) == [("launch", "safe", "replacement")]
    assert "replacement capacity for n1" in p.actions[0].reason
    # t+15 min: drain
    assert ("drain", "risky", "reclaim") in kinds(world(advised, [adv], now=NOW + 1000))
    # t+60 min and still only an advisory: time-boxed, the node takes work again
    assert kinds(world(advised, [adv], now=NOW + 3700)) == [("uncordon", "risky", "operator")]
    # and an expired advisory is not acted on again (no thrash)
    assert kinds(world(n, [adv], now=NOW + 3800)) == []


def test_advisory_cleared_reverts():
    advised = replace(node(1, pool_name="risky"), state=NodeState.ADVISED, cordoned=True)
    assert kinds(world(advised, [])) == [("uncordon", "risky", "operator")]


def test_calendar_reclaim_from_blazar_is_an_early_advisory_and_drains_before_the_hard_notice():
    n = replace(node(1, pool_name="risky"), host="risky-h0")
    # reservation on the node's host in 2 h: no advisory yet; the schedulers are told by when work must end
    p = world(n, host_reclaims={"risky-h0": NOW + 7200})
    assert kinds(p) == [("protect", "risky", "reclaim")]
    assert p.actions[0].inputs["until"] == NOW + 7200 - 120 - 600 and p.actions[0].inputs["closed"] is False
    told = replace(n, protected_until=NOW + 7200 - 720)
    assert kinds(world(told, host_reclaims={"risky-h0": NOW + 7200})) == []  # told already: nothing
    # in 50 min: cordon, announced as a calendar advisory
    p = world(n, host_reclaims={"risky-h0": NOW + 3000})
    assert kinds(p) == [("cordon", "risky", "reclaim")] and "reservation takes host risky-h0" in p.actions[0].reason
    advised = replace(n, state=NodeState.ADVISED, cordoned=True)
    # in 25 min: pre-spin the replacement
    assert kinds(world(advised, host_reclaims={"risky-h0": NOW + 1500})) == [("launch", "safe", "replacement")]
    # in 11 min: drain — the provider's hard notice comes 150-300 s before the start, the node is empty by then
    p = world(advised, host_reclaims={"risky-h0": NOW + 660})
    assert ("drain", "risky", "reclaim") in kinds(p)
    assert p.actions[0].deadline == NOW + 660


def test_replacement_is_not_launched_twice_once_it_is_building():
    adv = Notice(id="adv1", instance_id="i1", kind=NoticeKind.ADVISORY, issued_at=NOW, deadline=None)
    advised = replace(node(1, pool_name="risky"), state=NodeState.ADVISED, cordoned=True)
    spare = replace(node(2, pool_name="safe"), state=NodeState.BUILDING)
    pools = [pool("risky"), pool("safe")]
    inp = plan_input(pools, hosts("risky", 2, spot=1) + hosts("safe", 2, spot=1), [], nodes=[advised, spare],
                     usage=[busy(advised)], notices=[adv], policy=POL, prices={"risky": 1.0, "safe": 2.0},
                     now=NOW + 400)
    assert [a for a in plan(inp).actions if a.kind == "launch"] == []


def test_the_calendar_holds_at_run_time_protect_close_and_lift():
    """Issue 10, item 4: a node whose host a reservation takes gets a run-time window in its schedulers (Slurm:
    a maintenance reservation; Kubernetes: the safe-until annotation), closed (no new work: a taint) once what
    is left is shorter than the work that could land, and lifted when the reservation goes."""
    n = replace(node(1, pool_name="risky"), host="risky-h0")
    # 90 min out: until = start - drain - margin = 78 min away, more than default_pod_seconds (60 min): open
    p = world(n, host_reclaims={"risky-h0": NOW + 5400})
    (a,) = p.actions
    assert (a.kind, a.inputs["until"], a.inputs["closed"]) == ("protect", NOW + 5400 - 720, False)
    opened = replace(n, protected_until=NOW + 5400 - 720)
    # 20 minutes later the window left (58 min) is shorter than an hour of work: closed
    p = world(opened, now=NOW + 1200, host_reclaims={"risky-h0": NOW + 5400})
    (a,) = p.actions
    assert (a.kind, a.inputs["closed"]) == ("protect", True) and "no new work" in a.reason
    closed = replace(opened, protect_closed=True)
    assert world(closed, now=NOW + 1300, host_reclaims={"risky-h0": NOW + 5400}).actions == ()
    # the lease is deleted: the window is lifted
    p = world(closed, now=NOW + 1300)
    (a,) = p.actions
    assert (a.kind, a.inputs["until"], a.inputs["closed"]) == ("protect", None, False)
    assert "lift" in a.reason
    # an unprotected node on a host nobody reserves: nothing
    assert world(n).actions == ()


def test_room_on_a_node_whose_host_is_reserved_serves_only_work_that_ends_in_time():
    """The plan counts free room on our own nodes only for work that fits the node's run-time window: a one-hour
    job is not "served" by an idle node whose host a reservation takes in 66 minutes (Slurm would keep it off
    that node), so the plan launches for it; a ten-minute job fits there and needs no launch."""
    from ..factories import job

    idle = replace(node(1, pool_name="risky"), host="risky-h0")

    def launches(seconds):
        inp = plan_input([pool("risky"), pool("safe")], hosts("risky", 2, spot=1) + hosts("safe", 2),
                         [job(0, seconds=seconds)], nodes=[idle], policy=POL, prices={"risky": 1.0, "safe": 2.0})
        p = plan(replace(inp, host_reclaims={"risky-h0": NOW + 4000}))
        return sum(a.count or 0 for a in p.actions if a.kind == "launch")

    assert launches(600) == 0
    assert launches(3600) == 1


def test_a_reclaim_announced_long_ahead_does_not_hide_a_sooner_advisory():
    """A node's notice is the one to act on soonest: an advisory now (a surge) wins over a reservation
    announced for tomorrow (acted on an hour before it), whichever came first."""
    n = node(1, pool_name="risky")
    tomorrow = Notice(id="cal1", instance_id="i1", kind=NoticeKind.CALENDAR, issued_at=NOW - 600,
                      deadline=NOW + 20 * 3600, reason="reservation r9 takes the host")
    surge = Notice(id="adv2", instance_id="i1", kind=NoticeKind.ADVISORY, issued_at=NOW, deadline=None, reason="surge")
    assert kinds(world(n, [tomorrow])) == []  # too early: the node takes work
    p = world(n, [tomorrow, surge])
    assert kinds(p) == [("cordon", "risky", "reclaim")] and "adv2" in p.actions[0].reason
