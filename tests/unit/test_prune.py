"""Pruning by retention (spotctl.state.prune, spotctl.ops.prune): on a history built with the real store at
fixed times, a prune deletes exactly what is done with and past its retention — never a live node or its
transitions, an intended or running action, an undelivered outbox row, a running pass, the newest plan —
and the dry run's counts are what the prune then deletes, in whatever batch size."""

from __future__ import annotations

import dataclasses

import pytest

from spotctl.core.budget import Priority
from spotctl.core.config import Retention
from spotctl.core.models import Node, NodeState
from spotctl.ops import prune as ops_prune
from spotctl.state.store import Store

DAY = 86_400.0
NOW = 1_800_000_000.0  # a fixed clock: every age below is from here
S = NodeState


def ago(days: float) -> float:
    return NOW - days * DAY


def node(store: Store, name: str, path: list[tuple[NodeState, float]], created: float, instance: bool = True) -> Node:
    n = Node(id=name, pool="p", state=S.INTENDED, action_id=f"act-{name}", created_at=created, updated_at=created,
             instance_id=f"i-{name}" if instance else None)
    store.add_node(n, actor="t", reason="test")
    for state, at in path:
        store.transition(n, state, reason="test", at=at, actor="t")
    return n


def action(store: Store, aid: str, at: float, status: str | None) -> None:
    store.record_intent(action_id=aid, plan_id=None, kind="launch", priority=Priority.LAUNCH, reason="r", actor="t",
                        at=at, inputs={})
    if status is not None:
        store.finish_action(aid, status, "r", at)


def notice(store: Store, nid: str, node_id: str | None, at: float, handled: bool = False) -> None:
    store.see_notice(notice_id=nid, node_id=node_id, instance_id=f"i-{node_id}", kind="hard", issued_at=at,
                     deadline=at + 120, reason="r", at=at)
    if handled:
        store.notice_handled(nid, at + 1)


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    yield s
    s.close()


def history(s: Store) -> None:
    """A region's history, each row named by what a prune must do with it."""
    node(s, "live-old", [(S.BUILDING, ago(60)), (S.ACTIVE, ago(59))], ago(60))  # live: kept, and all of its
    node(s, "live-new", [(S.ACTIVE, ago(1))], ago(1))
    node(s, "gone-old", [(S.BUILDING, ago(50)), (S.GONE, ago(40))], ago(50))  # past 30 days: goes
    node(s, "failed-old", [(S.FAILED, ago(45))], ago(45), instance=False)  # never made: goes
    node(s, "failed-stuck", [(S.FAILED, ago(45))], ago(45))  # its instance is yet to be deleted: kept, and all of it
    node(s, "lost-old", [(S.ACTIVE, ago(45)), (S.LOST, ago(31))], ago(45))  # goes (its reclaim too)
    node(s, "gone-new", [(S.ACTIVE, ago(40)), (S.GONE, ago(10))], ago(40))  # kept; its 40-day-old transitions go
    action(s, "act-intended-old", ago(90), None)  # resumable: kept
    action(s, "act-running-old", ago(90), "running")  # resumable: kept
    action(s, "act-ok-old", ago(40), "ok")  # goes
    action(s, "act-failed-old", ago(31), "failed")  # goes
    action(s, "act-ok-new", ago(2), "ok")  # kept
    notice(s, "nt-live-old", "live-old", ago(40), handled=True)  # of a live node: kept
    notice(s, "nt-gone-old", "gone-new", ago(40), handled=True)  # its node ended: goes
    notice(s, "nt-stranger-old", None, ago(40))  # not ours: goes
    notice(s, "nt-new", None, ago(3))  # kept
    # outbox: the node events above are undelivered (kept); these are delivered at the times given
    for key, at in (("ev-delivered-old", ago(8)), ("ev-delivered-new", ago(6))):
        s.outbox("event", key, {"k": key}, at)
    ids = {r["key"]: r["id"] for r in s.outbox_rows("event") if r["key"].startswith("ev-")}
    s.mark_delivered([ids["ev-delivered-old"]], ago(8))  # past 7 days: goes
    s.mark_delivered([ids["ev-delivered-new"]], ago(6))  # kept
    s.outbox("event", "ev-undelivered-old", {"k": 1}, ago(100))  # never delivered: kept whatever its age
    for i, (at, status) in enumerate([(ago(40), "ok"), (ago(35), "partial"), (ago(40), "running"), (ago(1), "ok")]):
        with s.tx() as c:
            c.execute("INSERT INTO passes (started_at, finished_at, actor, status) VALUES (?,?,?,?)",
                      (at, None if status == "running" else at + 1, "t", status))
    for i in range(5):
        s.record_plan(plan_id=f"plan-{i}", at=ago(5 - i), actor="t", executed=True, summary={"i": i},
                      plan_input={"i": i, "pad": "x" * 1000 * (i + 1)})


