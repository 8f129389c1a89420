"""The embedded demo region: a simulated private cloud, provider feed and schedulers.

A :class:`SimWorld` moves on a virtual clock (:meth:`SimWorld.advance`) and
is deterministic for a seed: the same seed, region, calls and times give the
same world. It exposes the ports that ``spotctl.ops`` works through:

* ``world.cloud`` — :class:`~spotctl.core.ports.CloudPort` (hosts, quota,
  reservations, instances)
* ``world.contract`` — :class:`~spotctl.core.ports.ContractPort` (rate card,
  notices; plus ``reclaim()`` for drills)
* ``world.schedulers`` — two :class:`~spotctl.core.ports.SchedulerPort`\\ s,
  ``kubernetes`` and ``slurm``, over one shared cluster model

and :meth:`SimWorld.report` for what-if analysis (cost, demand served,
interruptions, notice handling).

Inside, timed things (boots, completions, notice deadlines, lease phases,
releases) are events on a heap, processed in time order; periodic things
(arrivals, placement, lease and surge planning) run at every step of at most
``Knobs.step_seconds``.

Over 400 lines because it is one thing: the event loop and the world's
persistence (one SQLite file, loaded and saved under the region lock) share the
clock, the heap and every part; the parts themselves live in ``cloud``,
``contract``, ``schedulers`` and ``workload``.
"""

from __future__ import annotations

import heapq
import math
from pathlib import Path

from spotctl.core import sim_report
from spotctl.core.config import RegionConfig
from spotctl.core.errors import NotFoundError, StateError, TemporaryError
from spotctl.core.models import PoolClass, Scheduler

from . import store
from .cloud import Fleet, Host, SimCloud, build_hosts
from .contract import Provider, SimContract
from .knobs import Knobs
from .rng import stable_int
from .schedulers import Cluster, SimScheduler
from .workload import Workload

STAT_KEYS = (
    "arrived", "queued_at_start", "excluded", "started", "completed", "abandoned", "withdrawn", "lost_units",
    "requeued_units", "launched", "launch_failures", "deleted", "reclaimed", "vanished", "nodes_lost_without_notice",
    "notices_hard", "notices_advisory", "notices_calendar", "notices_handled", "notices_missed",
    "surges", "reclaims", "interrupted_calendar",
    "interrupted_calendar_foreseen", "work_lost_seconds",
)


def fingerprint(region: RegionConfig, seed: int) -> str:
    """What a saved world depends on: the seed and each pool's name, kind, class and shape."""
    parts = [str(seed)]
    for name in sorted(region.pools):
        p = region.pools[name]
        parts.append(f"{name}:{p.kind.value}:{p.pool_class.value}:{p.shape.vcpu}:{p.shape.ram_mb}:{p.shape.gpus}")
    return f"{stable_int(*parts):016x}"


