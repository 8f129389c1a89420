"""Nova (and Glance for images): our servers as instances, creating and deleting them, flavors, host
aggregates, and the project's quota.

Our servers carry the tags ``spotctl:region=R``, ``spotctl:pool=P`` and ``spotctl:action=A`` and the
same keys as metadata, so a later pass finds what an earlier one created (:meth:`Nova.servers`).
The last read of each server is remembered, so that bounded waits read a server at most once per
:data:`~.api.POLL_SECONDS` (:meth:`Nova.until_next_poll`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from spotctl.core.errors import ConfigError, NotFoundError
from spotctl.core.models import Instance, PoolSpec, Quota

from .api import POLL_SECONDS, TAG_ACTION, TAG_POOL, TAG_REGION, Api, _ts

if TYPE_CHECKING:
    from openstack.compute.v2.server import Server

log = logging.getLogger(__name__)

CAPACITY_FAULTS = ("no valid host", "exceeded maximum number of retries", "insufficient", "not enough",
                   "quota exceeded")  # the last: Nova's quota recheck after scheduling


def _no_room(fault: str) -> bool:
    """A build fault that means the pool is full (NoValidHost and kin), or no fault said at all."""
    return not fault or any(f in fault.lower() for f in CAPACITY_FAULTS)


def _networks(spec: str) -> Any:
    """A ``networks`` option as Nova's ``networks`` value: "none", "auto" or a list of network uuids."""
    spec = (spec or "none").strip()
    if spec in ("none", "auto"):
        return spec
    return [{"uuid": n.strip()} for n in spec.split(",") if n.strip()]


