"""How the CLI's log lines look on stderr (imported when logging is set up, so that --help stays fast)."""

from __future__ import annotations

import logging
import sys
from typing import Any


class LibraryFormatter(logging.Formatter):
    """``spotctl: LEVEL: message``; a library's own line names the library (``spotctl: warning: kafka: …``)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        top = record.name.split(".", 1)[0]
        if top not in ("spotctl", "root", "spot-reconciler"):
            msg = f"{top}: {msg}"
        return f"spotctl: {record.levelname.lower()}: {msg}"


class StderrHandler(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record comes, not the stream it was
    made with (an in-process run, a test's captured stderr, a stream replaced since)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass
