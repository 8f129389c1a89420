"""spotctl metrics"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def metrics(
    ctx: typer.Context,
    write: Annotated[Optional[str], typer.Option(
        "--write", help="Write them to this file instead (atomically, for node_exporter's textfile collector).",
        show_default=False)] = None,
    state_db: Annotated[Optional[str], typer.Option(
        "--state-db", help="Read this state database (e.g. one kept by `simulate --keep-state`) instead of the "
                           "region's.", show_default=False)] = None,
) -> None:
    """Print the region's Prometheus metrics, read from its state database.

    The same families the reconciler writes after each pass (--metrics-file) and
    the watcher serves (--metrics-listen), in the Prometheus text format: kept
    counters (passes, actions, notices, reclaims, advisories), histograms of
    notice lead, delivery, cordon and empty times, and gauges of nodes by pool
    and state, headroom, prices, contract terms, the token budget, the outbox
    backlog and drill scores. Nothing is observed: no cloud or scheduler call,
    no region lock. Every family: docs/metrics.md.

    Example: spotctl metrics | grep '^spotctl_notice_lead_seconds_count'
    """
    st = state(ctx)
    from spotctl.ops.metrics import exposition_of, write_textfile_of
    from spotctl.state.store import Store
    from spotctl.wiring import state_path

    config = st.config()
    region = config.region(st.region)
    store = Store.open(state_db or state_path(config, region.name), region.name, create=False)
    st.cleanups.append(store.close)
    if write is not None:
        write_textfile_of(store, region, write)
        return
    sys.stdout.write(exposition_of(store, region))
    sys.stdout.flush()
