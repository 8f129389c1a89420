"""The Kubernetes scheduler port (:class:`KubernetesScheduler`, :class:`spotctl.core.ports.SchedulerPort`)
over the API client, the pod cache and the predicates of this package: demand from pending pods, usage per
node, and cordon, protect, drain, resume and forget on nodes (what each does is in the package doc)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from urllib.parse import quote

from spotctl.core.config import RegionConfig
from spotctl.core.errors import ConfigError, NotFoundError, TemporaryError
from spotctl.core.models import DrainProgress, Exclusion, NodeUsage, PoolSpec, Scheduler, Shape, WorkUnit
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.timefmt import iso

from .api import Api, Connection
from .kubeconfig import SERVICEACCOUNT_DIR, in_cluster, load_kubeconfig
from .pods import ACTIVE_PODS, DONE_PHASES, PodCache, PodSync, PodView, digest, metav1_time
from .predicates import Taint, affinity_match, tolerates
from .quantity import to_shape
from .settings import Settings

log = logging.getLogger(__name__)

ANNOTATION_CORDONED = "spotctl.io/cordoned"
ANNOTATION_REASON = "spotctl.io/cordon-reason"
ANNOTATION_SAFE_UNTIL = "spotctl.io/safe-until"  # protect(): work on the node must end by then (RFC 3339)
TAINT_WINDOW = "spotctl.io/window-closing"  # protect(closed=True): too little time left for new work


class KubernetesScheduler:
    """The Kubernetes scheduler port over the Kubernetes API."""

    remote = True  # its calls cross the network: a pass reads it in a thread, under its observe deadline

    name = "kubernetes"

    def __init__(self, api: Api, settings: Settings | None = None, clock: Clock | None = None):
        self.api = api
        self.settings = settings or Settings()
        self.clock = clock or SystemClock()
        self.pods = PodSync(api, self.settings)

    @property
    def cache(self) -> PodCache:
        return self.pods.cache

    @property
    def stats(self) -> dict[str, int]:
        """What the pod cache did: lists, watches, events, bookmarks, expired, reconnects, malformed."""
        return self.pods.stats

    @classmethod
    def from_config(cls, region: RegionConfig, clock: Clock | None = None) -> KubernetesScheduler:
        """Build from ``[regions.R.kubernetes]`` (see the package docstring for the keys)."""
        sec = dict(region.section("kubernetes") or {})
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
            conn = load_kubeconfig(paths, sec.get("context"))
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
        log.debug("kubernetes: %s via %s", conn.server, conn.source)
        return cls(Api(conn, timeout=float(settings.timeout_seconds)), settings, clock)

    # -- paths

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"

    @staticmethod
    def _node_path(node: str) -> str:
        return f"/api/v1/nodes/{quote(node, safe='')}"

    def sync(self) -> None:
        """Bring the pod cache up to date (see :class:`PodSync`)."""
        self.pods.sync()

    # -- SchedulerPort: observe

    def pending(self, pools: dict[str, PoolSpec]) -> tuple[list[WorkUnit], list[Exclusion]]:
        self.pods.sync()
        bound = [p for p in pools.values() if p.kubernetes.labels or p.kubernetes.taints]
        taints = {p.name: [Taint.parse(t) for t in p.kubernetes.taints] for p in bound}
        all_keys = sorted({t.key for p in bound for t in taints[p.name]})
        units: list[WorkUnit] = []
        excluded: list[Exclusion] = []
        malformed = 0
        for v in self.pods.cache.pods.values():
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
        self.pods.stats["malformed"] = malformed
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
        self.pods.fresh()
        params = {"labelSelector": self.settings.node_label_selector} if self.settings.node_label_selector else {}
        nodes, _ = self.api.list_all("/api/v1/nodes", params, self.settings.page_size)
        by_node: dict[str, list[PodView]] = {}
        for v in self.pods.cache.pods.values():
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
            # the youngest pod's start: every pod there has run at least this long (None: one did not say when)
            starts = [p.started for p in pods]
            started = max(s for s in starts if s is not None) if pods and None not in starts else None
            out.append(NodeUsage(node=name, scheduler=Scheduler.KUBERNETES, used=used, running=len(pods),
                                 cordoned=bool((n.get("spec") or {}).get("unschedulable")),
                                 last_busy_at=now if pods else None, work_started_at=started))
        return out

    # -- SchedulerPort: act

    def _patch_node(self, node: str, change: Callable[[dict], dict | None]) -> dict:
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
        objs, _ = self.api.list_all("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node},{ACTIVE_PODS}"},
                                    self.settings.page_size)
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
            leaving_at = metav1_time((p.get("metadata") or {}).get("deletionTimestamp"))
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
