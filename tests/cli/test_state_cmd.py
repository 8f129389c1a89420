"""``spotctl state prune`` and ``spotctl state check``: the envelope, exit codes, the region lock, bad
retention settings, the prune at the end of a pass — and a prune killed with SIGKILL half way through a
large history, which loses nothing it should keep and leaves a database the next prune finishes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotctl.state.store import Store

BIN = Path(sys.executable).parent
DAY = 86_400.0


@pytest.fixture
def region(cli, state_db):
    r = cli("-o", "json", "reconcile")
    assert r.code == 0, r.stderr
    return state_db


def age(db: Path, *, ended: int, live: int, delivered: int, undelivered: int, finished: int, intended: int) -> dict:
    """Write an aged history straight into the region's database (as a year of passes would leave it):
    ``ended`` gone nodes 40 days old with two transitions each, ``live`` nodes with transitions 60 days old,
    delivered and undelivered outbox rows 40 days old, finished and intended actions 40 days old."""
    old = time.time() - 40 * DAY
    c = sqlite3.connect(db)
    with c:
        c.executemany("INSERT INTO nodes (id, pool, state, action_id, created_at, updated_at) VALUES (?,?,?,?,?,?)",
                      [(f"old-{i}", "gp-az1", "gone", f"a-old-{i}", old, old) for i in range(ended)]
                      + [(f"keep-{i}", "gp-az1", "active", f"a-keep-{i}", old - 20 * DAY, old - 20 * DAY)
                         for i in range(live)])
        c.executemany("INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) VALUES (?,?,?,?,?,?)",
                      [(f"old-{i}", s, t, old, "aged", "t") for i in range(ended)
                       for s, t in ((None, "active"), ("active", "gone"))]
                      + [(f"keep-{i}", None, "active", old - 20 * DAY, "aged", "t") for i in range(live)])
        c.executemany("INSERT INTO outbox (kind, key, payload, created_at, delivered_at) VALUES (?,?,?,?,?)",
                      [("event", f"k{i}", "{}", old, old) for i in range(delivered)]
                      + [("event", f"u{i}", "{}", old, None) for i in range(undelivered)])
        c.executemany("INSERT INTO actions (id, kind, priority, status, reason, actor, created_at, updated_at, inputs)"
                      " VALUES (?,?,?,?,?,?,?,?,?)",
                      [(f"fin-{i}", "launch", "launch", "ok", "r", "t", old, old, "{}") for i in range(finished)]
                      + [(f"int-{i}", "launch", "launch", "intended", "r", "t", old, old, "{}")
                         for i in range(intended)])
    c.close()
    return must_keep(db)


def must_keep(db: Path) -> dict:
    """What no prune may take: live nodes and their transitions, undelivered rows, resumable actions."""
    c = sqlite3.connect(db)
    try:
        q = lambda sql: c.execute(sql).fetchone()[0]
        return {
            "live nodes": q("SELECT count(*) FROM nodes WHERE state NOT IN ('gone','failed','lost')"),
            "live transitions": q("SELECT count(*) FROM transitions WHERE node_id IN "
                                  "(SELECT id FROM nodes WHERE state NOT IN ('gone','failed','lost'))"),
            "undelivered": q("SELECT count(*) FROM outbox WHERE delivered_at IS NULL"),
            "resumable": q("SELECT count(*) FROM actions WHERE status IN ('intended','running')"),
            "audit": q("SELECT count(*) FROM audit"),
        }
    finally:
        c.close()


def counts(db: Path) -> dict:
    c = sqlite3.connect(db)
    try:
        return {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("nodes", "transitions", "outbox", "actions", "audit", "passes", "plans")}
    finally:
        c.close()


def test_the_dry_run_reports_per_table_and_deletes_nothing(cli, region):
    kept = age(region, ended=50, live=5, delivered=30, undelivered=4, finished=20, intended=3)
    before = counts(region)
    r = cli("-o", "json", "state", "prune", "--dry-run")
    assert r.code == 0, r.stderr
    env = r.json
    assert (env["command"], env["status"], env["exit_code"], env["errors"]) == ("state prune", "dry-run", 0, [])
    tables = {t["table"]: t for t in env["data"]["tables"]}
    assert tables["nodes"]["eligible"] == 50 and tables["nodes"]["with_them"] == {"transitions": 0}
    assert tables["transitions"]["eligible"] == 100
    assert tables["outbox"]["eligible"] == 30 and tables["actions"]["eligible"] == 20
    why = {k["why"]: k["rows"] for k in tables["nodes"]["kept_because"]}
    assert why["live nodes"] == kept["live nodes"]
    assert {k["why"]: k["rows"] for k in tables["actions"]["kept_because"]}[
        "actions intended or running (resumable)"] == 3
    assert counts(region) == before
    t = cli("-o", "table", "state", "prune", "--dry-run")
    assert t.code == 0 and "dry run: nothing deleted" in t.stdout and "live nodes" in t.stdout


def test_a_prune_deletes_what_is_due_and_records_one_audit_record(cli, region):
    kept = age(region, ended=50, live=5, delivered=30, undelivered=4, finished=20, intended=3)
    before = counts(region)
    r = cli("-o", "json", "state", "prune")
    assert r.code == 0, r.stderr
    d = r.json["data"]
    assert r.json["status"] == "ok" and not d["dry_run"]
    deleted = {t["table"]: t["deleted"] for t in d["tables"]}
    assert deleted["nodes"] == 50 and deleted["transitions"] == 100 and deleted["outbox"] == 30
    assert deleted["actions"] == 20
    after = counts(region)
    # two records (round 1 wrote one, after the deletes): "started" with the policy before, the counts after
    assert after["nodes"] == before["nodes"] - 50 and after["audit"] == before["audit"] + 2
    assert must_keep(region) == {**kept, "audit": kept["audit"] + 2, "undelivered": kept["undelivered"] + 2}  # queued
    records = prune_records(cli)
    assert [r["result"] for r in records] == ["started", "ok"]
    assert records[0]["id"] == d["started_record"] and records[1]["id"] == d["audit_record"]
    assert records[0]["inputs"]["retention"]["nodes"] == "30 days" and "deleted" not in records[0]["inputs"]
    assert records[1]["inputs"]["deleted"]["nodes"] == 50 and records[1]["inputs"]["started"] == records[0]["id"]
    v = cli("-o", "json", "audit", "verify", "--local-only")
    assert v.code == 0, v.stdout
    again = cli("-o", "json", "state", "prune", "--dry-run").json["data"]["tables"]
    assert all(t["eligible"] == 0 for t in again), again


def prune_records(cli) -> list[dict]:
    rec = cli("-o", "json", "audit", "list", "--action", "state.prune").json["data"]
    records = rec["records"] if isinstance(rec, dict) else rec
    return sorted(records, key=lambda r: r["seq"])  # oldest first


def test_a_prune_refuses_while_a_pass_holds_the_region_lock(cli, region):
    age(region, ended=5, live=1, delivered=0, undelivered=0, finished=0, intended=0)
    before = counts(region)
    holder = Store.open(region, "demo")
    try:
        assert holder.try_lock(purpose="spot-reconciler pass")
        r = cli("-o", "json", "state", "prune", "--wait", "0")
    finally:
        holder.close()
    assert r.code == 6, r.stderr
    first = r.stderr.splitlines()[0]
    assert "region lock" in first and "spot-reconciler pass" in first, first
    assert r.json["status"] == "error" and r.json["errors"][0]["code"] == "refused"
    assert counts(region) == before


# (the TOML, the dotted key, a phrase of the message)
BAD_RETENTION = [
    ("nodes_days = -1", "nodes_days", ">= 0"),
    ("audit_days = nan", "audit_days", "finite"),
    ("outbox_days = inf", "outbox_days", "finite"),
    ("transitions_days = 99999", "transitions_days", "<= 3660"),
    ("plans_max = 0", "plans_max", ">= 1"),
    ("plans_max = 501", "plans_max", "<= 500"),
    ("plans_max_mib = -5", "plans_max_mib", ">= 0"),
    ("pass_budget_seconds = 1e9", "pass_budget_seconds", "<= 60"),
    ('actions_days = "30"', "actions_days", "must be a number"),
    ("keep_forever = true", "keep_forever", "unknown key"),
]


@pytest.mark.parametrize("line,key,phrase", BAD_RETENTION, ids=[c[0] for c in BAD_RETENTION])
def test_a_bad_retention_setting_exits_3_naming_file_line_and_key(cli, tmp_path, region, line, key, phrase):
    before = counts(region)
    f = tmp_path / "bad.toml"
    f.write_text(f"[regions.demo.retention]\n{line}\n")
    for argv in (("state", "prune"), ("reconcile",)):
        r = cli("--config", str(f), "-o", "json", *argv)
        assert r.code == 3, r.stderr
        first = r.stderr.splitlines()[0]
        assert first.startswith(f"spotctl: error: {f}:2: "), first
        assert f"'regions.demo.retention.{key}'" in first and phrase in first, first
        assert r.json["errors"][0]["code"] == "config"
    assert counts(region) == before


def test_each_pass_prunes_within_its_budget_and_says_so_in_its_summary(cli, region):
    age(region, ended=30, live=2, delivered=10, undelivered=2, finished=5, intended=1)
    kept = must_keep(region)
    mine = ("SELECT (SELECT count(*) FROM nodes WHERE id LIKE 'keep-%'), (SELECT count(*) FROM transitions WHERE "
            "node_id LIKE 'keep-%'), (SELECT count(*) FROM actions WHERE id LIKE 'int-%')")
    c = sqlite3.connect(region)
    live_before = c.execute(mine).fetchone()
    c.close()
    r = cli("-o", "json", "reconcile")
    assert r.code == 0, r.stderr
    c = sqlite3.connect(region)
    summary = json.loads(c.execute("SELECT summary FROM passes ORDER BY seq DESC LIMIT 1").fetchone()[0])
    gone = c.execute("SELECT count(*) FROM nodes WHERE id LIKE 'old-%'").fetchone()[0]
    live_after = c.execute(mine).fetchone()
    c.close()
    assert summary["pruned"]["rows"]["nodes"] == 30 and summary["pruned"]["done"], summary
    assert r.json["data"]["pruned"] == summary["pruned"]["rows"]  # and in the pass's result
    assert gone == 0
    # the live nodes of before (the pass may have found them lost: they ended just now), their transitions
    # and the resumable actions are all still there, and so is every undelivered row
    nodes_after, transitions_after, actions_after = live_after
    assert nodes_after == live_before[0] and transitions_after >= live_before[1] and actions_after == live_before[2]
    assert must_keep(region)["undelivered"] >= kept["undelivered"]


def test_the_pass_output_says_what_it_pruned_in_one_line_when_it_pruned_anything(cli, region):
    age(region, ended=7, live=0, delivered=0, undelivered=0, finished=0, intended=0)
    r = cli("-o", "table", "reconcile")
    assert r.code == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("pruned ")]
    assert len(lines) == 1 and "7 nodes" in lines[0] and "14 transitions" in lines[0], r.stdout
    again = cli("-o", "table", "reconcile")
    assert again.code == 0 and not [x for x in again.stdout.splitlines() if x.startswith("pruned")], again.stdout
    assert cli("-o", "json", "reconcile").json["data"]["pruned"] == {}


def test_a_budget_of_zero_turns_the_prune_in_the_pass_off(cli, tmp_path, region):
    age(region, ended=10, live=0, delivered=0, undelivered=0, finished=0, intended=0)
    f = tmp_path / "c.toml"
    f.write_text("[regions.demo.retention]\npass_budget_seconds = 0\n")
    assert cli("--config", str(f), "-o", "json", "reconcile").code == 0
    c = sqlite3.connect(region)
    assert c.execute("SELECT count(*) FROM nodes WHERE id LIKE 'old-%'").fetchone()[0] == 10
    c.close()


def test_state_check_says_ok_on_a_sound_database(cli, region):
    if not hasattr(Store, "full_check"):
        pytest.skip("Store.full_check is not there yet")
    r = cli("-o", "json", "state", "check")
    assert r.code == 0, r.stderr
    assert r.json["command"] == "state check" and r.json["data"]["ok"] and r.json["data"]["problems"] == []


def test_state_commands_need_an_existing_database(cli, state_db):
    r = cli("-o", "json", "state", "prune", "--dry-run")
    assert r.code == 5 and "no state database" in r.stderr
    assert not state_db.exists()


def test_a_prune_killed_half_way_loses_nothing_and_the_next_one_finishes(cli, region):
    kept = age(region, ended=120_000, live=2_000, delivered=60_000, undelivered=1_000, finished=20_000,
               intended=50)
    start = counts(region)
    proc = subprocess.Popen([str(BIN / "spotctl"), "-o", "json", "state", "prune", "--wait", "0"], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watch = sqlite3.connect(region, timeout=30)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            left = watch.execute("SELECT count(*) FROM nodes WHERE id LIKE 'old-%'").fetchone()[0]
            if left < 120_000:  # it has committed batches, and has more to do
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        watch.close()
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the prune finished before it could be killed: make the history larger"
    mid = counts(region)
    assert mid["nodes"] < start["nodes"], "killed before its first batch"
    c = sqlite3.connect(region)
    assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # no transition without its node: a batch takes a node and its transitions together
    assert c.execute("SELECT count(*) FROM transitions WHERE node_id NOT IN (SELECT id FROM nodes)").fetchone()[0] == 0
    c.close()
    assert must_keep(region) == {**kept, "audit": kept["audit"] + 1, "undelivered": kept["undelivered"] + 1}
    if hasattr(Store, "full_check"):
        assert cli("-o", "json", "state", "check").code == 0
    # the killed prune left its "started" record (written before any delete), and no other
    assert must_keep(region) == {**kept, "audit": kept["audit"] + 1, "undelivered": kept["undelivered"] + 1}
    assert [x["result"] for x in prune_records(cli)] == ["started"]
    r = cli("-o", "json", "state", "prune")
    assert r.code == 0, r.stderr
    assert must_keep(region) == {**kept, "audit": kept["audit"] + 3, "undelivered": kept["undelivered"] + 3}  # queued
    again = cli("-o", "json", "state", "prune", "--dry-run").json["data"]["tables"]
    assert all(t["eligible"] == 0 for t in again), again
    end = counts(region)
    assert end["nodes"] == start["nodes"] - 120_000 and end["actions"] == start["actions"] - 20_000


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_prune_between_batches_with_a_partial_audit_record(cli, region, sig, code):
    kept = age(region, ended=60_000, live=500, delivered=20_000, undelivered=100, finished=10_000, intended=10)
    start = counts(region)
    proc = subprocess.Popen([str(BIN / "spotctl"), "-o", "json", "state", "prune", "--wait", "0"], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = sqlite3.connect(region, timeout=30)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if watch.execute("SELECT count(*) FROM nodes WHERE id LIKE 'old-%'").fetchone()[0] < 60_000:
                break
            time.sleep(0.02)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        watch.close()
    assert proc.returncode == code, err
    env = json.loads(out)
    assert env["status"] == "partial" and env["exit_code"] == code and env["data"]["interrupted"] == sig.name
    assert f"stopped by {sig.name}" in err
    done = env["data"]["deleted_total"]
    assert 0 < done and counts(region)["nodes"] > start["nodes"] - 60_000, "the prune finished before the signal"
    records = prune_records(cli)
    assert [x["result"] for x in records] == ["started", "partial"]
    assert sum(records[1]["inputs"]["deleted"].values()) == done and records[1]["inputs"]["interrupted"] == sig.name
    # what it reported is what it deleted: the batch under way was committed, not rolled back nor lost
    mid = counts(region)
    left = {t["table"]: t["rows"] for t in env["data"]["tables"]}
    assert {t: left[t] for t in ("nodes", "transitions", "actions")} == {
        t: mid[t] for t in ("nodes", "transitions", "actions")}
    c = sqlite3.connect(region)
    assert c.execute("SELECT count(*) FROM transitions WHERE node_id NOT IN (SELECT id FROM nodes)").fetchone()[0] == 0
    c.close()
    assert must_keep(region) == {**kept, "audit": kept["audit"] + 2, "undelivered": kept["undelivered"] + 2}
    assert cli("-o", "json", "audit", "verify", "--local-only").code == 0
