"""Waiting for the region lock: the ``--wait SECONDS`` option of the commands that take it, and the
spinner on stderr while they wait.

A command that changes the region (``launch``, ``drain``, ``reconcile``, ``exercise-reclaim``) takes the
region's pass lock. When a timer pass or another command holds it, the command waits for it up to
``--wait`` seconds (default 30; 0 refuses at once, as the timer's ``spot-reconciler`` always does),
before anything starts: nothing ever waits inside a pass.
"""

from __future__ import annotations

import sys
import time

import typer

from .options import finite

WAIT_DEFAULT = 30.0
WAIT_MAX = 3600.0


def wait_option(what: str = "refused (exit 6)"):
    """A fresh ``--wait`` option (each command gets its own)."""
    return typer.Option(
        "--wait", metavar="SECONDS", callback=finite(lo=0, hi=WAIT_MAX),
        help=f"When another pass or command holds the region lock, wait up to SECONDS for it (0-{WAIT_MAX:g}; "
             f"0: do not wait); still busy then: {what}, naming the holder.")


class LockSpinner:
    """Shows a wait for the region lock on stderr: a spinner line on a terminal, one line otherwise;
    nothing with -q."""

    FRAMES = "|/-\\"

    def __init__(self, st):
        self.st = st
        self.shown = False
        self.tty = False
        self.t_last = 0.0
        self.i = 0

    def waiting(self, elapsed: float, timeout: float, holder: str) -> None:
        if self.st.quiet:
            return
        if not self.shown:
            self.shown = True
            self.tty = sys.stderr.isatty()
            if not self.tty:
                self.st.progress(f"waiting up to {timeout:g} s for the region lock"
                                 + (f", held by {holder}" if holder else ""))
                return
        if not self.tty:
            return
        now = time.monotonic()
        if now - self.t_last < 0.1:
            return
        self.t_last = now
        self.i += 1
        line = (f"{self.FRAMES[self.i % len(self.FRAMES)]} waiting for the region lock"
                + (f", held by {holder}" if holder else "") + f" ({elapsed:.{0 if timeout >= 10 else 1}f}/{timeout:g} s)")
        sys.stderr.write("\r\x1b[2K" + line[:200])
        sys.stderr.flush()

    def done(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
        self.shown = False
