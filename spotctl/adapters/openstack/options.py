"""The ``[regions.R.openstack]`` table, read and checked once: :class:`Options` and its per-pool
:class:`PoolOptions` (the keys are listed in the package doc, :mod:`spotctl.adapters.openstack`)."""

from __future__ import annotations

from dataclasses import dataclass

from spotctl.core.config import RegionConfig
from spotctl.core.errors import ConfigError
from spotctl.core.models import PoolSpec


@dataclass(frozen=True)
class PoolOptions:
    """``[regions.R.openstack.pools.NAME]``: how one pool's nodes are found and made."""

    via: str = "nova"  # "nova" | "ironic": bare metal through Nova (a baremetal flavor) or Ironic directly
    traits: tuple[str, ...] = ()
    image: str | None = None
    networks: str | None = None
    host_placement: str | None = None  # "off" | "hint" | "target"; None: the region's


#: How a boot is kept off hosts a reservation takes too soon (:mod:`spotctl.core.hostaware`): ``off`` (Nova
#: picks; the landing check corrects), ``hint`` (a JsonFilter scheduler hint excluding them; needs JsonFilter
#: in nova-scheduler's enabled_filters), ``target`` (a host-targeted boot, microversion 2.74, admin policy).
HOST_PLACEMENTS = ("off", "hint", "target")


@dataclass(frozen=True)
class Options:
    """``[regions.R.openstack]``."""

    image: str | None = None
    networks: str = "none"
    key_name: str | None = None
    user_data: str | None = None
    wait_active_seconds: int = 600
    delete_verify_seconds: int = 300
    timeout_seconds: float = 30.0
    blazar: bool = True
    host_placement: str = "off"
    pools: dict[str, PoolOptions] | None = None

    def pool(self, name: str) -> PoolOptions:
        """The options of pool ``name`` (the defaults when it has no table)."""
        return (self.pools or {}).get(name) or PoolOptions()

    def placement_of(self, name: str) -> str:
        """How boots of pool ``name`` are kept off soon-reserved hosts (the pool's table, else the region's)."""
        return self.pool(name).host_placement or self.host_placement

    def image_ref(self, pool: PoolSpec) -> str | None:
        """The image (name or id) a node of ``pool`` boots: the pool's table, the pool, the region's default."""
        return self.pool(pool.name).image or pool.image or self.image

    def user_data_for(self, *, name: str, pool: str, region: str, action_id: str) -> str | None:
        """The ``user_data`` template filled in for one node; None when the region sets none."""
        if not self.user_data:
            return None
        return self.user_data.format(name=name, pool=pool, region=region, action_id=action_id)


def _options(region: RegionConfig) -> Options:
    """The region's ``[openstack]`` table as :class:`Options`; ConfigError for a pool table that does not fit."""
    raw = dict(region.section("openstack") or {})
    pools = {}
    for pname, p in (raw.pop("pools", None) or {}).items():
        if pname not in region.pools:
            raise ConfigError(f"[regions.{region.name}.openstack.pools.{pname}] names no pool of the region",
                              hint=f"pools: {', '.join(sorted(region.pools)) or 'none'}")
        via = p.get("via", "nova")
        if via not in ("nova", "ironic"):
            raise ConfigError(f"regions.{region.name}.openstack.pools.{pname}.via must be 'nova' or 'ironic', "
                              f"got {via!r}")
        if via == "ironic" and not region.pools[pname].resource_class:
            raise ConfigError(f"pool {pname!r} is deployed through Ironic but has no resource_class")
        hp = p.get("host_placement")
        if hp is not None and hp not in HOST_PLACEMENTS:
            raise ConfigError(f"regions.{region.name}.openstack.pools.{pname}.host_placement must be one of "
                              f"{', '.join(HOST_PLACEMENTS)}, got {hp!r}")
        pools[pname] = PoolOptions(via=via, traits=tuple(str(t) for t in p.get("traits", [])), image=p.get("image"),
                                   networks=p.get("networks"), host_placement=hp)
    if raw.get("host_placement", "off") not in HOST_PLACEMENTS:
        raise ConfigError(f"regions.{region.name}.openstack.host_placement must be one of "
                          f"{', '.join(HOST_PLACEMENTS)}, got {raw['host_placement']!r}")
    return Options(**raw, pools=pools)
