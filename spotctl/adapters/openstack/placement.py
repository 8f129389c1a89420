"""Placement: which resource providers (hosts) serve a pool, their inventories and allocations, and
what is left on each for one more node of the pool's shape (:func:`host_capacity`, pure).

Headroom on a provider is (total − reserved) × allocation ratio − used, per resource class; our own
allocations in the pool are spot nodes, not foreign use. Placement's microversion is pinned to what
the queries need (:data:`PLACEMENT_MICROVERSION`).
"""

from __future__ import annotations

import re
from typing import Any

from spotctl.core.errors import ConfigError
from spotctl.core.models import HostCapacity, PoolKind, PoolSpec, Shape

from .api import Api, json_of

# Placement 1.22: forbidden traits (skip hosts whose compute service is disabled); member_of (1.3), required (1.18).
PLACEMENT_MICROVERSION = "1.22"
DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"


def _rc(resource_class: str) -> str:
    """An Ironic resource class as Placement spells it (CUSTOM_…, upper case, [A-Z0-9_])."""
    if resource_class.startswith("CUSTOM_") or resource_class in ("VCPU", "MEMORY_MB", "DISK_GB", "VGPU"):
        return resource_class
    return "CUSTOM_" + re.sub(r"[^A-Z0-9_]", "_", resource_class.upper())


class Placement:
    """Placement reads through the shared connection."""

    def __init__(self, api: Api):
        self.api = api

    def get(self, path: str) -> Any:
        """One GET; its JSON, or None when Placement answers 404."""
        def get() -> Any:
            r = self.api.conn.placement.get(path, microversion=PLACEMENT_MICROVERSION, raise_exc=False)
            if r.status_code == 404:
                return None
            return json_of(r, path)

        return self.api.call(f"placement GET {path}", get)

    def providers(self, pool: PoolSpec, traits: tuple[str, ...], aggregate: str | None) -> list[dict[str, Any]]:
        """The enabled providers of a pool, by name: members of its ``aggregate`` (a uuid) and/or with its
        ``traits``, and for bare metal with a free unit of its resource class."""
        params = []
        if aggregate:
            params.append(f"member_of={aggregate}")
        required = list(traits) + [f"!{DISABLED_TRAIT}"]
        params.append("required=" + ",".join(required))
        if pool.kind is PoolKind.BAREMETAL and pool.resource_class:
            params.append(f"resources={_rc(pool.resource_class)}:1")
        if not aggregate and not traits:
            raise ConfigError(f"pool {pool.name!r} names neither an aggregate nor traits: cannot find its hosts")
        data = self.get("/resource_providers?" + "&".join(params)) or {}
        return sorted(data.get("resource_providers", []), key=lambda r: r["name"])

    def provider_state(self, uuid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """A provider's inventories and allocations (consumer -> its resources)."""
        inv = (self.get(f"/resource_providers/{uuid}/inventories") or {}).get("inventories", {})
        allocs = (self.get(f"/resource_providers/{uuid}/allocations") or {}).get("allocations", {})
        return inv, allocs

    def allocations_freed(self, consumer: str) -> bool:
        """Placement holds no allocation for the consumer (a server) any more."""
        allocs = self.get(f"/allocations/{consumer}") or {}
        return not allocs.get("allocations")


def host_capacity(pool: PoolSpec, host: str, inv: dict[str, Any], allocs: dict[str, Any], ours: dict[str, str],
                  reserved_from: float | None) -> HostCapacity:
    """One provider as a host of ``pool``: its capacity, what others use, our nodes of the pool on it.
    ``ours`` maps our servers (consumers) to their pools; ``reserved_from`` is when a lease takes the host."""
    used: dict[str, int] = {}
    mine: dict[str, int] = {}
    spot_nodes = 0
    for consumer, a in allocs.items():
        res = a.get("resources", {})
        is_ours = consumer in ours
        if is_ours and ours[consumer] == pool.name:
            spot_nodes += 1
        for rc, n in res.items():
            used[rc] = used.get(rc, 0) + n
            if is_ours:
                mine[rc] = mine.get(rc, 0) + n

    def cap(rc: str) -> int:
        i = inv.get(rc)
        if not i:
            return 0
        return int((i["total"] - i["reserved"]) * i["allocation_ratio"])

    def other(rc: str) -> int:
        return max(0, used.get(rc, 0) - mine.get(rc, 0))

    if pool.kind is PoolKind.BAREMETAL and pool.resource_class:
        # One node per provider: the whole shape when the resource class has a free unit.
        rc = _rc(pool.resource_class)
        c = cap(rc)
        capacity = pool.shape if c > 0 else Shape()
        taken = other(rc) >= c if c else True
        used_other = pool.shape if taken and not spot_nodes else Shape()
        return HostCapacity(host, pool.name, capacity, used_other, spot_nodes, reserved_from)
    capacity = Shape(cap("VCPU"), cap("MEMORY_MB"), cap("VGPU"))
    if not fits_units(pool, inv):
        capacity = Shape()
    used_other = Shape(other("VCPU"), other("MEMORY_MB"), other("VGPU"))
    # our allocations held by *other* pools on this host are foreign to this pool
    for consumer, a in allocs.items():
        if consumer in ours and ours[consumer] != pool.name:
            res = a.get("resources", {})
            used_other = used_other + Shape(res.get("VCPU", 0), res.get("MEMORY_MB", 0), res.get("VGPU", 0))
    return HostCapacity(host, pool.name, capacity, used_other, spot_nodes, reserved_from)


def fits_units(pool: PoolSpec, inv: dict[str, Any]) -> bool:
    """Whether one node of the pool's shape is a valid request (min/max unit, step size) on this provider."""
    for rc, need in (("VCPU", pool.shape.vcpu), ("MEMORY_MB", pool.shape.ram_mb), ("VGPU", pool.shape.gpus)):
        if need <= 0:
            continue
        i = inv.get(rc)
        if not i:
            return False
        if need < i.get("min_unit", 1) or need > i.get("max_unit", need) or need % max(1, i.get("step_size", 1)):
            return False
    return True
