"""The planner's sub-planners, one by one, over one plan state (what each promises the next)."""

from __future__ import annotations

from dataclasses import replace

from spotctl.core.budget import Bucket, Priority
from spotctl.core.config import Policy
from spotctl.core.hostaware import choose_hosts
from spotctl.core.models import NodeState, NodeUsage, Notice, NoticeKind, Quota, Scheduler, Shape
from spotctl.core.plan_demand import Launches, fill_existing, fill_room, pack_new, pool_score
from spotctl.core.plan_housekeeping import housekeeping, protect_windows
from spotctl.core.plan_input import REPLACEMENT
from spotctl.core.plan_state import PlanState
from spotctl.core.planner import plan, scale_down, summary

from ..factories import NOW, hosts, job, node, plan_input, pool


def usage(n, running=1, vcpu=4):
    return NodeUsage(node=n.id, scheduler=Scheduler.SLURM, used=Shape(vcpu * running, 8192 * running) if running
                     else Shape(), running=running, last_busy_at=NOW)


def hard(n, deadline=NOW + 150):
    return Notice(id=f"hn-{n.id}", instance_id=n.instance_id, kind=NoticeKind.HARD, issued_at=NOW - 10,
                  deadline=deadline, reason="reservation")


def state(*args, **kw):
    return PlanState.start(plan_input(*args, **kw))


def kinds(st):
    return [(a.kind, a.node or a.pool) for a in st.actions]


# -- housekeeping ----------------------------------------------------------------


def test_a_hard_notice_yields_a_drain_before_any_launch_and_its_work_a_replacement():
    n = node(1)
    st = state([pool("p1"), pool("p2")], hosts("p1", 2) + hosts("p2", 2), [job(i) for i in range(3)], nodes=[n],
               usage=[usage(n)], notices=[hard(n)])
    housekeeping(st)
    assert kinds(st) == [("drain", "n1")] and st.actions[0].deadline == NOW + 150
    assert st.leaving == {"n1"} and [v.id for v in st.to_replace] == ["n1"]
    rep = [d for d in st.demand if d.scheduler == REPLACEMENT]
    assert [(d.key, d.pools, d.count) for d in rep] == [("replace-n1", ("p2",), 1)]  # elsewhere, same kind
    assert st.remaining["replace-n1"] == 1
    # through the whole planner: the drain comes first, the replacement launch before the ordinary one
    p = plan(st.inp)
    assert [(a.kind, a.priority) for a in p.actions][0] == ("drain", Priority.RECLAIM)
    launches = [a for a in p.actions if a.kind == "launch"]
    assert launches and launches[0].priority is Priority.REPLACEMENT
    assert all(p.actions.index(a) > 0 for a in launches)


def test_past_the_deadline_a_noticed_node_is_deleted_within_the_token_budget():
    n = node(1)
    st = state([pool()], hosts("p1", 1), [], nodes=[n], notices=[hard(n, deadline=NOW - 5)])
    housekeeping(st)
    assert kinds(st) == [("delete", "n1")] and st.actions[0].priority is Priority.RECLAIM
    broke = state([pool()], hosts("p1", 1), [], nodes=[n], notices=[hard(n, deadline=NOW - 5)],
                  budget=Bucket(0.001, 10, 0.0, NOW))
    housekeeping(broke)
    assert broke.actions == [] and broke.leaving == {"n1"}  # no token: next pass, and no work planned onto it


def test_an_overdue_drain_is_ended_and_a_failed_build_deleted():
    draining = replace(node(1, state=NodeState.DRAINING), updated_at=NOW - 500)  # drain_seconds 120: overdue
    failed = node(2, state=NodeState.FAILED)
    st = state([pool()], hosts("p1", 1), [], nodes=[draining, failed], usage=[usage(draining, running=1)])
    housekeeping(st)
    assert [(a.kind, a.node, a.reason) for a in st.actions] == [
        ("delete", "n1", "drain time is up: return the capacity"),
        ("delete", "n2", "instance failed to build")]
    assert all(a.priority is Priority.CONSOLIDATION for a in st.actions) and st.leaving == {"n1", "n2"}


