#!/usr/bin/env python3
"""Planner quality (issue 18): spotctl's planner against a price-greedy baseline and a MILP bound of each decision.

For every scenario of :mod:`benchmarks.scenarios` (regions of 6-100 pools generated from seeds through the
simulator's knobs) the region is simulated (:func:`spotctl.ops.simulate.simulate`, as ``spotctl simulate``
runs it: one reconcile pass a minute against a fresh simulated world) twice, with the same seed:

- ``spotctl``: spotctl's planner (:func:`spotctl.core.planner.plan`);
- ``greedy``: the price-greedy baseline (:func:`spotctl.core.plan_greedy.plan`: cheapest pool first,
  blind to the calendar and to risk, otherwise within headroom, limits, quota, spend cap, budget);
- ``milp``: the MILP as a planner (:func:`benchmarks.milp.plan`: spotctl's plan with its launches replaced
  by those of a MILP that places the most units at the least cost; ``--no-milp-planner`` leaves it out).

and, along spotctl's run, the launch decision of every pass that launches (every ``stride``-th on the
wide regions) is also solved as a MILP with HiGHS (:mod:`benchmarks.milp`: aggregate per-pool packing, a
relaxation, so its value is a **bound**): the per-decision cost gap (spotctl's risk-weighted €/h of launches
over the bound's, for at least the same units of each class) and, in the spend-cap scenario, the units
spotctl placed over the most units that fit in the same €/h: the per-decision optimum on the same inputs
as spotctl's decision (the targets are judged on it). The ``milp`` rows are a third run in which the MILP
decides its own launches.

Printed per scenario and in total: cost (EUR), demand served (units started, share of the servable), mean
and p95 wait, calendar-reclaim interruptions (runs stopped on a host a reservation takes within 2 h),
all interruptions (runs requeued or lost), work lost (unit-hours of progress those runs had), actions
taken (launched nodes count one each), planner time (ms, mean and max; the planner alone). Then the
targets, PASS or FAIL, and the fallback time: in scenarios with launch failures, the simulated seconds from
a failed launch to the next launch request in another pool (the reconciler re-plans in the same pass).

Exits 0 when the run completes (FAIL lines are printed, not hidden), 1 when it errors.

    .venv/bin/python benchmarks/planner_quality.py [--quick] [--only NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import milp  # noqa: E402
from benchmarks.scenarios import Scenario, suite, world_factory  # noqa: E402
from spotctl.core import plan_greedy  # noqa: E402
from spotctl.core.actions import Plan  # noqa: E402
from spotctl.core.models import ActionKind  # noqa: E402
from spotctl.core.plan_input import PlanInput  # noqa: E402
from spotctl.core.planner import plan as spotctl_plan  # noqa: E402
from spotctl.core.stats import percentile  # noqa: E402
from spotctl.ops.reconcile import PassResult  # noqa: E402
from spotctl.ops.simulate import simulate  # noqa: E402

GAP_TARGET = 1.0  # % mean per-decision cost gap to the optimum (bound)
SPEND_CAP_TARGET = 95.0  # % of the units the optimum places at the same €/h
CAL_TARGET = 50.0  # % fewer calendar-reclaim interruptions than greedy ...
COST_SLACK = 2.0  # ... at most this % higher cost
FALLBACK_TARGET = 60.0  # s from a failed launch to the replacement request in another pool
FALLBACK_HORIZON = 3600.0  # a failure with no launch elsewhere within this long counts as "none"


@dataclass
class Timed:
    """A planner behind the planner's interface that times itself (and, for spotctl, solves the MILP)."""

    planner: object
    sc: Scenario | None = None  # set: solve the MILP of every stride-th launching decision
    stride: int = 1
    times: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # % per decision (risk-weighted €/h)
    raw_gaps: list[float] = field(default_factory=list)  # % per decision (€/h)
    exact: int = 0
    cap_units: list[tuple[int, int]] = field(default_factory=list)  # (spotctl units, bound units) at the same €/h
    milp_seconds: float = 0.0
    launching: int = 0
    skipped: int = 0  # decisions the MILP could not state (a class spotctl placed where no segment takes it)

    def __call__(self, inp: PlanInput) -> Plan:
        t = time.perf_counter()
        p = self.planner(inp)  # type: ignore[operator]
        self.times.append((time.perf_counter() - t) * 1000)
        if self.sc is not None and any(a.kind is ActionKind.LAUNCH for a in p.actions):
            self.launching += 1
            if (self.launching - 1) % self.stride == 0:
                self.reference(inp)
        return p

    def reference(self, inp: PlanInput) -> None:
        t = time.perf_counter()
        d = milp.decision(inp)
        if d.units > 0 and d.risk_cost > 0:
            s = milp.solve(d, "min_cost")
            if s.status == "infeasible" or s.value <= 0:
                self.skipped += 1
            else:
                self.exact += s.exact
                self.gaps.append(100.0 * (d.risk_cost / s.value - 1.0))
                raw = s.cost if s.exact and s.cost > 0 else None
                if raw:
                    self.raw_gaps.append(100.0 * (d.cost / raw - 1.0))
            if self.sc is not None and "spend_cap" in self.sc.tags:
                m = milp.solve(d, "max_units", euro_per_hour=d.cost)
                if m.status != "infeasible":
                    self.cap_units.append((d.units, max(d.units, int(m.value + 1e-6))))
        self.milp_seconds += time.perf_counter() - t


