"""A pass's commits leave SQLite's write-ahead log to one checkpoint at the pass's end
(``StoreBase.checkpoints_deferred``): an automatic checkpoint inside a commit copied and synced every page the
log held, a dozen times in a pass of a thousand drains. After the pass the log is copied into the database
and the automatic checkpoint is back for whatever the connection does next, whether the pass ended well or not."""

from __future__ import annotations

import pytest

from spotctl.state import connection
from spotctl.state.connection import AUTOCHECKPOINT_PAGES

from .conftest import advance


def autocheckpoint(store) -> int:
    return store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]


def test_a_pass_checkpoints_once_after_its_last_commit(make_rt, monkeypatch):
    monkeypatch.setattr(connection, "CHECKPOINT_AFTER_CHANGES", 10)  # (the demo's passes change a few dozen rows)
    rt, world = make_rt()
    advance(rt, world, 60)  # the fleet adopted and launched: the next passes have work to record
    statements: list[str] = []
    rt.store.conn.set_trace_callback(statements.append)
    try:
        advance(rt, world, 30)
    finally:
        rt.store.conn.set_trace_callback(None)
    commits = [i for i, s in enumerate(statements) if s.strip().upper() == "COMMIT"]
    off = [i for i, s in enumerate(statements) if s == "PRAGMA wal_autocheckpoint=0"]
    checkpoints = [i for i, s in enumerate(statements) if "wal_checkpoint(" in s]
    back = [i for i, s in enumerate(statements) if s == f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}"]
    assert len(commits) > 3
    assert len(off) == len(checkpoints) == len(back) == 1
    assert off[0] < commits[0] and commits[-1] < checkpoints[0] < back[0]
    assert autocheckpoint(rt.store) == AUTOCHECKPOINT_PAGES
    busy, log_frames, copied = rt.store.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and log_frames == copied


def test_a_pass_of_few_changes_leaves_the_log_to_the_automatic_checkpoint(make_rt):
    """A pass that changed fewer rows than the automatic checkpoint's pages does not checkpoint itself: a later
    commit does, once the log holds that many pages, as it always did."""
    rt, world = make_rt()
    advance(rt, world, 60)
    statements: list[str] = []
    rt.store.conn.set_trace_callback(statements.append)
    changes = rt.store.conn.total_changes
    try:
        advance(rt, world, 30)
    finally:
        rt.store.conn.set_trace_callback(None)
    assert 0 < rt.store.conn.total_changes - changes < connection.CHECKPOINT_AFTER_CHANGES
    assert not [s for s in statements if "wal_checkpoint(" in s]
    assert autocheckpoint(rt.store) == AUTOCHECKPOINT_PAGES


def test_an_interrupted_stretch_puts_the_automatic_checkpoint_back(make_rt):
    rt, _ = make_rt()
    with pytest.raises(KeyboardInterrupt):
        with rt.store.checkpoints_deferred():
            assert autocheckpoint(rt.store) == 0
            with rt.store.tx() as conn:
                conn.execute("INSERT INTO kv (key, value, updated_at) VALUES ('k', 'v', 0)")
            raise KeyboardInterrupt
    assert autocheckpoint(rt.store) == AUTOCHECKPOINT_PAGES
    assert rt.store.conn.execute("SELECT value FROM kv WHERE key='k'").fetchone()[0] == "v"  # committed: kept


def test_the_watchers_deferred_checkpoints_stay_deferred_after_a_stretch(make_rt):
    rt, _ = make_rt()
    rt.store.defer_checkpoints()  # the watcher's connection checkpoints after each batch of drains, itself
    with rt.store.checkpoints_deferred():
        pass
    assert autocheckpoint(rt.store) == 0
