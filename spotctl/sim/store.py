"""Where a file-bound world lives: one row of JSON in a small SQLite file.

The whole world is one JSON document in table ``sim_state`` (a single row),
rewritten in one short ``BEGIN IMMEDIATE`` transaction after every mutating
call and after every advance. The processes of a demo region write it only while
they hold the region's pass lock (``SimWorld.shared``); a revision number still
guards against two writers overwriting each other (see :func:`write`). A file
that cannot be read is an error naming the file
(:class:`~spotctl.core.errors.StateError`), never silently recreated.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from spotctl.core.errors import StateError

FORMAT = 1
TABLE = "sim_state"
_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    format INTEGER NOT NULL,
    region TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    saved_at REAL NOT NULL,
    rev INTEGER NOT NULL,
    state TEXT NOT NULL
)"""
_HINT = "move the file aside (or delete it) to start a fresh simulated region"


def _corrupt(path: Path, why: str) -> StateError:
    return StateError(f"simulator state file {path} is unreadable or corrupt: {why}", hint=_HINT,
                      details={"file": str(path)})


def read(path: Path) -> tuple[str, str, int, dict] | None:
    """(region, fingerprint, revision, state) from ``path``; None when there is no world in it yet."""
    if not path.exists():
        return None
    if path.is_dir():
        raise _corrupt(path, "it is a directory")
    try:
        conn = sqlite3.connect(str(path), timeout=10)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                return None  # an empty SQLite file (e.g. created by a crashed first save)
            if TABLE not in tables:
                raise _corrupt(path, f"no {TABLE} table (is this a simulator file?)")
            row = conn.execute(f"SELECT format, region, fingerprint, rev, state FROM {TABLE} WHERE id = 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise _corrupt(path, str(e)) from None
    except OSError as e:
        raise _corrupt(path, e.strerror or str(e)) from None
    if row is None:
        raise _corrupt(path, f"the {TABLE} table is empty")
    fmt, region, fingerprint, rev, text = row
    if fmt != FORMAT:
        raise _corrupt(path, f"format {fmt!r}, this version reads format {FORMAT}")
    try:
        state = json.loads(text)
    except (TypeError, ValueError) as e:
        raise _corrupt(path, f"bad JSON: {e}") from None
    if not isinstance(state, dict):
        raise _corrupt(path, "the state is not a JSON object")
    return region, fingerprint, int(rev), state


def revision(path: Path) -> int | None:
    """The revision of the world saved in ``path`` (cheap: the state is not read); None when there is none
    yet, or when the file cannot tell (then :func:`read` says why: never take None for "start afresh")."""
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=10)
        try:
            row = conn.execute(f"SELECT rev FROM {TABLE} WHERE id = 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return int(row[0]) if row and isinstance(row[0], int) else None


def write(path: Path, region: str, fingerprint: str, state: dict, saved_at: float, rev: int) -> int | None:
    """Replace the saved world if it is still at revision ``rev`` (0: no world saved yet).

    Returns the new revision, or None when another process saved in between (nothing written):
    optimistic concurrency, so that two processes never silently overwrite each other's changes.
    """
    text = json.dumps(state, separators=(",", ":"), allow_nan=False)
    try:
        conn = sqlite3.connect(str(path), timeout=10, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_SCHEMA)
            row = conn.execute(f"SELECT rev FROM {TABLE} WHERE id = 1").fetchone()
            if (row[0] if row else 0) != rev:
                conn.execute("ROLLBACK")
                return None
            conn.execute(f"INSERT OR REPLACE INTO {TABLE} (id, format, region, fingerprint, saved_at, rev, state) "
                         "VALUES (1, ?, ?, ?, ?, ?, ?)", (FORMAT, region, fingerprint, saved_at, rev + 1, text))
            conn.execute("COMMIT")
            return rev + 1
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise StateError(f"cannot write simulator state file {path}: {e}", details={"file": str(path)}) from None
    except OSError as e:
        raise StateError(f"cannot write simulator state file {path}: {e.strerror or e}",
                         details={"file": str(path)}) from None
