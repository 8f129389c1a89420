"""The simulated cluster behind the Kubernetes and Slurm ports.

One cluster model, two scheduler views: a node is one machine that both
schedulers know (a Kubernetes node with the pool's labels and taints, a Slurm
node in the pool's partition with its features). Each scheduler places its
own units on it (priority, then submit time) and keeps its own cordon/drain
flags, so draining in one scheduler and not the other is observable: only the
scheduler that cordoned a node stops placing its units there.

Over 400 lines because it is one thing: :class:`Cluster` is a single model
whose placement, drain and persistence share every field; splitting it would
spread one invariant (a unit runs on at most one node, in one scheduler's view)
across files.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import TYPE_CHECKING

from spotctl.core.errors import NotFoundError
from spotctl.core.models import DrainProgress, Exclusion, NodeUsage, PoolSpec, Scheduler, Shape, WorkUnit

from .rng import mix, stable_int
from .workload import BEGIN, DEPENDENCY, Arrival

if TYPE_CHECKING:  # pragma: no cover
    from .cloud import SimInstance
    from .world import SimWorld

SCHEDULERS = (Scheduler.KUBERNETES, Scheduler.SLURM)
MAX_WAITS = 20000  # wait times kept for the report's percentiles (the most recent starts)
_IDX = {Scheduler.KUBERNETES: 0, Scheduler.SLURM: 1}


def _ckey(u: WorkUnit) -> tuple:
    """What decides where a unit can go: its requirements and its size."""
    return (u.partition, u.features, u.node_selector, u.tolerations, u.shape)


def _order(u: WorkUnit) -> tuple:
    return (-u.priority, u.submitted_at, u.id)


#: an interruption on a host whose reservation starts within this many seconds counts as a calendar reclaim
CALENDAR_CAUSE_SECONDS = 7200.0


class Run:
    __slots__ = ("unit", "node", "s", "started_at", "end_at", "token")

    def __init__(self, unit: WorkUnit, node: str, s: int, started_at: float, end_at: float, token: int):
        self.unit = unit
        self.node = node
        self.s = s
        self.started_at = started_at
        self.end_at = end_at
        self.token = token


class Node:
    """One machine, known to both schedulers. Per-scheduler flags are bit ``s`` of ``reg``/``cordoned``;
    ``times`` is ``[drained_at k8s, drained_at slurm, last_busy k8s, last_busy slurm]`` (compact: there
    may be tens of thousands of nodes)."""

    __slots__ = ("name", "pool", "instance_id", "cap", "used_v", "used_m", "used_g", "up", "registered_at",
                 "reg", "cordoned", "times", "runs", "until", "closed", "sums")

    def __init__(self, name: str, pool: str, instance_id: str, cap: Shape, registered_at: float):
        self.name = name
        self.pool = pool
        self.instance_id = instance_id
        self.cap = cap
        self.used_v = self.used_m = self.used_g = 0
        self.up = True
        self.registered_at = registered_at
        self.reg = 3
        self.cordoned = 0
        self.times: list = [None, None, registered_at, registered_at]
        self.runs: list[Run] = []
        self.until: list = [None, None]  # per scheduler: work must end by then (SchedulerPort.protect)
        self.closed = 0  # per scheduler bit: no new work at all (the window is too short for any)
        # per scheduler: (what its runs here use, how many, the youngest one's start), or None when a run came
        # or went since it was summed (usage() sums a node's runs again only then)
        self.sums: list = [None, None]

    def registered(self, s: int) -> bool:
        return bool(self.reg >> s & 1)

    def fits(self, s: Shape) -> bool:
        cap = self.cap
        return (self.used_v + s.vcpu <= cap.vcpu and self.used_m + s.ram_mb <= cap.ram_mb
                and self.used_g + s.gpus <= cap.gpus)


class Held:
    """A unit that is pending but not demand, for a while (then it becomes pending or goes away)."""

    __slots__ = ("unit", "reason", "until", "then", "view")

    def __init__(self, unit: WorkUnit, reason: str, until: float, then: str):
        self.unit = unit
        self.reason = reason
        self.until = until
        self.then = then  # "pending" | "drop"
        self.view = Exclusion(unit_id=unit.id, scheduler=unit.scheduler, reason=reason)


class Interner:
    """Shares the few distinct tuples and shapes among many units (memory, speed)."""

    def __init__(self):
        self._d: dict = {}

    def __call__(self, x):
        return self._d.setdefault(x, x)


def unit_dump(u: WorkUnit) -> list:
    return [u.id, _IDX[u.scheduler], u.shape.vcpu, u.shape.ram_mb, u.shape.gpus, u.priority, u.expected_seconds,
            u.submitted_at, u.partition, list(u.features), [list(kv) for kv in u.node_selector],
            list(u.tolerations)]


def unit_load(d: list, intern: Interner) -> WorkUnit:
    return WorkUnit(id=d[0], scheduler=SCHEDULERS[d[1]], shape=intern(Shape(d[2], d[3], d[4])), priority=d[5],
                    expected_seconds=d[6], submitted_at=d[7], partition=d[8], features=intern(tuple(d[9])),
                    node_selector=intern(tuple(tuple(kv) for kv in d[10])), tolerations=intern(tuple(d[11])))


class Cluster:
    def __init__(self, world: "SimWorld"):
        self.w = world
        self.nodes: dict[str, Node] = {}
        self._node_list: list[Node] | None = None
        self.pending: tuple[list[WorkUnit], list[WorkUnit]] = ([], [])
        self._gone: tuple[set[str], set[str]] = (set(), set())
        self.classes: tuple[dict, dict] = ({}, {})
        self.held: tuple[list[Held], list[Held]] = ([], [])
        self.running: dict[str, Run] = {}
        self.started: set[str] = set()  # started at least once and not finished
        self.withdrawn_by: dict[str, int] = {}  # units withdrawn while held, by the hold's reason
        self.waits: list[float] = []
        self.tokens = 0
        self.counters = {"pod": 0, "job": 4700}
        self.known: set[str] = set()
        self.version = 0
        self.pversion = [0, 0]
        self.intern = Interner()
        self._serving: dict[tuple, tuple[str, ...]] = {}
        self._usage: list = [None, None]
        self._pcache: list = [None, None]

    # --- pending work ----------------------------------------------------------

    def submit(self, a: Arrival) -> WorkUnit:
        t = a.template
        if t.scheduler is Scheduler.KUBERNETES:
            self.counters["pod"] += 1
            uid = f"{t.prefix}-{self.counters['pod']:06d}"
        else:
            self.counters["job"] += 1
            uid = f"slurm/{self.counters['job']}"
        it = self.intern
        unit = WorkUnit(id=uid, scheduler=t.scheduler, shape=it(a.shape), priority=a.priority,
                        expected_seconds=a.expected, submitted_at=a.at, partition=t.partition,
                        features=t.features, node_selector=t.node_selector, tolerations=t.tolerations)
        stats = self.w.stats
        stats["arrived"] += 1
        if a.excluded:
            stats["excluded"] += 1
            then = "pending" if a.excluded in (BEGIN, DEPENDENCY) else "drop"
            self.hold(Held(unit, a.excluded, a.at + a.excluded_for, then))
        else:
            self.add_pending(unit)
        return unit

    def hold(self, h: Held) -> None:
        self.held[_IDX[h.unit.scheduler]].append(h)
        self.pversion[_IDX[h.unit.scheduler]] += 1

    # Each scheduler's pending list is kept sorted (priority, then submit time, then id): arrivals
    # and requeued units are inserted in place; placed units are only marked gone and compacted
    # away in bulk, so a step costs O(placements · log n) rather than O(n).

    def add_pending(self, unit: WorkUnit) -> None:
        s = _IDX[unit.scheduler]
        gone = self._gone[s]
        if unit.id in gone:
            gone.discard(unit.id)  # placed and requeued before compaction: its entry is still there
        else:
            bisect.insort(self.pending[s], unit, key=_order)
        key = _ckey(unit)
        c = self.classes[s]
        c[key] = c.get(key, 0) + 1
        self.pversion[s] += 1

    def set_pending(self, s: int, units: list[WorkUnit], presorted: bool = False) -> None:
        """Replace a scheduler's pending list wholesale (bulk builds)."""
        if not presorted:
            units = sorted(units, key=_order)
        self.pending[s][:] = units
        self._gone[s].clear()
        c: dict = {}
        for u in units:
            key = _ckey(u)
            c[key] = c.get(key, 0) + 1
        self.classes[s].clear()
        self.classes[s].update(c)
        self.pversion[s] += 1

    def _take(self, s: int, units: list[WorkUnit]) -> None:
        """Units leave the pending list (placed, abandoned)."""
        c = self.classes[s]
        gone = self._gone[s]
        for u in units:
            gone.add(u.id)
            key = _ckey(u)
            n = c[key] - 1
            if n:
                c[key] = n
            else:
                del c[key]
        self.pversion[s] += 1

    def _compact(self, s: int) -> list[WorkUnit]:
        pend = self.pending[s]
        gone = self._gone[s]
        if gone:
            pend[:] = [u for u in pend if u.id not in gone]
            gone.clear()
        return pend

    def pending_count(self, s: int) -> int:
        return len(self.pending[s]) - len(self._gone[s])

    def waiting(self) -> tuple[int, int]:
        """Units waiting in both schedulers' queues: (never started, started before and requeued)."""
        fresh = again = 0
        started = self.started
        for s in (0, 1):
            gone = self._gone[s]
            for u in self.pending[s]:
                if u.id in gone:
                    continue
                if u.id in started:
                    again += 1
                else:
                    fresh += 1
        return fresh, again

    def held_by_reason(self) -> dict[str, int]:
        """Units held (pending but not demand) right now, by reason."""
        out: dict[str, int] = {}
        for s in (0, 1):
            for h in self.held[s]:
                out[h.reason] = out.get(h.reason, 0) + 1
        return out

    def release_held(self, now: float) -> None:
        for s in (0, 1):
            held = self.held[s]
            if not held or min(h.until for h in held) > now:
                continue
            keep = []
            for h in held:
                if h.until > now:
                    keep.append(h)
                elif h.then == "pending":
                    self.add_pending(dataclasses.replace(h.unit, submitted_at=h.until))
                else:
                    self.w.stats["withdrawn"] += 1
                    self.withdrawn_by[h.reason] = self.withdrawn_by.get(h.reason, 0) + 1
            held[:] = keep
            self.pversion[s] += 1

    def abandon(self, now: float) -> None:
        """Work that never started within ``abandon_after_seconds`` goes elsewhere."""
        cutoff = now - self.w.knobs.abandon_after_seconds
        for s in (0, 1):
            old = [u for u in self._compact(s) if u.submitted_at < cutoff and u.id not in self.started]
            if old:
                self._take(s, old)
                self._compact(s)
                self.w.stats["abandoned"] += len(old)

    # --- placement ---------------------------------------------------------------

    def node_list(self) -> list[Node]:
        if self._node_list is None:
            self._node_list = sorted(self.nodes.values(), key=lambda n: n.name)
        return self._node_list

    def serving(self, unit: WorkUnit) -> tuple[str, ...]:
        key = (unit.scheduler, unit.partition, unit.features, unit.node_selector, unit.tolerations)
        pools = self._serving.get(key)
        if pools is None:
            pools = self._serving[key] = tuple(n for n in sorted(self.w.pools) if self.w.pools[n].serves(unit))
        return pools

    def place(self, s: int) -> None:
        pend = self.pending[s]
        if len(pend) <= len(self._gone[s]):
            return
        bit = 1 << s
        cands: dict[str, list[Node]] = {}
        windowed: dict[str, list[Node]] = {}  # protected nodes (few): a unit goes there only if it ends in time
        for node in self.node_list():
            if node.up and node.reg & bit and not node.cordoned & bit and not node.closed & bit \
                    and node.used_v < node.cap.vcpu:
                # Kubernetes knows no durations: only the taint (closed) keeps work off; Slurm checks time limits
                timed = node.until[s] is not None and s == _IDX[Scheduler.SLURM]
                (windowed if timed else cands).setdefault(node.pool, []).append(node)
        if not cands and not windowed:
            return
        now = self.w.now
        gone = self._gone[s]
        if len(gone) * 4 > len(pend):
            pend = self._compact(s)
        classes = len(self.classes[s])
        failed: set = set()
        placed: list[WorkUnit] = []
        # First fit in name order. Within a pass, free capacity only shrinks, so a node that could not
        # take a unit of some class cannot take a later one of the same class: resume from a cursor.
        cursor: dict[tuple, int] = {}
        depth = self.w.knobs.queue_depth
        for unit in pend:
            if unit.id in gone:
                continue
            depth -= 1
            if depth < 0:
                break
            key = _ckey(unit)
            if key in failed:
                continue
            target = None
            sh = unit.shape
            v, m, g = sh.vcpu, sh.ram_mb, sh.gpus
            for pool in self.serving(unit):
                nodes = cands.get(pool)
                if not nodes:
                    continue
                ck = (key, pool)
                i = cursor.get(ck, 0)
                n = len(nodes)
                while i < n:
                    node = nodes[i]
                    cap = node.cap
                    if (node.used_v + v <= cap.vcpu and node.used_m + m <= cap.ram_mb
                            and node.used_g + g <= cap.gpus):
                        target = node
                        break
                    i += 1
                cursor[ck] = i
                if target is not None:
                    break
            if target is None and windowed:
                # as Slurm does with a maintenance reservation: no job whose time limit crosses its start
                target = next((node for pool in self.serving(unit) for node in windowed.get(pool, ())
                               if now + unit.expected_seconds <= node.until[s] and node.fits(sh)), None)
            if target is None:
                failed.add(key)
                if len(failed) >= classes:
                    break
                continue
            self._start(unit, target, s)
            placed.append(unit)
        if placed:
            self._take(s, placed)

    def _start(self, unit: WorkUnit, node: Node, s: int) -> None:
        w = self.w
        now = w.now
        lo, hi = w.knobs.run_fraction
        frac = lo + (hi - lo) * mix(stable_int(w.seed, "run", unit.id), int(now))
        end = now + max(60.0, round(unit.expected_seconds * frac))
        self.tokens += 1
        run = Run(unit, node.name, s, now, end, self.tokens)
        self._attach_run(run, node)
        node.times[2 + s] = now
        if unit.id not in self.started:
            self.started.add(unit.id)
            self.waits.append(round(now - unit.submitted_at, 3))
            if len(self.waits) > MAX_WAITS + MAX_WAITS // 4:
                del self.waits[:-MAX_WAITS]  # bounded: percentiles over the most recent starts
            w.stats["started"] += 1
        w.push(end, "done", unit.id, run.token)
        self.version += 1

    def _attach_run(self, run: Run, node: Node) -> None:
        sh = run.unit.shape
        node.runs.append(run)
        node.sums[run.s] = None
        node.used_v += sh.vcpu
        node.used_m += sh.ram_mb
        node.used_g += sh.gpus
        self.running[run.unit.id] = run

    def _detach_run(self, run: Run) -> None:
        node = self.nodes.get(run.node)
        if node is not None and run in node.runs:
            sh = run.unit.shape
            node.runs.remove(run)
            node.sums[run.s] = None
            node.used_v -= sh.vcpu
            node.used_m -= sh.ram_mb
            node.used_g -= sh.gpus
            node.times[2 + run.s] = self.w.now
        self.running.pop(run.unit.id, None)
        self.version += 1

    def on_done(self, uid: str, token: int) -> None:
        run = self.running.get(uid)
        if run is None or run.token != token:
            return
        self._detach_run(run)
        self.started.discard(uid)
        self.w.stats["completed"] += 1

    def _interrupt(self, run: Run, lost: bool) -> None:
        self._detach_run(run)
        self.add_pending(run.unit)
        stats = self.w.stats
        stats["lost_units" if lost else "requeued_units"] += 1
        # what the interruption cost: the run's progress (no checkpoints in the model), and whether a
        # reservation taking its node's host was the cause (the planner-quality benchmark reads both)
        stats["work_lost_seconds"] += max(0, round(self.w.now - run.started_at))
        cause = self._calendar_cause(run)
        if cause:
            stats["interrupted_calendar"] += 1
            if cause == "foreseen":
                stats["interrupted_calendar_foreseen"] += 1

    def _calendar_cause(self, run: Run) -> str:
        """Whether the run's node's host is about to be (or was just) taken by a reservation: a lease's deadline
        within :data:`CALENDAR_CAUSE_SECONDS` ahead, or passed and the lease not over: ``foreseen`` when the
        lease was made before the run started (the calendar showed it), ``late`` when after; '' when not."""
        node = self.nodes.get(run.node)
        fleet = self.w.fleet
        inst = fleet.instances.get(node.instance_id) if node is not None else None
        host = fleet.hosts.get(inst.host) if inst is not None else None
        now = self.w.now
        cause = ""
        for lease in host.leases if host is not None else ():
            if lease.deadline - CALENDAR_CAUSE_SECONDS <= now < lease.end:
                if lease.created_at <= run.started_at:
                    return "foreseen"
                cause = "late"
        return cause

    # --- nodes -----------------------------------------------------------------

    def register(self, inst: "SimInstance", spec: PoolSpec) -> None:
        old = self.nodes.get(inst.name)
        if old is not None:
            for run in list(old.runs):
                self._interrupt(run, lost=True)
        self.nodes[inst.name] = Node(inst.name, spec.name, inst.id, spec.shape, self.w.now)
        self.known.add(inst.name)
        self._node_list = None
        self.version += 1

    def instance_gone(self, inst: "SimInstance") -> None:
        node = self.nodes.get(inst.name)
        if node is None or node.instance_id != inst.id or not node.up:
            return
        node.up = False
        for run in sorted(node.runs, key=lambda r: r.unit.id):
            self._interrupt(run, lost=True)
        self.version += 1

    def drained_everywhere(self, name: str, instance_id: str, deadline: float | None) -> bool:
        node = self.nodes.get(name)
        if node is None or node.instance_id != instance_id:
            return True  # never registered, or forgotten in both: nothing of ours runs there
        limit = float("inf") if deadline is None else deadline
        return all((not node.registered(s)) or (node.times[s] is not None and node.times[s] <= limit)
                   for s in (0, 1))

    def _get(self, s: int, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None or not node.registered(s):
            raise NotFoundError(f"{SCHEDULERS[s].value}: no node named {name!r}")
        return node

    def cordon(self, s: int, name: str, reason: str) -> None:
        node = self._get(s, name)
        node.cordoned |= 1 << s
        self.version += 1

    def drain(self, s: int, name: str, reason: str, deadline: float | None) -> DrainProgress:
        node = self._get(s, name)
        node.cordoned |= 1 << s
        if node.times[s] is None:
            node.times[s] = self.w.now
        runs = sorted((r for r in node.runs if r.s == s), key=lambda r: r.unit.id)
        for run in runs:
            self._interrupt(run, lost=False)  # the simulated work leaves at once (requeued, not lost)
        self.version += 1
        left = sum(1 for r in node.runs if r.s == s)
        return DrainProgress(scheduler=SCHEDULERS[s].value, remaining=left, moved=len(runs))

    def protect(self, s: int, name: str, until: float | None, closed: bool) -> None:
        node = self._get(s, name)
        node.until[s] = until
        node.closed = node.closed | (1 << s) if closed and until is not None else node.closed & ~(1 << s)
        self.version += 1

    def resume(self, s: int, name: str) -> None:
        node = self._get(s, name)
        node.cordoned &= ~(1 << s)
        node.times[s] = None
        self.version += 1

    def forget(self, s: int, name: str, reason: str) -> None:
        node = self.nodes.get(name)
        if node is None or not node.registered(s):
            return  # never known, or already forgotten: either way it is not there (as with the real adapters)
        for run in sorted((r for r in node.runs if r.s == s), key=lambda r: r.unit.id):
            self._interrupt(run, lost=True)
        node.reg &= ~(1 << s)
        if not node.reg:
            del self.nodes[name]
            self._node_list = None
        self.version += 1

    # --- port views ------------------------------------------------------------

    def usage(self, s: int) -> list[NodeUsage]:
        now = self.w.now
        key = (now, self.version)
        cached = self._usage[s]
        if cached is not None and cached[0] == key:
            return list(cached[1])
        sched = SCHEDULERS[s]
        out = []
        bit = 1 << s
        for node in self.node_list():
            if not node.reg & bit:
                continue
            sums = node.sums[s]
            if sums is None:  # a run came or went since the last sum: sum this node's runs again
                v = m = g = n = 0
                started: float | None = None  # the youngest run's start
                for run in node.runs:
                    if run.s == s:
                        sh = run.unit.shape
                        v += sh.vcpu
                        m += sh.ram_mb
                        g += sh.gpus
                        n += 1
                        if started is None or run.started_at > started:
                            started = run.started_at
                sums = node.sums[s] = (Shape(v, m, g), n, started)
            used, n, started = sums
            # (node, scheduler, used, running, cordoned, last_busy_at, work_started_at), by position: 20k a call
            out.append(NodeUsage(node.name, sched, used, n, bool(node.cordoned & bit), now if n else node.times[2 + s],
                                 started))
        self._usage[s] = (key, out)
        return list(out)

    def pending_view(self, s: int, pools: dict[str, PoolSpec]) -> tuple[list[WorkUnit], list[Exclusion]]:
        sig = tuple(sorted(pools.items()))
        cached = self._pcache[s]
        if cached is not None and cached[0] == self.pversion[s] and cached[1] == sig:
            return list(cached[2]), list(cached[3])
        pend = self._compact(s)
        verdict: dict[tuple, str | None] = {}
        for key in self.classes[s]:
            rk = key[:4]
            if rk not in verdict:
                probe = WorkUnit(id="", scheduler=SCHEDULERS[s], shape=key[4], partition=rk[0], features=rk[1],
                                 node_selector=rk[2], tolerations=rk[3])
                verdict[rk] = None if any(p.serves(probe) for p in pools.values()) else _unserved(probe, pools)
        excl = [h.view for h in self.held[s]]
        if all(v is None for v in verdict.values()):
            demand = list(pend)
        else:
            demand = []
            for u in pend:
                why = verdict[_ckey(u)[:4]]
                if why is None:
                    demand.append(u)
                else:
                    excl.append(Exclusion(unit_id=u.id, scheduler=u.scheduler, reason=why))
        self._pcache[s] = (self.pversion[s], sig, demand, excl)
        return list(demand), list(excl)

    # --- persistence -----------------------------------------------------------

    def dump(self) -> dict:
        nodes = []
        for node in self.node_list():
            nodes.append([node.name, node.pool, node.instance_id, node.cap.vcpu, node.cap.ram_mb, node.cap.gpus,
                          node.up, node.registered_at, node.reg, node.cordoned, node.times,
                          [[unit_dump(r.unit), r.s, r.started_at, r.end_at, r.token]
                           for r in sorted(node.runs, key=lambda r: r.unit.id)], node.until, node.closed])
        return {
            "nodes": nodes,
            "pending": [[unit_dump(u) for u in self._compact(s)] for s in (0, 1)],
            "held": [[[unit_dump(h.unit), h.reason, h.until, h.then] for h in self.held[s]] for s in (0, 1)],
            "started": sorted(self.started),
            "withdrawn_by": dict(sorted(self.withdrawn_by.items())),
            "waits": self.waits,
            "tokens": self.tokens,
            "counters": self.counters,
            "known": sorted(self.known),
        }

    def load(self, d: dict) -> None:
        it = self.intern
        for row in d["nodes"]:
            (name, pool, iid, v, m, g, up, reg_at, reg, cordoned, times, runs) = row[:12]
            node = Node(name, pool, iid, it(Shape(v, m, g)), reg_at)
            node.up, node.reg, node.cordoned, node.times = up, reg, cordoned, list(times)
            if len(row) > 12:  # saved before protect() existed: unprotected
                node.until, node.closed = list(row[12]), row[13]
            self.nodes[name] = node
            for ud, s, started, end, token in runs:
                self._attach_run(Run(unit_load(ud, it), name, s, started, end, token), node)
        self._node_list = None
        for s in (0, 1):
            self.set_pending(s, [unit_load(x, it) for x in d["pending"][s]])
            self.held[s][:] = [Held(unit_load(u, it), reason, until, then) for u, reason, until, then in d["held"][s]]
        self.started = set(d["started"])
        self.withdrawn_by = dict(d.get("withdrawn_by", {}))  # absent in files saved before it was kept
        self.waits = list(d["waits"])
        self.tokens = d["tokens"]
        self.counters = dict(d["counters"])
        self.known = set(d["known"])
        self.version += 1


def _unserved(u: WorkUnit, pools: dict[str, PoolSpec]) -> str:
    if u.scheduler is Scheduler.SLURM:
        parts = {p.slurm.partition for p in pools.values() if p.slurm.partition}
        if u.partition and u.partition not in parts:
            return f"partition {u.partition} is not a spot partition"
        return "no spot pool has the requested features"
    tol = set(u.tolerations)
    if not any(p.kubernetes.taint_keys <= tol for p in pools.values()):
        return "does not tolerate the spot taint"
    return "no spot pool matches its node selector"


class SimScheduler:
    """A :class:`~spotctl.core.ports.SchedulerPort` over the shared cluster model."""

    def __init__(self, world: "SimWorld", scheduler: Scheduler):
        self._w = world
        self._s = _IDX[scheduler]
        self.name = scheduler.value
        self.scheduler = scheduler

    def __repr__(self) -> str:
        return f"<SimScheduler {self.name}>"

    def pending(self, pools: dict[str, PoolSpec]) -> tuple[list[WorkUnit], list[Exclusion]]:
        return self._w.cluster.pending_view(self._s, pools)

    def usage(self) -> list[NodeUsage]:
        return self._w.cluster.usage(self._s)

    def cordon(self, node: str, reason: str) -> None:
        self._w.cluster.cordon(self._s, node, reason)
        self._w.changed()

    def drain(self, node: str, reason: str, deadline: float | None, force: bool = False) -> DrainProgress:
        out = self._w.cluster.drain(self._s, node, reason, deadline)
        self._w.changed()
        return out

    def protect(self, node: str, until: float | None, closed: bool = False) -> None:
        self._w.cluster.protect(self._s, node, until, closed)
        self._w.changed()

    def resume(self, node: str) -> None:
        self._w.cluster.resume(self._s, node)
        self._w.changed()

    def forget(self, node: str, reason: str) -> None:
        self._w.cluster.forget(self._s, node, reason)
        self._w.changed()
