"""Pending work arriving over time: Kubernetes pods and Slurm jobs.

The mix is derived from the region's pools, so any region (the demo one, a
configured one, a generated one) gets work that its pools can serve: for each
pool, pods that select its labels and tolerate its taints, and Slurm jobs for
its partition and features, sized to fit one node. Arrivals follow a day curve
(``arrivals_diurnal`` around ``arrivals_per_hour``) with occasional bursts.
Everything is a pure function of (seed, minute), so replaying a day gives the
same work.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotctl.core.models import PoolSpec, Scheduler, Shape

from .knobs import Knobs
from .rng import diurnal, keyed, poisson

K8S, SLURM = Scheduler.KUBERNETES, Scheduler.SLURM

NOT_TOLERATING = "does not tolerate the spot taint"
HELD = "held (JobHeldUser)"
DEPENDENCY = "waiting on dependency"
BEGIN = "begin time in the future"

_NAMESPACES = {"gp": ("batch", "etl"), "mem": ("analytics", "spark-exec"), "gpu": ("ml", "train"),
               "bm": ("hpc", "sim")}
_SLURM_LIMITS = (1200, 1800, 3600, 3600, 7200, 14400, 28800)


@dataclass(frozen=True, slots=True)
class Template:
    """A kind of work: who schedules it, what it asks for, how big it can be."""

    scheduler: Scheduler
    weight: float
    prefix: str  # "pod/<namespace>/<app>" for pods, "slurm" for jobs
    partition: str | None
    features: tuple[str, ...]
    node_selector: tuple[tuple[str, str], ...]
    tolerations: tuple[str, ...]
    shapes: tuple[Shape, ...]
    limits: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    template: Template
    shape: Shape
    expected: int
    priority: int
    excluded: str | None = None  # why this unit is not demand (for a while)
    excluded_for: float = 0.0


def _min_shape(pools: list[PoolSpec]) -> Shape:
    return Shape(min(p.shape.vcpu for p in pools), min(p.shape.ram_mb for p in pools),
                 min(p.shape.gpus for p in pools))


def _shapes(bound: Shape, sizes: tuple[int, ...], gib_per_cpu: tuple[int, ...], floor_div: int) -> tuple[Shape, ...]:
    out = []
    if bound.gpus:
        per_v = max(1, bound.vcpu // bound.gpus)
        per_m = bound.ram_mb // bound.gpus
        for g in (1, 2, 4, 8):
            if g <= bound.gpus:
                out.append(Shape(per_v * g, per_m * g, g))
        return tuple(out)
    for v in sizes:
        if v > bound.vcpu or v < max(1, bound.vcpu // floor_div):
            continue
        for gib in gib_per_cpu:
            m = min(v * gib * 1024, bound.ram_mb)
            s = Shape(v, m, 0)
            if s not in out:
                out.append(s)
    return tuple(out) or (Shape(bound.vcpu, bound.ram_mb, 0),)


def build_templates(pools: dict[str, PoolSpec], pod_seconds: int,
                    slurm_limits: tuple[int, ...] | None = None) -> list[Template]:
    """The work mix of a region: one pod kind per label set, one job kind per partition/feature (time limits
    drawn from ``slurm_limits``, default 20 min - 8 h)."""
    ordered = [pools[n] for n in sorted(pools)]
    out: list[Template] = []

    # Kubernetes: pods selecting a pool's labels and tolerating its taints.
    groups: dict[tuple, list[PoolSpec]] = {}
    for p in ordered:
        if p.kubernetes.labels or p.kubernetes.taints:
            key = (p.kubernetes.labels, tuple(sorted(p.kubernetes.taint_keys)))
            groups.setdefault(key, []).append(p)
    for (labels, tolerations), members in groups.items():
        value = labels[0][1] if labels else members[0].name
        ns, app = _NAMESPACES.get(value, ("batch", value))
        out.append(Template(K8S, float(len(members)), f"pod/{ns}/{app}", None, (), labels, tolerations,
                            _shapes(_min_shape(members), (2, 4, 8, 16, 32), (2, 4), 8), (pod_seconds,)))
    # ...pods with no selector that tolerate the most common taint set: any such pool will do.
    plain = [p for p in ordered if p.kubernetes.taints and not p.shape.gpus]
    if plain:
        common = max({tuple(sorted(p.kubernetes.taint_keys)) for p in plain},
                     key=lambda ks: (sum(1 for p in plain if tuple(sorted(p.kubernetes.taint_keys)) == ks), ks))
        members = [p for p in plain if tuple(sorted(p.kubernetes.taint_keys)) == common]
        out.append(Template(K8S, 0.5, "pod/default/job", None, (), (), common,
                            _shapes(_min_shape(members), (1, 2, 4), (2, 4), 8), (pod_seconds,)))

    # Slurm: jobs for a partition, with no feature or one of the pool's features.
    jobs: dict[tuple[str, tuple[str, ...]], float] = {}
    for p in ordered:
        if not p.slurm.partition:
            continue
        options: list[tuple[str, ...]] = [()] + [(f,) for f in p.slurm.features]
        for feats in options:
            job = (p.slurm.partition, feats)
            jobs[job] = jobs.get(job, 0.0) + 1.0 / len(options)
    for (partition, feats), weight in jobs.items():
        members = [p for p in ordered if p.slurm.partition == partition and set(feats) <= set(p.slurm.features)]
        out.append(Template(SLURM, weight, "slurm", partition, feats, (), (),
                            _shapes(_min_shape(members), (4, 8, 16, 32, 64, 128), (2, 4, 8), 16),
                            tuple(slurm_limits or _SLURM_LIMITS)))
    return out


class Workload:
    """Arrivals per minute, a pure function of (seed, minute)."""

    def __init__(self, pools: dict[str, PoolSpec], seed: int, knobs: Knobs, pod_seconds: int):
        self.seed = seed
        self.knobs = knobs
        self.templates = build_templates(pools, pod_seconds, knobs.slurm_limits)
        self.total = sum(t.weight for t in self.templates)
        self.rate = knobs.arrivals_per_hour if knobs.arrivals_per_hour is not None else 40.0 * len(pools) / 6.0
        self.not_tolerating = Template(K8S, 0.0, "pod/default/web", None, (), (), (),
                                       (Shape(1, 2048, 0), Shape(2, 4096, 0)), (pod_seconds,))

    def _pick(self, r) -> Template:
        x = r.random() * self.total
        for t in self.templates:
            x -= t.weight
            if x < 0:
                return t
        return self.templates[-1]

    def _one(self, r, at: float, t: Template, shape: Shape | None = None, expected: int | None = None) -> Arrival:
        k = self.knobs
        shape = shape or r.choice(t.shapes)
        expected = expected or r.choice(t.limits)
        if t.scheduler is K8S:
            u = r.random()
            priority = 0 if u < 0.8 else (100 if u < 0.95 else 1000)
            if r.random() < k.not_tolerating_share:
                nt = self.not_tolerating
                return Arrival(at, nt, r.choice(nt.shapes), expected, priority, NOT_TOLERATING, r.uniform(1800, 7200))
            return Arrival(at, t, shape, expected, priority)
        priority = r.randint(1000, 5000)
        u = r.random()
        if u < k.held_share:
            return Arrival(at, t, shape, expected, priority, HELD, r.uniform(3600, 4 * 3600))
        u -= k.held_share
        if u < k.dependency_share:
            return Arrival(at, t, shape, expected, priority, DEPENDENCY, r.uniform(600, 2 * 3600))
        u -= k.dependency_share
        if u < k.begin_share:
            return Arrival(at, t, shape, expected, priority, BEGIN, r.uniform(1800, 6 * 3600))
        return Arrival(at, t, shape, expected, priority)

    def minute(self, m: int) -> list[Arrival]:
        """What arrives in [60 m, 60 m + 60), in time order."""
        if not self.templates:
            return []
        k = self.knobs
        r = keyed(self.seed, "arrivals", m)
        lam = self.rate * (1.0 + k.arrivals_diurnal * diurnal(m * 60.0 + 30.0)) / 60.0
        out = [self._one(r, m * 60.0 + r.random() * 60.0, self._pick(r)) for _ in range(poisson(r, lam))]
        hour = m // 60
        rb = keyed(self.seed, "burst", hour)
        if rb.random() < k.burst_probability and rb.randrange(60) == m % 60:
            t = self._pick(rb)
            shape, expected = rb.choice(t.shapes), rb.choice(t.limits)
            base = m * 60.0 + rb.random() * 30.0
            out.extend(self._one(rb, base + i * 0.5, t, shape, expected) for i in range(rb.randint(*k.burst_size)))
        out.sort(key=lambda a: a.at)
        return out
