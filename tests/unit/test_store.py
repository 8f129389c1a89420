"""The state store: migrations, transactions with the outbox, audit chain, lock, corruption."""

import sqlite3

import pytest

from spotctl.core.budget import Priority
from spotctl.core.errors import ExitCode, NotFoundError, RefusedError, StateError
from spotctl.core.models import Node, NodeState
from spotctl.state.store import SCHEMA_VERSION, Store


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
