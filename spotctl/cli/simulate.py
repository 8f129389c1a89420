"""spotctl simulate"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import fmt, render
from .context import state
from .options import finite

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def simulate(
    ctx: typer.Context,
    hours: Annotated[float, typer.Option(
        "--hours", "-H", callback=finite(gt=0, hi=336), help="Simulated hours to replay (max 336).")] = 24.0,
    seed: Annotated[Optional[int], typer.Option("--seed", "-s", help="World seed (default: the region's seed).")] = None,
    interval: Annotated[int, typer.Option(
        "--interval", min=1, max=86400, help="Seconds between reconcile passes, as the timer would.")] = 60,
    keep_state: Annotated[Optional[str], typer.Option(
        "--keep-state", help="Keep the simulation's state database in this directory (for `audit` and inspection).")] = None,
) -> None:
    """Replay hours of the region on a virtual clock and report the outcome.

    Runs the reconciler against a fresh simulated world built from the
    region's pools and policy (the demo region by default): cost, demand
    served, wait times, interruptions, notices handled before their deadline.
    The region's own state is not touched. Same seed, same report.

    Every pod or job that arrived ends the window started, pending, abandoned
    or excluded (held, not demand); shares of demand are of the servable
    units (arrived minus excluded), each written as "N of M (P %)".

    Example: spotctl simulate --hours 24 --seed 7
    """
    st = state(ctx)
    from spotctl.ops.simulate import simulate as run_sim
    from spotctl.wiring import sim_world_factory

    region = st.config().region(st.region)
    import logging

    # a day is 1,440 virtual passes: their info and debug lines (36,000, 5 MB) would cost the run 15-25 %
    st.log_file_level(logging.WARNING, "simulate: the virtual passes' info and debug lines are left out "
                                       "(-v or -vv shows them on stderr)")
    show = _hourly(st, hours)
    report = run_sim(region, sim_world_factory, hours=hours, seed=seed, interval=interval,
                     state_dir=keep_state, progress=show)
    show.done()
    render.emit(st.fmt(), "simulate", report, table=_table)


class _hourly:
    """Progress on stderr: one updating line on a terminal, a line every few hours otherwise."""

    def __init__(self, st, hours: float):
        import sys

        self.st, self.err = st, sys.stderr
        self.tty = self.err.isatty()
        self.every = max(1, int(hours // 6))
        self.n = 0

    def __call__(self, message: str) -> None:
        self.n += 1
        if self.st.quiet:
            return
        if self.tty:
            self.err.write(f"\rspotctl: {message}   ")
            self.err.flush()
        elif self.n % self.every == 0:
            self.st.progress(message)

    def done(self) -> None:
        if self.tty and self.n and not self.st.quiet:
            self.err.write("\n")


def _of(n: int, whole: int, what: str, pct: float | None) -> str:
    """``943 of 962 servable (98.0 %)``: a share with its numerator and denominator."""
    return f"{n} of {whole} {what} ({fmt.pct(pct)})"


def _table(console, r: dict) -> None:
    """The report as one table: figure (with its unit), value, and what it counts. Each figure is defined
    in :mod:`spotctl.core.sim_report` (how they add up: its docstring); this only writes it out."""
    from rich.table import Table

    cost, dm, w = r["cost"], r["demand"], r["wait_seconds"]
    it, no, ins, rec = r["interruptions"], r["notices"], r["instances"], r.get("reconciler", {})
    cur = cost["currency"]
    arrived, servable, due = dm["arrived"], dm["servable"], no["due_in_window"]
    rows: list = [
        ("arrived (units)", str(arrived), f"pods and Slurm jobs; {dm['queued_at_start']} already queued at the start"),
        ("excluded (units)", _of(dm["excluded"], arrived, "arrived", dm["excluded_pct"]),
         f"not demand at the end: {dm['still_held']} still held, {dm['withdrawn']} withdrawn"),
        ("  by reason (units)", fmt.counts(dm["excluded_by_reason"]), "why they are not demand"),
        ("servable (units)", str(servable), "arrived − excluded = started + pending + abandoned"),
        ("  started (units)", _of(dm["started"], servable, "servable", dm["served_pct"]),
         f"{dm['completed']} completed, {dm['running']} running, {dm['requeued']} requeued (to run again)"),
        ("  pending (units)", _of(dm["pending"], servable, "servable", dm["pending_pct"]),
         "waiting at the end, never started"),
        ("  abandoned (units)", _of(dm["abandoned"], servable, "servable", dm["abandoned_pct"]),
         f"not started within {fmt.duration(dm['abandon_after_seconds'])} of submit: gone elsewhere"),
        ("wait to start (duration)",
         f"p50 {fmt.duration(w['p50'])}, p95 {fmt.duration(w['p95'])}, max {fmt.duration(w['max'])}",
         f"submit (or end of a hold) to first start; {dm['wait_samples']} starts"),
        _SECTION,
        ("interrupted runs (runs)", f"{it['requeued_units']} by a drain, {it['lost_units']} lost",
         "their units queued again; lost: the node went away"),
        ("nodes lost (nodes)", str(it["nodes_lost_without_notice"]), "taken by the provider with no hard notice"),
        ("hard notices (notices)", str(no["hard"]), "delete the node by a deadline ≥ 120s ahead"),
        ("  handled in time", _of(no["handled_before_deadline"], due, "due", no["handled_pct"]),
         "drained or deleted by then; due: deadline in the window"),
        ("  missed", str(no["missed"]), "work still running at the deadline"),
        ("  open at the end", str(no["open_at_end"]), "deadline after the window"),
        *([("  unscored", str(no["unscored"]), "the node was gone before its deadline")] if no["unscored"] else []),
        ("advisories (notices)", str(no["advisory"]), "reclaim risk rose (a surge; a reservation in 30m)"),
        ("calendar notices (notices)", str(no["calendar"]), "a reservation takes the node's host at a known time"),
        _SECTION,
        ("instances (nodes)",
         f"{ins['launched']} launched, {ins['deleted']} deleted, {ins['reclaimed']} reclaimed, {ins['live']} live",
         f"deleted: by spotctl; reclaimed: by the provider; {ins['launch_failures']} launches failed"),
        ("node time (node-hours)", f"{cost['node_hours_total']:.1f}", "spot nodes up, all pools"),
        (f"cost ({cur})", fmt.money(cost["total"]), "node time × the rate-card price in force"),
        (f"  by pool ({cur})", ", ".join(f"{p} {fmt.money(v)}" for p, v in cost["by_pool"].items()), ""),
    ]
    if rec:
        audit = rec["audit"]
        rows += [
            _SECTION,
            ("reconciler passes", f"{rec['passes']}, one every {fmt.duration(rec['interval_s'])}",
             f"by outcome: {fmt.counts(rec['pass_status'])}"),
            ("actions (steps)", fmt.counts(rec["actions"]),
             f"steps taken (launch: nodes); failed: {fmt.counts(rec['failed_actions'])}"),
            ("API tokens (tokens)", str(rec["tokens_used"]), "mutating cloud calls, from the token budget"),
            ("audit records (records)", f"{audit['records']}, hash chain {'ok' if audit['chain_ok'] else 'BROKEN'}",
             _outbox_note(rec)),
        ]
    if "wall_seconds" in r:
        rows.append(("wall time (s)", f"{r['wall_seconds']:g}", "real time the simulation took"))
    t = Table(title=f"Simulated {r['hours']:g} h of region {r['region']} (seed {r['seed']}): "
                    f"{fmt.ts(r['start'])} to {fmt.ts(r['end'])}", title_justify="left")
    t.add_column("figure (unit)", no_wrap=True)
    t.add_column("value", max_width=30)
    t.add_column("what it counts")
    for row in rows:
        if row is _SECTION:
            t.add_section()
        else:
            t.add_row(*row)
    console.print(t)


_SECTION = ("",)  # a rule between groups of rows


def _outbox_note(rec: dict) -> str:
    """What the simulation left in the outbox: queued (a simulation runs no relay), or nothing because the
    region configures no relay for any kind."""
    kinds = rec.get("outbox_kinds")
    if kinds == []:
        return "outbox: nothing queued (no relay configured: the region has no kafka or audit section)"
    return f"{rec['outbox_rows']} events and records queued in the outbox for {', '.join(kinds or ['the relays'])}"

