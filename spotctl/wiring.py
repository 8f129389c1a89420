"""The small factory the two entry points use to build a region's runtime.

Only ``spotctl.cli`` and ``reconciler`` import this module; it is the one
place that chooses between the simulator and real adapters, and it imports
them lazily so that ``--help`` never pays for an SDK.
"""

from __future__ import annotations

import re
from pathlib import Path

from spotctl.core.config import Config, RegionConfig
from spotctl.core.errors import ConfigError
from spotctl.core.ports import Clock, SystemClock

_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def state_path(config: Config, region: str) -> Path:
    if not _SAFE.match(region):
        raise ConfigError(f"region name {region!r} may only hold letters, digits, '.', '_' and '-'")
    return config.state_dir() / f"{region}.db"


def build_runtime(config: Config, region_name: str | None = None, *, clock: Clock | None = None,
                  actor: str | None = None, progress=None):
    from spotctl.ops.runtime import Runtime, os_actor
    from spotctl.state.store import Store

    region = config.region(region_name)
    clock = clock or SystemClock()
    path = state_path(config, region.name)
    store = Store.open(path, region.name)  # creates the state directory the simulator also uses
    try:
        cloud, contract, schedulers, concurrent = _ports(region, path, clock)
    except BaseException:
        store.close()
        raise
    rt = Runtime(region=region, store=store, cloud=cloud, contract=contract, schedulers=schedulers, clock=clock,
                 actor=actor or region.actor or os_actor(), concurrent_observe=concurrent, backend=region.backend)
    if progress:
        rt.progress = progress
    return rt


def _ports(region: RegionConfig, path: Path, clock: Clock):
    if region.backend == "sim":
        from spotctl.sim.world import SimWorld

        world = SimWorld.open(path.with_suffix(".sim.db"), region, clock.now())
        return world.cloud, world.contract, list(world.schedulers), False
    raise ConfigError(
        f"region {region.name!r} uses backend {region.backend!r}, which this build of spotctl does not provide",
        hint="use backend = \"sim\" (the embedded simulator), or a spotctl with the OpenStack adapters")


def sim_world_factory(region: RegionConfig, start: float, seed: int):
    from spotctl.sim.world import SimWorld

    world = SimWorld.new(region, start, seed)
    return world, world.cloud, world.contract, list(world.schedulers)
