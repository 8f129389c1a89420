"""The audit trail over a long history (issue 14, item 4): reads stream in chunks, `audit verify` walks
from its checkpoint (``--full``: the whole kept chain), `--limit` is the newest N, and pruning removes
only a contiguous prefix of acknowledged records, leaving an anchor that `verify --full` starts from."""

from __future__ import annotations

import json
import sqlite3

import pytest
import yaml
from typer.testing import CliRunner

import spotctl.cli.audit as cli_audit
import spotctl.ops.audit as ops_audit
import spotctl.state.audit as state_audit
from spotctl.cli.main import app
from spotctl.core.audit import ALTERED, BROKEN_LINK, CHECKPOINT_CHANGED, CHECKPOINT_GONE, audit_hash
from spotctl.ops.audit import list_records, verify
from spotctl.state.audit import ANCHOR_KEY, CHECKPOINT_KEY
from spotctl.state.store import Store

T0 = 1767571200.0


def cli(*args):
    r = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def add(s: Store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        with s.tx():
            s.audit(actor="alice@host" if i % 2 else "svc:reconciler", action="node.launch" if i % 3 else "node.drain",
                    target=f"spot-gp-{i % 4}", result="ok", inputs={"i": i}, at=T0 + 60 * i)


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "state.db", "demo")
    add(s, 10)
    yield s
    s.close()


def tamper(s: Store, seq: int, **changes) -> None:
    sets = ", ".join(f"{k}=?" for k in changes)
    s.conn.execute(f"UPDATE audit SET {sets} WHERE seq=?", (*changes.values(), seq))


def deliver(s: Store, upto_seq: int, at: float = T0 + 10_000) -> None:
    keys = {r["id"] for r in s.audit_records() if r["seq"] <= upto_seq}
    s.mark_delivered([o["id"] for o in s.outbox_rows("audit") if o["key"] in keys], at)


# -- incremental verify ----------------------------------------------------------------------------------


def test_the_first_verify_is_full_and_leaves_a_checkpoint_the_next_starts_from(store):
    first = verify(store)
    assert (first["ok"], first["mode"], first["from_seq"], first["records"]) == (True, "full", 0, 10)
    assert first["checkpoint"] == {"seq": 10, "saved": True, "problem": None}
    add(store, 3, start=10)
    again = verify(store)
    assert (again["ok"], again["mode"], again["from_seq"], again["records"]) == (True, "incremental", 10, 3)
    assert json.loads(store.get_value(CHECKPOINT_KEY))["seq"] == 13
    nothing_new = verify(store)
    assert (nothing_new["ok"], nothing_new["records"], nothing_new["checkpoint"]["seq"]) == (True, 0, None)
    assert json.loads(store.get_value(CHECKPOINT_KEY))["seq"] == 13  # unchanged: nothing new was verified
    full = verify(store, full=True)
    assert (full["ok"], full["mode"], full["records"]) == (True, "full", 13)


def test_a_record_altered_after_the_checkpoint_fails_incremental_verify_and_the_checkpoint_stays(store):
    verify(store)
    add(store, 4, start=10)
    saved = store.get_value(CHECKPOINT_KEY)
    tamper(store, 12, result="failed")
    r = verify(store)
    assert not r["ok"] and r["mode"] == "incremental" and r["first_bad"]["seq"] == 12
    assert r["first_bad"]["reason"] == ALTERED and r["records"] == 2 and r["checkpoint"]["seq"] is None
    assert store.get_value(CHECKPOINT_KEY) == saved
    assert not verify(store)["ok"]  # still failing: the checkpoint did not move past the bad record


def test_a_record_altered_before_the_checkpoint_is_found_by_full(store):
    verify(store)
    tamper(store, 4, target="elsewhere")
    inc = verify(store)
    assert inc["ok"] and inc["mode"] == "incremental" and inc["records"] == 0  # not walked, and says so
    saved = store.get_value(CHECKPOINT_KEY)
    full = verify(store, full=True)
    assert not full["ok"] and full["first_bad"]["seq"] == 4 and full["records"] == 4
    assert store.get_value(CHECKPOINT_KEY) == saved


