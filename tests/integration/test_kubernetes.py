"""The Kubernetes adapter against the Kubernetes API test server (scripts/testenv/k8s).

The server validates every request and response body against the official Kubernetes schemas
(kubernetes-validate); each test ends by checking that none of our requests was rejected and
none of its answers was invalid. Start it with `scripts/testenv/k8s up`.

Each test works in a namespace and on nodes of its own (the adapter is scoped to that namespace),
so test runs sharing one server leave each other alone.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from spotctl.adapters.kubernetes import Api, Connection, KubernetesScheduler, Settings, in_cluster, load_kubeconfig
from spotctl.core.config import load_config
from spotctl.core.errors import AuthError, ExitCode, NotFoundError, TemporaryError, UnavailableError

from . import conftest as harness
from .conftest import testenv as service_env
from .conftest import unavailable

pytestmark = pytest.mark.integration

SPOT_TOLERATION = {"key": "spotctl.io/spot", "operator": "Exists", "effect": "NoSchedule"}
UNSCHEDULABLE = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/3 nodes are available: 3 Insufficient cpu."}]}


# --- fixtures -----------------------------------------------------------------------------------


class K8s:
    """Talks to the test server directly (to set the scene) and builds adapters against it."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.url = env["K8S_URL"]
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {env['K8S_TOKEN']}"

    def admin(self, what: str, **body) -> dict:
        r = self.http.post(f"{self.url}/_admin/{what}", json=body, timeout=10)
        r.raise_for_status()
        return r.json()

    def stats(self) -> dict:
        return self.http.get(f"{self.url}/_admin/stats", timeout=10).json()

    def post(self, path: str, body: dict) -> dict:
        r = self.http.post(self.url + path, json=body, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, path: str) -> requests.Response:
        return self.http.get(self.url + path, timeout=10)

    def pod(self, ns: str, name: str, *, cpu: str = "1500m", memory: str = "1Gi", tolerate: bool = True,
            status: dict | None = None, node: str | None = None, labels: dict | None = None,
            annotations: dict | None = None, **spec) -> dict:
        container = {"name": "main", "image": "busybox:1.36",
                     "resources": {"requests": {"cpu": cpu, "memory": memory}}}
        body_spec = {"containers": [container], **spec}
        if tolerate:
            body_spec["tolerations"] = [SPOT_TOLERATION]
        if node:
            body_spec["nodeName"] = node
        md: dict = {"name": name, "labels": labels or {"app": name}}
        if annotations:
            md["annotations"] = annotations
        return self.post(f"/api/v1/namespaces/{ns}/pods",
                         {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": body_spec,
                          "status": status if status is not None else UNSCHEDULABLE})

    def node(self, name: str, labels: dict | None = None) -> dict:
        return self.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                           "metadata": {"name": name, "labels": labels or {}},
                                           "spec": {}, "status": {"capacity": {"cpu": "4", "memory": "4000Mi"}}})

    def pdb(self, ns: str, name: str, app: str, min_available: int = 1) -> dict:
        return self.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
                         {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
                          "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}})

    def adapter(self, token: str | None = None, url: str | None = None, **settings) -> KubernetesScheduler:
        conn = Connection(server=url or self.url, token=token or self.env["K8S_TOKEN"], source="test")
        opts = {"timeout_seconds": 5, "watch_idle_seconds": 0.3, **settings}
        return KubernetesScheduler(Api(conn, timeout=opts["timeout_seconds"]), Settings(**opts))


@pytest.fixture(scope="module")
def k8s_env() -> dict[str, str]:
    env = service_env("k8s")
    try:
        requests.get(env["K8S_URL"] + "/readyz", headers={"Authorization": f"Bearer {env['K8S_TOKEN']}"},
                     timeout=3).raise_for_status()
    except requests.RequestException as e:

        unavailable("k8s", str(e))
    return env


@pytest.fixture
def k8s(k8s_env):
    """The server; after the test, no request was rejected and no answer failed the schemas."""
    k = K8s(k8s_env)
    before = k.stats()
    yield k
    st = k.stats()
    invalid = st["validation_errors"][len(before["validation_errors"]):]
    rejected = st["rejected_requests"][len(before["rejected_requests"]):]
    assert invalid == [], f"the test server answered with bodies that fail the schemas: {invalid}"
    assert rejected == [], f"our requests failed the schemas: {rejected}"


@pytest.fixture
def a() -> str:
    """This test's namespace."""
    return "t-" + uuid.uuid4().hex[:8]


@pytest.fixture
def lab_config(k8s_env, a, tmp_path) -> str:
    """The generated `lab` config, with the adapter scoped to this test's namespace."""
    path = tmp_path / "lab.toml"
    text = Path(k8s_env["SPOTCTL_K8S_CONFIG"]).read_text()
    path.write_text(text.replace("[regions.lab.kubernetes]\n", f'[regions.lab.kubernetes]\nnamespace = "{a}"\n'))
    return str(path)


@pytest.fixture
def lab(lab_config):
    """The `lab` region (simulated cloud + the real Kubernetes adapter)."""
    return load_config(env={"SPOTCTL_CONFIG": lab_config}).region("lab")


def spotctl(tmp_path: Path, config: str, *args: str):
    from spotctl.cli.main import app

    env = {"SPOTCTL_CONFIG": config, "SPOTCTL_REGION": "lab", "SPOTCTL_STATE_DIR": str(tmp_path / "state"),
           "NO_COLOR": "1"}
    result = CliRunner().invoke(app, ["-o", "json", *args], env=env, catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else None, result.stderr


# --- demand -------------------------------------------------------------------------------------


def test_unschedulable_pods_that_tolerate_spot_are_demand_and_others_are_excluded(k8s, a, lab, lab_config,
                                                                                   tmp_path):
    k8s.pod(a, "batch-1", cpu="1500m", memory="1500Mi", annotations={"spotctl.io/expected-seconds": "900"},
            priority=100)
    k8s.pod(a, "batch-2", cpu="2", memory="3Gi", activeDeadlineSeconds=1800)
    k8s.pod(a, "gpu-1", cpu="8", memory="16Gi", nodeSelector={"spotctl.io/pool": "bm-spot"})
    k8s.pod(a, "affine", cpu="1", memory="512Mi", affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "spotctl.io/pool", "operator": "In", "values": ["vm-spot"]}]}]}}})
    k8s.pod(a, "web-1", tolerate=False)  # does not tolerate spot
    k8s.pod(a, "pinned", nodeSelector={"disktype": "ssd"})  # no spot pool has that label
    k8s.pod(a, "garbage", cpu="lots")  # malformed quantity: skipped with a warning, counted
    k8s.pod(a, "fresh", status={"phase": "Pending"})  # the scheduler has not given up on it yet
    k8s.node(f"on-demand-{a}")
    k8s.pod(a, "running", node=f"on-demand-{a}", status={"phase": "Running"})

    sched = KubernetesScheduler.from_config(lab)
    units, excluded = sched.pending(lab.pools)
    by_id = {u.id: u for u in units}
    assert set(by_id) == {f"pod/{a}/batch-1", f"pod/{a}/batch-2", f"pod/{a}/gpu-1", f"pod/{a}/affine"}
    b1 = by_id[f"pod/{a}/batch-1"]
    assert (b1.shape.vcpu, b1.shape.ram_mb, b1.priority, b1.expected_seconds) == (2, 1500, 100, 900)
    assert by_id[f"pod/{a}/batch-2"].expected_seconds == 1800
    assert by_id[f"pod/{a}/batch-2"].shape.ram_mb == 3072
    pools = lab.pools
    assert [p for p in pools if pools[p].serves(by_id[f"pod/{a}/gpu-1"])] == ["bm-spot"]
    assert [p for p in pools if pools[p].serves(by_id[f"pod/{a}/affine"])] == ["vm-spot"]
    assert sorted(p for p in pools if pools[p].serves(b1)) == ["bm-spot", "vm-spot"]
    reasons = {e.unit_id: e.reason for e in excluded}
    assert reasons == {f"pod/{a}/web-1": "does not tolerate the spot taints",
                       f"pod/{a}/pinned": "node selector/affinity matches no spot pool",
                       f"pod/{a}/garbage": "malformed pod (see the warning log)"}
    assert sched.stats["malformed"] == 1

    code, out, err = spotctl(tmp_path, lab_config, "plan")
    assert code == 0, err
    data = out["data"]
    assert data["degraded"] == {}
    assert data["demand"]["by_scheduler"]["kubernetes"] == 4
    assert data["demand"]["excluded_reasons"]["does not tolerate the spot taints"] == 1
    excl = {e["unit"]: e for e in data["excluded"] if e["scheduler"] == "kubernetes"}
    assert excl[f"pod/{a}/web-1"]["reason"] == "does not tolerate the spot taints"
    assert set(excl) == set(reasons)
    launched = {a_["pool"]: a_["count"] for a_ in data["actions"] if a_["kind"] == "launch"}
    assert launched.get("bm-spot", 0) >= 1 and launched.get("vm-spot", 0) >= 1


