"""The contract feed of a region that has none configured.

Prices come from each pool's ``price`` (list price per node-hour). No notices
or advisories arrive, so the planner runs every pool under the no-notice
policy (shorter placements, no long jobs on bare metal) — the provider
contract's degraded case, stated rather than hidden.
"""

from __future__ import annotations

from spotctl.core.config import RegionConfig
from spotctl.core.errors import UnavailableError
from spotctl.core.models import Notice, RateCard


class StaticContract:
    provides_notices = False

    def __init__(self, prices: dict[str, float], currency: str):
        self.prices = prices
        self.currency = currency

    @classmethod
    def from_config(cls, region: RegionConfig) -> "StaticContract":
        prices = {name: p.list_price for name, p in region.pools.items() if p.list_price is not None}
        return cls(prices, region.policy.currency)

    def rate_card(self) -> RateCard:
        if not self.prices:
            raise UnavailableError("no contract feed is configured and no pool has a list `price`")
        return RateCard(version="static", currency=self.currency, prices=dict(self.prices), valid_from=0.0,
                        valid_until=float("inf"))

    def notices(self) -> list[Notice]:
        return []
