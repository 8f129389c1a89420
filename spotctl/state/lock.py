"""The region's locks: the pass lock (one pass or operator action at a time) and the relay's own.

Both are ``flock`` locks on files beside the database (``<db>.lock``, ``<db>.relay.lock``): the
kernel drops them when the holder dies, even by ``kill -9``, so a crash never leaves a region locked.
:meth:`RegionLock.unlock` forgets the file descriptor before it releases it, so a signal landing in
it cannot make a later cleanup close it twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator

from spotctl.core.errors import StateError
from spotctl.state.connection import StoreBase


class RegionLock(StoreBase):
    """The lock methods of :class:`spotctl.state.store.Store`."""

    LOCK_POLL_SECONDS = 0.1  # how often a waiter for the pass lock tries it again

    def try_lock(self, wait: float = 0.0, *, purpose: str = "",
                 on_wait: Callable[[float], object] | None = None) -> bool:
        """Take the region's pass lock; False if another process holds it (still, after ``wait`` seconds).

        Waiting is a poll of a non-blocking ``flock`` every ``LOCK_POLL_SECONDS`` until the deadline: the one
        bounded wait there is, taken before a pass or an operator action starts, never inside one.
        ``on_wait(elapsed)`` is called at each poll (a spinner). The holder writes who it is into the lock
        file (``purpose``: what it does), for :meth:`lock_holder` to name it to whoever waits."""
        if self._lock_fd is not None:
            return True
        import math
        import socket
        import time

        path = str(self.path) + ".lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StateError(f"cannot open the region lock file {path}: {e.strerror or e}",
                             hint="it must be a regular file this user can write", details={"path": path}) from None
        t0 = time.monotonic()
        polls = math.ceil(wait / self.LOCK_POLL_SECONDS) if wait > 0 else 0  # a bound even if the clock stands
        held = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    elapsed = time.monotonic() - t0
                    if elapsed >= wait or polls <= 0:
                        return False
                    polls -= 1
                    if on_wait is not None:
                        on_wait(elapsed)
                    time.sleep(max(0.0, min(self.LOCK_POLL_SECONDS, wait - elapsed)))
            me = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": purpose[:200], "since": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            held = True
        finally:
            if not held:
                os.close(fd)  # not taken (busy, an error, or an interrupt while waiting): the flock goes with it
        self._lock_fd = fd
        return True

    def lock_holder(self) -> dict | None:
        """Who holds the region's pass lock, as the holder wrote it (``pid``, ``host``, ``purpose``, ``since``);
        None when unknown. Only meaningful while the lock is busy: the file keeps the last holder's record."""
        try:
            with open(str(self.path) + ".lock", encoding="utf-8", errors="replace") as f:
                raw = f.read(4096).strip()
        except OSError:
            return None
        if raw.isdigit():  # written by an older spotctl: the pid alone
            return {"pid": int(raw)}
        try:
            d = json.loads(raw)
        except ValueError:
            return None
        return d if isinstance(d, dict) else None

    @contextlib.contextmanager
    def relay_lock(self) -> Iterator[bool]:
        """The outbox relay's own lock (not the pass lock: a slow destination must not hold up passes or the
        watcher). Yields False, at once, when another process is relaying: it delivers the same rows."""
        fd = os.open(str(self.path) + ".relay.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def unlock(self) -> None:
        """Release the region's pass lock (a no-op when this store does not hold it)."""
        # forget the fd first: a Ctrl-C or SIGTERM landing in here must not make a later cleanup release it again
        # (a second close is EBADF, or worse, closes a file descriptor opened since)
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