def rows(s: Store) -> dict[str, set]:
    q = s.conn.execute
    return {
        "nodes": {r[0] for r in q("SELECT id FROM nodes")},
        "transitions": {(r[0], r[1]) for r in q("SELECT node_id, to_state FROM transitions")},
        "reclaims": {r[0] for r in q("SELECT node_id FROM reclaims")},
        "actions": {r[0] for r in q("SELECT id FROM actions")},
        "notices": {r[0] for r in q("SELECT id FROM notices")},
        "outbox": {r[0] for r in q("SELECT id FROM outbox")},
        "passes": {(r[0], r[1]) for r in q("SELECT started_at, status FROM passes")},
        "plans": {r[0] for r in q("SELECT plan_id FROM plans")},
    }


RET = Retention.of()  # the defaults: 30 days, outbox 7 days, plans 500 / 64 MiB


def expected_after(before: dict[str, set], s: Store) -> dict[str, set]:
    gone_nodes = {"gone-old", "failed-old", "lost-old"}
    out = {k: set(v) for k, v in before.items()}
    out["nodes"] -= gone_nodes
    out["transitions"] = {t for t in before["transitions"] if t[0] not in gone_nodes}
    # gone-new ended 10 days ago: its transitions older than 30 days go, the one 10 days ago stays
    out["transitions"] -= {("gone-new", "intended"), ("gone-new", "active")}
    out["reclaims"] = set()  # lost-old's, 31 days ago
    out["actions"] -= {"act-ok-old", "act-failed-old"}
    out["notices"] -= {"nt-gone-old", "nt-stranger-old"}
    delivered_old = s.conn.execute("SELECT id FROM outbox WHERE key = 'ev-delivered-old'").fetchone()[0]
    out["outbox"] -= {delivered_old}
    out["passes"] -= {(ago(40), "ok"), (ago(35), "partial")}
    return out


@pytest.mark.parametrize("batch", [1000, 1])
def test_a_prune_deletes_exactly_what_is_done_with_and_past_its_retention(store, monkeypatch, batch):
    monkeypatch.setattr(ops_prune, "BATCH", batch)  # one row per transaction: every cursor and restart path
    history(store)
    before = rows(store)
    want = expected_after(before, store)
    deleted, done = ops_prune.run(store, RET, NOW)
    assert done
    assert rows(store) == want
    # the live node keeps every transition, however old, and the live nodes are all there
    assert {t for t in rows(store)["transitions"] if t[0] == "live-old"} == {
        ("live-old", "intended"), ("live-old", "building"), ("live-old", "active")}
    assert {n.id for n in store.nodes(live_only=True)} == {"live-old", "live-new"}
    assert deleted["nodes"] == 3 and deleted["actions"] == 2 and deleted["notices"] == 2 and deleted["passes"] == 2
    # a second prune finds nothing more
    again, _ = ops_prune.run(store, RET, NOW)
    assert not any(again.values())


def test_the_dry_run_deletes_nothing_and_counts_what_the_prune_deletes(store):
    history(store)
    before = rows(store)
    report = {r["table"]: r for r in ops_prune.report(store, RET, NOW)}
    assert rows(store) == before
    for t, r in report.items():
        assert r["kept"] + r["eligible"] == r["rows"], t
        assert sum(k["rows"] for k in r["kept_because"]) == r["kept"], (t, r)
    deleted, _ = ops_prune.run(store, RET, NOW)
    for t in ("actions", "notices", "outbox", "passes", "reclaims", "plans"):
        assert report[t]["eligible"] == deleted[t], t
    assert report["nodes"]["eligible"] == deleted["nodes"] == 3
    assert report["transitions"]["eligible"] + report["nodes"]["with_them"]["transitions"] == deleted["transitions"]
    why = {k["why"]: k["rows"] for k in report["outbox"]["kept_because"]}
    assert why["outbox rows not yet delivered"] >= 1
    assert {k["why"] for k in report["actions"]["kept_because"]} == {
        "actions intended or running (resumable)", "finished actions within their retention"}


