"""What ``spotctl doctor`` reads of the state database and of private directories: facts, nothing changed.

The database is opened read-only (immutable when it has no write-ahead log: no -wal or -shm file is made,
no lock taken); it is never migrated here, so a file of an older schema version is reported as it is.
``spotctl.core.doctor`` judges the facts.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

from .schema import SCHEMA_VERSION, _read_only, full_check

#: Which SQLite check doctor runs: quick_check reads every page like integrity_check, but skips comparing
#: each index with its table (a fraction of the time on a large database); ``spotctl state check`` runs the
#: full one.
CHECK = "quick_check"


def _mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def state_db_facts(path: Path) -> dict[str, Any]:
    """exists, the modes of the file and its -wal/-shm, size, schema_version (``PRAGMA user_version``),
    code_schema_version, and the problems ``PRAGMA quick_check`` found (empty: ok); ``error`` when SQLite
    cannot read it at all."""
    path = Path(path)
    facts: dict[str, Any] = {"path": str(path), "code_schema_version": SCHEMA_VERSION, "check": CHECK}
    mode = _mode(path)
    facts["exists"] = mode is not None
    if mode is None:
        return facts
    modes = {path.name: mode}
    for suffix in ("-wal", "-shm"):
        m = _mode(Path(f"{path}{suffix}"))
        if m is not None:
            modes[path.name + suffix] = m
    facts["modes"] = modes
    facts["size"] = os.stat(path).st_size
    try:
        conn = _read_only(path, immutable=not Path(f"{path}-wal").exists())
    except Exception as e:  # StateError from open_error: unreadable
        facts["error"] = getattr(e, "message", str(e))
        return facts
    try:
        try:
            facts["schema_version"] = int(conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as e:
            facts["schema_version"] = None
            facts["problems"] = [f"SQLite cannot read it: {e}"]
            return facts
        facts["problems"] = full_check(conn, quick=True)
    finally:
        conn.close()
    return facts


def private_dir_facts(path: Path) -> dict[str, Any]:
    """exists and mode of a directory that must be its owner's only (the identity token cache)."""
    mode = _mode(Path(path))
    return {"path": str(path), "exists": mode is not None, "mode": mode or 0}
