"""The planner at scale (issue 14, item 6): the demand index decides what the plain greedy fill decided,
plans are the same decisions, and the input's digest is the same bytes' hash as ever.

The index (:class:`spotctl.core.plan_state.DemandIndex`) replaces a scan of every class per pool and per
node pattern; these tests pin it to the reference it replaces (:func:`spotctl.core.plan_demand.fill_room`
over the classes a pool serves, in the plan's order) and check a few plans by hand."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as hs

from spotctl.core.config import Policy
from spotctl.core.models import KubernetesBinding, PoolClass, PoolKind, PoolSpec, Scheduler, Shape, WorkUnit
from spotctl.core.plan_demand import fill_room
from spotctl.core.plan_digest import pool_sets
from spotctl.core.plan_input import DemandClass, PlanInput
from spotctl.core.plan_state import DemandIndex
from spotctl.core.planner import plan

from ..factories import NOW, hosts, job, node, plan_input, pool

POOL_SHAPES = {"a": Shape(8, 32768), "b": Shape(16, 65536), "c": Shape(4, 8192), "d": Shape(32, 65536, 2)}


def _classes(draw_shapes, sets, seconds, counts):
    out = []
    for i, (shape, pools, secs, count) in enumerate(zip(draw_shapes, sets, seconds, counts)):
        served = tuple(sorted(p for p in pools if shape.fits_in(POOL_SHAPES[p])))
        out.append(DemandClass(key=f"k{i:03d}", scheduler="slurm" if i % 3 else "replacement", shape=shape,
                               priority=0, expected_seconds=secs, count=count, pools=served))
    return out


demand_st = hs.integers(1, 40).flatmap(lambda n: hs.tuples(
    hs.lists(hs.builds(Shape, hs.integers(0, 9), hs.integers(0, 40000), hs.integers(0, 2)), min_size=n, max_size=n),
    hs.lists(hs.sets(hs.sampled_from(sorted(POOL_SHAPES)), min_size=1), min_size=n, max_size=n),
    hs.lists(hs.integers(0, 8000), min_size=n, max_size=n),
    hs.lists(hs.integers(1, 4), min_size=n, max_size=n)))


@settings(max_examples=150, deadline=None)
@given(demand_st, hs.lists(hs.tuples(hs.sampled_from(sorted(POOL_SHAPES)), hs.integers(0, 16),
                                     hs.integers(0, 70000), hs.integers(0, 3), hs.sampled_from([None, 600, 4000])),
                           min_size=1, max_size=12))
def test_the_index_fills_a_room_as_the_plain_greedy_fill_does(parts, rooms):
    """Room after room (units placed as they are found: rooms shrink, classes empty), the index gives the
    pattern the greedy fill over the pool's classes gives."""
    demand = _classes(*parts)
    remaining = {d.key: d.count for d in demand}
    index = DemandIndex(demand, remaining, dict(POOL_SHAPES))
    for name, v, r, g, window in rooms:
        room = Shape(v, r, g)
        for replacement in (False, True):
            lids = index.of_pool_round.get((replacement, name), [])
            cands = [d for d in demand if name in d.pools and (d.scheduler == "replacement") is replacement]
            want = fill_room(room, cands, remaining, window=window)
            assert index.fill(name, lids, room, remaining, window) == want
            assert index.has_demand(name, replacement) == any(remaining[d.key] > 0 for d in cands)
            for k, c in want.items():
                remaining[k] -= c
                index.placed(k, remaining)


def test_a_shared_pool_set_is_one_tuple_and_one_entry():
    """Classes served by the same pools share one pools tuple: the input costs one entry per class, not
    one per class and pool, and each distinct set is recorded once."""
    units = [job(i, vcpu=1 + i % 4, ram=2048, seconds=600 + i) for i in range(40)]  # 40 distinct classes
    inp = plan_input([pool("p1"), pool("p2"), pool("p3", vcpu=2, ram=4096)],
                     hosts("p1", 2) + hosts("p2", 2) + hosts("p3", 2), units)
    assert len(inp.demand) == 40
    assert len({id(d.pools) for d in inp.demand}) == 2  # fits p3 (1-2 vCPU) or not
    sets, _ = pool_sets(inp.demand)
    assert sorted(sets) == [("p1", "p2"), ("p1", "p2", "p3")]
    rec = inp.to_dict()
    assert sorted(map(tuple, rec["pool_sets"])) == sorted(sets) and all("pools" not in c for c in rec["demand"])


