"""The planner-quality scenario suite (issue 18): simulated regions generated from seeds.

Each :class:`Scenario` is a region (pools, policy, budget) and the simulator's :class:`~spotctl.sim.knobs.Knobs`,
both drawn deterministically from the scenario's seed (the same seed gives the same region, knobs and so
world), plus pools whose launches fail (NoValidHost) for a while. :func:`world_factory` builds its world the
way ``spotctl simulate`` does (``SimWorld.new`` on the region), for :func:`spotctl.ops.simulate.simulate`.

Pools are drawn from five families (general-purpose, memory, CPU VMs; CPU and GPU bare metal), over three
AZs, half of them ``reserved-idle`` (cheaper, with reservations coming) and half ``headroom``. The suite:

Every scenario has reservations that start mid-run in busy pools (:func:`busy_leases`: most pools get
leases, made 40 min - 4 h before they start):

- ``mixed-6``     6 pools, the default work mix (Slurm jobs 20 min - 8 h, pods, bursts), 24 h;
- ``long-slurm-12``  12 pools, long Slurm jobs (2-12 h time limits), short pods (10 min), 16 h;
- ``gpu-burst-10``   10 pools with GPU bare metal, frequent large bursts (array jobs), 12 h;
- ``spiky-16``    16 pools, prices jumping by up to +-40 % every 3 rate-card ticks, 12 h;
- ``failing-12``  12 pools: the three cheapest fail to launch (NoValidHost) for the first 6 h, 5 % of all
  builds fail, surges every hour; a degraded-contract pool (its hard notices come 60 s before the deadline), 8 h;
- ``spend-cap-20``   20 pools under a tight spend cap (25 EUR/h), heavy demand, 8 h;
- ``wide-50``     50 pools, everything at once (swings, build failures, two failing pools, quota), 6 h;
- ``wide-100``    100 pools, reservations, swings and quota, 3 h.

``--quick`` keeps the first three (at most 3 h), ``failing-12`` and ``spend-cap-20`` (2 h each).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from spotctl.core.config import BudgetConfig, Policy, RegionConfig
from spotctl.core.models import KubernetesBinding, PoolClass, PoolKind, PoolSpec, Shape, SlurmBinding
from spotctl.sim.contract import base_price
from spotctl.sim.knobs import Knobs
from spotctl.sim.rng import stable_int
from spotctl.sim.world import SimWorld

SPOT = ("spot=true:NoSchedule",)
GPU = ("spot=true:NoSchedule", "nvidia.com/gpu=present:NoSchedule")

# family: kind, shape, label, partition, features, max nodes, boot s, cleaning s, weight of the draw
FAMILIES = {
    "gp": ("vm", (8, 32768, 0), "gp", "spot", ("gp",), 40, 90, 0, 5),
    "mem": ("vm", (16, 131072, 0), "mem", "spot", ("gp", "highmem"), 16, 120, 0, 2),
    "cpu": ("vm", (32, 65536, 0), "cpu", "spot", ("cpu",), 16, 90, 0, 2),
    "bm": ("baremetal", (64, 524288, 0), "bm", "spot-bm", ("bm", "gp"), 6, 600, 900, 1),
    "gpu": ("baremetal", (32, 262144, 4), "gpu", "spot-gpu", ("gpu", "a100"), 4, 600, 900, 1),
}


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    hours: float
    region: RegionConfig
    knobs: Knobs
    #: (pool, seconds from the start until which its launches fail with NoValidHost)
    failures: tuple[tuple[str, float], ...] = ()
    notes: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)

    def describe(self) -> str:
        return (f"{self.name}: {len(self.region.pools)} pools, {self.hours:g} h, seed {self.seed}"
                + (f"; {self.notes}" if self.notes else ""))


def make_pools(n: int, seed: int, *, gpu: bool = True) -> dict[str, PoolSpec]:
    """``n`` pools drawn from the families (at least one general-purpose pool per AZ first)."""
    r = random.Random(stable_int(seed, "pools", n))
    names = [f for f in FAMILIES if gpu or f != "gpu"]
    weights = [FAMILIES[f][8] for f in names]
    fams = ["gp", "gp", "mem", "cpu", "bm"] + (["gpu"] if gpu else [])
    fams = fams[:n] + [r.choices(names, weights)[0] for _ in range(n - min(n, len(fams)))]
    pools: dict[str, PoolSpec] = {}
    for i, fam in enumerate(fams):
        kind, (v, m, g), label, part, feats, max_nodes, boot, clean, _ = FAMILIES[fam]
        az = f"az{i % 3 + 1}"
        cls = PoolClass.RESERVED_IDLE if (i // 3 + i) % 2 else PoolClass.HEADROOM
        name = f"{fam}-{'rsv-' if cls is PoolClass.RESERVED_IDLE else ''}{az}-{i:03d}"
        bm = kind == "baremetal"
        pools[name] = PoolSpec(
            name=name, kind=PoolKind(kind), pool_class=cls, az=az, shape=Shape(v, m, g),
            flavor=f"spot.{label}.{v}x{m // 1024}", resource_class=f"baremetal.{label}" if bm else None,
            max_nodes=max(2, int(max_nodes * r.uniform(0.6, 1.2))),
            kubernetes=KubernetesBinding(labels=(("spot.pool", label),), taints=GPU if g else SPOT),
            slurm=SlurmBinding(partition=part, features=feats), boot_seconds=boot, cleaning_seconds=clean)
    return pools


def make_region(name: str, pools: dict[str, PoolSpec], seed: int, *, spend_cap: float | None = None,
                pod_seconds: int = 3600, launches: int = 50) -> RegionConfig:
    # a token budget that a region of this size needs (the demo's 0.5/s, 30 is for 6 pools)
    n = len(pools)
    budget = BudgetConfig(rate=max(0.5, n / 12), burst=max(30, 5 * n))
    policy = Policy(spend_cap_per_hour=spend_cap, disruption_budget_pct=20.0, default_pod_seconds=pod_seconds,
                    max_launches_per_pass=launches)
    return RegionConfig(name=name, backend="sim", pools=pools, budget=budget, policy=policy, seed=seed)


def cheapest(pools: dict[str, PoolSpec], k: int) -> list[str]:
    """The ``k`` pools a price-first allocator goes to first (list price per vCPU-hour, non-GPU)."""
    return sorted((p for p in pools.values() if not p.shape.gpus),
                  key=lambda p: (base_price(p) / p.shape.vcpu, p.name))[:k]


def _names(pools: list[PoolSpec]) -> list[str]:
    return [p.name for p in pools]


def busy_leases(knobs: Knobs) -> Knobs:
    """Reservations that start mid-run: most pools get one a day or more, 40 min - 4 h after they are made."""
    return replace(knobs, leases_per_slot_reserved=(2, 4), lease_probability_headroom=0.6,
                   lease_start_offset=(40 * 60.0, 4 * 3600.0), lease_slot_seconds=12 * 3600)


def suite(quick: bool = False) -> list[Scenario]:
    """The scenarios, in order (``quick``: five of them, shorter)."""
    out: list[Scenario] = []
    base = Knobs()

    p = make_pools(6, 101)
    out.append(Scenario("mixed-6", 101, 24, make_region("mixed-6", p, 101), busy_leases(base),
                        notes="default work mix, reservations mid-run"))

    p = make_pools(12, 202, gpu=False)
    out.append(Scenario("long-slurm-12", 202, 16, make_region("long-slurm-12", p, 202, pod_seconds=600),
                        busy_leases(replace(base, slurm_limits=(7200, 14400, 28800, 43200), arrivals_per_hour=70.0)),
                        notes="long Slurm jobs (2-12 h), 10-min pods, busy reserved pools"))

    p = make_pools(10, 303)
    out.append(Scenario("gpu-burst-10", 303, 12, make_region("gpu-burst-10", p, 303),
                        busy_leases(replace(base, burst_probability=0.5, burst_size=(20, 60))),
                        notes="GPU bare metal, frequent array-job bursts"))

    p = make_pools(16, 404)
    out.append(Scenario("spiky-16", 404, 12, make_region("spiky-16", p, 404),
                        busy_leases(replace(base, price_swing_ticks=3, price_swing=0.4)),
                        notes="prices jump +-40 % every 3 rate-card ticks"))

    p = make_pools(12, 505, gpu=False)
    fail = _names(cheapest(p, 3))
    late = sorted(n for n in p if n.startswith("gp-") and n not in fail)[:1]
    out.append(Scenario("failing-12", 505, 8, make_region("failing-12", p, 505),
                        busy_leases(replace(base, build_failure_rate=0.05, late_notice_pools=tuple(late),
                                            surges_per_day=24.0)),
                        failures=tuple((n, 6 * 3600.0) for n in fail), tags=frozenset({"fallback"}),
                        notes=f"NoValidHost in {', '.join(fail)} for 6 h, 5 % builds fail, "
                              f"degraded contract in {', '.join(late)}"))

    p = make_pools(20, 606)
    out.append(Scenario("spend-cap-20", 606, 8, make_region("spend-cap-20", p, 606, spend_cap=25.0),
                        busy_leases(replace(base, arrivals_per_hour=200.0)), tags=frozenset({"spend_cap"}),
                        notes="spend cap 25 EUR/h, heavy demand"))

    p = make_pools(50, 707)
    fail = _names(cheapest(p, 2))
    out.append(Scenario("wide-50", 707, 6, make_region("wide-50", p, 707, launches=100),
                        busy_leases(replace(base, price_swing_ticks=4, price_swing=0.3, build_failure_rate=0.02,
                                            quota_instances=600, quota_vcpu=12000, quota_ram_mb=48 * 1024 * 1024)),
                        failures=tuple((n, 3 * 3600.0) for n in fail), notes="everything at once"))

    p = make_pools(100, 808)
    out.append(Scenario("wide-100", 808, 3, make_region("wide-100", p, 808, launches=200),
                        busy_leases(replace(base, price_swing_ticks=4, price_swing=0.3, quota_instances=1200,
                                            quota_vcpu=24000, quota_ram_mb=96 * 1024 * 1024)),
                        notes="everything at once, 100 pools"))
    if quick:
        return [replace(s, hours=min(s.hours, 3.0)) for s in out[:3]] + [replace(s, hours=2.0) for s in out[4:6]]
    return out


def world_factory(sc: Scenario):
    """A world factory for :func:`spotctl.ops.simulate.simulate` (as ``spotctl.wiring.sim_world_factory``,
    with the scenario's knobs and launch failures). The world built last is kept in ``factory.world``."""

    def factory(region: RegionConfig, start: float, seed: int):
        world = SimWorld.new(region, start, seed, knobs=sc.knobs)
        for pool, seconds in sc.failures:
            world.inject_launch_failures(pool, start + seconds)
        factory.world = world  # type: ignore[attr-defined]
        return world, world.cloud, world.contract, list(world.schedulers)

    factory.world = None  # type: ignore[attr-defined]
    return factory
