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


def test_count_in_is_the_fewest_whole_units_over_the_dimensions_asked_for():
    """Every shape and room of a small grid (negative room: a host over-committed by others): the count is the
    least ``room // need`` over the dimensions the shape asks for; a room short of a dimension it does not ask
    for fits none; a shape that asks for nothing fits none."""
    from itertools import product

    from spotctl.core.models import Shape

    def reference(shape: Shape, room: Shape) -> int:
        counts = []
        for need, have in ((shape.vcpu, room.vcpu), (shape.ram_mb, room.ram_mb), (shape.gpus, room.gpus)):
            if need > 0:
                counts.append(max(0, have) // need)
            elif have < 0:
                return 0
        return min(counts) if counts else 0

    values = (-3, 0, 1, 2, 5)
    for need in product((0, 1, 2, 3), repeat=3):
        for have in product(values, repeat=3):
            assert Shape(*need).count_in(Shape(*have)) == reference(Shape(*need), Shape(*have)), (need, have)
    assert Shape(8, 32768, 0).count_in(Shape(64, 262144, 4)) == 8
    assert Shape(8, 32768, 1).count_in(Shape(64, 262144, 4)) == 4
