"""A large synthetic region for benchmarks: ~12 pools over 3 AZs, thousands of hosts.

``generated_region(20000, 200000)`` builds, in well under two seconds, a world
with 20 000 ACTIVE spot nodes (most of them busy, some idle) registered in both
schedulers, plus 200 000 pending work units — all prebuilt, so that the port
calls only walk lists.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import random
from operator import attrgetter

from spotctl.core.config import BudgetConfig, Policy, RegionConfig
from spotctl.core.models import (
    KubernetesBinding,
    PoolClass,
    PoolKind,
    PoolSpec,
    Scheduler,
    Shape,
    SlurmBinding,
    WorkUnit,
)

from .cloud import ACTIVE, Host, SimInstance
from .knobs import Knobs
from .rng import stable_int, uuid_from
from .schedulers import Held, Node, Run
from .workload import DEPENDENCY, HELD, NOT_TOLERATING
from .world import SimWorld

GEN_START = 1_767_261_600.0  # 2026-01-01T10:00:00Z: a fixed, busy time of day

_SPOT = ("spot=true:NoSchedule",)
_GPU = ("spot=true:NoSchedule", "nvidia.com/gpu=present:NoSchedule")

# name, kind, class, az, shape, label, partition, features, weight (share of nodes), nodes per host
_LAYOUT = (
    ("gp-az1", "vm", "headroom", "az1", (8, 32768, 0), "gp", "spot", ("gp",), 14, 10),
    ("gp-az2", "vm", "headroom", "az2", (8, 32768, 0), "gp", "spot", ("gp",), 14, 10),
    ("gp-az3", "vm", "headroom", "az3", (8, 32768, 0), "gp", "spot", ("gp",), 14, 10),
    ("gp-rsv-az1", "vm", "reserved-idle", "az1", (8, 32768, 0), "gp", "spot", ("gp",), 8, 10),
    ("gp-rsv-az2", "vm", "reserved-idle", "az2", (8, 32768, 0), "gp", "spot", ("gp",), 8, 10),
    ("gp-rsv-az3", "vm", "reserved-idle", "az3", (8, 32768, 0), "gp", "spot", ("gp",), 8, 10),
    ("mem-az1", "vm", "headroom", "az1", (16, 131072, 0), "mem", "spot", ("gp", "highmem"), 7, 6),
    ("mem-az2", "vm", "reserved-idle", "az2", (16, 131072, 0), "mem", "spot", ("gp", "highmem"), 7, 6),
    ("cpu-az3", "vm", "headroom", "az3", (32, 65536, 0), "cpu", "spot", ("cpu",), 6, 3),
    ("bm-cpu-az1", "baremetal", "headroom", "az1", (64, 524288, 0), "bm", "spot-bm", ("bm", "gp"), 3, 1),
    ("bm-cpu-az2", "baremetal", "reserved-idle", "az2", (64, 524288, 0), "bm", "spot-bm", ("bm", "gp"), 3, 1),
    ("bm-gpu-az3", "baremetal", "reserved-idle", "az3", (32, 262144, 4), "gpu", "spot-gpu", ("gpu", "a100"), 2, 1),
)


def _region(nodes: int, seed: int) -> tuple[RegionConfig, dict[str, int], dict[str, int]]:
    total_w = sum(row[8] for row in _LAYOUT)
    counts = {row[0]: nodes * row[8] // total_w for row in _LAYOUT}
    counts[_LAYOUT[0][0]] += nodes - sum(counts.values())
    per_host = {row[0]: row[9] for row in _LAYOUT}
    pools = {}
    for name, kind, cls, az, (v, m, g), label, part, feats, _, _ in _LAYOUT:
        bm = kind == "baremetal"
        pools[name] = PoolSpec(
            name=name, kind=PoolKind(kind), pool_class=PoolClass(cls), az=az, shape=Shape(v, m, g),
            flavor=f"spot.{label}.{v}x{m // 1024}", resource_class=f"baremetal.{label}" if bm else None,
            max_nodes=int(counts[name] * 1.5) + 10,
            kubernetes=KubernetesBinding(labels=(("spot.pool", label),), taints=_GPU if g else _SPOT),
            slurm=SlurmBinding(partition=part, features=feats),
            boot_seconds=600 if bm else 90, cleaning_seconds=900 if bm else 0)
    region = RegionConfig(name="generated", backend="sim", pools=pools, budget=BudgetConfig(rate=20.0, burst=500),
                          policy=Policy(spend_cap_per_hour=None, max_launches_per_pass=500), seed=seed)
    return region, counts, per_host


def generated_pools(nodes: int, seed: int = 1) -> dict[str, PoolSpec]:
    """The pools of ``generated_region(nodes, ...)``, without building its world."""
    return _region(max(0, int(nodes)), seed)[0].pools


def _hosts(region: RegionConfig, counts: dict[str, int], per_host: dict[str, int], r: random.Random):
    out: dict[str, list[Host]] = {}
    for name in sorted(region.pools):
        p = region.pools[name]
        need = counts[name]
        if p.kind is PoolKind.BAREMETAL:
            n = int(need * 1.2) + 2
            out[name] = [Host(f"{name}-node{i + 1:05d}", name, True, p.shape, r.uniform(0.05, 0.2), 1.0)
                         for i in range(n)]
        else:
            n = math.ceil(need / per_host[name] * 1.25) + 2
            cap = Shape(128, 1024 * 1024 if p.shape.ram_mb > 65536 else 512 * 1024, 0)
            out[name] = [Host(f"{name}-hv{i + 1:05d}", name, False, cap, r.uniform(0.1, 0.3), r.uniform(0.9, 1.1))
                         for i in range(n)]
    return out


def generated_region(nodes: int, pending: int, seed: int = 1, *,
                     start: float = GEN_START) -> tuple[RegionConfig, SimWorld]:
    """A synthetic region with ``nodes`` ACTIVE spot nodes and ``pending`` pending units."""
    region, counts, per_host = _region(max(0, int(nodes)), seed)
    r = random.Random(stable_int(seed, "generated", nodes, pending))
    knobs = Knobs(quota_instances=None, quota_vcpu=None, quota_ram_mb=None, backlog_seconds=0.0,
                  arrivals_per_hour=max(40.0, pending / 20.0))
    world = SimWorld(region, start, seed, knobs, hosts=_hosts(region, counts, per_host, r))
    world._bootstrap()  # leases on the calendar, surge plan (no backlog: the backlog is built below)
    fleet, cluster, now = world.fleet, world.cluster, world.now
    templates = world.workload.templates

    # -- instances and nodes, first-fit over hosts that no lease is about to take --------------
    guard = knobs.reservation_guard_seconds
    seq = 0
    heap = world._heap
    pool_templates = {}
    for name in sorted(region.pools):
        spec = region.pools[name]
        probe = {t: WorkUnit(id="", scheduler=t.scheduler, shape=Shape(), partition=t.partition,
                             features=t.features, node_selector=t.node_selector, tolerations=t.tolerations)
                 for t in templates}
        pool_templates[name] = [t for t in templates if spec.serves(probe[t])]
        left = counts[name]
        cap_per_host = per_host[name]
        for h in fleet.hosts_by_pool[name]:
            if left <= 0:
                break
            if fleet.blocked(h, now, guard + knobs.advisory_lead_seconds):
                continue
            for _ in range(min(cap_per_host, left)):
                seq += 1
                created = now - 600.0 - r.random() * 6 * 3600.0
                inst = SimInstance(uuid_from(r), f"spot-{name}-{seq:06d}", name, h.name, f"gen-{seq:06d}",
                                   spec.shape, created, created + spec.boot_seconds, ACTIVE)
                fleet._attach(inst)
                node = Node(inst.name, name, inst.id, spec.shape, inst.active_at)
                cluster.nodes[inst.name] = node
                cluster.known.add(inst.name)
                left -= 1
        world.stats["launched"] += counts[name] - left

    # -- running work: most nodes busy (1-3 units), some idle -------------------------------------
    stats = world.stats
    pods = jobs = 0
    tokens = cluster.tokens
    seconds: dict[int, float] = {}  # shared float objects for whole-second times (memory)

    def at(x: float) -> float:
        i = int(x)
        f = seconds.get(i)
        if f is None:
            f = seconds[i] = float(i)
        return f

    for node in sorted(cluster.nodes.values(), key=lambda n: n.name):
        if r.random() < 0.12:
            idle = at(now - r.random() * 1800.0)  # idle for a while
            node.times[2] = node.times[3] = idle
            continue
        choices = pool_templates[node.pool]
        if not choices:
            continue
        for _ in range(r.randint(1, 3)):
            t = choices[int(r.random() * len(choices))]
            shape = t.shapes[int(r.random() * len(t.shapes))]
            if not node.fits(shape):
                break
            expected = t.limits[int(r.random() * len(t.limits))]
            started = at(now - r.random() * 0.5 * expected)
            if t.scheduler is Scheduler.KUBERNETES:
                pods += 1
                uid = f"{t.prefix}-r{pods:07d}"
            else:
                jobs += 1
                uid = f"slurm/{1_000_000 + jobs}"
            unit = WorkUnit(uid, t.scheduler, shape, 0, expected, started, t.partition, t.features,
                            t.node_selector, t.tolerations)
            s = 0 if t.scheduler is Scheduler.KUBERNETES else 1
            end = max(now + 60.0, started + expected * (0.4 + 0.6 * r.random()))
            tokens += 1
            run = Run(unit, node.name, s, started, end, tokens)
            cluster._attach_run(run, node)
            cluster.started.add(uid)
            node.times[2 + s] = started
            world._seq += 1
            heap.append((end, world._seq, "done", (uid, tokens)))
            stats["arrived"] += 1
            stats["started"] += 1
    cluster.tokens = tokens
    heapq.heapify(heap)
    cluster._node_list = None
    cluster.version += 1

    # -- pending work: weighted over the region's work mix, submitted over the last 4 hours -----
    cum, acc = [], 0.0
    for t in templates:
        acc += t.weight
        cum.append(acc)
    lists: tuple[list[WorkUnit], list[WorkUnit]] = ([], [])
    held = cluster.held
    k8s = Scheduler.KUBERNETES
    rnd = r.random
    nt = world.workload.not_tolerating
    priorities = (1000, 1500, 2000, 3000, 5000)  # a few shared values (memory)
    for i in range(int(pending)):
        t = templates[bisect.bisect_right(cum, rnd() * acc)] if templates else nt
        shape = t.shapes[int(rnd() * len(t.shapes))]
        submitted = at(now - rnd() * 14400.0)
        x = rnd()
        if t.scheduler is k8s:
            if x < 0.01:  # ~1 %: pods that do not tolerate spot
                unit = WorkUnit(f"{nt.prefix}-{i:07d}", k8s, nt.shapes[0], 0, t.limits[0], submitted)
                held[0].append(Held(unit, NOT_TOLERATING, now + 900.0 + rnd() * 1800.0, "drop"))
                continue
            unit = WorkUnit(f"{t.prefix}-{i:07d}", k8s, shape, 0, t.limits[0], submitted, None, (),
                            t.node_selector, t.tolerations)
            lists[0].append(unit)
        else:
            unit = WorkUnit(f"slurm/{2_000_000 + i}", t.scheduler, shape, priorities[int(rnd() * 5)],
                            t.limits[int(rnd() * len(t.limits))], submitted, t.partition, t.features, (), ())
            if x < 0.03:  # ~3 %: held by the user, or waiting on a dependency
                reason, then = (HELD, "drop") if x < 0.015 else (DEPENDENCY, "pending")
                held[1].append(Held(unit, reason, now + 600.0 + rnd() * 7200.0, then))
                continue
            lists[1].append(unit)
    for s in (0, 1):
        # Priority, then submit time, then id (the schedulers' order), by stable sorts on existing
        # attributes: no key tuples, so no memory spike.
        lst = lists[s]
        lst.sort(key=attrgetter("id"))
        lst.sort(key=attrgetter("submitted_at"))
        if s:
            lst.sort(key=attrgetter("priority"), reverse=True)
        cluster.set_pending(s, lst, presorted=True)
    stats["arrived"] += int(pending)
    stats["excluded"] += len(held[0]) + len(held[1])

    # -- calendar notices for nodes on hosts with a lease ahead ---------------------------------
    for name in sorted({lease_host for lease in fleet.leases.values() for lease_host in lease.hosts}):
        for inst in fleet.alive_on(name):
            world.provider.instance_created(inst)
    # One full collection now, so that the first port calls do not pay for a generation-2 pass over
    # the hundreds of thousands of objects just built (that pass would otherwise land on them).
    gc.collect()
    return region, world