class SimWorld:
    """A simulated region on a virtual clock. Build with :meth:`new` or :meth:`open`."""

    def __init__(self, region: RegionConfig, start: float, seed: int, knobs: Knobs | None = None,
                 hosts: dict[str, list[Host]] | None = None):
        self.region = region
        self.pools = dict(region.pools)
        self.seed = int(seed)
        self.knobs = knobs or Knobs()
        self.start = self.now = float(start)
        self.path: Path | None = None
        self._rev = 0  # the file's revision this world was loaded from / last saved as
        self._mutated = False  # calls changed this world since it was loaded
        self._stale = False  # another process saved a newer world: stop writing
        self._shared = False  # bound to a file shared under the region lock (see shared()): writes only when held
        self._held = False  # shared: the region lock is held (between acquire() and release())
        self._tainted = False  # shared: changed while not held (refused): reload on the next acquire()
        self._knobs_for_new: Knobs | None = None  # shared: the knobs of a world created when there is none yet
        self._heap: list[tuple] = []
        self._seq = 0
        self._step = float(self.knobs.step_seconds)
        self.stats = {k: 0 for k in STAT_KEYS}
        self.cost = {p: 0.0 for p in sorted(self.pools)}
        self.node_seconds = {p: 0.0 for p in sorted(self.pools)}
        self._acc_t = self.start
        self._arrived_to = self.start
        self._last_abandon = int(self.start // 600)
        self._last_purge = int(self.start // 3600)
        self._turn = 0
        self.fleet = Fleet(self, hosts if hosts is not None else build_hosts(self.pools, self.seed, self.knobs))
        self.provider = Provider(self)
        self.cluster = Cluster(self)
        self.workload = Workload(self.pools, self.seed, self.knobs, region.policy.default_pod_seconds)
        self.cloud = SimCloud(self)
        self.contract = SimContract(self)
        self.schedulers = [SimScheduler(self, Scheduler.KUBERNETES), SimScheduler(self, Scheduler.SLURM)]
        self._handlers = self._make_handlers()

    def _make_handlers(self) -> dict:
        return {
            "active": self.fleet.on_active,
            "released": self.fleet.on_released,
            "cleaned": self._bump,
            "done": self.cluster.on_done,
            "lease_create": self._on_lease_create,
            "lease_adv": self.provider.on_lease_adv,
            "lease_hard": self.provider.on_lease_hard,
            "lease_block": self.provider.on_lease_block,
            "lease_end": self._bump,
            "hard_issue": self.provider.on_hard_issue,
            "reclaim_hard": self.provider.on_reclaim_hard,
            "deadline": self.provider.on_deadline,
            "expire": self.provider.on_expire,
            "surge": self.provider.on_surge,
        }

    # --- construction ------------------------------------------------------------

    @classmethod
    def new(cls, region: RegionConfig, start: float, seed: int | None = None, *,
            knobs: Knobs | None = None) -> "SimWorld":
        """A fresh world in memory at ``start`` (seed: ``region.seed`` unless given)."""
        world = cls(region, start, region.seed if seed is None else seed, knobs)
        world._bootstrap()
        return world

    @classmethod
    def open(cls, path: Path, region: RegionConfig, now: float, *, knobs: Knobs | None = None) -> "SimWorld":
        """The world saved in ``path`` (created at ``now`` rounded down to the minute when absent),
        advanced to ``now``. The world then saves itself after every change.

        ``knobs`` only apply when the file is created; an existing world keeps its own.
        Raises :class:`StateError` when the file is unreadable, corrupt, or was made for
        other pools or another seed. For a file that several processes share under a lock, see :meth:`shared`.
        """
        path = Path(path)
        world = cls._read(path, region)
        if world is None:
            world = cls._fresh(region, now, knobs)
            world.path = path
            world.save()
            return world
        world.advance(now)
        return world

    @classmethod
    def shared(cls, path: Path, region: RegionConfig, now: float, *, knobs: Knobs | None = None) -> "SimWorld":
        """The world saved in ``path``, for processes that share the file under one lock (the demo region's
        pass lock): every change to it is made, and saved, while that lock is held.

        Until :meth:`acquire` it is a read-only snapshot: one consistent read of the file (a fresh world in
        memory when there is none yet), advanced to ``now`` in memory and never written; so a reader (``plan``,
        ``status``) never fails nor disturbs a pass. :meth:`acquire`, called once the lock is taken, brings it
        up to the newest saved world and makes it save after every change; :meth:`release`, called before the
        lock goes, makes it read-only again. A change while the lock is not held is a bug, refused with an error.
        """
        path = Path(path)
        world = cls._read(path, region) or cls._fresh(region, now, knobs)
        world.path = path
        world._shared = True
        world._knobs_for_new = knobs
        world.advance(now)  # in memory only: not held
        return world

    @classmethod
    def _fresh(cls, region: RegionConfig, now: float, knobs: Knobs | None) -> "SimWorld":
        world = cls.new(region, math.floor(now / 60.0) * 60.0, knobs=knobs)
        world.advance(now)
        return world

    @classmethod
    def _read(cls, path: Path, region: RegionConfig) -> "SimWorld | None":
        """The world saved in ``path``, bound to it at its revision, not advanced; None when there is none yet."""
        saved = store.read(path)
        if saved is None:
            return None
        _, fp, rev, state = saved
        if fp != fingerprint(region, region.seed):
            raise StateError(
                f"simulator state file {path} was made for another region layout (its pools or seed changed)",
                hint=f"remove {path} to start a fresh simulated region", details={"file": str(path)})
        try:
            world = cls._from_state(region, state)
        except StateError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise StateError(f"simulator state file {path} is unreadable or corrupt: bad state ({e!r})",
                             hint="move the file aside (or delete it) to start a fresh simulated region",
                             details={"file": str(path)}) from None
        world.path = path
        world._rev = rev
        return world

    # --- sharing the file under the region lock ------------------------------------------

    def acquire(self, now: float) -> None:
        """The region lock was just taken: load the newest saved world (unless this one is it), move it to
        ``now`` and save after every change from here on, until :meth:`release`. A no-op for a world that is
        not :meth:`shared`."""
        if not self._shared or self._held:
            return
        path = self.path
        assert path is not None
        if self._tainted or store.revision(path) != self._rev:
            latest = type(self)._read(path, self.region)  # raises on a corrupt file: never recreated silently
            self._adopt(latest if latest is not None else type(self)._fresh(self.region, now, self._knobs_for_new))
            self._rev = latest._rev if latest is not None else 0
        self._held = True
        self._stale = self._mutated = self._tainted = False
        if self._rev == 0:
            self.save()  # the first holder creates the file
        self.advance(now)

    def release(self) -> None:
        """The region lock is about to be released: from now on read-only again. Every change made while it
        was held is already saved (each one is, at once)."""
        self._held = False

    def _adopt(self, other: "SimWorld") -> None:
        """Become ``other`` in place: the ports handed out (``cloud``, ``contract``, ``schedulers``) stay valid."""
        keep = {k: self.__dict__[k] for k in ("cloud", "contract", "schedulers", "path", "_shared", "_held",
                                               "_knobs_for_new")}
        self.__dict__.update(other.__dict__)
        self.__dict__.update(keep)
        for part in (self.fleet, self.provider, self.cluster):
            part.w = self
        self._handlers = self._make_handlers()

    def _bootstrap(self) -> None:
        """Leases already on the calendar, the surge plan, and a backlog of pending work."""
        self._plan(self.now + self._step + 60.0)
        self._arrived_to = self.now - self.knobs.backlog_seconds
        before = self.stats["arrived"]
        self._arrive(self.now)
        self.stats["queued_at_start"] += self.stats["arrived"] - before
        # Events already due (reservations taking hosts now) run before anything is placed.
        while self._heap and self._heap[0][0] <= self.now:
            _, _, kind, args = heapq.heappop(self._heap)
            self._handlers[kind](*args)

    # --- the clock -----------------------------------------------------------------

    def push(self, t: float, kind: str, *args) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (float(t), self._seq, kind, args))

    def advance(self, to: float) -> None:
        """Move the world to ``to`` in steps of at most ``step_seconds`` (more when the gap is huge)."""
        to = float(to)
        if to <= self.now:
            return
        k = self.knobs
        gap = to - self.now
        step = float(k.step_seconds)
        if gap / step > k.max_steps:
            step = float(math.ceil(gap / k.max_steps / k.step_seconds) * k.step_seconds)
        self._step = step
        t = self.now
        while t < to:
            nxt = min(to, (math.floor(t / step) + 1) * step)
            self._run_until(nxt)
            t = nxt
        self._step = float(k.step_seconds)
        self.changed(mutated=False)

    def _run_until(self, until: float) -> None:
        heap = self._heap
        handlers = self._handlers
        while heap and heap[0][0] <= until:
            t, _, kind, args = heapq.heappop(heap)
            if t > self.now:
                self._accrue(t)
                self.now = t
            handlers[kind](*args)
        self._accrue(until)
        self.now = until
        self._tick(until)

    def _tick(self, now: float) -> None:
        self._plan(now + self._step + 60.0)
        for name in sorted(self.pools):
            spec = self.pools[name]
            if spec.pool_class is PoolClass.RESERVED_IDLE and not self.fleet.has_upcoming(name, now):
                lease = self.fleet.create_lease(spec, now, "topup", int(now))
                if lease is not None:
                    self.provider.lease_created(lease)
        self._arrive(now)
        self.cluster.release_held(now)
        if int(now // 600) != self._last_abandon:
            self._last_abandon = int(now // 600)
            self.cluster.abandon(now)
        if int(now // 3600) != self._last_purge:
            self._last_purge = int(now // 3600)
            self.fleet.purge(now - 6 * 3600.0)
        order = (0, 1) if self._turn % 2 == 0 else (1, 0)
        self._turn += 1
        for s in order:
            self.cluster.place(s)

    def _plan(self, upto: float) -> None:
        """Schedule lease creations and surges of every slot that starts before ``upto``."""
        k = self.knobs
        fleet = self.fleet
        length = k.lease_slot_seconds
        if fleet.lease_cursor is None:
            longest = k.lease_start_offset[1] + k.lease_duration[1] + length
            longest += max((p.cleaning_seconds for p in self.pools.values()), default=0)
            fleet.lease_cursor = math.floor((self.now - longest) / length)
            history = True
        else:
            history = False
        while fleet.lease_cursor * length <= upto:
            slot = fleet.lease_cursor
            plans = []
            for name in sorted(self.pools):
                for i, t in enumerate(fleet.plan_slot(self.pools[name], slot)):
                    plans.append((t, name, i))
            plans.sort()
            for t, name, i in plans:
                if history and t <= self.now:
                    lease = fleet.create_lease(self.pools[name], t, slot, i)
                    if lease is not None:
                        self.provider.lease_created(lease)
                else:
                    self.push(t, "lease_create", name, slot, i)
            fleet.lease_cursor += 1
        self.provider.plan_surges(upto)

    def _on_lease_create(self, pool: str, slot: int, i: int) -> None:
        spec = self.pools.get(pool)
        if spec is None:
            return
        lease = self.fleet.create_lease(spec, self.now, slot, i)
        if lease is not None:
            self.provider.lease_created(lease)

    def _bump(self, *_: object) -> None:
        self.fleet.version += 1

    def _arrive(self, now: float) -> None:
        lo = self._arrived_to
        if now <= lo:
            return
        for m in range(math.floor(lo / 60.0), math.floor(now / 60.0) + 1):
            for a in self.workload.minute(m):
                if lo < a.at <= now:
                    self.cluster.submit(a)
        self._arrived_to = now

    def _accrue(self, t: float) -> None:
        """Cost and node-seconds of every live instance up to ``t`` at the prices in force."""
        a = self._acc_t
        if t <= a:
            return
        length = self.knobs.rate_card_seconds
        price = self.provider.price
        for pool, n in self.fleet.live.items():
            if n <= 0:
                continue
            x = a
            cost = 0.0
            while x < t:
                slot = int(x // length)
                y = min(t, (slot + 1) * length)
                cost += (y - x) * price(pool, slot)
                x = y
            self.cost[pool] = self.cost.get(pool, 0.0) + n * cost / 3600.0
            self.node_seconds[pool] = self.node_seconds.get(pool, 0.0) + n * (t - a)
        self._acc_t = t

    # --- demo and test controls --------------------------------------------------------

    def inject_launch_failures(self, pool: str, until: float) -> None:
        """``create_instance`` in ``pool`` raises CapacityError until ``until``."""
        if pool not in self.pools:
            raise NotFoundError(f"unknown pool {pool!r} in the simulated region",
                                hint=f"known pools: {', '.join(sorted(self.pools))}")
        self.fleet.failures[pool] = float(until)
        self.changed()

    def vanish(self, instance_id: str) -> None:
        """The instance disappears without notice; its running work is lost and requeued."""
        inst = self.fleet.instances.get(instance_id)
        if inst is None or not inst.alive:
            raise NotFoundError(f"no live instance {instance_id!r} in the simulated region")
        self.stats["nodes_lost_without_notice"] += 1
        self.fleet.delete(instance_id, cause="vanished")
        self.changed()

    # --- persistence ---------------------------------------------------------------

    def changed(self, mutated: bool = True) -> None:
        """Called after every change: a file-bound world saves itself (a :meth:`shared` one only while the
        region lock is held: before, an advance stays in memory and a call that changes the world is refused)."""
        if mutated:
            self._mutated = True
        if self.path is None:
            return
        if self._shared and not self._held:
            if mutated:
                self._tainted = True
                raise RuntimeError(f"the simulated world in {self.path} was changed without holding the region "
                                   "lock (a bug: every change must be made under the lock)")
            return
        self.save()

    def save(self) -> None:
        """Write the world to its file, unless another process saved a newer one since we loaded it.

        A world that was only advanced yields to the other process (its own state is re-derivable
        from the newer file); a world with calls on it raises :class:`TemporaryError` instead of
        losing either side's changes.
        """
        if self.path is None:
            raise StateError("this simulated world is not bound to a file")
        if self._stale:
            rev = None
        else:
            rev = store.write(self.path, self.region.name, fingerprint(self.region, self.seed), self.dump(),
                              self.now, self._rev)
        if rev is not None:
            self._rev = rev
            return
        self._stale = True
        if self._mutated:
            raise TemporaryError(f"simulator state file {self.path} was changed by another process",
                                 hint="retry: the next run loads the newer world", details={"file": str(self.path)})

    def dump(self) -> dict:
        return {
            "seed": self.seed, "start": self.start, "now": self.now, "knobs": self.knobs.to_dict(),
            "seq": self._seq, "heap": [[t, seq, kind, list(args)] for t, seq, kind, args in self._heap],
            "stats": self.stats, "cost": self.cost, "node_seconds": self.node_seconds, "acc_t": self._acc_t,
            "arrived_to": self._arrived_to, "last_abandon": self._last_abandon, "last_purge": self._last_purge,
            "turn": self._turn,
            "fleet": self.fleet.dump(), "provider": self.provider.dump(), "cluster": self.cluster.dump(),
        }

    @classmethod
    def _from_state(cls, region: RegionConfig, d: dict) -> "SimWorld":
        world = cls(region, d["start"], d["seed"], Knobs.from_dict(d["knobs"]))
        world.now = float(d["now"])
        world._seq = d["seq"]
        world._heap = [(float(t), seq, kind, tuple(args)) for t, seq, kind, args in d["heap"]]
        for _, _, kind, _ in world._heap:
            if kind not in world._handlers:
                raise ValueError(f"unknown event {kind!r}")
        heapq.heapify(world._heap)
        world.stats.update(d["stats"])
        world.cost.update(d["cost"])
        world.node_seconds.update(d["node_seconds"])
        world._acc_t = d["acc_t"]
        world._arrived_to = d["arrived_to"]
        world._last_abandon = d["last_abandon"]
        world._last_purge = d["last_purge"]
        world._turn = d["turn"]
        world.fleet.load(d["fleet"])
        world.provider.load(d["provider"])
        world.cluster.load(d["cluster"])
        return world

    # --- report ----------------------------------------------------------------------

    def counters(self) -> sim_report.Counters:
        """What the world counted since it began, for :mod:`spotctl.core.sim_report`."""
        st = self.stats
        cl = self.cluster
        fresh, again = cl.waiting()
        withdrawn = dict(cl.withdrawn_by)
        unrecorded = st["withdrawn"] - sum(withdrawn.values())  # worlds saved before reasons were kept
        if unrecorded > 0:
            withdrawn["reason not recorded"] = unrecorded
        return sim_report.Counters(
            arrived=st["arrived"], queued_at_start=st["queued_at_start"], excluded_at_arrival=st["excluded"],
            started=st["started"], completed=st["completed"], running=len(cl.running), requeued=again,
            pending=fresh, abandoned=st["abandoned"], abandon_after_seconds=self.knobs.abandon_after_seconds,
            held=cl.held_by_reason(), withdrawn=withdrawn,
            waits=cl.waits, requeued_runs=st["requeued_units"], lost_runs=st["lost_units"],
            nodes_lost_without_notice=st["nodes_lost_without_notice"],
            notices={k: st["notices_" + k] for k in ("hard", "advisory", "calendar")},
            hard_handled=st["notices_handled"], hard_missed=st["notices_missed"],
            hard_open=sum(1 for n in self.provider.notices.values() if n.kind == "hard"),
            cost=self.cost, node_seconds=self.node_seconds, currency=self.region.policy.currency)

    def report(self) -> dict:
        """What happened since the world began: cost, demand served, interruptions, notices. Each figure is
        defined in :mod:`spotctl.core.sim_report` (and how they add up: see its docstring)."""
        st = self.stats
        c = self.counters()
        return {
            "region": self.region.name,
            "start": self.start,
            "end": self.now,
            "hours": round((self.now - self.start) / 3600.0, 4),
            "seed": self.seed,
            "cost": sim_report.cost(c),
            "demand": sim_report.demand(c),
            "wait_seconds": sim_report.waits(c),
            "interruptions": sim_report.interruptions(c),
            "notices": sim_report.notices(c),
            "instances": {
                "launched": st["launched"],
                "launch_failures": st["launch_failures"],
                "deleted": st["deleted"],
                "reclaimed": st["reclaimed"],
                "vanished": st["vanished"],
                "live": sum(self.fleet.live.values()),
            },
            "node_hours": sim_report.node_hours(c),
        }

    def __repr__(self) -> str:
        return f"<SimWorld {self.region.name} seed={self.seed} now={self.now:.0f}>"