def test_fixed_plans_by_hand():
    """Two 8-vCPU pools (p1 cheaper), one node of ours in p1 with 4 vCPUs used; ten 4-vCPU jobs and one
    that no pool fits: the node takes one job, new p1 nodes two each (max 3 nodes: 2 new), p2 the rest."""
    n = node(1)
    from spotctl.core.models import NodeUsage

    inp = plan_input([pool("p1", max_nodes=3), pool("p2")], hosts("p1", 4, spot=1) + hosts("p2", 4),
                     [job(i) for i in range(10)] + [job(99, vcpu=64)], nodes=[n],
                     usage=[NodeUsage(n.id, Scheduler.SLURM, Shape(4, 8192), 1)], prices={"p1": 1.0, "p2": 2.0})
    p = plan(inp)
    assert [(a.kind, a.pool, a.count, a.units) for a in p.actions] == [("launch", "p1", 2, 4), ("launch", "p2", 3, 5)]
    assert p.demand["covered_by_existing_nodes"] == 1
    assert p.unplaced == {"no pool serves it (scheduler binding or node shape)": 1}
    # the same, with the launch room for one node only: the rest says why, per pool that could take it
    held = plan(plan_input([pool("p1", max_nodes=3), pool("p2")], hosts("p1", 4, spot=1) + hosts("p2", 4),
                           [job(i) for i in range(10)], nodes=[n], usage=[NodeUsage(n.id, Scheduler.SLURM,
                                                                                     Shape(4, 8192), 1)],
                           prices={"p1": 1.0, "p2": 2.0}, policy=Policy(spend_cap_per_hour=None,
                                                                         max_launches_per_pass=1)))
    assert [(a.pool, a.count, a.units) for a in held.actions] == [("p1", 1, 2)]
    assert held.unplaced == {"at most 1 launches per pass": 7}


def test_a_calendar_too_close_names_the_work_longer_than_its_window():
    """A pool whose capacity goes in 2 hours takes the short job; the long one is told why, with its own
    duration (the reason of a pool's calendar is per class)."""
    from ..factories import reservation

    p1 = pool("p1", cleaning=0)
    res = [reservation("p1", ["p1-h0", "p1-h1"], NOW + 2 * 3600, NOW + 10 * 3600)]
    p = plan(plan_input([p1], hosts("p1", 2), [job(1, seconds=600), job(2, seconds=5 * 3600, vcpu=8)],
                        reservations=res, policy=Policy(spend_cap_per_hour=None)))
    assert [(a.kind, a.units) for a in p.actions] == [("launch", 1)]
    (reason,) = p.unplaced
    assert reason.startswith("calendar: p1 takes capacity back at ") and reason.endswith(
        "too soon for 5h00m of work + drain")