@pytest.mark.parametrize("how", ["content", "rehashed", "deleted"])
def test_the_checkpoint_record_itself_is_checked(store, how):
    verify(store)
    rec = store.audit_records()[-1]
    if how == "content":
        tamper(store, 10, result="failed")
    elif how == "rehashed":
        tamper(store, 10, result="failed", hash=audit_hash(dict(rec, result="failed"), rec["prev_hash"]))
    else:
        store.conn.execute("DELETE FROM audit WHERE seq=10")
    add(store, 2, start=10)
    r = verify(store)
    assert not r["ok"] and r["first_bad"]["seq"] == 10
    assert r["first_bad"]["reason"] == (CHECKPOINT_GONE if how == "deleted" else CHECKPOINT_CHANGED)


def test_a_checkpoint_that_cannot_be_saved_does_not_fail_verify(store):
    store.conn.execute("PRAGMA query_only=1")  # what a read-only state directory does to writes
    r = verify(store)
    assert r["ok"] and r["records"] == 10
    assert r["checkpoint"]["seq"] == 10 and not r["checkpoint"]["saved"] and r["checkpoint"]["problem"]
    store.conn.execute("PRAGMA query_only=0")
    assert store.get_value(CHECKPOINT_KEY) is None


def test_a_database_another_writer_holds_leaves_the_checkpoint_unsaved_not_the_verify_failed(store):
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a pass writing: the write lock is taken
    try:
        r = verify(store)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert r["ok"] and r["records"] == 10 and not r["checkpoint"]["saved"] and "lock" in r["checkpoint"]["problem"]
    assert store.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10000  # the usual wait again
    assert verify(store)["checkpoint"]["saved"]


def test_cli_verify_incremental_then_full(tmp_path, store):
    db = str(store.path)
    code, out, _ = cli("-o", "json", "audit", "verify", "--state-db", db)
    d = json.loads(out)["data"]
    assert code == 0 and d["mode"] == "full" and d["records"] == 10 and d["checkpoint"]["saved"]
    add(store, 2, start=10)
    code, out, _ = cli("-o", "table", "audit", "verify", "--state-db", db)
    assert code == 0 and "2 records checked (incremental, the records after seq 10)" in out
    tamper(store, 3, result="failed")
    assert cli("audit", "verify", "--state-db", db)[0] == 0
    code, out, err = cli("-o", "json", "audit", "verify", "--full", "--state-db", db)
    assert code == 9 and json.loads(out)["data"]["first_bad"]["seq"] == 3 and "seq 3" in err


def test_a_bad_checkpoint_value_is_a_state_error(store):
    store.set_value(CHECKPOINT_KEY, '{"seq": "ten"}', T0)
    code, _, err = cli("audit", "verify", "--state-db", str(store.path))
    assert code == 9 and "audit.checkpoint" in err
    assert cli("audit", "verify", "--full", "--state-db", str(store.path))[0] == 0


# -- pruning ---------------------------------------------------------------------------------------------


def test_prune_removes_only_the_acknowledged_prefix_past_the_cutoff(store):
    deliver(store, 6)
    store.mark_delivered([o["id"] for o in store.outbox_rows("audit")][7:8], T0)  # seq 8: delivered, after a gap
    before = {r["seq"]: r for r in store.audit_records()}
    cutoff = T0 + 60 * 5  # records 1..5 are older than the cutoff
    assert store.audit_prunable(cutoff) == (5, 0)
    assert store.prune_audit(cutoff, 100, dry_run=True) == 5 and len(store.audit_records()) == 10
    assert store.prune_audit(cutoff, 3) == 3  # one batch
    assert store.prune_audit(cutoff, 100) == 2
    assert store.prune_audit(cutoff, 100) == 0
    kept = store.audit_records()
    assert [r["seq"] for r in kept] == list(range(6, 11))
    assert {o["key"] for o in store.outbox_rows("audit")} == {r["id"] for r in kept}  # their rows went too
    assert json.loads(store.get_value(ANCHOR_KEY))["hash"] == before[5]["hash"]
    # past the cutoff now, but seq 7 was never acknowledged: the prefix stops at 7, 8 stays behind it
    later = T0 + 60 * 100
    assert store.audit_prunable(later) == (1, 4)
    assert store.prune_audit(later, 100) == 1
    assert [r["seq"] for r in store.audit_records()] == [7, 8, 9, 10]