class Nova:
    """Nova calls through the shared connection (flavors, images and aggregates are cached)."""

    def __init__(self, api: Api):
        self.api = api
        self._flavors: dict[str, Any] = {}
        self._images: dict[str, str] = {}
        self._aggregates: dict[str, Any] | None = None
        self._seen: dict[str, tuple[float, Server | None]] = {}  # server id -> (monotonic time of the read, server)
        #: Nova's hostId (sha224 of project id + host) -> host name, for the hosts of our pools: where a server
        #: landed when the policy hides OS-EXT-SRV-ATTR:host from spotctl's account (not admin)
        self.host_ids: dict[str, str] = {}

    def learn_hosts(self, project_id: str, names: list[str]) -> None:
        """Remember the hostId Nova shows our project for each host name (nova.utils.generate_hostid)."""
        for n in names:
            self.host_ids[hashlib.sha224((project_id + n).encode()).hexdigest()] = n

    # -- aggregates ----------------------------------------------------------------

    def aggregates(self) -> dict[str, Any]:
        """Every host aggregate by name, read now (Blazar moves hosts between aggregates)."""
        aggs = self.api.call("nova aggregates", lambda: list(self.api.conn.compute.aggregates()))
        self._aggregates = {a.name: a for a in aggs}
        return self._aggregates

    def aggregate_uuid(self, name: str) -> str:
        """A Nova host aggregate's uuid (Placement aggregates mirror Nova's)."""
        if self._aggregates is None or name not in self._aggregates:
            self.aggregates()
        agg = (self._aggregates or {}).get(name)
        if agg is None:
            raise ConfigError(f"aggregate {name!r} does not exist in cloud {self.api.cloud_name!r}",
                              hint="pools name Nova host aggregates (`openstack aggregate list`)")
        return agg.uuid

    # -- quota ---------------------------------------------------------------------

    def quota(self, project_id: str) -> Quota:
        """What the project may still launch (None: unlimited), after what it uses and has reserved."""
        q = self.api.call("nova quota", lambda: self.api.conn.compute.get_quota_set(project_id, usage=True))
        usage = q.usage or {}
        reserved = q.reservation or {}

        def left(limit: int | None, key: str) -> int | None:
            if limit is None or limit < 0:
                return None
            return max(0, limit - usage.get(key, 0) - reserved.get(key, 0))

        return Quota(instances=left(q.instances, "instances"), vcpu=left(q.cores, "cores"), ram_mb=left(q.ram, "ram"))

    # -- servers ---------------------------------------------------------------------

    def servers(self, *tags: str) -> list[Instance]:
        """Our servers in the region (and with ``tags``, ``key=value`` each) that are not deleted."""
        query = ",".join((f"{TAG_REGION}={self.api.region.name}",) + tags)
        servers = self.api.call("nova list servers",
                                lambda: list(self.api.conn.compute.servers(details=True, tags=query)))
        out = []
        for s in servers:
            if s.status in ("DELETED", "SOFT_DELETED"):
                continue
            if s.status == "ERROR" and not s.fault:
                # Nova's list leaves the fault out: one GET of each failed server (rare) says why it failed
                s = self.server(s.id) or s
            out.append(self.instance(s))
        return out

    def instance(self, s: Server) -> Instance:
        """A server as an instance: our tags (metadata first), its host, and why it failed when it did."""
        md = s.metadata or {}
        tags = {t.split("=", 1)[0]: t.split("=", 1)[1] for t in (s.tags or []) if "=" in t}
        fault = ""
        if s.status == "ERROR":
            fault = (s.fault or {}).get("message", "") if isinstance(s.fault, dict) else str(s.fault or "")
        return Instance(id=s.id, name=s.name, pool=md.get(TAG_POOL) or tags.get(TAG_POOL, ""),
                        status=s.status or "BUILD", action_id=md.get(TAG_ACTION) or tags.get(TAG_ACTION, ""),
                        host=s.compute_host or s.hypervisor_hostname or self.host_ids.get(s.host_id or ""),
                        created_at=_ts(s.created_at) or self.api.clock.now(),
                        fault=fault, no_room=s.status == "ERROR" and _no_room(fault))

    def get_instance(self, server_id: str) -> Instance | None:
        """One server read now as an instance; None when it is gone."""
        s = self.server(server_id)
        if s is None or s.status in ("DELETED", "SOFT_DELETED"):
            return None
        return self.instance(s)

    def server(self, server_id: str) -> Server | None:
        """One GET of the server; None when Nova no longer knows it."""
        try:
            s = self.api.call("nova get server", lambda: self.api.conn.compute.get_server(server_id))
        except NotFoundError:
            s = None
        self._saw(server_id, s)
        return s

    def gone(self, server_id: str) -> bool:
        """Nova no longer lists the server (or lists it deleted)."""
        s = self.server(server_id)
        return s is None or s.status in ("DELETED", "SOFT_DELETED")

    def create(self, pool: PoolSpec, name: str, action_id: str, *, host: str | None = None,
               avoid: tuple[str, ...] = ()) -> Instance:
        """Create a tagged server of the pool and return at once (BUILD): no wait for the scheduler's verdict.
        ``host``: a host-targeted boot (``host``, microversion ≥ 2.74; Nova's policy
        ``compute:servers:create:requested_destination``, admin by default; the scheduler still checks the
        host). ``avoid``: hosts kept out through a JsonFilter scheduler hint (``query``; a scheduler without
        JsonFilter in its enabled_filters ignores it without a word: the landing check then corrects)."""
        region = self.api.region.name
        options = self.api.options
        po = options.pool(pool.name)
        flavor = self.flavor(pool)
        image = self.image_for(pool)
        tags = [f"{TAG_REGION}={region}", f"{TAG_POOL}={pool.name}", f"{TAG_ACTION}={action_id}"]
        for t in tags:
            if len(t) > 60 or "," in t or "/" in t:
                raise ConfigError(f"tag {t!r} is not a valid Nova tag (≤ 60 characters, no ',' or '/')")
        attrs: dict[str, Any] = {
            "name": name, "flavor_id": flavor.id, "image_id": image,
            "networks": _networks(po.networks or pool.networks or options.networks),
            "metadata": {TAG_REGION: region, TAG_POOL: pool.name, TAG_ACTION: action_id},
            "tags": tags,
        }
        if pool.az:
            attrs["availability_zone"] = pool.az
        if host:
            attrs["host"] = host
        if avoid:
            attrs["scheduler_hints"] = {"query": json.dumps(["not", ["in", "$host", *avoid]])}
        if options.key_name:
            attrs["key_name"] = options.key_name
        ud = options.user_data_for(name=name, pool=pool.name, region=region, action_id=action_id)
        if ud is not None:
            attrs["user_data"] = base64.b64encode(ud.encode()).decode()
        server = self.api.call(f"nova create server in pool {pool.name}",
                               lambda: self.api.conn.compute.create_server(**attrs))
        log.info("created server %s (%s) in pool %s for action %s%s", server.id, name, pool.name, action_id,
                 f" on host {host}" if host else f" avoiding {len(avoid)} host(s)" if avoid else "")
        # No wait for the scheduler's verdict (rule 2): NoValidHost shows in a later pass as an ERROR
        # server with its fault (``Instance.no_room``); that pass fails the node and remembers the pool.
        return Instance(id=server.id, name=name, pool=pool.name, status="BUILD", action_id=action_id,
                        created_at=self.api.clock.now())

    def delete(self, server_id: str) -> None:
        """Delete the server (nothing when it is gone already)."""
        self.api.call(f"nova delete server {server_id}",
                      lambda: self.api.conn.compute.delete_server(server_id, ignore_missing=True))
        log.info("deleted server %s", server_id)

    def flavor(self, pool: PoolSpec) -> Any:
        """The pool's Nova flavor (one flavor list per process); ConfigError when it does not exist."""
        if pool.flavor not in self._flavors:
            flavors = self.api.call("nova list flavors", lambda: list(self.api.conn.compute.flavors(details=True)))
            self._flavors = {**{f.id: f for f in flavors}, **{f.name: f for f in flavors}}
            if pool.flavor not in self._flavors:
                raise ConfigError(f"flavor {pool.flavor!r} of pool {pool.name!r} does not exist in cloud "
                                  f"{self.api.cloud_name!r}", hint="`openstack flavor list` shows the flavors")
        return self._flavors[pool.flavor]

    def image_for(self, pool: PoolSpec) -> str:
        """The Glance image id a node of the pool boots (Nova servers and Ironic nodes alike), looked up once."""
        ref = self.api.options.image_ref(pool)
        if not ref:
            raise ConfigError(f"pool {pool.name!r} has no image",
                              hint=f"set regions.{self.api.region.name}.openstack.image or the pool's image")
        if ref not in self._images:
            img = self.api.call("glance find image", lambda: self.api.conn.image.find_image(ref, ignore_missing=True))
            if img is None:
                raise ConfigError(f"image {ref!r} of pool {pool.name!r} does not exist in cloud "
                                  f"{self.api.cloud_name!r}")
            self._images[ref] = img.id
        return self._images[ref]

    # -- read pacing (bounded waits) -------------------------------------------------------

    def _saw(self, server_id: str, server: Server | None) -> None:
        """Remember the last read of a server (bounded: stale entries go when the map grows)."""
        now = time.monotonic()
        if len(self._seen) > 256:
            for k in [k for k, (t, _) in list(self._seen.items()) if now - t >= POLL_SECONDS]:
                self._seen.pop(k, None)
        self._seen[server_id] = (now, server)

    def until_next_poll(self, server_id: str) -> float:
        """Seconds to sleep so that the next read comes one interval after the last one."""
        seen = self._seen.get(server_id)
        if seen is None:
            return POLL_SECONDS
        return min(POLL_SECONDS, max(0.0, POLL_SECONDS - (time.monotonic() - seen[0])))

    def forget(self, server_id: str) -> None:
        """Drop the remembered read of a server that is gone for good."""
        self._seen.pop(server_id, None)
