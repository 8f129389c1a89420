"""spotctl launch"""

from __future__ import annotations

from typing import Annotated

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state
from .options import complete_pool
from .waiting import WAIT_DEFAULT, wait_option

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def launch(
    ctx: typer.Context,
    pool: Annotated[str, typer.Option(
        "--pool", "-p", autocompletion=complete_pool, help="Pool to launch in (see `spotctl status`).")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=500, help="Number of nodes (1-500).")] = 1,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check headroom, limits and budget; launch nothing.")] = False,
    wait: Annotated[float, wait_option()] = WAIT_DEFAULT,
) -> None:
    """Launch spot nodes in a pool now, as an operator action.

    Goes through the same token budget (operator class), intents, audit
    records and lifecycle events as the reconciler. Refused (exit 6) when the
    pool lacks headroom, is at its limit, or the budget cannot cover it.
    While a pass holds the region lock, waits for it (--wait, default 30 s).

    Example: spotctl launch --pool gp-az1 --count 2
    """
    st = state(ctx)
    from spotctl.ops.operator import launch as do_launch

    out, facts = do_launch(st.runtime(), pool, count, dry_run=dry_run, wait=wait)
    code = ExitCode.OK if out is None or out.status == "ok" else (
        ExitCode.PARTIAL if out.done else ExitCode.REFUSED)
    render.emit_operator_action(st.fmt(), "launch", facts, out, dry_run=dry_run, exit_code=code, table=_table)


def _table(console, d: dict) -> None:
    o = d["outcome"]
    if o is None:
        console.print(f"dry run: would launch {d['count']} in {d['pool']} "
                      f"(headroom {d['headroom']}, limit left {d['pool_limit_left']}, tokens {d['tokens_available']})")
        return
    console.print(f"launch {o['status']}: {o['launched']}/{o['count']} in {d['pool']}" +
                  (f" — {o['detail']}" if o["detail"] else ""))
    for n in o["nodes"]:
        console.print(f"  {n}")