# --- the watch ------------------------------------------------------------------------------------


def _ids(sched: KubernetesScheduler, pools) -> list[str]:
    units, _ = sched.pending(pools)
    ids = [u.id for u in units]
    assert len(ids) == len(set(ids)), "a pod was counted twice"
    return ids


def test_watch_survives_410_and_dropped_connections_without_losing_or_double_counting(k8s, a, lab):
    expected = set()
    for i in range(5):
        k8s.pod(a, f"p{i}")
        expected.add(f"pod/{a}/p{i}")
    sched = k8s.adapter(namespace=a)
    assert set(_ids(sched, lab.pools)) == expected
    assert sched.stats["lists"] == 1

    # catch-up by watch: additions, a deletion, a pod that got scheduled (leaves the demand)
    for i in range(5, 8):
        k8s.pod(a, f"p{i}")
        expected.add(f"pod/{a}/p{i}")
    assert k8s.http.delete(f"{k8s.url}/api/v1/namespaces/{a}/pods/p0", timeout=5).status_code == 200
    expected.discard(f"pod/{a}/p0")
    r = k8s.http.patch(f"{k8s.url}/api/v1/namespaces/{a}/pods/p1/status",
                       data=json.dumps({"status": {"phase": "Running", "conditions": None}}),
                       headers={"Content-Type": "application/merge-patch+json"}, timeout=5)
    assert r.status_code == 200, r.text
    expected.discard(f"pod/{a}/p1")
    assert set(_ids(sched, lab.pools)) == expected
    assert sched.stats["lists"] == 1 and sched.stats["watches"] >= 1 and sched.stats["events"] >= 5

    # 410: the history we would resume from is gone -> relist, nothing lost
    for i in range(8, 11):
        k8s.pod(a, f"p{i}")
        expected.add(f"pod/{a}/p{i}")
    k8s.admin("compact")
    assert set(_ids(sched, lab.pools)) == expected
    assert sched.stats["expired"] == 1 and sched.stats["lists"] == 2

    # dropped connections mid-stream: reconnect from the last version seen, nothing twice
    dropped = k8s.stats()["watches_dropped"]
    k8s.admin("drop-watches", after_events=2, count=2, match=f"/namespaces/{a}/")
    for i in range(11, 17):
        k8s.pod(a, f"p{i}")
        expected.add(f"pod/{a}/p{i}")
    assert k8s.http.delete(f"{k8s.url}/api/v1/namespaces/{a}/pods/p2", timeout=5).status_code == 200
    expected.discard(f"pod/{a}/p2")
    assert set(_ids(sched, lab.pools)) == expected
    assert sched.stats["reconnects"] == 2 and sched.stats["lists"] == 2, sched.stats
    assert k8s.stats()["watches_dropped"] - dropped == 2
    # and a fresh adapter (a pure list) agrees
    assert set(_ids(k8s.adapter(namespace=a), lab.pools)) == expected


