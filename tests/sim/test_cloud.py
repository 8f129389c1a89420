"""Nova/Ironic lifecycle: create, boot, find, delete, release; capacity and failures."""

from __future__ import annotations

import pytest

from spotctl.core.errors import CapacityError, NotFoundError
from spotctl.core.models import Scheduler
from spotctl.sim import Knobs, SimWorld

from .conftest import START


def test_create_find_boot_delete_release(world, region):
    pool = region.pools["gp-az1"]
    inst = world.cloud.create_instance(pool, "spot-gp-1", "act-1")
    assert inst.status == "BUILD" and inst.pool == "gp-az1" and inst.action_id == "act-1"
    assert inst.host and inst.host.startswith("gp-az1-") and inst.created_at == START
    assert world.cloud.find_instance("act-1") == inst
    assert world.cloud.find_instance("nope") is None
    assert world.cloud.instances() == [inst]
    host = next(h for h in world.cloud.hosts(region.pools) if h.name == inst.host)
    assert host.spot_nodes == 1
    # not registered while building
    assert all(u.node != "spot-gp-1" for s in world.schedulers for u in s.usage())
    world.advance(START + pool.boot_seconds - 1)
    assert world.cloud.find_instance("act-1").status == "BUILD"
    world.advance(START + pool.boot_seconds)
    assert world.cloud.find_instance("act-1").status == "ACTIVE"
    for s in world.schedulers:
        [u] = [u for u in s.usage() if u.node == "spot-gp-1"]
        assert u.last_busy_at == START + pool.boot_seconds  # registration time while idle
        assert not u.cordoned
    assert {u.scheduler for s in world.schedulers for u in s.usage()} == {Scheduler.KUBERNETES, Scheduler.SLURM}

    world.cloud.delete_instance(inst.id)
    world.cloud.delete_instance(inst.id)  # idempotent
    world.cloud.delete_instance("no-such-instance")  # fine
    assert world.cloud.instances() == [] and world.cloud.find_instance("act-1") is None
    assert not world.cloud.released(inst.id)
    world.advance(world.now + 4)
    assert not world.cloud.released(inst.id)  # allocations take 5-20 s to free
    world.advance(world.now + 20)
    assert world.cloud.released(inst.id)
    assert world.cloud.released("never-existed")
    host = next(h for h in world.cloud.hosts(region.pools) if h.name == inst.host)
    assert host.spot_nodes == 0


def test_pool_full_raises_capacity_error_naming_the_pool(world, region):
    pool = region.pools["bm-gpu-az2"]
    made = []
    with pytest.raises(CapacityError) as e:
        for n in range(50):
            made.append(world.cloud.create_instance(pool, f"g{n}", f"g{n}"))
    assert "No valid host was found" in str(e.value) and "bm-gpu-az2" in str(e.value)
    assert 1 <= len(made) <= 8
    assert len({i.host for i in made}) == len(made)  # bare metal: one instance per machine
    assert world.report()["instances"]["launch_failures"] == 1


def test_first_fit_in_host_name_order(world, region):
    pool = region.pools["gp-az2"]
    hosts = [h.name for h in world.cloud.hosts({"gp-az2": pool})]
    a = world.cloud.create_instance(pool, "a", "a")
    b = world.cloud.create_instance(pool, "b", "b")
    assert a.host == b.host  # a VM hypervisor holds several nodes
    assert hosts.index(a.host) <= 2


def test_injected_launch_failures(world, region):
    pool = region.pools["gp-az1"]
    world.inject_launch_failures("gp-az1", until=START + 600)
    with pytest.raises(CapacityError, match="gp-az1"):
        world.cloud.create_instance(pool, "x", "x")
    world.cloud.create_instance(region.pools["gp-az2"], "y", "y")  # other pools are fine
    world.advance(START + 600)
    assert world.cloud.create_instance(pool, "x", "x").status == "BUILD"
    with pytest.raises(NotFoundError):
        world.inject_launch_failures("nope", until=START)


def test_quota_exceeded(region):
    w = SimWorld.new(region, START, knobs=Knobs(quota_instances=2))
    pool = region.pools["gp-az1"]
    w.cloud.create_instance(pool, "a", "a")
    w.cloud.create_instance(pool, "b", "b")
    with pytest.raises(CapacityError, match="Quota exceeded for instances"):
        w.cloud.create_instance(pool, "c", "c")
    w.cloud.delete_instance(w.cloud.find_instance("a").id)
    w.cloud.create_instance(pool, "c", "c")


def test_unknown_pool(world, region):
    from dataclasses import replace

    with pytest.raises(NotFoundError):
        world.cloud.create_instance(replace(region.pools["gp-az1"], name="nope"), "x", "x")


def test_bare_metal_release_then_cleaning(world, region):
    pool = region.pools["bm-cpu-az1"]
    inst = world.cloud.create_instance(pool, "bm1", "bm1")
    world.advance(world.now + pool.boot_seconds)
    world.cloud.delete_instance(inst.id)
    world.advance(world.now + 25)
    assert not world.cloud.released(inst.id)  # bare metal takes longer than a VM
    world.advance(world.now + 70)
    assert world.cloud.released(inst.id)
    [host] = [h for h in world.cloud.hosts(region.pools) if h.name == inst.host]
    assert host.spot_nodes == 0 and host.used_other == host.capacity  # cleaning
    made = []
    with pytest.raises(CapacityError):
        for n in range(10):
            made.append(world.cloud.create_instance(pool, f"f{n}", f"f{n}"))
    assert all(i.host != inst.host for i in made)  # nothing lands on a machine being cleaned
    world.advance(world.now + pool.cleaning_seconds)
    assert world.fleet.hosts[inst.host].clean_until <= world.now


def test_vanish_is_a_no_notice_loss(world, region):
    pool = region.pools["gp-az1"]
    inst = world.cloud.create_instance(pool, "n1", "a1")
    world.advance(world.now + 600)  # active, and work placed on it
    running = sum(u.running for s in world.schedulers for u in s.usage() if u.node == "n1")
    assert running > 0
    world.vanish(inst.id)
    assert world.cloud.find_instance("a1") is None
    rep = world.report()
    assert rep["interruptions"]["nodes_lost_without_notice"] == 1
    assert rep["interruptions"]["lost_units"] == running
    assert rep["instances"]["vanished"] == 1
    with pytest.raises(NotFoundError):
        world.vanish(inst.id)
