"""What the contract API needs of the world it serves: a structural type, so that it never imports the simulator.

The simulator's ``SimWorld`` is one (``spotctl.wiring.sim_world_factory`` builds it). Its cloud and its
contract are core's ports; its provider is the simulated side that issues a reclaim's hard notice.
Attributes are read-only properties here, so a world that keeps them as plain attributes fits.
"""

from __future__ import annotations

from typing import Protocol

from spotctl.core.config import RegionConfig
from spotctl.core.models import Notice, PoolSpec
from spotctl.core.ports import CloudPort, ContractPort


class Provider(Protocol):
    def reclaim(self, instance_id: str, lead_seconds: float, reason: str) -> Notice:
        """Issue a hard notice for a live instance (NotFoundError if it is gone)."""
        ...


class World(Protocol):
    @property
    def now(self) -> float: ...

    @property
    def seed(self) -> int: ...

    @property
    def region(self) -> RegionConfig: ...

    @property
    def pools(self) -> dict[str, PoolSpec]: ...

    @property
    def cloud(self) -> CloudPort: ...

    @property
    def contract(self) -> ContractPort: ...

    @property
    def provider(self) -> Provider: ...

    def advance(self, to: float) -> None:
        """Move the world's clock forward to ``to``, running what falls due."""
        ...

    def changed(self) -> None:
        """The world was changed from outside (a reclaim): save it."""
        ...