def _legacy_digest(inp: PlanInput) -> str:
    """The digest as it was computed before issue 14: SHA-256 of the whole input's JSON."""
    blob = json.dumps(inp._legacy_dict(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def test_the_digest_is_the_hash_it_always_was_and_old_records_replay():
    """Plan ids do not change: the digest is still the SHA-256 of the input's canonical JSON. A record
    written before pool sets were (each class with its own ``pools`` list) replays to the same plan."""
    n = node(1)
    inp = plan_input([pool("p1"), pool("p2", vcpu=4, ram=8192)], hosts("p1", 2, spot=1) + hosts("p2", 2),
                     [job(i, vcpu=1 + i % 6, seconds=600 * (1 + i % 3)) for i in range(30)], nodes=[n])
    assert inp.digest() == _legacy_digest(inp)
    old_record = json.loads(json.dumps(inp._legacy_dict()))  # the format of plans recorded until now
    again = PlanInput.from_dict(old_record)
    assert again.digest() == inp.digest()
    assert plan(again).to_dict(explain=True) == plan(inp).to_dict(explain=True)
    # a float where an integer is expected (as a hand-edited record might hold) is hashed as JSON writes it
    odd = PlanInput.from_dict({**old_record, "demand": [{**old_record["demand"][0], "expected_seconds": 600.0},
                                                        *old_record["demand"][1:]]})
    assert odd.digest() == _legacy_digest(odd) != inp.digest()


def test_the_digest_changes_with_every_decision_input():
    from dataclasses import replace

    inp = plan_input([pool("p1"), pool("p2")], hosts("p1", 2) + hosts("p2", 2), [job(1), job(2, vcpu=2)],
                     nodes=[node(1)])
    base = inp.digest()
    d0 = inp.demand[0]
    changed = [
        replace(inp, demand=(replace(d0, count=d0.count + 1),) + inp.demand[1:]),
        replace(inp, demand=(replace(d0, pools=d0.pools[:1]),) + inp.demand[1:]),
        replace(inp, demand=(replace(d0, shape=Shape(3, 8192)),) + inp.demand[1:]),
        replace(inp, demand=(replace(d0, examples=("slurm/x",)),) + inp.demand[1:]),
        replace(inp, nodes=(replace(inp.nodes[0], used=Shape(1, 1024)),)),
        replace(inp, now=inp.now + 1),
        replace(inp, pools={**inp.pools, "p2": replace(inp.pools["p2"], max_nodes=3)}),
    ]
    digests = [c.digest() for c in changed]
    assert base not in digests and len(set(digests)) == len(digests)
    assert all(c.digest() == _legacy_digest(c) for c in changed)


def test_many_pools_and_distinct_classes_account_for_every_unit():
    """Forty pools of one binding over four shapes, three hundred distinct classes (each its own shape and
    duration), thirty launches allowed (not enough): every unit is placed or counted unplaced with its reason, and each
    class left is explained once."""
    pools = [PoolSpec(name=f"q{i:02d}", kind=PoolKind.VM, pool_class=PoolClass.HEADROOM, az="az1",
                      shape=Shape(*[(4, 8192, 0), (8, 32768, 0), (16, 65536, 0), (32, 131072, 0)][i % 4]),
                      max_nodes=2, kubernetes=KubernetesBinding(labels=(("spot", "yes"),),
                                                                taints=("spot=true:NoSchedule",)))
             for i in range(40)]
    units = [WorkUnit(f"pod-{i:03d}", Scheduler.KUBERNETES, Shape(1 + i % 12, 1024 * (1 + i % 40)), 0, 600 + i,
                      NOW - 60, tolerations=("spot",)) for i in range(300)]
    all_hosts = [h for p in pools for h in hosts(p.name, 1)]
    p = plan(plan_input(pools, all_hosts, units, prices={q.name: 0.01 * (1 + i % 7) for i, q in enumerate(pools)},
                        policy=Policy(spend_cap_per_hour=None, max_launches_per_pass=30)))
    assert sum(a.count for a in p.actions if a.kind == "launch") == 30
    d = p.demand
    assert d["placed_on_new_nodes"] + d["unplaced"] + d["covered_by_existing_nodes"] == d["pending"] == 300
    assert set(p.unplaced) == {"at most 30 launches per pass"}
    assert sum(" unplaced" in e for e in p.explain) == d["pending_after_plan"] > 0


def test_a_large_input_is_named_by_its_recorded_form_and_replays(monkeypatch):
    """Past DIGEST_V1_MAX_POOL_NAMES pool names in all (the JSON of every class's pools grows as classes x
    pools), the digest is version 2: the SHA-256 of the recorded form's canonical JSON, each pool set once.
    The version is recorded, so the replay names the input alike; a record without one is version 1."""
    import spotctl.core.plan_input as pi

    monkeypatch.setattr(pi, "DIGEST_V1_MAX_POOL_NAMES", 5)
    inp = plan_input([pool("p1"), pool("p2", vcpu=4, ram=8192)], hosts("p1", 2) + hosts("p2", 2),
                     [job(i, vcpu=1 + i % 6, seconds=600 * (1 + i % 3)) for i in range(30)], nodes=[node(1)])
    rec = json.loads(json.dumps(inp.to_dict()))
    assert rec["digest_version"] == 2 and inp.resolved_digest_version == 2
    want = hashlib.sha256(json.dumps(inp.to_dict(), sort_keys=True, separators=(",", ":"),
                                     default=str).encode()).hexdigest()
    assert inp.digest() == want != _legacy_digest(inp)
    again = PlanInput.from_dict(rec)
    assert again.digest() == inp.digest()
    assert plan(again).to_dict(explain=True) == plan(inp).to_dict(explain=True)
    old = PlanInput.from_dict({k: v for k, v in json.loads(json.dumps(inp._legacy_dict())).items()})
    assert old.resolved_digest_version == 1 and old.digest() == _legacy_digest(inp)
    bad = {**rec, "digest_version": 3}
    import pytest

    with pytest.raises(ValueError):
        PlanInput.from_dict(bad)
