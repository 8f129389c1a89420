"""spotctl exercise-reclaim"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from . import fmt, render
from .context import state
from .options import MAX_REASON, complete_pool, finite, text
from .waiting import WAIT_DEFAULT, wait_option

app = typer.Typer(rich_markup_mode=None, add_completion=False)
# no help= here: the callback's docstring is the command's help (and man page), guardrails and examples
drill_app = typer.Typer(rich_markup_mode=None, add_completion=False, invoke_without_command=True, no_args_is_help=False)
app.add_typer(drill_app, name="exercise-reclaim")

WAIT_READY_DEFAULT = 300.0


@drill_app.callback()
def exercise_reclaim(
    ctx: typer.Context,
    pool: Annotated[Optional[str], typer.Option(
        "--pool", "-p", autocompletion=complete_pool,
        help="Pool to drill (see `spotctl status`); default: the pool with the most live nodes.")] = None,
    count: Annotated[Optional[int], typer.Option(
        "--count", "-n", min=1, max=10_000, help="Number of nodes to reclaim.")] = None,
    percent: Annotated[Optional[float], typer.Option(
        "--percent", callback=finite(gt=0, hi=100),
        help="Share of the pool's live nodes to reclaim, in percent (rounded down, at least 1 node).")] = None,
    notice: Annotated[int, typer.Option(
        "--notice", min=120, max=86400,
        help="Hard-notice lead in seconds: from the notice to the deletion (120-86400; 120 is the contract's "
             "minimum).")] = 120,
    advisory_lead: Annotated[int, typer.Option(
        "--advisory-lead", min=0, max=7 * 86400,
        help="Send an advisory this many seconds before the hard notice (0: none).")] = 0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run",
        help="Show the victims and the guardrails; reclaim nothing, run no pass, wait for nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", callback=finite(gt=0, hi=3600), help="Seconds between the drill's reconcile passes.")] = 2.0,
    wait: Annotated[float, wait_option("the drill ends aborted")] = WAIT_DEFAULT,
    wait_ready: Annotated[float, typer.Option(
        "--wait-ready", metavar="SECONDS", callback=finite(lo=0, hi=3600),
        help="When the pool has too few active nodes yet but enough are booting to be active within SECONDS "
             "(0-3600; 0: do not wait), wait for them first, running a reconcile pass when they are due.")
    ] = WAIT_READY_DEFAULT,
) -> None:
    """Rehearse the provider's reclaim on live spot nodes, and score it.

    Picks COUNT (or PERCENT of the) active nodes of POOL (without --pool: the pool with the most live
    nodes), asks the provider's reclaim API to reclaim them in up to three waves, handles the notices as the reconciler does in production (drain in Kubernetes
    and Slurm, replacement capacity elsewhere, delete by the deadline), and scores each victim: notice
    delivered within 1 s, a lead of at least 120 s, drained before the deadline, no running work lost,
    capacity returned by the deadline, and the time until its replacement is active. It runs until every
    victim is gone (drained and deleted, by its notice's deadline at the latest) and every replacement
    launched for it is active (or past its pool's boot time): on the demo region about 2 minutes, most of
    it a replacement VM's 90 s boot.

    Guardrails. At most policy.drill_max_pool_pct percent of the pool's live nodes (25 by default; more is
    refused, exit 6). Victims are active nodes without a notice; when too few are active yet but enough are
    booting, it waits for them (--wait-ready, default 300 s), else it refuses and says when they will be
    ready. The notice lead is at least the contract's 120 s. One drill at a time per region: a running
    drill refuses the next. Each wave's reclaim calls take tokens of the "drill" class from the region's
    budget, and the region lock (--wait). No further wave is sent once demand served drops below
    policy.drill_min_served_pct percent or a notice reaches us with less than 120 s left. Asks for
    confirmation unless --yes.

    Stopping. Ctrl-C (or SIGTERM) ends the drill aborted, with its partial score, audited; the notices
    already sent stand, and the reconciler handles them. `exercise-reclaim abort DRILL` ends a drill whose
    process died the same way and frees the region for the next drill. Sub-commands: list, status DRILL,
    report DRILL, abort DRILL.

    Example: spotctl exercise-reclaim --pool gp-rsv-az2 --count 4 --yes

    Example, one node of the pool with the most nodes (right after `make demo`): spotctl exercise-reclaim
    --count 1 --yes

    Example, a preview (the victims and the policy's cap; nothing is reclaimed):
    spotctl exercise-reclaim --pool gp-rsv-az2 --count 2 --dry-run

    Example, an advisory 5 minutes before each hard notice, on 10 percent of a pool:
    spotctl exercise-reclaim --pool gp-az1 --percent 10 --advisory-lead 300 --yes

    Example, the score for a script: spotctl exercise-reclaim report DRILL -o json | jq .data.score
    """
    if ctx.invoked_subcommand:
        return
    st = state(ctx)
    if pool is None and count is None and percent is None:
        raise typer.BadParameter("give --count or --percent to start a drill (and --pool, else the pool with "
                                 "the most live nodes); or use: list, status, report", param_hint="--count")
    from spotctl.core.errors import RefusedError
    from spotctl.ops import drill as ops

    from .drill_live import DrillDisplay

    rt = st.runtime()
    if pool is None:
        pool = ops.busiest_pool(rt)
        typer.echo(f"spotctl: drilling pool {pool}, the one with the most live nodes (no --pool given)", err=True)
    if dry_run:
        sel = ops.select(rt, pool, count, percent, notice, advisory_lead)
        render.emit(st.fmt(), "exercise-reclaim", {"dry_run": True, **sel}, table=_selection_table)
        return
    import time

    def tick() -> None:
        time.sleep(interval)

    with DrillDisplay(st, rt) as show:
        sel = ops.select_when_ready(rt, pool, count, percent, notice, advisory_lead, wait_ready=wait_ready,
                                    tick=tick, progress=show.booting)
        if not yes:
            if not sys.stdin.isatty():
                raise RefusedError("refusing to reclaim live nodes without confirmation", hint="add --yes")
            with show.paused():  # the question has the terminal to itself
                typer.confirm(f"Reclaim {len(sel['victims'])} node(s) of pool {pool} now?", abort=True, err=True)
        d = ops.start(rt, sel)
        show.started(d, len(sel["victims"]))
        rep = ops.run(rt, d, tick=tick, progress=show.drill, wait=wait)
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


def _selection_table(console, d: dict) -> None:
    lead = d.get("advisory_lead_seconds") or 0
    console.print(f"dry run: would reclaim {len(d['victims'])} of the {d['pool_nodes']} live nodes of pool "
                  f"{d['pool']}, with a hard notice of {fmt.seconds(d['notice_seconds'])}"
                  + (f" after an advisory {fmt.seconds(lead)} ahead" if lead else "") + ".")
    console.print(f"{d['candidates']} are active without a notice; policy.drill_max_pool_pct allows "
                  f"{d['max_by_policy']} at most.")
    for v in d["victims"]:
        console.print(f"  {v['node']} (instance {v['instance_id']})")


def _list_table(console, d: dict) -> None:
    from rich.table import Table

    t = Table(title="Drills, newest first", title_justify="left")
    for col in ("id", "pool", "status", "victims", "started (UTC)", "finished (UTC)"):
        t.add_column(col, no_wrap=col == "id")
    for r in d["drills"]:
        t.add_row(r["id"], r["pool"], r["status"], str(r["victims"]), fmt.ts(r["started_at"]),
                  fmt.ts(r.get("finished_at")))
    console.print(t)


def _status_table(console, d: dict) -> None:
    console.print(f"drill {d['id']} on pool {d['pool']}: {d['status']}, wave {d['issued']} of {d['waves']} sent"
                  + (f" ({d['abort_reason']})" if d["abort_reason"] else ""))
    for node, s in d["victims"].items():
        console.print(f"  {node}: {s}")
    for r in d.get("replacements", ()):
        console.print(f"  replacement {r['node']} in pool {r['pool']} for {r['replaces']}: {r['state']}")


CHECK_LABELS = {"delivery_latency": "notice delivered", "notice_lead": "notice lead",
                "drained_before_deadline": "drained in time", "jobs_lost": "no work lost",
                "capacity_returned": "capacity returned"}
RESULT_LABELS = {"met": "met", "missed": "MISSED", "unchecked": "not exercised"}
OPS = {"<=": "≤", ">=": "≥", "==": "="}


def _observed(c: dict) -> str:
    """A check's observed value, in words (+N: seconds after the reclaim call)."""
    v, name = c["observed"], c["name"]
    if v is None or name == "jobs_lost":
        return c["note"]
    return {"delivery_latency": f"{fmt.seconds(v)} from issue to delivery",
            "notice_lead": f"{fmt.seconds(v)} from issue to deadline",
            "drained_before_deadline": f"drain accepted at +{fmt.seconds(v)}",
            "capacity_returned": f"deleting at +{fmt.seconds(v)}, gone at +{fmt.seconds(c['gone_after_s'])}"
            if c.get("gone_after_s") is not None else f"deleting at +{fmt.seconds(v)}, {c['note']}",
            }.get(name, fmt.text(v))


def _threshold(c: dict) -> str:
    if c["name"] == "jobs_lost":
        return "0 lost"
    if c["name"] in ("drained_before_deadline", "capacity_returned"):
        return f"{OPS.get(c['op'], c['op'])} +{fmt.seconds(c['threshold'])} (deadline)"
    return f"{OPS.get(c['op'], c['op'])} {fmt.seconds(c['threshold'])}"


def _replacement(v: dict) -> str:
    """The victim's replacement: the node launched for its work, and when it became active."""
    reps = v.get("replacements") or []
    if not reps:
        return "none launched" if v.get("jobs_requeued") or v.get("jobs_lost") else "none needed"
    return "; ".join(f"{r['node']} active at +{fmt.seconds(r['active_after_s'])}" if r["active_after_s"] is not None
                     else f"{r['node']}, {r['state']} (due {fmt.ts(r['expected_active_at'])})" for r in reps)


def _report_table(console, r: dict) -> None:
    from rich.table import Table

    victims = r["victims"]
    score = "no check was exercised" if r["score"] is None else \
        f"score {fmt.pct(r['score'])}, {r['passed']} of {r['checks']} checks met"
    console.print(f"Drill {r['id']} on pool {r['pool']} (region {r['region']}): {r['status']}, {score}")
    took = None if r["finished_at"] is None else r["finished_at"] - r["started_at"]
    lead = r.get("advisory_lead_seconds") or 0
    n, waves = len(victims), r.get("waves", 1)
    console.print(f"{n} victim{'s' if n != 1 else ''} in {waves} wave{'s' if waves != 1 else ''}; "
                  f"hard notice {fmt.seconds(r['notice_seconds'])}"
                  + (f", after an advisory {fmt.seconds(lead)} ahead" if lead else "")
                  + f"; started {fmt.ts(r['started_at'])}, "
                  + ("still running" if took is None else f"took {fmt.duration(took)}"))
    if r["abort_reason"]:
        console.print(f"stopped early: {r['abort_reason']}")
    width = max([len(v["node"]) for v in victims] + [4])
    console.print()
    t = Table(title="Victims (+N: seconds after its reclaim call)", title_justify="left")
    t.add_column("node", no_wrap=True, min_width=width)
    t.add_column("state")
    t.add_column("notice left (s)", justify="right")
    t.add_column("work on it (jobs)")
    t.add_column("replacement")
    for v in victims:
        if "reclaim_error" in v:
            t.add_row(v["node"], "not reclaimed", "-", "-", f"the provider refused: {v['reclaim_error']}")
        elif "skipped" in v:
            t.add_row(v["node"], "not reclaimed", "-", "-", v["skipped"])
        else:
            work = "-" if "jobs_lost" in v["unchecked"] else f"{v['jobs_requeued']} requeued, {v['jobs_lost']} lost"
            t.add_row(v["node"], v["final_state"] or "-", fmt.text(v["left_at_receipt_s"]), work, _replacement(v))
    console.print(t)
    console.print("state: the victim's state now. notice left: time to the notice's deadline when spotctl first "
                  "saw it.")
    console.print("replacement: the node launched for the work that ran there (none launched: the work fit on "
                  "nodes already up).")
    t = Table(title="Checks (+N: seconds after the victim's reclaim call)", title_justify="left")
    t.add_column("node", no_wrap=True, min_width=width)
    t.add_column("check", no_wrap=True)
    t.add_column("observed")
    t.add_column("threshold")
    t.add_column("result", no_wrap=True)
    for v in victims:
        rows = v.get("checks") or []
        if "reclaim_error" in v:
            t.add_row(v["node"], "reclaim accepted", v["reclaim_error"], "accepted", RESULT_LABELS["missed"],
                      end_section=True)
            continue
        for i, c in enumerate(rows):
            t.add_row(v["node"] if i == 0 else "", CHECK_LABELS.get(c["name"], c["name"]), _observed(c), _threshold(c),
                      RESULT_LABELS.get(c["result"], c["result"]), end_section=i == len(rows) - 1)
    if t.row_count:
        console.print()
        console.print(t)
        console.print("The score counts the checks met or missed (not exercised: nothing tested it). gone: deleted, "
                      "its allocations freed.")
