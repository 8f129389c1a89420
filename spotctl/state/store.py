"""The state store: one SQLite database per region (WAL, versioned migrations).

What it holds: our nodes and every transition; actions with their idempotency
key, recorded *before* each side effect; the token bucket; plan history with
the inputs that produced each plan; pool failure memory; notices seen; and the
**outbox** — lifecycle events (CloudEvents) and audit records written in the
same transaction as the state change they describe, for the relays to deliver.

Audit records are chained: each carries the SHA-256 of the previous one (the chain: spotctl.core.audit).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import sqlite3
import uuid
import zlib
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from spotctl.core.audit import GENESIS, audit_hash, canonical, walk
from spotctl.core.budget import Bucket, Priority
from spotctl.core.errors import NotFoundError, StateError
from spotctl.core.lifecycle import check_transition, event_type
from spotctl.core.models import Node, NodeState

log = logging.getLogger(__name__)

SCHEMA_VERSION = 4

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY, pool TEXT NOT NULL, state TEXT NOT NULL, action_id TEXT NOT NULL UNIQUE,
        instance_id TEXT, host TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL,
        reason TEXT NOT NULL DEFAULT '', cordoned INTEGER NOT NULL DEFAULT 0, idle_since REAL,
        notice_deadline REAL, notice_id TEXT, price REAL NOT NULL DEFAULT 0
    );
    CREATE INDEX nodes_state ON nodes(state);
    CREATE TABLE transitions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, node_id TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL,
        at REAL NOT NULL, reason TEXT NOT NULL, actor TEXT NOT NULL
    );
    CREATE INDEX transitions_node ON transitions(node_id);
    CREATE TABLE actions (
        id TEXT PRIMARY KEY, plan_id TEXT, kind TEXT NOT NULL, pool TEXT, node TEXT, count INTEGER,
        priority TEXT NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL, actor TEXT NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, result TEXT, inputs TEXT NOT NULL
    );
    CREATE INDEX actions_status ON actions(status);
    CREATE TABLE plans (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, plan_id TEXT NOT NULL, at REAL NOT NULL, actor TEXT NOT NULL,
        executed INTEGER NOT NULL, summary TEXT NOT NULL, input BLOB NOT NULL
    );
    CREATE TABLE budget (
        region TEXT PRIMARY KEY, rate REAL NOT NULL, burst INTEGER NOT NULL, tokens REAL NOT NULL, at REAL NOT NULL,
        used_total INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE pool_failures (pool TEXT PRIMARY KEY, until REAL NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL);
    CREATE TABLE reclaims (id INTEGER PRIMARY KEY AUTOINCREMENT, pool TEXT NOT NULL, node_id TEXT NOT NULL,
        at REAL NOT NULL, kind TEXT NOT NULL);
    CREATE TABLE notices (
        id TEXT PRIMARY KEY, node_id TEXT, instance_id TEXT NOT NULL, kind TEXT NOT NULL, issued_at REAL NOT NULL,
        deadline REAL, first_seen_at REAL NOT NULL, handled_at REAL, reason TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, key TEXT NOT NULL, payload TEXT NOT NULL,
        created_at REAL NOT NULL, delivered_at REAL
    );
    CREATE INDEX outbox_pending ON outbox(kind, delivered_at);
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, at REAL NOT NULL, actor TEXT NOT NULL,
        action TEXT NOT NULL, target TEXT NOT NULL, result TEXT NOT NULL, inputs TEXT NOT NULL,
        prev_hash TEXT NOT NULL, hash TEXT NOT NULL
    );
    CREATE TABLE passes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, started_at REAL NOT NULL, finished_at REAL, actor TEXT NOT NULL,
        status TEXT NOT NULL, summary TEXT NOT NULL DEFAULT '{}'
    );
    """,
    2: """
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL);
    """,
    3: """
    ALTER TABLE notices ADD COLUMN delivered_at REAL;
    ALTER TABLE notices ADD COLUMN pool TEXT;
    CREATE INDEX notices_seen ON notices(first_seen_at);
    """,
    4: """
    ALTER TABLE nodes ADD COLUMN protected_until REAL;
    ALTER TABLE nodes ADD COLUMN protect_closed INTEGER NOT NULL DEFAULT 0;
    """,
}

_NODE_COLS = ("id", "pool", "state", "action_id", "instance_id", "host", "created_at", "updated_at", "reason",
              "cordoned", "idle_since", "notice_deadline", "notice_id", "price", "protected_until", "protect_closed")


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")


# -- the state database as an input: every failure is a StateError naming the file (exit 9) ---------------

SQLITE_MAGIC = b"SQLite format 3\x00"
_RESTORE = ("nothing was changed; move the file aside and restore a backup, or start afresh (`mv` it away) if "
            "losing local state is acceptable")


