"""The outbox at scale (issue 14, item 1): a region without a relay for a kind queues none of it; pending
counts are a counter kept in the same transaction as the rows (right after kill -9, right when rows are
written around it), read in a few index seeks; the relay's queries use the partial index of pending rows."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from spotctl.core.config import load_config
from spotctl.core.models import Node, NodeState
from spotctl.ops.relay import outbox_queues, queued_kinds, relay
from spotctl.state.store import Store


def node(i: int) -> Node:
    return Node(id=f"n{i}", pool="p", state=NodeState.INTENDED, action_id=f"a{i}", created_at=1.0, updated_at=1.0)


def busy(s: Store, n: int = 3, first: int = 0) -> None:
    """Transitions (events) and audit records, as a pass writes them."""
    for i in range(first, first + n):
        with s.tx():
            x = node(i)
            s.add_node(x, actor="t", reason="test")
            s.transition(x, NodeState.BUILDING, reason="r", at=2.0, actor="t")
            s.audit(actor="t", action="node.launch", target=x.id, result="ok", inputs={}, at=2.0)


def raw_count(s: Store, kind: str) -> int:
    return s.conn.execute("SELECT count(*) FROM outbox WHERE kind=? AND delivered_at IS NULL", (kind,)).fetchone()[0]


@pytest.mark.parametrize("kinds", [set(), {"audit"}, {"event"}])
def test_a_kind_without_a_relay_is_not_queued_at_all(tmp_path, kinds):
    s = Store.open(tmp_path / "r.db", "r", outbox_kinds=kinds)
    busy(s)
    # bulk rows written through the store's connection are dropped the same way
    with s.tx() as c:
        c.executemany("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)",
                      [("event", "n9", "{}", 3.0), ("audit", "x", "{}", 3.0)])
    for kind in ("event", "audit"):
        assert (raw_count(s, kind) > 0) == (kind in kinds), kind
        assert s.queues(kind) == (kind in kinds)
        assert s.outbox_pending(kind)[0] == raw_count(s, kind)
    assert len(s.audit_records()) == 3  # the ledger itself is kept whatever is queued
    q = outbox_queues(s, 10.0)
    assert {k: v["queued"] for k, v in q.items()} == {"event": "event" in kinds, "audit": "audit" in kinds}
    s.close()


def test_the_kinds_queued_follow_the_relays_a_region_configures(tmp_path):
    bare = tmp_path / "bare.toml"
    bare.write_text("[regions.demo]\n")
    assert queued_kinds(load_config(env={}, user_path=bare).region("demo")) == frozenset()
    both = tmp_path / "both.toml"
    both.write_text('[regions.demo.kafka]\nbootstrap_servers = "127.0.0.1:9"\ntopic = "t"\n'
                    '[regions.demo.audit]\nurl = "http://127.0.0.1:9"\ntoken_file = "/dev/null"\n')
    assert queued_kinds(load_config(env={}, user_path=both).region("demo")) == frozenset({"event", "audit"})


def test_a_bare_open_queues_every_kind(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    busy(s)
    assert raw_count(s, "event") == 6 and raw_count(s, "audit") == 3
    s.close()


class Accept:
    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    def deliver(self, rows):
        self.seen.extend(rows)
        return len(rows)

    def close(self):
        pass


def test_pending_counts_follow_queueing_delivery_and_rows_written_around_the_counter(tmp_path):
    p = tmp_path / "r.db"
    s = Store.open(p, "r")
    busy(s, 5)
    assert s.outbox_pending("event")[0] == 10 and s.outbox_pending("audit")[0] == 5
    rep = relay(s, {"audit": Accept()}, now=lambda: 50.0, batch_size=2)
    assert rep.kinds["audit"].delivered == 5 and rep.kinds["audit"].pending == 0
    assert rep.kinds["event"].pending == 10 and rep.kinds["event"].oldest_pending_age_s == 49.0
    # another connection (an older spotctl, a generator, an operator's sqlite3) adds and delivers rows
    other = sqlite3.connect(p)
    other.executemany("INSERT INTO outbox (kind, key, payload, created_at) VALUES ('event', ?, '{}', 60)",
                      [(f"x{i}",) for i in range(7)])
    other.execute("UPDATE outbox SET delivered_at = 61 WHERE id = (SELECT max(id) FROM outbox)")
    other.commit()
    other.close()
    assert s.outbox_pending("event")[0] == raw_count(s, "event") == 16
    busy(s, 1, first=100)  # and the counter is right again from the next write on
    assert s.outbox_pending("event")[0] == raw_count(s, "event") == 18
    assert s.full_check() == []
    s.close()


def test_a_counter_that_disagrees_with_the_rows_is_a_full_check_problem(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    busy(s, 2)
    key = "outbox.pending.audit"
    value = s.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()[0]
    n, newest = value.split()
    s.conn.execute("UPDATE kv SET value=? WHERE key=?", (f"{int(n) + 5} {newest}", key))
    assert any("pending counter of 'audit'" in x for x in s.full_check())
    s.conn.execute("UPDATE kv SET value='garbage' WHERE key=?", (key,))
    assert s.outbox_pending("audit")[0] == 2  # unreadable: counted on the index instead
    s.close()


def test_a_kill_minus_9_in_the_middle_of_a_transaction_leaves_counter_and_rows_agreeing(tmp_path):
    p = tmp_path / "r.db"
    s = Store.open(p, "r")
    busy(s, 2)
    s.close()
    code = ("import os, sys; from spotctl.state.store import Store; s = Store.open(sys.argv[1], 'r')\n"
            "with s.tx():\n"
            "    s.audit(actor='t', action='a', target='x', result='ok', inputs={}, at=5.0)\n"
            "    s.mark_delivered([r['id'] for r in s.outbox_rows('event')], 5.0)\n"
            "    os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code, str(p)], check=True)
    s = Store.open(p, "r")
    assert s.full_checked  # it died with the database open
    for kind in ("event", "audit"):
        assert s.outbox_pending(kind)[0] == raw_count(s, kind)
    assert raw_count(s, "audit") == 2 and raw_count(s, "event") == 4  # nothing of the killed transaction
    assert s.full_check() == []
    s.close()


def test_a_transaction_writes_each_kinds_counter_once_before_it_commits(tmp_path):
    """Queueing and marking many rows in one write transaction (a drain: its transition's event and its
    audit record) writes each kind's counter once, just before the commit, current (no recount on the
    index at the next read); a transaction rolled back leaves rows and counters as they were."""
    s = Store.open(tmp_path / "r.db", "r")
    busy(s, 2)
    statements: list[str] = []
    s.conn.set_trace_callback(statements.append)
    with s.tx():
        for i in range(10, 14):
            x = node(i)
            s.add_node(x, actor="t", reason="test")
            s.transition(x, NodeState.BUILDING, reason="r", at=3.0, actor="t")
            s.audit(actor="t", action="node.launch", target=x.id, result="ok", inputs={}, at=3.0)
        s.mark_delivered([r["id"] for r in s.outbox_rows("audit")][:3], 3.0)
    s.conn.set_trace_callback(None)
    writes = [x for x in statements if x.startswith("INSERT INTO kv")]
    assert len(writes) == 2 and statements.index(writes[-1]) < statements.index("COMMIT")
    for kind, want in (("event", 12), ("audit", 3)):
        assert s._counter(kind) is not None and s.outbox_pending(kind)[0] == raw_count(s, kind) == want
    with pytest.raises(RuntimeError), s.tx():
        busy(s, 2, first=20)
        raise RuntimeError("rolled back")
    assert s.outbox_pending("event")[0] == raw_count(s, "event") == 12 and s._counter("event") is not None
    busy(s, 1, first=30)
    assert s.outbox_pending("event")[0] == raw_count(s, "event") == 14
    assert s.full_check() == []
    s.close()


@pytest.mark.parametrize("sql,args", [
    (("SELECT id, key, payload FROM outbox INDEXED BY outbox_undelivered WHERE kind=? AND delivered_at IS NULL "
      "AND id > ? ORDER BY id LIMIT ?"), ("event", 0, 500)),
    ("SELECT count(*) FROM outbox INDEXED BY outbox_undelivered WHERE kind=? AND delivered_at IS NULL", ("event",)),
    ("SELECT max(id) FROM outbox INDEXED BY outbox_undelivered WHERE kind=? AND delivered_at IS NULL", ("event",)),
    (("SELECT created_at FROM outbox INDEXED BY outbox_undelivered WHERE kind=? AND delivered_at IS NULL "
      "ORDER BY id LIMIT 1"), ("event",)),
    ("UPDATE outbox SET delivered_at=? WHERE id IN (?,?) AND delivered_at IS NULL RETURNING kind", (1.0, 1, 2)),
])
def test_the_outbox_queries_read_an_index_never_the_whole_table(tmp_path, sql, args):
    """The statements of spotctl.state.outbox, as they are written there (a copy: a change there that
    drops the index hint fails the test below, which reads the module)."""
    s = Store.open(tmp_path / "r.db", "r")
    busy(s, 2)
    plan = " | ".join(r[3] for r in s.conn.execute("EXPLAIN QUERY PLAN " + sql, args).fetchall())
    assert "SCAN outbox" not in plan.replace("SCAN outbox USING COVERING INDEX outbox_undelivered", ""), plan
    assert "outbox_undelivered" in plan or "INTEGER PRIMARY KEY" in plan, plan
    s.close()


def test_the_module_uses_those_statements():
    import inspect

    from spotctl.state import outbox

    src = inspect.getsource(outbox)
    assert src.count("INDEXED BY outbox_undelivered") >= 4
    assert "WHERE id IN (" in src and "RETURNING kind" in src


def test_status_says_per_kind_what_is_queued_for_which_relay(tmp_path):
    from spotctl.cli.status import _queue

    s = Store.open(tmp_path / "r.db", "r", outbox_kinds={"audit"})
    busy(s, 2)
    q = outbox_queues(s, 62.0)
    assert _queue(q["audit"]) == "queued for audit: 2 pending, the oldest 60s old"
    assert _queue(q["event"]) == "not queued: no relay configured (for kafka)"
    s.close()
    old = Store.open(tmp_path / "r.db", "r")  # an older spotctl queued events: they wait, and it says so
    busy(old, 1, first=10)
    old.close()
    s = Store.open(tmp_path / "r.db", "r", outbox_kinds={"audit"})
    assert _queue(outbox_queues(s, 62.0)["event"]) == ("not queued: no relay configured (for kafka); 2 rows queued "
                                                       "before wait for one")
    s.close()


def test_rows_nothing_queues_any_more_are_counted_once_not_at_every_pass(tmp_path):
    p = tmp_path / "r.db"
    old = Store.open(p, "r")  # an older spotctl, or a region whose relay was removed: rows queued before
    busy(old, 3)
    old.close()
    s = Store.open(p, "r", outbox_kinds=set())
    s.conn.execute("DELETE FROM kv WHERE key LIKE 'outbox.pending.%'")  # as an older spotctl left it: no counter
    statements: list[str] = []
    relay(s, {}, now=lambda: 10.0)  # the pass's relay stores the count it had to make
    s.conn.set_trace_callback(statements.append)
    rep = relay(s, {}, now=lambda: 10.0)
    s.conn.set_trace_callback(None)
    assert rep.kinds["event"].pending == 6 and rep.kinds["audit"].pending == 3
    assert not any("count(" in x for x in statements), statements  # the next pass counts nothing
    s.close()
