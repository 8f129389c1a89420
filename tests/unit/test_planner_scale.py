"""The planner at scale (issue 14, item 6): the demand index decides what the plain greedy fill decided,
plans are the same decisions, and the input's digest names every decision input (recorded plans keep
their names).

The index (:class:`spotctl.core.plan_state.DemandIndex`) replaces a scan of every class per pool and per
node pattern; these tests pin it to the reference it replaces (:func:`spotctl.core.plan_demand.fill_room`
over the classes a pool serves, in the plan's order) and check a few plans by hand."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from hypothesis import given, settings
from hypothesis import strategies as hs

from spotctl.core.config import Policy
from spotctl.core.models import KubernetesBinding, PoolClass, PoolKind, PoolSpec, Scheduler, Shape, WorkUnit
from spotctl.core.plan_demand import EXPLAIN_UNPLACED, fill_room
from spotctl.core.plan_digest import pool_sets
from spotctl.core.plan_input import DemandClass, PlanInput
from spotctl.core.plan_classes import ClassList
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


def _many_classes(rng: random.Random, n: int, ordered: bool) -> list[DemandClass]:
    """``n`` classes of few vCPU values (ties in the block minima), spread RAM, some GPUs, some empty shapes;
    in the plan's order (largest first) or not."""
    shapes = [Shape(rng.randrange(0, 5), rng.choice([0, rng.randrange(1, 40000)]), rng.choice([0, 0, 0, 1]))
              for _ in range(n)]
    if ordered:
        shapes.sort(key=lambda s: (-s.gpus, -s.vcpu, -s.ram_mb))
    return [DemandClass(key=f"k{i:05d}", scheduler="slurm", shape=sh, priority=0,
                        expected_seconds=rng.randrange(0, 8000), count=rng.randrange(0, 3),
                        pools=tuple(p for p in ("a", "b") if sh.fits_in(POOL_SHAPES[p])))
            for i, sh in enumerate(shapes)]


@settings(max_examples=40, deadline=None)
@given(hs.integers(0, 2**32), hs.sampled_from([1, 15, 16, 17, 255, 256, 257, 600, 4095, 4097, 4400]), hs.booleans())
def test_first_fit_is_the_first_class_that_fits_whatever_the_blocks(seed, n, ordered):
    """Over lists of one block to more than one of each level, from any position (inside a block too),
    with classes killed one by one (ties in the minima included), ``ClassList.first_fit`` finds the first
    class with units left and a non-empty shape that fits, as a scan of every class does."""
    rng = random.Random(seed)
    classes = _many_classes(rng, n, ordered)
    remaining = {d.key: d.count for d in classes}
    cl = ClassList(classes, list(range(n)), remaining)
    alive = [remaining[d.key] > 0 and d.shape != Shape() for d in classes]
    killed = set()
    for _ in range(60):
        v, r, g, w = rng.randrange(0, 6), rng.randrange(0, 45000), rng.randrange(0, 2), rng.choice([float("inf"), 4000, 100])
        i = rng.choice([0, rng.randrange(0, n + 1)])
        want = next((k for k in range(i, n) if alive[k] and classes[k].shape.fits_in(Shape(v, r, g))
                     and classes[k].expected_seconds <= w), n)
        assert cl.first_fit(i, v, r, g, w) == want
        j = want if want < n and rng.random() < 0.7 else rng.randrange(n) if rng.random() < 0.3 else None
        if j is not None:
            cl.kill(j)
            alive[j] = False
            killed.add(j)
    assert cl.live == sum(remaining[d.key] > 0 and k not in killed for k, d in enumerate(classes))


@settings(max_examples=20, deadline=None)
@given(hs.integers(0, 2**32), hs.sampled_from([300, 700, 4500]))
def test_the_index_fills_rooms_over_long_lists_as_the_plain_greedy_fill_does(seed, n):
    """As above, over lists of many blocks (the distinct demand of a large region: a class per unit)."""
    rng = random.Random(seed)
    demand = _many_classes(rng, n, ordered=True)
    remaining = {d.key: d.count for d in demand}
    index = DemandIndex(demand, remaining, dict(POOL_SHAPES))
    for _ in range(25):
        name = rng.choice("ab")
        room = Shape(rng.randrange(0, 17), rng.randrange(0, 70000), rng.randrange(0, 3))
        window = rng.choice([None, 600, 4000])
        lids = index.of_pool_round.get((False, name), [])
        want = fill_room(room, [d for d in demand if name in d.pools], remaining, window=window)
        assert index.fill(name, lids, room, remaining, window) == want
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


