"""The ``spotctl`` Typer app: global options, command composition, the one error catch site."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer.core import TyperArgument, TyperGroup

if TYPE_CHECKING:
    from typer import _click as click

from spotctl.core.errors import ExitCode, SpotctlError

from .context import AppState, state
from .errors import (
    GuardedStdout,
    OutputError,
    internal_error,
    interrupted,
    output_failed,
    report,
    report_early,
    usage_error,
)
from .options import plain_values

HELP = """Spot Capacity Orchestrator for on-premises OpenStack clouds.

Sells idle and not-yet-used reserved capacity as preemptible spot nodes to
batch work pending in Kubernetes and Slurm, and hands it back on time.

With no configuration, spotctl uses the built-in demo region (a simulated
cloud, provider and schedulers): try `spotctl plan`, then `spotctl reconcile`.

Output: a table on a terminal, JSON otherwise; -o json|yaml|table to choose.

Verbosity, on stderr (stdout carries the result only): by default, progress
lines and warnings; -v adds info records (what each source returned, with
counts and times; each phase of the pass and its time; the plan's actions by
kind); -vv or --debug adds debug records (each planned action; the libraries'
own debug lines, such as the HTTP requests of the real adapters); -q leaves
errors only. --log-format json (or SPOTCTL_LOG_FORMAT=json) writes those lines
as JSON objects, one a line (ts, level, logger, msg, region, action_id...), for
journald or jq.

Every run that does work also writes all its debug lines to a log file of its
own under $XDG_STATE_HOME/spotctl/logs (~/.local/state/spotctl/logs; the last
10 are kept); a command that fails names it: spotctl: error: ... (log: PATH).

The global options (-o, -r/--region, -v, -q, --debug, --log-format, --config,
--state-dir) work after the command too: spotctl status -o json -v.

Exit codes: 0 ok, 1 unexpected, 2 usage, 3 config, 4 auth, 5 not found,
6 refused, 7 partial, 8 backend unavailable, 9 state database, 10 output not writable,
20-25 a bundle refused (invalid, untrusted, digest, files, expired, rollback), 130 interrupted, 141 reader gone (broken pipe), 143 terminated (SIGTERM).
"""


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class LogFormat(str, Enum):
    plain = "plain"
    json = "json"


GLOBAL_VALUE_OPTS = {"-o", "--output", "-r", "--region", "--config", "--state-dir", "--log-format"}
GLOBAL_FLAG_OPTS = {"-v", "--verbose", "-q", "--quiet", "--debug"}


#: The last lines of every sub-command's --help (set in one place, SpotctlGroup.get_command).
GLOBAL_EPILOG = ("Global options work after the command too: -o/--output, -r/--region, -v/-vv, -q, --debug, "
                 "--log-format, --config, --state-dir (see `spotctl --help`).")


class UsageArgument(TyperArgument):
    """An argument as usage lines and man pages write it: ``NODE``, ``[NODE]`` when optional (Typer's
    own usage line writes a required one as ``{node}``, which reads as a literal or a set)."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        if not self.required:
            name = f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")


def settle_help(cmd: click.Command) -> None:
    """What every sub-command's help shows, in one place: the epilog on the global options, and its
    arguments by their upper-case name (the metavar; the man pages use the same)."""
    if GLOBAL_EPILOG not in (cmd.epilog or ""):  # after a command's own epilog, when it has one
        cmd.epilog = f"{cmd.epilog}\n\n{GLOBAL_EPILOG}" if cmd.epilog else GLOBAL_EPILOG
    for p in cmd.params:
        if type(p) is TyperArgument:
            if p.metavar is None:
                p.metavar = (p.name or "arg").upper()
            p.__class__ = UsageArgument
    for sub in getattr(cmd, "commands", {}).values():
        settle_help(sub)


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


