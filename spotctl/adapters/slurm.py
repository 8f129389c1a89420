"""Slurm through slurmrestd: pending jobs in, drain / resume / forget out.

Configured by a region's ``[regions.R.slurm]`` table::

    [regions.lab.slurm]
    url = "http://slurm-ctl:6820"       # slurmrestd (auth/jwt)
    user = "spotctl"                     # X-SLURM-USER-NAME
    token_file = "/etc/spotctl/slurm.jwt"  # or token = "...", or token_env = "SLURM_REST_TOKEN"
    # api_version = "v0.0.40"            # pin; default: the newest one served among v0.0.38 .. v0.0.42
    # scontrol = "/usr/bin/scontrol"     # for drain/resume when the REST API cannot update nodes
    # slurm_conf = "/etc/slurm/slurm.conf"
    # node_name = "{node}"               # Slurm NodeName of a spot node (the node agent's slurmd -N / -Z)
    # node_prefix = "spot-"              # spot node ids start with this: those Slurm nodes are ours
    # timeout_seconds = 10
    # verify_tls = true                  # or ca_file = "/etc/ssl/slurm-ca.pem"
    # default_time_limit_seconds = 3600  # expected duration of jobs without a time limit
    # drain_via = "auto"                 # auto | rest | scontrol

API versions: the adapter reads ``/openapi/v3`` once, at start, and uses the
newest version it supports. Node updates (drain, resume, down, delete) go over
REST from v0.0.39 (Slurm 23.02) and through ``scontrol`` before that; requeueing
jobs always goes through ``scontrol`` (no REST version offers it). ``scontrol``
runs with the same JWT as the REST calls (``SLURM_JWT`` in its own environment
only), so it acts as the same Slurm user.

Errors follow the one HTTP rule of :mod:`spotctl.adapters._http`: 401/403 and
rejected tokens -> AuthError (Slurm >= 23.11 answers a token slurmctld rejects
with HTTP 511, 22.05 with HTTP 500 "Unspecified error", see ``_check_access``);
refused connections -> UnavailableError; 5xx and timeouts -> TemporaryError;
400/422 -> RefusedError; an unknown node -> NotFoundError (HTTP 404, or — Slurm's
own addition to the rule — HTTP 500 with Slurm error 2018 from a v0.0.39+ node
update). A ``token_file`` is re-read when it changes (rotation).

Object shapes: v0.0.38 sends plain numbers, v0.0.40+ ``{"set", "infinite",
"number"}`` objects, state lists, and partition limits under ``maximums`` (see
``_num``, ``_flags``, ``partition_max_nodes``). Both are tested against real
slurmrestds: 22.05 (v0.0.38) and 24.11 (v0.0.40-v0.0.42), scripts/testenv/slurm{,24}.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

from spotctl.core import deadline
from spotctl.core.config import RegionConfig
from spotctl.core.errors import (
    AuthError,
    ConfigError,
    NotFoundError,
    RefusedError,
    SpotctlError,
    TemporaryError,
    UnavailableError,
)
from spotctl.core.models import DrainProgress, Exclusion, NodeUsage, PoolSpec, Scheduler, Shape, WorkUnit
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.secrets import SecretFile
from spotctl.core.timefmt import iso

from . import _http

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")
NODE_UPDATE_FROM = "v0.0.39"  # Slurm 23.02: POST/DELETE /slurm/vX/node/{name}
JOBS_CACHE_SECONDS = 2.0  # pending() and usage() of one pass share one /jobs read

# Pending reasons that more nodes would fix (Priority: only when jobs ahead wait for resources).
_RESOURCE_REASONS = {"Resources", "PartitionNodeLimit", "ReqNodeNotAvail", "NodeDown", "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions"}
_EXCLUDED_REASONS = {
    "JobHeldUser": "held by its user (JobHeldUser)",
    "JobHeldAdmin": "held by an administrator (JobHeldAdmin)",
    "Dependency": "waits for a dependency",
    "DependencyNeverSatisfied": "dependency can never be satisfied",
    "BeginTime": "begin time is in the future",
    "None": "not yet evaluated by the Slurm scheduler",
}


ESLURM_INVALID_NODE_NAME = 2018  # slurm_errno.h: "Invalid node name specified"


def _error_numbers(body: dict | None) -> set[int]:
    errs = (body or {}).get("errors") or []
    return {e["error_number"] for e in errs if isinstance(e, dict) and isinstance(e.get("error_number"), int)} \
        if isinstance(errs, list) else set()


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.lstrip("v").split("."))


def _num(v, default=None):
    """A number from either form: plain (v0.0.38) or ``{"set", "infinite", "number"}`` (v0.0.39+)."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return default
        v = v.get("number")
    if v is None or isinstance(v, bool):
        return default
    if isinstance(v, (int, float)):
        return v
    raise ValueError(f"not a number: {v!r}")


