"""spotctl report"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from . import render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    html = "html"


def _check_since(value: str) -> str:
    """--since is read where it enters (the ops function reads it again against the window's end)."""
    import time

    from spotctl.ops.audit import parse_since

    parse_since(value, time.time())
    return value


def _check_until(value: str | None) -> str | None:
    if value is not None and value not in ("now", "last-pass"):
        import time

        from spotctl.ops.audit import parse_since

        parse_since(value, time.time())
    return value


@app.command()
def report(
    ctx: typer.Context,
    since: Annotated[str, typer.Option(
        "--since", callback=_check_since,
        help="Start of the window: a duration before its end (30m, 24h, 7d), ISO 8601 or epoch seconds.")] = "7d",
    until: Annotated[Optional[str], typer.Option(
        "--until", callback=_check_until, show_default=False,
        help="End of the window: last-pass (default: the last recorded pass), now, ISO 8601 or epoch seconds.")] = None,
    format_: Annotated[Format, typer.Option(
        "--format", "-f", help="table (terminal), markdown, or html (one self-contained page with charts).")] = Format.table,
    output: Annotated[Optional[str], typer.Option(
        "--output", show_default=False,
        help="Write the markdown or html document to this file (atomically) instead of standard output.")] = None,
    state_db: Annotated[Optional[str], typer.Option(
        "--state-db", show_default=False,
        help="Read this state database (e.g. one kept by `simulate --keep-state`) instead of the region's.")] = None,
) -> None:
    """Report savings against on-demand, demand served and waits, interruptions per pool, notice SLOs,
    advisory precision, drill scores and contract degradations over a window.

    Every figure is computed from what the region's state database recorded
    (any region, real or simulated; docs/report.md defines each one). The
    window ends at the last recorded pass unless --until says otherwise, so a
    simulation's kept state reports its own simulated day. With -o json the
    figures are the envelope's data; --format markdown or html writes a
    document (html: inline SVG charts, no network needed to open it).

    Example: spotctl simulate --hours 24 --keep-state /tmp/sim && spotctl report --since 24h --state-db /tmp/sim/simulate-demo-7.db --format html --output report.html
    """
    st = state(ctx)
    from spotctl.ops.report import report as build_report
    from spotctl.state.store import Store
    from spotctl.wiring import state_path

    config = st.config()
    region = config.region(st.region)
    store = Store.open(state_db or state_path(config, region.name), region.name, create=False)
    st.cleanups.append(store.close)
    data = build_report(store, region, since=since, until=until)
    from . import report_doc

    explicit = (st.output or "").lower() in ("json", "yaml")
    if format_ is Format.table or explicit and output is None:
        render.emit(st.fmt(), "report", data, table=report_doc.table)
        return
    doc = report_doc.markdown(data) if format_ is Format.markdown else report_doc.page(data)
    if output is None:
        import sys

        sys.stdout.write(doc)
        sys.stdout.flush()
        return
    from spotctl.ops.report import write_document

    size = write_document(output, doc)
    st.progress(f"report written to {output} ({size:,} bytes)")
    if explicit:
        render.emit(st.fmt(), "report", data | {"written": {"path": output, "bytes": size, "format": format_.value}})
