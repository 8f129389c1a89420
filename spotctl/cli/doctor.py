"""spotctl doctor"""

from __future__ import annotations

import typer

from . import render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def doctor(ctx: typer.Context) -> None:
    """Check every backend the region configures, the state database and the systemd units, and say how to
    fix what fails.

    One cheap real call per check, each bounded by the adapter's timeout, never retried, without the
    region lock; nothing is changed. Checked when configured: OpenStack (a keystone token, then Nova,
    Placement, Blazar and Ironic as the pools need them), slurmrestd (its API versions, then the token:
    partitions and ping), Kubernetes (the credentials, then RBAC for each verb spotctl uses, by SelfSubjectAccessReview),
    Kafka (the topic's metadata), the audit service, OIDC (discovery, JWKS, a service token when a client
    secret is configured), the contract feed (the rate card); always: the state database (quick_check,
    permissions, schema version), the identity token cache (0700) with [identity], the systemd units
    (where systemd runs). The demo region's simulated parts are read through their ports.

    Results: pass (observed to work), fail (with a hint), info (does not apply here, says why), skipped
    (the check it needs failed). Exit 0 when nothing fails; else 4 when a backend refuses our credentials
    or RBAC denies a verb (wins: it needs an operator), 8 when one cannot be reached, 9 for the state
    database, 3 for configuration, 7 for the rest. docs/doctor.md lists every check and its hints.

    Example: spotctl doctor -o json | jq '.data.checks[] | select(.result == "fail") | {check, hint}'
    """
    st = state(ctx)
    from spotctl.ops.doctor import run
    from spotctl.wiring import doctor_probes

    region, probes = doctor_probes(st.config(), st.region)
    data = run(region, probes)
    code = data["exit_code"]
    errors = [{"code": "check_failed", "message": f"{c['check']} ({c['target']}): {c['detail']}",
               **({"hint": c["hint"]} if c["hint"] else {})} for c in data["checks"] if c["result"] == "fail"]
    render.emit(st.fmt(), "doctor", data, status=render.ResultStatus.OK if data["ok"] else render.ResultStatus.FAILED,
                exit_code=code, errors=errors, table=_table)
    if code:
        failed = [c["check"] for c in data["checks"] if c["result"] == "fail"]
        render.error(f"doctor: {len(failed)} check(s) failed: {', '.join(dict.fromkeys(failed))}",
                     hint="each failed row of the table says how to fix it (`spotctl doctor -o json` for scripts)")
        raise typer.Exit(int(code))


#: How each result reads in the table.
MARKS = {"pass": "pass", "fail": "FAIL", "info": "info", "skipped": "skipped"}


def _table(console, d: dict) -> None:
    from rich.table import Table

    c = d["counts"]
    t = Table(title=f"Doctor of region {d['region']} ({d['backend']}): {c['pass']} pass, {c['fail']} fail, "
                    f"{c['info']} info, {c['skipped']} skipped", title_justify="left")
    for col in ("check", "target", "result", "detail", "how to fix"):
        t.add_column(col, overflow="fold")
    for row in d["checks"]:
        t.add_row(row["check"], row["target"], MARKS.get(row["result"], row["result"]), row["detail"],
                  row["hint"] or "")
    console.print(t)
