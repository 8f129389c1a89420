#!/usr/bin/env python3
"""OpenStack adapter benchmarks against the test cloud (scripts/testenv/openstack up).

    .venv/bin/python benchmarks/os_cloud.py [--pairs N] [--json]

1. The observe phase on region `lab` (6 pools): median of 5 after one warm-up.   target: <= 2 s.
   Baseline in the same run: the raw openstacksdk reads it is made of (providers + inventories + usages).
2. A launch + delete round trip through the adapter vs the same work done with raw openstacksdk calls,
   ``--pairs`` pairs (default 15) after one untimed warm-up pair, the order alternating inside each pair.
   Ratio = the median of the per-pair ratios adapter / raw (the two halves of a pair run back to back,
   so a change of machine load between pairs cancels); the ratio of the medians is shown too.
                                                                                   target: <= 1.10.

What each side of (2) does, and why that is fair
------------------------------------------------
Both sides share one openstacksdk connection: one keystone session, one token, endpoints and
microversions discovered once. The adapter's contract is one session per process, and a careful
SDK user reuses one connection too; a warm-up pair pays the one-off lookups (flavor list, image,
Placement version discovery) on both sides before anything is timed.

The adapter side is what `spotctl launch` does for one node (spotctl/ops/act.py `_create`) and then
what a verified delete does: ``find_instance`` (the idempotency lookup by the action tag, so that a
re-run after a crash adopts instead of duplicating) → ``create_instance`` (which waits, bounded, for
the scheduler's verdict, so that NoValidHost becomes a CapacityError in the same pass) →
``wait_active`` → ``delete_and_verify`` (Nova no longer lists the server *and* Placement holds no
allocation for it: the capacity is really back).

The raw side is what a careful SDK user with the same contract writes: list servers by the same tags
(idempotency after a crash is part of the contract, so a careful user looks before creating too),
``create_server`` with the same name, flavor, image, networks, AZ, metadata, tags and user_data,
``wait_for_server(ACTIVE)``, ``delete_server``, ``wait_for_delete``, then poll Placement until the
allocation is gone. Both sides poll at the adapter's interval (``POLL_SECONDS``), so the ratio is
about the calls made, not a choice of sleep. Not measured on either side: the intent record in
SQLite (core, not the adapter) and the token budget.

What the overhead was (issue 9, item 5), and what changed
---------------------------------------------------------
Before (old benchmark: 3 pairs, adapter always first, raw side without tags or lookup): +16 %, +9 %,
+14 %; +15 % over 10 pairs. The same old adapter in this benchmark (10 pairs): ratio 1.14-1.19, 11
requests per round trip against 9. The time went to polling, not to Placement, tokens or discovery
(one session, discovered once): ``create_instance``'s schedule wait read the server, ``wait_active`` read it again
at once (one extra GET, ~40 ms, and a restarted poll cycle), then slept 0.25 s against the raw
side's 0.2 s, as ``delete_and_verify`` did too (~+50 ms per wait on a fake-driver round trip of
~0.9-1.1 s). Now one interval (``POLL_SECONDS``) for every wait, a read younger than one interval is
reused at the hand-off, and once Nova no longer lists the server only Placement is polled. After,
on a quiet machine: ratio of medians 0.94-1.05 over 8 runs of 10 pairs (round trips 0.9-1.1 s), 10
requests per round trip against 9. With other test suites loading the 2 cores (load average 3-5,
round trips 1.1-2.7 s) single runs ranged 0.89-1.20, while the same requests timed phase by phase
over 15 pairs at load 4-5 differed by +15 ms (lookup: the Ironic GET below), +37 ms (create to
ACTIVE) and -30 ms (delete to released): about +2 %. The spread is the machine's, not the adapter's;
the output notes a load average above the CPU count, and a FAIL then wants a rerun on a quiet
machine before it is read as a regression.

The one request the adapter still makes on top: ``find_instance(action_id)`` also lists Ironic
allocations when Nova has no server with the action tag and the region has Ironic-direct pools
(region `lab` has one), ~6 ms, < 1 % of a round trip. It stays: an action id does not say its pool,
and an Ironic launch cut short by a crash must be adopted too, not duplicated. Passing the pool to
``find_instance`` (the core port, spotctl/ops/act.py) would remove it for VM pools.

With 3 pairs always run in the same order the figure moved by several points from run to run (+9 % to
+16 % here; -12 % was reported once): a round trip is mostly sleeps, so the phase of the polls
against the fake driver dominates; hence 15 pairs, a warm-up pair, alternating order, paired medians.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.10
TARGET_OBSERVE_S = 2.0


def env_of(name: str) -> dict:
    out = subprocess.run([str(ROOT / "scripts" / "testenv" / name), "env"], capture_output=True, text=True, check=True)
    return {k.removeprefix("export "): v for k, v in (ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)}


class Requests:
    """Counts the HTTP requests made through one keystoneauth session (every openstacksdk proxy uses it)."""

    def __init__(self, session):
        self.n = 0
        self.kinds: collections.Counter = collections.Counter()
        inner = session.request

        def request(url, method, *a, **kw):
            self.n += 1
            service = (kw.get("endpoint_filter") or {}).get("service_type", "")
            self.kinds[f"{method} {service}".strip()] += 1
            return inner(url, method, *a, **kw)

        session.request = request

    def take(self) -> tuple[int, dict]:
        n, kinds = self.n, dict(self.kinds)
        self.n = 0
        self.kinds.clear()
        return n, kinds


def bench(pairs: int = 15) -> dict:
    env = env_of("openstack")
    os.environ.update({k: v for k, v in env.items() if k.startswith(("OS_", "SPOTCTL_"))})
    from spotctl.adapters.openstack import POLL_SECONDS, TAG_ACTION, TAG_POOL, TAG_REGION
    from spotctl.core.config import load_config
    from spotctl.ops.observe import observe
    from spotctl.wiring import build_runtime

    config = load_config()
    rt = build_runtime(config, "lab")
    cloud = rt.cloud
    conn = cloud.conn
    region = rt.region.name
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
    load_before = os.getloadavg()[0]
    counter = Requests(conn.session)
    made: list[str] = []

    def ours(tag: str) -> None:
        action = f"bench-{tag}"
        inst = cloud.find_instance(action) or cloud.create_instance(pool, f"bench-{tag}", action)
        made.append(inst.id)
        cloud.wait_active(inst.id)
        cloud.delete_and_verify(inst.id)

    def raw(tag: str) -> None:
        action = f"raw-{tag}"
        tags = [f"{TAG_REGION}={region}", f"{TAG_POOL}={pool.name}", f"{TAG_ACTION}={action}"]
        s = next(iter(conn.compute.servers(details=True, tags=",".join(tags[::2]))), None)
        if s is None:
            extra = {}
            if cloud.options.user_data:  # region lab sets a user_data template: send the same bytes
                ud = cloud.options.user_data.format(name=f"raw-{tag}", pool=pool.name, region=region, action_id=action)
                extra["user_data"] = base64.b64encode(ud.encode()).decode()
            s = conn.compute.create_server(name=f"raw-{tag}", flavor_id=flavor.id, image_id=image.id, networks="none",
                                           availability_zone=pool.az, tags=tags,
                                           metadata={TAG_REGION: region, TAG_POOL: pool.name, TAG_ACTION: action},
                                           **extra)
        made.append(s.id)
        conn.compute.wait_for_server(s, status="ACTIVE", interval=POLL_SECONDS, wait=120)
        conn.compute.delete_server(s)
        conn.compute.wait_for_delete(s, interval=POLL_SECONDS, wait=120)
        while conn.placement.get(f"/allocations/{s.id}").json().get("allocations"):
            time.sleep(POLL_SECONDS)

    sides = {"adapter": ours, "raw": raw}
    times: dict[str, list[float]] = {"adapter": [], "raw": []}
    counts: dict[str, list[int]] = {"adapter": [], "raw": []}
    kinds: dict[str, dict] = {}
    try:
        for i in range(pairs + 1):  # pair 0 is the warm-up
            order = ("adapter", "raw") if i % 2 else ("raw", "adapter")
            for side in order:
                tag = uuid.uuid4().hex[:8]
                counter.take()
                t = time.perf_counter()
                sides[side](tag)
                took = time.perf_counter() - t
                n, k = counter.take()
                if i:
                    times[side].append(took)
                    counts[side].append(n)
                    kinds[side] = k
    finally:
        for sid in made:  # nothing stays behind when a round trip fails half-way
            try:
                conn.compute.delete_server(sid, ignore_missing=True)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass
        rt.store.close()

    o, ro = statistics.median(obs), statistics.median(raw_obs)
    a, r = statistics.median(times["adapter"]), statistics.median(times["raw"])
    # the verdict: the median of the per-pair ratios (the two halves of a pair run back to back, so a
    # change of machine load between pairs cancels); the ratio of the two medians is shown beside it
    ratio = statistics.median(x / y for x, y in zip(times["adapter"], times["raw"]))
    return {
        "observe": {"median_s": round(o, 3), "raw_reads_s": round(ro, 3), "ratio_vs_raw": round(o / ro, 2),
                    "target": f"<= {TARGET_OBSERVE_S} s", "pass": o <= TARGET_OBSERVE_S},
        "round_trip": {
            "pairs": pairs, "poll_seconds": POLL_SECONDS,
            "median_s": round(a, 3), "raw_median_s": round(r, 3),
            "min_max_s": [round(min(times["adapter"]), 3), round(max(times["adapter"]), 3)],
            "raw_min_max_s": [round(min(times["raw"]), 3), round(max(times["raw"]), 3)],
            "ratio": round(ratio, 3), "overhead_pct": round(100 * (ratio - 1), 1),
            "ratio_of_medians": round(a / r, 3),
            "requests_per_round_trip": {s: statistics.median(c) for s, c in counts.items()},
            "requests_by_kind": kinds,
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
            "target": f"ratio <= {TARGET_RATIO}", "pass": ratio <= TARGET_RATIO},
        "pass": o <= TARGET_OBSERVE_S and ratio <= TARGET_RATIO,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=15, help="timed round-trip pairs (after one warm-up pair)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    res = bench(args.pairs)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        ob, rt = res["observe"], res["round_trip"]
        print(f"1. observe, region lab: median {ob['median_s'] * 1000:.0f} ms; the raw Placement reads "
              f"{ob['raw_reads_s'] * 1000:.0f} ms ({ob['ratio_vs_raw']}x)  (target {ob['target']})  "
              f"{'PASS' if ob['pass'] else 'FAIL'}")
        rq = rt["requests_per_round_trip"]
        print(f"2. launch + delete round trip, {rt['pairs']} pairs, polling every {rt['poll_seconds']} s: "
              f"adapter median {rt['median_s']:.3f} s ({rq['adapter']} requests), raw openstacksdk "
              f"{rt['raw_median_s']:.3f} s ({rq['raw']} requests)")
        print(f"   ratio adapter / raw (median of pairs): {rt['ratio']:.3f} ({rt['overhead_pct']:+.1f} %), "
              f"of medians {rt['ratio_of_medians']:.3f}  (target {rt['target']})  {'PASS' if rt['pass'] else 'FAIL'}")
        if max(rt["load_average"]) > (rt["cpus"] or 1):
            print(f"   note: load average {rt['load_average']} on {rt['cpus']} CPUs: other work shares the machine, "
                  "the figures are noisy (see the docstring)")
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