def test_bookmarks_keep_a_quiet_watch_current(k8s, a, lab):
    """Changes elsewhere move the resourceVersion; bookmarks carry it to a namespace-scoped watch,
    so a compaction afterwards needs no relist."""
    b = a + "-b"
    k8s.pod(a, "mine")
    sched = k8s.adapter(namespace=a, watch_idle_seconds=1.6)  # the server sends a bookmark every second
    assert _ids(sched, lab.pools) == [f"pod/{a}/mine"]
    for i in range(3):
        k8s.pod(b, f"other{i}")
    server_rv = k8s.stats()["resourceVersion"]
    assert _ids(sched, lab.pools) == [f"pod/{a}/mine"]
    assert sched.stats["bookmarks"] >= 1
    # at least the server's version when the changes were made (the test server's versions are integers;
    # another client's write after that read moves it on, and the bookmark carries that too)
    assert int(sched.cache.rv) >= int(server_rv)
    k8s.admin("compact")
    assert _ids(sched, lab.pools) == [f"pod/{a}/mine"]
    assert sched.stats["expired"] == 0 and sched.stats["lists"] == 1


def test_temporary_server_errors_are_temporary_and_the_next_pass_recovers(k8s, a, lab):
    k8s.pod(a, "p")
    sched = k8s.adapter(namespace=a)
    k8s.admin("fail", status=503, count=1, match=f"/namespaces/{a}/")
    with pytest.raises(TemporaryError):
        sched.pending(lab.pools)
    assert _ids(sched, lab.pools) == [f"pod/{a}/p"]


