"""spotctl contract check"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)
contract_app = typer.Typer(rich_markup_mode=None, add_completion=False, help="The provider contract: is every term met, per pool?", no_args_is_help=True)
app.add_typer(contract_app, name="contract")


@contract_app.callback()
def contract_group() -> None:
    """The provider contract: is every term met, per pool?"""


@contract_app.command("check")
def check(
    ctx: typer.Context,
    pool: Annotated[Optional[str], typer.Option("--pool", "-p", help="Only this pool.")] = None,
) -> None:
    """Evaluate the five contract terms per pool — met, degraded or missing — with evidence.

    Terms: hard notice >= 120 s ahead and delivered in <= 1 s; advisories
    before reclaims; a rate card per pool every 5 minutes; reservation data;
    a reachable reclaim API. A pool with any term not met runs under the
    no-notice policy; the reconcile pass records each flip in the audit log.
    Exit 0 when every term is met, 7 otherwise.

    Example: spotctl contract check -o json | jq '.data.pools[] | .failing'
    """
    st = state(ctx)
    from spotctl.ops.contract import check as run_check

    report = run_check(st.runtime(), pool)
    code = ExitCode.OK if report["met"] else ExitCode.PARTIAL
    status = render.ResultStatus.MET if report["met"] else render.ResultStatus.DEGRADED
    render.emit(st.fmt(), "contract check", report, status=status, exit_code=code, table=_table)
    if code:
        raise typer.Exit(int(code))


def _table(console, d: dict) -> None:
    from rich.table import Table

    t = Table(title=f"Provider contract, region {d['region']} at {render.ts(d['now'])}", title_justify="left")
    for col in ("pool", "notice", "advisory", "rate card", "reservations", "reclaim API", "pool state"):
        t.add_column(col)
    for name, p in d["pools"].items():
        terms = p["terms"]
        t.add_row(name, *[terms[k]["state"] for k in ("notice", "advisory", "rate_card", "reservations", "reclaim_api")],
                  p["state"] + (" (no-notice policy)" if p["state"] != "met" else ""))
    console.print(t)
    for name, p in d["pools"].items():
        for k in p["failing"]:
            console.print(f"  {name} {k}: {p['terms'][k]['evidence']}")
