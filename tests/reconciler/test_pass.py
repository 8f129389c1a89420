"""The reconcile pass against the demo region's simulator: idempotence, crash recovery, fallback, lock."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from spotctl.core.models import NodeState
from spotctl.ops.act import LAUNCH_CHUNK
from spotctl.ops.reconcile import run_pass
from spotctl.state.store import Store

from .conftest import Crash, advance


def node_events(rt):
    return [e for e in rt.store.outbox_rows("event") if '"type":"io.spotctl.node.' in e["payload"]]


def launched(result):
    return sum(o.done for o in result.outcomes if o.kind == "launch")


def tagged_instances(world):
    return Counter(i.action_id for i in world.cloud.instances())


def test_first_pass_launches_and_records_everything(make_rt):
    rt, world = make_rt()
    r = run_pass(rt)
    assert r.status == "ok", r.to_dict()
    assert launched(r) > 0
    nodes = rt.store.nodes(live_only=True)
    assert len(nodes) == launched(r)
    assert {n.state for n in nodes} == {NodeState.BUILDING}
    # every node has its instance, tagged with the node's action id, exactly once
    tags = tagged_instances(world)
    assert all(tags[n.action_id] == 1 for n in nodes)
    # intent, transitions and events are all recorded; the audit chain holds
    counts = rt.store.counts()
    assert counts["transitions"] == 2 * len(nodes)
    assert len(node_events(rt)) == counts["transitions"]
    assert rt.store.verify_audit()[0]
    assert rt.store.plans(1)[0]["summary"]["launches"] == launched(r)


def test_two_passes_on_the_same_input_act_once(make_rt):
    rt, world = make_rt()
    first = run_pass(rt)
    assert launched(first) > 0
    before = rt.store.counts()
    second = run_pass(rt)  # same clock, same world
    assert launched(second) == 0
    assert [o for o in second.outcomes if o.kind == "launch"] == []
    assert len(rt.store.nodes(live_only=True)) == launched(first)
    assert rt.store.counts()["nodes"] == before["nodes"]
    assert sum(tagged_instances(world).values()) == launched(first)


class CrashingCloud:
    """The simulator's cloud, with the process 'killed' around the n-th create."""

    def __init__(self, cloud, when: str, at_call: int = 1):
        self._cloud, self.when, self.at_call, self.calls = cloud, when, at_call, 0
        self.crashed: str | None = None  # the node whose create the crash hit

    def __getattr__(self, name):
        return getattr(self._cloud, name)

    def create_instance(self, pool, name, action_id, choice=None):
        self.calls += 1
        if self.calls == self.at_call:
            self.crashed = name
        if self.calls == self.at_call and self.when == "before_effect":
            raise Crash("killed between intent and effect")
        inst = self._cloud.create_instance(pool, name, action_id, choice)
        if self.calls == self.at_call and self.when == "after_effect":
            raise Crash("killed between effect and its record")
        return inst


def _crash_then_recover(make_rt, when, at_call=2):
    rt, world = make_rt(cloud=None)
    crashing = CrashingCloud(world.cloud, when, at_call=at_call)
    rt.cloud = crashing
    try:
        run_pass(rt)
    except Crash:
        pass
    else:
        raise AssertionError("the injected crash did not happen")
    rt.store.unlock()  # the dead process's lock dies with it
    stuck = [n for n in rt.store.nodes(live_only=True) if n.state is NodeState.INTENDED]
    # the intent was recorded before the effect: the node killed at its create is intended, and so are those of
    # its chunk not asked for yet (ops.act.LAUNCH_CHUNK: a launch commits 1, 2, 4, ... intents at a time)
    assert crashing.crashed in {n.id for n in stuck} and len(stuck) <= LAUNCH_CHUNK
    if when == "after_effect":  # its instance (and those made before it in its chunk) exist, tagged, not recorded yet
        assert sum(1 for n in stuck if tagged_instances(world).get(n.action_id)) >= 1
    rt.cloud = world.cloud
    r = run_pass(rt)
    assert r.status in ("ok", "partial")
    for n in stuck:
        assert rt.store.find_node(n.id).state in (NodeState.BUILDING, NodeState.ACTIVE)
    tags = tagged_instances(world)
    assert all(c == 1 for c in tags.values()), "no duplicate instance for any action"
    live = rt.store.nodes(live_only=True)
    assert sorted(tags) == sorted(n.action_id for n in live)
    assert rt.store.verify_audit()[0]
    return rt, world


