"""Headroom host by host and the forward calendar."""

from spotctl.core.capacity import calendar_id, forward_calendar, headroom
from spotctl.core.models import HostCapacity, Shape

from ..factories import NOW, pool, reservation


def test_headroom_is_per_host_fit_and_counts_our_nodes():
    p = pool(vcpu=8, ram=32768)
    hs = [
        HostCapacity("h0", "p1", Shape(64, 262144), Shape(60, 0), spot_nodes=0),   # 4 vCPU free: 0 nodes
        HostCapacity("h1", "p1", Shape(64, 262144), Shape(0, 200000), spot_nodes=0),  # RAM-bound: 1 node
        HostCapacity("h2", "p1", Shape(64, 262144), Shape(0, 0), spot_nodes=3),      # 8 fit, 3 ours
    ]
    hr = headroom(p, hs, NOW)
    assert (hr.capacity, hr.ours, hr.free, hr.hosts) == (0 + 1 + 8, 3, 0 + 1 + 5, 3)


def test_calendar_steps_down_at_reservation_minus_cleaning_and_back_after():
    p = pool(vcpu=8, ram=32768, cleaning=900)
    hs = [HostCapacity(f"h{i}", "p1", Shape(64, 262144), Shape()) for i in range(3)]
    res = [reservation("p1", ["h0", "h1"], NOW + 3600, NOW + 7200)]
    cal = forward_calendar(p, hs, res, NOW)
    assert cal.capacity_at(NOW) == 24
    assert cal.capacity_at(NOW + 3600 - 900) == 8
    assert cal.capacity_at(NOW + 7200) == 24
    assert cal.safe_until(8, NOW) == cal.end
    assert cal.safe_until(9, NOW) == NOW + 2700
    assert calendar_id({"p1": cal}) == calendar_id({"p1": forward_calendar(p, hs, res, NOW)})


def test_a_full_pool_says_the_larger_pools_on_its_hosts_are_full_too():
    from spotctl.core.capacity import also_full
    from spotctl.core.models import PoolClass, PoolKind, PoolSpec, Shape

    def pool(name, vcpu, ram, agg="freepool", az="nova"):
        return PoolSpec(name=name, kind=PoolKind.VM, pool_class=PoolClass.RESERVED_IDLE, az=az, shape=Shape(vcpu, ram),
                        aggregate=agg)

    pools = {p.name: p for p in (pool("reserved", 2, 2048), pool("reserved-large", 4, 4096),
                                 pool("reserved-tiny", 1, 1024), pool("general", 4, 4096, agg="agg-general"),
                                 pool("other-az", 4, 4096, az="az2"))}
    assert also_full(pools["reserved"], pools) == ["reserved", "reserved-large"]
    assert also_full(pools["reserved-large"], pools) == ["reserved-large"]
    assert also_full(pools["reserved-tiny"], pools) == ["reserved-tiny", "reserved", "reserved-large"]