class Fallback:
    """From each failed launch to the next launch request in another pool, in simulated seconds."""

    def __init__(self) -> None:
        self.open: list[tuple[float, str]] = []
        self.latencies: list[float] = []
        self.none = 0

    def __call__(self, t: float, r: PassResult) -> None:
        for o in r.outcomes:
            if o.kind != "launch":
                continue
            if o.done > 0:
                still = []
                for at, pool in self.open:
                    if pool != o.pool:
                        self.latencies.append(t - at)
                    else:
                        still.append((at, pool))
                self.open = still
            if o.status in ("failed", "partial") and o.done < (o.count or 0) and "token budget" not in o.detail:
                self.open.append((t, o.pool or "?"))
        keep = []
        for at, pool in self.open:
            if t - at > FALLBACK_HORIZON:
                self.none += 1
            else:
                keep.append((at, pool))
        self.open = keep


def run(sc: Scenario, label: str) -> tuple[dict, Timed, Fallback]:
    planner = {"spotctl": spotctl_plan, "greedy": plan_greedy.plan, "milp": milp.plan}[label]
    stride = 1 if len(sc.region.pools) <= 20 else 2
    timed = Timed(planner, sc if label == "spotctl" else None, stride)
    fb = Fallback()
    factory = world_factory(sc)
    rep = simulate(sc.region, factory, hours=sc.hours, seed=sc.seed, planner=timed, on_pass=fb)
    w = factory.world  # type: ignore[attr-defined]
    waits = w.cluster.waits
    inter = rep["interruptions"]
    row = {
        "cost": rep["cost"]["total"], "started": rep["demand"]["started"], "servable": rep["demand"]["servable"],
        "served_pct": rep["demand"]["served_pct"],
        "wait_mean": statistics.fmean(waits) if waits else 0.0, "wait_p95": rep["wait_seconds"]["p95"],
        "waits": list(waits),
        "cal": w.stats["interrupted_calendar"], "cal_seen": w.stats["interrupted_calendar_foreseen"], "inter": inter["lost_units"] + inter["requeued_units"],
        "lost_h": w.stats["work_lost_seconds"] / 3600.0,
        "actions": sum(rep["reconciler"]["actions"].values()),
        "plan_ms": list(timed.times),
        "wall": rep["wall_seconds"],
    }
    return row, timed, fb


COLS = ("scenario", "planner", "cost EUR", "served", "served%", "wait mean", "wait p95", "cal.int (seen)", "all int",
        "lost u-h", "actions", "plan ms mean/max")


