"""spotctl drain"""

from __future__ import annotations

from typing import Annotated

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state
from .options import MAX_REASON, complete_node, name, text
from .waiting import WAIT_DEFAULT, wait_option

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def drain(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(
        callback=name, autocompletion=complete_node, help="Node id (see `spotctl status`).")],
    reason: Annotated[str, typer.Option(
        "--reason", callback=text(MAX_REASON),
        help=f"Why: recorded in the audit log and shown to schedulers (at most {MAX_REASON} characters).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the node can be drained; change nothing.")] = False,
    wait: Annotated[float, wait_option()] = WAIT_DEFAULT,
) -> None:
    """Drain a spot node in every scheduler at once (cordon, requeue or evict its work).

    The reconciler deletes the node once it is empty (or the drain time is up).
    While a pass holds the region lock, waits for it (--wait, default 30 s).

    Example: spotctl drain spot-gp-az1-1a2b3c4d --reason "hypervisor maintenance"
    """
    st = state(ctx)
    from spotctl.ops.operator import drain as do_drain

    out, facts = do_drain(st.runtime(), node, reason, dry_run=dry_run, wait=wait)
    code = ExitCode.OK if out is None or out.status == "ok" else ExitCode.PARTIAL
    render.emit_operator_action(st.fmt(), "drain", facts, out, dry_run=dry_run, exit_code=code, table=_table)


def _table(console, d: dict) -> None:
    o = d["outcome"]
    if o is None:
        console.print(f"dry run: {d['node']} ({d['state']}) can be drained")
        return
    console.print(f"drain {o['status']}: {d['node']} in pool {d['pool']}" + (f" — {o['detail']}" if o["detail"] else ""))