# Command name -> (module in spotctl.cli, its Typer app, its one-line help). Loaded on first use: `spotctl plan
# --help` imports and builds only `plan`; `spotctl --help` lists them all from the help here, importing none
# (tests/cli/test_command_table.py checks that each help is the first paragraph of the command's own).
COMMANDS: dict[str, tuple[str, ...]] = {
    "plan": ("plan", "app", "Show what the next reconcile pass would do, and why. Changes nothing."),
    "status": ("status", "app", ("Show the region: per pool its price, room, our nodes by state and contract policy; "
                                 "why nodes are advised or leaving; the contract feed's health; the token budget; "
                                 "the last pass.")),
    "reconcile": ("reconcile", "app", "Run one reconcile pass now: observe, plan, act under the token budget, persist."),
    "launch": ("launch", "app", "Launch spot nodes in a pool now, as an operator action."),
    "drain": ("drain", "app", "Drain a spot node in every scheduler at once (cordon, requeue or evict its work)."),
    "simulate": ("simulate", "app", "Replay hours of the region on a virtual clock and report the outcome."),
    "report": ("report", "app", ("Report savings against on-demand, demand served and waits, interruptions per pool, "
                                 "notice SLOs, advisory precision, drill scores and contract degradations over a "
                                 "window.")),
    "sim": ("sim", "sim_app", "The region's simulator, served over HTTP as the provider contract API."),
    "exercise-reclaim": ("drill", "drill_app", "Rehearse the provider's reclaim on live spot nodes, and score it."),
    "metrics": ("metrics", "app", "Print the region's Prometheus metrics, read from its state database."),
    "audit": ("audit", "app", "The tamper-evident audit trail of capacity actions."),
    "contract": ("contract", "contract_app", "The provider contract: is each of its five terms met, per pool?"),
    "config": ("config_cmd", "config_app", "Inspect the merged configuration."),
    "state": ("state_cmd", "state_app", "The region's state database: prune what its retention lets go, check it whole."),
    "bundle": ("bundle", "bundle_app", "Signed bundles for node agents: build, sign, verify; publish, serve and fetch over mutual TLS with SPIFFE identities."),
    "login": ("login", "login_app", "Log in to the region's Keycloak realm."),
    "logout": ("login", "logout_app", "Log out of the region: revoke the cached sessions at Keycloak, delete the cache."),
    "whoami": ("login", "whoami_app", "Show who you act as in the region: identity, realm and client roles, expiry."),
    "version": ("version", "app", "Print the spotctl version and the result format version."),
    "doctor": ("doctor", "app", ("Check every backend the region configures, the state database and the systemd "
                                 "units, and say how to fix what fails.")),
}


# Set by run(), the console entry: this process is spotctl itself (not a test invoking the app in-process).
PROCESS = {"entry": False}

# Commands whose stdout is data in a format of its own (CSV, JSON lines): an error never writes an envelope there.
RAW_OUTPUT_COMMANDS = {"audit export", "metrics"}


