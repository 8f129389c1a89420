"""The state database file as an input: every failure is a StateError naming the file (exit 9).

What is checked before SQLite opens a file (an empty, cut-short or foreign file is corruption, not a
new region; the lock files must be files), how an SQLite failure reads to the user
(:func:`sqlite_error`: read-only, full disk, locked, corrupt...), and the error for a row holding a
value this spotctl cannot read (:func:`bad_value`).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from spotctl.core.errors import StateError

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_SIZE = 100  # the database header at the start of page 1 (https://www.sqlite.org/fileformat.html)
RESTORE = ("nothing was changed; move the file aside and restore a backup, or start afresh (`mv` it away) if "
           "losing local state is acceptable")


def clip(value, limit: int = 80) -> str:
    """``repr`` of a value read from the database or typed by a user, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def identity(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at ``path``; None when nothing is there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def version_stamp(path: Path) -> tuple | None:
    """What changes when anyone writes the file: identity, size, modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def writable_dir(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def read_only_error(path: Path) -> StateError:
    """The file, or the directory SQLite must create its ``-wal``/``-shm`` files in, cannot be written."""
    hint = ("nothing was changed; make it writable for the user running spotctl (check its permissions, "
            "`lsattr` flags and the mount), or point --state-dir at a writable copy")
    if not writable_dir(path.parent):
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
        if not writable_dir(path.parent) or (path.exists() and not os.access(path, os.W_OK)):
            return read_only_error(path)
        if not path.exists():
            return StateError(f"state database {path} was deleted while spotctl had it open",
                              hint="nothing more was written; restore the file from a backup", details=details)
        return StateError(f"state database {path} cannot be opened: {msg}", details=details)
    if msg.startswith(("no such table", "no such column")) or " has no column named " in msg:
        return StateError(f"state database {path} is damaged or not a spotctl state database: {msg}",
                          hint=RESTORE, details=details)
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
        return StateError(f"state database {path} is unreadable or corrupt: {msg}", hint=RESTORE, details=details)
    return None



def open_error(path: Path, e: sqlite3.Error) -> StateError:
    """Why an existing state database could not be opened: read-only (the file, or the directory its
    -wal/-shm files go in) is said as such; anything else is unreadable or corrupt."""
    err = sqlite_error(path, e)
    if err is not None and "read-only" in err.message:
        return err
    if not writable_dir(path.parent) and not Path(f"{path}-shm").exists():
        return read_only_error(path)
    return StateError(f"state database {path} is unreadable or corrupt: {e}", hint=RESTORE,
                      details={"path": str(path)})


def check_lock_paths(path: Path) -> None:
    """The lock files beside the database must be files (or not exist yet): a directory there would make
    every pass fail when it takes the lock."""
    for lock in (Path(f"{path}.lock"), Path(f"{path}.relay.lock"), Path(f"{path}.users.lock")):
        if os.path.lexists(lock) and not lock.is_file():
            kind = "a directory" if lock.is_dir() else "not a regular file"
            raise StateError(f"lock file {lock} of state database {path.name} is {kind}",
                             hint="nothing was changed; remove it (spotctl creates the lock file itself)",
                             details={"path": str(lock)})


def check_existing(path: Path) -> None:
    """An existing state database must be an SQLite file whole: an empty, cut-short or foreign file is not a
    new region (its history and audit chain would silently vanish) but corruption, and it is left as it is.

    Cheap (the 100-byte header and one ``stat``, whatever the size of the file): the SQLite magic, a valid
    page size, and — when no write-ahead log is beside it, so that the file alone is the database — a size
    that holds every page its header counts (what a copy or a disk cut short loses). A file that fails only
    that last test is refused only if it stayed as it was and still has no log (another process may be
    checkpointing into it at that moment: then the pages are in its log, and the open reads them there)."""
    why, size = _header_problem(path)
    if why and why.startswith("is cut short (its header"):
        again = _header_problem(path)
        if again != (why, size) or os.path.lexists(f"{path}-wal"):
            return
    if why:
        raise StateError(f"state database {path} {why}: it is corrupt, not a new region",
                         hint=RESTORE, details={"path": str(path), "size": size})


def _header_problem(path: Path) -> tuple[str | None, int]:
    """What is wrong with the file at ``path`` by its header and size (None: nothing), and its size."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            st = os.fstat(f.fileno())
    except IsADirectoryError:
        raise StateError(f"state database {path} is a directory, not a file", hint="move it away",
                         details={"path": str(path)}) from None
    except OSError as e:
        raise StateError(f"cannot read state database {path}: {e.strerror}", details={"path": str(path)}) from None
    size = st.st_size
    if size == 0:
        return "is empty (0 bytes)", size
    if head[:len(SQLITE_MAGIC)] != SQLITE_MAGIC:
        return (f"is not an SQLite database (its {size} byte{'s' if size != 1 else ''} do not start with the "
                "SQLite header)"), size
    if size < 512:  # the smallest SQLite page
        return f"is cut short ({size} bytes)", size
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        return f"has an unreadable header (page size {page})", size
    pages = int.from_bytes(head[28:32], "big")
    # the page count in the header is valid when the change counter matches "version-valid-for" (SQLite
    # >= 3.7.0 writes both on every commit that changes page 1); the file alone is the database only
    # when no write-ahead log is beside it
    if pages and head[24:28] == head[92:96] and not os.path.lexists(f"{path}-wal") and size < pages * page:
        return (f"is cut short (its header counts {pages} pages of {page} bytes, {pages * page} bytes, but the "
                f"file has {size})"), size
    return None, size


def bad_value(path: Path, table: str, key, column: str, value, known=None) -> StateError:
    """A row holding a value this spotctl cannot read (an unknown state, a mangled JSON column)."""
    what = f"{column} {clip(value)}"
    if known:
        what += f", which is not one of {', '.join(sorted(known))}"
    return StateError(f"state database {path}: {table} row {clip(key)} has an unreadable {what}",
                      hint="the file was edited by hand, or written by a newer spotctl (then upgrade); " + RESTORE,
                      details={"path": str(path), "table": table, "row": clip(key), "column": column})


def loads(path: Path, table: str, key, column: str, raw):
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        raise bad_value(path, table, key, column, raw) from None

