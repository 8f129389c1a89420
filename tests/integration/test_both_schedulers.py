"""One notice drives both schedulers: the real Slurm cluster and the Kubernetes API test server
drain the same spot node, concurrently, from one hard notice handled by the watcher's fast path."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from spotctl.core.config import load_config
from spotctl.core.models import Node, NodeState, Notice, NoticeKind
from spotctl.core.ports import FixedClock
from spotctl.ops import watch as fast
from spotctl.ops.runtime import Runtime
from spotctl.sim.world import SimWorld
from spotctl.state.store import Store
from spotctl.wiring import _adapter

from .conftest import testenv as service_env
from .conftest import unavailable

pytestmark = pytest.mark.integration
NODE = "spot-lab-n1"  # a node of the Slurm test cluster; the same name is registered in Kubernetes


def slurm(env, *args, check=True) -> str:
    e = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
    e["SLURM_CONF"] = env["SLURM_CONF"]
    p = subprocess.run(list(args), capture_output=True, text=True, env=e, timeout=30)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {p.stderr}")
    return p.stdout


@pytest.fixture
def lab(tmp_path):
    s_env, k_env = service_env("slurm"), service_env("k8s")
    try:
        requests.get(k_env["K8S_URL"] + "/readyz", headers={"Authorization": f"Bearer {k_env['K8S_TOKEN']}"},
                     timeout=3).raise_for_status()
    except requests.RequestException as e:
        unavailable("k8s", str(e))
    cfg = tmp_path / "lab.toml"
    cfg.write_text(Path(s_env["SPOTCTL_CONFIG"]).read_text() + "\n" + Path(k_env["SPOTCTL_K8S_FRAGMENT"]).read_text())
    region = load_config(env={"SPOTCTL_CONFIG": str(cfg)}).region("lab")
    return s_env, k_env, region


def scene(s_env, k_env, ns):
    """A running Slurm job and a running pod on the node, in both schedulers."""
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {k_env['K8S_TOKEN']}"
    url = k_env["K8S_URL"]
    http.delete(f"{url}/api/v1/nodes/{NODE}", timeout=10)
    r = http.post(f"{url}/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                                                "spec": {}, "status": {"capacity": {"cpu": "4", "memory": "4000Mi"}}},
                  timeout=10)
    assert r.status_code == 201, r.text
    http.post(f"{url}/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
              timeout=10)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "work", "labels": {"app": "work"}},
           "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox:1.36",
                                                      "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
           "status": {"phase": "Running"}}
    r = http.post(f"{url}/api/v1/namespaces/{ns}/pods", json=pod, timeout=10)
    assert r.status_code == 201, r.text
    slurm(s_env, "scontrol", "update", f"nodename={NODE}", "state=resume", check=False)
    job = int(slurm(s_env, "sbatch", "--parsable", "-o", "/dev/null", "-p", "spot", "-w", NODE,
                    "--wrap", "sleep 600").strip().split(";")[0])
    deadline = time.monotonic() + 20
    while "RUNNING" not in slurm(s_env, "squeue", "-h", "-j", str(job), "-o", "%T"):
        assert time.monotonic() < deadline, "the Slurm job did not start"
        time.sleep(0.2)
    return http, job


def teardown(rt, s_env, job) -> None:
    """Leave the node taking work in both schedulers, cancel the job, close the store."""
    for s in rt.schedulers:
        try:
            s.resume(NODE)
        except Exception:  # best effort: the scene may be half built
            pass
    slurm(s_env, "scancel", str(job), check=False)
    rt.store.close()


def runtime(region, tmp_path):
    world = SimWorld.new(region, time.time(), 7)
    store = Store.open(tmp_path / "state.db", region.name)
    schedulers = [_adapter(region, "kubernetes"), _adapter(region, "slurm")]
    rt = Runtime(region=region, store=store, cloud=world.cloud, contract=world.contract, schedulers=schedulers,
                 clock=FixedClock(time.time()), actor="test", concurrent_observe=True)
    now = rt.now()
    node = Node(id=NODE, pool="vm-spot", state=NodeState.INTENDED, action_id="a-n1", created_at=now, updated_at=now)
    with store.tx():
        store.add_node(node, actor="test", reason="test scene")
        store.transition(node, NodeState.BUILDING, reason="test scene", at=now, actor="test", instance_id="i-n1")
        store.transition(node, NodeState.ACTIVE, reason="test scene", at=now, actor="test")
    return rt


def test_one_notice_drains_the_node_in_both_schedulers_at_once(lab, tmp_path):
    s_env, k_env, region = lab
    ns = f"both-{uuid.uuid4().hex[:8]}"
    http, job = scene(s_env, k_env, ns)
    rt = runtime(region, tmp_path)
    try:
        now = rt.now()
        notice = Notice(id="hn-both", instance_id="i-n1", kind=NoticeKind.HARD, issued_at=now - 0.2,
                        deadline=now + 150, reason="reservation", pool="vm-spot", delivered_at=now - 0.1)
        ev = fast.handle(rt, notice, now, threading.Event())
        assert ev["action"] == "drain" and ev["status"] == "ok", ev
        assert set(ev["schedulers"]) == {"kubernetes", "slurm"}
        assert ev["seconds_to_accepted"] <= 2.0, ev
        # Slurm: DRAIN with our reason, the running job requeued
        show = slurm(s_env, "scontrol", "show", "node", NODE)
        assert "DRAIN" in show and "hard notice hn-both" in show
        deadline = time.monotonic() + 15  # requeued: COMPLETING on the node, then back to the queue
        state = ""
        while time.monotonic() < deadline:
            state = slurm(s_env, "squeue", "-h", "-j", str(job), "-o", "%T %r").strip()
            if state.startswith(("PENDING", "REQUEUED")):
                break
            time.sleep(0.3)
        assert state.startswith(("PENDING", "REQUEUED")), state
        # Kubernetes: cordoned (unschedulable + taint) and the pod evicted
        node = http.get(f"{k_env['K8S_URL']}/api/v1/nodes/{NODE}", timeout=10).json()
        assert node["spec"].get("unschedulable") is True
        # evicted, not gone: like a real API server, the pod stays Terminating for its grace period
        pods = http.get(f"{k_env['K8S_URL']}/api/v1/namespaces/{ns}/pods", timeout=10).json()["items"]
        ours = [p for p in pods if p["spec"].get("nodeName") == NODE]
        assert len(ours) == 1 and ours[0]["metadata"].get("deletionTimestamp")
        assert rt.store.node(NODE).state is NodeState.DRAINING
        drain = rt.store.audit_query(action="node.drain")[-1]
        assert set(drain["inputs"]["accepted_seconds"]) == {"kubernetes", "slurm"}
        assert drain["result"] == "ok" and drain["inputs"]["empty"] is False  # accepted is not empty
        assert drain["inputs"]["drain"]["kubernetes"]["moved"] == 1
    finally:
        teardown(rt, s_env, job)
        http.delete(f"{k_env['K8S_URL']}/api/v1/nodes/{NODE}", timeout=10)


def test_a_drain_whose_slurm_node_name_is_wrong_is_partial_and_names_slurm(lab, tmp_path):
    """A misconfigured Slurm node name must not pass for a drained node: the pool is bound to Slurm
    (it names a partition), Slurm does not know the node, so the drain is partial and says so."""
    from spotctl.core.actions import Action
    from spotctl.core.budget import Priority
    from spotctl.ops.act import execute

    s_env, k_env, region = lab
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {k_env['K8S_TOKEN']}"
    wrong = "spot-lab-misnamed"  # known to Kubernetes only, as a wrong node_name template would make it
    http.delete(f"{k_env['K8S_URL']}/api/v1/nodes/{wrong}", timeout=10)
    http.post(f"{k_env['K8S_URL']}/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node",
                                                         "metadata": {"name": wrong}, "spec": {}}, timeout=10)
    rt = runtime(region, tmp_path)
    try:
        now = rt.now()
        node = Node(id=wrong, pool="vm-spot", state=NodeState.INTENDED, action_id="a-wrong", created_at=now,
                    updated_at=now)
        with rt.store.tx():
            rt.store.add_node(node, actor="test", reason="test scene")
            rt.store.transition(node, NodeState.BUILDING, reason="scene", at=now, actor="test", instance_id="i-wrong")
            rt.store.transition(node, NodeState.ACTIVE, reason="scene", at=now, actor="test")
        out = execute(rt, Action(id="op-wrong", kind="drain", priority=Priority.OPERATOR, reason="maintenance",
                                 pool="vm-spot", node=wrong), None)
        assert out.status == "partial" and out.data["missing_in"] == ["slurm"], out
        assert "slurm: does not know the node" in out.detail
        assert "kubernetes" in out.data["accepted_seconds"]  # Kubernetes took the drain all the same
        rec = rt.store.audit_query(action="node.drain")[-1]
        assert rec["target"] == wrong and rec["result"] == "partial" and rec["inputs"]["missing_in"] == ["slurm"]
        row = next(a for a in rt.store.actions(limit=None) if a["id"] == "op-wrong")
        assert row["status"] == "partial"
    finally:
        for s in rt.schedulers:
            try:
                s.resume(wrong)
            except Exception:
                pass
        http.delete(f"{k_env['K8S_URL']}/api/v1/nodes/{wrong}", timeout=10)
        rt.store.close()
