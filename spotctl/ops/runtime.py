"""What every use case works with: the region, its ports, the store, a clock, an actor."""

from __future__ import annotations

import getpass
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from spotctl.core.config import RegionConfig
from spotctl.core.ports import Clock, CloudPort, ContractPort, SchedulerPort, Simulation, SystemClock
from spotctl.state.store import Store

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def os_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass
class Runtime:
    region: RegionConfig
    store: Store
    cloud: CloudPort
    contract: ContractPort
    schedulers: list[SchedulerPort]
    clock: Clock = field(default_factory=SystemClock)
    actor: str = field(default_factory=os_actor)
    progress: Progress = _quiet
    concurrent_observe: bool = True
    backend: str = "sim"
    simulation: Simulation | None = None  # the demo region's world, moved along with the wall clock
    outlets: dict = field(default_factory=dict)  # relay destinations: "kafka", "audit" (see ops.relay)

    def sync_world(self) -> None:
        """Bring a simulated world up to now (a no-op for real regions)."""
        if self.simulation is not None:
            self.simulation.advance(self.now())

    def now(self) -> float:
        return self.clock.now()

    def take_token(self, priority, n: int = 1) -> int:
        b = self.region.budget
        return self.store.take_tokens(n, priority, b.rate, b.burst, self.now())

    def bucket(self):
        b = self.region.budget
        return self.store.bucket(b.rate, b.burst, self.now())