@pytest.mark.parametrize("at_call", [1, 2, 3, 4, 6])
def test_crash_between_intent_and_effect_is_completed_by_the_next_pass(make_rt, at_call):
    _crash_then_recover(make_rt, "before_effect", at_call)


@pytest.mark.parametrize("at_call", [1, 2, 3, 5, 7])
def test_crash_after_effect_is_adopted_not_duplicated(make_rt, at_call):
    _crash_then_recover(make_rt, "after_effect", at_call)


def test_a_refused_pool_falls_back_to_the_next_pool_in_the_same_pass(make_rt):
    rt, world = make_rt()
    dry = run_pass(rt, dry_run=True)
    first = next(a for a in dry.plan.actions if a.kind == "launch")
    world.inject_launch_failures(first.pool, rt.clock.now() + 3600)
    r = run_pass(rt)
    failed = [o for o in r.outcomes if o.kind == "launch" and o.status == "failed"]
    assert [o.pool for o in failed] == [first.pool]
    assert launched(r) > 0
    assert all(n.pool != first.pool for n in rt.store.nodes(live_only=True))
    assert first.pool in rt.store.pool_failures(rt.clock.now())
    # the failure is remembered: the next pass does not try that pool again
    r2 = run_pass(rt)
    assert all(o.pool != first.pool for o in r2.outcomes if o.kind == "launch")


def test_an_overlapping_pass_is_skipped(make_rt, tmp_path):
    rt, world = make_rt()
    other = Store.open(tmp_path / "state.db", rt.region.name)
    assert other.try_lock()
    r = run_pass(rt)
    assert r.status == "skipped" and r.plan is None
    assert rt.store.counts()["nodes"] == 0
    other.close()


def test_a_day_of_passes_keeps_every_promise(make_rt):
    rt, world = make_rt()
    results = advance(rt, world, 6 * 3600, step=60)
    assert all(r.status in ("ok", "partial") for r in results)
    report = world.report()
    # nodes came up and served work
    assert report["demand"]["started"] > 0
    # every hard notice on our nodes was handled (drained) before its deadline
    notices = rt.store.notices()
    hard = [n for n in notices if n["kind"] == "hard" and n["node_id"]]
    for n in hard:
        assert n["handled_at"] is not None and n["handled_at"] <= n["deadline"], n
    # the budget was never exceeded: tokens used <= burst + rate * elapsed
    b = rt.region.budget
    assert rt.store.tokens_used_total() <= b.burst + b.rate * 6 * 3600
    # every state change has its event, every notice on our nodes too; the audit chain verifies
    assert len(node_events(rt)) == rt.store.counts()["transitions"]
    announced = {json.loads(e["payload"])["data"]["notice"] for e in rt.store.outbox_rows("event")
                 if '"type":"io.spotctl.notice.' in e["payload"]}
    assert {n["id"] for n in notices if n["node_id"]} == announced
    assert rt.store.verify_audit()[0]


def test_advisories_get_a_graduated_response_without_thrash(make_rt):
    # a seed whose half day has both kinds of advisory on our nodes: surges and calendar reclaims (which nodes
    # land on soon-reserved hosts follows the plans, whose ids name the nodes)
    rt, world = make_rt(seed=3)
    advance(rt, world, 12 * 3600, step=60)
    transitions = rt.store.transitions()
    advised = Counter(t["node_id"] for t in transitions if t["to_state"] == "advised")
    assert advised, "the demo region sends advisories over half a day"
    # no node goes advised -> active -> advised ... in a loop
    assert max(advised.values()) <= 2, advised
    # every node drained because of an advisory was emptied and deleted, never relaunched in place
    drained = {t["node_id"] for t in transitions if t["to_state"] == "draining" and "advisory" in t["reason"]}
    for node_id in drained:
        states = [t["to_state"] for t in transitions if t["node_id"] == node_id]
        rest = states[states.index("draining") + 1:]
        assert "active" not in rest and (rest == [] or rest[0] in ("deleting", "gone", "lost")), states
    assert any("deleting" in [t["to_state"] for t in transitions if t["node_id"] == n] for n in drained)
    # calendar reclaims were announced as lifecycle events before the hard notice could come
    events = [e for e in rt.store.outbox_rows("event") if '"to":"advised"' in e["payload"]]
    assert any("reservation" in e["payload"] or "calendar" in e["payload"] for e in events)