# --- cordon, drain, resume, forget -----------------------------------------------------------------


def _node(k8s: K8s, name: str) -> dict:
    r = k8s.get(f"/api/v1/nodes/{name}")
    assert r.status_code == 200, r.text
    return r.json()


READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
GRACE = 2  # terminationGracePeriodSeconds of the scene's pods: evicted pods linger this long


def _scene(k8s: K8s, node: str) -> str:
    """A spot node with two Ready web pods under a PDB (minAvailable 1), a batch pod and a DaemonSet pod."""
    a = "t-" + uuid.uuid4().hex[:8]
    k8s.node(node, {"spotctl.io/pool": "vm-spot"})
    k8s.pod(a, "web-1", node=node, status=READY, labels={"app": "web"}, terminationGracePeriodSeconds=GRACE)
    k8s.pod(a, "web-2", node=node, status=READY, labels={"app": "web"}, terminationGracePeriodSeconds=GRACE)
    k8s.pod(a, "batch", node=node, status=READY, cpu="2", memory="2Gi", terminationGracePeriodSeconds=GRACE)
    ds = k8s.post(f"/api/v1/namespaces/{a}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                           "name": "agent", "uid": str(uuid.uuid4()),
                                                           "controller": True}]},
        "spec": {"nodeName": node, "containers": [{"name": "a", "image": "agent:1"}]}, "status": READY})
    assert ds["metadata"]["name"] == "agent"
    k8s.pdb(a, "web", app="web", min_available=1)
    return a


def _pods(k8s: K8s, ns: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in k8s.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]}


def _until(pred, what: str, timeout: float = 15.0):
    return harness.wait_until(pred, what, timeout)


def test_a_drain_round_never_waits_and_the_node_is_empty_only_when_its_pods_are_gone(k8s):
    node = "spot-" + uuid.uuid4().hex[:6]
    a = _scene(k8s, node)
    sched = k8s.adapter()
    usage = {u.node: u for u in sched.usage()}
    assert usage[node].running == 3 and not usage[node].cordoned
    assert (usage[node].used.vcpu, usage[node].used.ram_mb) == (5, 4096)  # 1.5 + 1.5 + 2 cores, rounded once

    # round 1: cordon, one eviction each; the second web pod meets the PDB (one web pod must stay Ready)
    p1 = sched.drain(node, "notice n-1: reclaim", None)
    assert (p1.remaining, p1.moved, len(p1.blocked), p1.forced) == (3, 2, 1, ())
    assert "429" in p1.blocked[0] and "disruption budget" in p1.blocked[0]
    n = _node(k8s, node)
    assert n["spec"]["unschedulable"] is True
    assert {"key": "spotctl.io/reclaim", "effect": "NoSchedule"} in n["spec"]["taints"]
    assert n["metadata"]["annotations"]["spotctl.io/cordon-reason"] == "notice n-1: reclaim"
    pods = _pods(k8s, a)
    terminating = {k for k, p in pods.items() if p["metadata"].get("deletionTimestamp")}
    assert len(terminating) == 2 and "agent" not in terminating  # evicted pods linger, Terminating
    assert {u.node: u for u in sched.usage()}[node].running == 3  # accepted is not gone

    # round 2 at once: nothing new to evict (terminating pods are left to their grace period)
    p2 = sched.drain(node, "notice n-1: reclaim", None)
    assert (p2.remaining, p2.moved, len(p2.blocked)) == (3, 0, 1)

    # the grace period runs out: the evicted pods are gone; the web controller's replacement becomes Ready
    # elsewhere, which frees the PDB for the last web pod
    _until(lambda: set(_pods(k8s, a)) == {"agent", next(iter({"web-1", "web-2"} - terminating))},
           "the evicted pods to go")
    k8s.pod(a, "web-3", node="elsewhere-" + node, status=READY, labels={"app": "web"})
    p3 = sched.drain(node, "notice n-1: reclaim", None)
    assert (p3.remaining, p3.moved, p3.blocked) == (1, 1, ())
    _until(lambda: sched.drain(node, "notice n-1: reclaim", None).empty, "the node to be empty")
    assert set(_pods(k8s, a)) == {"agent", "web-3"}  # DaemonSet pods stay, like kubectl drain --ignore-daemonsets
    assert {u.node: u for u in sched.usage()}[node].running == 0
    assert not [d for d in k8s.stats()["deletes"] if d.startswith(f"pods/{a}/")]  # evicted, never deleted

    sched.resume(node)
    n = _node(k8s, node)
    assert "unschedulable" not in n["spec"] and not n["spec"].get("taints")
    assert "spotctl.io/cordon-reason" not in (n["metadata"].get("annotations") or {})


