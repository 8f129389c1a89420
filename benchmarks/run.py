#!/usr/bin/env python3
"""spotctl benchmarks: one command, ratios against baselines measured in the same run.

    make bench            (or: .venv/bin/python benchmarks/run.py [--quick] [--json])

1. CLI start: `spotctl plan --help` vs a bare Typer app of the same shape vs
   `python -c pass`.                      target: spotctl / bare Typer <= 1.2
2. `spotctl plan -o json` on the demo region.  target: <= 0.5 s wall
3. One in-process reconcile pass on generated regions (2k nodes / 20k pending
   units and 20k / 200k).   targets: <= 2 s at 20k/200k; 10x the work <= 12x
   the time; peak RSS <= 200 MiB.

Absolute times vary with the machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent

BARE_APP = textwrap.dedent('''
    from typing import Annotated, Optional
    import typer
    app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)
    @app.callback()
    def main(output: Annotated[Optional[str], typer.Option("-o", "--output")] = None,
             region: Annotated[Optional[str], typer.Option("--region")] = None,
             verbose: Annotated[int, typer.Option("-v", count=True)] = 0,
             quiet: Annotated[bool, typer.Option("-q")] = False,
             debug: Annotated[bool, typer.Option("--debug")] = False):
        """Bare app of the same shape as spotctl."""
    for name in ("plan", "status", "reconcile", "launch", "drain", "simulate", "version"):
        def cmd(explain: Annotated[bool, typer.Option("--explain")] = False, dry_run: bool = False):
            """A command."""
        app.command(name)(cmd)
    app(prog_name="bare")
''')


def timed_runs(cmds: dict[str, list[str]], n: int, env: dict) -> dict[str, float]:
    """Median wall time of each command, runs interleaved so that noise hits all alike."""
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(n):
        for name, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_cli_start(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare.py"
        bare.write_text(BARE_APP)
        env = {**os.environ, "XDG_STATE_HOME": tmp, "XDG_CONFIG_HOME": tmp}
        med = timed_runs({
            "python -c pass": [PY, "-c", "pass"],
            "bare typer --help": [PY, str(bare), "plan", "--help"],
            "spotctl plan --help": [str(BIN / "spotctl"), "plan", "--help"],
        }, n, env)
    ratio = med["spotctl plan --help"] / med["bare typer --help"]
    return {"median_s": med, "ratio_spotctl_vs_bare_typer": round(ratio, 3), "target": "<= 1.2", "pass": ratio <= 1.2}


def bench_plan_demo(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_STATE_HOME": tmp, "XDG_CONFIG_HOME": tmp}
        first = time.perf_counter()
        subprocess.run([str(BIN / "spotctl"), "plan", "-o", "json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        first = time.perf_counter() - first
        med = timed_runs({
            "python -c pass": [PY, "-c", "pass"],
            "spotctl plan -o json": [str(BIN / "spotctl"), "plan", "-o", "json"],
        }, n, env)
    wall = med["spotctl plan -o json"]
    return {"first_run_s": round(first, 3), "median_s": med,
            "ratio_vs_python_start": round(wall / med["python -c pass"], 2),
            "target": "<= 0.5 s", "pass": wall <= 0.5 and first <= 0.5}


PASS_CHILD = textwrap.dedent('''
    import json, resource, sys, tempfile, time
    from pathlib import Path
    nodes, pending = int(sys.argv[1]), int(sys.argv[2])
    from spotctl.sim.generate import generated_region
    from spotctl.core.ports import FixedClock
    from spotctl.ops.reconcile import run_pass
    from spotctl.ops.runtime import Runtime
    from spotctl.state.store import Store
    t0 = time.perf_counter()
    region, world = generated_region(nodes, pending)
    build = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "bench.db", region.name)
        rt = Runtime(region=region, store=store, cloud=world.cloud, contract=world.contract,
                     schedulers=list(world.schedulers), clock=FixedClock(world.now), actor="bench",
                     concurrent_observe=False)
        # first pass adopts the pre-existing tagged nodes (a one-off); the steady state is what the timer sees
        t1 = time.perf_counter(); r0 = run_pass(rt); adopt = time.perf_counter() - t1
        rt.clock.advance(30); world.advance(rt.clock.now())
        t2 = time.perf_counter(); r = run_pass(rt); steady = time.perf_counter() - t2
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"nodes": nodes, "pending": pending, "build_s": round(build, 3), "adopt_pass_s": round(adopt, 3),
                      "pass_s": round(steady, 3), "peak_rss_mib": round(rss, 1), "status": r.status,
                      "actions": len(r.plan.actions) if r.plan else 0}))
''')


def bench_pass(sizes: list[tuple[int, int]]) -> dict:
    out = []
    for nodes, pending in sizes:
        proc = subprocess.run([PY, "-c", PASS_CHILD, str(nodes), str(pending)], capture_output=True, text=True,
                              cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"pass benchmark failed at {nodes}/{pending}:\n{proc.stderr}")
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    small, big = out[0], out[-1]
    scale = big["pass_s"] / max(small["pass_s"], 1e-9)
    return {"runs": out, "ratio_10x_work": round(scale, 2),
            "targets": {"pass_s_at_largest": "<= 2", "ratio_10x_work": "<= 12", "peak_rss_mib": "<= 200"},
            "pass": big["pass_s"] <= 2 and scale <= 12 and big["peak_rss_mib"] <= 200}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller regions")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    n = 5 if args.quick else 15
    sizes = [(200, 2000), (2000, 20000)] if args.quick else [(2000, 20000), (20000, 200000)]
    results = {"cli_start": bench_cli_start(n), "plan_demo": bench_plan_demo(n), "pass": bench_pass(sizes)}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import notices

    results["notices"] = notices.bench()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        c = results["cli_start"]
        print("1. CLI start (median of %d, interleaved)" % n)
        for k, v in c["median_s"].items():
            print(f"   {k:24s} {v * 1000:7.1f} ms")
        print(f"   ratio spotctl / bare Typer: {c['ratio_spotctl_vs_bare_typer']}  (target {c['target']})  "
              f"{'PASS' if c['pass'] else 'FAIL'}")
        p = results["plan_demo"]
        print("2. spotctl plan -o json on the demo region")
        print(f"   first run {p['first_run_s'] * 1000:.0f} ms, median {p['median_s']['spotctl plan -o json'] * 1000:.0f} ms, "
              f"{p['ratio_vs_python_start']}x python start  (target {p['target']})  {'PASS' if p['pass'] else 'FAIL'}")
        b = results["pass"]
        print("3. one reconcile pass, in process")
        for r in b["runs"]:
            print(f"   {r['nodes']:>6} nodes {r['pending']:>7} pending: pass {r['pass_s']:.3f} s "
                  f"(first pass adopting every node {r['adopt_pass_s']:.2f} s, region built in {r['build_s']:.2f} s), "
                  f"peak RSS {r['peak_rss_mib']} MiB, {r['actions']} actions")
        print(f"   10x the work took {b['ratio_10x_work']}x the time  (targets: {b['targets']})  "
              f"{'PASS' if b['pass'] else 'FAIL'}")
        nb = results["notices"]
        pn, w = nb["pass_with_1000_notices"], nb["watch_100_notices"]
        print("4. notices")
        print(f"   pass with {pn['notices']} hard notices: {pn['pass_s']:.3f} s ({pn['drains']} drains), "
              f"{pn['ratio']}x the same pass without them  (target {pn['target']})  {'PASS' if pn['pass'] else 'FAIL'}")
        print(f"   watcher, {w['notices']} notices: receipt -> drains accepted p50 {w['p50_s'] * 1000:.1f} ms, "
              f"p99 {w['p99_s'] * 1000:.1f} ms  (target {w['target']})  {'PASS' if w['pass'] else 'FAIL'}")
    verdicts = [v["pass"] for k, v in results.items() if k != "notices"] + [
        v["pass"] for v in results["notices"].values()]
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
