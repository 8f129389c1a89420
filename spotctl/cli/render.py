"""Rendering: results are data; this turns them into JSON, YAML or tables.

stdout carries data only. Errors, warnings and progress go to stderr. JSON
is a versioned envelope (``spotctl_result_version``) that scripts rely on;
``tests/cli/test_result_contract.py`` pins its shape.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from .fmt import duration, ts  # noqa: F401  (render.ts/render.duration: the table formats, see fmt)

RESULT_VERSION = 1


class ResultStatus(StrEnum):
    """Every status a JSON/YAML envelope may carry (scripts rely on this list; the result contract test
    pins it). A step's :class:`~spotctl.core.models.OutcomeStatus` is one of them."""

    OK = "ok"
    ERROR = "error"
    PARTIAL = "partial"
    PENDING = "pending"
    FAILED = "failed"
    SKIPPED = "skipped"
    DRY_RUN = "dry-run"
    MISMATCH = "mismatch"
    UNKNOWN = "unknown"
    AUTH_FAILED = "auth-failed"
    MET = "met"
    DEGRADED = "degraded"
    RUNNING = "running"
    DONE = "done"
    ABORTED = "aborted"


def envelope(command: str, data, *, status: ResultStatus | str = ResultStatus.OK, exit_code: int = 0,
             errors: list | None = None) -> dict:
    """The versioned result envelope. ``status`` must be a :class:`ResultStatus` (or its value: ValueError
    otherwise); it is written as the plain string, so that JSON is unchanged and YAML's safe dumper,
    which does not know enums, can write it."""
    return {
        "spotctl_result_version": RESULT_VERSION,
        "command": command,
        "status": ResultStatus(status).value,
        "exit_code": int(exit_code),
        "data": data,
        "errors": errors or [],
    }


def emit(fmt: str, command: str, data, *, status: ResultStatus | str = ResultStatus.OK, exit_code: int = 0,
         table: Callable | None = None, errors: list | None = None) -> None:
    import json

    if fmt == "json":
        sys.stdout.write(json.dumps(envelope(command, data, status=status, exit_code=exit_code, errors=errors),
                                    indent=2, sort_keys=False, default=str) + "\n")
    elif fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(json.loads(json.dumps(
            envelope(command, data, status=status, exit_code=exit_code, errors=errors), default=str)),
            sort_keys=False))
    elif table is not None:
        table(console(), data)
    else:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def emit_operator_action(fmt: str, command: str, facts: dict[str, Any], out: Any, *, dry_run: bool,
                         exit_code: int, table: Callable[..., None]) -> None:
    """The result of an operator's launch or drain: the facts checked, the outcome (None for a dry run);
    the status is the outcome's unless it went through. Ends the command with ``exit_code`` when not 0."""
    import typer

    data = {**facts, "dry_run": dry_run, "outcome": out.to_dict() if out else None}
    status = ResultStatus.OK if out is None or exit_code == 0 else out.status
    emit(fmt, command, data, status=status, exit_code=exit_code, table=table)
    if exit_code:
        raise typer.Exit(int(exit_code))


def console(stderr: bool = False):
    from rich.console import Console

    no_color = bool(os.environ.get("NO_COLOR"))
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    # COLUMNS, when set, is the width (a pipe, a script, a test); else the terminal's, or 160 off a terminal
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and 20 <= int(columns) <= 1000 else (None if tty else 160)
    return Console(file=stream, no_color=no_color, highlight=False, soft_wrap=False,
                   force_terminal=None if tty else False, width=width)


MAX_MESSAGE = 1000  # characters of an error line: echoed input is cut, never a 100 KB line on stderr


def error(message: str, hint: str | None = None, log: str | None = None) -> None:
    """``spotctl: error: MESSAGE`` (then ``(log: PATH)``, the run's log file, when it has one) and the hint.
    Without ``log`` (a command that ends failed with its result), the run's file is looked up, and told."""
    if log is None:
        log = _told_in_run_log(message, hint)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f"… ({len(message) - MAX_MESSAGE} more characters)"
    sys.stderr.write(f"spotctl: error: {message}{log}\n")
    if hint:
        sys.stderr.write(f"spotctl: hint: {hint}\n")
    sys.stderr.flush()


def _told_in_run_log(message: str, hint: str | None) -> str:
    """`` (log: PATH)`` of the running command's log file, the error written in it; "" without one."""
    import logging

    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    path = getattr(obj, "log_file", None)
    if obj is None or path is None:
        return ""
    obj.log_to_file(logging.ERROR, "%s%s", message, f" (hint: {hint})" if hint else "")
    return f" (log: {path})"
