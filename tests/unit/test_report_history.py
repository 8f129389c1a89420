"""What each pass records for `spotctl report` (spotctl.state.history), on a real state database."""

from __future__ import annotations

import math
import struct

import pytest

from spotctl.core.models import Scheduler, Shape, WorkUnit
from spotctl.state import history
from spotctl.state.store import Store


def _unit(uid: str, sched: Scheduler, submitted: float) -> WorkUnit:
    return WorkUnit(id=uid, scheduler=sched, shape=Shape(1, 1024, 0), submitted_at=submitted)


def test_prices_recorded_once_per_change_and_read_by_window(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    try:
        assert history.record_prices(s, {"p": 1.0, "q": 2.0}, "EUR", 100.0) == 2
        assert history.record_prices(s, {"p": 1.0, "q": 2.0}, "EUR", 160.0) == 0  # unchanged: nothing written
        assert history.record_prices(s, {"p": 1.5, "q": float("nan")}, "EUR", 220.0) == 1  # a NaN is no price
        rows = history.window_rows(s, 150.0, 300.0)["prices"]
        # the change inside the window, and the price in force at its start for each pool
        assert sorted((r["pool"], r["at"], r["price"]) for r in rows) == [("p", 100.0, 1.0), ("p", 220.0, 1.5),
                                                                          ("q", 100.0, 2.0)]
    finally:
        s.close()


def test_a_wait_ends_when_a_pass_of_its_scheduler_no_longer_sees_it(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    try:
        both = {"kubernetes", "slurm"}
        history.record_waits(s, [_unit("k1", Scheduler.KUBERNETES, 50.0), _unit("s1", Scheduler.SLURM, 60.0)],
                             both, 100.0)
        # slurm was not read this pass: its unit's wait goes on; k1 is no longer pending: its wait ends now
        history.record_waits(s, [], {"kubernetes"}, 160.0)
        rows = {w["unit"]: w for w in history.window_rows(s, 0.0, 1000.0)["waits"]}
        assert rows["k1"]["gone_at"] == 160.0 and rows["s1"]["gone_at"] is None
        # requeued: seen pending again, a new wait from its new submit; the wait that ended is kept
        history.record_waits(s, [_unit("k1", Scheduler.KUBERNETES, 200.0)], both, 220.0)
        waits = history.window_rows(s, 0.0, 1000.0)["waits"]
        k1 = sorted((w["submitted_at"], w["gone_at"]) for w in waits if w["unit"] == "k1")
        assert k1 == [(50.0, 160.0), (200.0, None)]
        assert [w["gone_at"] for w in waits if w["unit"] == "s1"] == [220.0]
        # a window that ends before s1's wait ended still sees it (open at the end of that window), and k1's
        # first wait (which ended after that window's end); not k1's new one (first seen at 220: after it)
        early = sorted((w["unit"], w["gone_at"]) for w in history.window_rows(s, 0.0, 150.0)["waits"])
        assert early == [("k1", 160.0), ("s1", 220.0)]
        # an unchanged pass writes nothing
        before = s.conn.total_changes
        history.record_waits(s, [_unit("k1", Scheduler.KUBERNETES, 200.0)], both, 280.0)
        assert s.conn.total_changes == before
    finally:
        s.close()


def test_open_waits_of_any_unit_id_are_read_whole(tmp_path):
    """The open waits are read as one joined text: a unit id that holds the separator (a newline) or is empty
    is read all the same, so that a pass neither starts its wait twice nor ends it while it is pending."""
    s = Store.open(tmp_path / "r.db", "r")
    try:
        both = {"kubernetes", "slurm"}
        odd = [_unit("ns/a\nb", Scheduler.KUBERNETES, 50.0), _unit("", Scheduler.SLURM, 50.0),
               _unit("s1", Scheduler.SLURM, 60.0)]
        history.record_waits(s, odd, both, 100.0)
        before = s.conn.total_changes
        history.record_waits(s, odd, both, 160.0)  # the same units pending: nothing changes
        assert s.conn.total_changes == before
        history.record_waits(s, odd[1:], both, 220.0)  # the odd one is gone: only its wait ends
        rows = {w["unit"]: w["gone_at"] for w in history.window_rows(s, 0.0, 1000.0)["waits"]}
        assert rows == {"ns/a\nb": 220.0, "": None, "s1": None}
    finally:
        s.close()


def _old_database(path, version: int, waits: str):
    """A state database made by the migrations up to ``version`` (as a spotctl of that schema left it), with
    these ``waits`` rows (an SQL VALUES list)."""
    import sqlite3

    from spotctl.state import schema

    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    for v in range(1, version + 1):
        for stmt in schema.statements(schema.MIGRATIONS[v]):
            c.execute(stmt)
    c.execute(f"PRAGMA user_version={version}")
    c.execute(f"INSERT INTO waits VALUES {waits}")
    c.close()
    return path


def test_the_ended_waits_index_holds_ended_waits_only_and_an_old_database_moves_to_it(tmp_path):
    """Schema 8: ``waits_gone`` is partial (ended waits only: a new wait writes no entry there), the queries by
    end time still take it, and a database of schema 7 is moved to it on open with its waits kept."""
    from spotctl.state import schema

    old = _old_database(tmp_path / "old.db", 7, "('k1', 'kubernetes', 50.0, 100.0, 160.0), ('s1', 'slurm', 60.0, "
                        "100.0, NULL)")
    s = Store.open(old, "r")
    try:
        assert s.conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION >= 8
        (sql,) = s.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'waits_gone'").fetchone()
        assert sql.endswith("WHERE gone_at IS NOT NULL")
        assert s.conn.execute("SELECT count(*) FROM waits INDEXED BY waits_gone WHERE gone_at < 1e9").fetchone()[0] == 1
        for q in ("DELETE FROM waits WHERE gone_at < ?", "SELECT unit FROM waits WHERE gone_at >= ? AND first_seen_at <= ?"):
            plan = " ".join(r[-1] for r in s.conn.execute("EXPLAIN QUERY PLAN " + q, (1.0,) * q.count("?")))
            assert "waits_gone" in plan, (q, plan)
        rows = {w["unit"]: w["gone_at"] for w in history.window_rows(s, 0.0, 1000.0)["waits"]}
        assert rows == {"k1": 160.0, "s1": None}
    finally:
        s.close()


def _open(s: Store) -> dict[str, tuple[str, float, float]]:
    """The open waits as a report reads them: unit -> (scheduler, submitted_at, first_seen_at)."""
    return {w["unit"]: (w["scheduler"], w["submitted_at"], w["first_seen_at"])
            for w in history.window_rows(s, 0.0, 10**9)["waits"] if w["gone_at"] is None}


def test_waits_left_open_by_schema_8_move_into_chunks_and_keep_their_times(tmp_path):
    """A database of schema 8 keeps its open waits as rows: the next pass moves those still pending into a
    chunk (their submit and first-seen times kept) and ends the others, once; a report before that pass reads
    them as they are."""
    old = _old_database(tmp_path / "old.db", 8, "('k1', 'kubernetes', 50.0, 100.0, NULL), ('k2', 'kubernetes', "
                        "55.0, 100.0, NULL), ('s1', 'slurm', 60.0, 100.0, NULL), ('k0', 'kubernetes', 10.0, 20.0, 90.0)")
    s = Store.open(old, "r")
    try:
        before = _open(s)
        assert before == {"k1": ("kubernetes", 50.0, 100.0), "k2": ("kubernetes", 55.0, 100.0),
                          "s1": ("slurm", 60.0, 100.0)}
        # k2 left the queue; slurm was not read: s1 stays a row until a pass reads slurm
        history.record_waits(s, [_unit("k1", Scheduler.KUBERNETES, 50.0)], {"kubernetes"}, 160.0)
        assert _open(s) == {"k1": ("kubernetes", 50.0, 100.0), "s1": ("slurm", 60.0, 100.0)}
        assert [r[0] for r in s.conn.execute("SELECT unit FROM waits WHERE gone_at IS NULL")] == ["s1"]
        ended = {w["unit"]: w["gone_at"] for w in history.window_rows(s, 0.0, 10**9)["waits"] if w["gone_at"]}
        assert ended == {"k0": 90.0, "k2": 160.0}
        history.record_waits(s, [_unit("k1", Scheduler.KUBERNETES, 50.0), _unit("s1", Scheduler.SLURM, 60.0)],
                             {"kubernetes", "slurm"}, 220.0)
        assert _open(s) == {"k1": ("kubernetes", 50.0, 100.0), "s1": ("slurm", 60.0, 100.0)}
        assert s.conn.execute("SELECT count(*) FROM waits WHERE gone_at IS NULL").fetchone()[0] == 0
    finally:
        s.close()


@pytest.mark.parametrize("chunk_units", [history.CHUNK_UNITS, 8])
def test_chunks_stay_few_and_merging_them_keeps_every_wait(tmp_path, monkeypatch, chunk_units):
    """Each pass that sees new units adds a chunk (several when they are more than CHUNK_UNITS); small chunks
    are merged once a scheduler has more than MAX_SMALL_CHUNKS, and a chunk mostly ended is merged anyway: what
    a report reads is the same either way, and no chunk holds more than CHUNK_UNITS units."""
    monkeypatch.setattr(history, "CHUNK_UNITS", chunk_units)
    s = Store.open(tmp_path / "r.db", "r")
    try:
        k8s = {"kubernetes"}
        pending: list[WorkUnit] = []
        expected: dict[str, tuple[str, float, float]] = {}
        for p in range(3 * history.MAX_SMALL_CHUNKS):
            at = 1000.0 + 30 * p
            for i in range(20 if p == 0 else 3):
                u = _unit(f"p{p}-{i}", Scheduler.KUBERNETES, at - 5 - i)
                pending.append(u)
                expected[u.id] = ("kubernetes", at - 5 - i, at)
            if p % 4 == 3:  # some leave the queue: their waits end
                gone = pending[::5]
                pending = [u for u in pending if u not in gone]
                for u in gone:
                    expected.pop(u.id)
            history.record_waits(s, pending, k8s, at)
            sizes = [r[0] for r in s.conn.execute("SELECT length(alive) FROM open_waits")]
            assert max(sizes) <= chunk_units
            assert len([n for n in sizes if n < chunk_units // 4]) <= history.MAX_SMALL_CHUNKS
            assert _open(s) == expected
        alive = [r[0] for r in s.conn.execute("SELECT alive FROM open_waits")]
        live, dead = sum(a.count(1) for a in alive), sum(a.count(0) for a in alive)
        assert live == len(expected) and dead < live  # ended entries do not pile up
        if chunk_units == 8:
            assert len(sizes) >= len(expected) // 8
    finally:
        s.close()


def test_a_unit_without_a_usable_submit_time_starts_no_wait_and_a_unit_listed_twice_waits_once(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    try:
        odd = [_unit(f"u{i}", Scheduler.SLURM, t) for i, t in enumerate((math.nan, math.inf, -math.inf, 0.0, -5.0,
                                                                          500.0))]
        twice = [_unit("k1", Scheduler.KUBERNETES, 50.0), _unit("k1", Scheduler.KUBERNETES, 70.0)]
        history.record_waits(s, [*odd, *twice, _unit("s1", Scheduler.SLURM, 60.0)], {"kubernetes", "slurm"}, 100.0)
        assert _open(s) == {"k1": ("kubernetes", 50.0, 100.0), "s1": ("slurm", 60.0, 100.0)}
    finally:
        s.close()


@pytest.mark.parametrize("column,value", [("alive", b"\x01\x02"), ("submitted", b"\x00" * 7),
                                          ("encoding", "csv"), ("first_seen", struct.pack("<2d", 1.0, math.nan))])
def test_a_damaged_chunk_is_named_not_read_as_other_waits(tmp_path, column, value):
    from spotctl.core.errors import StateError

    s = Store.open(tmp_path / "r.db", "r")
    try:
        history.record_waits(s, [_unit("k1", Scheduler.KUBERNETES, 50.0), _unit("k2", Scheduler.KUBERNETES, 60.0)],
                             {"kubernetes"}, 100.0)
        s.conn.execute(f"UPDATE open_waits SET {column} = ?", (value,))
        for read in (lambda: history.window_rows(s, 0.0, 1000.0),
                     lambda: history.record_waits(s, [], {"kubernetes"}, 160.0)):
            with pytest.raises(StateError, match="open_waits row 1 has an unreadable units") as e:
                read()
            assert e.value.exit_code == 9
    finally:
        s.close()


def test_a_price_row_edited_by_hand_is_named(tmp_path):
    import pytest

    from spotctl.core.errors import StateError

    s = Store.open(tmp_path / "r.db", "r")
    try:
        s.conn.execute("INSERT INTO prices (pool, at, price, currency) VALUES ('p', 100.0, 'cheap', 'EUR')")
        with pytest.raises(StateError, match="prices row 'p' has an unreadable price 'cheap'") as e:
            history.window_rows(s, 0.0, 1000.0)
        assert e.value.exit_code == 9
    finally:
        s.close()
