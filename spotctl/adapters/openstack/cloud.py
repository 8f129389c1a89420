""":class:`OpenStackCloud`, the :class:`~spotctl.core.ports.CloudPort` of a real OpenStack region,
composed of the parts: hosts from Placement (or Ironic), quota from Nova, reservations from Blazar,
instances from Nova servers and Ironic claims; and the bounded waits of tests and operators.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from spotctl.core.config import RegionConfig
from spotctl.core.errors import AuthError, CapacityError, ConfigError, NotFoundError, SpotctlError, TemporaryError
from spotctl.core.hostaware import pick_host, reclaims_by_host
from spotctl.core.models import HostCapacity, HostChoice, Instance, PoolKind, PoolSpec, Quota, Reservation
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.timefmt import iso

from .api import ALLOC_PREFIX, IRONIC_PREFIX, POLL_SECONDS, TAG_ACTION, Api
from .blazar import Blazar, group_reservations
from .ironic import Ironic
from .nova import Nova
from .options import Options, _options
from .placement import Placement, host_capacity

if TYPE_CHECKING:
    from openstack.connection import Connection

T = TypeVar("T")

log = logging.getLogger(__name__)

#: How long one Placement read of a pool's hosts serves the host-targeted boots of a launch burst.
TARGET_VIEW_SECONDS = 10.0


class OpenStackCloud:
    """The :class:`~spotctl.core.ports.CloudPort` of a real OpenStack region."""

    remote = True  # its calls cross the network: a pass reads it in a thread, under its observe deadline

    def __init__(self, region: RegionConfig, cloud: str, options: Options, *, connect: bool = True,
                 clock: Clock | None = None):
        self.region = region
        self.clock = clock or SystemClock()  # timestamps the adapter stamps (a server with no created_at yet)
        self.cloud_name = cloud
        self.reads_reservations = bool(options.blazar)  # [openstack] blazar = false: no reservation data
        self.options = options
        self.api = Api(region, cloud, options, self.clock)
        self.placement = Placement(self.api)
        self.blazar = Blazar(self.api)
        self.nova = Nova(self.api)
        self.ironic = Ironic(self.api)
        self._project_id: str | None = None
        #: pool -> (monotonic time, its hosts read then, targeted boots sent per host since): host-targeted boots
        self._targets: dict[str, tuple[float, list[HostCapacity], dict[str, int]]] = {}
        if connect:
            self._authenticate()

    @classmethod
    def from_config(cls, region: RegionConfig, clock: Clock | None = None) -> OpenStackCloud:
        """Build from the region's ``cloud`` (or ``$OS_CLOUD``) and ``[openstack]`` table, and log in once."""
        cloud = region.cloud or os.environ.get("OS_CLOUD")
        if not cloud:
            raise ConfigError(f"region {region.name!r} uses backend 'openstack' but names no cloud",
                              hint=f"set regions.{region.name}.cloud to a clouds.yaml entry, or export OS_CLOUD")
        for name, pool in region.pools.items():
            if pool.kind is PoolKind.VM and not pool.flavor:
                raise ConfigError(f"pool {name!r} of region {region.name!r} has no flavor")
        return cls(region, cloud, _options(region), clock=clock)

    # -- session -------------------------------------------------------------------

    @property
    def conn(self) -> Connection:
        """The openstacksdk connection (one keystone session, built once)."""
        return self.api.conn

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return self.api.call(what, fn)

    def _authenticate(self) -> None:
        """Log in once now: bad credentials are a clear error at once; an unreachable cloud is left to each call."""
        try:
            self._call("keystone login", lambda: self.conn.session.get_token())
        except (AuthError, ConfigError):
            raise
        except SpotctlError as e:
            log.warning("cloud %s: %s (calls will be retried)", self.cloud_name, e.message)

    @property
    def project_id(self) -> str:
        """The project spotctl's account works in (its quota)."""
        if self._project_id is None:
            pid = self._call("keystone project", lambda: self.conn.current_project_id)
            if not pid:
                raise ConfigError(f"cloud {self.cloud_name!r}: the credentials are scoped to no project",
                                  hint="set the project of the cloud in clouds.yaml (project_name or project_id)")
            self._project_id = pid
        return self._project_id

    # -- hosts, quota, reservations ----------------------------------------------------

    def hosts(self, pools: dict[str, PoolSpec]) -> list[HostCapacity]:
        """Every host of every pool from Placement (or Ironic for direct bare-metal pools)."""
        ours = {i.id: i.pool for i in self.nova.servers()}  # consumer (server) id -> pool, every server of ours
        blazar = self.blazar.hosts_reserved(self.clock.now()) if self.options.blazar else {}
        rp_cache: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        out: list[HostCapacity] = []
        for name in sorted(pools):
            pool = pools[name]
            if self.options.pool(name).via == "ironic":
                out.extend(self.ironic.hosts(pool))
                continue
            if pool.flavor:
                self.nova.flavor(pool)  # an unknown flavor is a configuration error, found before any launch
            for rp in self._pool_providers(pool):
                if rp["uuid"] not in rp_cache:
                    rp_cache[rp["uuid"]] = self.placement.provider_state(rp["uuid"])
                inv, allocs = rp_cache[rp["uuid"]]
                if not inv:  # Blazar's blazar_<host> providers and other empty ones
                    continue
                out.append(host_capacity(pool, rp["name"], inv, allocs, ours, blazar.get(rp["name"])))
        if out:  # where our servers land, also when the policy shows our account only Nova's hostId
            self.nova.learn_hosts(self.project_id, sorted({h.name for h in out}))
        return out

    def _pool_providers(self, pool: PoolSpec) -> list[dict[str, Any]]:
        aggregate = self.nova.aggregate_uuid(pool.aggregate) if pool.aggregate else None
        return self.placement.providers(pool, self.options.pool(pool.name).traits, aggregate)

    def quota(self) -> Quota:
        return self.nova.quota(self.project_id)

    def reservations(self, pools: dict[str, PoolSpec], start: float, end: float) -> list[Reservation]:
        if not self.options.blazar:
            return []
        leases = self.blazar.host_leases()
        if not leases:
            return []
        return group_reservations(leases, self._pool_members(pools), start, end)

    def _pool_members(self, pools: dict[str, PoolSpec]) -> dict[str, set[str]]:
        """pool -> host names (Nova aggregate membership; Blazar moves hosts between aggregates)."""
        aggregates = self.nova.aggregates()
        out = {}
        for name, pool in pools.items():
            if self.options.pool(name).via == "ironic":
                continue
            if pool.aggregate and pool.aggregate in aggregates:
                out[name] = set(aggregates[pool.aggregate].hosts or [])
            elif self.options.pool(name).traits:
                out[name] = {rp["name"] for rp in self._pool_providers(pool)}
        return out

    # -- instances (Nova servers / Ironic allocations) ---------------------------------

    def instances(self) -> list[Instance]:
        out = self.nova.servers()
        if self.ironic.pools():
            out.extend(self.ironic.instances())
        return out

    def find_instance(self, action_id: str) -> Instance | None:
        found = self.nova.servers(f"{TAG_ACTION}={action_id}")
        if not found and self.ironic.pools():
            found = [i for i in self.ironic.instances() if i.action_id == action_id]
        if len(found) > 1:
            log.warning("%d instances carry action %s; adopting the oldest", len(found), action_id)
        return min(found, key=lambda i: (i.created_at, i.id)) if found else None

    def create_instance(self, pool: PoolSpec, name: str, action_id: str,
                        choice: HostChoice | None = None) -> Instance:
        """Boot one node. With the plan's host ``choice`` and ``host_placement`` set for the pool, Nova is kept
        off the hosts a reservation takes before ``choice.not_before`` (read from Blazar now, outside any
        write transaction): ``hint`` excludes them with a JsonFilter scheduler hint, ``target`` asks for one
        host chosen by :func:`~spotctl.core.hostaware.pick_host` (CapacityError when none fits). Ironic
        claims and ``off`` boot as before: the landing check of the next plans corrects."""
        if self.options.pool(pool.name).via == "ironic":
            return self.ironic.create(pool, name, action_id)
        mode = self.options.placement_of(pool.name)
        if choice is None or mode == "off":
            return self.nova.create(pool, name, action_id)
        now = self.clock.now()
        reclaims = self._host_reclaims(pool, now)
        if mode == "hint":
            avoid = tuple(sorted(h for h, at in reclaims.items() if not choice.acceptable(at)))
            return self.nova.create(pool, name, action_id, avoid=avoid)
        return self.nova.create(pool, name, action_id, host=self._target_host(pool, choice, reclaims, now))

    def _host_reclaims(self, pool: PoolSpec, now: float) -> dict[str, float]:
        """When a Blazar lease takes each host from the spot pool (its start minus the pool's cleaning time)."""
        if not self.options.blazar:
            return {}
        leases = [Reservation(id=lid, pool=pool.name, hosts=(host,), start=start, end=end)
                  for lid, host, start, end in self.blazar.host_leases()]
        return reclaims_by_host(leases, {pool.name: pool}, now)

    def _target_host(self, pool: PoolSpec, choice: HostChoice, reclaims: dict[str, float], now: float) -> str:
        """The host of a targeted boot: Placement's view of the pool (read once per launch burst, with the boots
        already sent there counted on top, since Placement sees them only once Nova has scheduled them)."""
        t = time.monotonic()
        cached = self._targets.get(pool.name)
        if cached is None or t - cached[0] > TARGET_VIEW_SECONDS:
            cached = self._targets[pool.name] = (t, self.hosts({pool.name: pool}), {})
        _, hosts, taken = cached
        host = pick_host(hosts, pool, reclaims, choice, now, taken)
        if host is None:
            raise CapacityError(f"No valid host was found for pool {pool.name}: no host with room that no reservation "
                                f"takes before {iso(choice.not_before, sep=' ')} (host-targeted boot)",
                                details={"pool": pool.name, "not_before": choice.not_before})
        taken[host] = taken.get(host, 0) + 1
        return host

    def advance(self, instance: Instance) -> Instance:
        """Deploy a claimed Ironic node (step "deploy"): the image, the config drive, provision "active".
        One round of calls, no wait; a Nova server goes on by itself and is returned as it is."""
        if instance.step != "deploy" or not instance.id.startswith(IRONIC_PREFIX):
            return instance
        pool = self.region.pools.get(instance.pool)
        if pool is None:
            raise ConfigError(f"Ironic node {instance.id[len(IRONIC_PREFIX):]} is claimed for pool "
                              f"{instance.pool!r}, which the region does not have")
        return self.ironic.deploy(instance, pool, self.nova.image_for(pool))

    def ironic_node_state(self, instance_id: str) -> dict[str, Any]:
        """The Ironic node behind an instance: provision/power state and target (deadline arithmetic, operators)."""
        return self.ironic.node_state(instance_id.removeprefix(IRONIC_PREFIX))

    def delete_instance(self, instance_id: str) -> None:
        if instance_id.startswith(ALLOC_PREFIX):
            return self.ironic.unclaim(instance_id[len(ALLOC_PREFIX):])
        if instance_id.startswith(IRONIC_PREFIX):
            return self.ironic.delete(instance_id[len(IRONIC_PREFIX):])
        self.nova.delete(instance_id)

    def released(self, instance_id: str) -> bool:
        """The server is gone and Placement holds no allocation for it (a read: nothing is changed)."""
        if instance_id.startswith(ALLOC_PREFIX):
            return self.ironic.claim_released(instance_id[len(ALLOC_PREFIX):])
        if instance_id.startswith(IRONIC_PREFIX):
            return self.ironic.released(instance_id[len(IRONIC_PREFIX):])
        return self.nova.gone(instance_id) and self.placement.allocations_freed(instance_id)

    def _get_instance(self, instance_id: str) -> Instance | None:
        if instance_id.startswith((IRONIC_PREFIX, ALLOC_PREFIX)):
            return next((i for i in self.ironic.instances() if instance_id in (i.id, i.claim)), None)
        return self.nova.get_instance(instance_id)

    # -- bounded waits (tests, operators; a pass never blocks on them) ---------------------

    def wait_active(self, instance_id: str, timeout: float | None = None) -> Instance:
        """Wait until the instance is ACTIVE (``wait_active_seconds`` at most); ERROR or timeout raise."""
        bound = timeout if timeout is not None else self.options.wait_active_seconds
        deadline = time.monotonic() + bound
        while True:
            inst = self._get_instance(instance_id)
            if inst is not None and inst.step:
                inst = self.advance(inst)
            if inst is not None and inst.status == "ACTIVE":
                return inst
            if inst is not None and inst.status == "ERROR":
                raise CapacityError(f"instance {instance_id} went to ERROR")
            if inst is None:
                raise NotFoundError(f"instance {instance_id} does not exist")
            if time.monotonic() >= deadline:
                raise TemporaryError(f"instance {instance_id} not ACTIVE after {bound}s (status {inst.status})")
            time.sleep(self.nova.until_next_poll(instance_id))

    def delete_and_verify(self, instance_id: str, timeout: float | None = None) -> float:
        """Delete, then wait until :meth:`released`; returns the seconds it took. Raises TemporaryError past the bound.

        Once Nova no longer lists the server, only Placement is polled (the server does not come back).
        """
        t0 = time.monotonic()
        bound = timeout if timeout is not None else self.options.delete_verify_seconds
        self.delete_instance(instance_id)
        ironic = instance_id.startswith((IRONIC_PREFIX, ALLOC_PREFIX))
        gone = False
        while True:
            if ironic:
                done = self.released(instance_id)
                if not done:
                    self.delete_instance(instance_id)  # a claim Ironic kept after the undeploy goes too
            else:
                gone = gone or self.nova.gone(instance_id)
                done = gone and self.placement.allocations_freed(instance_id)
            if done:
                break
            if time.monotonic() - t0 >= bound:
                raise TemporaryError(f"instance {instance_id}: not released {bound}s after delete "
                                     "(server still listed or Placement allocations not freed)",
                                     hint="escalate to the cloud operators: a stuck delete holds capacity")
            time.sleep(POLL_SECONDS)
        self.nova.forget(instance_id)
        return time.monotonic() - t0
