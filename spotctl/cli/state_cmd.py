"""spotctl state prune | check"""

from __future__ import annotations

from typing import Annotated

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state
from .waiting import WAIT_DEFAULT, wait_option

state_app = typer.Typer(rich_markup_mode=None, add_completion=False, name="state", no_args_is_help=True,
                        help="""The region's state database: prune what its retention lets go, check it whole.

What each table keeps, and for how long, is set in [regions.R.retention]
(docs/operator-guide.md). Every pass also prunes, within a small time budget.
Use the global --region to choose the region.""")


def _store(ctx: typer.Context):
    """The region's existing state database (NotFoundError, exit 5, when there is none), closed at the end."""
    from spotctl.state.store import Store
    from spotctl.wiring import state_path

    st = state(ctx)
    config = st.config()
    region = config.region(st.region)
    store = Store.open(state_path(config, region.name), region.name, create=False)
    st.cleanups.append(store.close)
    return st, region, store


@state_app.command()
def prune(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Say per table what would be deleted and why the rest is kept; delete nothing.")] = False,
    wait: Annotated[float, wait_option()] = WAIT_DEFAULT,
) -> None:
    """Delete the rows the region's retention policy lets go, a batch per transaction.

    Never a live node or anything of it, an intended or running action, an
    undelivered outbox row, a running pass, the newest plan, or an audit record
    the audit service has not acknowledged. Takes the region lock (waits for a
    pass up to --wait, then exit 6) and records one audit record with the
    counts. Progress goes to stderr. An audit record "started" (with the
    policy) comes before the first delete, and one with the counts after
    the last: result ok, or partial on Ctrl-C or SIGTERM, which stop it
    after the batch under way (exit 130 or 143). A prune killed half way,
    even with kill -9, loses nothing that should be kept: run it again to
    finish.

    Example: spotctl state prune --dry-run
    """
    import time

    st, region, store = _store(ctx)
    from spotctl.ops.prune import prune as do_prune
    from spotctl.ops.runtime import os_actor

    from .waiting import LockSpinner

    data = do_prune(store, region.retention, now=time.time(), actor=region.actor or os_actor(), dry_run=dry_run,
                    wait=wait, lock_wait=LockSpinner(st), progress=st.progress)
    stopped = data.get("interrupted")
    code = {"SIGINT": ExitCode.INTERRUPTED, "SIGTERM": ExitCode.TERMINATED}.get(stopped or "", ExitCode.OK)
    render.emit(st.fmt(), "state prune", data, status="dry-run" if dry_run else "partial" if stopped else "ok",
                exit_code=code, table=_prune_table)
    if code:
        render.error(f"state prune stopped by {stopped} after {data['deleted_total']} rows; run it again to finish")
        raise typer.Exit(int(code))


@state_app.command()
def check(ctx: typer.Context) -> None:
    """Check the whole state database: SQLite's integrity check and spotctl's own.

    Reads every page (slow on a large database; every command only checks
    the header, schema and version at open). Exit 0 when sound, 9 with the
    problems when not.

    Example: spotctl state check -o json
    """
    st, _, store = _store(ctx)
    from spotctl.ops.prune import check as do_check

    data = do_check(store)
    code = ExitCode.OK if data["ok"] else ExitCode.STATE
    render.emit(st.fmt(), "state check", data, status="ok" if data["ok"] else "failed", exit_code=code,
                table=_check_table)
    if code:
        problems = data["problems"]
        render.error(f"state database {data['path']}: {len(problems)} problem(s): {problems[0]}",
                     hint="restore it from a backup (see the operator guide's runbook)")
        raise typer.Exit(int(code))


def _prune_table(console, d: dict) -> None:
    from rich.table import Table

    if d["dry_run"]:
        t = Table(title=f"Prune of region {d['region']} (dry run: nothing deleted)", title_justify="left")
        for col in ("table", "retention", "rows", "eligible", "kept", "kept because"):
            t.add_column(col, overflow="fold")
        for r in d["tables"]:
            why = "; ".join(f"{k['rows']} {k['why']}" for k in r["kept_because"])
            extra = r.get("with_them", {}).get("transitions")
            eligible = f"{r['eligible']}" + (f" (+{extra} transitions)" if extra else "")
            t.add_row(r["table"], r["retention"], str(r["rows"]), eligible, str(r["kept"]), why or "-")
        console.print(t)
        return
    t = Table(title=f"Pruned region {d['region']}: {d['deleted_total']} rows in {d['duration_s']} s"
              + (f" (stopped by {d['interrupted']}: run it again to finish)" if d.get("interrupted") else ""),
              title_justify="left")
    for col in ("table", "retention", "deleted", "rows left"):
        t.add_column(col)
    for r in d["tables"]:
        t.add_row(r["table"], r["retention"], str(r["deleted"]), str(r["rows"]))
    console.print(t)


def _check_table(console, d: dict) -> None:
    if d["ok"]:
        console.print(f"ok: state database {d['path']} is sound")
        return
    console.print(f"state database {d['path']}: {len(d['problems'])} problem(s)")
    for p in d["problems"]:
        console.print(f"  {p}")