def test_a_record_never_queued_is_kept(store):
    store.conn.execute("DELETE FROM outbox WHERE kind='audit' AND key=(SELECT id FROM audit WHERE seq=3)")
    deliver(store, 10)
    assert store.prune_audit(T0 + 10**6, 100) == 2
    assert store.audit_records()[0]["seq"] == 3


def test_verify_full_after_prune_starts_at_the_anchor_and_checks_the_first_kept_record(store):
    verify(store)
    deliver(store, 10)
    assert store.prune_audit(T0 + 60 * 4, 100) == 4
    full = verify(store, full=True)
    assert (full["ok"], full["mode"], full["from_seq"], full["records"]) == (True, "full", 4, 6)
    inc = verify(store)
    assert inc["ok"] and inc["from_seq"] == 10
    assert store.verify_audit() == (True, None, 6)
    tamper(store, 5, prev_hash="0" * 64, hash=audit_hash(store.audit_records()[0], "0" * 64))
    bad = verify(store, full=True)
    assert not bad["ok"] and bad["first_bad"]["seq"] == 5 and bad["first_bad"]["reason"] == BROKEN_LINK


def test_removing_the_anchor_or_a_kept_record_is_found(store):
    deliver(store, 10)
    store.prune_audit(T0 + 60 * 4, 100)
    store.conn.execute("DELETE FROM kv WHERE key=?", (ANCHOR_KEY,))
    assert verify(store, full=True)["first_bad"]["seq"] == 5  # chains to the anchor, not to GENESIS


def test_everything_pruned_then_new_records_chain_to_the_anchor(store):
    deliver(store, 10)
    assert store.prune_audit(T0 + 10**6, 100) == 10 and store.audit_records() == []
    add(store, 2, start=10)
    r = verify(store, full=True)
    assert r["ok"] and r["records"] == 2 and r["from_seq"] == 10
    # an incremental verify whose checkpoint was pruned resumes after the anchor
    assert verify(store)["ok"]


def test_everything_pruned_then_adopted_nodes_chain_to_the_anchor(store):
    from spotctl.core.models import Node, NodeState

    deliver(store, 10)
    assert store.prune_audit(T0 + 10**6, 100) == 10
    node = Node(id="n-adopted", pool="gp", state=NodeState.INTENDED, action_id="adopt-1", created_at=T0,
                updated_at=T0, instance_id="i-1")
    with store.tx():
        store.adopt_nodes([(node, NodeState.ACTIVE)], at=T0 + 10**6, actor="svc:reconciler")
    r = verify(store, full=True)
    assert r["ok"] and r["records"] == 1 and r["from_seq"] == 10


def test_prune_rejects_bad_arguments(store):
    for cutoff, limit in ((float("nan"), 10), (T0, 0), (T0, 1.5), (float("inf"), 10)):
        with pytest.raises(ValueError):
            store.prune_audit(cutoff, limit)  # type: ignore[arg-type]


# -- listing: --limit is the newest N, streamed -----------------------------------------------------------