def clip(value, limit: int = 80) -> str:
    """``repr`` of a value read from the database or typed by a user, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _identity(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at ``path``; None when nothing is there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _version_stamp(path: Path) -> tuple | None:
    """What changes when anyone writes the file: identity, size, modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _writable_dir(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def read_only_error(path: Path) -> StateError:
    """The file, or the directory SQLite must create its ``-wal``/``-shm`` files in, cannot be written."""
    hint = ("nothing was changed; make it writable for the user running spotctl (check its permissions, "
            "`lsattr` flags and the mount), or point --state-dir at a writable copy")
    if not _writable_dir(path.parent):
        return StateError(f"state directory {path.parent} is read-only: state database {path} cannot be used "
                          "(SQLite keeps its -wal and -shm files beside it)",
                          hint=hint, details={"path": str(path)})
    return StateError(f"state database {path} is read-only", hint=hint, details={"path": str(path)})


def sqlite_error(path: Path, e: sqlite3.Error) -> StateError | None:
    """The user's view of an SQLite failure on the state database, or None for a programming error
    (IntegrityError, ProgrammingError, a syntax error: bugs, left as they are)."""
    if type(e) not in (sqlite3.OperationalError, sqlite3.DatabaseError):
        return None
    name = getattr(e, "sqlite_errorname", "") or ""
    msg = str(e)
    details = {"path": str(path), "sqlite": name or msg}
    if name.startswith("SQLITE_READONLY") or "readonly database" in msg:
        return read_only_error(path)
    if name.startswith("SQLITE_CANTOPEN") or "unable to open database file" in msg:
        if not _writable_dir(path.parent) or (path.exists() and not os.access(path, os.W_OK)):
            return read_only_error(path)
        if not path.exists():
            return StateError(f"state database {path} was deleted while spotctl had it open",
                              hint="nothing more was written; restore the file from a backup", details=details)
        return StateError(f"state database {path} cannot be opened: {msg}", details=details)
    if msg.startswith(("no such table", "no such column")) or " has no column named " in msg:
        return StateError(f"state database {path} is damaged or not a spotctl state database: {msg}",
                          hint=_RESTORE, details=details)
    if name.startswith("SQLITE_FULL") or "disk is full" in msg:
        return StateError(f"the disk holding state database {path} is full", hint="nothing was changed; free space "
                          "and run the command again", details=details)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in msg:
        return StateError(f"state database {path} stayed locked by another process for more than 10 s",
                          hint="nothing was changed; run the command again", details=details)
    if name.startswith("SQLITE_IOERR") or "disk I/O error" in msg:
        return StateError(f"state database {path}: I/O error ({msg})", hint="nothing was changed; check the disk",
                          details=details)
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or type(e) is sqlite3.DatabaseError:
        return StateError(f"state database {path} is unreadable or corrupt: {msg}", hint=_RESTORE, details=details)
    return None


class _Connection(sqlite3.Connection):
    """The store's connection: an operational failure (a read-only file, a table gone, a full disk,
    corruption met while reading) is a StateError naming the file, not a traceback."""

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
        return self._translated(super().execute, sql, parameters)

    def executemany(self, sql, seq_of_parameters, /):
        return self._translated(super().executemany, sql, seq_of_parameters)


def _open_error(path: Path, e: sqlite3.Error) -> StateError:
    """Why an existing state database could not be opened: read-only (the file, or the directory its
    -wal/-shm files go in) is said as such; anything else is unreadable or corrupt."""
    err = sqlite_error(path, e)
    if err is not None and "read-only" in err.message:
        return err
    if not _writable_dir(path.parent) and not Path(f"{path}-shm").exists():
        return read_only_error(path)
    return StateError(f"state database {path} is unreadable or corrupt: {e}", hint=_RESTORE,
                      details={"path": str(path)})


def _check_lock_paths(path: Path) -> None:
    """The lock files beside the database must be files (or not exist yet): a directory there would make
    every pass fail when it takes the lock."""
    for lock in (Path(f"{path}.lock"), Path(f"{path}.relay.lock")):
        if os.path.lexists(lock) and not lock.is_file():
            kind = "a directory" if lock.is_dir() else "not a regular file"
            raise StateError(f"lock file {lock} of state database {path.name} is {kind}",
                             hint="nothing was changed; remove it (spotctl creates the lock file itself)",
                             details={"path": str(lock)})


def _check_existing(path: Path) -> None:
    """An existing state database must be an SQLite file: an empty, cut-short or foreign file is not a new
    region (its history and audit chain would silently vanish) but corruption, and it is left as it is."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(len(SQLITE_MAGIC))
    except IsADirectoryError:
        raise StateError(f"state database {path} is a directory, not a file", hint="move it away",
                         details={"path": str(path)}) from None
    except OSError as e:
        raise StateError(f"cannot read state database {path}: {e.strerror}", details={"path": str(path)}) from None
    if st.st_size == 0:
        why = "is empty (0 bytes)"
    elif head != SQLITE_MAGIC:
        why = (f"is not an SQLite database (its {st.st_size} byte{'s' if st.st_size != 1 else ''} do not start "
               "with the SQLite header)")
    elif st.st_size < 512:  # the smallest SQLite page
        why = f"is cut short ({st.st_size} bytes)"
    else:
        return
    raise StateError(f"state database {path} {why}: it is corrupt, not a new region",
                     hint=_RESTORE, details={"path": str(path), "size": st.st_size})


_EXPECTED: dict[str, set[str]] = {}


def _expected_schema() -> dict[str, set[str]]:
    """Table -> columns, as the migrations make them (built once, in memory)."""
    if not _EXPECTED:
        c = sqlite3.connect(":memory:")
        for v in range(1, SCHEMA_VERSION + 1):
            for stmt in _statements(MIGRATIONS[v]):
                c.execute(stmt)
        _EXPECTED.update(_schema(c))
        c.close()
    return _EXPECTED


def _schema(conn: sqlite3.Connection) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for table, column in conn.execute("SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p "
                                      "WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'"):
        out.setdefault(table, set()).add(column)
    return out


def bad_value(path: Path, table: str, key, column: str, value, known=None) -> StateError:
    """A row holding a value this spotctl cannot read (an unknown state, a mangled JSON column)."""
    what = f"{column} {clip(value)}"
    if known:
        what += f", which is not one of {', '.join(sorted(known))}"
    return StateError(f"state database {path}: {table} row {clip(key)} has an unreadable {what}",
                      hint="the file was edited by hand, or written by a newer spotctl (then upgrade); " + _RESTORE,
                      details={"path": str(path), "table": table, "row": clip(key), "column": column})


def _loads(path: Path, table: str, key, column: str, raw):
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        raise bad_value(path, table, key, column, raw) from None


class Store:
    """A region's state database. Use :meth:`open`; close with :meth:`close`."""

    def __init__(self, path: Path, region: str, conn: sqlite3.Connection):
        import sqlite_utils

        self.path = path
        self.region = region
        self.conn = conn
        self.db = sqlite_utils.Database(conn)
        self._lock_fd: int | None = None
        self._in_tx = False
        #: True when this open created the database (a new region: nothing recorded before).
        self.created = False
        # The file's identity when opened: a file deleted or replaced under an open store is
        # noticed at the next write transaction instead of writing into a file nobody will read.
        self._identity = _identity(path)
        self._wal_identity: tuple[int, int] | None = None  # the -wal file SQLite uses for it (see close)

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, region: str, *, create: bool = True) -> "Store":
        """Open a region's state database. Only a missing file means a new region: it is created whole
        (migrated in a temporary file, then linked into place), so no other process ever sees it half made;
        an existing file that is empty, cut short or not SQLite is corruption and is left untouched."""
        path = Path(path)
        created = False
        if not os.path.lexists(path):
            if not create:
                raise NotFoundError(f"no state database at {path}",
                                    hint="run `spotctl reconcile` (or any command) once to create it")
            created = cls._create(path, region)
        else:
            _check_existing(path)
        _check_lock_paths(path)
        prechecked = False
        if not created and not os.path.lexists(f"{path}-wal"):
            seen = _version_stamp(path)
            try:
                cls._precheck(path, region)
                prechecked = True
            except StateError:
                # another process may have opened and checkpointed it meanwhile (the immutable read takes no
                # lock): only a file that stayed as it was is refused here; else check again, under the locks
                if _version_stamp(path) == seen and not os.path.lexists(f"{path}-wal"):
                    raise
        try:
            conn = sqlite3.connect(str(path), timeout=10, isolation_level=None, check_same_thread=False,
                                   factory=_Connection)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=10000")
            # read-only checks first (integrity, then version and schema): nothing is written to a file
            # that turns out to be damaged or foreign, not even the switch to WAL
            check = "ok" if prechecked else conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
        except sqlite3.DatabaseError as e:
            with contextlib.suppress(UnboundLocalError, sqlite3.Error):
                conn.close()
            raise _open_error(path, e) from None
        store = cls(path, region, conn)
        store.created = created
        try:
            store._migrate()
            store._check_schema()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as e:
            conn.close()
            raise _open_error(path, e) from None
        except BaseException:
            conn.close()
            raise
        conn.state_path = path  # from here on, SQLite failures name the file (StateError)
        store._wal_identity = _identity(Path(f"{path}-wal"))
        return store

    @classmethod
    def _create(cls, path: Path, region: str) -> bool:
        """Make a new, fully migrated state database at ``path``; False if another process made it first."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise StateError(f"cannot create state directory {path.parent}: it is read-only ({e.strerror})",
                                 hint="point --state-dir (or state_dir) at a writable directory") from None
            raise StateError(f"cannot create state directory {path.parent}: {e.strerror}") from None
        leftovers = [f for f in (Path(f"{path}-wal"), Path(f"{path}-shm")) if os.path.lexists(f)]
        if leftovers:
            if os.path.lexists(path):
                return False  # another process created the database (and opened it) since we looked
            wal = Path(f"{path}-wal")
            size = wal.stat().st_size if wal.exists() else 0
            raise StateError(
                f"state database {path} is missing but its SQLite side files are still there "
                f"({', '.join(f.name for f in leftovers)}{f', {size} bytes of log' if size else ''}): it was "
                "deleted while in use or after a crash, and a new database would replay that log",
                hint=f"nothing was changed; restore {path.name} from a backup, or, to start the region afresh, "
                     f"move {' and '.join(f.name for f in leftovers)} away too",
                details={"path": str(path), "leftovers": [str(f) for f in leftovers]})
        tmp = path.with_name(f".{path.name}.new-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            conn = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                cls(tmp, region, conn)._migrate()
            finally:
                conn.close()
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
                if os.path.lexists(path):  # no hard links here: rename, unless another process won
                    return False
                os.rename(tmp, path)
                return True
        except sqlite3.DatabaseError as e:
            raise _open_error(path, e) from None
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or not _writable_dir(path.parent):
                raise read_only_error(path) from None
            raise StateError(f"cannot create state database {path}: {e.strerror}") from None
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _preflight(self) -> int:
        """The schema version, refusing a newer one and a foreign SQLite file (reads only)."""
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StateError(
                f"state database {self.path} has schema version {version}, newer than this spotctl "
                f"understands ({SCHEMA_VERSION})", hint="upgrade spotctl")
        if version == 0:
            foreign = [r[0] for r in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            if foreign:
                raise StateError(
                    f"state database {self.path} is not a spotctl state database (it holds tables "
                    f"{', '.join(clip(t, 40) for t in foreign[:5])} but no spotctl schema version)",
                    hint="nothing was changed; point --state-dir elsewhere or move the file away",
                    details={"path": str(self.path)})
        return version

    @classmethod
    def _precheck(cls, path: Path, region: str) -> None:
        """Every read-only check of :meth:`open` — integrity, version, schema, enumerated values — on an
        immutable, read-only connection: it creates no -wal or -shm file and takes no lock, so a refused
        file is left exactly as it was, with nothing beside it. Only for a file without a write-ahead log
        (one with a log must be read through it)."""
        from urllib.parse import quote

        try:
            conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1", uri=True,
                                   check_same_thread=False)
        except sqlite3.DatabaseError as e:
            raise _open_error(path, e) from None
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            pre = cls(path, region, conn)
            if pre._preflight() == SCHEMA_VERSION:
                pre._check_schema()
        except sqlite3.DatabaseError as e:
            raise _open_error(path, e) from None
        finally:
            conn.close()

    def _migrate(self) -> None:
        try:
            version = self._preflight()
            for v in range(version + 1, SCHEMA_VERSION + 1):
                self.conn.execute("BEGIN IMMEDIATE")
                for stmt in _statements(MIGRATIONS[v]):
                    self.conn.execute(stmt)
                self.conn.execute(f"PRAGMA user_version={v}")
                self.conn.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            err = sqlite_error(self.path, e)
            if err is not None and "read-only" in err.message:
                raise err from None
            raise StateError(f"state database {self.path} could not be migrated: {e}",
                             hint="nothing was changed") from None

    def _check_schema(self) -> None:
        """Every table and column the migrations make must be there: a table dropped by hand is corruption,
        reported at open (exit 9), not a traceback in the middle of a pass."""
        try:
            have = _schema(self.conn)
        except sqlite3.DatabaseError as e:
            raise _open_error(self.path, e) from None
        problems = []
        for table, cols in sorted(_expected_schema().items()):
            if table not in have:
                problems.append(f"table {table!r} is missing")
            elif cols - have[table]:
                problems.append(f"table {table!r} lacks column(s) {', '.join(sorted(cols - have[table]))}")
        if problems:
            raise StateError(f"state database {self.path} is damaged: {'; '.join(problems[:4])}"
                             + (f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""),
                             hint=_RESTORE, details={"path": str(self.path), "problems": problems})
        # the enumerated columns, checked once here (both are indexed or small): a pass never starts on a
        # row it would fail to read half way through
        states = tuple(_STATES)
        r = self.conn.execute(f"SELECT id, state FROM nodes WHERE state NOT IN ({','.join('?' * len(states))}) "
                              "OR typeof(state) != 'text' LIMIT 1", states).fetchone()
        if r is not None:
            raise bad_value(self.path, "nodes", r[0], "state", r[1], known=_STATES)
        prios = tuple(m.lower() for m in Priority.__members__)
        r = self.conn.execute(f"SELECT id, priority FROM actions WHERE status = 'intended' AND "
                              f"(priority NOT IN ({','.join('?' * len(prios))}) OR typeof(priority) != 'text') "
                              "LIMIT 1", prios).fetchone()
        if r is not None:
            raise bad_value(self.path, "actions", r[0], "priority", r[1], known=prios)

    def close(self) -> None:
        self.unlock()
        moved = self._identity is not None and _identity(self.path) != self._identity
        self.conn.close()
        if moved:
            self._set_aside_orphans()

    def _set_aside_orphans(self) -> None:
        """The database was deleted or replaced while open: SQLite then leaves its write-ahead log at
        ``<db>-wal`` (it checkpoints only into an unmoved file), where the next open would replay it into
        whatever file is at the path now — a new region, or a restored backup. Move our own log (the same
        file we opened) and its index aside, never deleting anything."""
        wal, shm = Path(f"{self.path}-wal"), Path(f"{self.path}-shm")
        if self._wal_identity is None or _identity(wal) != self._wal_identity:
            return  # not the log we used: it belongs to whatever is at the path now
        stamp = f".orphaned-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        for f in (wal, shm):
            with contextlib.suppress(OSError):
                os.rename(f, f"{f}{stamp}")
        log.info("state database %s was deleted or replaced while open: its write-ahead log was moved to %s "
                 "(it holds the last changes made to the old file)", self.path, f"{wal}{stamp}")

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- locking and transactions -------------------------------------------

    LOCK_POLL_SECONDS = 0.1  # how often a waiter for the pass lock tries it again

    def try_lock(self, wait: float = 0.0, *, purpose: str = "", on_wait=None) -> bool:
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

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; nested calls join the outer one."""
        if self._in_tx:
            yield self.conn
            return
        self.check_identity()
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise StateError(f"state database {self.path}: {e}") from None
        self._in_tx = True
        try:
            yield self.conn
            self.check_identity()  # commit-critical: never commit into a file that is no longer the region's
        except BaseException:
            self._in_tx = False
            if self.conn.in_transaction:  # SQLite may have rolled back itself (a full disk, an I/O error)
                with contextlib.suppress(sqlite3.Error, StateError):
                    self.conn.execute("ROLLBACK")
            raise
        else:
            self._in_tx = False
            self.conn.execute("COMMIT")

    def check_identity(self) -> None:
        """Stop (StateError) when the database file was deleted or replaced since it was opened: writing on
        would go into a file nobody reads again, and everything recorded from then on would be lost."""
        if self._identity is None:
            return
        now = _identity(self.path)
        if now != self._identity:
            raise StateError(
                f"state database {self.path} was deleted or replaced while spotctl had it open",
                hint="nothing more was written to it; what this command recorded before is not in the file "
                     "now at that path (SQLite's log of the old file is kept beside it as *-wal.orphaned-*): find "
                     "out what removed or replaced it, restore a backup if needed, and run the command again",
                details={"path": str(self.path), "deleted": now is None})

    # -- nodes ---------------------------------------------------------------

    def nodes(self, *, live_only: bool = False, states: tuple[NodeState, ...] | None = None) -> list[Node]:
        sql = "SELECT * FROM nodes"
        args: tuple = ()
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            args = tuple(s.value for s in states)
        elif live_only:
            sql += " WHERE state NOT IN ('gone','failed','lost')"
        return [_node(r, self.path) for r in self.conn.execute(sql + " ORDER BY id", args)]

    def node(self, node_id: str) -> Node:
        r = self.conn.execute("SELECT * FROM nodes WHERE id=?", (node_id,)).fetchone()
        if r is None:
            raise NotFoundError(f"unknown node {node_id!r} in region {self.region!r}",
                                hint="`spotctl status` lists the region's nodes")
        return _node(r, self.path)

    def node_by_instance(self, instance_id: str) -> Node | None:
        r = self.conn.execute("SELECT * FROM nodes WHERE instance_id=? ORDER BY created_at DESC LIMIT 1",
                              (instance_id,)).fetchone()
        return None if r is None else _node(r, self.path)

    def find_node(self, node_id: str) -> Node | None:
        r = self.conn.execute("SELECT * FROM nodes WHERE id=?", (node_id,)).fetchone()
        return None if r is None else _node(r, self.path)

    def add_node(self, node: Node, *, actor: str, reason: str) -> None:
        """Record a new node (state ``intended``) with its event, in the caller's transaction."""
        with self.tx() as c:
            c.execute(f"INSERT INTO nodes ({','.join(_NODE_COLS)}) VALUES ({','.join('?' * len(_NODE_COLS))})",
                      _node_row(node))
            c.execute("INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) VALUES (?,?,?,?,?,?)",
                      (node.id, None, node.state.value, node.created_at, reason, actor))
            self.event(node, None, reason, node.created_at)

    def update_node(self, node: Node, **changes) -> Node:
        for k, v in changes.items():
            setattr(node, k, v)
        with self.tx() as c:
            sets = ",".join(f"{k}=?" for k in _NODE_COLS[1:])
            row = _node_row(node)
            c.execute(f"UPDATE nodes SET {sets} WHERE id=?", row[1:] + (node.id,))
        return node

    def transition(self, node: Node, to: NodeState, *, reason: str, at: float, actor: str, **changes) -> Node:
        """Move a node to a new state: the row, its transition and its event in one transaction."""
        src = node.state
        check_transition(node.id, src, to)
        with self.tx() as c:
            node.state = to
            node.updated_at = at
            node.reason = reason
            self.update_node(node, **changes)
            c.execute("INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) VALUES (?,?,?,?,?,?)",
                      (node.id, src.value, to.value, at, reason, actor))
            self.event(node, src, reason, at)
            if to in (NodeState.LOST,) or (to is NodeState.GONE and node.notice_id):
                c.execute("INSERT INTO reclaims (pool, node_id, at, kind) VALUES (?,?,?,?)",
                          (node.pool, node.id, at, "lost" if to is NodeState.LOST else "notice"))
        return node

    def activations_since(self, t: float) -> list[tuple[str, float]]:
        """(node, when it became active) for nodes created at or after ``t``."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT t.node_id, t.at FROM transitions t JOIN nodes n ON n.id = t.node_id "
            "WHERE t.to_state = 'active' AND n.created_at >= ? ORDER BY t.at", (t,))]

    def transitions(self, node_id: str | None = None) -> list[dict]:
        if node_id:
            return list(self.db.query("SELECT * FROM transitions WHERE node_id=? ORDER BY id", (node_id,)))
        return list(self.db.query("SELECT * FROM transitions ORDER BY id"))

    # -- outbox: events and audit -------------------------------------------

    def event(self, node: Node, src: NodeState | None, reason: str, at: float) -> None:
        """The lifecycle event of a node's transition (keyed by node id: per-node order on Kafka)."""
        self.cloud_event(event_type(node.state), node.id, {
            "node": node.id, "pool": node.pool, "from": src.value if src else None, "to": node.state.value,
            "reason": reason, "instance_id": node.instance_id, "action_id": node.action_id}, at)

    def cloud_event(self, type_: str, subject: str, data: dict, at: float, key: str | None = None) -> None:
        """Queue a CloudEvents 1.0 (structured JSON) event in the outbox, in the caller's transaction."""
        self.outbox("event", key or subject, {
            "specversion": "1.0", "id": str(uuid.uuid4()), "source": f"spotctl/{self.region}", "type": type_,
            "subject": subject, "time": iso(at), "datacontenttype": "application/json", "data": data}, at)

    def outbox(self, kind: str, key: str, payload: dict, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)",
                      (kind, key, canonical(payload), at))

    def audit(self, *, actor: str, action: str, target: str, result: str, inputs: dict, at: float) -> dict:
        """Append a chained audit record and queue it in the outbox (same transaction)."""
        with self.tx() as c:
            prev = c.execute("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
            prev_hash = prev[0] if prev else GENESIS
            rec = {"id": str(uuid.uuid4()), "at": at, "actor": actor, "action": action, "target": target,
                   "result": result, "inputs": inputs}
            rec["inputs"] = json.loads(canonical(inputs))
            h = audit_hash(rec, prev_hash)
            c.execute("INSERT INTO audit (id, at, actor, action, target, result, inputs, prev_hash, hash) "
                      "VALUES (?,?,?,?,?,?,?,?,?)",
                      (rec["id"], at, actor, action, target, result, canonical(rec["inputs"]), prev_hash, h))
            rec.update(prev_hash=prev_hash, hash=h, region=self.region)
            self.outbox("audit", rec["id"], rec, at)
        return rec

    def audit_records(self, limit: int | None = None) -> list[dict]:
        sql = "SELECT * FROM audit ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else "")
        return [{**r, "inputs": _loads(self.path, "audit", r["id"], "inputs", r["inputs"])} for r in self.db.query(sql)]

    def verify_audit(self) -> tuple[bool, dict | None, int]:
        """Walk the chain (:func:`spotctl.core.audit.walk`); return (ok, first bad record, records checked)."""
        w = walk(self.audit_records())
        return w.ok, (dict(w.first_bad) if w.first_bad is not None else None), w.checked

    def outbox_rows(self, kind: str | None = None, pending_only: bool = False) -> list[dict]:
        sql = "SELECT * FROM outbox WHERE 1=1"
        args: list = []
        if kind:
            sql += " AND kind=?"
            args.append(kind)
        if pending_only:
            sql += " AND delivered_at IS NULL"
        return list(self.db.query(sql + " ORDER BY id", args))

    # -- outbox relay and audit queries (issue 6) ----------------------------

    def pending_batch(self, kind: str, limit: int, after_id: int = 0) -> list[tuple[int, str, str]]:
        """The oldest undelivered outbox rows of a kind, as (id, key, payload), in id order (no sort: index)."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT id, key, payload FROM outbox WHERE kind=? AND delivered_at IS NULL AND id > ? ORDER BY id LIMIT ?",
            (kind, after_id, int(limit)))]

    def mark_delivered(self, ids: list[int], at: float) -> None:
        """Mark outbox rows delivered (called only after the destination acknowledged them)."""
        with self.tx() as c:
            c.executemany("UPDATE outbox SET delivered_at=? WHERE id=? AND delivered_at IS NULL",
                          [(at, i) for i in ids])

    def outbox_pending(self, kind: str) -> tuple[int, float | None]:
        """(undelivered rows of a kind, creation time of the oldest)."""
        r = self.conn.execute("SELECT count(*), min(created_at) FROM outbox WHERE kind=? AND delivered_at IS NULL",
                              (kind,)).fetchone()
        return r[0], r[1]

    def audit_delivered(self) -> dict[str, float | None]:
        """Audit record id -> when its outbox row was delivered (None: still queued)."""
        return {r[0]: r[1] for r in self.conn.execute("SELECT key, delivered_at FROM outbox WHERE kind='audit'")}

    def audit_query(self, *, since: float | None = None, actor: str | None = None, action: str | None = None,
                    target: str | None = None, limit: int | None = None) -> list[dict]:
        """Audit records matching every given filter, oldest first (``action`` may end with ``*``)."""
        sql, args = "SELECT * FROM audit WHERE 1=1", []
        if since is not None:
            sql, args = sql + " AND at >= ?", args + [since]
        if actor:
            sql, args = sql + " AND actor = ?", args + [actor]
        if action:
            if action.endswith("*"):
                sql, args = sql + " AND action LIKE ? ESCAPE '\\'", args + [
                    action[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"]
            else:
                sql, args = sql + " AND action = ?", args + [action]
        if target:
            sql, args = sql + " AND target = ?", args + [target]
        sql += " ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else "")
        return [{**dict(r), "inputs": _loads(self.path, "audit", r["id"], "inputs", r["inputs"])}
                for r in self.conn.execute(sql, args)]

    def audit_record(self, record_id: str) -> dict:
        """One audit record by id (a unique prefix of at least 8 characters also works)."""
        rows = self.conn.execute("SELECT * FROM audit WHERE id = ?", (record_id,)).fetchall()
        if not rows and len(record_id) >= 8:
            rows = self.conn.execute("SELECT * FROM audit WHERE id LIKE ? LIMIT 2",
                                     (record_id.replace("%", "").replace("_", "") + "%",)).fetchall()
        if len(rows) != 1:
            raise NotFoundError(f"no audit record {record_id!r} in region {self.region!r}" if not rows else
                                f"audit record id prefix {record_id!r} is ambiguous",
                                hint="`spotctl audit list` shows record ids")
        return {**dict(rows[0]), "inputs": _loads(self.path, "audit", rows[0]["id"], "inputs", rows[0]["inputs"])}

    def counts(self) -> dict:
        c = self.conn
        return {
            "nodes": c.execute("SELECT count(*) FROM nodes").fetchone()[0],
            "transitions": c.execute("SELECT count(*) FROM transitions").fetchone()[0],
            "actions": c.execute("SELECT count(*) FROM actions").fetchone()[0],
            "outbox": c.execute("SELECT count(*) FROM outbox").fetchone()[0],
            "outbox_pending": c.execute("SELECT count(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0],
            "audit": c.execute("SELECT count(*) FROM audit").fetchone()[0],
            "plans": c.execute("SELECT count(*) FROM plans").fetchone()[0],
        }

    # -- actions (intent before effect) --------------------------------------

    def record_intent(self, *, action_id: str, plan_id: str | None, kind: str, priority: Priority, reason: str,
                      actor: str, at: float, inputs: dict, pool: str | None = None, node: str | None = None,
                      count: int | None = None) -> bool:
        """Record an action before acting; False if this id is already recorded (idempotency)."""
        with self.tx() as c:
            cur = c.execute(
                "INSERT OR IGNORE INTO actions (id, plan_id, kind, pool, node, count, priority, status, reason, actor,"
                " created_at, updated_at, inputs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (action_id, plan_id, kind, pool, node, count, priority.name.lower(), "intended", reason, actor, at, at,
                 canonical(inputs)))
            return cur.rowcount == 1

    def finish_action(self, action_id: str, status: str, result: str, at: float) -> None:
        with self.tx() as c:
            c.execute("UPDATE actions SET status=?, result=?, updated_at=? WHERE id=?", (status, result, at, action_id))

    def actions(self, status: str | None = None, limit: int | None = 200) -> list[dict]:
        """Actions, newest first; ``limit=None`` for all of them."""
        sql = "SELECT * FROM actions"
        args: list = []
        if status:
            sql += " WHERE status=?"
            args.append(status)
        args.append(-1 if limit is None else limit)
        rows = self.conn.execute(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", args)
        out = []
        for r in rows:
            d = dict(r)
            d["inputs"] = _loads(self.path, "actions", d["id"], "inputs", d["inputs"])
            if not isinstance(d["priority"], str) or d["priority"].upper() not in Priority.__members__:
                raise bad_value(self.path, "actions", d["id"], "priority", d["priority"],
                                known=[m.lower() for m in Priority.__members__])
            out.append(d)
        return out

    # -- budget --------------------------------------------------------------

    def bucket(self, rate: float, burst: int, now: float) -> Bucket:
        r = self.conn.execute("SELECT * FROM budget WHERE region=?", (self.region,)).fetchone()
        if r is None:
            return Bucket.full(rate, burst, now)
        tokens = min(float(burst), r["tokens"])
        return Bucket(rate, burst, tokens, r["at"]).refill(now)

    def take_tokens(self, n: int, priority: Priority, rate: float, burst: int, now: float) -> int:
        """Atomically take up to n tokens from the shared bucket; return how many were granted."""
        with self.tx() as c:
            b = self.bucket(rate, burst, now)
            b, granted = b.take(n, priority, now)
            c.execute(
                "INSERT INTO budget (region, rate, burst, tokens, at, used_total) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(region) DO UPDATE SET rate=excluded.rate, burst=excluded.burst, tokens=excluded.tokens,"
                " at=excluded.at, used_total=budget.used_total+?",
                (self.region, rate, burst, b.tokens, b.at, granted, granted))
        return granted

    def tokens_used_total(self) -> int:
        r = self.conn.execute("SELECT used_total FROM budget WHERE region=?", (self.region,)).fetchone()
        return r[0] if r else 0

    # -- pool failures, reclaims, notices -----------------------------------

    def remember_failure(self, pool: str, until: float, reason: str, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO pool_failures (pool, until, reason, at) VALUES (?,?,?,?) ON CONFLICT(pool) DO "
                      "UPDATE SET until=excluded.until, reason=excluded.reason, at=excluded.at", (pool, until, reason, at))

    def pool_failures(self, now: float) -> dict[str, float]:
        return {r[0]: r[1] for r in self.conn.execute("SELECT pool, until FROM pool_failures WHERE until > ?", (now,))}

    def recent_reclaims(self, since: float) -> dict[str, int]:
        return {r[0]: r[1] for r in self.conn.execute(
            "SELECT pool, count(*) FROM reclaims WHERE at >= ? GROUP BY pool", (since,))}

    def see_notice(self, *, notice_id: str, node_id: str | None, instance_id: str, kind: str, issued_at: float,
                   deadline: float | None, reason: str, at: float, delivered_at: float | None = None,
                   pool: str | None = None) -> bool:
        """Record a notice the first time it is seen; True if new."""
        with self.tx() as c:
            cur = c.execute(
                "INSERT OR IGNORE INTO notices (id, node_id, instance_id, kind, issued_at, deadline, first_seen_at,"
                " reason, delivered_at, pool) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (notice_id, node_id, instance_id, kind, issued_at, deadline, at, reason, delivered_at, pool))
            return cur.rowcount == 1

    def notices_since(self, t: float) -> list[dict]:
        """Notices first seen at or after ``t`` (the evidence for contract conformance)."""
        return list(self.db.query("SELECT * FROM notices WHERE first_seen_at >= ? ORDER BY first_seen_at, id", (t,)))

    def notice_handled(self, notice_id: str, at: float) -> None:
        with self.tx() as c:
            c.execute("UPDATE notices SET handled_at=? WHERE id=? AND handled_at IS NULL", (at, notice_id))

    def notices(self) -> list[dict]:
        return list(self.db.query("SELECT * FROM notices ORDER BY first_seen_at, id"))

    # -- small persistent values (feed cursors, ETags) ------------------------

    def get_value(self, key: str, default: str | None = None) -> str | None:
        r = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return default if r is None else r[0]

    def set_value(self, key: str, value: str, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO kv (key, value, updated_at) VALUES (?,?,?) ON CONFLICT(key) DO UPDATE SET "
                      "value=excluded.value, updated_at=excluded.updated_at", (key, value, at))

    # -- plans and passes ----------------------------------------------------

    def record_plan(self, *, plan_id: str, at: float, actor: str, executed: bool, summary: dict, plan_input: dict) -> int:
        blob = zlib.compress(canonical(plan_input).encode(), 6)
        with self.tx() as c:
            cur = c.execute("INSERT INTO plans (plan_id, at, actor, executed, summary, input) VALUES (?,?,?,?,?,?)",
                            (plan_id, at, actor, int(executed), canonical(summary), blob))
            c.execute("DELETE FROM plans WHERE seq <= (SELECT max(seq) - 500 FROM plans)")
            return cur.lastrowid

    def plans(self, limit: int = 20) -> list[dict]:
        rows = self.conn.execute("SELECT seq, plan_id, at, actor, executed, summary FROM plans ORDER BY seq DESC LIMIT ?",
                                 (limit,))
        return [{**dict(r), "summary": _loads(self.path, "plans", r["seq"], "summary", r["summary"])} for r in rows]

    def plan_input(self, seq: int) -> dict:
        return self.plan_record(seq)["input"]

    def plan_record(self, seq: int) -> dict:
        """A recorded plan: its id, time, actor, summary and the full input it was made from."""
        r = self.conn.execute("SELECT * FROM plans WHERE seq=?", (seq,)).fetchone()
        if r is None:
            raise NotFoundError(f"no recorded plan #{seq} in region {self.region!r}",
                                hint="`spotctl plan --history` lists the recorded plans")
        d = dict(r)
        d["summary"] = _loads(self.path, "plans", seq, "summary", d["summary"])
        if not isinstance(d["summary"], dict):
            raise bad_value(self.path, "plans", seq, "summary", d["summary"])
        try:
            d["input"] = json.loads(zlib.decompress(d["input"]))
        except (zlib.error, TypeError, ValueError) as e:
            why = "cannot be decompressed" if isinstance(e, (zlib.error, TypeError)) else "is not valid JSON"
            raise StateError(f"state database {self.path}: recorded plan #{seq} is corrupt: its input {why} "
                             f"({str(e)[:80]})",
                             hint="nothing was changed; the other recorded plans can still be replayed "
                                  "(`spotctl plan --history`)",
                             details={"path": str(self.path), "table": "plans", "row": seq}) from None
        return d

    def start_pass(self, actor: str, at: float) -> int:
        """A new pass row (the caller holds the region lock, so no other pass is live): a row an earlier
        pass left ``running`` (killed, or failed without finishing) is closed as ``abandoned``."""
        with self.tx() as c:
            c.execute("UPDATE passes SET status='abandoned', finished_at=? WHERE status='running'", (at,))
            return c.execute("INSERT INTO passes (started_at, actor, status) VALUES (?,?,?)",
                             (at, actor, "running")).lastrowid

    def finish_pass(self, seq: int, status: str, summary: dict, at: float) -> None:
        with self.tx() as c:
            c.execute("UPDATE passes SET finished_at=?, status=?, summary=? WHERE seq=?",
                      (at, status, canonical(summary), seq))
            c.execute("DELETE FROM passes WHERE seq <= (SELECT max(seq) - 2000 FROM passes)")

    def last_pass(self) -> dict | None:
        r = self.conn.execute("SELECT * FROM passes WHERE finished_at IS NOT NULL ORDER BY seq DESC LIMIT 1").fetchone()
        if r is None:
            return None
        d = dict(r)
        d["summary"] = _loads(self.path, "passes", d["seq"], "summary", d["summary"])
        return d


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


_STATES = {s.value: s for s in NodeState}


def _node(r: sqlite3.Row, path: Path) -> Node:
    state = _STATES.get(r["state"]) if isinstance(r["state"], str) else None
    if state is None:
        raise bad_value(path, "nodes", r["id"], "state", r["state"], known=_STATES)
    return Node(
        id=r["id"], pool=r["pool"], state=state, action_id=r["action_id"],
        created_at=r["created_at"], updated_at=r["updated_at"], instance_id=r["instance_id"], host=r["host"],
        reason=r["reason"], cordoned=bool(r["cordoned"]), idle_since=r["idle_since"],
        notice_deadline=r["notice_deadline"], notice_id=r["notice_id"], price=r["price"],
        protected_until=r["protected_until"], protect_closed=bool(r["protect_closed"]),
    )


def _node_row(n: Node) -> tuple:
    return (n.id, n.pool, n.state.value, n.action_id, n.instance_id, n.host, n.created_at, n.updated_at, n.reason,
            int(n.cordoned), n.idle_since, n.notice_deadline, n.notice_id, n.price, n.protected_until,
            int(n.protect_closed))
