"""spotctl status"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state
from .fmt import NONE, counts, duration, money, shape_of, ts

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def status(
    ctx: typer.Context,
    list_nodes: Annotated[bool, typer.Option("--nodes", help="List every live node (id, state, host, why).")] = False,
    all_nodes: Annotated[bool, typer.Option("--all", help="List every node, those gone, failed or lost too "
                                                          "(implies --nodes).")] = False,
) -> None:
    """Show the region: per pool its price, room, our nodes by state and contract policy; why nodes are
    advised or leaving; the contract feed's health; the token budget; the last pass.

    Nodes are counted per pool and state; --nodes lists them one by one. JSON output
    (-o json) always carries the node list.

    Status reads the cloud's hosts and the contract feed's rate card now, and the rest
    from the state database (what the last pass recorded). Exit 7 (partial) when the
    answer is partial: the cloud or the rate card cannot be read now, or the last pass
    could not read the contract feed (rate card or notices) — the same rule as `plan`
    and `reconcile`, which exit 7 when a source was not read. The output names each
    source and since when. Exit 4 when the cloud refuses our credentials.

    Example: spotctl status -o json | jq '.data.pools[] | {name, headroom, price}'
    """
    st = state(ctx)
    from spotctl.ops.status import status as get_status

    data = get_status(st.runtime(), all_nodes=all_nodes)
    partial = data["partial"]
    code = ExitCode.PARTIAL if partial else ExitCode.OK
    errors = [{"code": "partial", "message": f"{s}: {why}"} for s, why in partial.items()]
    render.emit(st.fmt(), "status", data, status=render.ResultStatus.PARTIAL if partial else render.ResultStatus.OK,
                exit_code=code, errors=errors, table=lambda c, d: _table(c, d, list_nodes or all_nodes))
    if code != ExitCode.OK:
        raise typer.Exit(int(code))


def _table(console, d: dict, list_nodes: bool) -> None:
    from rich.table import Table

    now = d["now"]
    cur = d["currency"] or NONE
    t = Table(title=f"Region {d['region']} ({d['backend']}) at {ts(now)}: pools", title_justify="left")
    for col in ("pool", "kind, class", "az", "node shape", f"price\n({cur} per\nnode-hour)", "fit now\n(nodes)",
                "ours/limit\n(nodes)", "our nodes by state", "policy"):
        t.add_column(col, overflow="fold")
    for p in d["pools"]:
        t.add_row(p["name"], f"{p['kind']}, {p['class']}", p["az"], shape_of(p["shape"]), money(p["price"]),
                  str(p["headroom"]), f"{p['nodes']}/{p['max_nodes']}", counts(p["nodes_by_state"]), _policy(p))
    console.print(t)
    console.print("  fit now: new nodes of the pool's shape that fit on its hosts now, host by host\n"
                  "  ours/limit: our live nodes in the pool / the pool's max_nodes\n"
                  "  policy: as the last pass applied it; no-notice where a provider contract term is not met\n"
                  "  (shorter placements, no bare metal for long jobs); `-` before the first pass")
    groups = d["advised_or_leaving"]
    if groups:
        g = Table(title="Advised and leaving nodes (advised: cordoned, no new work)", title_justify="left")
        for col in ("pool", "state", "nodes", "host", "why"):
            g.add_column(col, overflow="fold")
        for grp in groups:
            g.add_row(grp["pool"], grp["state"], str(grp["count"]), grp["host"] or NONE, why(grp, now))
        console.print(g)
    live = d["node_states"]
    if list_nodes and d["nodes"]:
        n = Table(title="Nodes", title_justify="left")
        n.add_column("id", no_wrap=True)
        for col in ("pool", "state", "in state\nfor", "host", "why (advised, leaving) or last change"):
            n.add_column(col, overflow="fold")
        for node in sorted(d["nodes"], key=lambda x: (x["pool"], x["id"])):
            n.add_row(node["id"], node["pool"], node["state"], duration(now - node["updated_at"]),
                      node["host"] or NONE,
                      why(node, now) if node["state"] in EXPLAINED else node["reason"] or NONE)
        console.print(n)
    elif not live:
        console.print("no spot nodes")
    else:
        console.print(f"nodes: {sum(live.values())} live ({counts(live)}); `spotctl status --nodes` lists them")
    _feed(console, d)
    b = d["budget"]
    console.print(f"token budget: {b['tokens_left']:g} of {b['burst']:g} tokens left (refills {b['rate']:g} "
                  f"tokens/s); {b['tokens_used_total']} used in all")
    lp = d["last_pass"]
    if lp is None:
        console.print("last pass: none yet (`spotctl reconcile` runs one)")
    else:
        ago = duration(now - lp["finished_at"]) if lp["finished_at"] else NONE
        console.print(f"last pass: #{lp['seq']} {lp['status']} at {ts(lp['finished_at'])} ({ago} ago) by "
                      f"{lp['actor']}: {plural(lp['actions'], 'action')}, {plural(lp['tokens_used'], 'token')}"
                      + (f"; sources not read: {', '.join(sorted(lp['degraded']))}" if lp["degraded"] else ""))
    for kind, q in d["outbox"].get("kinds", {}).items():
        console.print(f"outbox {OUTBOX_LABELS.get(kind, kind)}: {_queue(q)}")
    console.print(f"audit records: {d['audit_records']}")
    idn = d["identity"]
    console.print(f"identity: {idn['mode']}" + (" (not configured: actions are recorded as the OS user)"
                                                if idn["mode"] == "none" else "") + f"; acting as {idn['actor']}")
    for dest, m in d.get("relay", {}).items():
        console.print(f"relay to {dest}: {m['mode']} producer (seen {ts(m['seen_at'])})")
    for src, msg in d["degraded"].items():
        if src != "rate_card":  # said with the contract feed
            console.print(f"degraded {src}: {msg}")


#: How the outbox kinds read in the status lines.
OUTBOX_LABELS = {"event": "events", "audit": "audit records"}


def _queue(q: dict[str, Any]) -> str:
    """``queued for kafka: 3 pending, the oldest 2m old`` / ``not queued: no relay configured (for kafka)``."""
    if q["queued"]:
        text = f"queued for {q['destination']}: {q['pending']} pending"
        age = q.get("oldest_pending_age_s")
        return text + (f", the oldest {duration(age)} old" if age is not None else "")
    text = f"not queued: no relay configured (for {q['destination']})"
    return text + (f"; {q['pending']} rows queued before wait for one" if q["pending"] else "")


#: The node states whose why is shown (the rest show the reason of their last change).
EXPLAINED = ("advised", "draining", "deleting")


def plural(n: int | None, word: str) -> str:
    return f"{NONE} {word}s" if n is None else f"{n} {word}{'' if n == 1 else 's'}"


def _policy(p: dict[str, Any]) -> str:
    """The pool's policy as the last pass recorded it (the terms behind it are said below the table)."""
    if p["contract"] is None:
        return NONE
    return "no-notice" if p["no_notice"] else "normal"