def _flags(v) -> set[str]:
    """Job or node states as a set of upper-case words ("idle", ["IDLE", "DRAIN"], "IDLE+DRAIN")."""
    if v is None:
        return set()
    items = v if isinstance(v, list) else [v]
    out: set[str] = set()
    for item in items:
        out.update(p.upper() for p in str(item).split("+") if p)
    return out


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return str(v)


def partition_max_nodes(p: dict):
    """A partition's MaxNodes (per job), None when unlimited or not given.

    v0.0.38/v0.0.39: ``maximum_nodes_per_job``; v0.0.40+: ``maximums.nodes`` (``{"set", "infinite", "number"}``).
    """
    maximums = p.get("maximums")
    if isinstance(maximums, dict) and "nodes" in maximums:
        return _num(maximums["nodes"], None)
    return _num(p.get("maximum_nodes_per_job"), None)


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist (``a-n[1-3,7],b[01-02]``) into names."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*(?:\[[^\]]*\][^,\[]*)*", expr or ""):
        out.extend(_expand_one(part))
    return out


def _expand_one(s: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", s)
    if not m:
        return [s] if s else []
    head, tail = s[: m.start()], s[m.end():]
    names = []
    for rng in m.group(1).split(","):
        if "-" in rng:
            lo, hi = rng.split("-", 1)
            width = len(lo) if lo.startswith("0") else 0
            names.extend(f"{head}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
        else:
            names.append(head + rng)
    return [n2 for n in names for n2 in _expand_one(n + tail)]


def array_tasks(spec: str) -> list[str]:
    """Task ids left in an array spec such as ``3-9%2``, ``1,4,7-8`` or ``0-15:4``."""
    spec = spec.split("%", 1)[0]
    out: list[str] = []
    for part in spec.split(","):
        part, _, step = part.partition(":")
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(str(i) for i in range(int(lo), int(hi) + 1, int(step or 1)))
        elif part.strip():
            out.append(part.strip())
    return out


_GPU = re.compile(r"gpu(?::[\w.-]+)?[:=](\d+)")
_MEM = re.compile(r"(?:^|,)mem=(\d+(?:\.\d+)?)([KMGT]?)", re.I)


def _gpus(*specs: str) -> int:
    for s in specs:
        m = _GPU.search(s or "")
        if m:
            return int(m.group(1))
    return 0


def _mem_mb(tres: str) -> int | None:
    m = _MEM.search(tres or "")
    if not m:
        return None
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def _jwt_claims(token: str) -> dict | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        pad = "=" * (-len(parts[1]) % 4)
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + pad))
    except (ValueError, UnicodeDecodeError):
        return None
    return claims if isinstance(claims, dict) else None


@dataclass
class _Token:
    """Where the JWT comes from: the config, a token file (re-read when it changes: rotation) or the environment."""

    source: str
    value: str | None = None
    file: SecretFile | None = None
    env: str | None = None

    def get(self) -> str:
        if self.file is not None:
            return self.file.value()  # ConfigError naming the file when it is missing, empty or not one token
        if self.env is not None:
            self.value = (os.environ.get(self.env) or "").strip()
        if not self.value:
            raise ConfigError(f"slurm: the token from {self.source} is empty")
        return self.value


