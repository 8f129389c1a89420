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
6 refused, 7 partial, 8 backend unavailable, 9 state database, 10 output not writable,
130 interrupted, 141 reader gone (broken pipe), 143 terminated (SIGTERM).
"""


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


GLOBAL_VALUE_OPTS = {"-o", "--output", "-r", "--region", "--config", "--state-dir"}
GLOBAL_FLAG_OPTS = {"-v", "--verbose", "-q", "--quiet", "--debug"}


def _value_opts(cmd) -> set[str]:
    """The options of a command that take a value (their next word is a value, never an option)."""
    out: set[str] = set()
    for p in getattr(cmd, "params", []):
        if getattr(p, "param_type_name", "") == "option" and not (getattr(p, "is_flag", False) or getattr(p, "count", False)):
            out.update(p.opts)
            out.update(p.secondary_opts)
    return out


def hoist_global_options(args: list[str], group=None, ctx=None) -> list[str]:
    """Let global options follow the command too: ``spotctl plan -o json`` == ``spotctl -o json plan``.

    The word after an option of the command that takes a value is that value and stays where it is:
    ``spotctl drain N --reason -q`` gives ``-q`` as the reason. ``--`` ends hoisting."""
    front: list[str] = []
    rest: list[str] = []
    cmd = None  # the (sub)command reached so far; None while still at the root
    values: set[str] = set()
    i = 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if a == "--":
            rest.extend(args[i:])
            break
        if cmd is not None and name in values:
            rest.append(a)
            if "=" not in a and i + 1 < len(args):
                rest.append(args[i + 1])
                i += 1
        elif name in GLOBAL_VALUE_OPTS:
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
            if not a.startswith("-") and group is not None:
                parent = cmd if cmd is not None else group
                sub = parent.get_command(ctx, a) if hasattr(parent, "get_command") else None
                if sub is not None:
                    cmd, values = sub, _value_opts(sub)
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


# Set by run(), the console entry: this process is spotctl itself (not a test invoking the app in-process).
PROCESS = {"entry": False}

# Commands whose stdout is data in a format of its own (CSV, JSON lines): an error never writes an envelope there.
RAW_OUTPUT_COMMANDS = {"audit export"}


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
            args = hoist_global_options(list(args), self, ctx)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):
        from typer import _click as click

        words = [a for a in [*getattr(ctx, "_protected_args", []), *ctx.args] if not a.startswith("-")]
        if " ".join(words[:2]) in RAW_OUTPUT_COMMANDS:
            ctx.meta["spotctl.raw_output"] = True
        try:
            return super().invoke(ctx)
        except SpotctlError as e:
            _report(ctx, e)
            raise typer.Exit(int(e.exit_code)) from None
        except KeyboardInterrupt as e:
            from spotctl.core.errors import InterruptedError_, Terminated

            term = isinstance(e, Terminated)
            err = InterruptedError_("terminated" if term else "interrupted")
            if term:
                err.code, err.exit_code = "terminated", ExitCode.TERMINATED
            _report(ctx, err, prefix="spotctl: ")
            raise typer.Exit(int(err.exit_code)) from None
        except (typer.Exit, typer.Abort):
            raise
        except click.exceptions.ClickException as e:
            _report(ctx, usage_error(e))
            raise typer.Exit(int(ExitCode.USAGE)) from None
        except OutputError:
            raise
        except Exception as e:  # a bug: one line, the traceback only with --debug
            _report(ctx, internal_error(e), exc=e)
            raise typer.Exit(int(ExitCode.UNEXPECTED)) from None
        finally:
            if PROCESS["entry"]:
                ignore_signals_at_exit()  # the command has ended: its cleanup is not cut short by a late signal
            obj = ctx.obj
            if isinstance(obj, AppState):
                obj.close()

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Errors before a command runs (a bad global option, an unknown command) and output that cannot be
        written end here, through the same error site as the rest."""
        from typer import _click as click

        argv = list(sys.argv[1:] if args is None else args)
        prog_name = prog_name or "spotctl"
        # What typer's own main does, without its silent turn of a Ctrl-C into exit 130 with no line
        self._main_shell_completion(extra, prog_name, complete_var)
        try:
            try:
                with self.make_context(prog_name, argv, **extra) as ctx:
                    rv = self.invoke(ctx)
                code = rv if isinstance(rv, int) else 0
            except EOFError:
                raise typer.Abort() from None
        except typer.Exit as e:
            code = e.exit_code
        except click.exceptions.NoArgsIsHelpError as e:
            e.show()
            code = e.exit_code
        except click.exceptions.ClickException as e:
            _report_early(argv, usage_error(e))
            code = int(ExitCode.USAGE)
        except typer.Abort:
            _report_early(argv, _interrupted())
            code = int(ExitCode.INTERRUPTED)
        except KeyboardInterrupt as e:
            from spotctl.core.errors import Terminated

            code = int(ExitCode.TERMINATED if isinstance(e, Terminated) else ExitCode.INTERRUPTED)
            sys.stderr.write(f"spotctl: {'terminated' if code == ExitCode.TERMINATED else 'interrupted'}\n")
        except OutputError as e:
            code = _output_failed(e)
        if not standalone_mode:
            return code
        try:
            sys.stdout.flush()
        except OutputError as e:
            code = _output_failed(e)
        sys.exit(code)


