"""spotctl audit list | show | verify | export | serve"""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from spotctl.core.errors import ExitCode

from . import render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False, name="audit", no_args_is_help=True, help="""The tamper-evident audit trail of capacity actions.

Every capacity action and decision is an audit record (actor, action, target,
result and the inputs behind it), chained by SHA-256 to the record before it,
written with the state change and relayed to the audit log service.
Use the global --region to choose the region.""")

StateDb = Annotated[Optional[str], typer.Option(
    "--state-db", help="Read this state database (e.g. one kept by `simulate --keep-state`) instead of the region's.",
    show_default=False)]
def _check_since(value: str | None) -> str | None:
    """--since is read where it enters, before any state is opened (the command reads it again)."""
    if value is not None:
        import time

        from spotctl.ops.audit import parse_since

        parse_since(value, time.time())
    return value


Since = Annotated[Optional[str], typer.Option(
    "--since", callback=_check_since, help="Only records from this time: a duration ago (30m, 2h, 7d), ISO 8601 or epoch seconds.",
    show_default=False)]
Actor = Annotated[Optional[str], typer.Option("--actor", help=(
    "Only records by this actor: its whole name as listed, or an OIDC identity's preferred_username, sub or "
    "client id."), show_default=False)]
Action = Annotated[Optional[str], typer.Option(
    "--action", help="Only this action (node.launch); a trailing * matches a prefix (node.*).", show_default=False)]
NodeOpt = Annotated[Optional[str], typer.Option("--node", help="Only records about this node.", show_default=False)]


class ExportFormat(str, Enum):
    jsonl = "jsonl"
    csv = "csv"


def _store(ctx: typer.Context, state_db: str | None):
    """The region's state database (read-only use), closed when the command ends."""
    from spotctl.state.store import Store
    from spotctl.wiring import state_path

    st = state(ctx)
    config = st.config()
    region = config.region(st.region)
    store = Store.open(state_db or state_path(config, region.name), region.name, create=False)
    st.cleanups.append(store.close)
    return st, region, store


def _now() -> float:
    import time

    return time.time()


@app.command("list")
def list_(ctx: typer.Context, since: Since = None, actor: Actor = None, action: Action = None, node: NodeOpt = None,
          limit: Annotated[Optional[int], typer.Option("--limit", "-n", min=1, max=10_000_000,
                                                       help="Only the newest N matching records.",
                                                       show_default=False)] = None,
          state_db: StateDb = None) -> None:
    """List audit records, oldest first, with the filters given.

    Example: spotctl audit list --since 2h --action 'node.*' --region demo
    """
    st, _, store = _store(ctx, state_db)
    from spotctl.ops.audit import listing

    with listing(store, now=_now(), since=since, actor=actor, action=action, node=node, limit=limit) as data:
        _emit_list(st.fmt(), data)


@app.command()
def show(ctx: typer.Context, record_id: Annotated[str, typer.Argument(
        metavar="ID", help="Record id (or a unique prefix of 8+ characters).")],
         state_db: StateDb = None) -> None:
    """Show one audit record with its inputs and chain hashes.

    Example: spotctl audit show 3f2a9c1e -o json
    """
    st, _, store = _store(ctx, state_db)
    from spotctl.ops.audit import show as show_record

    render.emit(st.fmt(), "audit show", show_record(store, record_id), table=_show_table)


