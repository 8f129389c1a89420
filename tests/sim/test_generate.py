"""The synthetic benchmark region: requested sizes, prebuilt, usable through the ports."""

from __future__ import annotations

from spotctl.core.models import PoolKind
from spotctl.sim import generated_region


def test_generated_region_sizes():
    region, world = generated_region(2000, 20000)
    pools = region.pools
    assert len(pools) == 12
    assert len({p.az for p in pools.values()}) == 3
    assert {p.kind for p in pools.values()} == {PoolKind.VM, PoolKind.BAREMETAL}
    assert any(p.shape.gpus for p in pools.values())

    instances = world.cloud.instances()
    assert len(instances) == 2000 and all(i.status == "ACTIVE" for i in instances)
    assert len({i.id for i in instances}) == 2000
    for s in world.schedulers:
        usage = s.usage()
        assert len(usage) == 2000
    busy = sum(1 for u in world.schedulers[0].usage() + world.schedulers[1].usage() if u.running)
    nodes_busy = len({u.node for s in world.schedulers for u in s.usage() if u.running})
    assert 0.7 * 2000 < nodes_busy < 2000 and busy >= nodes_busy  # most busy, some idle

    pending = excluded = 0
    for s in world.schedulers:
        units, excl = s.pending(pools)
        pending += len(units)
        excluded += len(excl)
    assert pending + excluded == 20000 and excluded < 1000
    hosts = world.cloud.hosts(pools)
    assert sum(h.spot_nodes for h in hosts) == 2000
    assert all(h.used_other.fits_in(h.capacity) for h in hosts)
    assert world.contract.rate_card().prices.keys() == pools.keys()
    assert world.report()["demand"]["pending"] + world.report()["demand"]["running"] > 20000 - 1000


def test_generated_region_is_deterministic_and_advances():
    a = generated_region(300, 3000, seed=3)[1]
    b = generated_region(300, 3000, seed=3)[1]
    assert a.cloud.instances() == b.cloud.instances()
    pools = a.region.pools
    assert [s.pending(pools) for s in a.schedulers] == [s.pending(pools) for s in b.schedulers]
    a.advance(a.now + 1800)
    b.advance(b.now + 1800)
    assert a.report() == b.report()
    assert a.report()["demand"]["completed"] > 0