def test_a_forced_round_deletes_what_the_pdb_holds_with_a_grace_period_that_fits_the_deadline(k8s):
    node = "spot-" + uuid.uuid4().hex[:6]
    a = _scene(k8s, node)
    sched = k8s.adapter()
    sched.drain(node, "hard notice", None)  # web-? and batch evicted (terminating), one web pod blocked
    deadline = time.time() + 6.0
    p = sched.drain(node, "hard notice", deadline, force=True)
    assert len(p.forced) == 1 and p.forced[0].startswith(f"{a}/web-")
    pods = _pods(k8s, a)
    for name, pod in pods.items():
        if name == "agent":
            continue
        gone_at = pod["metadata"].get("deletionTimestamp")
        assert gone_at, f"{name} is not leaving"
        assert datetime.fromisoformat(gone_at.replace("Z", "+00:00")).timestamp() <= deadline + 1
    _until(lambda: set(_pods(k8s, a)) == {"agent"}, "every pod but the DaemonSet's to go", timeout=10)
    assert sched.drain(node, "hard notice", deadline, force=True).empty


def test_within_the_deadline_margin_a_round_forces_itself(k8s):
    node = "spot-" + uuid.uuid4().hex[:6]
    a = _scene(k8s, node)
    sched = k8s.adapter(deadline_margin_seconds=30)
    p = sched.drain(node, "hard notice", time.time() + 5.0)
    assert p.moved == 2 and len(p.forced) == 1  # evicted what it could, deleted what the PDB held
    assert any(d.startswith(f"pods/{a}/web-") for d in k8s.stats()["deletes"])


def test_drain_without_deadline_deletes_nothing_and_reports_what_it_could_not_evict(k8s):
    node = "spot-" + uuid.uuid4().hex[:6]
    a = _scene(k8s, node)
    sched = k8s.adapter()
    p = sched.drain(node, "advisory", None)
    assert p.remaining == 3 and len(p.blocked) == 1 and not p.forced and not p.empty
    assert not [d for d in k8s.stats()["deletes"] if d.startswith(f"pods/{a}/")]  # nothing deleted without a deadline


def test_resume_leaves_a_node_cordoned_by_someone_else_cordoned(k8s):
    node = "spot-" + uuid.uuid4().hex[:6]
    k8s.node(node)
    r = k8s.http.patch(f"{k8s.url}/api/v1/nodes/{node}", data=json.dumps({"spec": {"unschedulable": True}}),
                       headers={"Content-Type": "application/strategic-merge-patch+json"}, timeout=5)
    assert r.status_code == 200
    sched = k8s.adapter()
    sched.cordon(node, "advisory")
    sched.resume(node)
    n = _node(k8s, node)
    assert n["spec"]["unschedulable"] is True and not n["spec"].get("taints")


def test_protect_annotates_the_safe_until_time_taints_when_closed_and_lifts(k8s):
    """Issue 10, item 4: the calendar at run time on Kubernetes. The node carries by when its work must end;
    once the window is too short for the work that could land (closed), a NoSchedule taint keeps new pods off;
    lifting removes both and leaves other taints alone. Each call is idempotent (no write when already so)."""
    from spotctl.adapters.kubernetes import ANNOTATION_SAFE_UNTIL, TAINT_WINDOW

    node = "spot-" + uuid.uuid4().hex[:6]
    k8s.node(node)
    sched = k8s.adapter()
    sched.cordon(node, "someone's")  # a taint of ours for another reason: protect leaves it
    until = 1_800_000_000.0
    sched.protect(node, until)
    n = _node(k8s, node)
    assert n["metadata"]["annotations"][ANNOTATION_SAFE_UNTIL] == "2027-01-15T08:00:00Z"
    assert not [t for t in n["spec"]["taints"] if t["key"] == TAINT_WINDOW]
    sched.protect(node, until, closed=True)
    n = _node(k8s, node)
    assert {"key": TAINT_WINDOW, "value": str(int(until)), "effect": "NoSchedule"} in n["spec"]["taints"]
    version = n["metadata"]["resourceVersion"]
    sched.protect(node, until, closed=True)
    assert _node(k8s, node)["metadata"]["resourceVersion"] == version  # already so: nothing written
    sched.protect(node, None)
    n = _node(k8s, node)
    assert ANNOTATION_SAFE_UNTIL not in (n["metadata"].get("annotations") or {})
    assert [t["key"] for t in n["spec"]["taints"]] == ["spotctl.io/reclaim"]
    with pytest.raises(NotFoundError):
        sched.protect("spot-no-such-node", until)