def test_a_drain_killed_after_its_intent_is_driven_again_by_the_next_pass(make_rt):
    """Seen in the crash harness: a drain whose process died between its intent and its effect was
    marked done by the next pass without an audit record, the node left active. Resume must check
    the world and drive the drain again, with its own audit record."""
    from spotctl.core.budget import Priority

    rt, world = make_rt()
    advance(rt, world, 900, step=60)
    node = next(n for n in rt.store.nodes(live_only=True) if n.state is NodeState.ACTIVE)
    rt.store.record_intent(action_id="killed-drain", plan_id=None, kind="drain", priority=Priority.OPERATOR,
                           reason="operator drain (killed)", actor="tester", at=rt.clock.now(), inputs={},
                           pool=node.pool, node=node.id)
    audits_before = len(rt.store.audit_query(action="node.drain"))
    run_pass(rt)
    row = next(a for a in rt.store.actions(limit=None) if a["id"] == "killed-drain")
    assert row["status"] in ("done", "partial") and "completed by a later pass" not in (row["result"] or "")
    assert rt.store.find_node(node.id).state in (NodeState.DRAINING, NodeState.DELETING, NodeState.GONE)
    recs = rt.store.audit_query(action="node.drain")
    mine = [r for r in recs[audits_before:] if r["target"] == node.id]
    assert mine and mine[0]["inputs"]["action_id"] == "killed-drain" and mine[0]["result"] == "ok"
    assert rt.store.actions(status="intended", limit=None) == []


class _NoCallsInTransactions:
    """A port (cloud or scheduler) that records every call made while the store's write transaction
    is open: the network must never be called with the database's write lock held."""

    CALLS = ("hosts", "quota", "reservations", "instances", "find_instance", "create_instance", "delete_instance",
             "released", "pending", "usage", "cordon", "drain", "resume", "forget")

    def __init__(self, inner, store, seen: list):
        self._inner, self._store, self._seen = inner, store, seen

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in self.CALLS or not callable(attr):
            return attr

        def call(*a, **kw):
            if self._store.conn.in_transaction:
                self._seen.append(f"{type(self._inner).__name__}.{name}")
            return attr(*a, **kw)
        return call


def test_no_cloud_or_scheduler_call_inside_a_write_transaction(make_rt):
    rt, world = make_rt()
    seen: list[str] = []
    rt.cloud = _NoCallsInTransactions(world.cloud, rt.store, seen)
    rt.schedulers = [_NoCallsInTransactions(s, rt.store, seen) for s in world.schedulers]
    results = advance(rt, world, 1800, step=60)
    victims = [n.instance_id for n in rt.store.nodes(live_only=True) if n.state is NodeState.ACTIVE][:3]
    world.contract.reclaim(victims, 150)  # hard notices: drains, deletes and releases must happen
    results += advance(rt, world, 3 * 3600, step=60)
    kinds = Counter(t["to_state"] for t in rt.store.transitions())
    assert kinds["gone"] > 0 and kinds["draining"] > 0, kinds  # deletes, drains and releases did happen
    assert all(r.status in ("ok", "partial") for r in results)
    assert seen == [], f"network calls inside a write transaction: {Counter(seen)}"


def test_the_relay_runs_after_the_pass_lock_is_released(make_rt, tmp_path):
    """A slow or unreachable audit service or broker must not hold up the next pass or the watcher: while the
    pass relays its outbox, the region lock is free (another process could take it), and a second relay at the
    same time would find the relay lock taken (and leave the rows to this one)."""
    rt, world = make_rt()
    seen: dict[str, object] = {}

    class Destination:  # stands for the audit service: it only looks at the locks while it is called
        batch_size = 100

        def deliver(self, rows):
            other = Store.open(tmp_path / "state.db", rt.region.name)
            try:
                seen["lock_free"] = other.try_lock()
                if seen["lock_free"]:
                    other.unlock()
                with other.relay_lock() as mine:
                    seen["relay_lock_free"] = mine
            finally:
                other.close()
            return len(rows)

        def close(self):
            pass

    rt.outlets = {"audit": Destination()}
    rt.clock.advance(30)
    world.advance(rt.clock.now())
    result = run_pass(rt)
    assert result.relay["audit"]["delivered"] > 0
    assert seen["lock_free"] is True  # the pass lock was released before the relay
    assert seen["relay_lock_free"] is False  # and the relay held its own


