"""The simulator's tunable constants, in one place.

A :class:`Knobs` value is stored with a world (in its SQLite file), so a
reopened world keeps behaving as it was created. Every field has a default
that gives the demo region a realistic day; what-if studies change them, e.g.
``Knobs(surges_per_day=20)`` for a stormy provider.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Knobs:
    # --- clock -------------------------------------------------------------
    step_seconds: int = 60              # advance() moves in steps of at most this
    max_steps: int = 3000               # ...unless the gap is huge: then the step grows

    # --- cloud -------------------------------------------------------------
    quota_instances: int | None = 150   # spot project quota (None = unlimited)
    quota_vcpu: int | None = 2000
    quota_ram_mb: int | None = 8 * 1024 * 1024
    cpu_allocation_ratio: float = 2.0   # VM hypervisors: 64 cores x this
    hypervisors: tuple[int, int] = (6, 10)   # per VM pool
    machines: tuple[int, int] = (4, 8)       # per bare-metal pool (one node-shaped host each)
    ondemand_headroom: tuple[float, float] = (0.35, 0.65)   # mean on-demand load, headroom hosts
    ondemand_reserved: tuple[float, float] = (0.05, 0.25)   # ...hosts of reserved-idle pools
    ondemand_diurnal: float = 0.15      # day swing of on-demand load (fraction of the host)
    ondemand_noise: float = 0.06        # hourly noise per host
    release_vm: tuple[float, float] = (5.0, 20.0)     # delete -> allocations freed (s)
    release_bm: tuple[float, float] = (30.0, 90.0)
    build_failure_rate: float = 0.0     # share of launches that end in ERROR instead of ACTIVE

    # --- reservations (Blazar-like) ------------------------------------------
    lease_slot_seconds: int = 24 * 3600          # one planning slot per pool
    leases_per_slot_reserved: tuple[int, int] = (1, 3)   # reserved-idle pools: 1..3 leases a day
    lease_probability_headroom: float = 0.15     # chance of one lease a day on a headroom pool
    lease_start_offset: tuple[float, float] = (20 * 60.0, 20 * 3600.0)   # created -> start
    lease_duration: tuple[float, float] = (2 * 3600.0, 12 * 3600.0)
    lease_hosts_vm: tuple[int, int] = (1, 3)
    lease_hosts_bm: tuple[int, int] = (1, 2)
    reservation_guard_seconds: float = 900.0     # no launches on a host this close to its reclaim

    # --- provider contract feed ----------------------------------------------
    rate_card_seconds: int = 300
    price_diurnal: float = 0.14         # +-14 % over the day ...
    price_noise: float = 0.05           # ... +-5 % per 5-minute slot (together within +-20 %)
    advisory_lead_seconds: float = 1800.0        # calendar advisory ahead of the reclaim
    hard_lead: tuple[float, float] = (150.0, 300.0)   # hard-notice lead for calendar reclaims
    surges_per_day: float | None = None          # on-demand surges; None = 4 per ~45 hosts
    surge_hard_probability: float = 0.4          # share of surges that end in a hard notice
    surge_hard_delay: tuple[float, float] = (120.0, 900.0)   # advisory -> hard notice
    surge_hard_lead: tuple[float, float] = (120.0, 300.0)
    advisory_ttl: tuple[float, float] = (1200.0, 2400.0)     # an advisory clears after this
    price_swing_ticks: int = 0          # every this many rate-card ticks a pool's price jumps (0: never) ...
    price_swing: float = 0.0            # ... by a factor in 1 +- this, drawn per pool and block of ticks
    late_notice_pools: tuple[str, ...] = ()      # pools whose hard notices come late (a degraded contract):
    late_notice_lead: float = 60.0               # ... this many seconds before their deadline (< 120 s)

    # --- workload --------------------------------------------------------------
    arrivals_per_hour: float | None = None       # mean over the day; None = ~6.7 per pool
    arrivals_diurnal: float = 0.5                # +-50 % over the day (peak 14:00 UTC)
    burst_probability: float = 0.12              # chance per hour of a burst (array job, scale-up)
    burst_size: tuple[int, int] = (8, 25)
    backlog_seconds: float = 5400.0              # arrivals already queued when a world is created
    run_fraction: tuple[float, float] = (0.4, 1.0)   # actual run time / expected_seconds
    not_tolerating_share: float = 0.05           # pods that do not tolerate the spot taint
    held_share: float = 0.03                     # Slurm jobs held by their user
    dependency_share: float = 0.03               # Slurm jobs waiting on a dependency
    begin_share: float = 0.02                    # Slurm jobs with a begin time in the future
    abandon_after_seconds: float = 12 * 3600.0   # never-started work is withdrawn after this
    slurm_limits: tuple[int, ...] | None = None  # Slurm jobs' time limits (s) to draw from; None: 20 min - 8 h
    queue_depth: int = 5000                      # units each scheduler considers per step (like
                                                 # Slurm's bf_max_job_test): bounds a step's cost

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Knobs":
        known = {f.name: f for f in fields(cls)}
        kw: dict[str, Any] = {}
        for k, v in d.items():
            if k in known:
                kw[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)