def test_forget_deletes_the_node_object_and_unknown_nodes_are_not_found(k8s):
    node = "spot-" + uuid.uuid4().hex[:6]
    k8s.node(node)
    sched = k8s.adapter()
    sched.forget(node, "instance gone")
    assert k8s.get(f"/api/v1/nodes/{node}").status_code == 404
    sched.forget(node, "instance gone")  # already gone: fine
    with pytest.raises(NotFoundError):
        sched.cordon(node, "x")


# --- credentials and outages -------------------------------------------------------------------------


def _write_config(tmp_path: Path, base: str, kubeconfig: str) -> str:
    text = Path(base).read_text()
    kc_line = next(line for line in text.splitlines() if line.startswith("kubeconfig = "))
    path = tmp_path / "spotctl-other.toml"
    path.write_text(text.replace(kc_line, f'kubeconfig = "{kubeconfig}"'))
    return str(path)


def _kubeconfig(tmp_path: Path, server: str, token: str, user: dict | None = None) -> str:
    import yaml

    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "spotctl-lab",
        "clusters": [{"name": "lab", "cluster": {"server": server}}],
        "contexts": [{"name": "spotctl-lab", "context": {"cluster": "lab", "user": "u"}}],
        "users": [{"name": "u", "user": user or {"token": token}}]}))
    return str(path)


EXEC_API = "client.authentication.k8s.io/v1beta1"


def _exec_kubeconfig(tmp_path: Path, server: str, token: str, expires_in: float | None = None) -> str:
    """A kubeconfig whose user is an exec credential plugin: a shell script that prints an ExecCredential with
    the token in ``plugin-token`` (rewrite it to rotate the token) and counts its runs in ``plugin-runs``."""
    from datetime import UTC, timedelta

    (tmp_path / "plugin-token").write_text(token)
    expiry = ""
    if expires_in is not None:
        at = datetime.now(UTC) + timedelta(seconds=expires_in)
        expiry = f',"expirationTimestamp":"{at:%Y-%m-%dT%H:%M:%SZ}"'
    script = tmp_path / "plugin.sh"
    script.write_text(
        '#!/bin/sh\nd=$(dirname "$0")\necho run >>"$d/plugin-runs"\n'
        f'printf \'{{"apiVersion":"{EXEC_API}","kind":"ExecCredential","status":{{"token":"%s"{expiry}}}}}\' '
        '"$(cat "$d/plugin-token")"\n')
    script.chmod(0o755)
    return _kubeconfig(tmp_path, server, "", user={"exec": {"apiVersion": EXEC_API, "command": str(script),
                                                             "interactiveMode": "Never"}})


def _plugin_runs(tmp_path: Path) -> int:
    runs = tmp_path / "plugin-runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def _exec_scheduler(tmp_path: Path, lab_config: str, kubeconfig: str) -> KubernetesScheduler:
    """The adapter as spotctl builds it, from the `lab` config pointed at ``kubeconfig``."""
    return KubernetesScheduler.from_config(
        load_config(env={"SPOTCTL_CONFIG": _write_config(tmp_path, lab_config, kubeconfig)}).region("lab"))


def test_an_exec_plugin_kubeconfig_lists_pending_pods_and_runs_the_plugin_once(k8s, a, k8s_env, tmp_path,
                                                                                lab_config, lab):
    k8s.pod(a, "p")
    sched = _exec_scheduler(tmp_path, lab_config, _exec_kubeconfig(tmp_path, k8s.url, k8s_env["K8S_TOKEN"]))
    assert sched.api.conn.credentials is not None and sched.api.conn.token is None
    assert [u.id for u in sched.pending(lab.pools)[0]] == [f"pod/{a}/p"]
    sched.usage()
    assert _plugin_runs(tmp_path) == 1  # a token without an expiry is kept while the server takes it


