"""A deadline that network calls made for a pass's observe phase respect.

``ops.observe`` reads every source in a worker thread and stops waiting for a
source at the pass's observe deadline (``policy.observe_deadline_seconds``). So
that a thread it stopped waiting for does not linger, it runs each source inside
:func:`until`, and an adapter bounds each HTTP request with :func:`bounded`: the
request's timeout is the configured one or the time left, whichever is shorter.

Outside :func:`until` (the watcher's long-polls, a pass's actions, the CLI's
other calls) :func:`bounded` returns the configured timeout unchanged. The clock
is ``time.monotonic``: wall-clock steps and simulated clocks do not move it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_UNTIL: ContextVar[float | None] = ContextVar("spotctl_deadline_until", default=None)

#: The shortest timeout handed to a request once the deadline is (nearly) gone: a timeout of 0 is
#: refused by HTTP clients, and the answer is not waited for anyway.
MIN_TIMEOUT = 0.05


@contextmanager
def until(monotonic_end: float | None) -> Iterator[None]:
    """Run the block under a deadline (a ``time.monotonic()`` value; None: no deadline)."""
    token = _UNTIL.set(monotonic_end)
    try:
        yield
    finally:
        _UNTIL.reset(token)


def remaining() -> float | None:
    """Seconds left before the current deadline (<= 0 once passed); None when there is none."""
    end = _UNTIL.get()
    return None if end is None else end - time.monotonic()


def bounded(timeout: float) -> float:
    """``timeout``, or the time left before the current deadline when that is shorter."""
    left = remaining()
    if left is None:
        return timeout
    return max(MIN_TIMEOUT, min(timeout, left))
