"""spotctl status"""

from __future__ import annotations

from typing import Annotated

import typer

from . import render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def status(
    ctx: typer.Context,
    all_nodes: Annotated[bool, typer.Option("--all", help="Include nodes that are gone, failed or lost.")] = False,
) -> None:
    """Show the region: pools with headroom and price, our nodes, the token budget, the last pass.

    Example: spotctl status -o json | jq '.data.pools[] | {name, headroom, price}'
    """
    st = state(ctx)
    from spotctl.ops.status import status as get_status

    data = get_status(st.runtime(), all_nodes=all_nodes)
    render.emit(st.fmt(), "status", data, table=_table)


def _table(console, d: dict) -> None:
    from rich.table import Table

    t = Table(title=f"Region {d['region']} ({d['backend']}) at {render.ts(d['now'])}, rate card {d['rate_card_version']}",
              title_justify="left")
    for col in ("pool", "kind", "class", "az", "shape", "price/h", "headroom", "nodes"):
        t.add_column(col)
    for p in d["pools"]:
        s = p["shape"]
        shape = f"{s['vcpu']}c/{s['ram_mb'] // 1024}G" + (f"/{s['gpus']}gpu" if s["gpus"] else "")
        states = ", ".join(f"{k} {v}" for k, v in sorted(p["nodes_by_state"].items()))
        t.add_row(p["name"], p["kind"], p["class"], p["az"], shape,
                  "-" if p["price"] is None else f"{p['price']:.3f}", str(p["headroom"]),
                  f"{p['nodes']}/{p['max_nodes']}" + (f" ({states})" if states else ""))
    console.print(t)
    if d["nodes"]:
        n = Table(title="Nodes", title_justify="left")
        for col in ("id", "pool", "state", "host", "since", "reason"):
            n.add_column(col, overflow="fold")
        for node in d["nodes"]:
            n.add_row(node["id"], node["pool"], node["state"], node["host"] or "-", render.ts(node["updated_at"]),
                      node["reason"])
        console.print(n)
    else:
        console.print("no spot nodes")
    b = d["budget"]
    console.print(f"budget: {b['tokens_left']}/{b['burst']} tokens left (refill {b['rate']}/s), "
                  f"{b['tokens_used_total']} used in all")
    lp = d["last_pass"]
    console.print("last pass: none" if lp is None else
                  f"last pass: {lp['status']} at {render.ts(lp['finished_at'])} by {lp['actor']}, "
                  f"{lp['tokens_used']} tokens")
    console.print(f"outbox: {d['outbox']['pending']} pending of {d['outbox']['total']}; "
                  f"audit records: {d['audit_records']}")
    for dest, m in d.get("relay", {}).items():
        console.print(f"relay to {dest}: {m['mode']} producer (seen {render.ts(m['seen_at'])})")
    for src, msg in d["degraded"].items():
        console.print(f"degraded {src}: {msg}")
