"""Headroom in node units and the forward calendar.

Headroom is computed host by host: a pool's spare capacity is the number of
whole nodes of the pool's shape that fit on each host, summed — never the sum
of free resources divided by the shape (which overstates it when fragmented).

The forward calendar of a pool is a step function of its *spot capacity* (how
many spot nodes it can hold in all, ours included) over the next hours: hosts
leave the spot pool when a reservation on them starts (minus the pool's
cleaning time) and come back when it ends.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .models import HostCapacity, PoolSpec, Reservation

HORIZON_SECONDS = 24 * 3600


def host_fit(host: HostCapacity, pool: PoolSpec, *, include_ours: bool) -> int:
    """Nodes of the pool's shape that fit on the host.

    ``include_ours=True``: the host's whole spot capacity (room for our nodes
    and any more); ``False``: only the room left for new nodes.
    """
    room = host.capacity - host.used_other
    total = pool.shape.count_in(room)
    if include_ours:
        return total
    return max(0, total - host.spot_nodes)


@dataclass(frozen=True)
class PoolHeadroom:
    pool: str
    hosts: int
    capacity: int  # spot nodes the pool can hold in all (ours included)
    ours: int  # our nodes on its hosts
    free: int  # new nodes that fit now, host by host

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "capacity": self.capacity, "ours": self.ours, "free": self.free}


def headroom(pool: PoolSpec, hosts: list[HostCapacity], now: float) -> PoolHeadroom:
    cap = ours = free = 0
    n = 0
    for h in hosts:
        if h.pool != pool.name:
            continue
        n += 1
        ours += h.spot_nodes
        if h.reserved_from is not None and h.reserved_from <= now:
            continue
        cap += host_fit(h, pool, include_ours=True)
        free += host_fit(h, pool, include_ours=False)
    return PoolHeadroom(pool.name, n, cap, ours, free)


@dataclass(frozen=True)
class Calendar:
    """Spot capacity of one pool over time: ``steps`` of (from_time, capacity)."""

    pool: str
    start: float
    end: float
    steps: tuple[tuple[float, int], ...] = field(default_factory=tuple)

    def capacity_at(self, t: float) -> int:
        cap = self.steps[0][1] if self.steps else 0
        for when, c in self.steps:
            if when <= t:
                cap = c
            else:
                break
        return cap

    def safe_until(self, n: int, now: float) -> float:
        """The first time at which the pool can no longer hold ``n`` spot nodes.

        Returns ``end`` (the horizon) when it holds them all the way.
        """
        for when, c in self.steps:
            if c < n:
                return max(now, when)
        return self.end

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "start": self.start, "end": self.end, "steps": [list(s) for s in self.steps]}


def forward_calendar(
    pool: PoolSpec,
    hosts: list[HostCapacity],
    reservations: list[Reservation],
    now: float,
    horizon: float = HORIZON_SECONDS,
) -> Calendar:
    end = now + horizon
    pool_hosts = {h.name: h for h in hosts if h.pool == pool.name}
    fit = {name: host_fit(h, pool, include_ours=True) for name, h in pool_hosts.items()}
    # Each host is out of the spot pool during [start - cleaning, end) of every reservation on it.
    outages: dict[str, list[tuple[float, float]]] = {}
    for r in reservations:
        if r.pool != pool.name:
            continue
        for name in r.hosts:
            if name in pool_hosts:
                outages.setdefault(name, []).append((r.start - pool.cleaning_seconds, r.end))
    for name, h in pool_hosts.items():
        if h.reserved_from is not None and not any(s <= h.reserved_from < e for s, e in outages.get(name, [])):
            outages.setdefault(name, []).append((h.reserved_from, end))
    times = {now}
    for spans in outages.values():
        for s, e in spans:
            if now < s < end:
                times.add(s)
            if now < e < end:
                times.add(e)
    steps: list[tuple[float, int]] = []
    for t in sorted(times):
        c = 0
        for name in pool_hosts:
            if not any(s <= t < e for s, e in outages.get(name, ())):
                c += fit[name]
        if not steps or steps[-1][1] != c:
            steps.append((t, c))
    return Calendar(pool.name, now, end, tuple(steps))


def calendar_id(calendars: dict[str, Calendar]) -> str:
    """A short stable id of a set of calendars (recorded with each action)."""
    blob = json.dumps({k: c.steps for k, c in sorted(calendars.items())}, separators=(",", ":"))
    return "cal-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def also_full(failed: PoolSpec, pools: dict[str, PoolSpec]) -> list[str]:
    """The pools a "no room" refusal in ``failed`` says are full too: the same hosts (same kind, AZ and
    aggregate or resource class) and a shape at least as large in every dimension. A smaller sibling may
    still fit, so it is not included. ``failed`` itself comes first."""
    def same_hosts(p: PoolSpec) -> bool:
        return (p.kind, p.az, p.aggregate, p.resource_class) == (failed.kind, failed.az, failed.aggregate,
                                                                  failed.resource_class)

    return [failed.name] + sorted(n for n, p in pools.items()
                                  if n != failed.name and same_hosts(p) and failed.shape.fits_in(p.shape))
