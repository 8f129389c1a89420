"""The CLI's one error site: how every failure is told (``spotctl: error: …`` on stderr, the JSON/YAML
envelope on stdout when asked for, a traceback only with ``--debug``), how a click usage error or a
bug is put in our words, and what happens when standard output cannot be written."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from spotctl.core.errors import ExitCode, SpotctlError

from .context import AppState

if TYPE_CHECKING:
    from typer import _click as click


class OutputError(Exception):
    """Standard output could not be written (closed, full, or the reader went away)."""

    def __init__(self, err: OSError):
        super().__init__(err.strerror or str(err))
        self.errno = err.errno


class GuardedStdout:
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


def output_failed(e: OutputError) -> int:
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


def interrupted() -> SpotctlError:
    from spotctl.core.errors import InterruptedError_

    return InterruptedError_("interrupted")


def report(ctx: click.Context, e: SpotctlError, *, exc: BaseException | None = None, prefix: str = "") -> None:
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
    import logging

    obj.log_to_file(logging.ERROR, "%s%s", e.message, f" (hint: {e.hint})" if e.hint else "", exc=exc or e)
    if prefix:  # interrupted, terminated: the one line scripts and signal tests know, the log file has the rest
        sys.stderr.write(f"{prefix}{e.message}\n")
    else:  # the same line with --log-format json: the error's words are the CLI's contract (-o json has the envelope)
        render.error(e.message, e.hint, log=f" (log: {obj.log_file})" if obj.log_file is not None else "")


def report_early(argv: list[str], e: SpotctlError, commands: Iterable[str] = ()) -> None:
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
        command = next((a for a in argv if a in commands), "")
        try:
            render.emit(fmt, command, None, status=render.ResultStatus.ERROR, exit_code=int(e.exit_code),
                        errors=[e.to_dict()])
        except OutputError:
            pass
    render.error(e.message, e.hint)