def test_an_old_record_is_named_as_it_was_and_replays():
    """Plan ids of recorded plans do not change: a record written before digest versions were (each class
    with its own ``pools`` list) is version 1, named by the SHA-256 of its canonical JSON as then, and
    replays to the plan it named."""
    from dataclasses import replace

    n = node(1)
    inp = plan_input([pool("p1"), pool("p2", vcpu=4, ram=8192)], hosts("p1", 2, spot=1) + hosts("p2", 2),
                     [job(i, vcpu=1 + i % 6, seconds=600 * (1 + i % 3)) for i in range(30)], nodes=[n])
    old_record = json.loads(json.dumps(inp._legacy_dict()))  # the format of plans recorded until issue 14
    again = PlanInput.from_dict(old_record)
    assert again.resolved_digest_version == 1 and again.digest() == _legacy_digest(inp) != inp.digest()
    assert plan(again).to_dict(explain=True) == plan(replace(inp, digest_version=1)).to_dict(explain=True)
    # a float where an integer is expected (as a hand-edited record might hold) is hashed as JSON writes it
    odd = PlanInput.from_dict({**old_record, "demand": [{**old_record["demand"][0], "expected_seconds": 600.0},
                                                        *old_record["demand"][1:]]})
    assert odd.digest() == _legacy_digest(odd) != again.digest()


@pytest.mark.parametrize("version", [2, 3])
def test_the_digest_changes_with_every_decision_input(version):
    """The digest names every value of the recorded form: a change of any field of a class or a node, of
    the time or of a pool changes it, and each changed input read back from its record is named alike (in
    the columns of version 3, every new input's, and in the per-item form of version 2, which recorded plans
    replay in)."""
    from dataclasses import fields, replace

    from spotctl.core.models import NodeState, Notice, NoticeKind

    inp = plan_input([pool("p1"), pool("p2")], hosts("p1", 2) + hosts("p2", 2), [job(1), job(2, vcpu=2)],
                     nodes=[node(1), node(2)])
    assert inp.resolved_digest_version == 3
    inp = replace(inp, digest_version=version)
    base = inp.digest()
    d0, n0 = inp.demand[0], inp.nodes[0]
    other = {"key": "k2", "scheduler": "kubernetes", "shape": Shape(3, 8192), "priority": 7,
             "expected_seconds": 601, "count": d0.count + 1, "pools": d0.pools[:1], "examples": ("slurm/x",)}
    node_other = {"id": "n9", "pool": "p2", "state": NodeState.DRAINING, "used": Shape(1, 1024), "running": 3,
                  "cordoned": not n0.cordoned, "idle_since": NOW - 5, "price": 9.5, "drain_started": NOW - 1,
                  "host": "h-9", "protected_until": NOW + 60, "protect_closed": True,
                  "cordoned_by_us": not n0.cordoned_by_us, "known": not n0.known,
                  "notice": Notice("ntc-1", "i-1", NoticeKind.HARD, NOW - 10, NOW + 600, "reclaim", "p1"),
                  "launched_at": NOW - 3600, "work_started_at": NOW - 600}
    assert set(other) == {f.name for f in fields(d0)} and set(node_other) == {f.name for f in fields(n0)}
    changed = [replace(inp, demand=(replace(d0, **{k: v}),) + inp.demand[1:]) for k, v in other.items()]
    changed += [replace(inp, nodes=(replace(n0, **{k: v}),) + inp.nodes[1:]) for k, v in node_other.items()]
    changed += [replace(inp, now=inp.now + 1), replace(inp, nodes=inp.nodes[::-1]),
                replace(inp, previous_rate_card=("rc-0", {"p1": 1.0})),
                replace(inp, policy=replace(inp.policy, consolidation_min_saving_pct=25)),
                replace(inp, pools={**inp.pools, "p2": replace(inp.pools["p2"], max_nodes=3)})]
    digests = [c.digest() for c in changed]
    assert base not in digests and len(set(digests)) == len(digests)
    assert all(PlanInput.from_dict(json.loads(json.dumps(c.to_dict()))).digest() == c.digest() for c in changed)


