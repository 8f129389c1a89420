"""Host-aware placement (issue 18): the pure host-choice and landing-risk rules, and the plan that uses them."""

from __future__ import annotations

from dataclasses import replace

from spotctl.core.config import Policy
from spotctl.core.hostaware import (
    LaunchNodes,
    choice_for_node,
    landed_at_risk,
    launch_choices,
    not_before,
    pick_host,
    reclaims_by_host,
)
from spotctl.core.models import HostCapacity, HostChoice, NodeState, Scheduler, Shape, WorkUnit
from spotctl.core.plan_input import PlanInput
from spotctl.core.planner import plan

from ..factories import NOW, hosts, job, node, plan_input, pool, reservation

POL = Policy(spend_cap_per_hour=None)
MARGIN = POL.drain_seconds + POL.advisory_drain_margin_seconds  # 120 + 600


def test_a_host_is_acceptable_when_no_reservation_takes_it_before_boot_work_and_drain():
    p = pool("p", boot=60)
    nb = not_before(NOW, p, POL, 3600)
    assert nb == NOW + 60 + 3600 + MARGIN
    choice = HostChoice(nb)
    assert choice.acceptable(None) and choice.acceptable(nb) and not choice.acceptable(nb - 1)
    # the same bound as the run-time window: a node on a host reclaimed exactly then has a window of the work
    assert not landed_at_risk(NodeState.BUILDING, 0, nb, NOW + 60, POL, 3600)
    assert landed_at_risk(NodeState.BUILDING, 0, nb - 1, NOW + 60, POL, 3600)


def test_each_node_of_a_launch_gets_the_bound_of_its_segment():
    p = pool("p", boot=60)
    inputs = {"segments": [[2, NOW + 9000, 7200], [3, NOW + 5000, 600]]}
    bounds = launch_choices(inputs, NOW, p, POL)
    # at least default_pod_seconds (an hour) of work: what the landing rule expects any new node may get
    assert bounds == [NOW + 60 + 7200 + MARGIN, NOW + 60 + 3600 + MARGIN]
    inputs["host_choice"] = {"not_before": bounds}
    assert [choice_for_node(inputs, i).not_before for i in range(5)] == [bounds[0]] * 2 + [bounds[1]] * 3
    assert choice_for_node(inputs, 9).not_before == bounds[1]  # past the end: the last segment's
    assert choice_for_node({"segments": inputs["segments"]}, 0) is None  # a plan from before: no choice
    assert choice_for_node({}, 0) is None


def test_each_node_of_a_launch_is_recorded_with_its_own_segment_and_bound_only():
    """A node's audit record carries its share of the launch, not the launch's lists (n nodes x n segments)."""
    segments = [[2, NOW + 9000, 7200], [0, NOW + 8000, 60], [3, NOW + 5000, 600]]
    inputs = {"segments": segments, "host_choice": {"not_before": [NOW + 1, NOW + 2, NOW + 3], "rule": "r"},
              "safe_until": NOW + 5000}
    nodes = LaunchNodes(inputs)
    shares = [nodes.inputs_of(i) for i in range(6)]
    assert [s["segments"] for s in shares] == [[[1, NOW + 9000, 7200]]] * 2 + [[[1, NOW + 5000, 600]]] * 4
    assert [s["host_choice"] for s in shares] == ([{"not_before": [NOW + 1], "rule": "r"}] * 2
                                                  + [{"not_before": [NOW + 3], "rule": "r"}] * 4)
    assert all(s["safe_until"] == NOW + 5000 for s in shares)
    # the node's share gives the node the choice the whole launch gives it; the action's inputs are left whole
    assert [LaunchNodes(s).choice(0) for s in shares] == [choice_for_node(inputs, i) for i in range(6)]
    assert inputs["segments"] == segments and len(inputs["host_choice"]["not_before"]) == 3
    # without segments (a plan from before them), or without a choice per segment: left as they are
    assert LaunchNodes({"x": 1}).inputs_of(3) == {"x": 1}
    only = LaunchNodes({"segments": segments}).inputs_of(0)
    assert only == {"segments": [[1, NOW + 9000, 7200]]} and LaunchNodes(only).choice(0) is None


