"""The state store: migrations, transactions with the outbox, audit chain, lock, corruption."""

import os
import sqlite3
import threading
import zlib

import pytest

from spotctl.core.budget import Priority
from spotctl.core.errors import ExitCode, NotFoundError, RefusedError, StateError
from spotctl.core.models import Node, NodeState
from spotctl.state.store import SCHEMA_VERSION, Store, sqlite_error
from tests.fsutil import read_only


def mk(store, i=1, at=100.0):
    n = Node(id=f"n{i}", pool="p", state=NodeState.INTENDED, action_id=f"a{i}", created_at=at, updated_at=at)
    with store.tx():
        store.add_node(n, actor="tester", reason="test")
    return n


def test_schema_wal_and_version(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert s.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    s.close()
    # reopening migrates nothing and keeps data
    s = Store.open(tmp_path / "r.db", "r")
    mk(s)
    s.close()
    assert len(Store.open(tmp_path / "r.db", "r").nodes()) == 1


def test_transition_writes_row_transition_and_event_together(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    n = mk(s)
    s.transition(n, NodeState.BUILDING, reason="created", at=101.0, actor="tester", instance_id="i-1")
    assert s.node("n1").state is NodeState.BUILDING and s.node("n1").instance_id == "i-1"
    events = [r for r in s.outbox_rows("event")]
    assert [e["key"] for e in events] == ["n1", "n1"]
    assert '"type":"io.spotctl.node.building"' in events[-1]["payload"]
    # a failure inside the transaction leaves neither the state change nor its outbox row
    before = s.counts()
    with pytest.raises(RuntimeError):
        with s.tx():
            s.transition(n, NodeState.ACTIVE, reason="x", at=102.0, actor="t")
            s.audit(actor="t", action="a", target="n1", result="ok", inputs={}, at=102.0)
            raise RuntimeError("crash")
    assert s.counts() == before
    assert s.node("n1").state is NodeState.BUILDING
    with pytest.raises(RefusedError):
        s.transition(s.node("n1"), NodeState.INTENDED, reason="x", at=103.0, actor="t")


def test_audit_chain_detects_tampering(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    for i in range(5):
        s.audit(actor="alice", action="node.launch", target=f"n{i}", result="ok", inputs={"i": i}, at=float(i))
    ok, bad, n = s.verify_audit()
    assert ok and n == 5
    third = s.audit_records()[2]
    s.conn.execute("UPDATE audit SET result='failed' WHERE id=?", (third["id"],))
    ok, bad, _ = s.verify_audit()
    assert not ok and bad["id"] == third["id"]
    assert len(s.outbox_rows("audit")) == 5


def test_intent_is_idempotent_and_budget_is_shared(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    kw = dict(action_id="x1", plan_id="p", kind="launch", priority=Priority.LAUNCH, reason="r", actor="a", at=1.0,
              inputs={})
    assert s.record_intent(**kw) is True
    assert s.record_intent(**kw) is False
    assert s.take_tokens(5, Priority.OPERATOR, 0.001, 10, 0.0) == 5
    other = Store.open(tmp_path / "r.db", "r")
    assert other.take_tokens(5, Priority.OPERATOR, 0.001, 10, 0.0) == 4  # 10 % reserve for higher classes
    assert other.tokens_used_total() == 9


def test_lock_is_exclusive(tmp_path):
    a = Store.open(tmp_path / "r.db", "r")
    b = Store.open(tmp_path / "r.db", "r")
    assert a.try_lock()
    assert not b.try_lock()
    a.unlock()
    assert b.try_lock()


def test_corrupt_database_is_reported_and_left_untouched(tmp_path):
    p = tmp_path / "r.db"
    p.write_bytes(b"this is not a database" * 100)
    before = p.read_bytes()
    with pytest.raises(StateError) as e:
        Store.open(p, "r")
    assert e.value.exit_code == ExitCode.STATE and str(p) in e.value.message
    assert p.read_bytes() == before


def test_unknown_node(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    with pytest.raises(NotFoundError):
        s.node("nope")
    assert isinstance(s.conn, sqlite3.Connection)


# -- the state database as an input (issue 11, items 3, 4 and 8) -------------------------------------------


def listing(d):
    return sorted((p.name, p.stat().st_size) for p in d.iterdir())


def real_db(tmp_path, name="src.db", nodes=3) -> bytes:
    """The bytes of a real, closed state database holding a few nodes and audit records."""
    s = Store.open(tmp_path / name, "r")
    for i in range(nodes):
        mk(s, i)
        s.audit(actor="t", action="node.launch", target=f"n{i}", result="ok", inputs={"i": i}, at=float(i))
    s.close()
    return (tmp_path / name).read_bytes()


@pytest.mark.parametrize("cut", ["empty", "one-zero-byte", "first-1000-bytes", "first-page-only", "not-sqlite"])
def test_an_existing_empty_or_cut_short_file_is_corruption_not_a_new_region(tmp_path, cut):
    good = real_db(tmp_path)
    assert len(good) > 8192
    raw = {"empty": b"", "one-zero-byte": b"\0", "first-1000-bytes": good[:1000], "first-page-only": good[:4096],
           "not-sqlite": b"hello"}[cut]
    d = tmp_path / "state"
    d.mkdir()
    p = d / "r.db"
    p.write_bytes(raw)
    before = listing(d)
    with pytest.raises(StateError) as e:
        Store.open(p, "r")
    assert e.value.exit_code == ExitCode.STATE and str(p) in e.value.message
    assert "corrupt" in e.value.message and "restore a backup" in e.value.hint
    assert p.read_bytes() == raw and listing(d) == before  # same bytes, same size, no -wal/-shm left behind
    with pytest.raises(StateError):  # and it stays an error: nothing was "repaired" into an empty region
        Store.open(p, "r", create=False)


def test_only_a_missing_file_is_a_new_region_and_it_is_created_whole(tmp_path):
    p = tmp_path / "state" / "r.db"
    s = Store.open(p, "r")
    assert s.created and s.counts()["audit"] == 0
    s.close()
    again = Store.open(p, "r")
    assert not again.created
    again.close()
    assert [x.name for x in p.parent.iterdir() if x.name.startswith(".")] == []  # no temporary file left


def test_concurrent_creation_of_a_new_region_never_sees_a_half_made_file(tmp_path):
    """Eight openers race on a missing database: all open it, exactly one created it (nobody meets the
    empty file an in-place creation leaves for a moment, which is now refused as corruption)."""
    for round_ in range(5):
        p = tmp_path / f"race{round_}" / "r.db"
        results, errors = [], []
        go = threading.Barrier(8)

        def opener():
            go.wait()
            try:
                s = Store.open(p, "r")
                results.append(s.created)
                s.close()
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=opener) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and sorted(results) == [False] * 7 + [True]


def test_a_sqlite_file_that_is_not_a_state_database_is_refused(tmp_path):
    p = tmp_path / "other.db"
    c = sqlite3.connect(p)
    c.execute("CREATE TABLE recipes (name TEXT)")
    c.commit()
    c.close()
    before = p.read_bytes()
    with pytest.raises(StateError, match="not a spotctl state database"):
        Store.open(p, "r")
    assert p.read_bytes() == before


def test_the_file_deleted_under_an_open_store_stops_the_next_write(tmp_path):
    p = tmp_path / "r.db"
    s = Store.open(p, "r")
    mk(s, 1)
    os.unlink(p)
    with pytest.raises(StateError, match="was deleted or replaced while spotctl had it open") as e:
        s.audit(actor="t", action="node.launch", target="n2", result="ok", inputs={}, at=2.0)
    assert e.value.exit_code == ExitCode.STATE and str(p) in e.value.message
    with pytest.raises(StateError):
        s.start_pass("t", 3.0)
    s.close()


def test_the_file_replaced_under_an_open_store_is_noticed_and_the_replacement_left_alone(tmp_path):
    p = tmp_path / "r.db"
    s = Store.open(p, "r")
    mk(s, 1)
    real_db(tmp_path, "backup.db", nodes=2)
    os.replace(tmp_path / "backup.db", p)  # e.g. a restore while a drill runs
    replacement = p.read_bytes()
    with pytest.raises(StateError, match="deleted or replaced"):
        mk(s, 7)
    s.close()
    assert p.read_bytes() == replacement
    assert [n.id for n in Store.open(p, "r").nodes()] == ["n0", "n1"]


def test_a_file_deleted_inside_a_transaction_is_not_committed(tmp_path):
    p = tmp_path / "r.db"
    s = Store.open(p, "r")
    with pytest.raises(StateError, match="deleted or replaced"):
        with s.tx():
            mk(s, 1)
            os.unlink(p)
    assert not s.conn.in_transaction
    assert s.nodes() == []  # rolled back: the write never reached even the unlinked file
    s.close()


@pytest.mark.parametrize("table", ["nodes", "audit", "plans"])
def test_a_missing_table_is_exit_9_naming_it(tmp_path, table):
    real_db(tmp_path, "r.db")
    p = tmp_path / "r.db"
    c = sqlite3.connect(p)
    c.execute(f"DROP TABLE {table}")
    c.commit()
    c.close()
    before = p.read_bytes()
    with pytest.raises(StateError) as e:
        Store.open(p, "r")
    assert e.value.exit_code == ExitCode.STATE and str(p) in e.value.message
    assert f"table '{table}' is missing" in e.value.message
    assert p.read_bytes() == before


def test_a_table_dropped_while_open_is_a_state_error_not_a_traceback(tmp_path):
    p = tmp_path / "r.db"
    s = Store.open(p, "r")
    other = sqlite3.connect(p)
    other.execute("DROP TABLE nodes")
    other.commit()
    other.close()
    with pytest.raises(StateError, match="no such table: nodes") as e:
        s.nodes()
    assert str(p) in e.value.message
    s.close()


def test_an_unknown_node_state_is_exit_9_naming_row_and_value_cut_short(tmp_path):
    real_db(tmp_path, "r.db")
    p = tmp_path / "r.db"
    c = sqlite3.connect(p)
    c.execute("UPDATE nodes SET state=? WHERE id='n1'", ("zombie" + "x" * 5000,))
    c.commit()
    c.close()
    with pytest.raises(StateError) as e:
        Store.open(p, "r")
    m = e.value.message
    assert e.value.exit_code == ExitCode.STATE and str(p) in m and "'n1'" in m and "'zombie" in m
    assert "x" * 200 not in m and len(m) < len(str(p)) + 300  # the bad value is echoed, cut to ~80 characters
    # and a value that turns bad while a store is open is caught where the row is read
    s = Store.open(tmp_path / "s.db", "r")
    mk(s, 1)
    s.conn.execute("UPDATE nodes SET state='zombie'")
    with pytest.raises(StateError, match="nodes row 'n1' has an unreadable state 'zombie'"):
        s.nodes()
    with pytest.raises(StateError, match="'zombie'"):
        s.node("n1")


def test_an_unknown_priority_on_an_unfinished_action_is_exit_9(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    s.record_intent(action_id="x1", plan_id="p", kind="launch", priority=Priority.LAUNCH, reason="r", actor="a",
                    at=1.0, inputs={})
    s.conn.execute("UPDATE actions SET priority='urgent!!'")
    with pytest.raises(StateError, match="actions row 'x1' has an unreadable priority 'urgent!!'"):
        s.actions(status="intended")
    s.close()
    with pytest.raises(StateError, match="priority"):
        Store.open(tmp_path / "r.db", "r")


def test_a_mangled_json_column_is_exit_9_naming_row(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    rec = s.audit(actor="t", action="a", target="n1", result="ok", inputs={"a": 1}, at=1.0)
    s.conn.execute("UPDATE audit SET inputs='{not json'")
    with pytest.raises(StateError, match=f"audit row '{rec['id']}' has an unreadable inputs"):
        s.audit_records()


@pytest.mark.parametrize("blob,why", [(b"\xde\xad\xbe\xef", "cannot be decompressed"),
                                      (zlib.compress(b'{"pools": '), "is not valid JSON")])
def test_a_corrupt_recorded_plan_is_exit_9_naming_the_plan(tmp_path, blob, why):
    s = Store.open(tmp_path / "r.db", "r")
    seq = s.record_plan(plan_id="p1", at=1.0, actor="t", executed=True, summary={"actions": 0}, plan_input={"a": 1})
    s.conn.execute("UPDATE plans SET input=? WHERE seq=?", (blob, seq))
    with pytest.raises(StateError) as e:
        s.plan_record(seq)
    assert f"recorded plan #{seq} is corrupt: its input {why}" in e.value.message
    assert e.value.exit_code == ExitCode.STATE


def test_a_read_only_file_is_said_to_be_read_only_at_the_first_write(tmp_path):
    p = tmp_path / "r.db"
    real_db(tmp_path, "r.db")
    with read_only(p):
        s = Store.open(p, "r")
        assert len(s.nodes()) == 3  # reading is fine
        with pytest.raises(StateError) as e:
            s.start_pass("t", 1.0)
        assert e.value.message == f"state database {p} is read-only" and e.value.exit_code == ExitCode.STATE
        assert not s.conn.in_transaction
        s.close()


def test_the_read_only_translation_of_a_real_sqlite_error(tmp_path):
    """The same translation, from the error a read-only SQLite connection really raises (this one holds
    wherever the test runs, root or not, attribute or not)."""
    p = tmp_path / "r.db"
    real_db(tmp_path, "r.db")
    c = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as raw:
        c.execute("INSERT INTO kv (key, value, updated_at) VALUES ('k', 'v', 1)")
    c.close()
    err = sqlite_error(p, raw.value)
    assert err is not None and err.message == f"state database {p} is read-only" and err.exit_code == ExitCode.STATE
    # programming errors stay what they are: a bug is not a state problem
    c = sqlite3.connect(p)
    with pytest.raises(sqlite3.IntegrityError) as bug:
        c.execute("INSERT INTO nodes (id) VALUES ('x')")
    assert sqlite_error(p, bug.value) is None


def test_a_read_only_state_directory_is_said_to_be_read_only_not_corrupt(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    real_db(d, "r.db")
    before = listing(d)
    with read_only(d):
        with pytest.raises(StateError) as e:
            Store.open(d / "r.db", "r")
        assert e.value.message.startswith(f"state directory {d} is read-only") and "corrupt" not in e.value.message
        assert "restore a backup" not in (e.value.hint or "")
        with pytest.raises(StateError, match="read-only"):
            Store.open(d / "new.db", "r")  # a new region there cannot be created either
    assert listing(d) == before


@pytest.mark.parametrize("lock", ["r.db.lock", "r.db.relay.lock"])
def test_a_directory_where_a_lock_file_belongs_is_exit_9(tmp_path, lock):
    real_db(tmp_path, "r.db")
    (tmp_path / lock).mkdir()
    with pytest.raises(StateError) as e:
        Store.open(tmp_path / "r.db", "r")
    assert e.value.exit_code == ExitCode.STATE
    assert e.value.message == f"lock file {tmp_path / lock} of state database r.db is a directory"


def test_after_a_deletion_under_an_open_store_the_next_region_starts_clean(tmp_path):
    """SQLite leaves the deleted file's write-ahead log at <db>-wal: it must not be replayed into the next
    database created at that path (it is moved aside, kept, and named)."""
    p = tmp_path / "r.db"
    s = Store.open(p, "r")
    s.set_value("k", "old", 1.0)
    os.unlink(p)
    with pytest.raises(StateError):
        s.set_value("k", "newer", 2.0)
    s.close()
    assert not (tmp_path / "r.db-wal").exists() and list(tmp_path.glob("r.db-wal.orphaned-*"))
    fresh = Store.open(p, "r")
    assert fresh.created and fresh.get_value("k") is None and fresh.counts()["audit"] == 0
    fresh.close()


def test_a_new_region_is_not_created_over_the_log_of_a_database_deleted_after_a_crash(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "r.db"
    code = ("import os, sys; from spotctl.state.store import Store; s = Store.open(sys.argv[1], 'r'); "
            "s.set_value('k', 'v', 1.0); os._exit(0)")  # dies without closing: its -wal stays
    subprocess.run([sys.executable, "-c", code, str(p)], check=True)
    assert (tmp_path / "r.db-wal").stat().st_size > 0
    os.unlink(p)
    before = listing(tmp_path)
    with pytest.raises(StateError) as e:
        Store.open(p, "r")
    assert "is missing but its SQLite side files are still there" in e.value.message
    assert "r.db-wal" in e.value.hint and e.value.exit_code == ExitCode.STATE
    assert listing(tmp_path) == before


class _Interrupting:
    """A connection whose ``execute`` raises KeyboardInterrupt (a signal) once: right after ``BEGIN IMMEDIATE``
    returned, or instead of ``COMMIT``, or right after ``COMMIT`` returned."""

    def __init__(self, conn, sql: str, after: bool):
        self._conn, self._sql, self._after, self.fired = conn, sql, after, False

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def execute(self, sql, *args):
        if sql == self._sql and not self.fired:
            self.fired = True
            if self._after:
                self._conn.execute(sql, *args)
            raise KeyboardInterrupt
        return self._conn.execute(sql, *args)


@pytest.mark.parametrize("sql,after,kept", [("BEGIN IMMEDIATE", True, False), ("COMMIT", False, False),
                                            ("COMMIT", True, True)])
def test_a_signal_anywhere_in_a_write_transaction_leaves_no_transaction_open(tmp_path, sql, after, kept):
    """A signal right after BEGIN, just before COMMIT or just after it: the store is out of the transaction
    (rolled back unless it committed), and the next write transaction begins and commits (it used to fail with
    "cannot start a transaction within a transaction", and with it the clean-up that closes a drill or pass)."""
    store = Store.open(tmp_path / "s.db", "r1")
    real = store.conn
    store.conn = _Interrupting(real, sql, after)
    try:
        with pytest.raises(KeyboardInterrupt), store.tx() as c:
            c.execute("INSERT INTO kv (key, value, updated_at) VALUES ('a', '1', 1.0)")
        assert store.conn.fired and not real.in_transaction and not store._in_tx
        with store.tx() as c:
            c.execute("INSERT INTO kv (key, value, updated_at) VALUES ('b', '2', 2.0)")
        keys = {r[0] for r in real.execute("SELECT key FROM kv WHERE key IN ('a', 'b')")}
        assert keys == ({"a", "b"} if kept else {"b"})
    finally:
        store.conn = real
        store.close()