@pytest.mark.parametrize("chunk", [5000, 2])
def test_limit_is_the_newest_n_oldest_first_with_delivery(store, monkeypatch, chunk):
    monkeypatch.setattr(ops_audit, "CHUNK", chunk)   # 2: the large-limit path (forward from the boundary)
    monkeypatch.setattr(state_audit, "CHUNK", chunk)  # and the delivery cursor reads two rows at a time
    deliver(store, 7)
    store.conn.execute("DELETE FROM outbox WHERE kind='audit' AND key=(SELECT id FROM audit WHERE seq=8)")
    got = list_records(store, now=T0, limit=4)
    assert got["count"] == 4 and [r["seq"] for r in got["records"]] == [7, 8, 9, 10]
    assert [r["delivered_at"] is not None for r in got["records"]] == [True, False, False, False]
    launches = [r["seq"] for r in list_records(store, now=T0, action="node.launch")["records"]]
    assert launches == [2, 3, 5, 6, 8, 9]  # i % 3 != 0
    assert [r["seq"] for r in list_records(store, now=T0, action="node.launch", limit=3)["records"]] == [6, 8, 9]
    every = list_records(store, now=T0)
    assert every["count"] == 10 and [r["delivered_at"] is not None for r in every["records"]] == [True] * 7 + [False] * 3
    assert list_records(store, now=T0, limit=50)["count"] == 10


def test_list_json_and_yaml_stream_the_same_envelope(store):
    db = str(store.path)
    code, out, _ = cli("-o", "json", "audit", "list", "--limit", "3", "--state-db", db)
    env = json.loads(out)
    assert code == 0 and list(env) == ["spotctl_result_version", "command", "status", "exit_code", "data", "errors"]
    assert env["data"]["count"] == 3 and [r["seq"] for r in env["data"]["records"]] == [8, 9, 10]
    assert out == json.dumps(env, indent=2) + "\n"  # byte for byte what the envelope renderer writes
    code, yout, _ = cli("-o", "yaml", "audit", "list", "--limit", "3", "--state-db", db)
    assert code == 0 and yaml.safe_load(yout) == env
    code, out, _ = cli("-o", "json", "audit", "list", "--actor", "nobody", "--state-db", db)
    assert json.loads(out)["data"] == {"region": "demo", "count": 0, "records": []}
    assert yaml.safe_load(cli("-o", "yaml", "audit", "list", "--actor", "nobody", "--state-db", db)[1])["data"][
        "records"] == []


def test_a_long_table_is_written_one_line_per_record(store, monkeypatch):
    monkeypatch.setattr(cli_audit, "TABLE_MAX", 3)
    code, out, _ = cli("-o", "table", "audit", "list", "--state-db", str(store.path))
    lines = out.splitlines()
    assert code == 0 and "(10: one line each" in lines[0] and len(lines) == 12
    code, out, _ = cli("-o", "table", "audit", "list", "--limit", "2", "--state-db", str(store.path))
    assert code == 0 and "Audit records in region demo (2)" in out


def test_iter_audit_reads_in_chunks_and_verify_against_a_service(store):
    assert [r["seq"] for r in store.iter_audit(chunk=3)] == list(range(1, 11))
    deliver(store, 6)
    recs = store.audit_records()

    class Service:  # the audit service's port: what it stores for the region
        url = "http://audit.test"

        def records(self, region=None):
            yield from ({"id": r["id"], "hash": r["hash"]} for r in recs[:4])  # 5 and 6 missing
            yield {"id": recs[2]["id"], "hash": "x"}  # a later duplicate: the first copy counts
            yield {"id": "not-ours", "hash": "y"}
            yield {"id": recs[8]["id"], "hash": "z"}  # not delivered yet: not compared

    s = verify(store, Service())["service"]
    assert (s["ok"], s["checked"], s["pending"], s["missing"], s["mismatched_count"], s["unknown_locally"]) == (
        False, 6, 4, [recs[4]["id"], recs[5]["id"]], 0, 1)


def test_export_streams_in_one_snapshot(store):
    chunks = ops_audit.export(store, "jsonl", now=T0)
    first = next(chunks)
    assert json.loads(first)["seq"] == 1 and store.conn.in_transaction  # the read snapshot is held
    assert len(list(chunks)) == 9 and not store.conn.in_transaction


def test_tampering_through_sqlite_is_found_by_the_cli(store):
    verify(store)
    c = sqlite3.connect(store.path)
    c.execute("UPDATE audit SET actor='mallory' WHERE seq=2")
    c.commit()
    c.close()
    assert cli("audit", "verify", "--state-db", str(store.path))[0] == 0  # before the checkpoint
    assert cli("audit", "verify", "--full", "--state-db", str(store.path))[0] == 9
