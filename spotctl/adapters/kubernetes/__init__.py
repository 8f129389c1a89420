"""Kubernetes through its HTTP API: our own requests-based client and list+watch pod cache, with credentials
and TLS read by the official ``kubernetes`` client's configuration loading.

Implements :class:`spotctl.core.ports.SchedulerPort`:

* **demand** — pods that are Pending, unbound, with condition ``PodScheduled=False`` reason
  ``Unschedulable``, that tolerate a spot pool's taints and whose node selector and required
  node affinity that pool's labels satisfy. Their shape comes from the container requests
  (CPU rounded up to whole vCPUs, memory in MiB, ``nvidia.com/gpu``/``amd.com/gpu``);
  the expected duration from the ``spotctl.io/expected-seconds`` annotation, else
  ``activeDeadlineSeconds``, else the region's ``policy.default_pod_seconds``. Pods that no
  pool can take are returned as :class:`Exclusion` with the reason.
* **a pod cache kept by list + watch** (:mod:`.pods`): a paginated list first, then bounded watch
  catch-ups from the last resourceVersion seen; 410 relists, a dropped stream reconnects.
* **cordon** (``spec.unschedulable`` plus a ``NoSchedule`` taint, with an optimistic-concurrency
  merge patch), **drain** (cordon, then the policy/v1 Eviction subresource for every evictable
  pod; PodDisruptionBudget 429s are retried until the deadline; for hard notices only, pods
  still blocked are deleted at the deadline), **resume** (remove the taint; uncordon only what
  we cordoned) and **forget** (delete the Node object).

Modules: :mod:`.quantity` (resource quantities, a pod's requests, shapes), :mod:`.predicates`
(taints, tolerations, node affinity), :mod:`.pods` (the pod cache), :mod:`.api` (the HTTP client and
its errors, by the rule of :mod:`spotctl.adapters._http`), :mod:`.kubeconfig` (credentials and TLS),
:mod:`.settings` and :mod:`.scheduler` (the port). Nothing here imports ``requests`` or ``kubernetes``
at import time.

Region table ``[regions.R.kubernetes]`` (every key optional):

``kubeconfig``/``context``
    kubeconfig file (default ``$KUBECONFIG`` or ``~/.kube/config``) and context (default: the
    current one). Bearer token or tokenFile, exec credential plugin or auth provider, client
    certificate/key and CA as files or data.
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

from .api import Api, Connection, Credentials, translate
from .kubeconfig import SERVICEACCOUNT_DIR, KubeconfigCredentials, in_cluster, load_kubeconfig
from .pods import PodCache, PodSync, PodView, digest
from .predicates import Taint, affinity_match, tolerates
from .quantity import parse_quantity, pod_resources, to_shape
from .scheduler import ANNOTATION_CORDONED, ANNOTATION_REASON, ANNOTATION_SAFE_UNTIL, TAINT_WINDOW, KubernetesScheduler
from .settings import Settings

__all__ = [
    "ANNOTATION_CORDONED",
    "ANNOTATION_REASON",
    "ANNOTATION_SAFE_UNTIL",
    "SERVICEACCOUNT_DIR",
    "TAINT_WINDOW",
    "Api",
    "Connection",
    "Credentials",
    "KubeconfigCredentials",
    "KubernetesScheduler",
    "PodCache",
    "PodSync",
    "PodView",
    "Settings",
    "Taint",
    "affinity_match",
    "digest",
    "in_cluster",
    "load_kubeconfig",
    "parse_quantity",
    "pod_resources",
    "to_shape",
    "tolerates",
    "translate",
]
