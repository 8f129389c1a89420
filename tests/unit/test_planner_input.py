"""The planner's input at scale (issue 14): ``build_input`` groups units into classes and merges what each
scheduler says of a node as it always did, the digest and the record share one rendering of the nodes, and
``ops.observe.planned`` leaves the garbage collector as it found it."""

from __future__ import annotations

import gc
import hashlib
import json
import random

import pytest

from spotctl.core.models import NodeUsage, Scheduler, Shape, WorkUnit
from spotctl.core.plan_input import EXAMPLES, PlanInput, build_input
from spotctl.ops.observe import planned

from ..factories import NOW, hosts, job, node, plan_input, pool


def _build(units, **kw):
    return plan_input([pool("p1"), pool("p2", vcpu=16, ram=65536)], hosts("p1", 4) + hosts("p2", 4), units, **kw)


def test_a_class_counts_every_unit_and_names_its_smallest_ids_in_order():
    """Units of one class in any order: the class counts them all and keeps the EXAMPLES smallest ids,
    sorted; a class of fewer keeps them all."""
    ids = list(range(1000, 1000 + 5 * EXAMPLES))
    random.Random(7).shuffle(ids)
    units = [job(i) for i in ids] + [job(i, vcpu=2) for i in (9, 3, 5)]
    by_shape = {d.shape: d for d in _build(units).demand}
    big, small = by_shape[Shape(4, 8192)], by_shape[Shape(2, 8192)]
    assert big.count == 5 * EXAMPLES
    assert big.examples == tuple(sorted(f"slurm/{i}" for i in ids)[:EXAMPLES])
    assert small.count == 3 and small.examples == ("slurm/3", "slurm/5", "slurm/9")


def test_a_scheduler_named_by_its_value_is_the_same_class():
    """A unit whose scheduler is the plain string is in the class of the units with the enum: one class,
    its key and sample from the first unit seen."""
    a = job(1)
    b = WorkUnit(id="slurm/2", scheduler="slurm", shape=a.shape, priority=a.priority,  # type: ignore[arg-type]
                 expected_seconds=a.expected_seconds, submitted_at=a.submitted_at, partition=a.partition)
    (d,) = _build([a, b]).demand
    assert (d.count, d.examples, d.scheduler) == (2, ("slurm/1", "slurm/2"), "slurm")
    assert d.key == _build([a]).demand[0].key


def test_a_node_seen_by_two_schedulers_sums_their_usage():
    """Used room and running units add up over the schedulers; the latest busy time counts; a cordon by
    any of them cordons the node (``cordoned_by_us`` stays our own record)."""
    n = node(1)
    usage = [NodeUsage("n1", Scheduler.SLURM, Shape(2, 4096), 1, cordoned=False, last_busy_at=NOW - 50),
             NodeUsage("n1", Scheduler.KUBERNETES, Shape(1, 1024, 0), 2, cordoned=True, last_busy_at=NOW - 10)]
    (v,) = _build([], nodes=[n], usage=usage).nodes
    assert (v.used, v.running, v.cordoned, v.cordoned_by_us, v.known) == (Shape(3, 5120), 3, True, False, True)
    (alone,) = _build([], nodes=[n], usage=usage[:1]).nodes
    assert (alone.used, alone.running, alone.cordoned) == (Shape(2, 4096), 1, False)
    (unknown,) = _build([], nodes=[n]).nodes
    assert (unknown.used, unknown.running, unknown.known, unknown.idle_since) == (Shape(), 0, False, n.updated_at)


@pytest.mark.parametrize("version", [2, 3])
def test_the_record_and_the_digest_say_the_same_nodes(version):
    """The recorded form (``to_dict``) is what the digest names: from version 2 on the digest is the SHA-256
    of the record's canonical JSON, and a record read back has the same digest and the same nodes."""
    from dataclasses import replace

    usage = [NodeUsage(f"n{i}", Scheduler.SLURM, Shape(1, 1024), 1) for i in range(3)]
    inp = replace(_build([job(i) for i in range(30)], nodes=[node(i) for i in range(3)], usage=usage),
                  digest_version=version)
    again = PlanInput.from_dict(json.loads(json.dumps(inp.to_dict())))
    text = json.dumps(again.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
    assert again.digest() == inp.digest() == hashlib.sha256(text.encode()).hexdigest()
    assert again.nodes == inp.nodes and again.demand == inp.demand
    nodes = inp.to_dict()["nodes"]
    assert (nodes["id"] if version == 3 else [n["id"] for n in nodes]) == ["n0", "n1", "n2"]


def test_planned_leaves_the_collector_as_it_found_it():
    """The collector is paused while the planner runs and put back after it, also when planning fails
    (an input of an unknown digest version)."""
    inp = _build([job(i) for i in range(10)])
    assert gc.isenabled()
    p = planned(inp)
    assert gc.isenabled() and p.id == inp.digest()[:12]
    bad = PlanInput.from_dict({**json.loads(json.dumps(inp.to_dict()))})
    object.__setattr__(bad, "digest_version", 7)
    with pytest.raises(ValueError, match="digest version"):
        planned(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        planned(inp)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_build_input_takes_units_as_a_list_of_any_order():
    """The classes do not depend on the order the units came in (the plan's order sorts them)."""
    units = [job(i, vcpu=1 + i % 3, seconds=600 * (1 + i % 2)) for i in range(60)]
    a = build_input(**_kwargs(units))
    b = build_input(**_kwargs(list(reversed(units))))
    assert [d.to_dict() for d in a.demand] == [d.to_dict() for d in b.demand]
    assert a.digest() == b.digest()


def _kwargs(units):
    inp = _build([])
    return {"region": inp.region, "now": inp.now, "pools": inp.pools, "policy": inp.policy, "headroom": inp.headroom,
            "calendars": inp.calendars, "quota": inp.quota, "rate_card": inp.rate_card, "nodes": [], "usage": [],
            "notices": [], "units": units, "excluded": {}, "recent_reclaims": {}, "pool_failures": {},
            "budget": inp.budget}
