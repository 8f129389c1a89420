#!/usr/bin/env python3
"""spotctl benchmarks: one command, ratios against baselines measured in the same run.

    make bench            (or: .venv/bin/python benchmarks/run.py [--quick] [--json])

Sections (`--only NAME,...` runs some; `--quick` for development), each printing its
targets as PASS/FAIL with the baseline measured in the same run:

  cli         `spotctl --help`, `plan --help`, `audit list --help` <= 1.2x a bare Typer
              app generated from spotctl's command tree (benchmarks/cli_shape.py);
              `spotctl status` on the demo region <= 1.5x the bare app's `status`
  plan_demo   `spotctl plan -o json` on the demo region <= 0.5 s (first call and median)
  identity    `spotctl status` with a cached, valid token <= 1.1x without [identity]
  passes      reconcile pass at 2k/20k, 20k/200k, 100k/1M nodes/pending, on a fresh DB
              and one aged by 30 simulated days; first (adopting) pass; growth; RSS
  planner     the planner alone, 100 pools x 10k units and 1,000 x 100k, usual mix
              and every unit a distinct class
  notices     watcher p99 at 400 vs 100k nodes; a pass with 1,000 hard notices
  audit       `audit verify` (incremental, --full) and `audit list` over 1M records
  state_open  opening a 200 MB state DB vs a small one; outbox pending counts
  prune       the budgeted prune in each pass; `spotctl state prune` throughput
  simulate    `spotctl simulate --hours 168` <= 7.5x `--hours 24`
  consolidation  demo region, 4 h of passes, prices pinned: no move when the cheap pool swaps every
              tick; after a steady 40 % drop, moves downhill only, none twice, spend below off

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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent

#: The bare Typer app the CLI start ratios compare against: generated in each run from spotctl's own command
#: tree by benchmarks/cli_shape.py (same commands, sub-groups and sub-commands, same parameters, help
#: texts and global options; bodies that do nothing, and a `status` that prints a result of the same size;
#: see that module's docstring for what is and is not the same).
BARE_APP = "benchmarks/cli_shape.py"


def timed_runs(cmds: dict[str, list[str]], n: int, env: dict) -> dict[str, float]:
    """Median wall time of each command, runs interleaved so that noise hits all alike."""
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(n):
        for name, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _ratio_row(name: str, med: dict[str, float], ours: str, bare: str, target: float) -> dict:
    ratio = med[ours] / med[bare]
    return {"name": name, "value": round(ratio, 3), "unit": "x", "target": f"<= {target}", "pass": ratio <= target,
            "detail": f"`{ours}` {med[ours] * 1000:.1f} ms / `{bare}` {med[bare] * 1000:.1f} ms (medians, same run)"}


def _cli_env(tmp: str, **extra: str) -> dict:
    """The environment of the CLI runs: an empty config and state home, and bytecode as an installed CLI has
    it (spotctl, the bare app and the libraries all run from .pyc files, written by a first untimed run
    into a cache of this run's own; PYTHONDONTWRITEBYTECODE, when set, would have spotctl's modules compiled
    from source on every call and the bare app not)."""
    env = {**os.environ, "XDG_STATE_HOME": tmp, "XDG_CONFIG_HOME": tmp, "PYTHONPYCACHEPREFIX": f"{tmp}/pycache",
           **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _warm(cmds: dict[str, list[str]], env: dict) -> None:
    """One untimed run of each command (it writes the bytecode); each must succeed, or its time means nothing."""
    for name, cmd in cmds.items():
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"CLI benchmark: `{name}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")


def _bare_app(tmp: str, env: dict) -> tuple[list[str], int]:
    """The bare app of spotctl's shape (see BARE_APP), written into ``tmp``: its command line and how many
    commands and groups it has (spotctl's own count)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cli_shape

    status = subprocess.run([str(BIN / "spotctl"), "status", "-o", "json"], capture_output=True, text=True, env=env,
                            check=False)
    tree = cli_shape.shape()
    return [PY, *cli_shape.write_bare(Path(tmp), status.stdout or "{}", tree)], cli_shape.count_commands(tree)


def _paired(n: int, calls: list[tuple[str, float]], **extra_env: str) -> tuple[dict[str, float], list[dict], int]:
    """Each call (the words after the program, its target ratio) run as `spotctl ...` and as `bare ...`,
    all interleaved, median of n; `python -c pass` beside them. Returns the medians, one ratio row per call
    and the number of commands both apps have."""
    with tempfile.TemporaryDirectory() as tmp:
        env = _cli_env(tmp, **extra_env)
        bare, commands = _bare_app(tmp, env)
        cmds = {"python -c pass": [PY, "-c", "pass"]}
        for words, _ in calls:
            cmds[f"bare {words}"] = [*bare, *words.split()]
            cmds[f"spotctl {words}"] = [str(BIN / "spotctl"), *words.split()]
        _warm(cmds, env)
        med = timed_runs(cmds, n, env)
    rows = [_ratio_row(f"spotctl {words} / bare Typer app {words}", med, f"spotctl {words}", f"bare {words}", target)
            for words, target in calls]
    return med, rows, commands


def bench_cli_start(n: int) -> dict:
    """`spotctl --help`, `spotctl plan --help` (a command) and `spotctl audit list --help` (a sub-group's
    command) against the same calls of a bare Typer app of spotctl's shape (BARE_APP): runs interleaved,
    median of n each, both from bytecode (_cli_env). Targets <= 1.2x."""
    med, rows, commands = _paired(n, [("--help", 1.2), ("plan --help", 1.2), ("audit list --help", 1.2)])
    worst = max(r["value"] for r in rows)
    return {"median_s": med, "rows": rows, "commands_in_both": commands,
            "ratio_spotctl_vs_bare_typer": worst, "target": "<= 1.2", "pass": all(r["pass"] for r in rows)}


def bench_cli_status(n: int) -> dict:
    """`spotctl status` on the demo region against the bare app's `status` (BARE_APP): off a terminal (JSON,
    the default there) the bare one prints the same JSON envelope, from a constant; with `-o table` it
    prints a rich table of the same pool rows and columns (rich is what spotctl's table uses). spotctl's
    does the real work: config, the demo region's simulated cloud and contract feed, the state database
    (created by a first, untimed call, which also gives the bare app its JSON). Runs interleaved, median of
    n. Target <= 1.5x, for each output."""
    med, rows, _ = _paired(n, [("status", 1.5), ("-o table status", 1.5)], COLUMNS="160")
    return {"median_s": med, "rows": rows, "pass": all(r["pass"] for r in rows)}


def bench_plan_demo(n: int) -> list[dict]:
    """`spotctl plan -o json` on the demo region: the first call (it creates the state database) and the
    median of n later ones, beside `python -c pass`. Target <= 0.5 s wall, both."""
    with tempfile.TemporaryDirectory() as tmp:
        env = _cli_env(tmp)
        # bytecode first, from a call on another state home (an installed CLI has its .pyc files): the
        # timed first call is then a first call on a new region, not a first run of a new install
        _warm({"plan": [str(BIN / "spotctl"), "plan", "-o", "json"]}, {**env, "XDG_STATE_HOME": f"{tmp}/warm"})
        first = time.perf_counter()
        subprocess.run([str(BIN / "spotctl"), "plan", "-o", "json"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env, check=True)
        first = time.perf_counter() - first
        med = timed_runs({"python -c pass": [PY, "-c", "pass"],
                          "spotctl plan -o json": [str(BIN / "spotctl"), "plan", "-o", "json"]}, n, env)
    wall = med["spotctl plan -o json"]
    detail = f"{wall / med['python -c pass']:.1f}x python start ({med['python -c pass'] * 1000:.0f} ms)"
    return [{"name": "spotctl plan -o json on the demo region, first call", "value": round(first, 3), "unit": "s",
             "target": "<= 0.5", "pass": first <= 0.5, "detail": "creates the state database; " + detail},
            {"name": "spotctl plan -o json on the demo region, median", "value": round(wall, 3), "unit": "s",
             "target": "<= 0.5", "pass": wall <= 0.5, "detail": f"median of {n}; " + detail}]


def machine() -> dict:
    """What the absolute figures were measured on: the processor, its cores, and a yardstick (the CPU time of a
    pure-Python loop of 10M additions, the best of 3) to compare one machine's figures with another's. The
    targets are never scaled by it."""
    model = "unknown"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    best = float("inf")
    for _ in range(3):
        t, total = time.process_time(), 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.process_time() - t)
    return {"cpu": model, "cores": os.cpu_count(), "python": sys.version.split()[0], "loop_10m_s": round(best, 3)}


def _module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import importlib

    return importlib.import_module(name)


#: The sections of `make bench`, in order: name -> what it measures, and how (quick: smaller sizes).
SECTIONS: dict[str, tuple[str, object]] = {
    "cli": ("CLI start and `spotctl status` vs a bare Typer app of spotctl's shape",
            lambda quick: bench_cli_start(5 if quick else 15)["rows"] + bench_cli_status(5 if quick else 15)["rows"]),
    "plan_demo": ("`spotctl plan -o json` on the demo region", lambda quick: bench_plan_demo(5 if quick else 15)),
    "identity": ("`spotctl status` logged in (cached token) vs without identity (benchmarks/identity.py)",
                 lambda quick: _module("identity").bench(quick)),
    "passes": ("reconcile passes, fresh and aged 30 days, first and steady (benchmarks/passes.py)",
               lambda quick: _module("passes").bench(quick)),
    "planner": ("the planner alone, usual mix and every unit distinct (benchmarks/planner.py)",
                lambda quick: _module("planner").bench(quick)),
    "notices": ("the watcher and a pass with 1,000 hard notices (benchmarks/notices.py)",
                lambda quick: _module("notices").bench(quick)),
    "audit": ("audit verify and list over 1M records (benchmarks/audit.py)",
              lambda quick: _module("audit").bench(quick)),
    "state_open": ("opening a large state database, outbox pending counts (benchmarks/state_open.py)",
                   lambda quick: _module("state_open").bench(quick)),
    "prune": ("retention: the prune in each pass and `spotctl state prune` (benchmarks/prune.py)",
              lambda quick: _module("prune").bench(quick)),
    "simulate": ("`spotctl simulate --hours 168` vs `--hours 24` (benchmarks/simulate.py)",
                 lambda quick: _module("simulate").bench(quick)),
    "consolidation": ("consolidation under oscillating and dropping prices (benchmarks/consolidation.py)",
                      lambda quick: _module("consolidation").bench(quick)),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes (for development)")
    ap.add_argument("--json", action="store_true", help="print one JSON document: section -> rows, and \"machine\": what they were measured on")
    ap.add_argument("--only", metavar="SECTION[,SECTION]", help=f"run only these sections: {', '.join(SECTIONS)}")
    args = ap.parse_args()
    chosen = list(SECTIONS) if not args.only else [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        ap.error(f"no section {', '.join(unknown)} (known: {', '.join(SECTIONS)})")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _rows

    results: dict[str, list[dict]] = {}
    box = machine()
    if not args.json:
        print(f"machine: {box['cpu']}, {box['cores']} cores, Python {box['python']}; a pure-Python loop of 10M "
              f"additions takes {box['loop_10m_s']} s CPU (a yardstick for comparing absolute figures across "
              f"machines; targets are not scaled by it)")
    for i, name in enumerate(chosen, 1):
        what, run = SECTIONS[name]
        print(f"[{i}/{len(chosen)}] {name}: {what} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        results[name] = run(args.quick)  # type: ignore[operator]
        if not args.json:
            print(f"{i}. {name}: {what}  ({time.perf_counter() - t0:.0f} s)")
            for r in results[name]:
                print("   " + _rows.line(r).replace("\n", "\n   "))
    rows = [r for section in results.values() for r in section]
    failed = [r["name"] for r in rows if not r["pass"]]
    if args.json:
        print(json.dumps({"machine": box, **results}, indent=2))
    else:
        print(f"\n{len(rows) - len(failed)} of {len(rows)} targets PASS" + (
            "; FAIL: " + "; ".join(failed) if failed else ""))
    return 0 if rows and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
