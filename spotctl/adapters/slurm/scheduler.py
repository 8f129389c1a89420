"""The :class:`~spotctl.core.ports.SchedulerPort` of Slurm: pending jobs in, drain / resume / forget out.

:class:`SlurmScheduler` is the REST client (:mod:`.rest`) plus what the port means in Slurm's terms:
which nodes are ours (``node_name``, ``node_prefix``), which pending jobs more nodes would start
(:func:`.parsing.job_units`), and node updates — over REST from v0.0.39 (Slurm 23.02), through
``scontrol`` (:mod:`.scontrol`) before that; requeueing jobs and reservations always go through
``scontrol`` (no REST version offers them).
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from typing import Any

from spotctl.core.config import RegionConfig
from spotctl.core.errors import ConfigError, NotFoundError, TemporaryError, UnavailableError
from spotctl.core.models import DrainProgress, Exclusion, NodeUsage, PoolSpec, Scheduler, Shape, WorkUnit
from spotctl.core.ports import Clock
from spotctl.core.secrets import SecretFile
from spotctl.core.timefmt import iso

from .parsing import _flags, _gpus, _num, _text, expand_hostlist, job_units, short_of_nodes, version_key
from .rest import NODE_UPDATE_FROM, SUPPORTED_VERSIONS, SlurmRest, _Token
from .scontrol import Scontrol, one_word

log = logging.getLogger(__name__)

JOBS_CACHE_SECONDS = 2.0  # pending() and usage() of one pass share one /jobs read


class SlurmScheduler(SlurmRest):
    """A :class:`~spotctl.core.ports.SchedulerPort` backed by slurmrestd (and ``scontrol`` where needed)."""

    remote = True  # its calls cross the network: a pass reads it in a thread, under its observe deadline

    name = "slurm"

    def __init__(self, url: str, user: str, token: _Token, *, api_version: str | None = None,
                 scontrol: str | None = "scontrol", slurm_conf: str | None = None, timeout: float = 10.0,
                 verify: bool | str = True, node_name: str = "{node}", node_prefix: str = "spot-",
                 default_time_limit: int = 3600, drain_via: str = "auto", clock: Clock | None = None):
        if node_name.count("{node}") != 1:
            raise ConfigError("slurm: node_name must contain {node} exactly once", hint='e.g. node_name = "{node}"')
        super().__init__(url, user, token, api_version=api_version, scontrol=scontrol, slurm_conf=slurm_conf,
                         timeout=timeout, verify=verify, clock=clock)
        self._name_head, self._name_tail = node_name.split("{node}")
        self.node_prefix = node_prefix
        self.default_time_limit = default_time_limit
        self.drain_via = drain_via
        self._jobs_cache: tuple[float, list[dict[str, Any]]] | None = None
        self.skipped_malformed = 0

    # --- construction -----------------------------------------------------------

    @classmethod
    def from_config(cls, region: RegionConfig, clock: Clock | None = None) -> SlurmScheduler:
        """Build from ``[regions.R.slurm]``; the API version is discovered on first use, inside the pass."""
        c = region.section("slurm") or {}
        where = f"regions.{region.name}.slurm"
        url = c.get("url")
        if not url:
            raise ConfigError(f"{where}.url must be set (slurmrestd base URL, e.g. http://slurm-ctl:6820)")
        if not re.match(r"^https?://", url):
            raise ConfigError(f"{where}.url must start with http:// or https://, got {url!r}")
        user = c.get("user")
        if not user:
            raise ConfigError(f"{where}.user must be set (the Slurm user the token belongs to)")
        sources = [k for k in ("token", "token_file", "token_env") if c.get(k)]
        if len(sources) != 1:
            raise ConfigError(f"{where}: set exactly one of token, token_file, token_env",
                              hint="a token file (re-read when it changes) is best: scontrol token username=USER")
        if c.get("token"):
            token = _Token(source=f"{where}.token", value=c["token"])
        elif c.get("token_file"):
            token = _Token(source=f"{where}.token_file ({c['token_file']})",
                           file=SecretFile(c["token_file"], setting=f"{where}.token_file"))
        else:
            token = _Token(source=f"environment variable {c['token_env']}", env=c["token_env"])
        version = c.get("api_version")
        if version is not None:
            version = version if version.startswith("v") else f"v{version}"
            if version not in SUPPORTED_VERSIONS:
                raise ConfigError(f"{where}.api_version {version!r} is not supported",
                                  hint=f"supported: {', '.join(SUPPORTED_VERSIONS)}")
        slurm_conf = c.get("slurm_conf")
        if slurm_conf and not os.path.isfile(slurm_conf):
            raise ConfigError(f"{where}.slurm_conf {slurm_conf!r} does not exist")
        drain_via = c.get("drain_via", "auto")
        if drain_via not in ("auto", "rest", "scontrol"):
            raise ConfigError(f"{where}.drain_via must be auto, rest or scontrol")
        timeout = float(c.get("timeout_seconds", 10))
        if timeout <= 0:
            raise ConfigError(f"{where}.timeout_seconds must be > 0")
        verify: bool | str = c.get("ca_file") or c.get("verify_tls", True)
        return cls(url, user, token, api_version=version, scontrol=c.get("scontrol", "scontrol"),
                   slurm_conf=slurm_conf, timeout=timeout, verify=verify,
                   node_name=c.get("node_name", "{node}"), node_prefix=c.get("node_prefix", "spot-"),
                   default_time_limit=int(c.get("default_time_limit_seconds", 3600)), drain_via=drain_via,
                   clock=clock)

    def __repr__(self) -> str:
        return f"<SlurmScheduler {self.url} {self.api_version or 'undiscovered'}>"

    # --- nodes: names -------------------------------------------------------------

    def slurm_name(self, node: str) -> str:
        """The Slurm NodeName of one of our nodes."""
        return f"{self._name_head}{node}{self._name_tail}"

    def node_id(self, slurm_name: str) -> str | None:
        """Our node id for a Slurm node name, or None when the node is not one of ours."""
        head, tail = self._name_head, self._name_tail
        if not slurm_name.startswith(head) or not slurm_name.endswith(tail) or len(slurm_name) <= len(head) + len(tail):
            return None
        node = slurm_name[len(head): len(slurm_name) - len(tail)] if tail else slurm_name[len(head):]
        return node if node.startswith(self.node_prefix) else None

    # --- reads ----------------------------------------------------------------------

    def _jobs(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        cached = self._jobs_cache
        if cached is not None and now - cached[0] < JOBS_CACHE_SECONDS:
            return cached[1]
        jobs = self._list("jobs", "jobs")
        self._jobs_cache = (now, jobs)
        return jobs

    def nodes(self) -> list[dict[str, Any]]:
        """Every Slurm node as slurmrestd reports it (``/nodes``: ``/node/{name}`` has wrong partitions in 22.05)."""
        return self._list("nodes", "nodes")

    def node(self, node: str) -> dict[str, Any]:
        """The Slurm record of one of our nodes; NotFoundError when Slurm does not know it."""
        name = self.slurm_name(node)
        for n in self.nodes():
            if n.get("name") == name:
                return n
        raise NotFoundError(f"slurm: no node named {name!r}")

    def _partitions(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self._list("partitions", "partitions") if p.get("name")}

    # --- demand ---------------------------------------------------------------------

    def pending(self, pools: dict[str, PoolSpec]) -> tuple[list[WorkUnit], list[Exclusion]]:
        """Pending jobs more nodes would start, as work units; the others with the reason why not."""
        jobs = self._jobs()
        pending = [j for j in jobs if "PENDING" in _flags(j.get("job_state"))]
        partitions = self._partitions() if any(_text(j.get("state_reason")) == "PartitionNodeLimit"
                                               for j in pending) else {}
        short = short_of_nodes(pending)
        units: list[WorkUnit] = []
        excluded: list[Exclusion] = []
        malformed = 0
        for j in pending:
            try:
                u, x = self._job_units(j, pools, partitions, short)
            except (KeyError, TypeError, ValueError) as e:
                malformed += 1
                jid = j.get("job_id") if isinstance(j.get("job_id"), (int, str)) else "?"
                log.warning("slurm: skipped malformed job %s: %s: %s", jid, type(e).__name__, e)
                excluded.append(Exclusion(f"slurm/{jid}", Scheduler.SLURM, "malformed job object (skipped)"))
                continue
            units.extend(u)
            if x is not None:
                excluded.append(x)
        self.skipped_malformed = malformed
        return units, excluded

    def _job_units(self, j: dict[str, Any], pools: dict[str, PoolSpec], partitions: dict[str, dict[str, Any]],
                   short_of_nodes: set[str]) -> tuple[list[WorkUnit], Exclusion | None]:
        """One pending job as work units (:func:`.parsing.job_units` with this region's default duration)."""
        return job_units(j, pools, partitions, short_of_nodes, self.default_time_limit)

    # --- usage ----------------------------------------------------------------------

    def usage(self) -> list[NodeUsage]:
        """What runs on each of our nodes, and whether it is drained."""
        now = self.clock.now()
        running: dict[str, int] = {}
        # per host: the latest start of a job running there (None once one of them has no readable start:
        # its run time is not known, and consolidation does not preempt what it does not know)
        started: dict[str, float | None] = {}
        for j in self._jobs():
            if "RUNNING" in _flags(j.get("job_state")) or "COMPLETING" in _flags(j.get("job_state")):
                start = _job_start(j)
                for host in expand_hostlist(_text(j.get("nodes"))):
                    running[host] = running.get(host, 0) + 1
                    if host not in started:
                        started[host] = start
                    elif started[host] is not None:
                        had = started[host]
                        started[host] = None if start is None or had is None else max(had, start)
        out = []
        for n in self.nodes():
            name = n.get("name")
            if not isinstance(name, str) or (node := self.node_id(name)) is None:
                continue
            try:
                flags = _flags(n.get("state")) | _flags(n.get("state_flags"))
                used = Shape(int(_num(n.get("alloc_cpus"), 0) or 0), int(_num(n.get("alloc_memory"), 0) or 0),
                             _gpus(_text(n.get("gres_used"))))
                last = _num(n.get("last_busy"))
            except (TypeError, ValueError) as e:
                log.warning("slurm: skipped malformed node %s: %s", name, e)
                continue
            k = running.get(name, 0)
            out.append(NodeUsage(node=node, scheduler=Scheduler.SLURM, used=used, running=k,
                                 cordoned=bool(flags & {"DRAIN", "DRAINED", "DRAINING"}),
                                 last_busy_at=now if k else (float(last) if last else None),
                                 work_started_at=started.get(name) if k else None))
        return out

    # --- node updates -----------------------------------------------------------------

    def drain_method(self) -> str:
        """How node updates are made: ``rest`` (v0.0.39+) or ``scontrol``; ConfigError when neither works."""
        version = self.discover()
        rest_ok = bool(version) and version_key(version) >= version_key(NODE_UPDATE_FROM)
        if self.drain_via in ("auto", "rest") and rest_ok:
            return "rest"
        if self.drain_via in ("auto", "scontrol") and self.scontrol:
            return "scontrol"
        why = []
        if not rest_ok:
            why.append(f"slurmrestd API {version or '(not discovered)'} cannot update nodes (needs "
                       f"{NODE_UPDATE_FROM}, Slurm 23.02+)")
        elif self.drain_via == "scontrol":
            why.append("drain_via = scontrol")
        if not self.scontrol:
            why.append(f"scontrol ({self.scontrol_configured}) was not found")
        raise ConfigError("slurm: cannot update nodes: " + "; ".join(why),
                          hint="install slurm-client on this host (scontrol) or upgrade slurmrestd")

    def cordon(self, node: str, reason: str) -> None:
        """DRAIN the node with our reason: no new jobs; running ones go on."""
        self._update(node, "DRAIN", reason)

    def drain(self, node: str, reason: str, deadline: float | None, force: bool = False) -> DrainProgress:
        """One drain round: DRAIN with our reason, then requeue the node's running jobs (they restart
        elsewhere). Requeueing is already the forceful move, so ``force`` changes nothing here. Jobs
        still completing on the node (requeued, their steps not yet gone) count as remaining."""
        name = self.slurm_name(node)
        self._update(node, "DRAIN", reason)
        self._jobs_cache = None
        on_node = [j for j in self._jobs() if name in expand_hostlist(_text(j.get("nodes")))
                   and isinstance(j.get("job_id"), int)]
        self._jobs_cache = None
        ids = sorted({int(j["job_id"]) for j in on_node
                      if {"RUNNING", "CONFIGURING", "SUSPENDED"} & _flags(j.get("job_state"))})
        leaving = sum(1 for j in on_node if "COMPLETING" in _flags(j.get("job_state"))
                      and int(j["job_id"]) not in ids)
        if not ids:
            return DrainProgress(scheduler=self.name, remaining=leaving)
        sc = self.scontrol
        if sc is None:
            raise UnavailableError(f"slurm: drained {name} but cannot requeue its jobs {ids}: no scontrol on this host")
        failed = []
        for jid in ids:
            rc, out = sc.run(["requeue", str(jid)])
            if rc != 0:
                failed.append(f"{jid}: {out}")
        if failed:
            raise TemporaryError(f"slurm: drained {name}; requeue failed for " + "; ".join(failed))
        log.info("slurm: drained %s and requeued jobs %s", name, ids)
        # requeued jobs leave the node as their steps end: they count until a later round sees them gone
        return DrainProgress(scheduler=self.name, remaining=leaving + len(ids), moved=len(ids))

    def protect(self, node: str, until: float | None, closed: bool = False) -> None:
        """A maintenance reservation ``spotctl-<node>`` on the node from ``until`` on (Flags=MAINT,IGNORE_JOBS):
        Slurm then starts no job there whose time limit crosses ``until`` — the way sites protect a
        maintenance window. ``closed`` changes nothing (the reservation already judges each job by its
        time limit). ``until=None`` deletes the reservation. Through scontrol (no REST version creates
        reservations)."""
        name = self.slurm_name(node)
        self.node(node)  # NotFoundError when Slurm does not know the node
        sc = self.scontrol
        if sc is None:
            raise UnavailableError(f"slurm: cannot reserve {name} from its safe-until time: no scontrol on this host",
                                   hint="install slurm-client on this host (scontrol)")
        res = f"spotctl-{name}"
        if until is None:
            rc, out = sc.run(["delete", f"ReservationName={res}"])
            if rc != 0 and "invalid" not in out.lower():
                sc.fail(out, f"delete reservation {res}")
            return
        # scontrol reads times without a zone in its TZ, which Scontrol sets to UTC
        start = "now" if until <= self.clock.now() + 1 else (iso(until) or "").removesuffix("Z")
        rc, out = sc.run(["update", f"ReservationName={res}", f"StartTime={start}"])
        if rc != 0 and "invalid" in out.lower():  # none yet: create it
            rc, out = sc.run(["create", "reservation", f"ReservationName={res}", f"StartTime={start}",
                              "Duration=UNLIMITED", f"Nodes={name}", "Users=root", "Flags=MAINT,IGNORE_JOBS"])
        if rc != 0:
            sc.fail(out, f"reserve {name} from {start} UTC")
        log.info("slurm: %s reserved from %s UTC (%s): no job crossing it starts there", name, start, res)

    def resume(self, node: str) -> None:
        """Clear DRAIN (and DOWN): the node takes work again."""
        try:
            self._update(node, "RESUME", None)
        except TemporaryError as e:
            if "Invalid node state" not in e.message:
                raise
            # not drained (or already resumed): resuming is idempotent, nothing to do

    def forget(self, node: str, reason: str) -> None:
        """The instance is gone: set the node DOWN with a reason; delete it when it is a dynamic node.

        Idempotent: a node Slurm does not know any more is already forgotten.
        """
        name = self.slurm_name(node)
        try:
            rec = self.node(node)
        except NotFoundError:
            return
        flags = _flags(rec.get("state")) | _flags(rec.get("state_flags"))
        self._update(node, "DOWN", reason or "spot instance gone")
        if self.scontrol:  # our reservation goes with the node (a reserved node cannot be deleted)
            self.scontrol.run(["delete", f"ReservationName=spotctl-{name}"])
        if flags & {"DYNAMIC_NORM", "DYNAMIC_FUTURE", "DYNAMIC"}:
            self._delete(node)
            log.info("slurm: deleted dynamic node %s", name)

    def _by_scontrol(self) -> Scontrol:
        """scontrol, for a node update drain_method() sent its way (so there is one)."""
        assert self.scontrol is not None, "drain_method() is scontrol only when scontrol was found"
        return self.scontrol

    def _update(self, node: str, state: str, reason: str | None) -> None:
        name = self.slurm_name(node)
        if self.drain_method() == "rest":
            body: dict[str, Any] = {"state": [state]}
            if reason:
                body["reason"] = reason
            self._api(f"node/{name}", method="POST", json_body=body, what=f"update node {name} to {state}")
            return
        args = ["update", f"nodename={name}", f"state={state}"]
        if reason:
            args.append(f"reason={one_word(reason)}")
        sc = self._by_scontrol()
        rc, out = sc.run(args)
        if rc != 0:
            sc.fail(out, f"update node {name} to {state}")

    def _delete(self, node: str) -> None:
        name = self.slurm_name(node)
        if self.drain_method() == "rest":
            self._api(f"node/{name}", method="DELETE", what=f"delete node {name}")
            return
        sc = self._by_scontrol()
        rc, out = sc.run(["delete", f"nodename={name}"])
        if rc != 0:
            sc.fail(out, f"delete node {name}")


def _job_start(j: dict[str, Any]) -> float | None:
    """A running job's start time (epoch seconds), or None when slurmrestd gives none that is a time."""
    try:
        v = _num(j.get("start_time"))
    except ValueError:
        return None
    if v is None or not math.isfinite(v) or v <= 0:
        return None
    return float(v)