class OutputError(Exception):
    """Standard output could not be written (closed, full, or the reader went away)."""

    def __init__(self, err: OSError):
        super().__init__(err.strerror or str(err))
        self.errno = err.errno


class _GuardedStdout:
    """sys.stdout, with a failed write raised as :class:`OutputError` so that the error site can tell it
    from other I/O errors: a broken pipe (``spotctl status | head -1``) ends quietly, a full disk says so."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, s):
        try:
            return self._stream.write(s)
        except OSError as e:
            raise OutputError(e) from None

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as e:
            raise OutputError(e) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _output_failed(e: OutputError) -> int:
    import errno
    import os

    try:  # nothing more goes to the closed stream, not even at interpreter exit
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.__stdout__.fileno() if sys.__stdout__ else 1)
        os.close(fd)
    except (OSError, ValueError):
        pass
    if e.errno == errno.EPIPE:
        return int(ExitCode.PIPE)  # the reader is gone: quiet, as other Unix tools end on SIGPIPE
    sys.stderr.write(f"spotctl: error: cannot write to standard output: {e}\n")
    return int(ExitCode.OUTPUT)


def usage_error(e) -> SpotctlError:
    """A click/typer usage error in our words: ``--count must be >= 1, got '-1'``."""
    from spotctl.core.errors import UsageError

    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "spotctl"
    hint = f"see '{path} --help'"
    param = getattr(e, "param", None)
    name = "/".join(o for o in getattr(param, "opts", []) if o.startswith("--")) or (
        param.opts[0] if param is not None and getattr(param, "opts", None) else None)
    if param is not None and getattr(param, "param_type_name", "") == "argument":
        name = (getattr(param, "metavar", None) or param.name or "argument").upper()
    cause = e.__cause__
    errors = cause.errors() if cause is not None and hasattr(cause, "errors") else None
    if errors and name:
        first = errors[0]
        msg = _pydantic_phrase(first)
        got = first.get("input")
        shown = got is not None and first.get("type") != "value_error"
        message = f"{name} {msg}" + (f", got {_shown(got)}" if shown else "")
        if param is not None and getattr(param, "type", None) is not None and hasattr(param.type, "choices"):
            hint = "one of: " + ", ".join(map(str, param.type.choices))
    elif type(e).__name__ == "MissingParameter" and name:
        message = f"{name} is required"
    elif type(e).__name__ == "BadParameter" and name:
        message = f"{name} {e.message}"
    else:
        message = e.format_message().rstrip(".")
        message = message[0].lower() + message[1:] if message[:1].isupper() and message[1:2].islower() else message
    return UsageError(message, hint=hint)


def _pydantic_phrase(err: dict) -> str:
    c = err.get("ctx") or {}
    kind = err.get("type", "")
    phrases = {
        "greater_than_equal": lambda: f"must be >= {c.get('ge')}",
        "greater_than": lambda: f"must be > {c.get('gt')}",
        "less_than_equal": lambda: f"must be <= {c.get('le')}",
        "less_than": lambda: f"must be < {c.get('lt')}",
        "int_parsing": lambda: "must be an integer",
        "int_from_float": lambda: "must be an integer",
        "float_parsing": lambda: "must be a number",
        "finite_number": lambda: "must be a finite number",
        "bool_parsing": lambda: "must be true or false",
        "enum": lambda: f"must be one of {c.get('expected')}",
    }
    if kind in phrases:
        return phrases[kind]()
    if kind == "value_error" and isinstance(c.get("error"), Exception):
        return str(c["error"]).rstrip(".")
    msg = str(err.get("msg", "is not valid"))
    return msg[0].lower() + msg[1:] if msg else msg


def _shown(value: object, limit: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 1] + "…'"


def internal_error(e: Exception) -> SpotctlError:
    err = SpotctlError(f"internal error: {type(e).__name__}: {_shown(str(e), 200)[1:-1]}",
                       hint="this is a bug: run again with --debug for the traceback, and report it")
    err.code = "internal"
    return err


def _interrupted() -> SpotctlError:
    from spotctl.core.errors import InterruptedError_

    return InterruptedError_("interrupted")


def _report(ctx: typer.Context, e: SpotctlError, *, exc: BaseException | None = None, prefix: str = "") -> None:
    from . import render

    obj = ctx.obj if isinstance(ctx.obj, AppState) else AppState()
    if obj.debug:
        import traceback

        traceback.print_exception(exc or e, file=sys.stderr)
    try:
        fmt = obj.fmt()
    except Exception:
        fmt = "table"
    if fmt in ("json", "yaml") and not ctx.meta.get("spotctl.raw_output"):
        try:
            render.emit(fmt, obj.command or (ctx.invoked_subcommand or ""), None, status=render.ResultStatus.ERROR,
                        exit_code=int(e.exit_code), errors=[e.to_dict()])
        except OutputError:
            pass
    if prefix:
        sys.stderr.write(f"{prefix}{e.message}\n")
    else:
        render.error(e.message, e.hint)


def _report_early(argv: list[str], e: SpotctlError) -> None:
    """The error site for errors raised before the root context holds our state: the output format is read
    from the words given (``-o json``) and the environment."""
    import os

    from . import render

    fmt = (os.environ.get("SPOTCTL_OUTPUT") or "").lower()
    for i, a in enumerate(argv):
        if a in ("-o", "--output") and i + 1 < len(argv):
            fmt = argv[i + 1].lower()
        elif a.startswith("--output=") or (a.startswith("-o") and len(a) > 2 and not a.startswith("--")):
            fmt = a.split("=", 1)[-1][2:].lower() if not a.startswith("--") else a.split("=", 1)[1].lower()
    if fmt in ("", "auto"):
        fmt = "table" if sys.stdout.isatty() else "json"
    if fmt in ("json", "yaml"):
        command = next((a for a in argv if a in COMMANDS), "")
        try:
            render.emit(fmt, command, None, status=render.ResultStatus.ERROR, exit_code=int(e.exit_code),
                        errors=[e.to_dict()])
        except OutputError:
            pass
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
    if sys.stdout is None:  # started with stdout closed (>&-)
        sys.stderr.write("spotctl: error: standard output is closed\n")
        sys.exit(int(ExitCode.OUTPUT))
    sys.stdout = _GuardedStdout(sys.stdout)  # type: ignore[assignment]
    PROCESS["entry"] = True
    try:
        app(prog_name="spotctl")
    finally:
        ignore_signals_at_exit()


def ignore_signals_at_exit() -> None:
    """The command is over (its work done or closed): a Ctrl-C or SIGTERM now changes nothing, and must not
    kill the process while Python shuts down (it resets Python-level handlers to the default then, which
    would end a finished command with -SIGINT/-SIGTERM instead of its exit code). Ignored handlers are kept."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
