#!/usr/bin/env python3
"""OpenStack adapter benchmarks against the test cloud (scripts/testenv/openstack up).

1. The observe phase on region `lab` (6 pools): median of 5 after one warm-up. target <= 2 s.
   Baseline in the same run: the raw openstacksdk reads it is made of (providers + inventories + usages).
2. A launch + delete round trip through the adapter (create, wait ACTIVE, delete, allocations freed)
   vs the same raw openstacksdk calls, interleaved. target: overhead <= 10 %.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def env_of(name: str) -> dict:
    out = subprocess.run([str(ROOT / "scripts" / "testenv" / name), "env"], capture_output=True, text=True, check=True)
    return {k.removeprefix("export "): v for k, v in (ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)}


def bench(pairs: int = 3) -> dict:
    env = env_of("openstack")
    os.environ.update({k: v for k, v in env.items() if k.startswith(("OS_", "SPOTCTL_"))})
    from spotctl.core.config import load_config
    from spotctl.ops.observe import observe
    from spotctl.wiring import build_runtime

    config = load_config()
    rt = build_runtime(config, "lab")
    cloud = rt.cloud
    conn = cloud.conn
    observe(rt)
    obs, raw_obs = [], []
    for _ in range(5):
        t = time.perf_counter()
        observe(rt)
        obs.append(time.perf_counter() - t)
        t = time.perf_counter()
        for rp in conn.placement.resource_providers():
            list(conn.placement.resource_provider_inventories(rp))
            conn.placement.get(f"/resource_providers/{rp.id}/usages", microversion="1.22")
        raw_obs.append(time.perf_counter() - t)
    pool = rt.region.pools["general"]
    flavor = conn.compute.find_flavor(pool.flavor, ignore_missing=False)
    image = conn.image.find_image(cloud.options.image, ignore_missing=False)
    ours, raw = [], []
    for i in range(pairs):
        tag = uuid.uuid4().hex[:8]
        t = time.perf_counter()
        inst = cloud.create_instance(pool, f"bench-{tag}", f"bench-{tag}")
        cloud.wait_active(inst.id)
        cloud.delete_and_verify(inst.id)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        s = conn.compute.create_server(name=f"raw-{tag}", flavor_id=flavor.id, image_id=image.id, networks="none",
                                       availability_zone=pool.az)
        conn.compute.wait_for_server(s, status="ACTIVE", interval=0.2, wait=120)
        conn.compute.delete_server(s)
        conn.compute.wait_for_delete(s, interval=0.2, wait=120)
        while list(conn.placement.get(f"/allocations/{s.id}").json().get("allocations", {})):
            time.sleep(0.2)
        raw.append(time.perf_counter() - t)
    rt.store.close()
    o, ro = statistics.median(obs), statistics.median(raw_obs)
    a, r = statistics.median(ours), statistics.median(raw)
    return {"observe_s": round(o, 3), "raw_reads_s": round(ro, 3), "observe_ratio": round(o / ro, 2),
            "round_trip_s": round(a, 3), "raw_round_trip_s": round(r, 3), "overhead_pct": round(100 * (a / r - 1), 1),
            "targets": {"observe_s": "<= 2", "overhead_pct": "<= 10"}, "pass": o <= 2.0 and a / r <= 1.10}


if __name__ == "__main__":
    res = bench()
    print(json.dumps(res, indent=2))
    sys.exit(0 if res["pass"] else 1)
