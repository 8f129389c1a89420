"""A region's open state database: its connection, one write transaction at a time, and the check
that the file is still the region's.

:class:`StoreBase` is what the parts of the store (outbox, audit, lock, memory, and the ``Store``
that composes them) build on: ``path``, ``region``, ``conn`` and :meth:`StoreBase.tx`. A write
transaction is ``BEGIN IMMEDIATE`` (the write lock is taken at its start, where the busy timeout
waits for it, never half way through); nested calls join the outer one; the file's identity is
checked before it begins and again before it commits, so a state database deleted or replaced under
an open store is never written into.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from spotctl.core.errors import StateError
from spotctl.state.dbfile import identity, sqlite_error
from spotctl.state.presence import Presence

log = logging.getLogger(__name__)

#: SQLite's automatic checkpoint threshold (its default), put back after :meth:`StoreBase.checkpoints_deferred`
AUTOCHECKPOINT_PAGES = 1000
#: Rows a stretch under :meth:`StoreBase.checkpoints_deferred` changes, at least, for it to checkpoint at its end:
#: a pass that changed fewer wrote fewer pages than the automatic checkpoint waits for, which a later commit then
#: runs as it always did (a checkpoint after every small pass, two syncs each, was a tenth of a simulated day)
CHECKPOINT_AFTER_CHANGES = AUTOCHECKPOINT_PAGES


class Connection(sqlite3.Connection):
    """The store's connection: an operational failure (a read-only file, a table gone, a full disk,
    corruption met while reading) is a StateError naming the file, not a traceback — when a statement
    starts and while its rows are read (:class:`Cursor`): a damaged page in the middle of the file,
    which the cheap checks at open do not read, stops the command with exit 9 where it is met."""

    state_path: Path | None = None

    def _translated(self, call, *args):
        try:
            return call(*args)
        except sqlite3.Error as e:
            err = sqlite_error(self.state_path, e) if self.state_path is not None else None
            if err is None:
                raise
            raise err from e

    def execute(self, sql, parameters=(), /):
        return self._translated(self.cursor(Cursor).execute, sql, parameters)

    def executemany(self, sql, seq_of_parameters, /):
        return self._translated(self.cursor(Cursor).executemany, sql, seq_of_parameters)


class Cursor(sqlite3.Cursor):
    """Rows read through :class:`Connection`: SQLite steps a statement as its rows are fetched, so an
    error met on a later row (a corrupt page) is translated here too. Iteration fetches in chunks of
    ``FETCH`` rows (constant memory, about the speed of the C iterator)."""

    FETCH = 512

    def _translated(self, call, *args):
        conn = self.connection
        if not isinstance(conn, Connection):
            return call(*args)
        return conn._translated(call, *args)

    def fetchone(self):
        return self._translated(super().fetchone)

    def fetchmany(self, size: int | None = None):
        return self._translated(super().fetchmany, self.arraysize if size is None else size)

    def fetchall(self):
        return self._translated(super().fetchall)

    def __iter__(self):
        return self._rows()

    def _rows(self):
        while True:
            rows = self.fetchmany(self.FETCH)
            if not rows:
                return
            yield from rows


class StoreBase:
    """What every part of the store shares: the file, the region, the connection, and :meth:`tx`."""

    def __init__(self, path: Path, region: str, conn: sqlite3.Connection):
        self.path = path
        self.region = region
        self.conn = conn
        self._lock_fd: int | None = None
        self._in_tx = False
        #: True when this open created the database (a new region: nothing recorded before).
        self.created = False
        # The file's identity when opened: a file deleted or replaced under an open store is
        # noticed at the next write transaction instead of writing into a file nobody will read.
        self._identity = identity(path)
        self._wal_identity: tuple[int, int] | None = None  # the -wal file SQLite uses for it (see close)
        #: this store's hold on ``<db>.users.lock`` (:mod:`spotctl.state.presence`), released at close
        self._presence: Presence | None = None
        #: True when this open read every page (the last user had not closed the database)
        self.full_checked = False
        self._deferred_checkpoints = False  # defer_checkpoints(): commits leave the log to checkpoint()
        #: the pass row the last ``start_pass`` wrote (set inside its transaction: an interrupt before it
        #: returns still leaves the caller the row to close)
        self.started_pass: int | None = None
        self._on_commit: list = []  # after_commit(): what runs once the write transaction is committed

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; nested calls join the outer one.

        A signal (Ctrl-C, SIGTERM: an exception raised wherever the main thread is) may land between any two
        steps here. Every step after ``BEGIN`` runs inside the ``try`` that rolls back, and ``_in_tx`` says
        False again whatever happens: an interrupt never leaves the connection inside a transaction that this
        store thinks is over (the next write would fail with "cannot start a transaction within a
        transaction", and the caller's clean-up with it: a drill or pass row left running)."""
        if self._in_tx:
            yield self.conn
            return
        self.check_identity()
        committed = False
        try:
            self._in_tx = True
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as e:
                raise StateError(f"state database {self.path}: {e}") from None
            yield self.conn
            self._pre_commit()
            self.check_identity()  # commit-critical: never commit into a file that is no longer the region's
            done, self._on_commit = self._on_commit, []  # a failed COMMIT drops them too
            self.conn.execute("COMMIT")
            committed = True
        except BaseException:
            if not committed:
                self._on_commit.clear()
                self._rolled_back()
                # SQLite may have rolled back itself (a full disk, an I/O error); the connection may be closed
                # already (a signal's cleanup closed the store while this transaction's frame was unwound)
                with contextlib.suppress(sqlite3.Error, StateError):
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
            raise
        finally:
            self._in_tx = False
        for fn in done:
            fn()

    def after_commit(self, fn) -> None:
        """Run ``fn()`` once what the current write transaction wrote is committed (at once outside one;
        never when it is rolled back): a log line that says an outcome was recorded is written only then."""
        if self._in_tx:
            self._on_commit.append(fn)
        else:
            fn()

    def _pre_commit(self) -> None:
        """What a part of the store writes last in each write transaction, just before it commits (the
        outbox's pending counters): nothing here."""

    def _rolled_back(self) -> None:
        """A write transaction was rolled back: forget what :meth:`_pre_commit` would have written."""

    def defer_checkpoints(self) -> None:
        """Leave this connection's commits without SQLite's automatic checkpoint (copying the write-ahead log
        into the database, done by whichever commit finds the log past 1,000 pages: a few ms, more in a larger
        database): for a latency path such as the watcher's, which calls :meth:`checkpoint` once its work is
        done. Other connections (the passes) still checkpoint as usual."""
        if self._deferred_checkpoints:
            return
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self._deferred_checkpoints = True

    @contextlib.contextmanager
    def checkpoints_deferred(self) -> Iterator[None]:
        """A stretch of many write transactions (a pass) whose commits leave the write-ahead log to one
        checkpoint at its end. SQLite's automatic checkpoint runs inside whichever commit finds the log past
        1,000 pages, and copies and syncs every page the log holds: a pass of a thousand drains paid a dozen
        of them (25-30 ms each, most of it waiting for the disk), copying the same pages of the nodes, audit
        and outbox tables again each time. At the end, each page is copied once (``PASSIVE``: never waits for
        a reader), when the stretch changed :data:`CHECKPOINT_AFTER_CHANGES` rows or more. Nested in :meth:`defer_checkpoints` (the watcher's connection), it leaves that as it is.
        Durability is unchanged: a commit is in the log either way, and a crash before the checkpoint leaves
        it there for the next open to read."""
        if self._deferred_checkpoints:
            yield
            return
        self.defer_checkpoints()
        changes = self.conn.total_changes
        try:
            yield
            # (not after an error or an interrupt, nor after a few changes: a later commit's automatic one does it)
            if self.conn.total_changes - changes >= CHECKPOINT_AFTER_CHANGES:
                self.checkpoint()
        finally:
            self._deferred_checkpoints = False
            # an interrupt may have closed the store already (a signal's clean-up): nothing to put back then
            with contextlib.suppress(sqlite3.Error, StateError):
                self.conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")

    def checkpoint(self) -> None:
        """After :meth:`defer_checkpoints`: copy what the log holds into the database, as far as readers allow
        (``PASSIVE``: never waits for one, SQLite calls no busy handler; what is left goes with the next).
        Nothing otherwise."""
        if self._deferred_checkpoints and not self._in_tx:
            try:
                self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except (sqlite3.OperationalError, StateError) as e:  # (the store's connection says busy as a StateError)
                busy = not isinstance(e, StateError) or str(e.details.get("sqlite", "")).startswith(
                    ("SQLITE_BUSY", "SQLITE_LOCKED"))
                if not busy:
                    raise
                # busy (a writer or another checkpoint): the next one does it
                log.debug("state database %s: checkpoint deferred: %s", self.path, e)

    def check_identity(self) -> None:
        """Stop (StateError) when the database file was deleted or replaced since it was opened: writing on
        would go into a file nobody reads again, and everything recorded from then on would be lost."""
        if self._identity is None:
            return
        now = identity(self.path)
        if now != self._identity:
            raise StateError(
                f"state database {self.path} was deleted or replaced while spotctl had it open",
                hint="nothing more was written to it; what this command recorded before is not in the file "
                     "now at that path (SQLite's log of the old file is kept beside it as *-wal.orphaned-*): find "
                     "out what removed or replaced it, restore a backup if needed, and run the command again",
                details={"path": str(self.path), "deleted": now is None})


def inserted(cur: sqlite3.Cursor) -> int:
    """The rowid of the row an ``INSERT`` just made (the driver types it ``int | None``)."""
    if cur.lastrowid is None:
        raise StateError("the state database did not report the row it inserted")
    return cur.lastrowid
