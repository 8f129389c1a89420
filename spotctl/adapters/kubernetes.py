"""Kubernetes through its HTTP API (requests only, no client library).

Implements :class:`spotctl.core.ports.SchedulerPort`:

* **demand** — pods that are Pending, unbound, with condition ``PodScheduled=False`` reason
  ``Unschedulable``, that tolerate a spot pool's taints and whose node selector and required
  node affinity that pool's labels satisfy. Their shape comes from the container requests
  (CPU rounded up to whole vCPUs, memory in MiB, ``nvidia.com/gpu``/``amd.com/gpu``);
  the expected duration from the ``spotctl.io/expected-seconds`` annotation, else
  ``activeDeadlineSeconds``, else the region's ``policy.default_pod_seconds``. Pods that no
  pool can take are returned as :class:`Exclusion` with the reason.
* **a pod cache kept by list + watch** — the first call lists pods (paginated) and remembers
  the list's ``resourceVersion``; every later call is a bounded watch catch-up from the last
  version seen (``allowWatchBookmarks``), applying ADDED/MODIFIED/DELETED to the cache keyed by
  namespace/name, so no pod is lost or counted twice. ``410 Gone``/``Expired`` relists; a
  dropped connection reconnects from the last version seen.
* **cordon** (``spec.unschedulable`` plus a ``NoSchedule`` taint, with an optimistic-concurrency
  merge patch), **drain** (cordon, then the policy/v1 Eviction subresource for every evictable
  pod; PodDisruptionBudget 429s are retried until the deadline; for hard notices only, pods
  still blocked are deleted at the deadline), **resume** (remove the taint; uncordon only what
  we cordoned) and **forget** (delete the Node object).

Errors follow the one HTTP rule of :mod:`spotctl.adapters._http`: 401/403 → AuthError, 404 →
NotFoundError, 400/422 → RefusedError, 409/410/429/5xx/timeouts → TemporaryError, connection refused →
UnavailableError. Tokens are never logged; a token file (``tokenFile``, ``token_file``, the in-cluster
service-account token) is re-read when it changes (rotation).

Region table ``[regions.R.kubernetes]`` (every key optional):

``kubeconfig``/``context``
    kubeconfig file (default ``$KUBECONFIG`` or ``~/.kube/config``) and context (default: the
    current one). Bearer token or tokenFile, client certificate/key and CA as files or data.
``in_cluster``
    use the pod's service account (``KUBERNETES_SERVICE_HOST``; token and CA from
    ``serviceaccount_dir``, default ``/var/run/secrets/kubernetes.io/serviceaccount``).
``server``, ``token_file``, ``ca_file``, ``insecure_skip_tls_verify``
    connect without a kubeconfig.
``namespace``
    watch one namespace only (default: all).
``timeout_seconds`` (10)
    per request. ``watch_idle_seconds`` (0.3): a catch-up ends when the stream is quiet this long;
    ``watch_max_seconds`` (10): and at the latest after this long.
``cordon_taint`` (``spotctl.io/reclaim``)
    key of the NoSchedule taint set by cordon and drain.
``expected_seconds_annotation`` (``spotctl.io/expected-seconds``)
``deadline_margin_seconds`` (10)
    a drain is one round per call (cordon + taint, one eviction per pod not yet leaving) and never
    waits: later passes and the watcher call it again until the node is empty (pods gone, not just
    evictions accepted: an evicted pod stays Terminating for its grace period). When the planner
    forces a round (a hard notice's deadline is near), or once the deadline is less than this
    margin away, the pods still there are deleted with a grace period that fits the time left
    (PodDisruptionBudgets cannot hold a node the provider is taking back).
``page_size`` (500), ``node_label_selector`` (which nodes ``usage()`` reports; default all).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from spotctl import __version__
from spotctl.core import deadline
from spotctl.core.config import RegionConfig
from spotctl.core.errors import (
    AuthError,
    ConfigError,
    NotFoundError,
    RefusedError,
    SpotctlError,
    TemporaryError,
)
from spotctl.core.models import DrainProgress, Exclusion, NodeUsage, PoolSpec, Scheduler, Shape, WorkUnit
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.secrets import SecretFile
from spotctl.core.timefmt import iso, parse_ts

from . import _http

if TYPE_CHECKING:  # pragma: no cover
    import requests

log = logging.getLogger(__name__)

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
ANNOTATION_CORDONED = "spotctl.io/cordoned"
ANNOTATION_REASON = "spotctl.io/cordon-reason"
ANNOTATION_SAFE_UNTIL = "spotctl.io/safe-until"  # protect(): work on the node must end by then (RFC 3339)
TAINT_WINDOW = "spotctl.io/window-closing"  # protect(closed=True): too little time left for new work
DONE_PHASES = ("Succeeded", "Failed")
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


# --- settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How the adapter behaves (from ``[regions.R.kubernetes]``)."""

    namespace: str | None = None
    timeout_seconds: float = 10.0
    watch_idle_seconds: float = 0.3
    watch_max_seconds: float = 10.0
    cordon_taint: str = "spotctl.io/reclaim"
    expected_seconds_annotation: str = "spotctl.io/expected-seconds"
    default_pod_seconds: int = 3600
    deadline_margin_seconds: float = 10.0
    page_size: int = 500
    node_label_selector: str | None = None