def _feed(console, d: dict) -> None:
    """The contract feed's health: the rate card read now, what the last pass could not read, the pools
    under the no-notice policy and the terms with no evidence yet."""
    f = d["contract_feed"]
    rc, lp = f["rate_card"], f["last_pass"]
    down = not rc["read_now"] or bool(lp and lp["not_read"])
    lines = [f"contract feed: {'DOWN' if down else 'up'}",
             f"  rate card: {rc['version']} read now, valid until {ts(rc['valid_until'])}" if rc["read_now"] else
             f"  rate card: NOT read now: {rc['error']}"]
    if lp is None:
        lines.append("  notices: no pass has read them yet (status reads none itself)")
    else:
        for s, why_not in sorted(lp["not_read"].items()):
            if s != "notices":
                lines.append(f"  {s.replace('_', ' ')}: NOT read by the last pass at {ts(lp['at'])}: {why_not}")
        lines.append(f"  notices: NOT read by the last pass at {ts(lp['at'])}: {lp['not_read']['notices']}"
                     if "notices" in lp["not_read"] else
                     f"  notices: read by the last pass at {ts(lp['at'])} (status reads none itself)")
    by_terms: dict[str, list[str]] = {}  # the terms not met -> the pools under the no-notice policy for them
    for p in d["pools"]:
        if p["no_notice"]:
            by_terms.setdefault(", ".join(p["contract_failing"]), []).append(p["name"])
    lines.append("  no-notice policy: " + ("; ".join(
        f"{_pools(names, d)} (not met: {terms})" for terms, names in sorted(by_terms.items())) or "no pool"))
    unknown: dict[str, list[str]] = {}
    for p in d["pools"]:
        for term in p["contract_unknown"]:
            unknown.setdefault(term, []).append(p["name"])
    for term, names in sorted(unknown.items()):
        lines.append(f"  {term} term: no evidence yet in {_pools(names, d)} (normal policy; `spotctl contract check`)")
    console.print("\n".join(lines))


def _pools(names: list[str], d: dict) -> str:
    return "every pool" if len(names) == len(d["pools"]) else ", ".join(names)


def why(g: dict[str, Any], now: float) -> str:
    """Why a node (or a group of them, on one host) is advised or leaving: its notice, its host's
    reservation, or the reason recorded when it last changed state."""
    nt = g.get("notice")
    if nt:
        if nt["kind"] == "hard":
            return (f"hard notice {nt['id']}: the instance is deleted at {_when(nt['deadline'], now)}"
                    + (f" ({nt['reason']})" if nt["reason"] else ""))
        what = "calendar notice" if nt["kind"] == "calendar" else "advisory"
        ids = f" {nt['id']}" if g.get("count", 1) == 1 else "s"
        if nt["deadline"] is None:
            return f"the provider's {what}{ids}" + (f": {nt['reason']}" if nt["reason"] else "")
        out = f"host reserved from {_when(nt['deadline'], now)}, says the provider's {what}{ids}"
        if g.get("drain_from"):
            out += f"; drained from {ts(g['drain_from'])}"
        return out
    if g.get("host_reserved_from"):
        return f"host reserved from {_when(g['host_reserved_from'], now)} (calendar advisory)"
    return g.get("reason") or NONE


def _when(t: float | None, now: float) -> str:
    return NONE if t is None else f"{ts(t)} (in {duration(t - now)})" if t >= now else ts(t)
