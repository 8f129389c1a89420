#!/usr/bin/env python3
"""One notice -> both schedulers' drains accepted, over 50 notices, against the real test services
(scripts/testenv/slurm and scripts/testenv/k8s must be up). Target: p99 <= 2 s.

Baseline measured in the same run: the same two drains called one after the other (no concurrency),
so the ratio shows what driving both schedulers at once buys.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.test_both_schedulers import NODE, runtime, scene, teardown  # noqa: E402

from benchmarks._services import env_of, pct  # noqa: E402
from spotctl.core.config import load_config  # noqa: E402
from spotctl.core.models import NodeState, Notice, NoticeKind  # noqa: E402
from spotctl.ops import watch as fast  # noqa: E402




def bench(n: int = 50) -> dict:
    s_env, k_env = env_of("slurm"), env_of("k8s")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "lab.toml"
        cfg.write_text(Path(s_env["SPOTCTL_CONFIG"]).read_text() + "\n" + Path(k_env["SPOTCTL_K8S_FRAGMENT"]).read_text())
        region = load_config(env={"SPOTCTL_CONFIG": str(cfg)}).region("lab")
        ns = f"bench-{os.getpid()}"
        http, job = scene(s_env, k_env, ns)
        rt = runtime(region, Path(tmp))
        both, serial = [], []
        try:
            for i in range(n):
                node = rt.store.node(NODE)
                if node.state is not NodeState.ACTIVE:
                    rt.store.transition(node, NodeState.ACTIVE, reason="bench reset", at=rt.now(), actor="bench",
                                        cordoned=False, notice_id=None)
                for s in rt.schedulers:
                    s.resume(NODE)
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"work-{i}"},
                       "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox:1.36"}]},
                       "status": {"phase": "Running"}}
                http.post(f"{k_env['K8S_URL']}/api/v1/namespaces/{ns}/pods", json=pod, timeout=10)  # work to evict
                now = rt.now()
                nt = Notice(id=f"bench-{i}", instance_id="i-n1", kind=NoticeKind.HARD, issued_at=now, deadline=now + 150,
                            reason="bench", pool="vm-spot", delivered_at=now)
                ev = fast.handle(rt, nt, now, threading.Event())
                assert ev.get("status") == "ok", ev
                both.append(ev["seconds_to_accepted"])
                for s in rt.schedulers:
                    s.resume(NODE)
                t = time.monotonic()
                for s in rt.schedulers:  # the baseline: one scheduler after the other
                    s.drain(NODE, "bench serial", now + 150)
                serial.append(time.monotonic() - t)
        finally:
            teardown(rt, s_env, job)
    return {"notices": n, "p50_s": round(statistics.median(both), 4), "p99_s": round(pct(both, 0.99), 4),
            "serial_p50_s": round(statistics.median(serial), 4),
            "ratio_concurrent_vs_serial": round(statistics.median(both) / statistics.median(serial), 2),
            "target": "p99 <= 2 s", "pass": pct(both, 0.99) <= 2.0}


if __name__ == "__main__":
    r = bench()
    print(json.dumps(r, indent=2))
    sys.exit(0 if r["pass"] else 1)