def test_reclaims_by_host_are_lease_start_minus_cleaning_the_earliest_and_never_past():
    p = pool("p", cleaning=300)
    res = [reservation("p", ["h1"], NOW + 3600, NOW + 7200, "r1"), reservation("p", ["h1", "h2"], NOW + 1800,
                                                                                NOW + 2000, "r2"),
           reservation("p", ["h3"], NOW - 100, NOW + 100, "r3"), reservation("p", ["h4"], NOW - 900, NOW - 1, "r4")]
    assert reclaims_by_host(res, {"p": p}, NOW) == {"h1": NOW + 1500, "h2": NOW + 1500, "h3": NOW}


def test_pick_host_takes_the_soonest_reclaim_that_is_still_acceptable_then_room_then_name():
    p = pool("p", vcpu=8, ram=32768)
    hs = hosts("p", 4, vcpu=16, ram=65536)  # 2 nodes each
    hs[1] = replace(hs[1], spot_nodes=1)  # one node of room left
    reclaims = {"p-h0": NOW + 600, "p-h1": NOW + 20_000, "p-h2": NOW + 30_000}  # p-h3: never reserved
    choice = HostChoice(NOW + 10_000)
    assert pick_host(hs, p, reclaims, choice, NOW) == "p-h1"  # p-h0 too soon; p-h1 the tightest fit in time
    assert pick_host(hs, p, reclaims, choice, NOW, {"p-h1": 1}) == "p-h2"  # p-h1 full with a boot sent there
    assert pick_host(hs, p, reclaims, choice, NOW, {"p-h1": 1, "p-h2": 2}) == "p-h3"
    assert pick_host(hs, p, reclaims, choice, NOW, {"p-h1": 1, "p-h2": 2, "p-h3": 2}) is None
    # a host whose reservation has started is not a host of the pool now, whatever the bound
    assert pick_host(hs, p, {"p-h3": NOW}, HostChoice(NOW - 1), NOW, {"p-h0": 2, "p-h1": 1, "p-h2": 2}) is None
    # another pool's hosts are not candidates; Placement's own reserved_from counts when Blazar says nothing
    other = [HostCapacity("q-h0", "q", Shape(16, 65536), Shape())]
    assert pick_host(other, p, {}, choice, NOW) is None
    assert pick_host([replace(hs[3], reserved_from=NOW + 600)], p, {}, choice, NOW) is None


def test_only_a_new_node_with_nothing_running_on_a_soon_reserved_host_is_a_landing_risk():
    soon = NOW + 1800  # window: 1800 - 720 = 1080 s, shorter than an hour of work
    assert landed_at_risk(NodeState.BUILDING, 0, soon, NOW, POL, 3600)
    assert landed_at_risk(NodeState.ACTIVE, 0, soon, NOW, POL, 3600)
    assert not landed_at_risk(NodeState.ACTIVE, 2, soon, NOW, POL, 3600)  # working: the run-time window holds it
    assert not landed_at_risk(NodeState.DRAINING, 0, soon, NOW, POL, 3600)
    assert not landed_at_risk(NodeState.BUILDING, 0, None, NOW, POL, 3600)
    assert not landed_at_risk(NodeState.BUILDING, 0, soon, NOW, POL, 600)  # short work fits the window


def _reserved_world(units, nodes=(), now=NOW):
    """Pool p on two hosts: a reservation takes p-h0 in 90 minutes; p-h1 stays free."""
    p = pool("p", vcpu=8, ram=32768, boot=60)
    inp = plan_input([p], hosts("p", 2, vcpu=16, ram=65536), units, nodes=nodes, policy=POL, now=now,
                     reservations=[reservation("p", ["p-h0"], NOW + 5400, NOW + 9000)])
    return replace(inp, host_reclaims={"p-h0": NOW + 5400})


