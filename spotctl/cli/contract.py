"""spotctl contract check"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from spotctl.core.errors import ExitCode

from . import fmt, render
from .context import state
from .options import complete_pool

app = typer.Typer(rich_markup_mode=None, add_completion=False)
contract_app = typer.Typer(rich_markup_mode=None, add_completion=False, help="The provider contract: is each of its five terms met, per pool?", no_args_is_help=True)
app.add_typer(contract_app, name="contract")


@contract_app.callback()
def contract_group() -> None:
    """The provider contract: is each of its five terms met, per pool?"""


@contract_app.command("check")
def check(
    ctx: typer.Context,
    pool: Annotated[Optional[str], typer.Option(
        "--pool", "-p", autocompletion=complete_pool, help="Only this pool.")] = None,
) -> None:
    """Check the provider contract's five terms per pool: met, degraded, missing or unknown, with evidence.

    The terms, one column each: notice (hard notices come >= 120 s before
    deletion and reach the node in <= 1 s; unknown, "no evidence yet", while
    no hard notice came in the last 24 h); advisory (hard notices come after an
    advisory); rate card (a price per pool, refreshed every 5 minutes);
    reservations (reservation data, Blazar, is read); reclaim API (the
    provider's reclaim API answers its status call). A term is met only on
    evidence observed now.

    A pool with a term not met runs under the no-notice policy (pool state
    degraded), unless the only one is a notice term with no evidence yet (pool
    state unknown, normal policy); the reconcile pass records each flip in the
    audit log. Exit 0 when every term of every pool is met, 7 otherwise.

    Example: spotctl contract check -o json | jq '.data.pools | map_values(.failing)'
    """
    st = state(ctx)
    from spotctl.ops.contract import check as run_check

    report = run_check(st.runtime(), pool)
    code = ExitCode.OK if report["met"] else ExitCode.PARTIAL
    states = {p["state"] for p in report["pools"].values()}
    status = render.ResultStatus.MET if report["met"] else (
        render.ResultStatus.DEGRADED if "degraded" in states else render.ResultStatus.UNKNOWN)
    render.emit(st.fmt(), "contract check", report, status=status, exit_code=code, table=_table)
    if code:
        raise typer.Exit(int(code))


#: term -> its column header
COLUMNS = {"notice": "notice", "advisory": "advisory", "rate_card": "rate card", "reservations": "reservations",
           "reclaim_api": "reclaim API"}


def _table(console, d: dict) -> None:
    import textwrap

    from rich.table import Table

    t = Table(title=f"Provider contract terms, region {d['region']} at {render.ts(d['now'])}", title_justify="left")
    for col in ("pool", *COLUMNS.values(), "pool state", "policy"):
        t.add_column(col)
    for name, p in d["pools"].items():
        t.add_row(name, *[p["terms"][k]["state"] for k in COLUMNS], p["state"],
                  "no-notice" if p["state"] == "degraded" else "normal")
    console.print(t)
    # why each term is not met, one line for the pools that share a reason
    reasons: dict[tuple[str, str, str], list[str]] = {}
    for name, p in d["pools"].items():
        for k in p["failing"]:
            term = p["terms"][k]
            reasons.setdefault((k, term["state"], _why(k, term)), []).append(name)
    for (k, st, why), pools in reasons.items():
        console.print(f"{COLUMNS.get(k, k)} {st} in {fmt.items(pools)}:")
        console.print(textwrap.fill(why, width=max(40, console.width), initial_indent="  ", subsequent_indent="  "))


def _why(key: str, term: dict) -> str:
    """Why a term is not met, in words, from its evidence."""
    ev = term.get("evidence") or {}
    if ev.get("error"):
        return str(ev["error"])
    if key == "notice" and ev.get("last_late"):
        last = ev["last_late"]
        out = f"late hard notice {last.get('id')} ({fmt.items(last.get('why'))})"
        rule = ev.get("restore_rule") or {}
        if "on_time_since" in ev and rule:
            out += (f"; {ev['on_time_since']} on time since: {rule.get('on_time_in_a_row')} in a row and "
                    f"{fmt.duration(rule.get('hold_seconds'))} without a late one restore it")
        return out
    if key == "advisory" and "hard_without_advisory" in ev:
        return f"{ev['hard_without_advisory']} hard notice(s) came without an advisory (more than half)"
    if key == "rate_card" and "age_s" in ev:
        return (f"rate card {ev.get('version')} is {fmt.duration(ev['age_s'])} old (refreshed every 5 min), "
                f"valid until {fmt.ts(ev.get('valid_until'))}")
    if "recorded" in ev:
        return f"as recorded ({ev['recorded']})"
    return fmt.text(ev)
