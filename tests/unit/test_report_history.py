"""What each pass records for `spotctl report` (spotctl.state.history), on a real state database."""

from __future__ import annotations

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
        # requeued: seen pending again, a new wait from its new submit
        history.record_waits(s, [_unit("k1", Scheduler.KUBERNETES, 200.0)], both, 220.0)
        rows = {w["unit"]: w for w in history.window_rows(s, 0.0, 1000.0)["waits"]}
        assert rows["k1"]["gone_at"] is None and rows["k1"]["submitted_at"] == 200.0
        assert rows["s1"]["gone_at"] == 220.0
        # a window that ends before s1's wait ended still sees it (open at the end of that window); k1's row
        # is its new wait now (first seen at 220: after that window)
        early = {w["unit"]: w for w in history.window_rows(s, 0.0, 150.0)["waits"]}
        assert set(early) == {"s1"} and early["s1"]["gone_at"] == 220.0
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


def test_the_ended_waits_index_holds_ended_waits_only_and_an_old_database_moves_to_it(tmp_path):
    """Schema 8: ``waits_gone`` is partial (ended waits only: a new wait writes no entry there), the queries by
    end time still take it, and a database of schema 7 is moved to it on open with its waits kept."""
    import sqlite3

    from spotctl.state import schema

    old = tmp_path / "old.db"
    c = sqlite3.connect(old, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    for v in range(1, 8):
        for stmt in schema.statements(schema.MIGRATIONS[v]):
            c.execute(stmt)
    c.execute("PRAGMA user_version=7")
    c.execute("INSERT INTO waits VALUES ('k1', 'kubernetes', 50.0, 100.0, 160.0), ('s1', 'slurm', 60.0, 100.0, NULL)")
    c.close()
    s = Store.open(old, "r")
    try:
        assert s.conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 8
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


def test_ending_waits_looks_them_up_by_unit_not_by_every_open_wait(tmp_path):
    """Ending the waits of the units a pass no longer sees finds each by its key: a pass that ends 10k of 200k
    open waits must not walk all 200k for each chunk of 500 (SQLite would take the ``gone_at`` index for
    ``gone_at IS NULL``)."""
    s = Store.open(tmp_path / "r.db", "r")
    try:
        n = history.END_WAITS_CHUNK  # (with a chunk this long, SQLite takes the gone_at index unless kept from it)
        plan = " ".join(r[-1] for r in s.conn.execute("EXPLAIN QUERY PLAN " + history.END_WAITS.format(",".join("?" * n)),
                                                       (1.0, *[f"u{i}" for i in range(n)])))
        assert "(unit=?)" in plan and "waits_gone" not in plan, plan
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