def fmt_row(name: str, label: str, r: dict) -> list[str]:
    ms = r["plan_ms"]
    return [name, label, f"{r['cost']:.2f}", str(r["started"]), f"{100 * r['started'] / max(1, r['servable']):.1f}",
            f"{r['wait_mean']:.0f}s", f"{r['wait_p95']:.0f}s", f"{r['cal']} ({r['cal_seen']})", str(r["inter"]), f"{r['lost_h']:.1f}",
            str(r["actions"]), f"{statistics.fmean(ms):.1f}/{max(ms):.1f}" if ms else "-"]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def total(rows: list[dict]) -> dict:
    waits = [x for r in rows for x in r["waits"]]
    return {
        "cost": sum(r["cost"] for r in rows), "started": sum(r["started"] for r in rows),
        "servable": sum(r["servable"] for r in rows),
        "wait_mean": statistics.fmean(waits) if waits else 0.0,
        "wait_p95": percentile(sorted(waits), 0.95) if waits else 0.0, "waits": waits,
        "cal": sum(r["cal"] for r in rows), "cal_seen": sum(r["cal_seen"] for r in rows), "inter": sum(r["inter"] for r in rows),
        "lost_h": sum(r["lost_h"] for r in rows), "actions": sum(r["actions"] for r in rows),
        "plan_ms": [x for r in rows for x in r["plan_ms"]],
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="five scenarios, shorter")
    ap.add_argument("--only", action="append", default=[], help="run only this scenario (repeatable)")
    ap.add_argument("--no-milp-planner", action="store_true", help="leave out the runs planned by the MILP")
    args = ap.parse_args(argv)
    scenarios = [s for s in suite(args.quick) if not args.only or s.name in args.only]
    if not scenarios:
        print(f"no scenario named {', '.join(args.only)}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    lines = [list(COLS)]
    labels = ("spotctl", "greedy") if args.no_milp_planner else ("spotctl", "greedy", "milp")
    by: dict[str, list[dict]] = {label: [] for label in labels}
    refs: list[tuple[Scenario, Timed]] = []
    fallbacks: list[tuple[Scenario, Fallback]] = []
    for sc in scenarios:
        print(f"== {sc.describe()}", file=sys.stderr, flush=True)
        for label in labels:
            row, timed, fb = run(sc, label)
            by[label].append(row)
            lines.append(fmt_row(sc.name, label, row))
            if label == "spotctl":
                refs.append((sc, timed))
                if sc.failures or sc.knobs.build_failure_rate:
                    fallbacks.append((sc, fb))
            print(f"   {label}: {row['wall']:.1f} s simulated run", file=sys.stderr, flush=True)
    for label in labels:
        lines.append(fmt_row("TOTAL", label, total(by[label])))
    print(table(lines))

    print("\nper-decision MILP reference (HiGHS; aggregate packing per pool segment: a bound)")
    ref_lines = [["scenario", "decisions", "solved exact", "gap mean %", "gap p95 %", "gap max %", "raw gap mean %",
                  "cap units spotctl/bound", "milp s"]]
    gaps: list[float] = []
    cap = [0, 0]
    for sc, t in refs:
        gaps.extend(t.gaps)
        su, bu = sum(a for a, _ in t.cap_units), sum(b for _, b in t.cap_units)
        cap[0] += su
        cap[1] += bu
        ref_lines.append([sc.name, str(len(t.gaps)) + (f" (+{t.skipped} skipped)" if t.skipped else ""),
                          str(t.exact), f"{statistics.fmean(t.gaps):.2f}" if t.gaps else "-",
                          f"{percentile(sorted(t.gaps), 0.95):.2f}" if t.gaps else "-",
                          f"{max(t.gaps):.2f}" if t.gaps else "-",
                          f"{statistics.fmean(t.raw_gaps):.2f}" if t.raw_gaps else "-",
                          f"{su}/{bu}" if t.cap_units else "-", f"{t.milp_seconds:.1f}"])
    print(table(ref_lines))

    print("\nfallback (simulated seconds from a failed launch to the next launch request in another pool)")
    lat = [x for _, f in fallbacks for x in f.latencies]
    for sc, f in fallbacks:
        print(f"  {sc.name}: {len(f.latencies)} failures replaced elsewhere, max {max(f.latencies, default=0):.0f} s, "
              f"p95 {percentile(sorted(f.latencies), 0.95) if f.latencies else 0:.0f} s; "
              f"{f.none} with no launch in another pool within {FALLBACK_HORIZON:.0f} s")

    s, g = total(by["spotctl"]), total(by["greedy"])
    print("\ntargets")
    gap_mean = statistics.fmean(gaps) if gaps else None
    print(f"  {verdict(gap_mean is not None and gap_mean <= GAP_TARGET)}  per-decision cost gap vs the optimum (bound), "
          f"mean <= {GAP_TARGET:g} %: " + (f"{gap_mean:.2f} % over {len(gaps)} decisions" if gaps else "no decision"))
    if cap[1]:
        share = 100.0 * cap[0] / cap[1]
        print(f"  {verdict(share >= SPEND_CAP_TARGET)}  under a spend cap, units placed vs the optimum (bound) at the "
              f"same EUR/h >= {SPEND_CAP_TARGET:g} %: {share:.1f} % ({cap[0]} of {cap[1]})")
    else:
        print("  FAIL  under a spend cap: no spend-cap decision was measured")
    dearer = 100.0 * (s["cost"] / g["cost"] - 1) if g["cost"] else 0.0
    for key, what in (("cal_seen", "foreseeable calendar-reclaim interruptions (the lease on the calendar when the run "
                                   "started)"),
                      ("cal", "all calendar-reclaim interruptions (leases made after the run started included)")):
        fewer = 100.0 * (1 - s[key] / g[key]) if g[key] else (0.0 if s[key] else 100.0)
        print(f"  {verdict(fewer >= CAL_TARGET and dearer <= COST_SLACK)}  {what} >= {CAL_TARGET:g} % fewer than greedy "
              f"at <= {COST_SLACK:g} % higher cost: {s[key]} vs {g[key]} ({fewer:.0f} % fewer), "
              f"cost {s['cost']:.2f} vs {g['cost']:.2f} EUR ({dearer:+.2f} %)")
    print(f"  {verdict(s['started'] >= g['started'])}  demand served >= greedy: {s['started']} vs {g['started']} units started")
    if lat:
        print(f"  {verdict(max(lat) <= FALLBACK_TARGET)}  fallback: failed launch -> replacement request in another pool "
              f"<= {FALLBACK_TARGET:g} s: max {max(lat):.0f} s over {len(lat)} failures")
    else:
        print("  FAIL  fallback: no launch failure was replaced in another pool (nothing measured)")
    if "milp" in by:
        m = total(by["milp"])
        print(f"  info  spotctl vs the MILP as a planner (its own run): cost {s['cost']:.2f} vs {m['cost']:.2f} EUR "
              f"({100.0 * (s['cost'] / m['cost'] - 1) if m['cost'] else 0.0:+.2f} %), served {s['started']} vs "
              f"{m['started']}, calendar interruptions {s['cal']} ({s['cal_seen']}) vs {m['cal']} ({m['cal_seen']})")
    print(f"\n{len(scenarios)} scenarios in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("planner_quality: interrupted (the scenarios so far are printed above; no table)", file=sys.stderr)
        sys.exit(130)