def test_a_drain_under_way_runs_its_next_round_while_work_is_left():
    draining = replace(node(1, state=NodeState.DRAINING), updated_at=NOW - 20)
    st = state([pool()], hosts("p1", 1), [], nodes=[draining], usage=[usage(draining, running=2)],
               notices=[hard(draining, deadline=NOW + 100)])
    housekeeping(st)
    (a,) = st.actions
    assert (a.kind, a.inputs["continue"], a.priority, a.deadline) == ("drain", True, Priority.RECLAIM, NOW + 100)


def test_the_calendar_at_run_time_tells_a_node_by_when_its_work_must_end():
    n = replace(node(1), host="p1-h0")
    st = state([pool()], hosts("p1", 1), [], nodes=[n])
    st.inp = replace(st.inp, host_reclaims={"p1-h0": NOW + 7200})
    protect_windows(st)
    (a,) = st.actions
    assert (a.kind, a.inputs["until"], a.inputs["closed"]) == ("protect", NOW + 7200 - 720, False)
    told = PlanState.start(replace(st.inp, nodes=(replace(st.inp.nodes[0], protected_until=NOW + 7200 - 720),)))
    protect_windows(told)
    assert told.actions == []  # told already: nothing
    st.leaving.add("n1")
    st.actions.clear()
    protect_windows(st)
    assert st.actions == []  # a node on its way out is not told


# -- demand ------------------------------------------------------------------------


def test_demand_fills_existing_nodes_before_new_ones_are_packed():
    n = node(1)
    st = state([pool()], hosts("p1", 2, spot=1), [job(i) for i in range(4)], nodes=[n], usage=[usage(n, 0)])
    fill_existing(st)
    assert st.covered == 2 and st.used_nodes == {"n1"}  # an 8-vCPU node takes two 4-vCPU jobs
    assert sum(st.remaining.values()) == 2 and st.actions == []
    pack_new(st)
    (a,) = st.actions
    assert (a.kind, a.count, a.units) == ("launch", 1, 2)  # only what is left is packed into a new node
    assert sum(st.remaining.values()) == 0 and st.unplaced == {}


def test_a_cordoned_or_leaving_node_takes_no_new_work():
    n1, n2 = replace(node(1), cordoned=True), node(2)
    st = state([pool()], hosts("p1", 2), [job(i) for i in range(2)], nodes=[n1, n2],
               usage=[usage(n1, 0), usage(n2, 0)])
    st.leaving.add("n2")
    fill_existing(st)
    assert st.covered == 0 and st.used_nodes == set()


def test_packing_takes_the_cheapest_pool_and_counts_what_no_node_takes_by_reason():
    st = state([pool("cheap", max_nodes=1), pool("dear")], hosts("cheap", 1) + hosts("dear", 1),
               [job(i) for i in range(6)] + [job(99, vcpu=128)], prices={"cheap": 1.0, "dear": 3.0},
               quota=Quota(instances=2))
    pack_new(st)
    assert [(a.pool, a.count) for a in st.actions] == [("cheap", 1), ("dear", 1)]
    assert st.unplaced == {"spot project quota (instances) exhausted": 2,
                           "no pool serves it (scheduler binding or node shape)": 1}
    assert any("unplaced" in e for e in st.explain)


def test_without_a_rate_card_nothing_is_launched():
    st = state([pool()], hosts("p1", 2), [job(1)])
    st.inp = replace(st.inp, rate_card=None)
    st.prices = {}
    pack_new(st)
    assert st.actions == [] and st.unplaced == {"rate card unavailable: no launches without prices": 1}