@app.command()
def verify(ctx: typer.Context, state_db: StateDb = None,
           local_only: Annotated[bool, typer.Option(
               "--local-only", help="Check only the local chain, not the audit log service.")] = False,
           full: Annotated[bool, typer.Option(
               "--full", help="Walk the whole kept chain, not only the records after the last verified one.")] = False,
           ) -> None:
    """Verify the audit chain locally and against the audit log service.

    By default only the records after the checkpoint (the last record a
    successful verify checked) are walked, and the checkpoint record must still
    carry its hash; --full walks every kept record from the first one. A
    successful walk moves the checkpoint; a failed one never does.

    Exit 0 when intact; 9 when the local chain is broken (the first bad record
    is named); 6 when the service lacks or differs from a delivered record;
    8 when the service cannot be reached.

    Example: spotctl audit verify --region demo
    """
    st, region, store = _store(ctx, state_db)
    from spotctl.ops.audit import verify as verify_chain

    service = None
    if not local_only and not state_db and region.section("audit") is not None:
        from spotctl.adapters.audit_http import AuditClient

        service = AuditClient.from_config(region)
        st.cleanups.append(service.close)
    result = verify_chain(store, service, full=full)
    code = ExitCode.OK if result["ok"] else ExitCode.STATE if not result["local_ok"] else ExitCode.REFUSED
    status = render.ResultStatus.OK if result["ok"] else render.ResultStatus.FAILED
    render.emit(st.fmt(), "audit verify", result, status=status, exit_code=code, table=_verify_table)
    if result["checkpoint"]["problem"]:
        import logging  # a warning as every other (JSON with --log-format json, in the run's log file too)

        logging.getLogger("spotctl").warning("the verify checkpoint could not be saved (%s): the next verify walks "
                                             "these records again", result["checkpoint"]["problem"])
    if not result["local_ok"]:
        bad = result["first_bad"]
        render.error(f"audit chain broken at record {bad['id'] or '(gone)'} (seq {bad['seq']}): {bad['reason']}",
                     hint=None if full else "`spotctl audit verify --full` walks the whole kept chain")
    elif not result["ok"]:
        s = result["service"]
        render.error(f"audit service {s['url']} disagrees: {s['missing_count']} delivered records missing, "
                     f"{s['mismatched_count']} with a different hash")
    if code:
        raise typer.Exit(int(code))


@app.command("export")
def export_(ctx: typer.Context,
            fmt: Annotated[ExportFormat, typer.Option("--format", "-f", help="jsonl or csv.")] = ExportFormat.jsonl,
            since: Since = None, actor: Actor = None, action: Action = None, node: NodeOpt = None,
            state_db: StateDb = None) -> None:
    """Write audit records to stdout as JSON lines or CSV (oldest first).

    Example: spotctl audit export --format csv --since 7d > audit.csv
    """
    _, _, store = _store(ctx, state_db)
    from spotctl.ops.audit import export

    for chunk in export(store, fmt.value, now=_now(), since=since, actor=actor, action=action, node=node):
        sys.stdout.write(chunk)
    sys.stdout.flush()


@app.command()
def serve(ctx: typer.Context,
          db: Annotated[Optional[str], typer.Option(
              "--db", help="The receiver's append-only database (default: STATE_DIR/audit-receiver.db).",
              show_default=False)] = None,
          host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
          port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8470,
          token_file: Annotated[Optional[str], typer.Option(
              "--token-file", help="File holding the bearer token clients must send (else $SPOTCTL_AUDIT_TOKEN).",
              show_default=False)] = None) -> None:
    """Run the reference audit log service (docs/audit/openapi.yaml) until interrupted.

    Append-only SQLite, one result per record, duplicates dropped by
    idempotency key. For small sites and tests; put TLS in front of it.

    Example: spotctl audit serve --port 8470 --token-file /etc/spotctl/audit.token
    """
    st = state(ctx)
    from spotctl.services.audit_receiver import serve as run_receiver

    token = _read_token(token_file)
    path = db or str(st.config().state_dir() / "audit-receiver.db")
    run_receiver(path, token, host, port, ready=lambda url: st.progress(f"audit receiver on {url}, database {path}"))


def _read_token(token_file: str | None):
    """The token clients must send: ``--token-file`` (re-read by the receiver when it is rotated), else the
    environment."""
    from spotctl.core.secrets import SecretFile

    if token_file:
        secret = SecretFile(token_file, setting="--token-file")
        secret.value()  # unreadable, empty or not one token: a ConfigError before the receiver starts
        return secret
    return os.environ.get("SPOTCTL_AUDIT_TOKEN", "").strip()


# -- tables ----------------------------------------------------------------------


TABLE_MAX = 10_000  # more records than this are written one line each (a table needs every row first)
_LIST_COLUMNS = ("time", "id", "actor", "action", "target", "result", "relayed")


def _list_row(r: dict) -> tuple[str, ...]:
    return (r["time"], r["id"][:8], r["actor"], r["action"], r["target"], r["result"],
            "yes" if r.get("delivered_at") else "queued")


