"""The state database's schema: the versioned migrations, how a new database is made whole, the cheap
checks an existing one passes before it is used (version, every table and column, the enumerated
values: :meth:`spotctl.state.store.Store.open` runs them), and the full integrity check (every page:
on request, :meth:`Store.full_check`, and after an unclean shutdown, :func:`check_after_crash`).

Migrations are plain SQL, one script per version, each applied in its own ``BEGIN IMMEDIATE``
transaction with ``PRAGMA user_version``: a crash leaves the file at the last version that committed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import uuid
from pathlib import Path

from spotctl.core.budget import Priority
from spotctl.core.errors import StateError
from spotctl.core.models import NodeState
from spotctl.state.dbfile import RESTORE, bad_value, clip, open_error, read_only_error, sqlite_error, writable_dir

SCHEMA_VERSION = 9

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
    5: """
    CREATE INDEX nodes_instance ON nodes(instance_id);
    CREATE INDEX nodes_updated ON nodes(state, updated_at);
    CREATE INDEX transitions_at ON transitions(at);
    CREATE INDEX actions_updated ON actions(updated_at);
    CREATE INDEX outbox_undelivered ON outbox(kind, id) WHERE delivered_at IS NULL;
    CREATE INDEX outbox_delivered ON outbox(delivered_at) WHERE delivered_at IS NOT NULL;
    CREATE INDEX audit_at ON audit(at);
    CREATE INDEX plans_at ON plans(at);
    CREATE INDEX passes_started ON passes(started_at);
    CREATE INDEX passes_running ON passes(status) WHERE status = 'running';
    CREATE INDEX reclaims_at ON reclaims(at);
    DROP INDEX outbox_pending;
    CREATE INDEX outbox_key ON outbox(kind, key);
    """,
    # nodes_updated (state, updated_at) serves every lookup by state: nodes_state was one more index for
    # every node written, and read by nothing
    6: """
    DROP INDEX nodes_state;
    """,
    # what `spotctl report` needs and no other table keeps (spotctl.state.history): each pool's price
    # whenever a pass saw it change, and each pending unit's wait (submit to the pass that no longer saw
    # it pending); both read by time window, through these indexes
    7: """
    CREATE TABLE prices (pool TEXT NOT NULL, at REAL NOT NULL, price REAL NOT NULL, currency TEXT NOT NULL,
        PRIMARY KEY (pool, at));
    CREATE INDEX prices_at ON prices(at);
    CREATE TABLE waits (unit TEXT PRIMARY KEY, scheduler TEXT NOT NULL, submitted_at REAL NOT NULL,
        first_seen_at REAL NOT NULL, gone_at REAL);
    CREATE INDEX waits_gone ON waits(gone_at);
    CREATE INDEX waits_open ON waits(scheduler, unit) WHERE gone_at IS NULL;
    """,
    # waits_gone holds the ended waits only: an open wait (gone_at NULL) is in no query of it (`gone_at < ?`,
    # `gone_at >= ?` imply NOT NULL, and SQLite takes a partial index on that), and every new wait was one more
    # index entry to write (the first pass's 200k waits: 1.33 -> 1.09 s)
    8: """
    DROP INDEX waits_gone;
    CREATE INDEX waits_gone ON waits(gone_at) WHERE gone_at IS NOT NULL;
    """,
    # the open waits, in chunks (spotctl.state.history): each chunk a few columns of packed values for many
    # units, and which of them still wait; a row per unit was a B-tree entry (and an index entry) per pending
    # unit to write on the first pass and to read back on every pass (200k units: 1.9 s and 0.15 s). Waits of
    # schema 8 left open (rows with gone_at NULL) are moved into chunks by the next pass.
    9: """
    CREATE TABLE open_waits (id INTEGER PRIMARY KEY, scheduler TEXT NOT NULL, encoding TEXT NOT NULL,
        units TEXT NOT NULL, submitted BLOB NOT NULL, first_seen BLOB NOT NULL, alive BLOB NOT NULL);
    """,
}

def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


NODE_STATES = {s.value: s for s in NodeState}


_EXPECTED: dict[str, set[str]] = {}
_INDEXES: dict[str, str] = {}


def expected_schema() -> dict[str, set[str]]:
    """Table -> columns, as the migrations make them (built once, in memory)."""
    if not _EXPECTED:
        c = sqlite3.connect(":memory:")
        for v in range(1, SCHEMA_VERSION + 1):
            for stmt in statements(MIGRATIONS[v]):
                c.execute(stmt)
        _EXPECTED.update(schema_of(c))
        _INDEXES.update(indexes_of(c))
        c.close()
    return _EXPECTED


def expected_indexes() -> dict[str, str]:
    """Index -> its table, as the migrations make them (the queries name some of them: ``INDEXED BY``)."""
    expected_schema()
    return _INDEXES


def indexes_of(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' "
                             "AND name NOT LIKE 'sqlite_%'").fetchall())


def schema_of(conn: sqlite3.Connection) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for table, column in conn.execute("SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p "
                                      "WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'"):
        out.setdefault(table, set()).add(column)
    return out


def create(path: Path) -> bool:
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
        # owner only (0600), whatever the umask: the file holds the region's audit trail and token budget;
        # SQLite gives its -wal and -shm files the database's mode (`spotctl doctor` checks all three)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            migrate(conn, tmp)
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
        raise open_error(path, e) from None
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or not writable_dir(path.parent):
            raise read_only_error(path) from None
        raise StateError(f"cannot create state database {path}: {e.strerror}") from None
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
            with contextlib.suppress(OSError):
                leftover.unlink()

def preflight(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version, refusing a newer one and a foreign SQLite file (reads only)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StateError(
            f"state database {path} has schema version {version}, newer than this spotctl "
            f"understands ({SCHEMA_VERSION})", hint="upgrade spotctl")
    if version == 0:
        foreign = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        if foreign:
            raise StateError(
                f"state database {path} is not a spotctl state database (it holds tables "
                f"{', '.join(clip(t, 40) for t in foreign[:5])} but no spotctl schema version)",
                hint="nothing was changed; point --state-dir elsewhere or move the file away",
                details={"path": str(path)})
    return version

def _read_only(path: Path, *, immutable: bool) -> sqlite3.Connection:
    from urllib.parse import quote

    try:
        return sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro{'&immutable=1' if immutable else ''}",
                               uri=True, check_same_thread=False)
    except sqlite3.DatabaseError as e:
        raise open_error(path, e) from None


def precheck(path: Path) -> None:
    """The read-only checks of :meth:`Store.open` that read little whatever the size of the file — version,
    schema, enumerated values (on indexes) — on an immutable, read-only connection: it creates no -wal or
    -shm file and takes no lock, so a refused file is left exactly as it was, with nothing beside it. Only
    for a file without a write-ahead log (one with a log must be read through it). The header and size
    were checked before (:func:`spotctl.state.dbfile.check_existing`); the whole file is read only by
    :func:`full_check`."""
    conn = _read_only(path, immutable=True)
    try:
        if preflight(conn, path) == SCHEMA_VERSION:
            check_schema(conn, path)
    except sqlite3.DatabaseError as e:
        raise open_error(path, e) from None
    finally:
        conn.close()


#: How many problems the full check lists at most (SQLite's own default is 100).
MAX_PROBLEMS = 100


def full_check(conn: sqlite3.Connection, *, quick: bool = False) -> list[str]:
    """Read every page: ``PRAGMA integrity_check`` (``quick``: ``quick_check``, which skips comparing each
    index with its table), O(size of the file). The problems found, at most ``MAX_PROBLEMS``; empty: ok.
    A file SQLite cannot read at all is one problem, not an exception."""
    pragma = "quick_check" if quick else "integrity_check"
    try:
        rows = [r[0] for r in conn.execute(f"PRAGMA {pragma}({MAX_PROBLEMS})").fetchall()]
    except sqlite3.DatabaseError as e:
        return [str(e)]
    except StateError as e:  # the store's connection translates SQLite's errors
        return [e.message]
    return [] if rows == ["ok"] else [str(r) for r in rows]


def check_after_crash(path: Path) -> None:
    """The full check of a database its last user did not close (:mod:`spotctl.state.presence`), on a
    read-only connection: read through the log it left, and closed without checkpointing it, so a file
    refused here is left as it was — and refused again at the next open, which finds the log again."""
    conn = _read_only(path, immutable=False)
    try:
        problems = full_check(conn, quick=True)
    finally:
        conn.close()
    if problems:
        raise StateError(f"state database {path} is corrupt (checked in full because the last process to use it "
                         f"did not close it): {'; '.join(problems[:3])[:300]}",
                         hint=RESTORE, details={"path": str(path), "problems": problems})

def migrate(conn: sqlite3.Connection, path: Path) -> None:
    try:
        version = preflight(conn, path)
        for v in range(version + 1, SCHEMA_VERSION + 1):
            conn.execute("BEGIN IMMEDIATE")
            for stmt in statements(MIGRATIONS[v]):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version={v}")
            conn.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        err = sqlite_error(path, e)
        if err is not None and "read-only" in err.message:
            raise err from None
        raise StateError(f"state database {path} could not be migrated: {e}",
                         hint="nothing was changed") from None

def check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Every table and column the migrations make must be there: a table dropped by hand is corruption,
    reported at open (exit 9), not a traceback in the middle of a pass."""
    try:
        have = schema_of(conn)
        have_indexes = indexes_of(conn)
    except sqlite3.DatabaseError as e:
        raise open_error(path, e) from None
    problems = []
    for table, cols in sorted(expected_schema().items()):
        if table not in have:
            problems.append(f"table {table!r} is missing")
        elif cols - have[table]:
            problems.append(f"table {table!r} lacks column(s) {', '.join(sorted(cols - have[table]))}")
    problems += [f"index {name!r} of table {table!r} is missing" for name, table in sorted(expected_indexes().items())
                 if table in have and name not in have_indexes]
    if problems:
        raise StateError(f"state database {path} is damaged: {'; '.join(problems[:4])}"
                         + (f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""),
                         hint=RESTORE, details={"path": str(path), "problems": problems})
    # the enumerated columns, checked once here (both are indexed or small): a pass never starts on a
    # row it would fail to read half way through
    states = tuple(NODE_STATES)
    r = conn.execute(f"SELECT id, state FROM nodes WHERE state NOT IN ({','.join('?' * len(states))}) "
                     "OR typeof(state) != 'text' LIMIT 1", states).fetchone()
    if r is not None:
        raise bad_value(path, "nodes", r[0], "state", r[1], known=NODE_STATES)
    prios = tuple(m.lower() for m in Priority.__members__)
    r = conn.execute(f"SELECT id, priority FROM actions WHERE status = 'intended' AND "
                     f"(priority NOT IN ({','.join('?' * len(prios))}) OR typeof(priority) != 'text') "
                     "LIMIT 1", prios).fetchone()
    if r is not None:
        raise bad_value(path, "actions", r[0], "priority", r[1], known=prios)

