"""spotctl reconcile"""

from __future__ import annotations

from typing import Annotated

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state
from .waiting import WAIT_DEFAULT, wait_option

app = typer.Typer(rich_markup_mode=None, add_completion=False)

STATUS_EXIT = {"ok": ExitCode.OK, "skipped": ExitCode.OK, "dry-run": ExitCode.OK, "partial": ExitCode.PARTIAL}


@app.command()
def reconcile(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Observe and plan, but act on nothing.")] = False,
    wait: Annotated[float, wait_option('the pass is skipped (exit 0, status "skipped")')] = WAIT_DEFAULT,
) -> None:
    """Run one reconcile pass now: observe, plan, act under the token budget, persist.

    The same pass the spot-reconciler timer runs. Progress goes to stderr.
    Exit 7 when a source was unavailable or a step failed. When another pass
    holds the region lock, waits for it (--wait, default 30 s), then skips:
    exit 0 with status "skipped" (the timer never waits: it skips at once).

    Example: spotctl reconcile --dry-run -o json
    """
    st = state(ctx)
    from spotctl.ops.reconcile import run_pass

    result = run_pass(st.runtime(), dry_run=dry_run, wait=wait)
    code = STATUS_EXIT.get(result.status, ExitCode.PARTIAL)
    errors = [{"code": "auth", "message": f"{s}: {result.degraded[s]}"} for s in result.auth_failed]
    if errors:  # the pass did what it could; a refused credential needs a human
        code = ExitCode.AUTH
        for e in errors:
            render.error(e["message"])
    render.emit(st.fmt(), "reconcile", result.to_dict(), status=result.status, exit_code=code, errors=errors,
                table=_table)
    if code:
        raise typer.Exit(int(code))


def _table(console, d: dict) -> None:
    from rich.table import Table

    console.print(f"pass {d['status']} in region {d['region']} ({d['duration_s']}s)" +
                  (f": {d['message']}" if d["message"] else ""))
    if d["outcomes"]:
        t = Table(title="Outcomes", title_justify="left")
        for col in ("kind", "pool", "node", "status", "detail"):
            t.add_column(col, overflow="fold")
        for o in d["outcomes"]:
            node = o.get("node") or (", ".join(o.get("nodes", [])[:3]) + (" …" if len(o.get("nodes", [])) > 3 else ""))
            t.add_row(o["kind"], o.get("pool", "-"), node or "-", o["status"],
                      o["detail"] or (f"{o.get('launched')}/{o.get('count')} launched" if o["kind"] == "launch" else ""))
        console.print(t)
    elif d["plan"] is not None:
        console.print("nothing to do")
    b = d["budget"]
    console.print(f"tokens used {b['tokens_used']}, left {b['tokens_left']}")
    for src, msg in d["degraded"].items():
        console.print(f"degraded {src}: {msg}")
    if d.get("pruned"):
        console.print("pruned " + ", ".join(f"{n} {t}" for t, n in d["pruned"].items()))