class SlurmScheduler:
    """A :class:`~spotctl.core.ports.SchedulerPort` backed by slurmrestd (and ``scontrol`` where needed)."""

    remote = True  # its calls cross the network: a pass reads it in a thread, under its observe deadline

    name = "slurm"

    def __init__(self, url: str, user: str, token: _Token, *, api_version: str | None = None,
                 scontrol: str | None = "scontrol", slurm_conf: str | None = None, timeout: float = 10.0,
                 verify: bool | str = True, node_name: str = "{node}", node_prefix: str = "spot-",
                 default_time_limit: int = 3600, drain_via: str = "auto", clock: Clock | None = None):
        self.url = url.rstrip("/")
        self.user = user
        self._token = token
        self.pinned_version = api_version
        self.api_version: str | None = None
        self.served_versions: list[str] = []
        self.timeout = timeout
        self.verify = verify
        self.slurm_conf = slurm_conf
        self.scontrol = shutil.which(scontrol) if scontrol else None
        self.scontrol_configured = scontrol
        if node_name.count("{node}") != 1:
            raise ConfigError("slurm: node_name must contain {node} exactly once", hint='e.g. node_name = "{node}"')
        self._name_head, self._name_tail = node_name.split("{node}")
        self.node_prefix = node_prefix
        self.default_time_limit = default_time_limit
        self.drain_via = drain_via
        self.clock = clock or SystemClock()
        self._session = None
        self._lock = threading.Lock()
        self._jobs_cache: tuple[float, list[dict]] | None = None
        self.skipped_malformed = 0
        self._access_checked = False

    # --- construction -----------------------------------------------------------

    @classmethod
    def from_config(cls, region: RegionConfig, clock: Clock | None = None) -> "SlurmScheduler":
        """Build from ``[regions.R.slurm]`` and discover the API version (at start, once)."""
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
        self = cls(url, user, token, api_version=version, scontrol=c.get("scontrol", "scontrol"),
                   slurm_conf=slurm_conf, timeout=timeout, verify=verify,
                   node_name=c.get("node_name", "{node}"), node_prefix=c.get("node_prefix", "spot-"),
                   default_time_limit=int(c.get("default_time_limit_seconds", 3600)), drain_via=drain_via,
                   clock=clock)
        return self  # version discovery and the token check happen on first use, inside the pass

    def __repr__(self) -> str:
        return f"<SlurmScheduler {self.url} {self.api_version or 'undiscovered'}>"

    # --- HTTP -------------------------------------------------------------------

    def _http(self):
        if self._session is None:
            import requests

            s = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=32)  # the drain fan-out
            s.mount("https://", adapter)
            s.mount("http://", adapter)
            s.headers["Accept"] = "application/json"
            s.verify = self.verify
            self._session = s
        return self._session

    def _check_token(self) -> str:
        token = self._token.get()
        claims = _jwt_claims(token)
        if claims is None:
            raise AuthError(f"slurm: the token from {self._token.source} is not a JWT",
                            hint=f"generate one with: scontrol token username={self.user}")
        exp = claims.get("exp")
        if isinstance(exp, (int, float)) and exp <= self.clock.now():
            raise AuthError(f"slurm: the token for user {claims.get('sun', self.user)} from {self._token.source} "
                            f"expired at {iso(exp)}",
                            hint=f"generate a new one: scontrol token username={self.user} lifespan=SECONDS")
        sun = claims.get("sun")
        if sun and sun != self.user:
            raise AuthError(f"slurm: the token from {self._token.source} belongs to user {sun!r}, "
                            f"not to the configured user {self.user!r}")
        return token

    def _request(self, method: str, path: str, *, json_body: dict | None = None, timeout: float | None = None,
                 what: str = "") -> dict:
        token = self._check_token()
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": token}
        url = f"{self.url}{path}"
        what = what or f"{method} {path}"
        t = deadline.bounded(timeout or self.timeout)  # inside a pass's observe: no longer than the time left
        r = _http.send(self._http(), method, url, what=f"slurm: {what}", peer=f"slurmrestd at {self.url}",
                       timeout=(min(t, 5.0), t), headers=headers, json=json_body,
                       unreachable_hint="is slurmrestd running and listening there?",
                       tls_hint="set ca_file or verify_tls in the slurm table")
        body: dict | None = None
        try:
            parsed = r.json()
            body = parsed if isinstance(parsed, dict) else None
        except ValueError:
            body = None
        if r.status_code >= 400:
            raise self._http_error(r.status_code, body, (r.text or r.reason or ""), what)
        if body is None:
            raise UnavailableError(f"slurm: {what}: the answer is not a JSON object (HTTP {r.status_code})")
        return body

    def _http_error(self, status: int, body: dict | None, text: str, what: str) -> SpotctlError:
        """The error for an HTTP error answer of slurmrestd (``body``: its JSON object, if it sent one): the
        class by the rule of ``_http``, the message and hint Slurm's."""
        msg = self._message_of(body, text)
        if status == 511:
            # Slurm >= 23.11: slurmctld rejected the token slurmrestd passed through (bad signature,
            # unknown key); the answer carries no error entry. 22.05 says HTTP 500 instead (_check_access).
            return AuthError(f"slurm: slurmctld refuses the token of user {self.user!r} from {self._token.source} "
                             f"(slurmrestd: HTTP 511, {msg})",
                             hint=f"generate a new one: scontrol token username={self.user}")
        if ESLURM_INVALID_NODE_NAME in _error_numbers(body):
            # Slurm's own addition: v0.0.39+ node updates answer an unknown node with HTTP 500 and error 2018
            return NotFoundError(f"slurm: {what}: not found (HTTP {status}): {msg}")
        cls = _http.error_class(status)
        if cls is AuthError:
            return AuthError(f"slurm: slurmrestd refused user {self.user!r} (HTTP {status}): {msg}",
                             hint=f"check the token ({self._token.source}); scontrol token username={self.user}")
        if cls is NotFoundError:
            return NotFoundError(f"slurm: {what}: not found (HTTP {status}): {msg}")
        return cls(f"slurm: {what}: HTTP {status}: {msg}", details={"status": status})

    @staticmethod
    def _message_of(body: dict | None, text: str) -> str:
        """slurmrestd's error entries; the raw text only when the answer is not JSON."""
        if body is not None:
            errs = body.get("errors") or []
            parts = []
            for e in errs if isinstance(errs, list) else []:
                if isinstance(e, dict):
                    parts.append(" / ".join(str(e[k]) for k in ("description", "error", "source") if e.get(k)))
            return "; ".join(p for p in parts if p) or "no error message"
        return (text or "").strip()[:300] or "no error message"

    @classmethod
    def _message(cls, r, body: dict | None) -> str:
        return cls._message_of(body, "" if r is None else (r.text or r.reason or ""))

    def _api(self, path: str, method: str = "GET", **kw) -> dict:
        self.discover()
        if not self._access_checked:
            # once per process: a refused token is an AuthError (the pass goes on degraded and exits 4)
            self._check_access()
            self._access_checked = True
        return self._request(method, f"/slurm/{self.api_version}/{path}", **kw)

    def _list(self, path: str, key: str) -> list[dict]:
        """A list read (jobs, nodes, partitions). slurmrestd may answer HTTP 200 with an empty list and
        ``errors`` when it could not load the data from slurmctld (busy, timed out): that is a failure,
        not an empty cluster."""
        body = self._api(path, what=f"GET {path}")
        items = body.get(key)
        errors = body.get("errors") or []
        if errors and not items:
            raise TemporaryError(f"slurm: GET {path}: slurmrestd answered without data: {self._message(None, body)}")
        if errors:
            log.warning("slurm: GET %s: %s", path, self._message(None, body))
        if not isinstance(items, list):
            if items is None:
                return []
            raise UnavailableError(f"slurm: GET {path}: {key!r} is not a list")
        return [x for x in items if isinstance(x, dict)]

    # --- discovery ----------------------------------------------------------------

    def discover(self, start: bool = False) -> str:
        """Pick the API version (newest supported, or the pinned one). Once; later calls are free.

        At start, an unreachable slurmrestd is not fatal (the pass goes on degraded and the next call
        tries again); a rejected token is (AuthError), and so is a server without a supported version.
        """
        if self.api_version is not None:
            return self.api_version
        with self._lock:
            if self.api_version is not None:
                return self.api_version
            try:
                doc = self._request("GET", "/openapi/v3", what="API discovery (GET /openapi/v3)")
            except UnavailableError as e:
                if not start:
                    raise
                log.warning("%s; API version discovery deferred", e.message)
                return ""
            served = sorted({m.group(1) for p in (doc.get("paths") or {})
                             if (m := re.match(r"^/slurm/(v\d+\.\d+\.\d+)/", p))}, key=version_key)
            self.served_versions = served
            usable = [v for v in served if v in SUPPORTED_VERSIONS]
            if self.pinned_version:
                if self.pinned_version not in served:
                    raise ConfigError(f"slurm: api_version {self.pinned_version} is not served by {self.url}",
                                      hint=f"served: {', '.join(served) or 'none'}")
                chosen = self.pinned_version
            elif usable:
                chosen = usable[-1]
            else:
                raise UnavailableError(
                    f"slurm: slurmrestd at {self.url} serves no supported API version "
                    f"(served: {', '.join(served) or 'none'}; supported: {', '.join(SUPPORTED_VERSIONS)})",
                    hint="Slurm 22.05 or newer is needed; without slurmdbd, load the openapi/v0.0.3x or "
                         "openapi/slurmctld plugins with slurmrestd -s")
            self.api_version = chosen
            log.info("slurm: using API %s of %s (served: %s)", chosen, self.url, ", ".join(served))
        if start:
            self._check_access()
        return chosen

    def _check_access(self) -> None:
        """One authenticated read at start, so that a rejected token fails loudly (exit 4), not later.

        Slurm 22.05's slurmrestd answers a token that slurmctld rejects with HTTP 500 "Unspecified
        error" — the same answer as for a controller that is down. When scontrol can reach the
        controller on its own (munge), a 500 here means the token was refused.
        """
        try:
            self._request("GET", f"/slurm/{self.api_version}/partitions", what="GET partitions")
        except TemporaryError as e:
            if self.scontrol and self._controller_up_without_token():
                raise AuthError(f"slurm: slurmctld is up but refuses the token of user {self.user!r} "
                                f"from {self._token.source}; slurmrestd said: {e.message.split(': ', 2)[-1]}",
                                hint=f"generate a new one: scontrol token username={self.user}") from None
            log.warning("%s", e.message)
        except (UnavailableError, RefusedError) as e:  # not the token's fault: the reads say so themselves
            log.warning("%s", e.message)

    def _controller_up_without_token(self) -> bool:
        try:
            p = subprocess.run([self.scontrol, "ping"], capture_output=True, text=True, timeout=10,
                               env=self._scontrol_env(with_token=False))
        except (OSError, subprocess.TimeoutExpired):
            return False
        return "is UP" in p.stdout

    # --- nodes: names -------------------------------------------------------------

    def slurm_name(self, node: str) -> str:
        return f"{self._name_head}{node}{self._name_tail}"

    def node_id(self, slurm_name: str) -> str | None:
        """Our node id for a Slurm node name, or None when the node is not one of ours."""
        head, tail = self._name_head, self._name_tail
        if not slurm_name.startswith(head) or not slurm_name.endswith(tail) or len(slurm_name) <= len(head) + len(tail):
            return None
        node = slurm_name[len(head): len(slurm_name) - len(tail)] if tail else slurm_name[len(head):]
        return node if node.startswith(self.node_prefix) else None

    # --- reads ----------------------------------------------------------------------

    def _jobs(self) -> list[dict]:
        now = time.monotonic()
        cached = self._jobs_cache
        if cached is not None and now - cached[0] < JOBS_CACHE_SECONDS:
            return cached[1]
        jobs = self._list("jobs", "jobs")
        self._jobs_cache = (now, jobs)
        return jobs

    def nodes(self) -> list[dict]:
        """Every Slurm node as slurmrestd reports it (``/nodes``: ``/node/{name}`` has wrong partitions in 22.05)."""
        return self._list("nodes", "nodes")

    def node(self, node: str) -> dict:
        """The Slurm record of one of our nodes; NotFoundError when Slurm does not know it."""
        name = self.slurm_name(node)
        for n in self.nodes():
            if n.get("name") == name:
                return n
        raise NotFoundError(f"slurm: no node named {name!r}")

    def _partitions(self) -> dict[str, dict]:
        return {p["name"]: p for p in self._list("partitions", "partitions") if p.get("name")}

    # --- demand ---------------------------------------------------------------------

    def pending(self, pools: dict[str, PoolSpec]) -> tuple[list[WorkUnit], list[Exclusion]]:
        jobs = self._jobs()
        pending = [j for j in jobs if "PENDING" in _flags(j.get("job_state"))]
        partitions = self._partitions() if any(_text(j.get("state_reason")) == "PartitionNodeLimit"
                                               for j in pending) else {}
        short_of_nodes: set[str] = set()  # partitions where some job waits for resources
        for j in pending:
            if _text(j.get("state_reason")) in _RESOURCE_REASONS:
                short_of_nodes.update(p for p in _text(j.get("partition")).split(",") if p)
        units: list[WorkUnit] = []
        excluded: list[Exclusion] = []
        malformed = 0
        for j in pending:
            try:
                u, x = self._job_units(j, pools, partitions, short_of_nodes)
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

    def _job_units(self, j: dict, pools: dict[str, PoolSpec], partitions: dict[str, dict],
                   short_of_nodes: set[str]) -> tuple[list[WorkUnit], Exclusion | None]:
        job_id = j["job_id"]
        if not isinstance(job_id, int):
            raise TypeError(f"job_id is {type(job_id).__name__}")
        uid = f"slurm/{job_id}"
        reason = _text(j.get("state_reason")) or "None"
        parts = [p for p in _text(j.get("partition")).split(",") if p]
        node_count = int(_num(j.get("node_count"), 1) or 1)

        def excl(why: str):
            return [], Exclusion(uid, Scheduler.SLURM, why)

        if reason in _EXCLUDED_REASONS:
            return excl(_EXCLUDED_REASONS[reason])
        if reason.startswith("JobHeld"):
            return excl(f"held ({reason})")
        if reason == "Priority" and not short_of_nodes.intersection(parts):
            return excl("waits for priority behind jobs that are not short of nodes")
        if reason == "PartitionNodeLimit":
            limits = [partition_max_nodes(partitions.get(p, {})) for p in parts]
            limits = [x for x in limits if x is not None and x >= 0]
            if limits and node_count > max(limits):
                return excl("asks more nodes than its partition allows per job (MaxNodes)")
        if reason == "ReqNodeNotAvail" and _text(j.get("required_nodes")):
            return excl("pinned to specific nodes that are unavailable")
        if reason not in _RESOURCE_REASONS and reason != "Priority":
            return excl(f"pending for {reason}: more nodes would not start it")
        if _text(j.get("required_nodes")):
            return excl("pinned to specific nodes (--nodelist)")
        feat_expr = _text(j.get("features"))
        if re.search(r"[|\[\]*()!]", feat_expr):
            return excl("feature expression with OR/counts is not mapped to pools")
        features = tuple(sorted({f for f in re.split(r"[&,]", feat_expr) if f}))

        cpus_total = int(_num(j.get("cpus"), 1) or 1)
        cpus = max(math.ceil(cpus_total / node_count), int(_num(j.get("minimum_cpus_per_node"), 0) or 0), 1)
        mem = _num(j.get("memory_per_node"))
        if mem is None and _num(j.get("memory_per_cpu")) is not None:
            mem = _num(j.get("memory_per_cpu")) * cpus
        if mem is None:
            total = _mem_mb(_text(j.get("tres_req_str")))
            mem = math.ceil(total / node_count) if total else 0
        gpus = _gpus(_text(j.get("tres_per_node")), _text(j.get("gres_detail")))
        if not gpus:
            per_job = _gpus(_text(j.get("tres_per_job")))
            gpus = math.ceil(per_job / node_count) if per_job else 0
        limit = _num(j.get("time_limit"))
        expected = int(limit) * 60 if limit and limit < 4294967294 else self.default_time_limit
        priority = int(_num(j.get("priority"), 0) or 0)
        submitted = float(_num(j.get("submit_time"), 0) or 0)
        shape = Shape(cpus, int(mem), gpus)

        partition = None
        for p in parts or [None]:
            probe = WorkUnit(id=uid, scheduler=Scheduler.SLURM, shape=shape, partition=p, features=features)
            if any(pool.serves(probe) for pool in pools.values()):
                partition = p
                break
        else:
            served = {p.slurm.partition for p in pools.values() if p.slurm.partition}
            if parts and not served.intersection(parts):
                return excl(f"partition {','.join(parts)} is not served by any spot pool")
            return excl("no spot pool has the requested features")

        array = _text(j.get("array_task_string"))
        bases = [f"{uid}_{t}" for t in array_tasks(array)] if array else [uid]
        units = []
        for base in bases:
            for i in range(node_count):
                units.append(WorkUnit(
                    id=base if node_count == 1 else f"{base}/{i + 1}", scheduler=Scheduler.SLURM, shape=shape,
                    priority=priority, expected_seconds=expected, submitted_at=submitted, partition=partition,
                    features=features))
        return units, None

    # --- usage ----------------------------------------------------------------------

    def usage(self) -> list[NodeUsage]:
        now = self.clock.now()
        running: dict[str, int] = {}
        for j in self._jobs():
            if "RUNNING" in _flags(j.get("job_state")) or "COMPLETING" in _flags(j.get("job_state")):
                for n in expand_hostlist(_text(j.get("nodes"))):
                    running[n] = running.get(n, 0) + 1
        out = []
        for n in self.nodes():
            name = n.get("name")
            node = self.node_id(name) if isinstance(name, str) else None
            if node is None:
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
                                 last_busy_at=now if k else (float(last) if last else None)))
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
        if not self.scontrol:
            raise UnavailableError(f"slurm: drained {name} but cannot requeue its jobs {ids}: no scontrol on this host")
        failed = []
        for jid in ids:
            rc, out = self._run_scontrol(["requeue", str(jid)])
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
        if not self.scontrol:
            raise UnavailableError(f"slurm: cannot reserve {name} from its safe-until time: no scontrol on this host",
                                   hint="install slurm-client on this host (scontrol)")
        res = f"spotctl-{name}"
        if until is None:
            rc, out = self._run_scontrol(["delete", f"ReservationName={res}"])
            if rc != 0 and "invalid" not in out.lower():
                self._scontrol_error(out, f"delete reservation {res}")
            return
        # scontrol reads times without a zone in its TZ, which _scontrol_env sets to UTC
        start = "now" if until <= self.clock.now() + 1 else iso(until).removesuffix("Z")
        rc, out = self._run_scontrol(["update", f"ReservationName={res}", f"StartTime={start}"])
        if rc != 0 and "invalid" in out.lower():  # none yet: create it
            rc, out = self._run_scontrol(["create", "reservation", f"ReservationName={res}", f"StartTime={start}",
                                          "Duration=UNLIMITED", f"Nodes={name}", "Users=root",
                                          "Flags=MAINT,IGNORE_JOBS"])
        if rc != 0:
            self._scontrol_error(out, f"reserve {name} from {start} UTC")
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
            self._run_scontrol(["delete", f"ReservationName=spotctl-{name}"])
        if flags & {"DYNAMIC_NORM", "DYNAMIC_FUTURE", "DYNAMIC"}:
            self._delete(node)
            log.info("slurm: deleted dynamic node %s", name)

    def _update(self, node: str, state: str, reason: str | None) -> None:
        name = self.slurm_name(node)
        if self.drain_method() == "rest":
            body: dict = {"state": [state]}
            if reason:
                body["reason"] = reason
            self._api(f"node/{name}", method="POST", json_body=body, what=f"update node {name} to {state}")
            return
        args = ["update", f"nodename={name}", f"state={state}"]
        if reason:
            args.append(f"reason={_scontrol_value(reason)}")
        rc, out = self._run_scontrol(args)
        if rc != 0:
            self._scontrol_error(out, f"update node {name} to {state}")

    def _delete(self, node: str) -> None:
        name = self.slurm_name(node)
        if self.drain_method() == "rest":
            self._api(f"node/{name}", method="DELETE", what=f"delete node {name}")
            return
        rc, out = self._run_scontrol(["delete", f"nodename={name}"])
        if rc != 0:
            self._scontrol_error(out, f"delete node {name}")

    # --- scontrol -----------------------------------------------------------------

    def _scontrol_env(self, with_token: bool = True) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        env["TZ"] = "UTC"  # times given to scontrol are UTC
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        if with_token:
            env["SLURM_JWT"] = self._check_token()  # this child's environment only, never ours
        return env

    def _run_scontrol(self, args: list[str]) -> tuple[int, str]:
        assert self.scontrol
        try:
            p = subprocess.run([self.scontrol, *args], capture_output=True, text=True,
                               timeout=max(self.timeout, 10), env=self._scontrol_env())
        except subprocess.TimeoutExpired:
            raise TemporaryError(f"slurm: scontrol {args[0]} did not finish within {max(self.timeout, 10):g}s") from None
        except OSError as e:
            raise UnavailableError(f"slurm: cannot run {self.scontrol}: {e.strerror}") from None
        return p.returncode, (p.stderr.strip() or p.stdout.strip())[:300]

    def _scontrol_error(self, out: str, what: str):
        low = out.lower()
        if "invalid node name" in low or "not found" in low:
            raise NotFoundError(f"slurm: {what}: {out}")
        if "authentication" in low or "zero bytes were transmitted" in low or "access/permission denied" in low \
                or "access denied" in low or "permission denied" in low:
            raise AuthError(f"slurm: {what}: slurmctld refused the token of user {self.user!r}: {out}")
        if "unable to contact" in low or "connection refused" in low or "timed out" in low:
            raise UnavailableError(f"slurm: {what}: {out}")
        raise TemporaryError(f"slurm: {what}: scontrol: {out}")


def _scontrol_value(s: str) -> str:
    """scontrol takes key=value words; one argv word may hold spaces, not newlines."""
    return " ".join(str(s).split())
