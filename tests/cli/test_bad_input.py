"""Bad input: a clear message on stderr, a distinct exit code, and nothing lost."""

from __future__ import annotations

import sqlite3

import pytest
from freezegun import freeze_time


@pytest.fixture(autouse=True)
def frozen():
    with freeze_time("2026-03-02 10:00:00", tick=True):
        yield


@pytest.fixture
def with_state(cli, state_db):
    r = cli("-o", "json", "reconcile")
    assert r.code == 0, r.stderr
    return snapshot(state_db)


def snapshot(db):
    c = sqlite3.connect(db)
    return {t: c.execute(f"select count(*) from {t}").fetchone()[0] for t in ("nodes", "transitions", "outbox", "audit", "actions")}


def test_malformed_config_exits_3_naming_file_and_line(cli, tmp_path, with_state, state_db):
    bad = tmp_path / "bad.toml"
    bad.write_text('default_region = "demo"\n[regions.demo.policy\n')
    r = cli("--config", str(bad), "-o", "json", "reconcile")
    assert r.code == 3
    assert str(bad) in r.stderr and "line 2" in r.stderr and r.stderr.startswith("spotctl: error:")
    assert r.json["status"] == "error" and r.json["errors"][0]["code"] == "config"
    assert snapshot(state_db) == with_state


def test_unknown_key_exits_3_naming_the_key(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[regions.demo.policy]\nidle_ttl = 5\n')
    r = cli("--config", str(bad), "plan")
    assert r.code == 3
    assert f"{bad}:2" in r.stderr and "regions.demo.policy.idle_ttl" in r.stderr
    assert "idle_ttl_seconds" in r.stderr  # the hint lists what is allowed


def test_unknown_region_and_pool_exit_5(cli, with_state, state_db):
    r = cli("--region", "atlantis", "-o", "json", "status")
    assert r.code == 5 and "atlantis" in r.stderr
    r = cli("-o", "json", "launch", "--pool", "no-such-pool", "--count", "1")
    assert r.code == 5 and "no-such-pool" in r.stderr and "gp-az1" in r.stderr
    assert snapshot(state_db) == with_state


@pytest.mark.parametrize("count", ["-1", "0", "100000"])
def test_negative_zero_or_huge_count_is_a_usage_error(cli, count, with_state, state_db):
    r = cli("-o", "json", "launch", "--pool", "gp-az1", "--count", count)
    assert r.code == 2
    assert "count" in r.stderr.lower()
    assert snapshot(state_db) == with_state


def test_count_beyond_the_pool_is_refused_with_exit_6(cli, with_state, state_db):
    r = cli("-o", "json", "launch", "--pool", "bm-gpu-az2", "--count", "50")
    assert r.code == 6
    assert "bm-gpu-az2" in r.stderr
    assert r.json["errors"][0]["code"] == "refused"
    assert snapshot(state_db) == with_state


def test_drain_of_an_unknown_node_exits_5(cli, with_state, state_db):
    r = cli("-o", "json", "drain", "spot-nope-00000000", "--reason", "test")
    assert r.code == 5 and "spot-nope-00000000" in r.stderr
    assert snapshot(state_db) == with_state


def test_corrupted_state_db_exits_9_and_is_left_as_it_was(cli, with_state, state_db):
    raw = bytearray(state_db.read_bytes())
    # clobber the page header area: SQLite can no longer read it
    raw[0:16] = b"garbage-garbage!"
    state_db.write_bytes(bytes(raw))
    for wal in (state_db.with_name("demo.db-wal"), state_db.with_name("demo.db-shm")):
        if wal.exists():
            wal.unlink()
    before = state_db.read_bytes()
    r = cli("-o", "json", "reconcile")
    assert r.code == 9
    assert str(state_db) in r.stderr and "corrupt" in r.stderr
    assert state_db.read_bytes() == before


def test_debug_shows_traceback_only_when_asked(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("nonsense = 1\n")
    r = cli("--config", str(bad), "plan")
    assert "Traceback" not in r.stderr
    r = cli("--debug", "--config", str(bad), "plan")
    assert "Traceback" in r.stderr and r.code == 3
