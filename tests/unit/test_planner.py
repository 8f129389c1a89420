"""Planner v1: decisions, and properties that must hold for any input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spotctl.core.budget import Bucket
from spotctl.core.config import Policy
from spotctl.core.models import NodeState, NodeUsage, Notice, NoticeKind, Quota, Scheduler, Shape
from spotctl.core.planner import plan

from ..factories import NOW, hosts, job, node, plan_input, pool, reservation


def launches(p, pool_name=None):
    return sum(a.count for a in p.actions if a.kind == "launch" and (pool_name is None or a.pool == pool_name))


def test_packs_units_into_node_shapes_host_by_host():
    # 10 jobs of 4 vCPU: two per 8-vCPU node -> 5 nodes. Hosts fit 8 nodes each by vCPU.
    p = plan(plan_input([pool()], hosts("p1", 2), [job(i) for i in range(10)]))
    assert launches(p) == 5
    a = next(a for a in p.actions if a.kind == "launch")
    assert a.units == 10 and a.pool == "p1"
    assert a.inputs["rate_card_version"] == "rc-1" and a.inputs["calendar_id"].startswith("cal-")
    assert "budget_tokens" in a.inputs and a.reason


def test_headroom_counts_whole_nodes_per_host_not_sums():
    # Each host has 6 vCPU free: no 8-vCPU node fits anywhere, although 3 hosts hold 18 vCPU together.
    hs = hosts("p1", 3, vcpu=64, used=Shape(58, 0, 0))
    p = plan(plan_input([pool()], hs, [job(i) for i in range(4)]))
    assert launches(p) == 0
    assert any("headroom" in r for r in p.unplaced)


def test_cheapest_pool_first_and_fallback_when_a_pool_failed():
    cheap, dear = pool("cheap"), pool("dear")
    hs = hosts("cheap", 2) + hosts("dear", 2)
    units = [job(i) for i in range(4)]
    p = plan(plan_input([cheap, dear], hs, units, prices={"cheap": 1.0, "dear": 3.0}))
    assert launches(p, "cheap") == 2 and launches(p, "dear") == 0
    p2 = plan(plan_input([cheap, dear], hs, units, prices={"cheap": 1.0, "dear": 3.0}, failures={"cheap": NOW + 600}))
    assert launches(p2, "cheap") == 0 and launches(p2, "dear") == 2
    # an expired failure is forgotten
    p3 = plan(plan_input([cheap, dear], hs, units, prices={"cheap": 1.0, "dear": 3.0}, failures={"cheap": NOW - 1}))
    assert launches(p3, "cheap") == 2


def test_calendar_never_places_work_that_cannot_finish_before_reclaim():
    p1 = pool(boot=60)
    hs = hosts("p1", 1)
    # The only host is reserved 2 h from now: a 2 h job must not go there, a 20 min job may.
    res = [reservation("p1", ["p1-h0"], NOW + 7200, NOW + 9 * 3600)]
    pol = Policy(drain_seconds=120, calendar_advisory_seconds=3600)
    long = plan(plan_input([p1], hs, [job(1, seconds=7200)], reservations=res, policy=pol))
    assert launches(long) == 0
    assert any(r.startswith("calendar") for r in long.unplaced)
    short = plan(plan_input([p1], hs, [job(1, seconds=1200)], reservations=res, policy=pol))
    assert launches(short) == 1


def test_no_launch_the_calendar_advisory_would_cordon_before_the_node_boots():
    """Seen on the demo region: with a reservation 30 min out, nodes were launched for 15 min pods and
    cordoned one pass later by the calendar advisory (already due), so their work never landed. The
    rule that cordons ahead of a reservation also decides what may be launched."""
    p1 = pool(boot=60)
    hs = hosts("p1", 1)
    pol = Policy(drain_seconds=120, calendar_advisory_seconds=3600)
    soon = [reservation("p1", ["p1-h0"], NOW + 1800, NOW + 7 * 3600)]
    p = plan(plan_input([p1], hs, [job(1, seconds=600)], reservations=soon, policy=pol))
    assert launches(p) == 0
    assert any("cordoned by the calendar advisory" in r for r in p.unplaced)
    # once the advisory is no longer due at boot time, the same short job is placed
    later = [reservation("p1", ["p1-h0"], NOW + 3600 + 61, NOW + 7 * 3600)]
    assert launches(plan(plan_input([p1], hs, [job(1, seconds=600)], reservations=later, policy=pol))) == 1


def test_respects_pool_limit_quota_spend_cap_and_budget():
    units = [job(i, vcpu=8) for i in range(40)]
    hs = hosts("p1", 10)
    assert launches(plan(plan_input([pool(max_nodes=7)], hs, units))) == 7
    assert launches(plan(plan_input([pool()], hs, units, quota=Quota(instances=3)))) == 3
    assert launches(plan(plan_input([pool()], hs, units, quota=Quota(vcpu=20)))) == 2
    assert launches(plan(plan_input([pool()], hs, units, policy=Policy(spend_cap_per_hour=4.5)))) == 4
    # 10 tokens, launch class keeps 20 % back -> 8
    assert launches(plan(plan_input([pool()], hs, units, budget=Bucket(0.01, 10, 10.0, NOW)))) == 8


def test_existing_free_room_is_used_before_launching():
    n = node(1, state=NodeState.ACTIVE)
    usage = [NodeUsage(node="n1", scheduler=Scheduler.SLURM, used=Shape(0, 0, 0), running=0, last_busy_at=NOW)]
    p = plan(plan_input([pool()], hosts("p1", 2, spot=1), [job(1), job(2)], nodes=[n], usage=usage))
    assert launches(p) == 0
    assert p.demand["covered_by_existing_nodes"] == 2


def test_hard_notice_drains_first_and_advisory_cordons():
    n1, n2 = node(1), node(2)
    notices = [
        Notice(id="hn", instance_id="i1", kind=NoticeKind.HARD, issued_at=NOW - 10, deadline=NOW + 150, reason="reservation"),
        Notice(id="adv", instance_id="i2", kind=NoticeKind.ADVISORY, issued_at=NOW - 10, deadline=None),
    ]
    usage = [NodeUsage(node="n1", scheduler=Scheduler.SLURM, used=Shape(4, 8192), running=1, last_busy_at=NOW)]
    p = plan(plan_input([pool()], hosts("p1", 2, spot=1), [job(i) for i in range(3)], nodes=[n1, n2],
                        usage=usage, notices=notices))
    kinds = [(a.kind, a.node) for a in p.actions]
    assert kinds[0] == ("drain", "n1")
    assert ("cordon", "n2") in kinds
    assert p.actions[0].deadline == NOW + 150
    # neither noticed node counts as room for demand: new nodes are launched
    assert launches(p) >= 1


def _draining(i, *, updated_at=NOW - 20):
    n = node(i, state=NodeState.DRAINING)
    n.updated_at = updated_at
    return n


def test_a_drain_continues_pass_after_pass_until_the_node_is_empty():
    """A drain is a state machine: while work is left on a draining node, each pass runs one more
    round; once it is empty, the capacity is returned."""
    n1 = _draining(1)
    busy = [NodeUsage(node="n1", scheduler=Scheduler.KUBERNETES, used=Shape(2, 4096), running=2, last_busy_at=NOW)]
    notice = Notice(id="hn", instance_id="i1", kind=NoticeKind.HARD, issued_at=NOW - 20, deadline=NOW + 100)
    p = plan(plan_input([pool()], hosts("p1", 1), [], nodes=[n1], usage=busy, notices=[notice]))
    acts = [(a.kind, a.node, a.inputs.get("continue"), a.inputs.get("force")) for a in p.actions]
    assert acts == [("drain", "n1", True, None)]
    assert p.actions[0].deadline == NOW + 100
    gone = NodeUsage(node="n1", scheduler=Scheduler.SLURM, used=Shape(), running=0, last_busy_at=NOW)  # seen empty
    empty = plan(plan_input([pool()], hosts("p1", 1), [], nodes=[n1], usage=[gone], notices=[notice]))
    assert [(a.kind, a.node) for a in empty.actions] == [("delete", "n1")]


def test_near_a_hard_deadline_the_last_round_is_forced_then_the_capacity_returned():
    n1 = _draining(1)
    busy = [NodeUsage(node="n1", scheduler=Scheduler.KUBERNETES, used=Shape(2, 4096), running=1, last_busy_at=NOW)]
    notice = Notice(id="hn", instance_id="i1", kind=NoticeKind.HARD, issued_at=NOW - 100, deadline=NOW + 20)
    p = plan(plan_input([pool()], hosts("p1", 1), [], nodes=[n1], usage=busy, notices=[notice]))
    acts = [(a.kind, a.node, a.inputs.get("force")) for a in p.actions]
    assert acts == [("drain", "n1", True), ("delete", "n1", None)]  # forced round first, in order


def test_idle_nodes_scale_down_within_disruption_budget():
    nodes = [node(i, idle_since=NOW - 3600) for i in range(10)]
    pol = Policy(idle_ttl_seconds=600, disruption_budget_pct=20)
    p = plan(plan_input([pool()], hosts("p1", 4, spot=3), [], nodes=nodes, policy=pol))
    deletes = [a for a in p.actions if a.kind == "delete"]
    assert len(deletes) == 2
    # not yet past the TTL: nothing
    young = [node(i, idle_since=NOW - 60) for i in range(10)]
    assert not [a for a in plan(plan_input([pool()], hosts("p1", 4), [], nodes=young, policy=pol)).actions]


def test_units_no_pool_serves_are_reported():
    p = plan(plan_input([pool()], hosts("p1", 2), [job(1, partition="gpu-only"), job(2, vcpu=128)]))
    assert launches(p) == 0
    assert p.unplaced == {"no pool serves it (scheduler binding or node shape)": 2}


# -- properties ----------------------------------------------------------------

shapes = st.sampled_from([(1, 2048), (2, 4096), (4, 8192), (8, 16384), (16, 65536)])


@st.composite
def scenarios(draw):
    n_pools = draw(st.integers(1, 3))
    pools = [pool(f"p{i}", vcpu=draw(st.sampled_from([8, 16])), ram=65536, max_nodes=draw(st.integers(0, 12)))
             for i in range(n_pools)]
    hs = []
    for p in pools:
        hs += hosts(p.name, draw(st.integers(0, 4)), vcpu=draw(st.sampled_from([16, 32, 64])),
                    used=Shape(draw(st.integers(0, 16)), 0, 0))
    units = []
    for i in range(draw(st.integers(0, 60))):
        v, r = draw(shapes)
        units.append(job(i, vcpu=v, ram=r, seconds=draw(st.sampled_from([600, 3600, 4 * 3600, 12 * 3600]))))
    res = []
    for p in pools:
        ph = [h.name for h in hs if h.pool == p.name]
        if ph and draw(st.booleans()):
            start = NOW + draw(st.integers(0, 20 * 3600))
            res.append(reservation(p.name, ph[: draw(st.integers(1, len(ph)))], start, start + 3600, rid=f"r-{p.name}"))
    prices = {p.name: draw(st.sampled_from([0.5, 1.0, 2.0])) for p in pools}
    cap = draw(st.one_of(st.none(), st.floats(0, 30)))
    tokens = draw(st.integers(1, 40))
    quota = Quota(instances=draw(st.one_of(st.none(), st.integers(0, 20))))
    return dict(pools=pools, hs=hs, units=units, res=res, prices=prices,
                policy=Policy(spend_cap_per_hour=cap, drain_seconds=120), budget=Bucket(0.001, tokens, float(tokens), NOW),
                quota=quota)


def build(s, **over):
    s = {**s, **over}
    return plan_input(s["pools"], s["hs"], s["units"], reservations=s["res"], prices=s["prices"], policy=s["policy"],
                      budget=s["budget"], quota=s["quota"])


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_never_over_headroom_limits_quota_spend_or_budget(s):
    inp = build(s)
    p = plan(inp)
    for name, hr in inp.headroom.items():
        assert launches(p, name) <= hr.free
        assert launches(p, name) <= inp.pools[name].max_nodes
    total = launches(p)
    if s["quota"].instances is not None:
        assert total <= s["quota"].instances
    if s["policy"].spend_cap_per_hour is not None:
        assert sum(a.count * a.price for a in p.actions if a.kind == "launch") <= s["policy"].spend_cap_per_hour + 1e-6
    assert total <= s["budget"].available(__import__("spotctl.core.budget", fromlist=["Priority"]).Priority.LAUNCH, NOW)
    assert sum(a.units for a in p.actions if a.kind == "launch") <= len(s["units"])


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_same_input_same_plan(s, rnd):
    """Any order of any input (pools, hosts, units, reservations) gives the same plan."""
    a = plan(build(s))
    shuffled = {k: list(s[k]) for k in ("pools", "hs", "units", "res")}
    for v in shuffled.values():
        rnd.shuffle(v)
    b = plan(build(s, **shuffled))
    assert a.to_dict(explain=True) == b.to_dict(explain=True)


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.integers(60, 6 * 3600))
def test_moving_a_reservation_earlier_never_increases_placements(s, earlier):
    if not s["res"]:
        return
    r = s["res"][0]
    moved = [r.__class__(id=r.id, pool=r.pool, hosts=r.hosts, start=max(NOW, r.start - earlier), end=r.end)] + s["res"][1:]
    before = launches(plan(build(s)), r.pool)
    after = launches(plan(build(s, res=moved)), r.pool)
    assert after <= before


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_placed_work_finishes_before_the_calendar_takes_the_capacity(s):
    inp = build(s)
    p = plan(inp)
    for a in p.actions:
        if a.kind != "launch":
            continue
        pl = inp.pools[a.pool]
        assert sum(n for n, _, _ in a.inputs["segments"]) == a.count
        # on every node, the longest unit packed there, plus boot and drain, ends before the calendar takes it back
        for _n, safe, longest in a.inputs["segments"]:
            assert longest + inp.policy.drain_seconds + pl.boot_seconds <= safe - NOW
    # ... checked against the reservations themselves, not the planner's own safe_until: the nodes whose
    # work runs past a reservation's start fit on the hosts that reservation leaves to the pool
    for r in s["res"]:
        pl = inp.pools[r.pool]
        past = sum(n for a in p.actions if a.kind == "launch" and a.pool == r.pool
                   for n, _safe, longest in a.inputs["segments"]
                   if NOW + pl.boot_seconds + longest + inp.policy.drain_seconds > r.start - pl.cleaning_seconds)
        left = sum(min((h.capacity.vcpu - h.used_other.vcpu) // pl.shape.vcpu,
                       (h.capacity.ram_mb - h.used_other.ram_mb) // pl.shape.ram_mb)
                   for h in s["hs"] if h.pool == r.pool and h.name not in r.hosts)
        assert past <= max(0, left), (r, past, left)


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_a_recorded_input_reproduces_its_plan(s):
    import json

    from spotctl.core.plan_input import PlanInput

    inp = build(s)
    stored = json.loads(json.dumps(inp.to_dict()))  # what the store keeps
    again = PlanInput.from_dict(stored)
    assert again.digest() == inp.digest()
    assert plan(again).to_dict(explain=True) == plan(inp).to_dict(explain=True)


def test_a_draining_node_is_empty_only_when_its_schedulers_were_read():
    """Helper review of issue 10: a draining node showing nothing running because its scheduler could not be
    read (down, or not configured) is not "drained and empty": no delete until the drain time is up."""
    from dataclasses import replace as _replace

    drain = _replace(node(1), state=NodeState.DRAINING, updated_at=NOW - 10)
    seen = NodeUsage(node=drain.id, scheduler=Scheduler.SLURM, used=Shape(), running=0, last_busy_at=NOW - 10)

    def deletes(usage, unread=frozenset()):
        inp = _replace(plan_input([pool()], hosts("p1", 2, spot=1), [], nodes=[drain], usage=usage),
                       usage_unread=unread)
        return [a.reason for a in plan(inp).actions if a.kind == "delete"]

    assert deletes([seen]) == ["drained and empty: return the capacity"]
    assert deletes([]) == []  # no scheduler said anything of it
    assert deletes([seen], frozenset({"slurm"})) == []  # its scheduler was down this pass