class SpotctlGroup(TyperGroup):
    """The root command: lazy sub-commands, and the single place that turns errors into exit codes."""

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in COMMANDS:
            return None
        import importlib

        module, attr = COMMANDS[name][:2]
        cmd = typer.main.get_command(getattr(importlib.import_module(f"spotctl.cli.{module}"), attr))
        cmd.name = name
        settle_help(cmd)
        plain_values(cmd, ctx)
        return cmd

    def format_commands(self, ctx, formatter) -> None:
        """The command list of ``spotctl --help``, from the one-line helps in COMMANDS: no command module is
        imported for it (one without a help there is loaded for its own)."""
        from typer._click.utils import make_default_short_help

        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = []
        for name, entry in COMMANDS.items():
            if len(entry) > 2:
                rows.append((name, make_default_short_help(entry[2], limit)))
            elif (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx, args):
        if ctx.parent is None:
            plain_values(self, ctx)  # the global options' values, without pydantic (see options.plain_values)
            args = hoist_global_options(list(args), self, ctx)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        from typer import _click as click

        words = [a for a in [*getattr(ctx, "_protected_args", []), *ctx.args] if not a.startswith("-")]
        if words[:1] and words[0] in RAW_OUTPUT_COMMANDS or " ".join(words[:2]) in RAW_OUTPUT_COMMANDS:
            ctx.meta["spotctl.raw_output"] = True
        try:
            return super().invoke(ctx)
        except SpotctlError as e:
            report(ctx, e)
            raise typer.Exit(int(e.exit_code)) from None
        except KeyboardInterrupt as e:
            from spotctl.core.errors import InterruptedError_, Terminated

            term = isinstance(e, Terminated)
            err = InterruptedError_("terminated" if term else "interrupted")
            if term:
                err.code, err.exit_code = "terminated", ExitCode.TERMINATED
            report(ctx, err, prefix="spotctl: ")
            raise typer.Exit(int(err.exit_code)) from None
        except (typer.Exit, typer.Abort):
            raise
        except click.exceptions.ClickException as e:
            report(ctx, usage_error(e))
            raise typer.Exit(int(ExitCode.USAGE)) from None
        except OutputError:
            raise
        except Exception as e:  # a bug: one line, the traceback only with --debug
            report(ctx, internal_error(e), exc=e)
            raise typer.Exit(int(ExitCode.UNEXPECTED)) from None
        finally:
            if PROCESS["entry"]:
                ignore_signals_at_exit()  # the command has ended: its cleanup is not cut short by a late signal
            obj = ctx.obj
            if isinstance(obj, AppState):
                obj.close()

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
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
            report_early(argv, usage_error(e), COMMANDS)
            code = int(ExitCode.USAGE)
        except typer.Abort:
            report_early(argv, interrupted(), COMMANDS)
            code = int(ExitCode.INTERRUPTED)
        except KeyboardInterrupt as e:
            from spotctl.core.errors import Terminated

            code = int(ExitCode.TERMINATED if isinstance(e, Terminated) else ExitCode.INTERRUPTED)
            sys.stderr.write(f"spotctl: {'terminated' if code == ExitCode.TERMINATED else 'interrupted'}\n")
        except OutputError as e:
            code = output_failed(e)
        if not standalone_mode:
            return code
        try:
            sys.stdout.flush()
        except OutputError as e:
            code = output_failed(e)
        sys.exit(code)


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
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help=(
        "More on stderr: -v info (what each source returned, the pass's phases and times), "
        "-vv debug (each planned action, the libraries' debug lines)."), show_default=False)] = 0,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="Errors only on stderr: no progress, no warnings.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="The debug log (as -vv), and the traceback of any error.")] = False,
    log_format: Annotated[LogFormat, typer.Option(
        "--log-format", help="How log lines on stderr look: plain, or json (one JSON object a line, for journald).",
        envvar="SPOTCTL_LOG_FORMAT", show_envvar=True, case_sensitive=False)] = LogFormat.plain,
    config: Annotated[Optional[str], typer.Option(
        "--config", help="Config file to use instead of the user file (same as SPOTCTL_CONFIG).",
        show_default=False)] = None,
    state_dir: Annotated[Optional[str], typer.Option(
        "--state-dir", help="Directory of the region state databases (default: $XDG_STATE_HOME/spotctl).",
        show_default=False)] = None,
) -> None:
    # Logging is set up when a command does real work (AppState.config), so --help stays fast.
    source = ctx.get_parameter_source("region")  # typer bundles its own click: compare the name
    if getattr(source, "name", None) == "ENVIRONMENT":
        region = None  # SPOTCTL_REGION, not a flag: the config loader reads it as the environment layer
    ctx.obj = AppState(output=output.value if output else None, region=region, verbosity=verbose, quiet=quiet, debug=debug,
                       log_format=log_format.value, config_path=config, state_dir=state_dir)



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
    sys.stdout = GuardedStdout(sys.stdout)
    PROCESS["entry"] = True
    try:
        app(prog_name="spotctl")
    except KeyboardInterrupt as e:  # while Typer builds the root command, before its error site (main) runs
        term = isinstance(e, Terminated)
        sys.stderr.write(f"spotctl: {'terminated' if term else 'interrupted'}\n")
        sys.exit(int(ExitCode.TERMINATED if term else ExitCode.INTERRUPTED))
    finally:
        ignore_signals_at_exit()


def ignore_signals_at_exit() -> None:
    """The command is over (its work done or closed): a Ctrl-C or SIGTERM now changes nothing, and must not
    kill the process while Python shuts down (it resets Python-level handlers to the default then, which
    would end a finished command with -SIGINT/-SIGTERM instead of its exit code). Ignored handlers are kept."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
