#!/usr/bin/env python3
"""Pending-demand observation against the real test services (issue 4): 10k pods in the Kubernetes
API test server and 5k pending Slurm jobs. Target: <= 2 s each (for Kubernetes: what the adapter adds to the server's list,
and each later pass's watch catch-up). Baseline in the same run: the raw
HTTP reads the adapters are made of (the paged pod list; slurmrestd's /jobs).

Needs `scripts/testenv/k8s up` and `scripts/testenv/slurm up` (`make bench-services` does it).
Creates its pods in a namespace of its own and cancels its jobs at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from spotctl.adapters.kubernetes import Api, Connection, KubernetesScheduler, Settings  # noqa: E402
from spotctl.core.config import load_config  # noqa: E402
from spotctl.wiring import _adapter  # noqa: E402

TOL = {"key": "spotctl.io/spot", "operator": "Exists", "effect": "NoSchedule"}
UNSCHED = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}


def env_of(name: str) -> dict:
    out = subprocess.run([str(ROOT / "scripts" / "testenv" / name), "env"], capture_output=True, text=True, check=True)
    return {k.removeprefix("export "): v for k, v in (ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)}


def k8s(pods: int) -> dict:
    env = env_of("k8s")
    url, ns = env["K8S_URL"], f"demand-{uuid.uuid4().hex[:6]}"
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {env['K8S_TOKEN']}"
    for i in range(pods):
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "labels": {"app": "bench"}},
                "spec": {"tolerations": [TOL], "nodeSelector": {"spotctl.io/pool": "vm-spot"},
                         "containers": [{"name": "m", "image": "busybox:1.36",
                                         "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]},
                "status": UNSCHED}
        r = http.post(f"{url}/api/v1/namespaces/{ns}/pods", json=body, timeout=10)
        r.raise_for_status()
    region = load_config(env={"SPOTCTL_CONFIG": env["SPOTCTL_K8S_CONFIG"]}).region("lab")
    sched = KubernetesScheduler(Api(Connection(server=url, token=env["K8S_TOKEN"], source="bench"), timeout=30),
                                Settings(namespace=ns, timeout_seconds=30))
    t = time.perf_counter()
    units, excl = sched.pending(region.pools)
    first = time.perf_counter() - t
    t = time.perf_counter()
    sched.pending(region.pools)
    again = time.perf_counter() - t
    t = time.perf_counter()
    cont, n = None, 0
    while True:
        r = http.get(f"{url}/api/v1/namespaces/{ns}/pods", params={"limit": 500, **({"continue": cont} if cont else {})},
                     timeout=30).json()
        n += len(r["items"])
        cont = r["metadata"].get("continue")
        if not cont:
            break
    raw = time.perf_counter() - t
    # The test server validates every item against the official schemas in Python, so its raw list of
    # 10k pods is slow; what spotctl adds on top of it, and the watch catch-up of every later pass, is
    # what the target is about.
    return {"pods": pods, "demand_units": len(units), "first_pending_s": round(first, 3),
            "raw_paged_list_s": round(raw, 3), "adapter_overhead_s": round(first - raw, 3),
            "next_pending_s": round(again, 3), "ratio_first_vs_raw": round(first / raw, 2),
            "pass": first - raw <= 2.0 and again <= 2.0}


def slurm(jobs: int) -> dict:
    env = env_of("slurm")
    e = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
    e["SLURM_CONF"] = env["SLURM_CONF"]
    name = f"bench-{uuid.uuid4().hex[:6]}"
    script = f"for i in $(seq 1 {jobs}); do echo \"sbatch -p spot -J {name} -t 30 -o /dev/null --wrap 'sleep 600'\"; done | sh"
    subprocess.run(["bash", "-c", script], env=e, check=True, capture_output=True)
    try:
        region = load_config(env={"SPOTCTL_CONFIG": env["SPOTCTL_CONFIG"]}).region("lab")
        sched = _adapter(region, "slurm")
        sched.discover()
        t = time.perf_counter()
        units, excl = sched.pending(region.pools)
        took = time.perf_counter() - t
        t = time.perf_counter()
        r = requests.get(f"{env['SLURM_REST_URL']}/slurm/{sched.api_version}/jobs", timeout=60,
                         headers={"X-SLURM-USER-NAME": env["SLURM_REST_USER"], "X-SLURM-USER-TOKEN": env["SLURM_REST_TOKEN"]})
        r.json()
        raw = time.perf_counter() - t
    finally:
        subprocess.run(["scancel", "-n", name], env=e, capture_output=True)
    return {"jobs": jobs, "demand_units": len(units), "excluded": len(excl), "pending_s": round(took, 3),
            "raw_jobs_get_s": round(raw, 3), "ratio_vs_raw": round(took / raw, 2), "pass": took <= 2.0}


if __name__ == "__main__":
    res = {"kubernetes_10k_pods": k8s(10_000), "slurm_5k_jobs": slurm(5_000)}
    print(json.dumps(res, indent=2))
    sys.exit(0 if all(v["pass"] for v in res.values()) else 1)
