"""The real private cloud: Placement and quotas, Blazar, Nova and Ironic, through openstacksdk.

:class:`OpenStackCloud` implements :class:`spotctl.core.ports.CloudPort` for a region
configured with ``backend = "openstack"``. The cloud is a ``clouds.yaml`` entry named by
the region's ``cloud`` (or ``$OS_CLOUD``); credentials never appear in spotctl's config.
One keystone session is reused for every call; compute and bare-metal microversions are
negotiated by openstacksdk, Placement's is pinned to what the queries need.

Options, in ``[regions.R.openstack]``::

    image = "spot-image"          # default image (name or id) when a pool sets none
    networks = "none"             # "none" | "auto" | comma-separated network ids
    key_name = "ops"              # optional keypair
    user_data = "..."             # template: {name} {pool} {region} {action_id}
    wait_active_seconds = 600     # bound of wait_active() (tests, operators); a pass never waits for ACTIVE
    delete_verify_seconds = 300   # bound of delete_and_verify()
    timeout_seconds = 30          # per API call
    blazar = true                 # read reservations from Blazar (the forward calendar)
    [regions.R.openstack.pools.NAME]
    via = "nova" | "ironic"       # bare-metal pools: through Nova (baremetal flavor) or Ironic directly
    traits = ["CUSTOM_SPOT"]      # select hosts by traits instead of (or on top of) the aggregate
    image = "..."; networks = "..."

What is ours: servers carry the tags ``spotctl:region=R``, ``spotctl:pool=P`` and
``spotctl:action=A`` and the same keys as metadata; Ironic allocations carry them in
``extra``. Instance ids of Ironic nodes deployed directly are ``ironic:<node uuid>``.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from spotctl.core.config import RegionConfig
from spotctl.core.errors import (
    AuthError,
    CapacityError,
    ConfigError,
    NotFoundError,
    SpotctlError,
    TemporaryError,
    UnavailableError,
)
from spotctl.core.models import HostCapacity, Instance, PoolKind, PoolSpec, Quota, Reservation, Shape
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.timefmt import parse_ts

from . import _http

log = logging.getLogger(__name__)

TAG_REGION = "spotctl:region"
TAG_POOL = "spotctl:pool"
TAG_ACTION = "spotctl:action"
IRONIC_PREFIX = "ironic:"  # ironic:<node uuid>: a claim that has its node
ALLOC_PREFIX = "ironic-alloc:"  # ironic-alloc:<allocation uuid>: a claim Ironic has not given a node yet
# Placement 1.22: forbidden traits (skip hosts whose compute service is disabled); member_of (1.3), required (1.18).
PLACEMENT_MICROVERSION = "1.22"
DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"
CAPACITY_FAULTS = ("no valid host", "exceeded maximum number of retries", "insufficient", "not enough",
                   "quota exceeded")  # the last: Nova's quota recheck after scheduling
BLAZAR_CACHE_SECONDS = 5.0
# One polling interval for the bounded waits of tests and operators (ACTIVE, release): a wait reads a server
# at most once per interval (create_instance itself reads nothing: no pass waits).
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class PoolOptions:
    via: str = "nova"
    traits: tuple[str, ...] = ()
    image: str | None = None
    networks: str | None = None


@dataclass(frozen=True)
class Options:
    image: str | None = None
    networks: str = "none"
    key_name: str | None = None
    user_data: str | None = None
    wait_active_seconds: int = 600
    delete_verify_seconds: int = 300
    timeout_seconds: float = 30.0
    blazar: bool = True
    pools: dict[str, PoolOptions] | None = None

    def pool(self, name: str) -> PoolOptions:
        return (self.pools or {}).get(name) or PoolOptions()


def _options(region: RegionConfig) -> Options:
    raw = dict(region.section("openstack") or {})
    pools = {}
    for pname, p in (raw.pop("pools", None) or {}).items():
        if pname not in region.pools:
            raise ConfigError(f"[regions.{region.name}.openstack.pools.{pname}] names no pool of the region",
                              hint=f"pools: {', '.join(sorted(region.pools)) or 'none'}")
        via = p.get("via", "nova")
        if via not in ("nova", "ironic"):
            raise ConfigError(f"regions.{region.name}.openstack.pools.{pname}.via must be 'nova' or 'ironic', got {via!r}")
        if via == "ironic" and not region.pools[pname].resource_class:
            raise ConfigError(f"pool {pname!r} is deployed through Ironic but has no resource_class")
        pools[pname] = PoolOptions(via=via, traits=tuple(str(t) for t in p.get("traits", [])), image=p.get("image"),
                                   networks=p.get("networks"))
    return Options(**raw, pools=pools)


def _ts(value: str | None) -> float:
    """An OpenStack timestamp ('2024-05-01T10:00:00Z', '…:00.000000', '2024-05-01 10:00') as epoch seconds;
    without a zone it is UTC (as the APIs document). 0.0 when there is none; ValueError when malformed."""
    if not value:
        return 0.0
    try:
        t = parse_ts(value.strip(), assume_utc=True)
    except ValueError:
        raise ValueError(f"unrecognised timestamp {value!r}") from None
    return t or 0.0


def translate(exc: BaseException, what: str) -> SpotctlError:
    """An SDK/HTTP error as one of spotctl's errors (the adapter's boundary). The SDK raises its own
    exceptions, so this mapping is the adapter's; an HTTP status they carry means what the one rule of
    :mod:`spotctl.adapters._http` says, after OpenStack's own addition: a 400 or 403 that says "quota
    exceeded" or "no valid host" is a CapacityError (no room in that pool)."""
    from keystoneauth1 import exceptions as ka
    from openstack import exceptions as os_exc

    if isinstance(exc, SpotctlError):
        return exc
    msg = _message(exc)
    if isinstance(exc, os_exc.ConfigException):
        return ConfigError(f"{what}: {msg}", hint="check the region's `cloud` and clouds.yaml (OS_CLIENT_CONFIG_FILE)")
    if isinstance(exc, ka.Unauthorized):
        return AuthError(f"{what}: the cloud refused the credentials: {msg}",
                         hint="check the user, password and project of the cloud in clouds.yaml")
    if isinstance(exc, (ka.MissingRequiredOptions, ka.AuthorizationFailure, ka.NoMatchingPlugin)):
        return AuthError(f"{what}: cannot authenticate: {msg}")
    if isinstance(exc, (ka.ConnectFailure, ka.ConnectTimeout, ka.DiscoveryFailure, ka.EndpointNotFound,
                        ka.catalog.EndpointNotFound, ka.RetriableConnectionFailure)):
        if isinstance(exc, ka.ConnectTimeout) or "timed out" in msg.lower():
            return TemporaryError(f"{what}: timed out: {msg}")
        if _http.broke_off(exc):  # connected, then the exchange broke off: not now, as the HTTP rule says
            return TemporaryError(f"{what}: the connection broke off: {msg}")
        return UnavailableError(f"{what}: cloud endpoint unreachable: {msg}")
    if isinstance(exc, ka.http.Unauthorized):
        return AuthError(f"{what}: {msg}")
    status = getattr(exc, "status_code", None) or getattr(exc, "http_status", None)
    if isinstance(exc, ka.http.HttpError) and status is None:
        status = exc.http_status
    if status is not None:
        status = int(status)
        low = msg.lower()
        if status == 403 and "quota exceeded" in low:
            return CapacityError(f"{what}: {msg}")
        if status == 400 and ("quota" in low or "no valid host" in low):
            return CapacityError(f"{what}: {msg}")
        cls = _http.error_class(status)
        if cls is AuthError and status == 403:
            return AuthError(f"{what}: not allowed: {msg}", hint="spotctl's account needs the admin role to read "
                             "Placement, Ironic and Blazar")
        if cls is AuthError:
            return AuthError(f"{what}: the cloud refused the credentials: {msg}")
        if cls is NotFoundError:
            return NotFoundError(f"{what}: {msg}")
        return cls(f"{what}: HTTP {status}: {msg}")
    if isinstance(exc, (TimeoutError, os_exc.ResourceTimeout)):
        return TemporaryError(f"{what}: timed out: {msg}")
    if isinstance(exc, (ka.ClientException, os_exc.SDKException, OSError)):
        return UnavailableError(f"{what}: {msg}")
    return UnavailableError(f"{what}: {type(exc).__name__}: {msg}")