def test_a_launch_records_the_earliest_reclaim_its_nodes_can_live_with_and_says_so():
    inp = _reserved_world([job(i, vcpu=8, ram=32768, seconds=3 * 3600) for i in range(2)])
    p = plan(inp)
    launches = [a for a in p.actions if a.kind == "launch"]
    assert launches, p.explain
    for a in launches:
        hc = a.inputs["host_choice"]
        assert hc["not_before"] == launch_choices(a.inputs, NOW, inp.pools["p"], POL)
        assert len(hc["not_before"]) == len(a.inputs["segments"])
    bounds = sorted(b for a in launches for b in a.inputs["host_choice"]["not_before"])
    assert bounds[-1] == NOW + 60 + 3 * 3600 + MARGIN  # the 3-hour jobs: p-h0 (reclaimed at +90 min) is out
    assert not HostChoice(bounds[-1]).acceptable(NOW + 5400)
    assert any("may land only on hosts no reservation takes before" in line for line in p.explain), p.explain
    # recorded and replayable: the recorded input gives the same choice
    again = plan(PlanInput.from_dict(inp.to_dict()))
    assert [a.inputs for a in again.actions] == [a.inputs for a in p.actions]


def test_no_reservation_within_reach_no_explanation_but_the_bound_is_recorded():
    p1 = pool("p", boot=60)
    inp = plan_input([p1], hosts("p", 2), [job(0)], policy=POL)
    (a,) = [a for a in plan(inp).actions if a.kind == "launch"]
    assert a.inputs["host_choice"]["not_before"] == [NOW + 60 + 3600 + MARGIN]
    assert not any("may land only" in line for line in plan(inp).explain)


def test_a_node_that_landed_on_a_soon_reserved_host_is_closed_early_and_explained():
    """The cloud put a new node on p-h0, which a reservation takes in 67 minutes: the plan protects it (closed: no
    new work for Kubernetes, Slurm keeps jobs that would cross the window off) and says why, at once."""
    n = replace(node(1, pool_name="p", state=NodeState.BUILDING), host="p-h0")
    # 4000 s out: later than the calendar advisory (an hour ahead), but the window (4000 - 720 s) is short
    inp = replace(_reserved_world([], nodes=[n]), host_reclaims={"p-h0": NOW + 4000})
    p = plan(inp)
    (a,) = [a for a in p.actions if a.kind == "protect"]
    assert a.inputs["landing_risk"] is True and a.inputs["closed"] is True
    assert a.reason.startswith("calendar risk: the node landed on a soon-reserved host")
    assert any("landed on host p-h0" in line and "re-planned" in line for line in p.explain), p.explain
    # on the safe host it is no risk
    safe = plan(replace(inp, nodes=(replace(inp.nodes[0], host="p-h1"),)))
    assert not [a for a in safe.actions if a.kind == "protect"]
    assert not any("landed on host" in line for line in safe.explain)


def _pod(i, seconds=600):
    return WorkUnit(id=f"pod/{i}", scheduler=Scheduler.KUBERNETES, shape=Shape(8, 32768), expected_seconds=seconds,
                    submitted_at=NOW - 60, node_selector=(("spot", "yes"),), tolerations=("spot",))


def test_the_work_meant_for_a_kubernetes_node_at_risk_is_replanned_onto_a_new_node():
    """A Kubernetes-only pool: a node tainted for a closed window takes no pod at all, so the plan does not count
    its room: the pending pod gets a new node (on a safe host), where without the risk it would not."""
    p = replace(pool("p", vcpu=8, ram=32768, boot=60, partition=None))
    n = replace(node(1, pool_name="p", state=NodeState.BUILDING), host="p-h0")
    inp = plan_input([p], hosts("p", 2, vcpu=16, ram=65536), [_pod(0)], nodes=[n], policy=POL,
                     reservations=[reservation("p", ["p-h0"], NOW + 4000, NOW + 9000)])

    def launched(reclaims):
        return sum(a.count or 0 for a in plan(replace(inp, host_reclaims=reclaims)).actions if a.kind == "launch")

    assert launched({}) == 0  # the building node on a free host takes the pod
    assert launched({"p-h0": NOW + 4000}) == 1  # at risk: re-planned
    (a,) = [a for a in plan(replace(inp, host_reclaims={"p-h0": NOW + 4000})).actions if a.kind == "launch"]
    assert not HostChoice(a.inputs["host_choice"]["not_before"][0]).acceptable(NOW + 4000)  # not p-h0 again