class _Out:
    """stdout in 64 KiB writes (one record per write would be a system call each)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def write(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)
        if self.size >= 65536:
            self.flush()

    def flush(self) -> None:
        sys.stdout.write("".join(self.parts))
        self.parts, self.size = [], 0
        sys.stdout.flush()


def _emit_list(fmt: str, d: dict) -> None:
    """Write ``audit list`` as its records are read (``d["records"]`` is an iterator): JSON (the same
    bytes as the envelope renderer) and YAML stream the record array; a table up to TABLE_MAX records,
    else plain lines."""
    import json

    if fmt not in ("json", "yaml") and d["count"] <= TABLE_MAX:
        _list_table(render.console(), d)
        return
    out = _Out()
    if fmt == "json":
        head, tail = json.dumps(render.envelope("audit list", {**d, "records": []}), indent=2,
                                default=str).split('"records": []', 1)
        out.write(head + '"records": [')
        sep = "\n"
        for r in d["records"]:
            out.write(sep + "      " + json.dumps(r, indent=2, default=str).replace("\n", "\n      "))
            sep = ",\n"
        out.write(("]" if sep == "\n" else "\n    ]") + tail + "\n")
    elif fmt == "yaml":
        import yaml

        head, tail = yaml.safe_dump(render.envelope("audit list", {**d, "records": []}),
                                    sort_keys=False).split("  records: []\n", 1)
        out.write(head + "  records:")
        empty = True
        for r in d["records"]:
            out.write("\n" if empty else "")
            empty = False
            out.write("".join("  " + line for line in yaml.safe_dump([r], sort_keys=False).splitlines(True)))
        out.write((" []\n" if empty else "") + tail)
    else:
        out.write(f"Audit records in region {d['region']} ({d['count']}: one line each; "
                  f"--limit N or -o json for fewer or all)\n" + "  ".join(_LIST_COLUMNS) + "\n")
        for r in d["records"]:
            out.write("  ".join(_list_row(r)) + "\n")
    out.flush()


def _list_table(console, d: dict) -> None:
    from rich.table import Table

    t = Table(title=f"Audit records in region {d['region']} ({d['count']})", title_justify="left")
    for col in _LIST_COLUMNS:
        t.add_column(col, overflow="fold")
    for r in d["records"]:
        t.add_row(*_list_row(r))
    console.print(t)


def _show_table(console, r: dict) -> None:
    import json

    from rich.table import Table

    t = Table(title=f"Audit record {r['id']}", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    for k in ("seq", "time", "actor", "action", "target", "result", "prev_hash", "hash"):
        t.add_row(k, str(r[k]))
    t.add_row("relayed", render.ts(r["delivered_at"]) if r.get("delivered_at") else "queued")
    t.add_row("inputs", json.dumps(r["inputs"], indent=2, sort_keys=True))
    console.print(t)


def _verify_table(console, d: dict) -> None:
    walked = (f"incremental, the records after seq {d['from_seq']}" if d["mode"] == "incremental" else
              "full, every kept record" + (f" (pruned up to seq {d['from_seq']})" if d["from_seq"] else ""))
    if d["mode"] == "incremental" and not d["records"] and d["local_ok"]:
        console.print(f"region {d['region']}: no records since the checkpoint (seq {d['from_seq']}), which still "
                      "holds its hash; `spotctl audit verify --full` walks the whole chain")
    else:
        console.print(f"region {d['region']}: {d['records']} records checked ({walked}), local chain "
                      f"{'intact' if d['local_ok'] else 'BROKEN'}")
    cp = d["checkpoint"]
    if cp["seq"] is not None:
        console.print(f"checkpoint: seq {cp['seq']}" + (" saved" if cp["saved"] else
                                                        f" could not be saved ({cp['problem']})"))
    if d["first_bad"]:
        b = d["first_bad"]
        console.print(f"first bad record: {b['id']} (seq {b['seq']}, {b['action']} {b['target']}): {b['reason']}")
    s = d["service"]
    if s is None:
        console.print("audit service: not checked (none configured, --local-only or --state-db)")
    else:
        console.print(f"audit service {s['url']}: {s['checked']} delivered records checked, {s['pending']} still "
                      f"queued; {s['missing_count']} missing, {s['mismatched_count']} different"
                      + (" — OK" if s["ok"] else " — MISMATCH"))
