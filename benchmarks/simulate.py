#!/usr/bin/env python3
"""``spotctl simulate`` over a week vs over a day (issue 14): a region's cost must not grow with its history.

Both runs go through the CLI (``spotctl -o json simulate --hours H --seed 1``) in subprocesses on the demo
region, each with a fresh XDG_STATE_HOME and XDG_CONFIG_HOME (no user configuration, no state left by the
other run), the same seed and interval. 7x the simulated hours is 7x the passes; the target is
``--hours 168`` <= 7.5x ``--hours 24``.

The ratio that is held to the target is of CPU time (user + system) of the child processes: on a shared
machine (2 cores, other work running) wall time swings by 2-5x with the load, CPU time is what the run
itself cost, less the fixed cost of a one-pass run (``--hours 0.01``: start-up, the world's build, the
report) measured the same way, which is in both runs and would only flatter the ratio. The wall-time ratio (the simulation's own ``wall_seconds`` from its report, start-up left
out) is printed beside it. The short run is made before and after the long one and their mean taken, so
that a drift in the machine's load hits both sides alike. --quick: 4 h vs 28 h (the same 7x).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SEED = "1"
TARGET = 7.5


def run(hours: float) -> tuple[float, float, dict]:
    """One ``spotctl simulate`` in a fresh environment: (CPU s of the process, simulation wall s, report)."""
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
        env.update(XDG_STATE_HOME=f"{tmp}/state", XDG_CONFIG_HOME=f"{tmp}/config", NO_COLOR="1")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([str(BIN / "spotctl"), "-q", "-o", "json", "simulate", "--hours", str(hours),
                            "--seed", SEED], capture_output=True, text=True, env=env, cwd=tmp, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        raise RuntimeError(f"spotctl simulate --hours {hours} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    data = json.loads(p.stdout)["data"]
    return cpu, float(data["wall_seconds"]), data


def bench(quick: bool = False) -> list[dict]:
    short, long = (4, 28) if quick else (24, 168)
    fixed, _, one = run(0.01)
    c1, s1, r_short = run(short)
    c_long, s_long, r_long = run(long)
    c2, s2, again = run(short)
    if again["reconciler"] != r_short["reconciler"]:
        raise RuntimeError(f"simulate --hours {short} --seed {SEED} gave two different reports")
    c_short, s_short = (c1 + c2) / 2, (s1 + s2) / 2
    ratio = (c_long - fixed) / (c_short - fixed)
    rec_s, rec_l = r_short["reconciler"], r_long["reconciler"]
    return [{
        "name": f"simulate --hours {long} vs --hours {short}", "value": round(ratio, 2), "unit": "x",
        "target": f"<= {TARGET}", "pass": ratio <= TARGET,
        "detail": f"CPU {c_long:.1f} s vs {c_short:.1f} s ({c1:.1f}, {c2:.1f}), less {fixed:.2f} s for a run of "
                  f"{one['reconciler']['passes']} pass; {rec_l['passes']} vs "
                  f"{rec_s['passes']} passes; simulation wall {s_long:.1f} s vs {s_short:.1f} s "
                  f"({s1:.1f}, {s2:.1f}), ratio {s_long / s_short:.2f}x; "
                  f"outbox rows at the end {rec_l['outbox_rows']} vs {rec_s['outbox_rows']}, "
                  f"audit records {rec_l['audit']['records']} vs {rec_s['audit']['records']}",
    }]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _rows

    sys.exit(_rows.main(bench, __doc__))
