"""The simulated private cloud: hosts, on-demand load, Blazar-like leases, Nova/Ironic.

:class:`Fleet` holds the state; :class:`SimCloud` is the :class:`CloudPort`
face of it. Capacity follows Placement's arithmetic: a host offers
``capacity`` (total × allocation ratio); on-demand tenants use part of it
(deterministic per host per hour, with a day curve); our spot instances use
another part; a started reservation (lease start − cleaning) takes the whole
host.

Over 400 lines because it is one thing: :class:`Fleet` is one state machine
(hosts, leases, instances and their allocations move together, under one
capacity arithmetic), and :class:`SimCloud` is its thin port face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotctl.core.errors import CapacityError, NotFoundError
from spotctl.core.models import (
    HostCapacity,
    HostChoice,
    Instance,
    PoolClass,
    PoolKind,
    PoolSpec,
    Quota,
    Reservation,
    Shape,
)
from spotctl.core.timefmt import iso

from .rng import diurnal, keyed, mix, stable_int, uuid_from

if TYPE_CHECKING:  # pragma: no cover
    from .knobs import Knobs
    from .world import SimWorld

DAY = 86400.0
BUILD, ACTIVE, ERROR, DELETED = "BUILD", "ACTIVE", "ERROR", "DELETED"


class Host:
    """One hypervisor (VM pools) or one Ironic node (bare-metal pools)."""

    __slots__ = ("name", "pool", "bm", "cap", "base", "ramf", "key",
                 "spot_v", "spot_m", "spot_g", "spot_n", "clean_until", "leases", "insts", "od_hour", "od")

    def __init__(self, name: str, pool: str, bm: bool, cap: Shape, base: float, ramf: float):
        self.name = name
        self.pool = pool
        self.bm = bm
        self.cap = cap
        self.base = base  # mean on-demand load (fraction of the host)
        self.ramf = ramf  # on-demand RAM load relative to its vCPU load
        self.key = stable_int("host", name)
        self.spot_v = self.spot_m = self.spot_g = self.spot_n = 0
        self.clean_until = 0.0
        self.leases: list[Lease] = []
        self.insts: list[SimInstance] = []  # ours, holding allocations here
        self.od_hour = -1
        self.od = (0, 0, 0)


class SimInstance:
    __slots__ = ("id", "name", "pool", "host", "action_id", "shape", "created_at", "active_at",
                 "status", "deleted_at", "released_at", "released", "view")

    def __init__(self, id: str, name: str, pool: str, host: str, action_id: str, shape: Shape,
                 created_at: float, active_at: float, status: str = BUILD):
        self.id = id
        self.name = name
        self.pool = pool
        self.host = host
        self.action_id = action_id
        self.shape = shape
        self.created_at = created_at
        self.active_at = active_at
        self.status = status
        self.deleted_at: float | None = None
        self.released_at: float | None = None
        self.released = False
        self.view = self._view()

    def _view(self) -> Instance:
        return Instance(id=self.id, name=self.name, pool=self.pool, status=self.status,
                        action_id=self.action_id, host=self.host, created_at=self.created_at)

    def set_status(self, status: str) -> None:
        self.status = status
        self.view = self._view()

    @property
    def alive(self) -> bool:
        return self.status != DELETED

    def dump(self) -> list:
        return [self.id, self.name, self.pool, self.host, self.action_id, self.shape.vcpu, self.shape.ram_mb,
                self.shape.gpus, self.created_at, self.active_at, self.status, self.deleted_at,
                self.released_at, self.released]

    @classmethod
    def load(cls, d: list) -> "SimInstance":
        (iid, name, pool, host, action, v, m, g, created, active, status, deleted, released_at, released) = d
        i = cls(iid, name, pool, host, action, Shape(v, m, g), created, active, status)
        i.deleted_at, i.released_at, i.released = deleted, released_at, released
        return i


class Lease:
    """A committed reservation: whole hosts from ``start`` to ``end`` (Blazar lease)."""

    __slots__ = ("id", "pool", "hosts", "start", "end", "created_at", "deadline", "view")

    def __init__(self, id: str, pool: str, hosts: tuple[str, ...], start: float, end: float,
                 created_at: float, cleaning: float):
        self.id = id
        self.pool = pool
        self.hosts = hosts
        self.start = start
        self.end = end
        self.created_at = created_at
        self.deadline = start - cleaning  # capacity leaves the spot pool here
        self.view = Reservation(id=id, pool=pool, hosts=hosts, start=start, end=end)

    def dump(self) -> list:
        return [self.id, self.pool, list(self.hosts), self.start, self.end, self.created_at, self.start - self.deadline]

    @classmethod
    def load(cls, d: list) -> "Lease":
        return cls(d[0], d[1], tuple(d[2]), d[3], d[4], d[5], d[6])


# --- layout ---------------------------------------------------------------------


def build_hosts(pools: dict[str, PoolSpec], seed: int, knobs: "Knobs") -> dict[str, list[Host]]:
    """The hosts of every pool, deterministic per (seed, pool name, kind, shape)."""
    out: dict[str, list[Host]] = {}
    for name in sorted(pools):
        p = pools[name]
        r = keyed(seed, "hosts", name, p.kind.value, p.shape.vcpu, p.shape.ram_mb, p.shape.gpus)
        lo, hi = knobs.ondemand_reserved if p.pool_class is PoolClass.RESERVED_IDLE else knobs.ondemand_headroom
        hosts = []
        if p.kind is PoolKind.BAREMETAL:
            for i in range(r.randint(*knobs.machines)):
                hosts.append(Host(f"{name}-node{i + 1:02d}", name, True, p.shape, r.uniform(lo, hi) * 0.6, 1.0))
        else:
            for i in range(r.randint(*knobs.hypervisors)):
                cores = max(64, p.shape.vcpu * 2)
                vcpu = int(cores * knobs.cpu_allocation_ratio)
                ram_gib = r.choice([g for g in (256, 384, 512) if g * 1024 >= 4 * p.shape.ram_mb]
                                   or [max(512, 4 * p.shape.ram_mb // 1024)])
                gpus = p.shape.gpus * 4
                hosts.append(Host(f"{name}-hv{i + 1:02d}", name, False, Shape(vcpu, ram_gib * 1024, gpus),
                                  r.uniform(lo, hi), r.uniform(0.85, 1.15)))
        out[name] = hosts
    return out


class Fleet:
    """Hosts, leases and our instances: the cloud's state."""

    def __init__(self, world: "SimWorld", hosts_by_pool: dict[str, list[Host]]):
        self.w = world
        self.hosts_by_pool = {p: sorted(hs, key=lambda h: h.name) for p, hs in hosts_by_pool.items()}
        self.hosts: dict[str, Host] = {h.name: h for hs in self.hosts_by_pool.values() for h in hs}
        self.instances: dict[str, SimInstance] = {}
        self.by_action: dict[str, list[SimInstance]] = {}
        self.leases: dict[str, Lease] = {}
        self.failures: dict[str, float] = {}
        self.counter = 0
        self.lease_cursor: int | None = None  # next lease planning slot
        self.version = 0
        self._hv_key: tuple | None = None
        self._hv: dict[str, list[HostCapacity]] = {}
        self.live = {p: 0 for p in self.w.pools}  # instances not deleted, per pool
        self.used = [0, 0, 0]  # quota usage: instances, vcpu, ram_mb
        #: per pool and host choice (its ``not_before``, None: none), where the last first fit placed a node:
        #: (now, shape, guard, version after it, host index)
        self._fit_from: dict[tuple[str, float | None], tuple[float, Shape, float, int, int]] = {}

    # --- capacity ------------------------------------------------------------

    def ondemand(self, h: Host, now: float) -> tuple[int, int, int]:
        hour = int(now // 3600)
        if h.od_hour == hour:
            return h.od
        k = self.w.knobs
        f = h.base + k.ondemand_diurnal * diurnal(hour * 3600.0 + 1800.0) + k.ondemand_noise * (2 * mix(h.key, hour) - 1)
        f = min(0.95, max(0.0, f))
        cap = h.cap
        if h.bm:
            od = (cap.vcpu, cap.ram_mb, cap.gpus) if mix(h.key, hour, 1) < f else (0, 0, 0)
        else:
            ram = min(cap.ram_mb, int(f * h.ramf * cap.ram_mb) // 1024 * 1024)
            od = (int(f * cap.vcpu), ram, int(f * cap.gpus))
        h.od_hour, h.od = hour, od
        return od

    def blocked(self, h: Host, now: float, guard: float = 0.0) -> bool:
        """Whether a reservation (or bare-metal cleaning) keeps spot off this host now."""
        if h.clean_until > now:
            return True
        for lease in h.leases:
            clean = lease.start - lease.deadline
            if lease.deadline - guard <= now < lease.end + clean:
                return True
        return False

    def reclaim_at(self, h: Host, now: float) -> float | None:
        """When the next lease not yet over takes the host from the spot pool (None: no lease does)."""
        at = None
        for lease in h.leases:
            if lease.end + (lease.start - lease.deadline) > now and (at is None or lease.deadline < at):
                at = lease.deadline
        return at

    def used_other(self, h: Host, now: float) -> tuple[int, int, int]:
        cap = h.cap
        if self.blocked(h, now):
            od = (cap.vcpu, cap.ram_mb, cap.gpus)
        else:
            od = self.ondemand(h, now)
        # On-demand tenants cannot take what our instances hold (Nova would refuse them).
        return (max(0, min(od[0], cap.vcpu - h.spot_v)), max(0, min(od[1], cap.ram_mb - h.spot_m)),
                max(0, min(od[2], cap.gpus - h.spot_g)))

    def host_view(self, h: Host, now: float) -> HostCapacity:
        uv, um, ug = self.used_other(h, now)
        reserved_from = None
        for lease in h.leases:
            clean = lease.start - lease.deadline
            if lease.end + clean > now and lease.deadline < now + DAY:
                if reserved_from is None or lease.deadline < reserved_from:
                    reserved_from = lease.deadline
        return HostCapacity(name=h.name, pool=h.pool, capacity=h.cap, used_other=Shape(uv, um, ug),
                            spot_nodes=h.spot_n, reserved_from=reserved_from)

    def host_views(self, pools) -> list[HostCapacity]:
        now = self.w.now
        key = (now, self.version)
        if self._hv_key != key:
            self._hv_key, self._hv = key, {}
        out: list[HostCapacity] = []
        for name in sorted(pools):
            views = self._hv.get(name)
            if views is None:
                views = self._hv[name] = [self.host_view(h, now) for h in self.hosts_by_pool.get(name, ())]
            out.extend(views)
        return out

    def quota_left(self) -> Quota:
        k = self.w.knobs
        n, v, m = self.used
        return Quota(instances=None if k.quota_instances is None else k.quota_instances - n,
                     vcpu=None if k.quota_vcpu is None else k.quota_vcpu - v,
                     ram_mb=None if k.quota_ram_mb is None else k.quota_ram_mb - m)

    # --- instances -----------------------------------------------------------

    def create(self, pool: PoolSpec, name: str, action_id: str, choice: HostChoice | None = None) -> Instance:
        w = self.w
        now = w.now
        spec = w.pools.get(pool.name)
        if spec is None:
            known = ", ".join(sorted(w.pools)) or "none"
            raise NotFoundError(f"unknown pool {pool.name!r} in the simulated region", hint=f"known pools: {known}")
        until = self.failures.get(spec.name)
        if until is not None and now < until:
            w.stats["launch_failures"] += 1
            raise CapacityError(f"No valid host was found for pool {spec.name} (injected launch failure)",
                                details={"pool": spec.name, "until": until})
        k = w.knobs
        shape = spec.shape
        n, v, m = self.used
        for limit, have, need, what in ((k.quota_instances, n, 1, "instances"), (k.quota_vcpu, v, shape.vcpu, "cores"),
                                        (k.quota_ram_mb, m, shape.ram_mb, "ram")):
            if limit is not None and have + need > limit:
                w.stats["launch_failures"] += 1
                raise CapacityError(f"Quota exceeded for {what}: requested {need}, used {have} of {limit}"
                                    f" (pool {spec.name})", details={"pool": spec.name, "quota": what})
        host, at = self._first_fit(spec, now, choice)
        if host is None and choice is not None:
            w.stats["launch_failures"] += 1
            raise CapacityError(f"No valid host was found for pool {spec.name} ({spec.az}): no host with room that "
                                f"no reservation takes before {iso(choice.not_before, sep=' ')}",
                                details={"pool": spec.name, "not_before": choice.not_before})
        if host is None:
            w.stats["launch_failures"] += 1
            raise CapacityError(f"No valid host was found for pool {spec.name} ({spec.az}): "
                                f"not enough free capacity for {spec.shape.vcpu} vCPU / {spec.shape.ram_mb} MB"
                                + (f" / {spec.shape.gpus} GPU" if spec.shape.gpus else ""),
                                details={"pool": spec.name})
        self.counter += 1
        iid = uuid_from(keyed(w.seed, "instance", self.counter))
        inst = SimInstance(iid, name, spec.name, host.name, action_id, shape, now, now + spec.boot_seconds)
        self._attach(inst)
        # the hosts before this one did not fit at this time (or were not acceptable to the choice); until
        # something else changes the fleet (``version``), the next first fit of the same shape and choice
        # starts here (attaching only fills hosts)
        self._fit_from[_fit_key(spec, choice)] = (
            now, spec.shape, self.w.knobs.reservation_guard_seconds, self.version, at)
        w.stats["launched"] += 1
        w.push(inst.active_at, "active", iid)
        w.provider.instance_created(inst)
        return inst.view

    def _first_fit(self, spec: PoolSpec, now: float, choice: HostChoice | None = None) -> tuple[Host | None, int]:
        """The first host of the pool (in name order) with room for one node, and its index. Hosts a
        first fit of the same shape at the same time passed over are not asked again while the fleet is
        as that fit left it (plus the instance it placed): they can only have less room since. With a
        ``choice`` (the plan's host-aware placement), only hosts no lease takes before ``not_before`` (and
        the hosts passed over are remembered per ``not_before``)."""
        s = spec.shape
        guard = self.w.knobs.reservation_guard_seconds
        hosts = self.hosts_by_pool.get(spec.name, [])
        start = 0
        last = self._fit_from.get(_fit_key(spec, choice))
        if last is not None and last[:4] == (now, s, guard, self.version):
            start = last[4]
        for i in range(start, len(hosts)):
            h = hosts[i]
            if h.bm and h.spot_n:
                continue
            if self.blocked(h, now, guard):
                continue
            if choice is not None and not choice.acceptable(self.reclaim_at(h, now)):
                continue
            uv, um, ug = self.used_other(h, now)
            cap = h.cap
            if (cap.vcpu - uv - h.spot_v >= s.vcpu and cap.ram_mb - um - h.spot_m >= s.ram_mb
                    and cap.gpus - ug - h.spot_g >= s.gpus):
                return h, i
        return None, len(hosts)

    def _attach(self, inst: SimInstance) -> None:
        """Index a (new or loaded) instance and account its allocation and quota."""
        self.instances[inst.id] = inst
        if inst.alive:
            self.by_action.setdefault(inst.action_id, []).append(inst)
            self.live[inst.pool] = self.live.get(inst.pool, 0) + 1
            self.used[0] += 1
            self.used[1] += inst.shape.vcpu
            self.used[2] += inst.shape.ram_mb
        if not inst.released:
            h = self.hosts.get(inst.host)
            if h is not None:
                h.spot_v += inst.shape.vcpu
                h.spot_m += inst.shape.ram_mb
                h.spot_g += inst.shape.gpus
                h.spot_n += 1
                h.insts.append(inst)
        self.version += 1

    def on_active(self, iid: str) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.status != BUILD:
            return
        w = self.w
        k = w.knobs
        if k.build_failure_rate and mix(stable_int(w.seed, "build", iid)) < k.build_failure_rate:
            inst.set_status(ERROR)
            self.version += 1
            return
        inst.set_status(ACTIVE)
        self.version += 1
        w.cluster.register(inst, w.pools[inst.pool])

    def find(self, action_id: str) -> Instance | None:
        for inst in self.by_action.get(action_id, ()):
            if inst.alive:
                return inst.view
        return None

    def delete(self, iid: str, cause: str = "deleted") -> None:
        inst = self.instances.get(iid)
        if inst is None or not inst.alive:
            return
        w = self.w
        now = w.now
        inst.set_status(DELETED)
        inst.deleted_at = now
        lst = self.by_action.get(inst.action_id)
        if lst is not None:
            lst[:] = [i for i in lst if i is not inst]
            if not lst:
                del self.by_action[inst.action_id]
        self.live[inst.pool] -= 1
        self.used[0] -= 1
        self.used[1] -= inst.shape.vcpu
        self.used[2] -= inst.shape.ram_mb
        h = self.hosts.get(inst.host)
        lo, hi = w.knobs.release_bm if (h is not None and h.bm) else w.knobs.release_vm
        inst.released_at = now + keyed(w.seed, "release", iid).uniform(lo, hi)
        w.push(inst.released_at, "released", iid)
        w.stats["deleted" if cause == "deleted" else cause] += 1
        self.version += 1
        w.cluster.instance_gone(inst)
        w.provider.instance_gone(inst, cause)

    def on_released(self, iid: str) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.released:
            return
        inst.released = True
        h = self.hosts.get(inst.host)
        if h is not None:
            h.spot_v -= inst.shape.vcpu
            h.spot_m -= inst.shape.ram_mb
            h.spot_g -= inst.shape.gpus
            h.spot_n -= 1
            h.insts = [i for i in h.insts if i is not inst]
            spec = self.w.pools.get(h.pool)
            if h.bm and spec is not None and spec.cleaning_seconds:
                h.clean_until = self.w.now + spec.cleaning_seconds
                self.w.push(h.clean_until, "cleaned", h.name)
        self.version += 1

    def released(self, iid: str) -> bool:
        inst = self.instances.get(iid)
        if inst is None:
            return True
        return inst.released

    def instance_views(self) -> list[Instance]:
        return [i.view for i in self.instances.values() if i.status != DELETED]

    def alive_on(self, host: str) -> list[SimInstance]:
        h = self.hosts.get(host)
        return [i for i in h.insts if i.alive] if h is not None else []

    def purge(self, before: float) -> None:
        """Forget deleted and released instances (they answer ``released() is True`` anyway)."""
        gone = [iid for iid, i in self.instances.items() if i.released and (i.deleted_at or 0) < before]
        for iid in gone:
            del self.instances[iid]
        old = [lid for lid, lease in self.leases.items() if lease.end < before]
        for lid in old:
            self._unindex_lease(self.leases.pop(lid))
        if gone or old:
            self.version += 1

    # --- leases --------------------------------------------------------------

    def plan_slot(self, pool: PoolSpec, slot: int) -> list[float]:
        """When leases of this planning slot are created (pure: seed, pool, slot)."""
        k = self.w.knobs
        r = keyed(self.w.seed, "lease-plan", pool.name, slot)
        if pool.pool_class is PoolClass.RESERVED_IDLE:
            n = r.randint(*k.leases_per_slot_reserved)
        else:
            n = 1 if r.random() < k.lease_probability_headroom else 0
        length = k.lease_slot_seconds
        return sorted(slot * length + r.random() * length for _ in range(n))

    def create_lease(self, pool: PoolSpec, created_at: float, *key: object) -> Lease | None:
        w = self.w
        k = w.knobs
        r = keyed(w.seed, "lease", pool.name, *key)
        clean = float(pool.cleaning_seconds)
        start = created_at + r.uniform(*k.lease_start_offset) + clean
        end = start + r.uniform(*k.lease_duration)
        lo, hi = k.lease_hosts_bm if pool.kind is PoolKind.BAREMETAL else k.lease_hosts_vm
        want = r.randint(lo, hi)
        lid = uuid_from(r)
        deadline = start - clean
        guard = k.reservation_guard_seconds + k.advisory_lead_seconds
        free = []
        for h in self.hosts_by_pool.get(pool.name, ()):
            if all(not (lease.deadline - guard < end + clean and deadline - guard < lease.end + clean)
                   for lease in h.leases):
                free.append(h.name)
        if not free:
            return None
        hosts = tuple(sorted(r.sample(free, min(want, len(free)))))
        lease = Lease(lid, pool.name, hosts, start, end, created_at, clean)
        self.add_lease(lease)
        return lease

    def add_lease(self, lease: Lease) -> None:
        self.leases[lease.id] = lease
        for name in lease.hosts:
            h = self.hosts.get(name)
            if h is not None:
                h.leases.append(lease)
                h.leases.sort(key=lambda x: (x.deadline, x.id))
        self.version += 1

    def _unindex_lease(self, lease: Lease) -> None:
        for name in lease.hosts:
            h = self.hosts.get(name)
            if h is not None:
                h.leases = [x for x in h.leases if x is not lease]

    def has_upcoming(self, pool: str, now: float) -> bool:
        return any(lease.pool == pool and lease.end > now and lease.start < now + DAY
                   for lease in self.leases.values())

    def reservation_views(self, pools, start: float, end: float) -> list[Reservation]:
        names = set(pools)
        out = [lease for lease in self.leases.values()
               if lease.pool in names and lease.start < end and lease.end > start]
        out.sort(key=lambda x: (x.start, x.id))
        return [lease.view for lease in out]

    # --- persistence -----------------------------------------------------------

    def dump(self) -> dict:
        return {
            "instances": [i.dump() for i in self.instances.values()],
            "leases": [lease.dump() for lease in self.leases.values()],
            "failures": self.failures,
            "counter": self.counter,
            "lease_cursor": self.lease_cursor,
            "cleaning": {h.name: h.clean_until for h in self.hosts.values() if h.clean_until},
        }

    def load(self, d: dict) -> None:
        self.counter = d["counter"]
        self.lease_cursor = d["lease_cursor"]
        self.failures = {str(k): float(v) for k, v in d["failures"].items()}
        for name, t in d["cleaning"].items():
            if name in self.hosts:
                self.hosts[name].clean_until = t
        for row in d["leases"]:
            self.add_lease(Lease.load(row))
        for row in d["instances"]:
            self._attach(SimInstance.load(row))


class SimCloud:
    """The :class:`~spotctl.core.ports.CloudPort` of the demo region."""

    reads_reservations = True  # the simulated Blazar calendar

    def __init__(self, world: "SimWorld"):
        self._w = world

    def hosts(self, pools: dict[str, PoolSpec]) -> list[HostCapacity]:
        return self._w.fleet.host_views(pools)

    def quota(self) -> Quota:
        return self._w.fleet.quota_left()

    def reservations(self, pools: dict[str, PoolSpec], start: float, end: float) -> list[Reservation]:
        return self._w.fleet.reservation_views(pools, start, end)

    def instances(self) -> list[Instance]:
        return self._w.fleet.instance_views()

    def find_instance(self, action_id: str) -> Instance | None:
        return self._w.fleet.find(action_id)

    def create_instance(self, pool: PoolSpec, name: str, action_id: str,
                        choice: HostChoice | None = None) -> Instance:
        try:
            return self._w.fleet.create(pool, name, action_id, choice)
        finally:
            self._w.changed()

    def advance(self, instance: Instance) -> Instance:
        return instance  # the simulated cloud builds by itself: no step ever needs a call

    def delete_instance(self, instance_id: str) -> None:
        self._w.fleet.delete(instance_id)
        self._w.changed()

    def released(self, instance_id: str) -> bool:
        return self._w.fleet.released(instance_id)


def _fit_key(spec: PoolSpec, choice: HostChoice | None) -> tuple[str, float | None]:
    """Which remembered first fit a launch may start from: its pool's, for the same host choice."""
    return spec.name, None if choice is None else choice.not_before