def test_a_wrong_token_from_the_exec_plugin_is_an_auth_error_and_a_new_one_is_fetched(k8s, a, k8s_env, tmp_path,
                                                                                       lab_config, lab):
    k8s.pod(a, "p")
    sched = _exec_scheduler(tmp_path, lab_config, _exec_kubeconfig(tmp_path, k8s.url, "not-the-token"))
    with pytest.raises(AuthError) as e:
        sched.pending(lab.pools)
    assert e.value.exit_code == ExitCode.AUTH and "refused the credentials" in e.value.message
    assert "not-the-token" not in e.value.message
    # the 401 makes the next request run the plugin again: a renewed credential is picked up
    (tmp_path / "plugin-token").write_text(k8s_env["K8S_TOKEN"])
    assert [u.id for u in sched.pending(lab.pools)[0]] == [f"pod/{a}/p"]
    assert _plugin_runs(tmp_path) == 2


def test_an_expiring_exec_token_is_renewed_before_requests(k8s, a, k8s_env, tmp_path, lab_config, lab):
    k8s.pod(a, "p")
    # expires within the 5 minutes the official loader keeps in hand: the plugin runs before every request
    sched = _exec_scheduler(tmp_path, lab_config,
                            _exec_kubeconfig(tmp_path, k8s.url, k8s_env["K8S_TOKEN"], expires_in=60))
    assert [u.id for u in sched.pending(lab.pools)[0]] == [f"pod/{a}/p"]
    runs = _plugin_runs(tmp_path)
    assert runs >= 2  # at load, and again for the request
    (tmp_path / "plugin-token").write_text("rotated-away")
    with pytest.raises(AuthError):
        sched.cordon("any", "x")  # the new (wrong) token was sent, not the one it had
    assert _plugin_runs(tmp_path) > runs
    # a plugin that cannot renew the token: an auth error that says why, not the old token sent again
    (tmp_path / "plugin.sh").write_text("#!/bin/sh\necho 'session expired: log in again' >&2\nexit 1\n")
    with pytest.raises(AuthError, match="session expired: log in again") as e:
        sched.pending(lab.pools)
    assert e.value.exit_code == ExitCode.AUTH


def test_a_wrong_exec_token_makes_the_cli_exit_4_without_a_traceback(k8s, lab_config, tmp_path):
    config = _write_config(tmp_path, lab_config, _exec_kubeconfig(tmp_path, k8s.url, "not-the-token"))
    code, _, err = spotctl(tmp_path, config, "plan")  # an exception escaping the CLI would fail the test here
    assert code == ExitCode.AUTH, err
    assert "not-the-token" not in err


def test_kubeconfig_with_an_inline_token_works(k8s, a, k8s_env, tmp_path, lab):
    k8s.pod(a, "p")
    conn = load_kubeconfig([_kubeconfig(tmp_path, k8s.url, k8s_env["K8S_TOKEN"])], None)
    sched = KubernetesScheduler(Api(conn), Settings(namespace=a))
    assert [u.id for u in sched.pending(lab.pools)[0]] == [f"pod/{a}/p"]


def test_bad_token_is_an_auth_error(k8s, lab_config, tmp_path, lab):
    sched = k8s.adapter(token="not-the-token")
    with pytest.raises(AuthError) as e:
        sched.pending(lab.pools)
    assert e.value.exit_code == ExitCode.AUTH
    assert "not-the-token" not in e.value.message
    with pytest.raises(AuthError):
        sched.cordon("any", "x")

    config = _write_config(tmp_path, lab_config, _kubeconfig(tmp_path, k8s.url, "not-the-token"))
    code, out, err = spotctl(tmp_path, config, "reconcile")
    # the pass still does what it can with the other sources, but a refused credential needs a human: exit 4
    assert code == ExitCode.AUTH, err
    assert out["data"]["auth_failed"] == ["scheduler:kubernetes"]
    assert "refused the credentials" in out["data"]["degraded"]["scheduler:kubernetes"]
    assert "not-the-token" not in json.dumps(out) + err


def test_bad_token_makes_the_cli_exit_4(k8s, lab_config, tmp_path):
    config = _write_config(tmp_path, lab_config, _kubeconfig(tmp_path, k8s.url, "not-the-token"))
    code, _, _ = spotctl(tmp_path, config, "plan")
    assert code == ExitCode.AUTH


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down_the_pass_goes_on_degraded(lab_config, tmp_path, lab):
    url = f"http://127.0.0.1:{_closed_port()}"
    sched = KubernetesScheduler(Api(Connection(server=url, token="t"), timeout=2), Settings())
    with pytest.raises(UnavailableError) as e:
        sched.pending(lab.pools)
    assert not isinstance(e.value, TemporaryError) and "unreachable" in e.value.message

    config = _write_config(tmp_path, lab_config, _kubeconfig(tmp_path, url, "t"))
    code, out, err = spotctl(tmp_path, config, "reconcile")
    assert code == ExitCode.PARTIAL, err
    assert out["status"] == "partial"
    assert "unreachable" in out["data"]["degraded"]["scheduler:kubernetes"]
    assert "cloud" not in out["data"]["degraded"]  # the other sources were observed


