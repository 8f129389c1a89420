"""A launch commits the intents of a few nodes together before their creates (``ops.act.LAUNCH_CHUNK``):
what it leaves when the cloud refuses a node part way, or the token budget runs out, is what a
node-by-node launch leaves — every created instance recorded once, nothing left intended, the chain whole."""

from __future__ import annotations

from spotctl.core.actions import Action, ActionKind
from spotctl.core.budget import Priority
from spotctl.core.errors import CapacityError
from spotctl.core.models import NodeState, OutcomeStatus
from spotctl.ops.act import LAUNCH_CHUNK, execute


class RefusingCloud:
    """The simulator's cloud, refusing every create after the first ``ok`` (no room left)."""

    def __init__(self, cloud, ok: int):
        self._cloud, self.ok, self.asked = cloud, ok, []

    def __getattr__(self, name):
        return getattr(self._cloud, name)

    def create_instance(self, pool, name, action_id):
        self.asked.append(name)
        if len(self.asked) > self.ok:
            raise CapacityError(f"No valid host was found for pool {pool.name} (test)")
        return self._cloud.create_instance(pool, name, action_id)


def _launch(rt, count: int, priority: Priority = Priority.LAUNCH):
    pool = "gp-az1"  # a VM pool of the demo region, with room for many nodes
    action = Action(id="launch-t1", kind=ActionKind.LAUNCH, priority=priority, reason="test", pool=pool,
                    count=count, price=0.1)
    return execute(rt, action, None), pool


def test_a_refusal_part_way_fails_the_refused_node_and_those_not_asked_for(make_rt):
    rt, world = make_rt()
    cloud = rt.cloud = RefusingCloud(world.cloud, ok=4)  # nodes 0 | 1 2 | 3 4 5 6: the 5th is refused
    out, pool = _launch(rt, 10)
    assert out.status is OutcomeStatus.PARTIAL and out.done == 4
    nodes = {n.id: n for n in rt.store.nodes() if n.action_id.startswith("launch-t1.")}
    made = [n for n in nodes.values() if n.state is NodeState.BUILDING]
    failed = sorted((n for n in nodes.values() if n.state is NodeState.FAILED), key=lambda n: n.action_id)
    assert sorted(n.id for n in made) == sorted(cloud.asked[:4]) == sorted(out.nodes)
    assert all(n.instance_id for n in made)
    assert failed[0].id == cloud.asked[4] and "launch refused" in failed[0].reason
    unasked = failed[1:]
    assert len(unasked) <= LAUNCH_CHUNK and all("not created" in n.reason for n in unasked)
    assert not {n.id for n in unasked} & set(cloud.asked)  # never asked for: no instance to leak
    assert not [n for n in nodes.values() if n.state is NodeState.INTENDED]
    audits = rt.store.audit_query(action="node.launch")
    assert sorted(a["target"] for a in audits if a["result"] == "failed") == sorted(n.id for n in failed)
    assert sorted(a["target"] for a in audits if a["result"] == "ok") == sorted(n.id for n in made)
    assert rt.store.verify_audit()[0]
    assert [a["status"] for a in rt.store.actions() if a["id"] == "launch-t1"] == ["partial"]


def test_a_launch_stops_where_the_token_budget_runs_out(make_rt):
    rt, world = make_rt()
    b = rt.region.budget
    rt.store.take_tokens(b.burst - 5, Priority.RECLAIM, b.rate, b.burst, rt.clock.now())
    out, pool = _launch(rt, 12, Priority.RECLAIM)  # the class no token is kept back from
    assert out.status is OutcomeStatus.PARTIAL and "token budget exhausted" in out.detail
    nodes = [n for n in rt.store.nodes() if n.action_id.startswith("launch-t1.")]
    assert out.done == 5 and len(nodes) == out.done  # a node is recorded only with its token
    assert all(n.state is NodeState.BUILDING and n.instance_id for n in nodes)
    assert sorted(world.fleet.by_action) == sorted(n.action_id for n in nodes)
    assert rt.store.verify_audit()[0]


def test_a_launch_run_again_creates_only_what_is_missing(make_rt):
    rt, world = make_rt()
    out, pool = _launch(rt, 7)
    assert out.status is OutcomeStatus.OK and out.done == 7
    again, _ = _launch(rt, 7)  # the same action id (a re-driven action): nothing new
    assert again.done == 7 and sorted(again.nodes) == sorted(out.nodes)
    assert sum(1 for a in world.fleet.by_action if a.startswith("launch-t1.")) == 7


def test_each_node_is_audited_with_its_own_segment_and_host_choice_and_the_action_keeps_them_all(make_rt):
    """A launch of n nodes in n segments (replacement capacity: one per node replaced) records each node
    with its own segment and bound, not the launch's lists: n records of one, not n records of n."""
    rt, world = make_rt()
    now = rt.now()
    segments = [[1, now + 7200 + i, 3600] for i in range(6)]
    bounds = [now + 4000 + i for i in range(6)]
    action = Action(id="launch-t3", kind=ActionKind.LAUNCH, priority=Priority.REPLACEMENT, reason="test",
                    pool="gp-az1", count=6, price=0.1,
                    inputs={"segments": segments, "host_choice": {"not_before": bounds, "rule": "test"}})
    out = execute(rt, action, None)
    assert out.status is OutcomeStatus.OK and out.done == 6
    intended = {a["target"]: a["inputs"] for a in rt.store.audit_query(action="node.launch")
                if a["result"] == "intended"}
    by_index = {int(i["sub_action"].rsplit(".", 1)[1]): i for i in intended.values()}
    assert sorted(by_index) == list(range(6))
    for i, inputs in by_index.items():
        assert inputs["segments"] == [[1, now + 7200 + i, 3600]]
        assert inputs["host_choice"] == {"not_before": [now + 4000 + i], "rule": "test"}
    # the action's own row keeps every segment and bound (what resume and the replay read)
    row = next(a for a in rt.store.actions() if a["id"] == "launch-t3")
    assert row["inputs"]["segments"] == segments and row["inputs"]["host_choice"]["not_before"] == bounds
    assert rt.store.verify_audit()[0]
