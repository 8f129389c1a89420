"""Who has a state database open, and whether the last one to have it open went away without closing it.

Every open :class:`spotctl.state.store.Store` holds a shared ``flock`` on ``<db>.users.lock`` from open
to close; the kernel drops it when the process dies, even by ``kill -9``. An opener that can take the
lock exclusively (for a moment, never waiting) knows that no other store has the database open. SQLite
deletes the write-ahead log (``<db>-wal``) when the last connection to a database closes cleanly; so a
log found by an opener that is alone was left by a process that did not close (killed, crashed, or a
power loss): an **unclean shutdown**, after which :meth:`Store.open` runs the full integrity check once.

What this never does: make a concurrent reader (``spotctl status`` during a timer pass) run the full
check — the pass holds the lock, so the reader is not alone — or make anyone wait (the exclusive try is
non-blocking; the shared lock is at most a moment behind another opener's exclusive try). A log left by
something that is not a store (the ``sqlite3`` shell, a read-only connection closing last) only costs
one extra check. ``flock`` locks belong to the open file, not the process, so two stores of one process
see each other too; the file descriptor is not inherited by programs spotctl runs (``O_CLOEXEC``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path


def users_lock_path(path: Path) -> Path:
    return Path(f"{path}.users.lock")


@dataclass
class Presence:
    """This store's hold on ``<db>.users.lock`` (``fd`` None: none, e.g. a read-only directory)."""

    fd: int | None
    alone: bool  # no other store had the database open when this one arrived
    wal_left: bool  # a write-ahead log was beside the file when this one arrived

    @property
    def unclean(self) -> bool:
        """The last store to have the database open did not close it (see the module docstring)."""
        return self.fd is not None and self.alone and self.wal_left

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # the flock goes with the file descriptor


def arrive(path: Path) -> Presence:
    """Join the database's users before opening it (call before the SQLite connection is made, so that our
    own connection's log is not mistaken for a leftover); a lock file that cannot be opened (a read-only
    directory, permissions) means no detection: never a full check because of it, never an error."""
    try:
        fd = os.open(users_lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return Presence(None, alone=False, wal_left=False)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        # seen while exclusive (if we are alone): no other store can be opening meanwhile and make one
        wal_left = os.path.lexists(f"{path}-wal")
        fcntl.flock(fd, fcntl.LOCK_SH)  # from exclusive: a conversion; else waits out another's exclusive try
    except BaseException:
        os.close(fd)
        raise
    return Presence(fd, alone=alone, wal_left=wal_left)