def test_a_zero_retention_still_keeps_what_is_live_resumable_or_undelivered(store):
    history(store)
    zero = dataclasses.replace(RET, **{f"{t}_days": 0 for t in ("nodes", "transitions", "actions", "notices",
                                                               "outbox", "audit", "passes")}, plans_max=1,
                               plans_max_mib=0)
    ops_prune.run(store, zero, NOW)
    left = rows(store)
    assert left["nodes"] == {"live-old", "live-new", "failed-stuck"}
    assert {t[0] for t in left["transitions"]} == {"live-old", "live-new", "failed-stuck"}
    assert left["actions"] == {"act-intended-old", "act-running-old"}
    assert left["notices"] == {"nt-live-old"}
    assert store.conn.execute("SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL AND kind != 'audit'"
                              ).fetchone()[0] == 0
    assert store.conn.execute("SELECT count(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0] == len(
        [r for r in store.outbox_rows(pending_only=True)]) > 0
    assert {p[1] for p in left["passes"]} == {"running"}
    assert left["plans"] == {"plan-4"}  # the newest plan is always kept


def test_plans_are_capped_by_count_and_by_stored_size(store):
    history(store)
    ops_prune.run(store, dataclasses.replace(RET, plans_max=3), NOW)
    assert rows(store)["plans"] == {"plan-2", "plan-3", "plan-4"}
    sizes = dict(store.conn.execute("SELECT plan_id, length(input) FROM plans"))
    cap = (sizes["plan-4"] + sizes["plan-3"]) / (1 << 20)  # room for the two newest exactly
    ops_prune.run(store, dataclasses.replace(RET, plans_max_mib=cap), NOW)
    assert rows(store)["plans"] == {"plan-3", "plan-4"}


def test_the_passes_walk_on_from_their_mark_and_a_node_ended_since_takes_its_transitions(store):
    history(store)
    ops_prune.run(store, RET, NOW, resume=True)
    mark = store.get_value(ops_prune.CURSOR_KEY.format(table="transitions"))
    assert mark is not None  # where the walk of the transitions ended: the next pass goes on from there
    # live-old's transitions (60 days old) are behind the mark; it ends now, long enough ago to go
    node = store.node("live-old")
    store.transition(node, S.GONE, reason="test", at=ago(31), actor="t")
    deleted, done = ops_prune.run(store, RET, NOW, resume=True)
    assert done and deleted["nodes"] == 1
    assert "live-old" not in rows(store)["nodes"]
    assert not [t for t in rows(store)["transitions"] if t[0] == "live-old"]
    # a bad mark (a hand-edited database) is ignored: the walk starts from the beginning
    store.set_value(ops_prune.CURSOR_KEY.format(table="transitions"), "nan x", NOW)
    assert ops_prune.run(store, RET, NOW, resume=True)[1]


def test_a_spent_time_budget_stops_before_the_first_batch(store):
    history(store)
    before = rows(store)
    deleted, done = ops_prune.run(store, RET, NOW, budget_s=0)
    assert not done and not any(deleted.values())
    assert rows(store) == before


def test_audit_records_go_only_once_acknowledged_and_past_their_retention(store):
    recs = [store.audit(actor="t", action="node.launch", target=f"n{i}", result="ok", inputs={}, at=ago(100 - i))
            for i in range(5)]
    recs.append(store.audit(actor="t", action="node.launch", target="n-new", result="ok", inputs={}, at=ago(1)))
    report = {r["table"]: r for r in ops_prune.report(store, RET, NOW)}
    assert report["audit"]["eligible"] == 0  # nothing acknowledged by an audit service yet
    assert {k["why"]: k["rows"] for k in report["audit"]["kept_because"]} == {
        "audit records not acknowledged by the audit service": 5, "audit records within their retention": 1}
    ops_prune.run(store, RET, NOW)
    assert store.conn.execute("SELECT count(*) FROM audit").fetchone()[0] == 6
    # the service acknowledges the first two, the fourth, and the newest: only the first two may go (the
    # third, unacknowledged, keeps everything after it; the newest is within its retention)
    out = {r["key"]: r["id"] for r in store.outbox_rows("audit")}
    store.mark_delivered([out[recs[i]["id"]] for i in (0, 1, 3, 5)], ago(50))
    report = {r["table"]: r for r in ops_prune.report(store, RET, NOW)}
    assert report["audit"]["eligible"] == 2
    deleted, _ = ops_prune.run(store, RET, NOW)
    assert deleted["audit"] == 2
    left = [r["id"] for r in store.audit_records()]
    assert left == [r["id"] for r in recs[2:]]
    assert {r["key"] for r in store.outbox_rows("audit")} == set(left)  # their outbox rows went with them
    ok, bad, _ = store.verify_audit()
    assert ok, bad


def test_live_only_reads_the_live_states_from_the_state_index(store):
    history(store)
    plan = " ".join(r[-1] for r in store.conn.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM nodes WHERE state IN ('intended','building','active','advised',"
        "'draining','deleting') ORDER BY id"))
    assert "nodes_" in plan, plan  # an index on state, not a scan of every node
    assert {n.id for n in store.nodes(live_only=True)} == {"live-old", "live-new"}


