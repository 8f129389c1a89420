"""The watcher's cost per notice does not grow with the region's history: every statement it runs for a
notice finds its rows through an index (the query plans SQLite chose, no timing), so a notice is handled
as fast at 100k nodes, or after a year of transitions and notices, as on a fresh region."""

from __future__ import annotations

import re
import threading

from spotctl.core.models import NodeState, Notice, NoticeKind
from spotctl.ops import watch as fast

from .conftest import advance

# A pass over every row of a table that grows with history, or over all of one of its indexes (``SCAN t``,
# ``SCAN t USING INDEX i``); a lookup is ``SEARCH t USING INDEX i (col=?)``.
FULL_SCAN = re.compile(r"^SCAN (nodes|notices|transitions|actions|outbox)\b")


def plans(store, statements: list[str]) -> dict[str, list[str]]:
    out = {}
    for sql in dict.fromkeys(statements):
        if sql.split(None, 1)[0].upper() not in ("SELECT", "UPDATE", "DELETE", "INSERT"):
            continue
        out[sql] = [row[3] for row in store.conn.execute("EXPLAIN QUERY PLAN " + sql)]
    return out


def _hard_notice_traced(rt, notice_id: str):
    """A hard notice for an active node, handled by the watcher's fast path with every SQL statement traced:
    (the node, the watcher's event, the statements)."""
    node = next(n for n in rt.store.nodes(live_only=True) if n.state is NodeState.ACTIVE)
    now = rt.clock.now()
    notice = Notice(id=notice_id, instance_id=node.instance_id, kind=NoticeKind.HARD, issued_at=now,
                    deadline=now + 150, reason="reclaim", pool=node.pool, delivered_at=now + 0.2)
    statements: list[str] = []
    rt.store.conn.set_trace_callback(statements.append)
    try:
        ev = fast.handle(rt, notice, now, threading.Event())
    finally:
        rt.store.conn.set_trace_callback(None)
    return node, ev, statements


def test_node_by_instance_uses_the_instance_index(make_rt):
    rt, world = make_rt()
    advance(rt, world, 300, step=60)
    node = next(n for n in rt.store.nodes(live_only=True) if n.instance_id)
    statements: list[str] = []
    rt.store.conn.set_trace_callback(statements.append)
    try:
        assert rt.store.node_by_instance(node.instance_id).id == node.id
    finally:
        rt.store.conn.set_trace_callback(None)
    (detail,) = plans(rt.store, statements).values()
    assert any("USING INDEX nodes_instance" in d for d in detail), detail
    assert rt.store.node_by_instance("no-such-instance") is None


def test_a_notice_handled_by_the_watcher_scans_no_table_that_grows(make_rt):
    rt, world = make_rt()
    advance(rt, world, 900, step=60)  # nodes up, busy, with transitions and events behind them
    node, ev, statements = _hard_notice_traced(rt, "q-1")
    assert ev["action"] == "drain" and ev["status"] == "ok"
    assert rt.store.node(node.id).state is NodeState.DRAINING
    found = plans(rt.store, statements)
    assert any(s.lstrip().upper().startswith("SELECT ") and " FROM NODES WHERE INSTANCE_ID" in s.upper() for s in found)
    scans = {sql: d for sql, d in found.items() if any(FULL_SCAN.search(x) for x in d)}
    assert not scans, scans


def test_two_notices_for_one_node_in_a_batch_act_once(make_rt):
    """A storm can carry an advisory and a hard notice for the same node in one poll: one drain, and the
    other notice says which notice of the batch handles its node (each is recorded as seen)."""
    rt, world = make_rt()
    advance(rt, world, 600, step=60)
    a, b = [n for n in rt.store.nodes(live_only=True) if n.state is NodeState.ACTIVE][:2]
    now = rt.clock.now()
    batch = [Notice(id="h-a", instance_id=a.instance_id, kind=NoticeKind.HARD, issued_at=now, deadline=now + 150,
                    reason="reclaim", pool=a.pool),
             Notice(id="h-b", instance_id=b.instance_id, kind=NoticeKind.HARD, issued_at=now, deadline=now + 150,
                    reason="reclaim", pool=b.pool),
             Notice(id="h-a2", instance_id=a.instance_id, kind=NoticeKind.HARD, issued_at=now, deadline=now + 140,
                    reason="reclaim again", pool=a.pool)]
    events = fast.handle_batch(rt, batch, now)
    assert [e["action"] for e in events] == ["drain", "drain", f"none: node {a.id} is handled by another notice "
                                                                "of this batch"]
    assert {n["id"] for n in rt.store.notices()} >= {"h-a", "h-b", "h-a2"}
    assert rt.store.node(a.id).state is NodeState.DRAINING and rt.store.node(b.id).state is NodeState.DRAINING


def test_the_watcher_copies_the_log_after_the_drains_are_accepted_not_inside_a_commit(make_rt):
    """SQLite's automatic checkpoint runs inside whichever commit finds the write-ahead log full, and costs
    more in a larger database: on the notice path that made the latency grow with the node table. The
    watcher's connection leaves it off and checkpoints (``PASSIVE``: it waits for no reader) once the
    batch's drains are accepted, after its last commit; the log is then copied into the database."""
    rt, world = make_rt()
    advance(rt, world, 600, step=60)
    _, ev, statements = _hard_notice_traced(rt, "c-1")
    assert ev["action"] == "drain" and ev["status"] == "ok"
    assert rt.store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    commits = [i for i, s in enumerate(statements) if s.strip().upper() == "COMMIT"]
    checkpoints = [i for i, s in enumerate(statements) if "wal_checkpoint" in s]
    assert commits and checkpoints and checkpoints[-1] > commits[-1]
    busy, log_frames, copied = rt.store.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and log_frames == copied
