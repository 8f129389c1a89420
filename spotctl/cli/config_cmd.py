"""spotctl config show"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import fmt, render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)
config_app = typer.Typer(rich_markup_mode=None, add_completion=False, help="Inspect the merged configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.callback()
def config_group() -> None:
    """Inspect the merged configuration."""


@config_app.command("show")
def show(
    ctx: typer.Context,
    key: Annotated[Optional[str], typer.Argument(
        help="Show only this key, or the keys under it (e.g. regions.demo.policy).", show_default=False)] = None,
) -> None:
    """Print every setting in effect, defaults included, with the layer it came from (secrets redacted).

    Layers, later wins: default < /etc/spotctl/config.toml (or $SPOTCTL_SYSTEM_CONFIG) < user file
    ($SPOTCTL_CONFIG or --config, else $XDG_CONFIG_HOME/spotctl/config.toml) < SPOTCTL_* environment <
    flags. The source column says which: `default`, FILE:LINE, `env VAR` or `flag`. A value `-` is unset
    (off, or decided at run time); an integration table a region leaves out is one row saying what stands
    in for it. Every key is described in docs/operator-guide.md (Configuration reference).

    Example: spotctl config show regions.demo.policy
    """
    from spotctl.core.config_view import config_view

    st = state(ctx)
    cfg = st.config()
    view = config_view(cfg, key)
    data = {
        "files": cfg.files,
        "default_region": cfg.default_region,
        "regions": cfg.region_names(),
        "state_dir": str(cfg.state_dir()),
        "values": [{"key": s.key, "value": s.value, "source": s.source, "line": s.line} for s in view.settings],
        "not_configured": view.absent,
    }
    render.emit(st.fmt(), "config show", data, table=_table)


def _table(console, d: dict) -> None:
    from rich.table import Table

    console.print(f"files: {', '.join(d['files']) or 'none (built-in defaults)'}; state dir: {d['state_dir']}")
    t = Table(show_header=True)
    for col in ("key", "value", "source"):
        t.add_column(col, overflow="fold")
    absent = d["not_configured"]
    shown: set[str] = set()
    for row in d["values"]:
        table = next((name for name in absent if row["key"].startswith(name + ".")), None)
        if table is not None:
            if table not in shown:  # one row for a table the region leaves out
                shown.add(table)
                t.add_row(f"{table}.*", absent[table], "default")
            continue
        where = f"{row['source']}:{row['line']}" if row.get("line") else row["source"]
        t.add_row(row["key"], fmt.setting(row["value"]), where)
    console.print(t)
    console.print("source: default, FILE:LINE, env VAR or flag; '-': unset. Units are in the key names "
                  "(_seconds, _pct, _mb); a pool's price is per node-hour, in policy.currency.")
