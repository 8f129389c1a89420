#!/usr/bin/env python3
"""The reconcile pass at scale, on a fresh state database and on one aged by 30 simulated days.

For each size (nodes / pending units: 2k/20k, 20k/200k, 100k/1M; ``--quick``: the first two), two
cases, each in a subprocess of its own (its peak RSS is the case's): **fresh** (a new database) and
**aged** (the history ``benchmarks/aged.py`` writes for the same region: 30 days of ended nodes,
actions, audit records, outbox rows, notices, passes and plans). In each case the generated region's
first pass adopts its whole fleet (tagged instances the database does not know: the one-off first pass
on an existing fleet) and is timed on its own; then the steady passes, 30 s apart, as the timer runs
them (the median of 3).

Targets: steady pass <= 2 s at 20k/200k and <= 10 s at 100k/1M; first (adopting) pass <= 2 s at 20k;
aged <= 1.1x fresh at each size; growth exponent <= 1.0 (log of the time ratio over log of the work
ratio between sizes, the work being the nodes); peak RSS <= 200 MiB at 20k and <= 800 MiB at 100k.
The peak RSS includes the simulated provider (the generated world lives in the same process), and
``detail`` says what the world alone takes. The simulated world's objects are frozen out of the
garbage collector (``gc.freeze``): they are not the reconciler's, a real region's are in other processes.

    python benchmarks/passes.py [--quick]     prints the rows, exits 1 on any FAIL
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

CHILD = textwrap.dedent('''
    import gc, json, resource, sys, time
    from pathlib import Path
    nodes, pending, db, steady_n = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    from spotctl.sim.generate import generated_region
    from spotctl.core.ports import FixedClock
    from spotctl.ops.reconcile import run_pass
    from spotctl.ops.runtime import Runtime
    from spotctl.state.store import Store
    t0 = time.perf_counter()
    region, world = generated_region(nodes, pending)
    gc.collect()
    gc.freeze()  # the simulated provider's objects: not the reconciler's to collect
    build = time.perf_counter() - t0
    world_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store = Store.open(db, region.name)
    rt = Runtime(region=region, store=store, cloud=world.cloud, contract=world.contract,
                 schedulers=list(world.schedulers), clock=FixedClock(world.now), actor="bench",
                 concurrent_observe=False)
    t1 = time.perf_counter(); first = run_pass(rt); first_s = time.perf_counter() - t1
    steady = []
    for _ in range(steady_n):
        rt.clock.advance(30); world.advance(rt.clock.now())
        t2 = time.perf_counter(); r = run_pass(rt); steady.append(time.perf_counter() - t2)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    counts = store.counts()
    store.close()
    print(json.dumps({"build_s": build, "first_s": first_s, "adopted": first.synced.get("adopted", 0),
                      "first_status": first.status, "steady_s": steady, "status": r.status,
                      "actions": len(r.plan.actions) if r.plan else 0, "peak_rss_mib": rss,
                      "world_rss_mib": world_rss, "counts": counts, "db_mib": db.stat().st_size / (1 << 20)}))
''')

SIZES = [(2_000, 20_000), (20_000, 200_000), (100_000, 1_000_000)]


def run_case(nodes: int, pending: int, db: Path, steady_n: int) -> dict:
    proc = subprocess.run([PY, "-c", CHILD, str(nodes), str(pending), str(db), str(steady_n)], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"pass benchmark failed at {nodes}/{pending} ({db.name}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["pass_s"] = statistics.median(out["steady_s"])
    return out


def aged_db(nodes: int, db: Path) -> dict:
    proc = subprocess.run([PY, str(ROOT / "benchmarks" / "aged.py"), str(db), str(nodes)], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"aged database for {nodes} nodes failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _k(n: int) -> str:
    return f"{n // 1000}k" if n < 1_000_000 else f"{n // 1_000_000}M"


def _row(name: str, value: float, unit: str, limit: float, detail: str) -> dict:
    return {"name": name, "value": round(value, 3), "unit": unit, "target": f"<= {limit:g}",
            "pass": value <= limit, "detail": detail}


def bench(quick: bool = False) -> list[dict]:
    sizes = SIZES[:2] if quick else SIZES
    runs: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for nodes, pending in sizes:
            steady_n = 3
            runs[(nodes, "fresh")] = run_case(nodes, pending, Path(tmp) / f"fresh-{nodes}.db", steady_n)
            db = Path(tmp) / f"aged-{nodes}.db"
            history = aged_db(nodes, db)
            runs[(nodes, "aged")] = {**run_case(nodes, pending, db, steady_n), "history": history}
            for f in Path(tmp).glob("*.db*"):  # a few hundred MiB each: not kept past their case
                f.unlink()
    rows = []
    for nodes, pending in sizes:
        fresh, aged = runs[(nodes, "fresh")], runs[(nodes, "aged")]
        size = f"{_k(nodes)}/{_k(pending)}"
        h = aged["history"]
        aged_detail = (f"aged DB {h['db_mib']:.0f} MiB: {h['nodes']} ended nodes, {h['transitions']} transitions, "
                       f"{h['audit']} audit, {h['outbox']} outbox, {h['plans']} plans")
        for case, r in (("fresh", fresh), ("aged", aged)):
            limit = 2.0 if nodes == 20_000 else 10.0 if nodes == 100_000 else None
            steady = ", ".join(f"{s:.3f}" for s in r["steady_s"])
            detail = (f"steady passes {steady} s ({r['status']}, {r['actions']} actions); first pass "
                      f"{r['first_s']:.3f} s adopting {r['adopted']}; world built in {r['build_s']:.1f} s")
            if case == "aged":
                detail += "; " + aged_detail
            if limit is not None:
                rows.append(_row(f"pass {size} {case}", r["pass_s"], "s", limit, detail))
            if nodes == 20_000:
                rows.append(_row(f"first (adopting) pass {size} {case}", r["first_s"], "s", 2.0,
                                 f"adopted {r['adopted']} nodes ({r['first_status']}); steady pass "
                                 f"{r['pass_s']:.3f} s in the same run"))
        rows.append(_row(f"pass {size} aged / fresh", aged["pass_s"] / fresh["pass_s"], "x", 1.1,
                         f"aged {aged['pass_s']:.3f} s vs fresh {fresh['pass_s']:.3f} s (first pass "
                         f"{aged['first_s']:.3f} vs {fresh['first_s']:.3f} s); {aged_detail}"))
        limit_rss = {20_000: 200.0, 100_000: 800.0}.get(nodes)
        if limit_rss is not None:
            worst = max(fresh["peak_rss_mib"], aged["peak_rss_mib"])
            rows.append(_row(f"peak RSS {size}", worst, "MiB", limit_rss,
                             f"fresh {fresh['peak_rss_mib']:.0f}, aged {aged['peak_rss_mib']:.0f} MiB; the "
                             f"simulated world alone {fresh['world_rss_mib']:.0f} MiB"))
    for case in ("fresh", "aged"):
        for (n1, _), (n2, p2) in zip(sizes, sizes[1:]):
            a, b = runs[(n1, case)], runs[(n2, case)]
            exp = math.log(b["pass_s"] / a["pass_s"]) / math.log(n2 / n1)
            rows.append(_row(f"pass growth exponent {_k(n1)} -> {_k(n2)} {case}", exp, "", 1.0,
                             f"{b['pass_s']:.3f} s / {a['pass_s']:.3f} s for {n2 // n1}x the nodes and pending"))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _rows

    sys.exit(_rows.main(bench, __doc__))
