"""spotctl version"""

from __future__ import annotations

import typer

from . import render
from .context import state

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def version(ctx: typer.Context) -> None:
    """Print the spotctl version and the result format version.

    Example: spotctl version -o json
    """
    import platform

    from spotctl import __version__

    st = state(ctx)
    data = {"version": __version__, "result_version": render.RESULT_VERSION, "python": platform.python_version()}
    render.emit(st.fmt(), "version", data, table=lambda c, d: c.print(f"spotctl {d['version']} (python {d['python']})"))
