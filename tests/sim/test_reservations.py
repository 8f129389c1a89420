"""Blazar-like leases: a calendar that is always populated, and reclaims that follow it."""

from __future__ import annotations

from spotctl.core.models import NoticeKind, PoolClass
from spotctl.sim import SimWorld

from .conftest import START


def _reserved(region):
    return {n: p for n, p in region.pools.items() if p.pool_class is PoolClass.RESERVED_IDLE}


def test_next_24h_always_holds_leases_for_reserved_idle_pools(region):
    w = SimWorld.new(region, START)
    pools = _reserved(region)
    for _ in range(36):  # three days, every two hours
        leases = w.cloud.reservations(pools, w.now, w.now + 86400)
        assert {r.pool for r in leases} == set(pools), w.now
        for r in leases:
            assert r.start < w.now + 86400 and r.end > w.now
            assert 2 * 3600 <= r.end - r.start <= 12 * 3600
            assert r.hosts and len(r.hosts) <= 3
        w.advance(w.now + 7200)


def test_leases_mark_hosts_and_take_them_at_start_minus_cleaning(region):
    w = SimWorld.new(region, START)
    pools = _reserved(region)
    future = [r for r in w.cloud.reservations(pools, w.now, w.now + 86400) if r.start > w.now + 3600]
    assert future
    lease = min(future, key=lambda r: r.start)
    cleaning = region.pools[lease.pool].cleaning_seconds
    hosts = {h.name: h for h in w.cloud.hosts(region.pools)}
    for name in lease.hosts:
        assert hosts[name].reserved_from is not None and hosts[name].reserved_from <= lease.start - cleaning
    w.advance(lease.start - cleaning)
    for h in w.cloud.hosts(region.pools):
        if h.name in lease.hosts:
            assert h.used_other == h.capacity  # the reservation holds the whole host


def test_lease_overlapping_a_window_and_known_only_once_created(world, region):
    pools = _reserved(region)
    all_now = world.cloud.reservations(region.pools, 0, 2**40)
    assert all(r.pool in region.pools for r in all_now)
    assert world.cloud.reservations(pools, world.now + 10**7, world.now + 10**7 + 1) == []


def _next_lease(w, pool, ahead):
    """The first lease of ``pool`` whose reclaim is more than ``ahead`` seconds away (waiting for one)."""
    for _ in range(48):
        leases = [r for r in w.cloud.reservations({pool.name: pool}, w.now, w.now + 86400)
                  if r.start - pool.cleaning_seconds > w.now + ahead]
        if leases:
            return min(leases, key=lambda r: r.start)
        w.advance(w.now + 3600)
    raise AssertionError(f"no lease on {pool.name} in two days")


def _fill(w, pool):
    made = []
    n = 0
    while True:
        n += 1
        try:
            made.append(w.cloud.create_instance(pool, f"fill-{pool.name}-{n}", f"fill-{pool.name}-{n}"))
        except Exception:
            return made


def test_calendar_reclaim_notices_and_deletion(region):
    """Fill a reserved-idle pool; the next lease sends calendar, advisory and hard notices, then takes the
    instances still on its hosts at start - cleaning."""
    w = SimWorld.new(region, START)
    pool = region.pools["gp-rsv-az2"]
    lease = _next_lease(w, pool, 2 * 3600)
    w.advance(lease.start - 2 * 3600)
    made = _fill(w, pool)
    on_lease = [i for i in made if i.host in lease.hosts]
    assert on_lease, "no instance landed on the lease's hosts"
    kinds = {n.kind for n in w.contract.notices() if n.instance_id in {i.id for i in on_lease}}
    assert NoticeKind.CALENDAR in kinds
    seen_hard = {}
    seen_adv = set()
    while w.now < lease.start:
        w.advance(w.now + 30)
        for n in w.contract.notices():
            if n.kind is NoticeKind.HARD:
                seen_hard.setdefault(n.instance_id, n)
            if n.kind is NoticeKind.ADVISORY:
                seen_adv.add(n.instance_id)
    ids = {i.id for i in on_lease}
    assert ids <= set(seen_hard) and ids <= seen_adv
    for n in seen_hard.values():
        assert n.deadline == lease.start
        assert 150 <= n.deadline - n.issued_at <= 300
    alive = {i.id for i in w.cloud.instances()}
    assert not ids & alive  # taken at the deadline
    assert all(i.id in alive for i in made if i.host not in lease.hosts)
    rep = w.report()
    assert rep["notices"]["missed"] >= len(ids)
    assert rep["instances"]["reclaimed"] >= len(ids)


def test_bare_metal_lease_deadline_includes_cleaning(region):
    w = SimWorld.new(region, START)
    pool = region.pools["bm-gpu-az2"]
    lease = _next_lease(w, pool, 3600)
    w.advance(lease.start - pool.cleaning_seconds - 3600)
    made = _fill(w, pool)
    victims = [i for i in made if i.host in lease.hosts]
    assert victims
    w.advance(lease.start - pool.cleaning_seconds - 100)
    hard = [n for n in w.contract.notices() if n.kind is NoticeKind.HARD and n.instance_id in {v.id for v in victims}]
    assert len(hard) == len(victims)
    assert all(n.deadline == lease.start - pool.cleaning_seconds for n in hard)
