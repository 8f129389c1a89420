"""The demo region's shape: pools, hosts, on-demand load that moves, quota."""

from __future__ import annotations

from spotctl.core.models import PoolClass, PoolKind
from spotctl.core.ports import CloudPort, ContractPort, SchedulerPort

from .conftest import START


def test_demo_region_has_vm_baremetal_and_gpu_pools_over_two_azs(region):
    pools = region.pools
    assert len(pools) >= 6
    assert len({p.az for p in pools.values()}) >= 2
    kinds = {p.kind for p in pools.values()}
    assert kinds == {PoolKind.VM, PoolKind.BAREMETAL}
    assert sum(1 for p in pools.values() if p.shape.gpus) == 1
    assert {p.pool_class for p in pools.values()} == {PoolClass.HEADROOM, PoolClass.RESERVED_IDLE}


def test_world_implements_the_ports(world):
    assert isinstance(world.cloud, CloudPort)
    assert isinstance(world.contract, ContractPort)
    assert [s.name for s in world.schedulers] == ["kubernetes", "slurm"]
    assert all(isinstance(s, SchedulerPort) for s in world.schedulers)
    assert world.now == START


def test_hosts_per_pool(world, region):
    hosts = world.cloud.hosts(region.pools)
    by_pool: dict[str, list] = {}
    for h in hosts:
        by_pool.setdefault(h.pool, []).append(h)
    assert set(by_pool) == set(region.pools)
    for name, hs in by_pool.items():
        pool = region.pools[name]
        names = [h.name for h in hs]
        assert names == sorted(names) and len(set(names)) == len(names)
        if pool.kind is PoolKind.BAREMETAL:
            assert 4 <= len(hs) <= 8
            assert all(h.capacity == pool.shape for h in hs)  # one node-shaped host per machine
        else:
            assert 6 <= len(hs) <= 10
            for h in hs:
                assert h.capacity.vcpu >= 64 and 256 * 1024 <= h.capacity.ram_mb <= 512 * 1024
        for h in hs:
            assert h.spot_nodes == 0
            assert h.used_other.fits_in(h.capacity)
    assert all(h.capacity.gpus == 4 for h in by_pool["bm-gpu-az2"])
    # a subset of pools gives a subset of hosts
    only = world.cloud.hosts({"gp-az1": region.pools["gp-az1"]})
    assert {h.pool for h in only} == {"gp-az1"}


def test_on_demand_usage_moves_over_the_day(world, region):
    def usage():
        return {h.name: h.used_other for h in world.cloud.hosts(region.pools) if h.reserved_from is None
                or h.reserved_from > world.now + 86400}

    before = usage()
    world.advance(START + 6 * 3600)
    after = usage()
    common = set(before) & set(after)
    assert sum(1 for n in common if before[n] != after[n]) > len(common) // 3


def test_quota_is_what_is_left(world, region):
    q0 = world.cloud.quota()
    assert q0.instances == 150 and q0.vcpu == 2000 and q0.ram_mb > 10**6
    world.cloud.create_instance(region.pools["gp-az1"], "n1", "a1")
    q1 = world.cloud.quota()
    assert (q1.instances, q1.vcpu, q1.ram_mb) == (149, 1992, q0.ram_mb - 32768)


def test_fresh_world_has_pending_work_for_several_pools(world, region):
    served = set()
    kinds = set()
    for s in world.schedulers:
        units, _ = s.pending(region.pools)
        for u in units:
            kinds.add(u.scheduler)
            served |= {name for name, p in region.pools.items() if p.serves(u)}
    assert len(kinds) == 2
    assert len(served) >= 4