def _message(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    base = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    if details and str(details) not in base:
        base = f"{base}: {details}"
    return base.strip()


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
        self._conn = None
        self._lock = threading.Lock()
        self._flavors: dict[str, Any] = {}
        self._images: dict[str, str] = {}
        self._aggregates: dict[str, Any] | None = None
        self._blazar_cache: tuple[float, dict] | None = None
        self._project_id: str | None = None
        self._seen: dict[str, tuple[float, Any]] = {}  # server id -> (monotonic time of the read, server or None)
        if connect:
            self._authenticate()

    @classmethod
    def from_config(cls, region: RegionConfig, clock: Clock | None = None) -> "OpenStackCloud":
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
    def conn(self):
        """The openstacksdk connection (one keystone session, built once)."""
        if self._conn is None:
            with self._lock:
                if self._conn is None:
                    import openstack

                    try:
                        # no retries inside the SDK (Ironic's 409/503 are retried 5 times, ~16 s, by default):
                        # a pass never waits; the next pass tries again
                        self._conn = openstack.connect(cloud=self.cloud_name, api_timeout=self.options.timeout_seconds,
                                                       baremetal_status_code_retries=0,
                                                       image_status_code_retries=0)
                    except Exception as e:
                        raise translate(e, f"cloud {self.cloud_name!r}") from None
        return self._conn

    def _authenticate(self) -> None:
        """Log in once now: bad credentials are a clear error at once; an unreachable cloud is left to each call."""
        try:
            self._call("keystone login", lambda: self.conn.session.get_token())
        except AuthError:
            raise
        except ConfigError:
            raise
        except SpotctlError as e:
            log.warning("cloud %s: %s (calls will be retried)", self.cloud_name, e.message)

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except SpotctlError:
            raise
        except Exception as e:
            raise translate(e, what) from None

    @property
    def project_id(self) -> str:
        if self._project_id is None:
            self._project_id = self._call("keystone project", lambda: self.conn.current_project_id)
        return self._project_id

    def _placement(self, path: str) -> dict:
        def get():
            r = self.conn.placement.get(path, microversion=PLACEMENT_MICROVERSION, raise_exc=False)
            if r.status_code == 404:
                return None
            if r.status_code >= 400:
                from keystoneauth1 import exceptions as ka

                raise ka.from_response(r, "GET", path)
            return r.json()

        return self._call(f"placement GET {path}", get)

    # -- hosts (Placement) -----------------------------------------------------------

    def hosts(self, pools: dict[str, PoolSpec]) -> list[HostCapacity]:
        """Every host of every pool from Placement (or Ironic for direct bare-metal pools)."""
        ours = self._our_allocations_index()
        blazar = self._blazar_hosts_reserved() if self.options.blazar else {}
        rp_cache: dict[str, tuple[dict, dict]] = {}
        out: list[HostCapacity] = []
        for name in sorted(pools):
            pool = pools[name]
            if self.options.pool(name).via == "ironic":
                out.extend(self._ironic_hosts(pool, ours))
                continue
            if pool.flavor:
                self._flavor(pool)  # an unknown flavor is a configuration error, found before any launch
            for rp in self._pool_providers(pool):
                if rp["uuid"] not in rp_cache:
                    rp_cache[rp["uuid"]] = self._rp_state(rp["uuid"])
                inv, allocs = rp_cache[rp["uuid"]]
                if not inv:  # Blazar's blazar_<host> providers and other empty ones
                    continue
                out.append(self._host_capacity(pool, rp["name"], inv, allocs, ours, blazar.get(rp["name"])))
        return out

    def _pool_providers(self, pool: PoolSpec) -> list[dict]:
        params = []
        if pool.aggregate:
            agg = self._aggregate(pool.aggregate)
            params.append(f"member_of={agg}")
        traits = self.options.pool(pool.name).traits
        required = list(traits) + [f"!{DISABLED_TRAIT}"]
        params.append("required=" + ",".join(required))
        if pool.kind is PoolKind.BAREMETAL and pool.resource_class:
            params.append(f"resources={_rc(pool.resource_class)}:1")
        if not pool.aggregate and not traits:
            raise ConfigError(f"pool {pool.name!r} names neither an aggregate nor traits: cannot find its hosts")
        data = self._placement("/resource_providers?" + "&".join(params)) or {}
        return sorted(data.get("resource_providers", []), key=lambda r: r["name"])

    def _aggregate(self, name: str) -> str:
        """A Nova host aggregate's uuid (Placement aggregates mirror Nova's)."""
        if self._aggregates is None or name not in self._aggregates:
            aggs = self._call("nova aggregates", lambda: list(self.conn.compute.aggregates()))
            self._aggregates = {a.name: a for a in aggs}
        agg = self._aggregates.get(name)
        if agg is None:
            raise ConfigError(f"aggregate {name!r} does not exist in cloud {self.cloud_name!r}",
                              hint="pools name Nova host aggregates (`openstack aggregate list`)")
        return agg.uuid

    def _rp_state(self, uuid: str) -> tuple[dict, dict]:
        inv = (self._placement(f"/resource_providers/{uuid}/inventories") or {}).get("inventories", {})
        allocs = (self._placement(f"/resource_providers/{uuid}/allocations") or {}).get("allocations", {})
        return inv, allocs

    def _host_capacity(self, pool: PoolSpec, host: str, inv: dict, allocs: dict, ours: dict[str, str],
                       reserved_from: float | None) -> HostCapacity:
        used: dict[str, int] = {}
        mine: dict[str, int] = {}
        spot_nodes = 0
        for consumer, a in allocs.items():
            res = a.get("resources", {})
            is_ours = consumer in ours
            if is_ours and ours[consumer] == pool.name:
                spot_nodes += 1
            for rc, n in res.items():
                used[rc] = used.get(rc, 0) + n
                if is_ours:
                    mine[rc] = mine.get(rc, 0) + n

        def cap(rc: str) -> int:
            i = inv.get(rc)
            if not i:
                return 0
            return int((i["total"] - i["reserved"]) * i["allocation_ratio"])

        def other(rc: str) -> int:
            return max(0, used.get(rc, 0) - mine.get(rc, 0))

        if pool.kind is PoolKind.BAREMETAL and pool.resource_class:
            # One node per provider: the whole shape when the resource class has a free unit.
            rc = _rc(pool.resource_class)
            c = cap(rc)
            capacity = pool.shape if c > 0 else Shape()
            taken = other(rc) >= c if c else True
            used_other = pool.shape if taken and not spot_nodes else Shape()
            return HostCapacity(host, pool.name, capacity, used_other, spot_nodes, reserved_from)
        capacity = Shape(cap("VCPU"), cap("MEMORY_MB"), cap("VGPU"))
        if not self._fits_units(pool, inv):
            capacity = Shape()
        used_other = Shape(other("VCPU"), other("MEMORY_MB"), other("VGPU"))
        # our allocations held by *other* pools on this host are foreign to this pool
        for consumer, a in allocs.items():
            if consumer in ours and ours[consumer] != pool.name:
                res = a.get("resources", {})
                used_other = used_other + Shape(res.get("VCPU", 0), res.get("MEMORY_MB", 0), res.get("VGPU", 0))
        return HostCapacity(host, pool.name, capacity, used_other, spot_nodes, reserved_from)

    @staticmethod
    def _fits_units(pool: PoolSpec, inv: dict) -> bool:
        """Whether one node of the pool's shape is a valid request (min/max unit, step size) on this provider."""
        for rc, need in (("VCPU", pool.shape.vcpu), ("MEMORY_MB", pool.shape.ram_mb), ("VGPU", pool.shape.gpus)):
            if need <= 0:
                continue
            i = inv.get(rc)
            if not i:
                return False
            if need < i.get("min_unit", 1) or need > i.get("max_unit", need) or need % max(1, i.get("step_size", 1)):
                return False
        return True

    def _our_allocations_index(self) -> dict[str, str]:
        """consumer (server) id -> pool, for every server of ours that is not deleted."""
        return {i.id: i.pool for i in self._servers()}

    # -- quota -----------------------------------------------------------------------

    def quota(self) -> Quota:
        q = self._call("nova quota", lambda: self.conn.compute.get_quota_set(self.project_id, usage=True))
        usage = q.usage or {}
        reserved = q.reservation or {}

        def left(limit, key):
            if limit is None or limit < 0:
                return None
            return max(0, limit - usage.get(key, 0) - reserved.get(key, 0))

        return Quota(instances=left(q.instances, "instances"), vcpu=left(q.cores, "cores"), ram_mb=left(q.ram, "ram"))

    # -- reservations (Blazar) -------------------------------------------------------

    def _blazar(self, path: str) -> dict:
        def get():
            r = self.conn.session.get(path, endpoint_filter={"service_type": "reservation", "interface": "public"},
                                      raise_exc=False)
            if r.status_code >= 400:
                from keystoneauth1 import exceptions as ka

                raise ka.from_response(r, "GET", path)
            return r.json()

        return self._call(f"blazar GET {path}", get)

    def _blazar_state(self) -> dict:
        """Blazar hosts, host allocations and leases, cached for a few seconds (one observe reads them twice)."""
        now = time.monotonic()
        if self._blazar_cache and now - self._blazar_cache[0] < BLAZAR_CACHE_SECONDS:
            return self._blazar_cache[1]
        hosts = {h["id"]: h["hypervisor_hostname"] for h in self._blazar("/os-hosts").get("hosts", [])}
        allocs = self._blazar("/os-hosts/allocations").get("allocations", [])
        leases = {le["id"]: le for le in self._blazar("/leases").get("leases", [])}
        state = {"hosts": hosts, "allocations": allocs, "leases": leases}
        self._blazar_cache = (now, state)
        return state

    def _host_leases(self) -> list[tuple[str, str, float, float]]:
        """(lease id, host name, start, end) for every lease holding a host."""
        st = self._blazar_state()
        out = []
        for a in st["allocations"]:
            host = st["hosts"].get(str(a.get("resource_id")))
            if host is None:
                continue
            for r in a.get("reservations", []):
                lease = st["leases"].get(r.get("lease_id"))
                if lease is None or lease.get("status") in ("TERMINATED", "DELETED", "ERROR"):
                    continue
                out.append((lease["id"], host, _ts(lease.get("start_date")), _ts(lease.get("end_date"))))
        return out

    def _blazar_hosts_reserved(self) -> dict[str, float]:
        """host -> start of its earliest lease that has not ended (HostCapacity.reserved_from)."""
        now = self.clock.now()
        out: dict[str, float] = {}
        for _lid, host, start, end in self._host_leases():
            if end > now and (host not in out or start < out[host]):
                out[host] = start
        return out

    def reservations(self, pools: dict[str, PoolSpec], start: float, end: float) -> list[Reservation]:
        if not self.options.blazar:
            return []
        leases = self._host_leases()
        if not leases:
            return []
        members = self._pool_members(pools)
        grouped: dict[tuple[str, str], list] = {}
        for lid, host, ls, le in leases:
            if not (ls < end and le > start):
                continue
            for pname, hosts in members.items():
                if host in hosts:
                    g = grouped.setdefault((lid, pname), [ls, le, set()])
                    g[2].add(host)
        return [Reservation(id=lid, pool=pname, hosts=tuple(sorted(g[2])), start=g[0], end=g[1])
                for (lid, pname), g in sorted(grouped.items(), key=lambda kv: (kv[1][0], kv[0]))]

    def _pool_members(self, pools: dict[str, PoolSpec]) -> dict[str, set[str]]:
        """pool -> host names (Nova aggregate membership; Blazar moves hosts between aggregates)."""
        aggs = self._call("nova aggregates", lambda: list(self.conn.compute.aggregates()))
        self._aggregates = {a.name: a for a in aggs}
        out = {}
        for name, pool in pools.items():
            if self.options.pool(name).via == "ironic":
                continue
            if pool.aggregate and pool.aggregate in self._aggregates:
                out[name] = set(self._aggregates[pool.aggregate].hosts or [])
            elif self.options.pool(name).traits:
                out[name] = {rp["name"] for rp in self._pool_providers(pool)}
        return out

    # -- instances (Nova servers / Ironic allocations) ---------------------------------

    def _servers(self, *tags: str) -> list[Instance]:
        query = ",".join((f"{TAG_REGION}={self.region.name}",) + tags)
        servers = self._call("nova list servers", lambda: list(self.conn.compute.servers(details=True, tags=query)))
        out = []
        for s in servers:
            if s.status in ("DELETED", "SOFT_DELETED"):
                continue
            if s.status == "ERROR" and not s.fault:
                # Nova's list leaves the fault out: one GET of each failed server (rare) says why it failed
                s = self._server(s.id) or s
            out.append(self._instance(s))
        return out

    def _instance(self, s) -> Instance:
        md = s.metadata or {}
        tags = {t.split("=", 1)[0]: t.split("=", 1)[1] for t in (s.tags or []) if "=" in t}
        fault = ""
        if s.status == "ERROR":
            fault = (s.fault or {}).get("message", "") if isinstance(s.fault, dict) else str(s.fault or "")
        return Instance(id=s.id, name=s.name, pool=md.get(TAG_POOL) or tags.get(TAG_POOL, ""),
                        status=s.status or "BUILD", action_id=md.get(TAG_ACTION) or tags.get(TAG_ACTION, ""),
                        host=s.compute_host or s.hypervisor_hostname, created_at=_ts(s.created_at) or self.clock.now(),
                        fault=fault, no_room=s.status == "ERROR" and _no_room(fault))

    def instances(self) -> list[Instance]:
        out = self._servers()
        if self._ironic_pools():
            out.extend(self._ironic_instances())
        return out

    def find_instance(self, action_id: str) -> Instance | None:
        found = self._servers(f"{TAG_ACTION}={action_id}")
        if not found and self._ironic_pools():
            found = [i for i in self._ironic_instances() if i.action_id == action_id]
        if len(found) > 1:
            log.warning("%d instances carry action %s; adopting the oldest", len(found), action_id)
        return min(found, key=lambda i: (i.created_at, i.id)) if found else None

    def create_instance(self, pool: PoolSpec, name: str, action_id: str) -> Instance:
        if self.options.pool(pool.name).via == "ironic":
            return self._ironic_create(pool, name, action_id)
        po = self.options.pool(pool.name)
        flavor = self._flavor(pool)
        image = self._image(po.image or pool.image or self.options.image, pool)
        tags = [f"{TAG_REGION}={self.region.name}", f"{TAG_POOL}={pool.name}", f"{TAG_ACTION}={action_id}"]
        for t in tags:
            if len(t) > 60 or "," in t or "/" in t:
                raise ConfigError(f"tag {t!r} is not a valid Nova tag (≤ 60 characters, no ',' or '/')")
        attrs: dict[str, Any] = {
            "name": name, "flavor_id": flavor.id, "image_id": image,
            "networks": _networks(po.networks or pool.networks or self.options.networks),
            "metadata": {TAG_REGION: self.region.name, TAG_POOL: pool.name, TAG_ACTION: action_id},
            "tags": tags,
        }
        if pool.az:
            attrs["availability_zone"] = pool.az
        if self.options.key_name:
            attrs["key_name"] = self.options.key_name
        if self.options.user_data:
            ud = self.options.user_data.format(name=name, pool=pool.name, region=self.region.name, action_id=action_id)
            attrs["user_data"] = base64.b64encode(ud.encode()).decode()
        server = self._call(f"nova create server in pool {pool.name}", lambda: self.conn.compute.create_server(**attrs))
        log.info("created server %s (%s) in pool %s for action %s", server.id, name, pool.name, action_id)
        # No wait for the scheduler's verdict (rule 2): NoValidHost shows in a later pass as an ERROR
        # server with its fault (``Instance.no_room``); that pass fails the node and remembers the pool.
        return Instance(id=server.id, name=name, pool=pool.name, status="BUILD", action_id=action_id,
                        created_at=self.clock.now())

    def _flavor(self, pool: PoolSpec):
        """The pool's Nova flavor (one flavor list per process); ConfigError when it does not exist."""
        if pool.flavor not in self._flavors:
            flavors = self._call("nova list flavors", lambda: list(self.conn.compute.flavors(details=True)))
            self._flavors = {**{f.id: f for f in flavors}, **{f.name: f for f in flavors}}
            if pool.flavor not in self._flavors:
                raise ConfigError(f"flavor {pool.flavor!r} of pool {pool.name!r} does not exist in cloud "
                                  f"{self.cloud_name!r}", hint="`openstack flavor list` shows the flavors")
        return self._flavors[pool.flavor]

    def _image(self, ref: str | None, pool: PoolSpec) -> str:
        if not ref:
            raise ConfigError(f"pool {pool.name!r} has no image",
                              hint=f"set regions.{self.region.name}.openstack.image or the pool's image")
        if ref not in self._images:
            img = self._call("glance find image", lambda: self.conn.image.find_image(ref, ignore_missing=True))
            if img is None:
                raise ConfigError(f"image {ref!r} of pool {pool.name!r} does not exist in cloud {self.cloud_name!r}")
            self._images[ref] = img.id
        return self._images[ref]

    def delete_instance(self, instance_id: str) -> None:
        if instance_id.startswith(ALLOC_PREFIX):
            return self._ironic_unclaim(instance_id[len(ALLOC_PREFIX):])
        if instance_id.startswith(IRONIC_PREFIX):
            return self._ironic_delete(instance_id[len(IRONIC_PREFIX):])
        self._call(f"nova delete server {instance_id}",
                   lambda: self.conn.compute.delete_server(instance_id, ignore_missing=True))
        log.info("deleted server %s", instance_id)

    def released(self, instance_id: str) -> bool:
        """The server is gone and Placement holds no allocation for it (a read: nothing is changed)."""
        if instance_id.startswith(ALLOC_PREFIX):
            return self._ironic_claim_released(instance_id[len(ALLOC_PREFIX):])
        if instance_id.startswith(IRONIC_PREFIX):
            return self._ironic_released(instance_id[len(IRONIC_PREFIX):])
        return self._server_gone(instance_id) and self._allocations_freed(instance_id)

    def _server_gone(self, instance_id: str) -> bool:
        s = self._server(instance_id)
        return s is None or s.status in ("DELETED", "SOFT_DELETED")

    def _allocations_freed(self, instance_id: str) -> bool:
        allocs = self._placement(f"/allocations/{instance_id}") or {}
        return not allocs.get("allocations")

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
            time.sleep(self._until_next_poll(instance_id))

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
                gone = gone or self._server_gone(instance_id)
                done = gone and self._allocations_freed(instance_id)
            if done:
                break
            if time.monotonic() - t0 >= bound:
                raise TemporaryError(f"instance {instance_id}: not released {bound}s after delete "
                                     "(server still listed or Placement allocations not freed)",
                                     hint="escalate to the cloud operators: a stuck delete holds capacity")
            time.sleep(POLL_SECONDS)
        self._seen.pop(instance_id, None)
        return time.monotonic() - t0

    def _get_instance(self, instance_id: str) -> Instance | None:
        if instance_id.startswith((IRONIC_PREFIX, ALLOC_PREFIX)):
            return next((i for i in self._ironic_instances() if instance_id in (i.id, i.claim)), None)
        s = self._server(instance_id)
        if s is None or s.status in ("DELETED", "SOFT_DELETED"):
            return None
        return self._instance(s)

    def _server(self, instance_id: str):
        """One GET of the server; None when Nova no longer knows it."""
        try:
            s = self._call("nova get server", lambda: self.conn.compute.get_server(instance_id))
        except NotFoundError:
            s = None
        self._saw(instance_id, s)
        return s

    def _saw(self, instance_id: str, server) -> None:
        """Remember the last read of a server (bounded: stale entries go when the map grows)."""
        now = time.monotonic()
        if len(self._seen) > 256:
            for k in [k for k, (t, _) in list(self._seen.items()) if now - t >= POLL_SECONDS]:
                self._seen.pop(k, None)
        self._seen[instance_id] = (now, server)

    def _until_next_poll(self, instance_id: str) -> float:
        """Seconds to sleep so that the next read comes one interval after the last one."""
        seen = self._seen.get(instance_id)
        if seen is None:
            return POLL_SECONDS
        return min(POLL_SECONDS, max(0.0, POLL_SECONDS - (time.monotonic() - seen[0])))

    # -- Ironic, directly (pools with via = "ironic") ----------------------------------------

    def _ironic_pools(self) -> list[str]:
        return [n for n in self.region.pools if self.options.pool(n).via == "ironic"]

    def _allocations(self) -> list:
        def get():
            return list(self.conn.baremetal.allocations(details=True))

        allocs = self._call("ironic list allocations", get)
        return [a for a in allocs if (a.extra or {}).get(TAG_REGION) == self.region.name]

    def _ironic_nodes(self, resource_class: str | None = None) -> list:
        q: dict[str, Any] = {"details": True}
        if resource_class:
            q["resource_class"] = resource_class
        return self._call("ironic list nodes", lambda: list(self.conn.baremetal.nodes(**q)))

    def _ironic_hosts(self, pool: PoolSpec, ours: dict[str, str]) -> list[HostCapacity]:
        mine = {a.node_id: a for a in self._allocations() if a.node_id}
        out = []
        for n in self._ironic_nodes(pool.resource_class):
            a = mine.get(n.id)
            is_ours = a is not None and (a.extra or {}).get(TAG_POOL) == pool.name
            # what Ironic's allocation API would pick: available, powered (any state), not in maintenance, unclaimed
            free = (n.provision_state == "available" and not n.is_maintenance and not n.instance_id
                    and not n.allocation_id and n.power_state is not None)
            used_other = Shape() if (free or is_ours) else pool.shape
            out.append(HostCapacity(n.name or n.id, pool.name, pool.shape, used_other, 1 if is_ours else 0))
        return out

    def _ironic_instances(self) -> list[Instance]:
        allocs = self._allocations()
        if not allocs:
            return []
        nodes = {n.id: n for n in self._ironic_nodes()}
        return [self._ironic_instance(a, nodes.get(a.node_id) if a.node_id else None) for a in allocs]

    def _ironic_instance(self, a, n) -> "_IronicInstance":
        """One of our allocations as an instance: a claim still allocating (``ironic-alloc:``), a claim
        that has its node and waits for the deploy (step "deploy"), a deploying or active node."""
        ex = a.extra or {}
        fault, no_room, step = "", False, ""
        if a.state == "error":
            status, fault, no_room = "ERROR", a.last_error or "no node available", True
        elif not a.node_id:
            status = "BUILD"  # Ironic has not picked a node yet
        elif n is None:
            status, fault = "ERROR", f"node {a.node_id} of allocation {a.id} no longer exists"
        elif n.provision_state == "active":
            status = "ACTIVE"
        elif n.provision_state in ("deploy failed", "error"):
            status, fault = "ERROR", n.last_error or n.provision_state
        elif n.provision_state == "available" and not n.target_provision_state:
            status, step = "BUILD", "deploy"  # claimed, not yet deployed: advance() deploys it
        else:
            status = "BUILD"
        iid = IRONIC_PREFIX + a.node_id if a.node_id else ALLOC_PREFIX + a.id
        return _IronicInstance(id=iid, name=a.name or a.id, pool=ex.get(TAG_POOL, ""), status=status,
                               action_id=ex.get(TAG_ACTION, ""), host=n.name if n is not None else None,
                               created_at=_ts(a.created_at) or self.clock.now(), fault=fault, no_room=no_room, step=step,
                               claim=ALLOC_PREFIX + a.id)

    def ironic_node_state(self, instance_id: str) -> dict:
        """The Ironic node behind an instance: provision/power state and target (deadline arithmetic, operators)."""
        uuid = instance_id[len(IRONIC_PREFIX):] if instance_id.startswith(IRONIC_PREFIX) else instance_id
        n = self._call("ironic get node", lambda: self.conn.baremetal.get_node(uuid))
        return {"node": n.id, "name": n.name, "provision_state": n.provision_state,
                "target_provision_state": n.target_provision_state, "power_state": n.power_state,
                "maintenance": n.is_maintenance, "last_error": n.last_error}

    def _ironic_create(self, pool: PoolSpec, name: str, action_id: str) -> Instance:
        """Claim a node of the pool's resource class (an Ironic allocation) and return at once: Ironic
        picks the node in the background, and a later pass deploys it (:meth:`advance`, step "deploy").
        CapacityError at once when no node of the class is free (counting claims still allocating)."""
        bm = self.conn.baremetal
        # claims first, nodes second: a claim that gets its node in between counts twice (safe), never zero times
        waiting = [a for a in self._call("ironic list allocations",
                                         lambda: list(bm.allocations(state="allocating")))
                   if a.resource_class == pool.resource_class]
        free = [n for n in self._ironic_nodes(pool.resource_class)
                if n.provision_state == "available" and not n.is_maintenance and not n.instance_id
                and not n.allocation_id and n.power_state is not None]
        if len(free) <= len(waiting):
            raise CapacityError(f"pool {pool.name}: no available {pool.resource_class} node "
                                f"({len(free)} free, {len(waiting)} claim(s) allocating)", details={"pool": pool.name})
        extra = {TAG_REGION: self.region.name, TAG_POOL: pool.name, TAG_ACTION: action_id}
        po = self.options.pool(pool.name)
        alloc = self._call(f"ironic allocate a {pool.resource_class} node", lambda: bm.create_allocation(
            resource_class=pool.resource_class, name=_hostname(name), extra=extra, traits=list(po.traits)))
        log.info("claimed an Ironic %s node for pool %s, action %s (allocation %s)", pool.resource_class,
                 pool.name, action_id, alloc.id)
        return self._ironic_instance(alloc, None) if not alloc.node_id else Instance(
            id=IRONIC_PREFIX + alloc.node_id, name=name, pool=pool.name, status="BUILD", action_id=action_id,
            created_at=self.clock.now(), step="deploy")

    def advance(self, instance: Instance) -> Instance:
        """Deploy a claimed Ironic node (step "deploy"): the image, the config drive, provision "active".
        One round of calls, no wait; a Nova server goes on by itself and is returned as it is."""
        if instance.step != "deploy" or not instance.id.startswith(IRONIC_PREFIX):
            return instance
        bm = self.conn.baremetal
        node_id = instance.id[len(IRONIC_PREFIX):]
        pool = self.region.pools.get(instance.pool)
        if pool is None:
            raise ConfigError(f"Ironic node {node_id} is claimed for pool {instance.pool!r}, which the region "
                              "does not have")
        po = self.options.pool(pool.name)
        image = self._image(po.image or pool.image or self.options.image, pool)
        info = {"image_source": image, "display_name": instance.name}
        self._call("ironic set instance_info", lambda: bm.patch_node(node_id, [
            {"op": "add", "path": "/instance_info", "value": info}]))
        ud = None
        if self.options.user_data:
            ud = {"user_data": self.options.user_data.format(name=instance.name, pool=pool.name,
                                                            region=self.region.name, action_id=instance.action_id)}
        self._call("ironic deploy node", lambda: bm.set_node_provision_state(node_id, "active", config_drive=ud))
        log.info("deploying Ironic node %s (%s) for pool %s, action %s", node_id, instance.name, pool.name,
                 instance.action_id)
        return replace(instance, step="")

    def _ironic_unclaim(self, alloc_id: str) -> None:
        """Give up a claim: undeploy its node if it has one by now, else delete the allocation."""
        bm = self.conn.baremetal
        a = self._allocation(alloc_id)
        if a is None:
            return
        if a.node_id:
            return self._ironic_delete(a.node_id)
        self._call("ironic delete allocation", lambda: bm.delete_allocation(a, ignore_missing=True))

    def _allocation(self, alloc_id: str):
        """One GET of an allocation; None when Ironic no longer has it."""
        try:
            return self._call("ironic get allocation", lambda: self.conn.baremetal.get_allocation(alloc_id))
        except NotFoundError:
            return None

    def _ironic_claim_released(self, alloc_id: str) -> bool:
        a = self._allocation(alloc_id)
        if a is None:
            return True
        return bool(a.node_id) and self._ironic_released(a.node_id)

    def _ironic_delete(self, node_id: str) -> None:
        bm = self.conn.baremetal
        n = self._call("ironic get node", lambda: bm.find_node(node_id, ignore_missing=True))
        if n is None:
            return  # the node is gone: nothing to delete
        if n.provision_state in ("active", "deploy failed", "error", "wait call-back"):
            self._call("ironic undeploy node", lambda: bm.set_node_provision_state(node_id, "deleted"))
            log.info("undeploying Ironic node %s", node_id)
        elif n.provision_state in ("deploying",):
            raise TemporaryError(f"Ironic node {node_id} is still deploying; undeploy next pass")
        elif n.provision_state == "available" and n.allocation_id:
            # never deployed, or undeployed with the claim kept: drop the claim if it is ours
            alloc = self._allocation(n.allocation_id)
            if alloc is not None and (alloc.extra or {}).get(TAG_REGION) == self.region.name:
                self._call("ironic delete allocation", lambda: bm.delete_allocation(alloc, ignore_missing=True))

    def _ironic_released(self, node_id: str) -> bool:
        """The node is back: available, no instance, no claim (a read; delete_instance drops a kept claim)."""
        n = self._call("ironic get node", lambda: self.conn.baremetal.find_node(node_id, ignore_missing=True))
        if n is None:
            return True
        return n.provision_state == "available" and not n.instance_id and not n.allocation_id


@dataclass(frozen=True, slots=True)
class _IronicInstance(Instance):
    """An Ironic instance with its claim's id, which stays when the id moves to the node's."""

    claim: str = ""


def _no_room(fault: str) -> bool:
    """A build fault that means the pool is full (NoValidHost and kin), or no fault said at all."""
    return not fault or any(f in fault.lower() for f in CAPACITY_FAULTS)


def _rc(resource_class: str) -> str:
    """An Ironic resource class as Placement spells it (CUSTOM_…, upper case, [A-Z0-9_])."""
    if resource_class.startswith("CUSTOM_") or resource_class in ("VCPU", "MEMORY_MB", "DISK_GB", "VGPU"):
        return resource_class
    return "CUSTOM_" + re.sub(r"[^A-Z0-9_]", "_", resource_class.upper())


def _hostname(name: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", name.lower())[:63]


def _networks(spec: str) -> Any:
    spec = (spec or "none").strip()
    if spec in ("none", "auto"):
        return spec
    return [{"uuid": n.strip()} for n in spec.split(",") if n.strip()]
