"""spotctl config show"""

from __future__ import annotations

import typer

from . import render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)
config_app = typer.Typer(rich_markup_mode=None, add_completion=False, help="Inspect the merged configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.callback()
def config_group() -> None:
    """Inspect the merged configuration."""


@config_app.command("show")
def show(ctx: typer.Context) -> None:
    """Print every configuration value with the layer it came from (secrets redacted).

    Layers: default < /etc/spotctl/config.toml < user file ($SPOTCTL_CONFIG or
    $XDG_CONFIG_HOME/spotctl/config.toml) < SPOTCTL_* environment < flags.

    Example: spotctl config show -o json
    """
    st = state(ctx)
    cfg = st.config()
    data = {
        "files": cfg.files,
        "default_region": cfg.default_region,
        "regions": cfg.region_names(),
        "state_dir": str(cfg.state_dir()),
        "values": [{"key": k, "value": v, "source": s} for k, v, s in cfg.flat()],
    }
    render.emit(st.fmt(), "config show", data, table=_table)


def _table(console, d: dict) -> None:
    from rich.table import Table

    console.print(f"files: {', '.join(d['files']) or 'none (built-in defaults)'}; state dir: {d['state_dir']}")
    t = Table(show_header=True)
    for col in ("key", "value", "source"):
        t.add_column(col, overflow="fold")
    for row in d["values"]:
        t.add_row(row["key"], str(row["value"]), row["source"])
    console.print(t)