def test_many_pools_and_distinct_classes_account_for_every_unit():
    """Forty pools of one binding over four shapes, three hundred distinct classes (each its own shape and
    duration), thirty launches allowed (not enough): every unit is placed or counted unplaced with its reason; the first
    EXPLAIN_UNPLACED classes left are explained one by one, the rest in one line."""
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
    lines = [e for e in p.explain if " unplaced" in e and not e.startswith("…")]
    assert d["pending_after_plan"] > EXPLAIN_UNPLACED and len(lines) == EXPLAIN_UNPLACED
    assert sum(int(e.split("×")[1].split(" ")[0]) for e in lines) < d["pending_after_plan"]
    (rest,) = [e for e in p.explain if e.startswith("…")]
    assert rest.startswith(f"… and {d['pending_after_plan'] - EXPLAIN_UNPLACED} more demand classes unplaced")
    assert f"{d['unplaced']} in all" in rest


def test_a_new_input_is_named_by_the_text_the_store_records(tmp_path):
    """Every new input is version 3: its digest is the SHA-256 of the recorded form's canonical JSON (each
    pool set once, the nodes and the demand as columns), the very text the store records (``recorded_json``);
    read back, it is named alike and replays to the same plan. A record of version 2 (per-item nodes and
    classes) is named as it was and replays to the same plan; a record without a version is version 1 (the
    whole input's JSON, each class with its pools); an unknown version is refused."""
    from dataclasses import replace

    from spotctl.state.store import Store

    inp = plan_input([pool("p1"), pool("p2", vcpu=4, ram=8192)], hosts("p1", 2) + hosts("p2", 2),
                     [job(i, vcpu=1 + i % 6, seconds=600 * (1 + i % 3)) for i in range(30)], nodes=[node(1)])
    text = json.dumps(inp.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
    assert inp.recorded_json() == text and inp.digest() == hashlib.sha256(text.encode()).hexdigest()
    assert inp.resolved_digest_version == 3 and inp.digest() != _legacy_digest(inp)
    assert inp.to_dict()["nodes"]["id"] == ["n1"] and len(inp.to_dict()["demand"]["key"]) == len(inp.demand)
    store = Store.open(tmp_path / "state.db", "r1")
    seq = store.record_plan(plan_id=inp.digest()[:12], at=NOW, actor="t", executed=True, summary={},
                            plan_input=inp.recorded_json())
    rec = store.plan_input(seq)
    assert rec == json.loads(text) and rec["digest_version"] == 3
    again = PlanInput.from_dict(rec)
    assert again.digest() == inp.digest()
    assert plan(again).to_dict(explain=True) == plan(inp).to_dict(explain=True)
    v2 = replace(inp, digest_version=2)
    v2_record = json.loads(v2.recorded_json())
    assert v2_record["digest_version"] == 2 and v2_record["nodes"][0]["id"] == "n1"
    assert len(v2.recorded_json()) > len(text)  # the columns are the smaller record
    v2_again = PlanInput.from_dict(v2_record)
    assert v2_again.digest() == v2.digest() == hashlib.sha256(v2.recorded_json().encode()).hexdigest() != inp.digest()
    assert plan(v2_again).to_dict(explain=True) == plan(v2).to_dict(explain=True)
    decided = [[(a.kind, a.pool, a.node, a.count, a.reason) for a in plan(i).actions] for i in (v2_again, inp)]
    assert decided[0] == decided[1]  # the same decisions; only the plan's name (and its actions' ids) differs
    old = PlanInput.from_dict(json.loads(json.dumps(inp._legacy_dict())))
    assert old.resolved_digest_version == 1 and old.digest() == _legacy_digest(inp)
    for bad in (4, 0, "3"):
        with pytest.raises(ValueError, match="digest version"):
            PlanInput.from_dict({**rec, "digest_version": bad})
    # version 3's columns must be whole: a damaged record is refused, never read as another input
    for damaged in ({**rec["nodes"], "id": []}, {k: v for k, v in rec["nodes"].items() if k != "price"},
                    [{"id": "n1"}]):
        with pytest.raises(ValueError, match="column"):
            PlanInput.from_dict({**rec, "nodes": damaged})