@dataclass
class Connection:
    """Where the API server is and how to authenticate to it (never logged: it may hold a token)."""

    server: str
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    ca_file: str | None = None
    verify: bool = True
    client_cert: str | None = None
    client_key: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    source: str = ""  # for messages: which kubeconfig/context or "in-cluster"


# --- quantities -----------------------------------------------------------------------

_QTY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {None: 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "E": 1e18, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def parse_quantity(value: Any) -> float:
    """A Kubernetes resource quantity ("500m", "1.5", "4Gi", "1e3") as a number of base units."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError(f"invalid quantity {value!r}")
    n = float(m.group(1)) * _SUFFIX[m.group(3)]
    if m.group(2):
        n *= 10 ** int(m.group(2))
    if n < 0:
        raise ValueError(f"negative quantity {value!r}")
    return n


def _requests_of(container: dict) -> tuple[float, float, float]:
    res = container.get("resources") or {}
    req = dict(res.get("limits") or {})  # requests default to limits when only limits are set
    req.update(res.get("requests") or {})
    cpu = parse_quantity(req["cpu"]) if "cpu" in req else 0.0
    mem = parse_quantity(req["memory"]) if "memory" in req else 0.0
    gpu = sum(parse_quantity(req[g]) for g in GPU_RESOURCES if g in req)
    return cpu, mem, gpu


def pod_resources(spec: dict) -> tuple[float, float, float]:
    """What the pod asks of a node (cores, bytes, GPUs): containers (plus sidecars) vs. the largest init
    container, plus the pod overhead."""
    cpu = mem = gpu = 0.0
    init_cpu = init_mem = init_gpu = 0.0
    side_cpu = side_mem = side_gpu = 0.0
    for c in spec.get("initContainers") or []:
        c_cpu, c_mem, c_gpu = _requests_of(c)
        if c.get("restartPolicy") == "Always":  # a sidecar: runs alongside the containers
            side_cpu, side_mem, side_gpu = side_cpu + c_cpu, side_mem + c_mem, side_gpu + c_gpu
        else:
            init_cpu, init_mem, init_gpu = (max(init_cpu, side_cpu + c_cpu), max(init_mem, side_mem + c_mem),
                                            max(init_gpu, side_gpu + c_gpu))
    for c in spec.get("containers") or []:
        c_cpu, c_mem, c_gpu = _requests_of(c)
        cpu, mem, gpu = cpu + c_cpu, mem + c_mem, gpu + c_gpu
    cpu, mem, gpu = max(cpu + side_cpu, init_cpu), max(mem + side_mem, init_mem), max(gpu + side_gpu, init_gpu)
    overhead = spec.get("overhead") or {}
    cpu += parse_quantity(overhead["cpu"]) if "cpu" in overhead else 0.0
    mem += parse_quantity(overhead["memory"]) if "memory" in overhead else 0.0
    return cpu, mem, gpu


def to_shape(cpu: float, mem: float, gpu: float) -> Shape:
    """Whole vCPUs (rounded up), MiB (rounded up) and GPUs."""
    return Shape(vcpu=math.ceil(cpu - 1e-9), ram_mb=math.ceil(mem / 2 ** 20 - 1e-9), gpus=math.ceil(gpu - 1e-9))


# --- scheduling predicates ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    @classmethod
    def parse(cls, text: str) -> "Taint":
        """``key=value:Effect``, ``key:Effect`` or ``key`` (NoSchedule), as pools write them."""
        rest, _, effect = text.partition(":")
        key, _, value = rest.partition("=")
        return cls(key.strip(), value.strip(), (effect or "NoSchedule").strip())


def tolerates(tolerations: list[dict], taint: Taint) -> bool:
    """The Kubernetes rule: some toleration matches the taint's key, value and effect."""
    if taint.effect == "PreferNoSchedule":
        return True
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t["key"] != taint.key:
            continue
        if op == "Exists" or (op == "Equal" and (t.get("value") or "") == taint.value):
            return True
    return False


def _expr_match(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {op!r}")


def affinity_match(spec: dict, labels: dict[str, str]) -> bool:
    """nodeSelector and required node affinity (terms ORed, expressions ANDed) against node labels."""
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or []
    for term in terms:
        if term.get("matchFields"):
            continue  # metadata.name pins a pod to a named node: never a new spot node
        exprs = term.get("matchExpressions") or []
        if exprs and all(_expr_match(e, labels) for e in exprs):
            return True
    return False


# --- the pod cache --------------------------------------------------------------------------


@dataclass(slots=True)
class PodView:
    """What the adapter keeps of one pod (a compact digest of the object)."""

    key: str  # namespace/name
    namespace: str
    name: str
    node: str | None
    phase: str
    unschedulable: bool
    spec: dict  # only what predicates need: nodeSelector, affinity, tolerations
    shape: Shape | None
    resources: tuple[float, float, float]  # exact (cores, bytes, GPUs), summed per node by usage()
    priority: int
    expected_seconds: int | None
    created: float
    daemonset: bool
    mirror: bool
    gated: bool
    nominated: bool
    problem: str | None = None  # malformed: why


def _ts(text: str | None) -> float:
    """A metav1.Time (RFC 3339, UTC) as epoch seconds; 0.0 when it is missing or malformed."""
    try:
        return parse_ts(text, assume_utc=True) or 0.0
    except ValueError:
        return 0.0


def digest(pod: dict, settings: Settings) -> PodView:
    """Reduce a Pod object to a :class:`PodView`; a malformed pod gets ``problem`` set instead of raising."""
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    st = pod.get("status") or {}
    ns, name = md.get("namespace") or "", md.get("name") or ""
    conds = st.get("conditions") or []
    unsched = any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
                  for c in conds if isinstance(c, dict))
    annotations = md.get("annotations") or {}
    owners = md.get("ownerReferences") or []
    view = PodView(
        key=f"{ns}/{name}", namespace=ns, name=name, node=spec.get("nodeName") or None,
        phase=st.get("phase") or "Pending", unschedulable=unsched,
        spec={k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if spec.get(k)},
        shape=None, resources=(0.0, 0.0, 0.0), priority=0, expected_seconds=None, created=_ts(md.get("creationTimestamp")),
        daemonset=any(isinstance(o, dict) and o.get("kind") == "DaemonSet" and o.get("controller") for o in owners),
        mirror="kubernetes.io/config.mirror" in annotations, gated=bool(spec.get("schedulingGates")),
        nominated=bool(st.get("nominatedNodeName")),
    )
    try:
        if not name or not ns:
            raise ValueError("no metadata.name/namespace")
        view.resources = pod_resources(spec)
        view.shape = to_shape(*view.resources)
        prio = spec.get("priority", 0)
        if prio is None:
            prio = 0
        if not isinstance(prio, int) or isinstance(prio, bool):
            raise ValueError(f"spec.priority {prio!r} is not an integer")
        view.priority = prio
        raw = annotations.get(settings.expected_seconds_annotation)
        if raw is not None:
            try:
                view.expected_seconds = int(float(raw))
                if view.expected_seconds <= 0:
                    raise ValueError
            except ValueError:
                raise ValueError(f"annotation {settings.expected_seconds_annotation}={raw!r} is not a "
                                 "positive number of seconds") from None
        elif isinstance(spec.get("activeDeadlineSeconds"), int) and spec["activeDeadlineSeconds"] > 0:
            view.expected_seconds = spec["activeDeadlineSeconds"]
        for t in view.spec.get("tolerations") or []:
            if not isinstance(t, dict):
                raise ValueError("a toleration is not an object")
        affinity_match(view.spec, {})  # raises on unknown operators
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        view.problem = str(e) or type(e).__name__
    return view


class PodCache:
    """Pods by namespace/name, with the resourceVersion they are current to."""

    def __init__(self) -> None:
        self.pods: dict[str, PodView] = {}
        self.rv: str | None = None

    def replace(self, views: list[PodView], rv: str) -> None:
        self.pods = {v.key: v for v in views}
        self.rv = rv

    def apply(self, etype: str, view: PodView, rv: str | None) -> None:
        if etype == "DELETED":
            self.pods.pop(view.key, None)
        else:  # ADDED or MODIFIED: the newest state wins, so a replayed event never counts twice
            self.pods[view.key] = view
        if rv:
            self.rv = rv


class _Expired(Exception):
    """The resourceVersion is too old (410): relist."""


class _Dropped(Exception):
    """The watch stream broke off: reconnect from the last resourceVersion."""


# --- the HTTP client ------------------------------------------------------------------------


class Api:
    """A small Kubernetes API client over requests: auth, TLS, timeouts and error translation."""

    def __init__(self, conn: Connection, timeout: float = 10.0):
        import requests

        self.conn = conn
        self.base = conn.server.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        # as many pooled connections as a storm's drain fan-out has workers (ops.act.DRAIN_WORKERS)
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=32)
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)
        self.session.headers["Accept"] = "application/json"
        self.session.headers["User-Agent"] = f"spotctl/{__version__}"
        self.session.verify = conn.ca_file if (conn.verify and conn.ca_file) else conn.verify
        if conn.client_cert:
            self.session.cert = (conn.client_cert, conn.client_key) if conn.client_key else conn.client_cert
        if conn.username is not None:
            self.session.auth = (conn.username, conn.password or "")
        self._token_file = (SecretFile(conn.token_file, setting=f"the Kubernetes token file ({conn.source})")
                            if conn.token_file and not conn.token else None)
        self.files: _DataFiles | None = None  # kubeconfig *-data files live as long as the client

    def _token(self) -> str | None:
        """The bearer token; a token file is re-read when it changes (service-account tokens rotate)."""
        if self.conn.token:
            return self.conn.token
        return self._token_file.value() if self._token_file is not None else None

    def _headers(self, extra: dict | None = None) -> dict:
        h = dict(extra or {})
        token = self._token()
        if token:
            h["Authorization"] = f"Bearer {token}"
        return h

    def _send(self, method: str, path: str, what: str, timeout: tuple[float, float], **kw: Any):
        """One request (no retry, no sleep: the next pass asks again); no answer is an error by the rule of ``_http``."""
        return _http.send(self.session, method, self.base + path, what=f"kubernetes: {what}",
                          peer=f"the Kubernetes API at {self.base}", timeout=timeout,
                          tls_hint="check the CA (certificate-authority) and client certificate", **kw)

    def request(self, method: str, path: str, *, params: dict | None = None, body: Any = None,
                content_type: str = "application/json", ok: tuple[int, ...] = ()) -> tuple[int, dict]:
        """Send one request; return (status, JSON body). Statuses in ``ok`` are returned, not raised."""
        data = None if body is None else json.dumps(body)
        headers = self._headers({"Content-Type": content_type} if data is not None else None)
        t = deadline.bounded(self.timeout)  # inside a pass's observe: no longer than the time left
        r = self._send(method, path, f"{method} {path}", (min(t, 5.0), t), params=params, data=data,
                       headers=headers)
        try:
            payload = r.json() if r.content else {}
        except ValueError:
            payload = {"message": r.text[:200]}
        if r.status_code < 300 or r.status_code in ok:
            return r.status_code, payload
        raise translate(r.status_code, payload, f"{method} {path}", self.base)

    def watch(self, path: str, params: dict, idle: float, limit: float):
        """Open a watch stream; yield decoded events until the stream is quiet ``idle`` seconds, ends,
        or ``limit`` seconds pass. Raises _Expired (410) and _Dropped (connection broke off)."""
        import requests

        params = dict(params, watch="true", allowWatchBookmarks="true", timeoutSeconds=str(max(1, int(limit))))
        r = self._send("GET", path, f"WATCH {path}", (min(self.timeout, 5.0), max(self.timeout, limit + 5)),
                       params=params, headers=self._headers(), stream=True)
        with r:
            if r.status_code == 410:
                raise _Expired()
            if r.status_code >= 300:
                try:
                    payload = r.json()
                except ValueError:
                    payload = {}
                raise translate(r.status_code, payload, f"WATCH {path}", self.base)
            sock = getattr(getattr(r.raw, "connection", None), "sock", None)
            if sock is not None:
                sock.settimeout(idle)  # from now on a quiet stream means "caught up"
            end = time.monotonic() + limit
            try:
                for line in r.iter_lines():
                    if not line:
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise _Dropped() from None
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        if obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone"):
                            raise _Expired()
                        raise translate(int(obj.get("code") or 500), obj, f"WATCH {path}", self.base)
                    yield event
                    if time.monotonic() >= end:
                        return
            except requests.exceptions.ConnectionError as e:
                if "timed out" in str(e).lower():
                    return  # quiet for `idle` seconds: caught up
                raise _Dropped() from None
            except requests.exceptions.ChunkedEncodingError:
                raise _Dropped() from None
            except requests.exceptions.RequestException:
                raise _Dropped() from None