def test_launch_room_says_why_one_more_node_is_held():
    st = state([pool()], hosts("p1", 2), [], policy=Policy(spend_cap_per_hour=5.0, max_launches_per_pass=3))
    p = st.inp.pools["p1"]
    room = Launches(spend=4.5, room=3, quota_inst=None, quota_vcpu=16, quota_ram=None, existing={}, classes={})
    assert room.held(st, "p1", p, 1.0, 0, 5, 5) == "spend cap 5.0/h reached"
    assert room.held(st, "p1", p, 0.5, 5, 5, 9) == "no headroom left in p1"
    assert room.held(st, "p1", p, 0.5, 0, 5, 5) is None
    assert room.bound(9, p, 0.25, 5.0) == 2  # vCPU quota 16 / 8 per node
    room.take(2, p, 0.25)
    assert (room.room, room.quota_vcpu, room.spend) == (1, 0, 5.0)
    assert room.held(st, "p1", p, 0.0, 0, 5, 5) == "spot project quota (vCPU) exhausted"


def test_fill_room_packs_largest_first_and_leaves_out_work_longer_than_the_window():
    from spotctl.core.plan_input import DemandClass

    big = DemandClass(key="big", scheduler="slurm", shape=Shape(4, 8192), priority=0, expected_seconds=600,
                      count=5, pools=("p1",))
    long = DemandClass(key="long", scheduler="slurm", shape=Shape(2, 4096), priority=0, expected_seconds=7200,
                       count=5, pools=("p1",))
    remaining = {"big": 1, "long": 5}
    assert fill_room(Shape(8, 32768), [big, long], remaining, window=None) == {"big": 1, "long": 2}
    assert fill_room(Shape(8, 32768), [big, long], remaining, window=3600) == {"big": 1}
    assert pool_score(pool(vcpu=8), 1.0, 1, 1) == 1.0 / 8 * 1.5


# -- scale down and summary ---------------------------------------------------------


def test_an_idle_node_past_idle_ttl_is_scaled_down_unless_work_was_planned_onto_it():
    pol = Policy(idle_ttl_seconds=600, disruption_budget_pct=50, spend_cap_per_hour=None)
    idle, young = node(1, idle_since=NOW - 3600), node(2, idle_since=NOW - 60)
    st = state([pool()], hosts("p1", 2, spot=2), [], nodes=[idle, young], policy=pol)
    scale_down(st)
    assert [(a.kind, a.node, a.priority) for a in st.actions] == [("delete", "n1", Priority.CONSOLIDATION)]
    assert "idle for 3600s" in st.actions[0].reason
    busy = state([pool()], hosts("p1", 2, spot=2), [], nodes=[idle, young], policy=pol)
    busy.used_nodes.add("n1")
    scale_down(busy)
    assert busy.actions == []


def test_scale_down_stays_within_the_disruption_budget():
    pol = Policy(idle_ttl_seconds=600, disruption_budget_pct=20, spend_cap_per_hour=None)
    st = state([pool()], hosts("p1", 4, spot=3), [], nodes=[node(i, idle_since=NOW - 3600) for i in range(10)],
               policy=pol)
    scale_down(st)
    assert len(st.actions) == 2 and any("held by the disruption budget" in e for e in st.explain)


def test_the_summary_orders_actions_by_priority_class_and_renumbers_them():
    st = state([pool()], hosts("p1", 2), [job(1)])
    st.add("delete", Priority.CONSOLIDATION, "idle", node="n9")
    st.add("drain", Priority.RECLAIM, "notice", node="n8")
    st.covered = 3
    p = summary(st)
    assert [(a.kind, a.id) for a in p.actions] == [("drain", f"{st.plan_id}-000"), ("delete", f"{st.plan_id}-001")]
    assert p.demand["covered_by_existing_nodes"] == 3 and p.demand["pending"] == 1
    assert p.inputs["plan_input_digest"] == st.inp.digest() and p.id == st.plan_id
    assert [s["name"] for s in p.pools] == ["p1"]


def test_the_steps_in_order_are_the_plan():
    n = node(1)
    inp = plan_input([pool("p1"), pool("p2")], hosts("p1", 2) + hosts("p2", 2), [job(i) for i in range(5)],
                     nodes=[n, node(2, idle_since=NOW - 9000)], usage=[usage(n)], notices=[hard(n)])
    st = PlanState.start(inp)
    for step in (housekeeping, protect_windows, fill_existing, pack_new, choose_hosts, scale_down):
        step(st)
    assert summary(st).to_dict(explain=True) == plan(inp).to_dict(explain=True)
