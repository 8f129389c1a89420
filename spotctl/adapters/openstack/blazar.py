"""Blazar, the reservation service: which hosts committed leases hold and when (the forward calendar).

:class:`Blazar` reads hosts, host allocations and leases (cached for a few seconds: one observe reads
them twice); :func:`group_reservations` turns the leases into the port's per-pool reservations (pure).
"""

from __future__ import annotations

import time
from typing import Any

from spotctl.core.models import Reservation

from .api import Api, _ts, json_of

BLAZAR_CACHE_SECONDS = 5.0
# (lease id, host name, start, end)
HostLease = tuple[str, str, float, float]


class Blazar:
    """Blazar reads through the shared connection's keystone session."""

    def __init__(self, api: Api):
        self.api = api
        self._cache: tuple[float, dict[str, Any]] | None = None

    def get(self, path: str) -> Any:
        """One GET of the reservation API; its JSON."""
        def get() -> Any:
            r = self.api.conn.session.get(path, endpoint_filter={"service_type": "reservation", "interface": "public"},
                                          raise_exc=False)
            return json_of(r, path)

        return self.api.call(f"blazar GET {path}", get)

    def state(self) -> dict[str, Any]:
        """Blazar hosts, host allocations and leases, cached for a few seconds (one observe reads them twice)."""
        now = time.monotonic()
        if self._cache and now - self._cache[0] < BLAZAR_CACHE_SECONDS:
            return self._cache[1]
        hosts = {h["id"]: h["hypervisor_hostname"] for h in self.get("/os-hosts").get("hosts", [])}
        allocs = self.get("/os-hosts/allocations").get("allocations", [])
        leases = {le["id"]: le for le in self.get("/leases").get("leases", [])}
        state = {"hosts": hosts, "allocations": allocs, "leases": leases}
        self._cache = (now, state)
        return state

    def host_leases(self) -> list[HostLease]:
        """(lease id, host name, start, end) for every lease holding a host."""
        st = self.state()
        out = []
        for a in st["allocations"]:
            host = st["hosts"].get(str(a.get("resource_id")))
            if host is None:
                continue
            for r in a.get("reservations", []):
                lease = st["leases"].get(r.get("lease_id"))
                if lease is None or lease.get("status") in ("TERMINATED", "DELETED", "ERROR"):
                    continue
                out.append((lease["id"], host, _ts(lease.get("start_date")), _ts(lease.get("end_date"))))
        return out

    def hosts_reserved(self, now: float) -> dict[str, float]:
        """host -> start of its earliest lease that has not ended by ``now`` (HostCapacity.reserved_from)."""
        out: dict[str, float] = {}
        for _lid, host, start, end in self.host_leases():
            if end > now and (host not in out or start < out[host]):
                out[host] = start
        return out


def group_reservations(leases: list[HostLease], members: dict[str, set[str]], start: float,
                       end: float) -> list[Reservation]:
    """The leases that overlap [start, end) as one reservation per (lease, pool), with the pool's hosts it
    holds; ``members`` maps each pool to its host names. Ordered by start, then lease and pool."""
    grouped: dict[tuple[str, str], tuple[float, float, set[str]]] = {}
    for lid, host, ls, le in leases:
        if not (ls < end and le > start):
            continue
        for pname, hosts in members.items():
            if host in hosts:
                g = grouped.setdefault((lid, pname), (ls, le, set()))
                g[2].add(host)
    return [Reservation(id=lid, pool=pname, hosts=tuple(sorted(g[2])), start=g[0], end=g[1])
            for (lid, pname), g in sorted(grouped.items(), key=lambda kv: (kv[1][0], kv[0]))]