def test_reclaims_out_of_time_order_are_counted_and_deleted_alike(store):
    # written newest first (a late import, a clock step): the oldest by id is not due, others are
    with store.tx() as c:
        c.executemany("INSERT INTO reclaims (pool, node_id, at, kind) VALUES (?,?,?,?)",
                      [("p", f"n{i}", at, "lost") for i, at in enumerate((ago(1), ago(40), ago(2), ago(35), ago(31)))])
    report = {r["table"]: r for r in ops_prune.report(store, RET, NOW)}
    assert report["reclaims"]["eligible"] == 3
    deleted, done = ops_prune.run(store, RET, NOW)
    assert done and deleted["reclaims"] == 3
    assert rows(store)["reclaims"] == {"n0", "n2"}
    # the budgeted prune of a pass finds them too
    with store.tx() as c:
        c.executemany("INSERT INTO reclaims (pool, node_id, at, kind) VALUES (?,?,?,?)",
                      [("p", "n5", ago(0.5), "lost"), ("p", "n6", ago(50), "lost")])
    deleted, done = ops_prune.run(store, RET, NOW, budget_s=60, resume=True, batch=ops_prune.PASS_BATCH)
    assert done and deleted["reclaims"] == 1 and rows(store)["reclaims"] == {"n0", "n2", "n5"}


def test_a_budgeted_prune_in_growing_batches_deletes_what_the_whole_prune_does(store, tmp_path):
    history(store)
    want = expected_after(rows(store), store)
    deleted, done = ops_prune.run(store, RET, NOW, budget_s=60, resume=True, batch=ops_prune.PASS_BATCH)
    assert done and rows(store) == want
    assert set(store.prune_rates()) >= {"nodes", "actions", "plans"}  # each table's cost per row, measured


def test_a_batch_whose_estimate_does_not_fit_the_budget_is_not_begun(store):
    history(store)
    before = rows(store)
    rates = store.prune_rates()
    rates.update(dict.fromkeys(ops_prune.TABLES, 1.0))  # a second a row, measured earlier: not one row fits in 0.2 s
    deleted, done = ops_prune.run(store, RET, NOW, budget_s=0.2, resume=True, batch=ops_prune.PASS_BATCH)
    assert not done and not any(deleted.values()) and rows(store) == before
    rates["actions"] = 1e-6  # one cheap table: it goes on, the others wait
    deleted, done = ops_prune.run(store, RET, NOW, budget_s=0.2, resume=True, batch=ops_prune.PASS_BATCH)
    assert not done and deleted["actions"] == 2 and sum(deleted.values()) == 2


def test_the_passes_read_the_size_of_new_plans_only_and_cap_them_as_a_full_check_does(store):
    for i in range(6):
        store.record_plan(plan_id=f"plan-{i}", at=ago(6 - i), actor="t", executed=True, summary={},
                          plan_input={"pad": "x" * 1000 * (i + 1)})
    capped = dataclasses.replace(RET, plans_max=4)
    ops_prune.run(store, capped, NOW, budget_s=60, resume=True)
    assert rows(store)["plans"] == {"plan-2", "plan-3", "plan-4", "plan-5"}
    sql: list[str] = []
    store.conn.set_trace_callback(sql.append)
    try:
        store.record_plan(plan_id="plan-6", at=NOW, actor="t", executed=True, summary={}, plan_input={"pad": "y"})
        sql.clear()
        ops_prune.run(store, capped, NOW, budget_s=60, resume=True)
    finally:
        store.conn.set_trace_callback(None)
    reads = [q for q in sql if "length(input)" in q]
    assert reads and all("seq > " in q for q in reads), reads  # the new plan's size, not every plan's
    assert rows(store)["plans"] == {"plan-3", "plan-4", "plan-5", "plan-6"}
    # a size cap, a list in kv that no longer holds (a plan deleted under it), a bad one: same as a full check
    sizes = dict(store.conn.execute("SELECT plan_id, length(input) FROM plans"))
    by_size = dataclasses.replace(RET, plans_max_mib=(sizes["plan-6"] + sizes["plan-5"]) / (1 << 20))
    with store.tx() as c:
        c.execute("DELETE FROM plans WHERE plan_id = 'plan-3'")
    ops_prune.run(store, by_size, NOW, budget_s=60, resume=True)
    assert rows(store)["plans"] == {"plan-5", "plan-6"}
    store.set_value("prune.plans.sizes", "[[1, \"x\"]", NOW)
    ops_prune.run(store, dataclasses.replace(RET, plans_max=1), NOW, budget_s=60, resume=True)
    assert rows(store)["plans"] == {"plan-6"}
