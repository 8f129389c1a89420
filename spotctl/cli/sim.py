"""spotctl sim serve | status"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import render
from .context import state
from .options import host as host_check
from .options import url as url_check

app = typer.Typer(rich_markup_mode=None, add_completion=False)
sim_app = typer.Typer(rich_markup_mode=None, add_completion=False, help="The region's simulator, served over HTTP as the provider contract API.",
                      no_args_is_help=True)
app.add_typer(sim_app, name="sim")


@sim_app.command("serve")
def serve(
    ctx: typer.Context,
    port: Annotated[Optional[int], typer.Option(
        "--port", "-p", min=0, max=65535, show_default=False,
        help="TCP port (default: the port of the region's [contract] url, else 8787; 0 = any free port).")] = None,
    host: Annotated[Optional[str], typer.Option(
        "--host", show_default=False, callback=host_check,
        help="Address to listen on (default 127.0.0.1). A non-loopback address is only used when given here.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", "-s", help="World seed (default: the region's seed).")] = None,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar="SPOTCTL_SIM_TOKEN", show_envvar=True, show_default=False,
        help="Require this bearer token (default: the region's [contract] token, else no auth).")] = None,
    instances: Annotated[int, typer.Option(
        "--instances", min=0, max=500, help="Spot instances to launch in the served world (reclaim victims).")] = 6,
    max_wait: Annotated[float, typer.Option(
        "--max-wait", min=0.0, max=60.0, help="Longest long-poll the server holds, in seconds.")] = 60.0,
) -> None:
    """Serve the region's simulated provider contract API (docs/contract/openapi.yaml) until Ctrl-C.

    A fresh simulated world (the demo region by default) advances with the
    wall clock: rate card with ETag, the ordered notice log with long-poll,
    notices in force, the reclaim API and contract status, under /v1/. The
    URL is printed on stderr. SIGTERM stops it cleanly (exit 0); Ctrl-C
    exits 130. Point a region's [contract] url at it to consume it.

    Example: spotctl sim serve --port 8787 --token s3cret
    """
    st = state(ctx)
    from spotctl.services.contract_api import serve_region
    from spotctl.wiring import sim_world_factory

    result = serve_region(st.config().region(st.region), sim_world_factory, host=host, port=port, seed=seed,
                          token=token, instances=instances, max_wait=max_wait, announce=st.progress,
                          warn=_warn)
    render.emit(st.fmt(), "sim serve", result, table=_served)


@sim_app.command("status")
def status(
    ctx: typer.Context,
    url: Annotated[Optional[str], typer.Option(
        "--url", show_default=False, callback=url_check,
        help="Base URL of the running server (default: the region's [contract] url, else http://127.0.0.1:8787).")] = None,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar="SPOTCTL_SIM_TOKEN", show_envvar=True, show_default=False,
        help="Bearer token (default: the region's [contract] token).")] = None,
) -> None:
    """Show a running simulator's world: time, pools and instances.

    Example: spotctl sim status --url http://127.0.0.1:8787 -o json | jq '.data.instances[].id'
    """
    st = state(ctx)
    from spotctl.adapters.contract_http import world_status

    render.emit(st.fmt(), "sim status", world_status(st.config().region(st.region), url=url, token=token),
                table=_world)


def _warn(message: str) -> None:
    import logging  # a warning as every other (JSON with --log-format json, in the run's log file too)

    logging.getLogger("spotctl").warning("%s", message)


def _served(console, r: dict) -> None:
    console.print(f"served {r['url']} for {render.duration(r['served_seconds'])}: "
                  f"{r['notices_logged']} notices logged, {r['reclaims']} reclaims")


def _world(console, d: dict) -> None:
    from rich.table import Table

    console.print(f"simulated region {d['region']} (seed {d['seed']}) at {d['now']}: "
                  f"{d['notices_in_force']} notices in force, {d['log_length']} in the log, "
                  f"{d['reclaims']} reclaims")
    console.print("pools: " + ", ".join(d["pools"]))
    t = Table(title="Instances", title_justify="left")
    for col in ("id", "name", "pool", "status", "host"):
        t.add_column(col, overflow="fold")
    for i in d["instances"]:
        t.add_row(i["id"], i["name"], i["pool"], i["status"], i["host"] or "-")
    console.print(t)
