"""spotctl plan"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state
from .fmt import NONE, counts, money, text, ts

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def plan(
    ctx: typer.Context,
    explain: Annotated[bool, typer.Option("--explain", help=(
        "Also show the pools and the planner's reasons: why units were or were not placed, why nodes are "
        "advised, where the calendar takes capacity back."))] = False,
    history: Annotated[bool, typer.Option("--history", help="List the plans recent passes executed (newest first).")] = False,
    replay: Annotated[Optional[int], typer.Option(
        "--replay", metavar="SEQ", help="Re-plan from the inputs recorded with plan SEQ (see --history) and compare "
        "the action list with the one recorded: exit 0 when they match, 1 when they differ, 7 when the plan was "
        "recorded without its action digest.")] = None,
) -> None:
    """Show what the next reconcile pass would do, and why. Changes nothing.

    Every executed plan is recorded with its full input (demand, headroom,
    calendars, rate card, budget); --replay re-runs the planner on it, so a
    past decision can be explained and is shown to be reproducible.

    --explain adds the pools (price, score, room, calendar) and the planner's
    reasons: why demand was or was not placed (the first 100 classes of
    demand left unplaced one by one, the rest in one line; the plan's
    "unplaced" counts every unit by reason), why nodes are advised (cordoned:
    no new work), where the calendar takes capacity back.

    Exit 7 (partial) when a source — the cloud, the contract feed (rate card,
    notices), a scheduler — could not be read within the observe deadline: the
    plan is then made without it, and says which. The same rule as `status`
    and `reconcile`. Exit 4 when a source refused our credentials.

    Example: spotctl plan --explain
    """
    st = state(ctx)
    from spotctl.ops import plan as ops

    if history:
        rows = ops.history(st.runtime())
        render.emit(st.fmt(), "plan", {"history": rows}, table=_history_table)
        return
    if replay is not None:
        r = ops.replay(st.runtime(), replay)
        data = {**{k: v for k, v in r.items() if k != "plan"}, **r["plan"].to_dict(explain=explain)}
        # reproduced: true (the action lists match), false (they differ: exit 1), null (nothing
        # recorded to compare: exit 7, never a pass by default)
        status, code = {True: (render.ResultStatus.OK, ExitCode.OK),
                        False: (render.ResultStatus.MISMATCH, ExitCode.UNEXPECTED)}.get(
            r["reproduced"], (render.ResultStatus.UNKNOWN, ExitCode.PARTIAL))
        render.emit(st.fmt(), "plan", data, status=status, exit_code=code, table=lambda c, d: _table(c, d, explain))
        if code != ExitCode.OK:
            render.error(f"replay of plan #{r['seq']}: {r['why']}")
            raise typer.Exit(int(code))
        return
    result, degraded, auth_failed = ops.show_plan(st.runtime())
    data = result.to_dict(explain=explain)
    data["degraded"] = degraded
    # a source not read (down, or past the observe deadline) makes the plan partial, as it makes a pass
    code = ExitCode.AUTH if auth_failed else ExitCode.PARTIAL if degraded else ExitCode.OK
    errors = [{"code": "auth", "message": f"{s}: {degraded[s]}"} for s in auth_failed]
    errors += [{"code": "partial", "message": f"{s}: {why}"} for s, why in degraded.items() if s not in auth_failed]
    status = (render.ResultStatus.AUTH_FAILED if auth_failed else render.ResultStatus.PARTIAL if degraded
              else render.ResultStatus.OK)
    render.emit(st.fmt(), "plan", data, status=status, exit_code=code, errors=errors,
                table=lambda c, d: _table(c, d, explain))
    for e in errors:
        if e["code"] == "auth":
            render.error(e["message"])
    if code != ExitCode.OK:
        raise typer.Exit(int(code))


def _history_table(console, d: dict) -> None:
    from rich.table import Table

    t = Table(title="Executed plans (newest first)", title_justify="left")
    for col in ("seq", "plan", "at", "actor", "actions", "launches\n(nodes)"):
        t.add_column(col)
    for r in d["history"]:
        t.add_row(str(r["seq"]), r["plan_id"], ts(r["at"]), r["actor"], text(r["actions"]), text(r["launches"]))
    console.print(t)


def _table(console, d: dict, explain: bool) -> None:
    from rich.table import Table

    currency = d["inputs"].get("currency") or NONE
    title = f"Plan {d['id']} for region {d['region']} at {ts(d['now'])}"
    if "reproduced" in d:
        title += f" — replay of #{d['seq']}: " + {True: "reproduced exactly (action lists match)",
                                                  False: "DIFFERS from the recorded action list"}.get(
            d["reproduced"], "cannot be checked (no action digest recorded)")
    t = Table(title=title, title_justify="left")
    for col in ("#", "kind", "pool", "node", "count\n(nodes)", "priority", "reason"):
        t.add_column(col, overflow="fold")
    for i, a in enumerate(d["actions"], 1):
        t.add_row(str(i), a["kind"], a.get("pool") or NONE, a.get("node") or NONE, text(a.get("count")),
                  a["priority"], a["reason"])
    if not d["actions"]:
        t.add_row(NONE, "none", NONE, NONE, NONE, NONE, "nothing to do")
    console.print(t)
    dm = d["demand"]
    console.print(f"demand: {dm['pending']} pending units ({counts(dm['by_scheduler'])}): "
                  f"{dm['covered_by_existing_nodes']} fit our nodes' free room, {dm['placed_on_new_nodes']} on new "
                  f"nodes, {dm['unplaced']} unplaced; {dm['excluded']} excluded (not for spot, or not ready)")
    for reason, n in d["unplaced"].items():
        console.print(f"  unplaced ×{n}: {reason}")
    inp = d["inputs"]
    console.print(f"inputs: rate card {inp['rate_card_version'] or 'unavailable'}"
                  + (f" (prices in {currency})" if inp["rate_card_version"] else "")
                  + f", calendar {inp['calendar_id']}, token budget {inp['budget_tokens']:g} tokens")
    if d.get("degraded"):
        for src, msg in d["degraded"].items():
            console.print(f"[yellow]not read[/yellow] {src}: {msg} (the plan is made without it)")
    if explain:
        p = Table(title="Pools (cheapest and least risky first; `spotctl status` shows their kind and class)",
                  title_justify="left")
        for col in ("pool", f"price\n({currency}/node-h)", f"score\n({currency}/vCPU-h)", "fit now\n(nodes)",
                    "ours/limit\n(nodes)", "policy", "next capacity drop\n(calendar: spot capacity, nodes)"):
            p.add_column(col, overflow="fold")
        for pool in sorted(d["pools"], key=lambda x: (x["score"] is None, x["score"] or 0, x["name"])):
            p.add_row(pool["name"], money(pool["price"]), money(pool["score"]), str(pool["headroom"]),
                      f"{pool['nodes']}/{pool['max_nodes']}", "no-notice" if pool.get("no_notice") else "normal",
                      _drop(pool["calendar_next_drop"]))
        console.print(p)
        console.print("  score: price per vCPU-hour × (1 + 0.25 per advisory and per reclaim in the last hour)\n"
                      "  fit now: new nodes of the pool's shape that fit on its hosts now, host by host\n"
                      "  ours/limit: our nodes in the pool (leaving ones too) / the pool's max_nodes\n"
                      "  policy: no-notice where a provider contract term is not met (`spotctl contract check`)\n"
                      "  next capacity drop: when the forward calendar next lowers the pool's spot capacity (ours\n"
                      "  included) as a reservation starts on some of its hosts, and from how many nodes to how many")
        from rich.padding import Padding

        for line in d.get("explain", []):  # indented, wrapped lines too
            console.print(Padding(line, (0, 0, 0, 2)))
        for reason, n in d["demand"]["excluded_reasons"].items():
            console.print(f"  excluded ×{n}: {reason}")


def _drop(nxt: dict | None) -> str:
    """The calendar's next drop: ``2026-12-02 01:58:40Z: 81 → 62``."""
    if not nxt:
        return NONE
    before = nxt.get("capacity_before")
    return f"{ts(nxt['at'])}: " + (f"{before} → " if before is not None else "→ ") + str(nxt["capacity"])