def test_a_pass_that_fails_half_way_is_recorded_and_a_killed_one_is_closed_by_the_next(make_rt):
    """Rule 4: no pass row stays `running` without a live owner. An error that stops the pass (here the cloud
    says the configuration is wrong: exit 3) ends its row as `failed` with the error; a row left `running` by a
    killed process is closed as `abandoned` by the next pass."""
    from spotctl.core.errors import ConfigError

    rt, world = make_rt()

    class Misconfigured:  # the cloud refuses the region's configuration (an unknown flavor, say)
        reads_reservations = True

        def __getattr__(self, name):
            def call(*a, **kw):
                raise ConfigError("flavor 'spot.nope' of pool 'gp-az1' does not exist")
            return call

    def rows():
        return list(rt.store.conn.execute("SELECT seq, status, summary FROM passes ORDER BY seq"))

    killed = rt.store.start_pass("killed-process", rt.now())  # as if its process died mid-pass
    good_cloud = rt.cloud
    rt.cloud = Misconfigured()
    rt.clock.advance(30)
    try:
        run_pass(rt)
    except ConfigError:
        pass
    else:
        raise AssertionError("the misconfigured cloud did not stop the pass")
    by_seq = {r["seq"]: r for r in rows()}
    assert by_seq[killed]["status"] == "abandoned"
    after = [r for r in rows() if r["seq"] > killed]
    assert [r["status"] for r in after] == ["failed"] and "spot.nope" in after[0]["summary"]
    rt.cloud = good_cloud
    rt.clock.advance(30)
    world.advance(rt.clock.now())
    assert run_pass(rt).status in ("ok", "partial")  # the lock was released by the failed pass
    assert not [r for r in rows() if r["status"] == "running"]


def test_a_scheduler_a_pool_is_bound_to_but_that_has_no_adapter_makes_a_drain_partial(make_rt):
    """A drain asked of no scheduler is not "ok": a pool bound to Kubernetes and Slurm in a runtime that has
    only Slurm records a partial drain naming the scheduler that was never asked."""
    from spotctl.core.actions import Action
    from spotctl.core.budget import Priority
    from spotctl.ops.act import execute

    rt, world = make_rt()
    advance(rt, world, 900, step=60)
    node = next(n for n in rt.store.nodes(live_only=True) if n.state is NodeState.ACTIVE)
    pool = rt.region.pools[node.pool]
    assert pool.kubernetes.labels or pool.kubernetes.taints, "the demo pool is not bound to Kubernetes"
    rt.schedulers = [s for s in rt.schedulers if s.name == "slurm"]
    out = execute(rt, Action(id="drain-one", kind="drain", priority=Priority.OPERATOR, reason="operator drain",
                             pool=node.pool, node=node.id), None)
    assert out.status == "partial" and "kubernetes" in out.detail, out.to_dict()
    row = next(a for a in rt.store.actions(limit=None) if a["id"] == "drain-one")
    assert row["status"] == "partial"
    rec = [r for r in rt.store.audit_query(action="node.drain") if r["target"] == node.id][-1]
    assert rec["result"] == "partial" and rec["inputs"]["missing_in"] == ["kubernetes"]


class ChoiceRecordingCloud:
    """The simulator's cloud; remembers the host choice each create was given (by node action id)."""

    def __init__(self, cloud):
        self._cloud, self.choices = cloud, {}

    def __getattr__(self, name):
        return getattr(self._cloud, name)

    def create_instance(self, pool, name, action_id, choice=None):
        self.choices[action_id] = choice
        return self._cloud.create_instance(pool, name, action_id, choice)


def test_every_boot_carries_the_host_choice_its_launch_recorded_also_when_resumed(make_rt):
    """Host-aware placement (issue 18): the launch's recorded ``host_choice`` reaches the cloud for each node, and a
    node left intended by a killed pass is booted by the next one with the same choice, read from the record."""
    from spotctl.core.hostaware import choice_for_node

    rt, world = make_rt()
    crashing = CrashingCloud(world.cloud, "before_effect", at_call=2)
    rt.cloud = crashing
    try:
        run_pass(rt)
    except Crash:
        pass
    rt.store.unlock()
    stuck = [n for n in rt.store.nodes(live_only=True) if n.state is NodeState.INTENDED]  # (its launch chunk)
    assert stuck
    rec = ChoiceRecordingCloud(world.cloud)
    rt.cloud = rec
    run_pass(rt)
    for node in stuck:
        aid, _, idx = node.action_id.rpartition(".")
        (row,) = [a for a in rt.store.actions(limit=None) if a["id"] == aid]
        want = choice_for_node(row["inputs"], int(idx))
        assert want is not None and rec.choices[node.action_id] == want
    for sub, choice in rec.choices.items():  # the new launches of that pass: each node its segment's bound
        a, _, i = sub.rpartition(".")
        (r,) = [x for x in rt.store.actions(limit=None) if x["id"] == a]
        assert choice == choice_for_node(r["inputs"], int(i))
