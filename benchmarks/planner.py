#!/usr/bin/env python3
"""The planner alone (issue 14, item 6): time of ``plan()`` on a prebuilt input, by pools and distinct demand.

Inputs come from :func:`make_input` below (not the simulator: it has 12 pools): ``pools`` pools of six
shapes over three AZs, bound in groups of five to a Kubernetes label and a Slurm partition; ``units``
pending units (half bound to one group's label, 30 % to a partition, 20 % tolerating spot anywhere:
served by every non-GPU pool); our nodes (one for every ten units) busy with one to three units; a
few reservations, notices and idle nodes. The policy is the generated region's (500 launches per
pass, no spend cap; budget burst 500). Two demand mixes at each size:

- ``usual``: shapes and durations from the templates' few values (classes: bindings x shapes x durations);
- ``distinct``: every unit its own shape and duration (as many demand classes as units).

Targets: 100 pools x 10k units <= 50 ms; 1,000 pools x 100k units <= 1 s; distinct <= 2x usual at the
same size; 10x the work <= 12x the time (the growth exponent is reported). Only the planner is timed
(median of a few runs), as production runs it: through ``spotctl.ops.observe.planned``, which pauses the
cyclic garbage collector around ``plan()`` (see there); the input is built once per case.

    .venv/bin/python benchmarks/planner.py [--quick]
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spotctl.core.budget import Bucket
from spotctl.core.capacity import forward_calendar, headroom
from spotctl.core.config import Policy
from spotctl.core.models import (
    HostCapacity,
    KubernetesBinding,
    Node,
    NodeState,
    NodeUsage,
    Notice,
    NoticeKind,
    PoolClass,
    PoolKind,
    PoolSpec,
    Quota,
    RateCard,
    Reservation,
    Scheduler,
    Shape,
    SlurmBinding,
    WorkUnit,
)
from spotctl.core.plan_input import PlanInput, build_input

NOW = 1_767_261_600.0
SHAPES = ((8, 32768, 0), (16, 65536, 0), (16, 131072, 0), (32, 65536, 0), (64, 524288, 0), (32, 262144, 4))
UNIT_SHAPES = ((1, 2048, 0), (2, 4096, 0), (4, 8192, 0), (4, 16384, 0), (8, 32768, 0), (16, 65536, 0))
DURATIONS = (600, 1800, 3600, 7200)
SPOT = "spot=true:NoSchedule"
GPU = "nvidia.com/gpu=present:NoSchedule"


def make_pools(n: int, r: random.Random) -> dict[str, PoolSpec]:
    pools = {}
    for i in range(n):
        v, m, g = SHAPES[i % len(SHAPES)]
        group = i // 5
        bm = v == 64 or g > 0
        name = f"pool{i:04d}"
        pools[name] = PoolSpec(
            name=name, kind=PoolKind.BAREMETAL if bm else PoolKind.VM,
            pool_class=PoolClass.HEADROOM if i % 2 else PoolClass.RESERVED_IDLE, az=f"az{i % 3 + 1}",
            shape=Shape(v, m, g), max_nodes=r.randint(20, 80),
            kubernetes=KubernetesBinding(labels=(("spot.pool", f"g{group}"),), taints=(SPOT, GPU) if g else (SPOT,)),
            slurm=SlurmBinding(partition=f"part{group}", features=("gpu",) if g else ("gp",)),
            boot_seconds=600 if bm else 90, cleaning_seconds=900 if bm else 0)
    return pools


def make_units(n: int, groups: int, distinct: bool, r: random.Random) -> list[WorkUnit]:
    out = []
    for i in range(n):
        if distinct:  # its own shape and duration: one demand class per unit
            shape = Shape(1 + i % 16, 1024 + (i * 7919) % 60000, 0)
            seconds = 300 + i
        else:
            shape = Shape(*UNIT_SHAPES[r.randrange(len(UNIT_SHAPES))])
            seconds = DURATIONS[r.randrange(len(DURATIONS))]
        g = r.randrange(groups)
        x = r.random()
        if x < 0.5:
            out.append(WorkUnit(f"pod-{i:07d}", Scheduler.KUBERNETES, shape, 0, seconds, NOW - 60,
                                node_selector=(("spot.pool", f"g{g}"),), tolerations=("spot",)))
        elif x < 0.8:
            out.append(WorkUnit(f"slurm/{1_000_000 + i}", Scheduler.SLURM, shape, r.choice((1000, 2000, 5000)),
                                seconds, NOW - 60, partition=f"part{g}"))
        else:
            out.append(WorkUnit(f"any-{i:07d}", Scheduler.KUBERNETES, shape, 0, seconds, NOW - 60,
                                tolerations=("spot",)))
    return out


def make_input(pools: int, units: int, distinct: bool, seed: int = 1, *,
               max_launches: int = 500, burst: int = 500) -> PlanInput:
    """A plan input with ``pools`` pools, ``units`` pending units and one node of ours per ten units."""
    r = random.Random(seed * 1_000_003 + pools * 7 + units)
    ps = make_pools(pools, r)
    names = sorted(ps)
    groups = max(1, math.ceil(pools / 5))
    hosts: dict[str, list[HostCapacity]] = {}
    for name in names:
        p = ps[name]
        hosts[name] = [HostCapacity(f"{name}-h{j}", name, Shape(128, 1024 * 1024, 8 if p.shape.gpus else 0),
                                    Shape(r.randrange(0, 64), r.randrange(0, 262144), 0), spot_nodes=0)
                       for j in range(r.randint(2, 12))]
    nodes: list[Node] = []
    usage: list[NodeUsage] = []
    notices: list[Notice] = []
    for i in range(units // 10):
        name = names[r.randrange(len(names))]
        p = ps[name]
        h = hosts[name][r.randrange(len(hosts[name]))]
        nid = f"n{i:06d}"
        busy = r.random() < 0.85
        nodes.append(Node(id=nid, pool=name, state=NodeState.ACTIVE, action_id=f"a{i}", created_at=NOW - 7200,
                          updated_at=NOW - 3600, instance_id=f"i{i:06d}", host=h.name, idle_since=None if busy
                          else NOW - r.randrange(0, 1800), price=1.0))
        used = Shape()
        if busy:
            for _ in range(r.randint(1, 3)):
                s = Shape(*UNIT_SHAPES[r.randrange(len(UNIT_SHAPES))])
                if (used + s).fits_in(p.shape):
                    used = used + s
        sched = Scheduler.SLURM if r.random() < 0.4 else Scheduler.KUBERNETES
        usage.append(NodeUsage(nid, sched, used, 1 if busy else 0, last_busy_at=NOW - 60 if busy else None))
        if r.random() < 0.005:
            notices.append(Notice(f"ntc-{i}", f"i{i:06d}", NoticeKind.HARD, NOW - 10, NOW + 600, "reclaim", name))
    on_host: dict[str, int] = {}
    for nd in nodes:
        on_host[nd.host or ""] = on_host.get(nd.host or "", 0) + 1
    for name in names:
        hosts[name] = [HostCapacity(h.name, h.pool, h.capacity, h.used_other, spot_nodes=on_host.get(h.name, 0))
                       for h in hosts[name]]
    res_of: dict[str, list[Reservation]] = {}
    for k, name in enumerate(names):
        if k % 10 == 3:
            hs = hosts[name][: max(1, len(hosts[name]) // 3)]
            res_of[name] = [Reservation(f"r{k}", name, tuple(h.name for h in hs), NOW + r.randrange(3600, 20 * 3600),
                                        NOW + 30 * 3600)]
    host_reclaims = {h: rv.start - ps[rv.pool].cleaning_seconds for rs in res_of.values() for rv in rs for h in rv.hosts}
    prices = {name: round(ps[name].shape.vcpu * 0.02 * r.uniform(0.7, 1.3), 4) for name in names}
    return build_input(
        region="bench", now=NOW, pools=ps,
        policy=Policy(spend_cap_per_hour=None, max_launches_per_pass=max_launches),
        headroom={n: headroom(ps[n], hosts[n], NOW) for n in names},
        calendars={n: forward_calendar(ps[n], hosts[n], res_of.get(n, []), NOW) for n in names},
        quota=Quota(), rate_card=RateCard("rc-1", "EUR", prices, NOW - 60, NOW + 3600),
        nodes=nodes, usage=usage, notices=notices, units=make_units(units, groups, distinct, r), excluded={},
        recent_reclaims={names[0]: 1}, pool_failures={names[1]: NOW + 300} if len(names) > 1 else {},
        budget=Bucket.full(20.0, burst, NOW - 30), host_reclaims=host_reclaims)


def time_plan(inp: PlanInput, runs: int) -> tuple[float, float]:
    """Median CPU and wall seconds of the planner on ``inp`` as production runs it (``ops.observe.planned``:
    ``plan()`` with the cyclic collector paused) over ``runs`` runs, each on a fresh copy of the input
    (the digest is cached on the input and is part of the planner's work), after a full collection (the
    garbage of building the input is not the planner's). CPU time is the verdict: the planner is one
    thread, and on a shared machine the wall time also counts the other processes."""
    import gc
    from dataclasses import replace

    from spotctl.ops.observe import planned

    cpu, wall = [], []
    for _ in range(runs):
        fresh = replace(inp)
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        planned(fresh)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return statistics.median(cpu), statistics.median(wall)


def bench(quick: bool = False) -> list[dict]:
    small, large = ((20, 2_000), (200, 20_000)) if quick else ((100, 10_000), (1_000, 100_000))
    runs = 3 if quick else 5
    limits = {small: 0.05, large: 1.0}
    t: dict[tuple[int, int, bool], float] = {}
    wall: dict[tuple[int, int, bool], float] = {}
    classes: dict[tuple[int, int, bool], int] = {}
    for size in (small, large):
        for distinct in (False, True):
            inp = make_input(*size, distinct)
            classes[(*size, distinct)] = len(inp.demand)
            t[(*size, distinct)], wall[(*size, distinct)] = time_plan(inp, runs if size == small else max(1, runs - 2))
            del inp
    rows = []
    for size in (small, large):
        for distinct in (False, True):
            v = t[(*size, distinct)]
            mix = "distinct" if distinct else "usual mix"
            rows.append({"name": f"planner alone {size[0]} pools x {size[1]} units, {mix}", "value": round(v * 1000, 1),
                         "unit": "ms", "target": f"<= {limits[size] * 1000:g}", "pass": v <= limits[size],
                         "detail": f"CPU time; {classes[(*size, distinct)]} demand classes, {size[1] // 10} nodes; "
                                   f"median of {runs if size == small else max(1, runs - 2)} runs; wall "
                                   f"{wall[(*size, distinct)] * 1000:.1f} ms"})
        ratio = t[(*size, True)] / max(t[(*size, False)], 1e-9)
        rows.append({"name": f"planner distinct / usual mix at {size[0]} pools x {size[1]} units",
                     "value": round(ratio, 2), "unit": "x", "target": "<= 2", "pass": ratio <= 2,
                     "detail": f"distinct {t[(*size, True)] * 1000:.1f} ms vs usual mix {t[(*size, False)] * 1000:.1f} ms"})
    for distinct in (False, True):
        a, b = t[(*small, distinct)], t[(*large, distinct)]
        ratio = b / max(a, 1e-9)
        exponent = math.log(ratio) / math.log(10)
        mix = "distinct" if distinct else "usual mix"
        rows.append({"name": f"planner growth, 10x pools and units, {mix}", "value": round(ratio, 2), "unit": "x",
                     "target": "<= 12", "pass": ratio <= 12,
                     "detail": f"{a * 1000:.1f} ms -> {b * 1000:.1f} ms; growth exponent {exponent:.2f}"})
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _rows

    sys.exit(_rows.main(bench, __doc__))
