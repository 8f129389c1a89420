"""The pod cache: :class:`PodView` (a compact digest of a Pod, made by :func:`digest`), :class:`PodCache`
(pods by namespace/name at a resourceVersion) and :class:`PodSync`, which keeps the cache current by
list + watch.

The first sync lists pods (paginated) and remembers the list's ``resourceVersion``; every later sync is
a bounded watch catch-up from the last version seen (``allowWatchBookmarks``), applying
ADDED/MODIFIED/DELETED to the cache keyed by namespace/name, so no pod is lost or counted twice.
``410 Gone``/``Expired`` relists; a dropped connection reconnects from the last version seen.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote

from spotctl.core.errors import TemporaryError
from spotctl.core.models import Shape
from spotctl.core.timefmt import parse_ts

from .api import Api, Dropped, Expired
from .predicates import affinity_match
from .quantity import pod_resources, to_shape
from .settings import Settings

log = logging.getLogger(__name__)

DONE_PHASES = ("Succeeded", "Failed")
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


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
    started: float | None = None  # status.startTime (when the kubelet took it); None: not reported, or not a time


def metav1_time(text: str | None) -> float:
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
        shape=None, resources=(0.0, 0.0, 0.0), priority=0, expected_seconds=None, created=metav1_time(md.get("creationTimestamp")),
        daemonset=any(isinstance(o, dict) and o.get("kind") == "DaemonSet" and o.get("controller") for o in owners),
        mirror="kubernetes.io/config.mirror" in annotations, gated=bool(spec.get("schedulingGates")),
        nominated=bool(st.get("nominatedNodeName")),
        started=(metav1_time(st["startTime"]) or None) if isinstance(st.get("startTime"), str) else None,
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



class PodSync:
    """Keeps a :class:`PodCache` current by list + watch (see the module doc); ``stats`` counts what it did."""

    def __init__(self, api: Api, settings: Settings):
        self.api = api
        self.settings = settings
        self.cache = PodCache()
        self._lock = threading.Lock()
        self._synced_at = 0.0
        self._warned: set[str] = set()
        self.stats = {"lists": 0, "watches": 0, "events": 0, "bookmarks": 0, "expired": 0, "reconnects": 0,
                      "malformed": 0}

    def path(self) -> str:
        ns = self.settings.namespace
        return f"/api/v1/namespaces/{quote(ns, safe='')}/pods" if ns else "/api/v1/pods"

    def _relist(self) -> None:
        objs, rv = self.api.list_all(self.path(), {"fieldSelector": ACTIVE_PODS}, self.settings.page_size)
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
        until = time.monotonic() + s.watch_max_seconds
        drops = 0
        while True:
            self.stats["watches"] += 1
            try:
                for ev in self.api.watch(self.path(), {"fieldSelector": ACTIVE_PODS,
                                                       "resourceVersion": self.cache.rv or ""},
                                         idle=s.watch_idle_seconds, limit=max(0.5, until - time.monotonic())):
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
            except Dropped:
                drops += 1
                self.stats["reconnects"] += 1
                log.info("kubernetes: pod watch dropped; reconnecting from resourceVersion %s", self.cache.rv)
                if drops > 3 or time.monotonic() >= until:
                    raise TemporaryError("Kubernetes pod watch keeps breaking off; will relist next time") from None

    def sync(self) -> None:
        """Bring the pod cache up to date: list the first time, then a watch catch-up."""
        with self._lock:
            try:
                if self.cache.rv is None:
                    self._relist()
                else:
                    try:
                        self._catch_up()
                    except Expired:
                        self.stats["expired"] += 1
                        log.info("kubernetes: resourceVersion %s expired (410); relisting pods", self.cache.rv)
                        self._relist()
            except TemporaryError:
                self.cache.rv = None  # start over with a list next time
                raise
            self._synced_at = time.monotonic()

    def fresh(self) -> None:
        """Sync unless the cache was synced within the last second."""
        if time.monotonic() - self._synced_at > 1.0 or self.cache.rv is None:
            self.sync()
