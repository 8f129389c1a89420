"""The first pass on an existing fleet: every tagged instance the state database does not know is adopted
(its node, two transitions with their events, one audit record), all in one transaction, so that a pass
killed (SIGKILL) in the middle of it loses nothing and duplicates nothing: the next pass adopts what
was not committed, and what was committed is not adopted again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from spotctl.core.models import NodeState
from spotctl.core.ports import FixedClock
from spotctl.ops.reconcile import run_pass
from spotctl.ops.runtime import Runtime
from spotctl.sim.generate import generated_region
from spotctl.state.store import Store

NODES, PENDING = 240, 600
ROOT = Path(__file__).resolve().parents[2]
ADOPTED = ("adopted: tagged instance unknown to the state store", "adopted")  # the two transitions' reasons

#: a pass in a child process on the generated region, SIGKILLed at a chosen point
KILLED_PASS = textwrap.dedent('''
    import os, signal, sys
    from spotctl.core.ports import FixedClock
    from spotctl.ops import reconcile
    from spotctl.ops.runtime import Runtime
    from spotctl.sim.generate import generated_region
    from spotctl.state.store import Store
    db, point = sys.argv[1], sys.argv[2]
    region, world = generated_region(%d, %d)
    store = Store.open(db, region.name)

    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "adopting":  # every adoption row written, the pass's transaction not committed
        real = Store.adopt_nodes
        def adopt(self, *a, **k):
            real(self, *a, **k)
            die()
        Store.adopt_nodes = adopt
    else:  # the node records committed, killed in the planner
        reconcile.planned = die
    rt = Runtime(region=region, store=store, cloud=world.cloud, contract=world.contract,
                 schedulers=list(world.schedulers), clock=FixedClock(world.now), actor="killed",
                 concurrent_observe=False)
    reconcile.run_pass(rt)
''' % (NODES, PENDING))


def _runtime(db: Path):
    region, world = generated_region(NODES, PENDING)
    store = Store.open(db, region.name)
    rt = Runtime(region=region, store=store, cloud=world.cloud, contract=world.contract,
                 schedulers=list(world.schedulers), clock=FixedClock(world.now), actor="tester",
                 concurrent_observe=False)
    return rt, world


def _fleet(world) -> dict[str, str]:
    """Instance name -> action id of every tagged instance the world starts with."""
    return {i.name: i.action_id for i in world.cloud.instances()}


def _check_adopted_once(store: Store, fleet: dict[str, str]) -> None:
    nodes = {n.id: n for n in store.nodes()}
    adopted = {k: v for k, v in nodes.items() if k in fleet}
    assert sorted(adopted) == sorted(fleet), "every tagged instance has exactly one node"
    assert all(adopted[k].action_id == fleet[k] for k in fleet)
    moves = Counter(t["node_id"] for t in store.transitions() if t["reason"] in ADOPTED)
    assert sorted(moves) == sorted(fleet) and set(moves.values()) == {2}, "intended, then adopted: once each"
    data = [json.loads(r["payload"])["data"] for r in store.outbox_rows("event")]
    events = Counter(d["node"] for d in data if d.get("reason") in ADOPTED)
    assert events == moves, "each transition has its event"
    audit = Counter(r["target"] for r in store.audit_records() if r["action"] == "node.adopt")
    assert sorted(audit) == sorted(fleet) and set(audit.values()) == {1}
    queued = {r["key"] for r in store.outbox_rows("audit")}
    assert {r["id"] for r in store.audit_records()} <= queued, "every audit record is queued for the service"
    assert store.verify_audit()[0]


def test_the_first_pass_adopts_the_whole_fleet_with_every_record(tmp_path):
    rt, world = _runtime(tmp_path / "state.db")
    fleet = _fleet(world)
    r = run_pass(rt)
    assert r.synced["adopted"] == len(fleet) > 200
    _check_adopted_once(rt.store, fleet)
    node = rt.store.node(next(iter(sorted(fleet))))
    assert node.state is NodeState.ACTIVE and node.reason == "adopted"
    first = [t for t in rt.store.transitions(node.id)]
    assert [(t["from_state"], t["to_state"], t["reason"]) for t in first] == [
        (None, "intended", "adopted: tagged instance unknown to the state store"), ("intended", "active", "adopted")]
    assert first[0]["at"] == node.created_at and first[1]["at"] == r.started_at
    payload = json.loads(next(e["payload"] for e in rt.store.outbox_rows("event")
                              if json.loads(e["payload"])["subject"] == node.id))
    assert payload["type"] == "io.spotctl.node.intended" and payload["specversion"] == "1.0"
    assert payload["data"] == {"node": node.id, "pool": node.pool, "from": None, "to": "intended",
                               "reason": "adopted: tagged instance unknown to the state store",
                               "instance_id": node.instance_id, "action_id": node.action_id}
    rt.clock.advance(30)
    world.advance(rt.clock.now())
    again = run_pass(rt)
    assert again.synced["adopted"] == 0
    _check_adopted_once(rt.store, fleet)
    rt.store.close()


@pytest.mark.parametrize("point", ["adopting", "planning"])
def test_a_pass_killed_during_or_after_adoption_loses_and_duplicates_nothing(tmp_path, point):
    db = tmp_path / "state.db"
    proc = subprocess.run([sys.executable, "-c", KILLED_PASS, str(db), point], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    rt, world = _runtime(db)
    fleet = _fleet(world)
    known = {n.id for n in rt.store.nodes()}
    assert known == (set() if point == "adopting" else set(fleet)), "all of the transaction or none of it"
    r = run_pass(rt)
    assert r.status in ("ok", "partial"), r.to_dict()
    assert r.synced["adopted"] == (len(fleet) if point == "adopting" else 0)
    _check_adopted_once(rt.store, fleet)
    rt.store.close()