# --- connection sources (no server needed) -------------------------------------------------------------


def test_kubeconfig_data_fields_named_context_and_relative_paths(tmp_path):
    import base64

    import yaml

    (tmp_path / "ca.pem").write_text("CA")
    (tmp_path / "tok").write_text("file-token\n")
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "one",
           "clusters": [{"name": "c1", "cluster": {"server": "https://one:6443", "certificate-authority": "ca.pem"}},
                        {"name": "c2", "cluster": {"server": "https://two:6443",
                                                   "certificate-authority-data": base64.b64encode(b"CA2").decode()}}],
           "users": [{"name": "u1", "user": {"tokenFile": "tok"}},
                     {"name": "u2", "user": {"client-certificate-data": base64.b64encode(b"CERT").decode(),
                                             "client-key-data": base64.b64encode(b"KEY").decode()}}],
           "contexts": [{"name": "one", "context": {"cluster": "c1", "user": "u1"}},
                        {"name": "two", "context": {"cluster": "c2", "user": "u2"}}]}
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    one = load_kubeconfig([str(path)], None)
    assert (one.server, one.ca_file, one.token_file) == ("https://one:6443", str(tmp_path / "ca.pem"),
                                                         str(tmp_path / "tok"))
    assert Api(one)._token() == "file-token"
    two = load_kubeconfig([str(path)], "two")
    assert Path(two.ca_file).read_bytes() == b"CA2" and Path(two.client_cert).read_bytes() == b"CERT"
    assert oct(os.stat(two.client_key).st_mode & 0o777) == "0o600"
    # an exec credential plugin is run (by the official loader) and its token used
    plugin = tmp_path / "plugin.sh"
    credential = json.dumps({"apiVersion": EXEC_API, "kind": "ExecCredential", "status": {"token": "exec-token"}})
    plugin.write_text(f"#!/bin/sh\necho '{credential}'\n")
    plugin.chmod(0o755)
    doc["users"][0]["user"] = {"exec": {"apiVersion": EXEC_API, "command": "./plugin.sh"}}  # relative: to the file
    path.write_text(yaml.safe_dump(doc))
    assert Api(load_kubeconfig([str(path)], None))._token() == "exec-token"


def test_kubeconfig_problems_are_one_config_error(tmp_path):
    import yaml

    from spotctl.core.errors import ConfigError

    def load(user: dict, context: str | None = None) -> ConfigError:
        path = Path(_kubeconfig(tmp_path, "https://k8s:6443", "", user=user))
        with pytest.raises(ConfigError) as e:
            load_kubeconfig([str(path)], context)
        assert e.value.exit_code == ExitCode.CONFIG and "\n" not in e.value.message
        return e.value

    failing = tmp_path / "fail.sh"
    failing.write_text("#!/bin/sh\necho 'login required: run kubelogin' >&2\nexit 1\n")
    failing.chmod(0o755)
    assert "login required" in load({"exec": {"apiVersion": EXEC_API, "command": str(failing)}}).message
    assert "no-such-plugin" in load({"exec": {"apiVersion": EXEC_API, "command": "no-such-plugin"}}).message
    assert "no context named 'nope'" in load({"token": "t"}, context="nope").message
    with pytest.raises(ConfigError, match="no kubeconfig found"):
        load_kubeconfig([str(tmp_path / "missing")], None)
    (tmp_path / "bad").write_text("clusters: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot read kubeconfig"):
        load_kubeconfig([str(tmp_path / "bad")], None)
    (tmp_path / "list").write_text(yaml.safe_dump(["not", "a", "mapping"]))
    with pytest.raises(ConfigError):
        load_kubeconfig([str(tmp_path / "list")], None)


def test_in_cluster_service_account(tmp_path):
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("CA")
    conn = in_cluster(str(tmp_path), {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert conn.server == "https://10.0.0.1:443"
    assert conn.token_file == str(tmp_path / "token") and conn.ca_file == str(tmp_path / "ca.crt")
    assert Api(conn)._token() == "sa-token"
    from spotctl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster(str(tmp_path), {})