def translate(status: int, payload: dict, what: str, base: str) -> SpotctlError:
    """An HTTP error status (with its metav1.Status body) as a spotctl error: the class by the rule of
    ``_http`` (410 — an expired resourceVersion or continue token — is a TemporaryError: list again)."""
    message = payload.get("message") if isinstance(payload, dict) else None
    detail = f"{what}: HTTP {status}" + (f" {message}" if message else "")
    cls = _http.error_class(status)
    if cls is AuthError:
        return AuthError(f"Kubernetes API {base} refused the credentials ({detail})",
                         hint="check the token or client certificate in the kubeconfig, and the RBAC rules")
    if cls is NotFoundError:
        return NotFoundError(f"Kubernetes: {detail}")
    if cls is RefusedError:
        return RefusedError(f"Kubernetes API {base} rejected the request ({detail})")
    return cls(f"Kubernetes API {base}: {detail}")


# --- connection sources ---------------------------------------------------------------------


class _DataFiles:
    """Private files for kubeconfig ``*-data`` fields (requests wants paths), removed with their owner."""

    def __init__(self) -> None:
        self.dir: str | None = None

    def write(self, name: str, b64: str) -> str:
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="spotctl-kube-")
            weakref.finalize(self, shutil.rmtree, self.dir, True)
        try:
            raw = base64.b64decode(b64, validate=False)
        except (ValueError, TypeError):
            raise ConfigError(f"kubeconfig field {name} is not valid base64") from None
        path = os.path.join(self.dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        return path


def _named(items: list | None, name: str, what: str, source: str) -> dict:
    for it in items or []:
        if isinstance(it, dict) and it.get("name") == name:
            return it.get(what) or {}
    raise ConfigError(f"kubeconfig {source}: no {what} named {name!r}")


def load_kubeconfig(paths: list[str], context: str | None, files: _DataFiles) -> Connection:
    """A Connection from kubeconfig file(s) (merged like kubectl: the first definition of a name wins)."""
    import yaml

    merged: dict[str, list] = {"clusters": [], "users": [], "contexts": []}
    current = None
    bases: dict[int, Path] = {}
    read = []
    for p in paths:
        path = Path(p).expanduser()
        if not path.is_file():
            continue
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read kubeconfig {path}: {e}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {path} is not a mapping")
        read.append(str(path))
        current = current or doc.get("current-context")
        for section in merged:
            for item in doc.get(section) or []:
                if isinstance(item, dict) and item.get("name") not in {i.get("name") for i in merged[section]}:
                    merged[section].append(item)
                    bases[id(item)] = path.parent
    if not read:
        raise ConfigError(f"no kubeconfig found (looked at {', '.join(paths)})",
                          hint="set kubeconfig in [regions.R.kubernetes], or in_cluster = true")
    source = ", ".join(read)
    name = context or current
    if not name:
        raise ConfigError(f"kubeconfig {source} has no current-context; set `context` in [regions.R.kubernetes]")
    ctx = _named(merged["contexts"], name, "context", source)
    cl_item = next((c for c in merged["clusters"] if c.get("name") == ctx.get("cluster")), None)
    if cl_item is None:
        raise ConfigError(f"kubeconfig {source}: context {name!r} names unknown cluster {ctx.get('cluster')!r}")
    cluster = cl_item.get("cluster") or {}
    user_item = next((u for u in merged["users"] if u.get("name") == ctx.get("user")), {"user": {}})
    user = user_item.get("user") or {}
    cbase, ubase = bases.get(id(cl_item), Path(".")), bases.get(id(user_item), Path("."))

    def rel(base: Path, p: str | None) -> str | None:
        return None if not p else str((base / os.path.expanduser(p)).resolve())

    if not cluster.get("server"):
        raise ConfigError(f"kubeconfig {source}: cluster {ctx.get('cluster')!r} has no server")
    if user.get("exec") or user.get("auth-provider"):
        raise ConfigError(f"kubeconfig {source}: user {ctx.get('user')!r} uses an exec/auth-provider plugin, "
                          "which spotctl does not run", hint="use a token, a tokenFile or a client certificate")
    conn = Connection(server=str(cluster["server"]), source=f"{source} (context {name})")
    if cluster.get("certificate-authority-data"):
        conn.ca_file = files.write("ca.crt", cluster["certificate-authority-data"])
    elif cluster.get("certificate-authority"):
        conn.ca_file = rel(cbase, cluster["certificate-authority"])
    conn.verify = not cluster.get("insecure-skip-tls-verify", False)
    conn.token = user.get("token") or None
    conn.token_file = rel(ubase, user.get("tokenFile"))
    if user.get("client-certificate-data"):
        conn.client_cert = files.write("client.crt", user["client-certificate-data"])
    elif user.get("client-certificate"):
        conn.client_cert = rel(ubase, user["client-certificate"])
    if user.get("client-key-data"):
        conn.client_key = files.write("client.key", user["client-key-data"])
    elif user.get("client-key"):
        conn.client_key = rel(ubase, user["client-key"])
    if user.get("username") is not None:
        conn.username, conn.password = str(user["username"]), str(user.get("password") or "")
    return conn


def in_cluster(sa_dir: str = SERVICEACCOUNT_DIR, env: dict | None = None) -> Connection:
    """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, token and CA from ``sa_dir``."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT") or "443"
    if not host:
        raise ConfigError("in_cluster = true but KUBERNETES_SERVICE_HOST is not set (not running in a pod?)")
    token = os.path.join(sa_dir, "token")
    if not os.path.isfile(token):
        raise ConfigError(f"in_cluster = true but there is no service-account token at {token}")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    ca = os.path.join(sa_dir, "ca.crt")
    return Connection(server=f"https://{host}:{port}", token_file=token,
                      ca_file=ca if os.path.isfile(ca) else None, source="in-cluster service account")


# --- the adapter ----------------------------------------------------------------------------


class KubernetesScheduler:
    """The Kubernetes scheduler port over the Kubernetes API."""

    remote = True  # its calls cross the network: a pass reads it in a thread, under its observe deadline

    name = "kubernetes"

    def __init__(self, api: Api, settings: Settings | None = None, clock: Clock | None = None):
        self.api = api
        self.settings = settings or Settings()
        self.clock = clock or SystemClock()
        self.cache = PodCache()
        self._sync_lock = threading.Lock()
        self._synced_at = 0.0
        self._warned: set[str] = set()
        self.stats = {"lists": 0, "watches": 0, "events": 0, "bookmarks": 0, "expired": 0, "reconnects": 0,
                      "malformed": 0}

    @classmethod
    def from_config(cls, region: RegionConfig, clock: Clock | None = None) -> "KubernetesScheduler":
        """Build from ``[regions.R.kubernetes]`` (see the module docstring for the keys)."""
        sec = dict(region.section("kubernetes") or {})
        files = _DataFiles()
        if sec.get("in_cluster"):
            conn = in_cluster(sec.get("serviceaccount_dir") or SERVICEACCOUNT_DIR)
        elif sec.get("server"):
            conn = Connection(server=sec["server"], token_file=sec.get("token_file"), ca_file=sec.get("ca_file"),
                              verify=not sec.get("insecure_skip_tls_verify", False), source="config")
        else:
            if sec.get("kubeconfig"):
                paths = [sec["kubeconfig"]]
            elif os.environ.get("KUBECONFIG"):
                paths = [p for p in os.environ["KUBECONFIG"].split(os.pathsep) if p]
            else:
                paths = [os.path.join(os.path.expanduser("~"), ".kube", "config")]
            conn = load_kubeconfig(paths, sec.get("context"), files)
        if sec.get("token_file") and not sec.get("in_cluster"):
            conn.token_file = sec["token_file"]
        if sec.get("ca_file") and not sec.get("in_cluster"):
            conn.ca_file = sec["ca_file"]
        names = {f.name for f in Settings.__dataclass_fields__.values()}
        kw = {k: v for k, v in sec.items() if k in names}
        kw.setdefault("default_pod_seconds", region.policy.default_pod_seconds)
        settings = Settings(**kw)
        if settings.page_size < 1:
            raise ConfigError("[kubernetes] page_size must be >= 1")
        api = Api(conn, timeout=float(settings.timeout_seconds))
        api.files = files
        log.debug("kubernetes: %s via %s", conn.server, conn.source)
        return cls(api, settings, clock)

    # -- paths

    def _pods_path(self) -> str:
        ns = self.settings.namespace
        return f"/api/v1/namespaces/{quote(ns, safe='')}/pods" if ns else "/api/v1/pods"

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"

    @staticmethod
    def _node_path(node: str) -> str:
        return f"/api/v1/nodes/{quote(node, safe='')}"

    # -- list + watch

    def _list(self, path: str, params: dict | None = None) -> tuple[list[dict], str]:
        """Every item of a collection, paginated; the resourceVersion of the first page."""
        params = dict(params or {}, limit=str(self.settings.page_size))
        items: list[dict] = []
        rv = None
        for _attempt in range(3):
            items, rv, cont = [], None, None
            try:
                while True:
                    page_params = dict(params, **({"continue": cont} if cont else {}))
                    _, page = self.api.request("GET", path, params=page_params)
                    meta = page.get("metadata") or {}
                    rv = rv or meta.get("resourceVersion")
                    items.extend(page.get("items") or [])
                    cont = meta.get("continue")
                    if not cont:
                        return items, str(rv or "")
            except TemporaryError as e:
                if "HTTP 410" not in e.message:  # an expired continue token: list again from the start
                    raise
        raise TemporaryError(f"Kubernetes: listing {path} kept expiring mid-way; try again")

    def _relist(self) -> None:
        objs, rv = self._list(self._pods_path(), {"fieldSelector": ACTIVE_PODS})
        self.cache.replace([self._digest(o) for o in objs], rv)
        self.stats["lists"] += 1
        log.debug("kubernetes: listed %d pods at resourceVersion %s", len(objs), rv)

    def _digest(self, obj: dict) -> PodView:
        view = digest(obj, self.settings)
        if view.problem and view.key not in self._warned:
            self._warned.add(view.key)
            log.warning("kubernetes: pod %s is malformed (%s); skipped", view.key, view.problem)
        return view

    def _catch_up(self) -> None:
        """Apply the watch events since the cache's resourceVersion (bounded in time)."""
        s = self.settings
        deadline = time.monotonic() + s.watch_max_seconds
        drops = 0
        while True:
            self.stats["watches"] += 1
            try:
                for ev in self.api.watch(self._pods_path(), {"fieldSelector": ACTIVE_PODS,
                                                              "resourceVersion": self.cache.rv or ""},
                                         idle=s.watch_idle_seconds,
                                         limit=max(0.5, deadline - time.monotonic())):
                    etype, obj = ev.get("type"), ev.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if etype == "BOOKMARK":  # everything up to rv has been sent: caught up
                        self.stats["bookmarks"] += 1
                        if rv:
                            self.cache.rv = rv
                        return
                    if etype not in ("ADDED", "MODIFIED", "DELETED"):
                        continue
                    self.stats["events"] += 1
                    self.cache.apply(etype, self._digest(obj), rv)
                return
            except _Dropped:
                drops += 1
                self.stats["reconnects"] += 1
                log.info("kubernetes: pod watch dropped; reconnecting from resourceVersion %s", self.cache.rv)
                if drops > 3 or time.monotonic() >= deadline:
                    raise TemporaryError("Kubernetes pod watch keeps breaking off; will relist next time") from None

    def sync(self) -> None:
        """Bring the pod cache up to date: list the first time, then a watch catch-up."""
        with self._sync_lock:
            try:
                if self.cache.rv is None:
                    self._relist()
                else:
                    try:
                        self._catch_up()
                    except _Expired:
                        self.stats["expired"] += 1
                        log.info("kubernetes: resourceVersion %s expired (410); relisting pods", self.cache.rv)
                        self._relist()
            except TemporaryError:
                self.cache.rv = None  # start over with a list next time
                raise
            self._synced_at = time.monotonic()

    def _fresh(self) -> None:
        if time.monotonic() - self._synced_at > 1.0 or self.cache.rv is None:
            self.sync()

    # -- SchedulerPort: observe

    def pending(self, pools: dict[str, PoolSpec]) -> tuple[list[WorkUnit], list[Exclusion]]:
        self.sync()
        bound = [p for p in pools.values() if p.kubernetes.labels or p.kubernetes.taints]
        taints = {p.name: [Taint.parse(t) for t in p.kubernetes.taints] for p in bound}
        all_keys = sorted({t.key for p in bound for t in taints[p.name]})
        units: list[WorkUnit] = []
        excluded: list[Exclusion] = []
        malformed = 0
        for v in self.cache.pods.values():
            if v.node or v.phase != "Pending":
                continue
            if v.problem:
                malformed += 1
                excluded.append(self._excl(v, "malformed pod (see the warning log)"))
                continue
            if v.gated:
                excluded.append(self._excl(v, "scheduling gated (spec.schedulingGates)"))
                continue
            if not v.unschedulable:
                continue  # the scheduler has not given up on it (yet)
            if v.nominated:
                excluded.append(self._excl(v, "preemption in progress (nominatedNodeName set)"))
                continue
            if not bound:
                excluded.append(self._excl(v, "no spot pool has a Kubernetes binding (labels/taints)"))
                continue
            tols = v.spec.get("tolerations") or []
            tolerating = [p for p in bound if all(tolerates(tols, t) for t in taints[p.name])]
            if not tolerating:
                excluded.append(self._excl(v, "does not tolerate the spot taints"))
                continue
            fitting = [p for p in tolerating if affinity_match(v.spec, dict(p.kubernetes.labels))]
            if not fitting:
                excluded.append(self._excl(v, "node selector/affinity matches no spot pool"))
                continue
            units.append(self._unit(v, fitting, bound, taints, all_keys))
        self.stats["malformed"] = malformed
        return units, excluded

    @staticmethod
    def _excl(v: PodView, reason: str) -> Exclusion:
        return Exclusion(unit_id=f"pod/{v.key}", scheduler=Scheduler.KUBERNETES, reason=reason)

    def _unit(self, v: PodView, fitting: list[PoolSpec], bound: list[PoolSpec], taints: dict[str, list[Taint]],
              all_keys: list[str]) -> WorkUnit:
        """A WorkUnit whose node_selector/tolerations make ``PoolSpec.serves`` pick exactly ``fitting``."""
        tol_keys = tuple(k for k in all_keys
                         if any(t.key == k and tolerates(v.spec.get("tolerations") or [], t)
                                for ts in taints.values() for t in ts))
        selector = dict(sorted((v.spec.get("nodeSelector") or {}).items()))
        names = {p.name for p in fitting}
        others = [p for p in bound if p.name not in names]
        if others:
            common = set(fitting[0].kubernetes.labels)
            for p in fitting[1:]:
                common &= set(p.kubernetes.labels)
            distinguishing = [kv for kv in sorted(common) if all(kv not in set(o.kubernetes.labels) for o in others)]
            if distinguishing:
                selector.setdefault(*distinguishing[0])
            elif len(fitting) == 1:
                for k, val in fitting[0].kubernetes.labels:
                    selector.setdefault(k, val)
        return WorkUnit(
            id=f"pod/{v.key}", scheduler=Scheduler.KUBERNETES, shape=v.shape or Shape(), priority=v.priority,
            expected_seconds=v.expected_seconds or self.settings.default_pod_seconds, submitted_at=v.created,
            node_selector=tuple(selector.items()), tolerations=tol_keys,
        )

    def usage(self) -> list[NodeUsage]:
        self._fresh()
        params = {"labelSelector": self.settings.node_label_selector} if self.settings.node_label_selector else {}
        nodes, _ = self._list("/api/v1/nodes", params)
        by_node: dict[str, list[PodView]] = {}
        for v in self.cache.pods.values():
            if v.node and v.phase not in DONE_PHASES and not v.daemonset and not v.mirror:
                by_node.setdefault(v.node, []).append(v)
        now = self.clock.now()
        out = []
        for n in nodes:
            name = (n.get("metadata") or {}).get("name")
            if not name:
                continue
            pods = by_node.get(name, [])
            used = to_shape(sum(p.resources[0] for p in pods), sum(p.resources[1] for p in pods),
                            sum(p.resources[2] for p in pods))
            out.append(NodeUsage(node=name, scheduler=Scheduler.KUBERNETES, used=used, running=len(pods),
                                 cordoned=bool((n.get("spec") or {}).get("unschedulable")),
                                 last_busy_at=now if pods else None))
        return out

    # -- SchedulerPort: act

    def _patch_node(self, node: str, change) -> dict:
        """Read the node, apply ``change(node) -> merge patch`` with the resourceVersion precondition; retry conflicts."""
        for attempt in range(5):
            _, obj = self.api.request("GET", self._node_path(node))
            patch = change(obj)
            if patch is None:
                return obj
            patch.setdefault("metadata", {})["resourceVersion"] = (obj.get("metadata") or {}).get("resourceVersion")
            try:
                _, out = self.api.request("PATCH", self._node_path(node), body=patch,
                                          content_type="application/merge-patch+json")
                return out
            except TemporaryError as e:
                if "HTTP 409" not in e.message or attempt == 4:
                    raise
                log.debug("kubernetes: node %s changed under us; retrying the patch", node)
        raise TemporaryError(f"Kubernetes: node {node} kept changing; could not patch it")

    def cordon(self, node: str, reason: str) -> None:
        key = self.settings.cordon_taint

        def change(obj: dict) -> dict | None:
            spec = obj.get("spec") or {}
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            if spec.get("unschedulable") and annotations.get(ANNOTATION_REASON) == reason[:1024] and any(
                    t.get("key") == key and t.get("effect") == "NoSchedule" for t in spec.get("taints") or []):
                return None  # already cordoned by us for this reason: nothing to write
            taints = [t for t in spec.get("taints") or [] if t.get("key") != key]
            taints.append({"key": key, "effect": "NoSchedule"})
            ann = {ANNOTATION_REASON: reason[:1024]}
            if not spec.get("unschedulable") or annotations.get(ANNOTATION_CORDONED) == "true":
                ann[ANNOTATION_CORDONED] = "true"  # we cordoned it, so resume may uncordon it
            return {"metadata": {"annotations": ann}, "spec": {"unschedulable": True, "taints": taints}}

        self._patch_node(node, change)
        log.info("kubernetes: cordoned node %s (%s)", node, reason)

    def protect(self, node: str, until: float | None, closed: bool = False) -> None:
        """The calendar at run time: the ``spotctl.io/safe-until`` annotation says by when work on the node
        must end; with ``closed`` (the planner found the window shorter than the work that could land), a
        ``spotctl.io/window-closing`` NoSchedule taint keeps new pods off — a pod known to be short may
        tolerate it. ``until=None`` removes both. Kubernetes itself knows no durations, hence the taint."""
        stamp = None if until is None else iso(until)

        def change(obj: dict) -> dict | None:
            spec = obj.get("spec") or {}
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            taints = spec.get("taints") or []
            kept = [t for t in taints if t.get("key") != TAINT_WINDOW]
            want = kept + ([{"key": TAINT_WINDOW, "value": str(int(until)), "effect": "NoSchedule"}]
                           if closed and until is not None else [])
            if annotations.get(ANNOTATION_SAFE_UNTIL) == stamp and want == taints:
                return None  # already so
            return {"metadata": {"annotations": {ANNOTATION_SAFE_UNTIL: stamp}}, "spec": {"taints": want or None}}

        self._patch_node(node, change)
        log.info("kubernetes: node %s safe until %s%s", node, stamp or "-", " (tainted: window closing)"
                 if closed and until is not None else "")

    def resume(self, node: str) -> None:
        key = self.settings.cordon_taint

        def change(obj: dict) -> dict | None:
            spec = obj.get("spec") or {}
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            taints = spec.get("taints") or []
            kept = [t for t in taints if t.get("key") != key]
            ours = annotations.get(ANNOTATION_CORDONED) == "true"
            if len(kept) == len(taints) and not ours and ANNOTATION_REASON not in annotations:
                return None  # nothing of ours on it
            patch: dict = {"metadata": {"annotations": {ANNOTATION_CORDONED: None, ANNOTATION_REASON: None}},
                           "spec": {"taints": kept or None}}
            if ours:
                patch["spec"]["unschedulable"] = None
            return patch

        self._patch_node(node, change)
        log.info("kubernetes: resumed node %s", node)

    def forget(self, node: str, reason: str) -> None:
        try:
            self.api.request("DELETE", self._node_path(node))
            log.info("kubernetes: deleted node object %s (%s)", node, reason)
        except NotFoundError:
            log.debug("kubernetes: node %s already gone", node)

    def _pods_on(self, node: str) -> list[dict]:
        objs, _ = self._list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node},{ACTIVE_PODS}"})
        return objs

    def _evict(self, namespace: str, name: str, grace: int | None = None) -> tuple[bool, str]:
        """Ask the Eviction subresource; (done, why-not). 429 (PDB) and 5xx are 'not now', not errors."""
        body: dict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        if grace is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace}
        try:
            code, payload = self.api.request("POST", self._pod_path(namespace, name) + "/eviction", body=body,
                                             ok=(429, 500, 503))
        except NotFoundError:
            return True, "already gone"
        if code < 300:
            return True, "evicted"
        causes = ((payload.get("details") or {}).get("causes") or []) if isinstance(payload, dict) else []
        why = "; ".join(c.get("message", "") for c in causes if isinstance(c, dict)) or payload.get("message", "")
        return False, f"HTTP {code}: {why}"

    def _delete_pod(self, namespace: str, name: str, grace: int) -> bool:
        """DELETE with a grace period; False when the pod was already gone."""
        try:
            self.api.request("DELETE", self._pod_path(namespace, name), params={"gracePeriodSeconds": str(grace)})
            return True
        except NotFoundError:
            return False

    def drain(self, node: str, reason: str, deadline: float | None, force: bool = False) -> DrainProgress:
        """One drain round (see the module doc): cordon, evict once what is not leaving yet, and when
        forced (or within the margin of a hard notice's deadline) delete what still stays; return
        what is left, without waiting."""
        s = self.settings
        self.cordon(node, reason)
        now = self.clock.now()
        force = force or (deadline is not None and now >= deadline - s.deadline_margin_seconds)
        grace = max(0, int(math.floor((deadline or now) - now)) - 1)  # what fits before the deadline
        remaining = moved = 0
        blocked: list[str] = []
        forced: list[str] = []
        for p in self._pods_on(node):
            v = digest(p, s)
            if v.daemonset or v.mirror or v.phase in DONE_PHASES:
                continue  # DaemonSet and static pods stay (like kubectl drain --ignore-daemonsets)
            remaining += 1
            leaving_at = _ts((p.get("metadata") or {}).get("deletionTimestamp"))
            if leaving_at and (not force or deadline is None or leaving_at <= deadline):
                continue  # already terminating, and (when it matters) gone before the deadline
            if not leaving_at:
                # forced: still ask for an eviction first (it honours the budget where it can), with
                # a grace period that ends before the deadline
                done, why = self._evict(v.namespace, v.name, grace if force else None)
                if done:
                    moved += 1
                    continue
                if not force:
                    blocked.append(f"{v.key}: {why}")
                    continue
            if self._delete_pod(v.namespace, v.name, grace):  # blocked, or terminating past the deadline
                forced.append(v.key)
                log.warning("kubernetes: deleted pod %s on %s (grace %ds) at the notice deadline", v.key, node, grace)
        log.info("kubernetes: drain %s: %d pod(s) left, %d evicted, %d blocked, %d deleted", node, remaining, moved,
                 len(blocked), len(forced))
        return DrainProgress(scheduler="kubernetes", remaining=remaining, moved=moved, blocked=tuple(blocked),
                             forced=tuple(forced))
