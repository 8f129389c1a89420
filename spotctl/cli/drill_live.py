"""The live display of ``spotctl exercise-reclaim`` on stderr, while it waits for a pool's nodes to boot and
while the drill runs.

On a terminal: one Rich ``Live`` area — what the drill is at (a spinner, the wave, the victims' states,
the replacements), and beneath it the last line of the reconcile pass in progress (or the wait for the
region lock) — with the drill's events (a victim's state change, a replacement launched or active, a
stop) printed above it as they happen. The pass's own progress lines go into that area instead of
being written over it. Off a terminal: plain lines, one per event and one per change of the summary
(the pass lines only with -v). Nothing with -q.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Self

from . import fmt, render


class DrillDisplay:
    """Use as a context manager around the wait and the drill; it takes over the runtime's ``progress``
    and ``lock_wait`` hooks while it is open and gives them back after."""

    def __init__(self, st: Any, rt: Any) -> None:
        self.st, self.rt = st, rt
        self.tty = sys.stderr.isatty() and not st.quiet
        self.plain = not self.tty and not st.quiet
        self.live: Any = None
        self.head = ""
        self.lines: list[str] = []
        self.ticker = ""
        self.until: float | None = None  # a deadline shown as a countdown
        self.ready_at: float | None = None
        self.states: dict[str, str] = {}
        self.repl: dict[str, str] = {}
        self.last_summary = ""
        self.last_wait = ""
        self.stopped = False
        self.t0 = rt.now()
        self._saved: tuple[Any, Any] | None = None

    # -- the context: hooks in, Live on ------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._saved = (self.rt.progress, self.rt.lock_wait)
        self.rt.progress = self.pass_line
        if self.tty:
            from rich.live import Live

            self.rt.lock_wait = self
            self.live = Live(_View(self), console=render.console(stderr=True), transient=True,
                             redirect_stdout=False, redirect_stderr=True, refresh_per_second=8)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self._saved is not None:
            self.rt.progress, self.rt.lock_wait = self._saved
            self._saved = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The live area off for a while (a question on the terminal), then on again."""
        live, self.live = self.live, None
        if live is not None:
            live.stop()
        try:
            yield
        finally:
            if live is not None:
                live.start()
                self.live = live

    def event(self, text: str) -> None:
        """A line that stays: above the live area on a terminal, a plain line otherwise."""
        if self.live is not None:
            self.live.console.print(text, highlight=False, soft_wrap=True)
        elif self.plain:
            self.st.progress(text)

    # -- what feeds it -----------------------------------------------------------------------------------

    def pass_line(self, message: str) -> None:
        """A reconcile pass's progress line: the live area's last line (printed too with -v)."""
        if self.st.verbosity >= 1:
            self.event(message)
        self.ticker = message

    def waiting(self, elapsed: float, timeout: float, holder: str) -> None:
        """The wait for the region lock (the runtime's ``lock_wait`` on a terminal)."""
        self.ticker = ("waiting for the region lock" + (f", held by {holder}" if holder else "")
                       + f" ({elapsed:.0f}/{timeout:g} s)")

    def done(self) -> None:
        self.ticker = ""

    def booting(self, w: dict) -> None:
        """The wait for a pool's nodes to boot (:func:`spotctl.ops.drill.select_when_ready`)."""
        self.head = (f"waiting for pool {w['pool']}'s nodes to boot: {w['active']} of {w['count']} active, "
                     f"{w['booting']} booting")
        self.ready_at, self.until = w.get("ready_at"), w.get("until")
        self.lines = [(f"expected active at {fmt.ts(self.ready_at)} (launch + boot time {w['boot_seconds']} s); "
                       f"giving up at {fmt.ts(self.until)}")]
        line = self.head + f"; expected active at {fmt.ts(self.ready_at)}, giving up at {fmt.ts(self.until)}"
        if self.plain and line != self.last_wait:
            self.st.progress(line)
        self.last_wait = line

    def started(self, drill: dict, victims: int) -> None:
        self.head, self.lines, self.until, self.ready_at = "", [], None, None
        self.t0 = self.rt.now()
        self.event(f"drill {drill['id']} started: {victims} victim(s) in {len(drill['waves'])} wave(s)")

    def drill(self, s: dict) -> None:
        """Where the drill stands (:func:`spotctl.ops.drill.status`), after each of its passes."""
        for node, state in s["victims"].items():
            before = self.states.get(node, "active")
            if state != before:
                self.event(f"{node}: {before} → {state}")
            self.states[node] = state
        for r in s.get("replacements", ()):
            was = self.repl.get(r["node"])
            if was is None:
                self.event(f"replacement {r['node']} launched in pool {r['pool']} for {r['replaces']}")
            elif r["state"] != was:
                self.event(f"replacement {r['node']}: {was} → {r['state']}")
            self.repl[r["node"]] = r["state"]
        if s["abort_reason"] and not self.stopped:
            self.stopped = True
            self.event(f"stopping: {s['abort_reason']}")
        self.head = f"drill {s['id']} on pool {s['pool']}: wave {s['issued']} of {s['waves']} sent"
        self.lines = ["victims: " + fmt.counts(_count(s["victims"].values()))]
        if s.get("waiting_for"):
            self.lines.append("waiting for " + s["waiting_for"])
        building = [r for r in s.get("replacements", ()) if r["active_at"] is None and r["state"] not in (
            "gone", "failed", "lost")]
        if building:
            self.lines.append("waiting for replacement(s) to become active: " + ", ".join(
                f"{r['node']} (expected {fmt.ts(r['expected_active_at'])})" for r in building))
        summary = (f"drill {s['id']}: wave {s['issued']}/{s['waves']}, " + fmt.counts(_count(s["victims"].values()))
                   + (f"; replacements: {fmt.counts(_count(self.repl.values()))}" if self.repl else "")
                   + (f"; waiting for {s['waiting_for']}" if s.get("waiting_for") else ""))
        if self.plain and summary != self.last_summary:
            self.st.progress(summary)
        self.last_summary = summary


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


class _View:
    """What the Live area shows, rendered afresh at each refresh (the elapsed time and countdowns move)."""

    def __init__(self, d: DrillDisplay) -> None:
        self.d = d

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.spinner import Spinner
        from rich.text import Text

        d = self.d
        now = d.rt.now()
        head = d.head or "starting"
        head += f" — {fmt.duration(now - d.t0)}"
        if d.ready_at is not None and d.ready_at > now:
            head += f", due in {fmt.duration(d.ready_at - now)}"
        parts: list[Any] = [Spinner("dots", text=Text(head, overflow="ellipsis", no_wrap=True))]
        parts += [Text("  " + line, overflow="ellipsis", no_wrap=True) for line in d.lines]
        if d.ticker:
            parts.append(Text("  " + d.ticker, style="dim", overflow="ellipsis", no_wrap=True))
        return Group(*parts)
