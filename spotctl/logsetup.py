"""How both entry points log (``spotctl`` and ``spot-reconciler``): one JSON line formatter for journald,
the fields a record carries beside its message, and the CLI's DEBUG log file per run.

Library code only calls ``logging.getLogger(__name__)`` and passes what it knows as ``extra``
(``extra={"action_id": ..., "region": ...}``); this module, imported by the entry points only when they set
logging up (stdlib only, so ``spotctl --help`` stays fast), decides how a record looks.

The log file per run is named and rotated as pipx does it (``cmd_<date>_<time>.log``, the newest ten
kept, oldest by name deleted); it is created 0600 in a 0700 directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import IO, Any

#: The ``--log-format`` values (and ``SPOTCTL_LOG_FORMAT``'s).
LOG_FORMATS = ("plain", "json")

#: What a record may carry beside its message (``extra=``), in the order a line shows them.
FIELDS = ("region", "action_id", "kind", "pool", "node", "result")

#: How many log files of past runs are kept (pipx keeps 10 too).
KEEP_LOGS = 10

#: Option names whose value is never written to a log (the value of ``--token``, ``--secret-env``...).
_SECRET_OPTION = re.compile(r"^--?[\w-]*(password|secret|token|key)([\w-]*)$", re.I)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The known fields a record carries (set with ``extra=``, or by :class:`RegionFilter`)."""
    out = {}
    for name in FIELDS:
        value = getattr(record, name, None)
        if value is not None and value != "":
            out[name] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``msg``, then
    the fields the record carries (region, action id, kind, pool, node, result) and ``exc`` for a traceback.
    journald stores each line as the MESSAGE of one entry; ``jq`` reads them back."""

    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {"ts": rfc3339(record.created), "level": record.levelname.lower(), "logger": record.name,
                             "msg": record.getMessage()}
        d.update(fields(record))
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, default=str, ensure_ascii=False)


class LineFormatter(logging.Formatter):
    """A plain line: ``LEVEL logger: message [action_id=… region=…]``; with ``timestamps`` (the log file)
    it starts with the time, ``2026-12-02T06:51:49.123Z``."""

    def __init__(self, timestamps: bool = False) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in fields(record).items())
        line = f"{record.levelname} {record.name}: {record.getMessage()}"
        if self.timestamps:
            line = f"{rfc3339(record.created)} {line}"
        if extra:
            line += f" [{extra}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class RegionFilter(logging.Filter):
    """Adds the region a run acts on to each record that does not name one (set once it is known)."""

    def __init__(self) -> None:
        super().__init__()
        self.region: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.region and getattr(record, "region", None) is None:
            record.region = self.region
        return True


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def log_dir(env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """``$XDG_STATE_HOME/spotctl/logs``, else ``~/.local/state/spotctl/logs``."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "spotctl" / "logs"


def open_run_log(directory: Path, keep: int = KEEP_LOGS, now: float | None = None) -> tuple[Path, IO[str]]:
    """A new log file for this run in ``directory`` (made 0700 if missing), opened for writing, 0600;
    the oldest files beyond the newest ``keep`` are deleted. Raises OSError when the directory cannot be
    made or written (the caller warns once and goes on without a file)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid == os.geteuid() and directory.stat().st_mode & 0o077:
        os.chmod(directory, 0o700)  # ours but readable by others (made by hand): close it
    stamp = time.strftime("%Y-%m-%d_%H.%M.%S", time.gmtime(time.time() if now is None else now))
    for n in range(100):  # several runs in one second: cmd_..._01.log, _02 ... (sorted by name = by age)
        path = directory / (f"cmd_{stamp}.log" if n == 0 else f"cmd_{stamp}_{n:02d}.log")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{directory}: 100 log files for {stamp} already")
    os.fchmod(fd, 0o600)  # whatever the umask
    stream = os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")
    rotate(directory, keep)
    return path, stream


def rotate(directory: Path, keep: int = KEEP_LOGS) -> list[Path]:
    """Delete all but the newest ``keep`` run logs (``cmd_*.log``, newest by name); what was deleted."""
    logs = sorted(directory.glob("cmd_*.log"))
    gone = []
    for old in logs[: max(0, len(logs) - keep)]:
        try:
            old.unlink()
            gone.append(old)
        except FileNotFoundError:
            pass  # another run deleted it first
    return gone


def redacted_argv(argv: list[str]) -> list[str]:
    """The command line as a log may show it: the value of an option named like a secret (``--token``,
    ``--secret-env``, ``--key``) is ``***``."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        name, eq, _ = a.partition("=")
        if a.startswith("-") and _SECRET_OPTION.match(name):
            if eq:
                out.append(f"{name}=***")
            else:
                out.append(a)
                hide_next = True
        else:
            out.append(a)
    return out
