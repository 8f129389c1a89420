"""spotctl exercise-reclaim"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from . import render
from .context import state
from .options import MAX_REASON, finite, text
from .waiting import WAIT_DEFAULT, wait_option

app = typer.Typer(rich_markup_mode=None, add_completion=False)
drill_app = typer.Typer(rich_markup_mode=None, add_completion=False, invoke_without_command=True, no_args_is_help=False,
                        help="Rehearse the provider's reclaim on live spot nodes, and score it.")
app.add_typer(drill_app, name="exercise-reclaim")


@drill_app.callback()
def exercise_reclaim(
    ctx: typer.Context,
    pool: Annotated[Optional[str], typer.Option("--pool", "-p", help="Pool to drill.")] = None,
    count: Annotated[Optional[int], typer.Option(
        "--count", "-n", min=1, max=10_000, help="Number of nodes to reclaim.")] = None,
    percent: Annotated[Optional[float], typer.Option(
        "--percent", callback=finite(gt=0, hi=100), help="Share of the pool's nodes to reclaim.")] = None,
    notice: Annotated[int, typer.Option(
        "--notice", min=120, max=86400, help="Hard-notice lead in seconds (120-86400, the API's range).")] = 120,
    advisory_lead: Annotated[int, typer.Option(
        "--advisory-lead", min=0, max=7 * 86400, help="Advisory this many seconds before the notice.")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the victims and the guardrails; reclaim nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", callback=finite(gt=0, hi=3600), help="Seconds between the drill's reconcile passes.")] = 2.0,
    wait: Annotated[float, wait_option("the drill ends aborted")] = WAIT_DEFAULT,
) -> None:
    """Reclaim some spot nodes of a pool through the provider's reclaim API, handle it, and score it.

    Guardrails: at most policy.drill_max_pool_pct of the pool, one drill per
    region at a time, budgeted API calls (drill class), waves that stop when
    demand served drops or a notice arrives late. Asks for confirmation unless
    --yes. Each wave's reclaim waits for the region lock while a pass holds it
    (--wait, default 30 s). Sub-commands: list, status DRILL, report DRILL,
    abort DRILL.

    Example: spotctl exercise-reclaim --pool gp-rsv-az2 --count 2 --yes
    """
    if ctx.invoked_subcommand:
        return
    st = state(ctx)
    if pool is None:
        raise typer.BadParameter("--pool is required to start a drill (or use: list, status, report)",
                                 param_hint="--pool")
    from spotctl.core.errors import RefusedError
    from spotctl.ops import drill as ops

    rt = st.runtime()
    sel = ops.select(rt, pool, count, percent, notice, advisory_lead)
    if dry_run:
        render.emit(st.fmt(), "exercise-reclaim", {"dry_run": True, **sel}, table=_selection_table)
        return
    if not yes:
        if not sys.stdin.isatty():
            raise RefusedError("refusing to reclaim live nodes without confirmation", hint="add --yes")
        typer.confirm(f"Reclaim {len(sel['victims'])} node(s) of pool {pool} now?", abort=True, err=True)
    d = ops.start(rt, sel)
    st.progress(f"drill {d['id']} started: {len(sel['victims'])} victim(s) in {len(d['waves'])} wave(s)")
    show = _Progress(st)
    import time

    rep = ops.run(rt, d, tick=lambda: time.sleep(interval), progress=show, wait=wait)
    show.done()
    render.emit(st.fmt(), "exercise-reclaim", rep, table=_report_table)


@drill_app.command("list")
def list_drills(ctx: typer.Context) -> None:
    """List the region's drills, newest first.

    Example: spotctl exercise-reclaim list
    """
    st = state(ctx)
    from spotctl.ops import drill as ops

    rows = ops.drills(st.runtime())
    render.emit(st.fmt(), "exercise-reclaim list", {"drills": rows}, table=_list_table)


@drill_app.command("status")
def drill_status(ctx: typer.Context, drill_id: Annotated[str, typer.Argument(help="Drill id.")]) -> None:
    """Where a drill stands: waves issued, each victim's state.

    Example: spotctl exercise-reclaim status drill-1a2b3c4d5e
    """
    st = state(ctx)
    from spotctl.ops import drill as ops

    render.emit(st.fmt(), "exercise-reclaim status", ops.status(st.runtime(), drill_id), table=_status_table)


@drill_app.command("abort")
def drill_abort(ctx: typer.Context, drill_id: Annotated[str, typer.Argument(help="Drill id.")],
                reason: Annotated[Optional[str], typer.Option(
                    "--reason", callback=text(MAX_REASON), help="Why (audited).")] = None) -> None:
    """End a drill whose process died: it is marked aborted with its partial score, audited, and the
    region takes a new drill again. Refused while the drill's process still runs on this host (Ctrl-C it:
    it then ends aborted by itself).

    Example: spotctl exercise-reclaim abort drill-1a2b3c4d5e
    """
    st = state(ctx)
    from spotctl.ops import drill as ops

    render.emit(st.fmt(), "exercise-reclaim abort", ops.abort(st.runtime(), drill_id, reason), table=_report_table)


@drill_app.command("report")
def drill_report(ctx: typer.Context, drill_id: Annotated[str, typer.Argument(help="Drill id.")]) -> None:
    """Score a drill: notices delivered and their latency, time left at receipt, drains before the deadline,
    jobs requeued vs lost, time to replacement, capacity returned by the deadline.

    Example: spotctl exercise-reclaim report drill-1a2b3c4d5e -o json
    """
    st = state(ctx)
    from spotctl.ops import drill as ops

    render.emit(st.fmt(), "exercise-reclaim report", ops.report(st.runtime(), drill_id), table=_report_table)


class _Progress:
    """Live progress on stderr: one updating line on a terminal, a line per change otherwise."""

    def __init__(self, st):
        self.st, self.tty, self.last = st, sys.stderr.isatty(), None

    def __call__(self, s: dict) -> None:
        if self.st.quiet:
            return
        counts: dict[str, int] = {}
        for v in s["victims"].values():
            counts[v] = counts.get(v, 0) + 1
        line = (f"drill {s['id']}: wave {s['issued']}/{s['waves']}, "
                + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
                + (f" — stopping: {s['abort_reason']}" if s["abort_reason"] else ""))
        if self.tty:
            sys.stderr.write("\r" + line + "   ")
            sys.stderr.flush()
        elif line != self.last:
            self.st.progress(line)
        self.last = line

    def done(self) -> None:
        if self.tty and self.last and not self.st.quiet:
            sys.stderr.write("\n")


def _selection_table(console, d: dict) -> None:
    console.print(f"dry run: would reclaim {len(d['victims'])} of {d['pool_nodes']} nodes in {d['pool']} "
                  f"(policy allows {d['max_by_policy']}), notice {d['notice_seconds']} s")
    for v in d["victims"]:
        console.print(f"  {v['node']} ({v['instance_id']})")


def _list_table(console, d: dict) -> None:
    from rich.table import Table

    t = Table(title="Drills", title_justify="left")
    for col in ("id", "pool", "status", "victims", "started"):
        t.add_column(col)
    for r in d["drills"]:
        t.add_row(r["id"], r["pool"], r["status"], str(r["victims"]), render.ts(r["started_at"]))
    console.print(t)


def _status_table(console, d: dict) -> None:
    console.print(f"drill {d['id']} in {d['pool']}: {d['status']}, wave {d['issued']}/{d['waves']}"
                  + (f" ({d['abort_reason']})" if d["abort_reason"] else ""))
    for node, s in d["victims"].items():
        console.print(f"  {node}: {s}")


def _report_table(console, r: dict) -> None:
    from rich.table import Table

    t = Table(title=f"Drill {r['id']} in {r['pool']}: {r['status']}, score {r['score']}% "
                    f"({r['passed']}/{r['checks']} checks)", title_justify="left")
    for col in ("node", "delivery", "lead", "left at receipt", "drained in time", "requeued", "lost", "replacement",
                "capacity back", "state"):
        t.add_column(col)
    for v in r["victims"]:
        if "skipped" in v:
            t.add_row(v["node"], v["skipped"], "", "", "", "", "", "", "", "")
            continue
        t.add_row(v["node"], "-" if v["delivery_latency_s"] is None else f"{v['delivery_latency_s']} s",
                  "-" if v["notice_lead_s"] is None else f"{v['notice_lead_s']} s",
                  "-" if v["left_at_receipt_s"] is None else f"{v['left_at_receipt_s']} s",
                  "yes" if v["drained_before_deadline"] else "NO", str(v["jobs_requeued"]), str(v["jobs_lost"]),
                  "-" if v["time_to_replacement_s"] is None else f"{v['time_to_replacement_s']} s",
                  "yes" if v["capacity_returned_by_deadline"] else "NO", v["final_state"] or "-")
    console.print(t)
    if r["abort_reason"]:
        console.print(f"stopped early: {r['abort_reason']}")
