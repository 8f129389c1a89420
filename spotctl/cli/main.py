"""The ``spotctl`` Typer app: global options, command composition, the one error catch site."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from spotctl.core.errors import ExitCode, SpotctlError

from .context import AppState, state

HELP = """Spot Capacity Orchestrator for on-premises OpenStack clouds.

Sells idle and not-yet-used reserved capacity as preemptible spot nodes to
batch work pending in Kubernetes and Slurm, and hands it back on time.

With no configuration, spotctl uses the built-in demo region (a simulated
cloud, provider and schedulers): try `spotctl plan`, then `spotctl reconcile`.

Output: a table on a terminal, JSON otherwise; -o json|yaml|table to choose.
Exit codes: 0 ok, 1 unexpected, 2 usage, 3 config, 4 auth, 5 not found,
6 refused, 7 partial, 8 backend unavailable, 9 state database, 130 interrupted, 143 terminated (SIGTERM).
"""


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


GLOBAL_VALUE_OPTS = {"-o", "--output", "-r", "--region", "--config", "--state-dir"}
GLOBAL_FLAG_OPTS = {"-v", "--verbose", "-q", "--quiet", "--debug"}


def hoist_global_options(args: list[str]) -> list[str]:
    """Let global options follow the command too: ``spotctl plan -o json`` == ``spotctl -o json plan``."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest.extend(args[i:])
            break
        name = a.split("=", 1)[0]
        if name in GLOBAL_VALUE_OPTS:
            if "=" in a or i + 1 >= len(args):
                front.append(a)
            else:
                front.extend(args[i:i + 2])
                i += 1
        elif a in GLOBAL_FLAG_OPTS or (a.startswith("-v") and set(a[1:]) == {"v"}):
            front.append(a)
        elif a.startswith("-o") and len(a) > 2 and not a.startswith("--"):
            front.append(a)
        else:
            rest.append(a)
        i += 1
    return front + rest


# Command name -> (module in spotctl.cli, its Typer app). Loaded on first use: `spotctl plan --help`
# imports and builds only `plan`; `spotctl --help` loads them all for their one-line help.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "app"),
    "status": ("status", "app"),
    "reconcile": ("reconcile", "app"),
    "launch": ("launch", "app"),
    "drain": ("drain", "app"),
    "simulate": ("simulate", "app"),
    "sim": ("sim", "sim_app"),
    "exercise-reclaim": ("drill", "drill_app"),
    "audit": ("audit", "app"),
    "contract": ("contract", "contract_app"),
    "config": ("config_cmd", "config_app"),
    "version": ("version", "app"),
}


class SpotctlGroup(TyperGroup):
    """The root command: lazy sub-commands, and the single place that turns errors into exit codes."""

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in COMMANDS:
            return None
        import importlib

        module, attr = COMMANDS[name]
        cmd = typer.main.get_command(getattr(importlib.import_module(f"spotctl.cli.{module}"), attr))
        cmd.name = name
        return cmd

    def parse_args(self, ctx, args):
        if ctx.parent is None:
            args = hoist_global_options(list(args))
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except SpotctlError as e:
            _report(ctx, e)
            raise typer.Exit(int(e.exit_code)) from None
        except KeyboardInterrupt as e:
            from spotctl.core.errors import Terminated

            term = isinstance(e, Terminated)
            sys.stderr.write(f"spotctl: {'terminated' if term else 'interrupted'}\n")
            raise typer.Exit(int(ExitCode.TERMINATED if term else ExitCode.INTERRUPTED)) from None
        finally:
            obj = ctx.obj
            if isinstance(obj, AppState):
                obj.close()


def _report(ctx: typer.Context, e: SpotctlError) -> None:
    from . import render

    obj = ctx.obj if isinstance(ctx.obj, AppState) else AppState()
    if obj.debug:
        import traceback

        traceback.print_exc(file=sys.stderr)
    try:
        fmt = obj.fmt()
    except Exception:
        fmt = "table"
    if fmt in ("json", "yaml"):
        render.emit(fmt, obj.command or (ctx.invoked_subcommand or ""), None, status="error",
                    exit_code=int(e.exit_code), errors=[e.to_dict()])
    render.error(e.message, e.hint)


app = typer.Typer(cls=SpotctlGroup, help=HELP, no_args_is_help=True, add_completion=True,
                  context_settings={"help_option_names": ["-h", "--help"]}, rich_markup_mode=None)


@app.callback()
def main(
    ctx: typer.Context,
    output: Annotated[Optional[OutputFormat], typer.Option(
        "-o", "--output", help="Output format: table, json or yaml (default: table on a TTY, JSON otherwise).",
        show_default=False, case_sensitive=False)] = None,
    region: Annotated[Optional[str], typer.Option(
        "--region", "-r", help="Region to act on (default: the config's default_region, else 'demo').",
        envvar="SPOTCTL_REGION", show_envvar=True)] = None,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="More log output on stderr (-vv for debug).")] = 0,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress or warnings on stderr.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs on errors.")] = False,
    config: Annotated[Optional[str], typer.Option(
        "--config", help="Config file to use instead of the user file (same as SPOTCTL_CONFIG).",
        show_default=False)] = None,
    state_dir: Annotated[Optional[str], typer.Option(
        "--state-dir", help="Directory of the region state databases (default: $XDG_STATE_HOME/spotctl).",
        show_default=False)] = None,
) -> None:
    # Logging is set up when a command does real work (AppState.config), so --help stays fast.
    ctx.obj = AppState(output=output.value if output else None, region=region, verbosity=verbose, quiet=quiet, debug=debug,
                       config_path=config, state_dir=state_dir)



__all__ = ["COMMANDS", "app", "run", "state"]


def run() -> None:
    """Console entry point. SIGTERM is handled like Ctrl-C (exit 143 with a line, every cleanup run)."""
    import signal

    from spotctl.core.errors import Terminated

    def on_term(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    app(prog_name="spotctl")
