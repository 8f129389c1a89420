"""The state database as an input (issue 11, items 3, 4 and 8): a damaged, read-only, vanished or foreign
state database is one clear line on stderr, exit 9 (the JSON envelope with -o json), and nothing changed;
only a missing file is a new region, and a new region whose audit service already holds its history says so."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from freezegun import freeze_time

from tests.conftest import AUDIT_TOKEN
from tests.fsutil import read_only

BIN = Path(sys.executable).parent
TOKEN = AUDIT_TOKEN


@pytest.fixture
def with_state(cli, state_db):
    with freeze_time("2026-03-02 10:00:00", tick=True):
        r = cli("-o", "json", "reconcile")
    assert r.code == 0, r.stderr
    assert not Path(f"{state_db}-wal").exists()  # closed cleanly: the file alone is the state
    snap = snapshot(state_db)
    assert not Path(f"{state_db}-shm").exists()
    return snap


def snapshot(db: Path) -> dict:
    """Row counts, read without touching anything (no -wal/-shm: the database is closed when it is taken)."""
    c = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        return {t: c.execute(f"select count(*) from {t}").fetchone()[0]
                for t in ("nodes", "transitions", "outbox", "audit", "actions", "passes", "plans")}
    finally:
        c.close()


def listing(d: Path) -> list[tuple[str, int, bytes]]:
    return sorted((p.name, p.stat().st_size, p.read_bytes() if p.is_file() else b"") for p in d.iterdir())


def one(db: Path, sql: str):
    c = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        return c.execute(sql).fetchone()[0]
    finally:
        c.close()


def edit(db: Path, sql: str, args: tuple = ()) -> None:
    c = sqlite3.connect(db)
    c.execute(sql, args)
    c.commit()
    c.close()


def state_error(r, db: Path, *fragments: str) -> None:
    """Exit 9, one `spotctl: error:` line naming the database (then at most a hint), the JSON envelope."""
    assert r.code == 9, (r.code, r.stderr)
    lines = r.stderr.strip().splitlines()
    errors = [x for x in lines if x.startswith("spotctl: error:")]
    assert len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    first = errors[0]
    assert str(db) in first, first
    for f in fragments:
        assert f in first, (f, first)
    env = r.json
    assert env["status"] == "error" and env["exit_code"] == 9 and env["errors"][0]["code"] == "state"


# -- item 4: an existing empty or cut-short file is corruption; only a missing file is a new region ------

@pytest.mark.parametrize("cut", ["empty", "first-1000-bytes", "first-page-only"])
@pytest.mark.parametrize("command", [("audit", "verify"), ("reconcile",), ("status",)])
def test_an_empty_or_cut_short_state_db_is_exit_9_and_left_untouched(cli, with_state, state_db, cut, command):
    good = state_db.read_bytes()
    state_db.write_bytes({"empty": b"", "first-1000-bytes": good[:1000], "first-page-only": good[:4096]}[cut])
    before = listing(state_db.parent)
    r = cli("-o", "json", *command)
    state_error(r, state_db, "corrupt")
    assert "0 records checked" not in r.stdout + r.stderr
    assert listing(state_db.parent) == before  # same bytes, same size, nothing beside it


def test_a_missing_state_db_is_a_new_region(cli, state_db):
    assert not state_db.exists()
    r = cli("-o", "json", "status")
    assert r.code == 0, r.stderr
    assert snapshot(state_db)["audit"] == 0


# -- item 4: a new region whose audit service already holds records for it --------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _spotctl(*args: str) -> subprocess.CompletedProcess:
    """spotctl as a user runs it (its real stderr, its logging), in this test's isolated environment."""
    return subprocess.run([str(BIN / "spotctl"), *args], capture_output=True, text=True, env=dict(os.environ),
                          timeout=120)


def _audit_config(tmp_path: Path, url: str) -> Path:
    token = tmp_path / "audit.token"
    token.write_text(TOKEN + "\n")
    cfg = tmp_path / "audit.toml"
    cfg.write_text(f'[regions.demo.audit]\nurl = "{url}"\ntoken_file = "{token}"\ntimeout_seconds = 2\n')
    return cfg


def test_a_new_region_whose_audit_service_holds_its_history_says_so(tmp_path, receiver, state_db):
    cfg = _audit_config(tmp_path, receiver.url)
    r = _spotctl("--config", str(cfg), "-o", "json", "reconcile")
    assert r.returncode == 0, r.stderr
    held = receiver.ledger.page("demo", 0, 100000)
    assert held, "the pass relayed its audit records to the service"
    state_db.rename(tmp_path / "lost.db")  # the region's state database goes missing
    r = _spotctl("--config", str(cfg), "-o", "json", "status")
    assert r.returncode == 0, r.stderr
    warning = [x for x in r.stderr.splitlines() if "already holds" in x]
    assert len(warning) == 1, r.stderr
    line = warning[0]
    assert line.startswith("spotctl: ") and "WARNING" in line.upper()
    assert f"already holds {len(held)} records" in line and str(state_db) in line
    assert str(held[-1]["id"]) in line  # the newest record the service holds is named
    assert "restore it from a backup" in line
    again = _spotctl("--config", str(cfg), "-o", "json", "status")  # said once, when the file is created
    assert again.returncode == 0 and "already holds" not in again.stderr


def test_a_new_region_with_an_unreachable_audit_service_says_nothing_extra(tmp_path, state_db):
    cfg = _audit_config(tmp_path, f"http://127.0.0.1:{_free_port()}")
    t0 = time.monotonic()
    r = _spotctl("--config", str(cfg), "-o", "json", "status")
    assert r.returncode == 0, r.stderr
    assert "already holds" not in r.stderr and "audit" not in r.stderr.lower()
    assert time.monotonic() - t0 < 30
    assert state_db.exists()


def test_a_new_region_with_an_empty_audit_service_says_nothing(tmp_path, receiver, state_db):
    cfg = _audit_config(tmp_path, receiver.url)
    r = _spotctl("--config", str(cfg), "-o", "json", "status")
    assert r.returncode == 0, r.stderr
    assert "already holds" not in r.stderr


# -- item 4: the state database deleted in the middle of a drill ------------------------------------------

def test_a_state_db_deleted_in_the_middle_of_a_drill_stops_it_with_exit_9(cli, state_db, monkeypatch):
    with freeze_time("2026-03-02 10:00:00") as clock:
        gone = []

        def sleep(seconds):  # the drill waits between its passes: the file is deleted during the first wait
            if not gone:
                state_db.unlink()
                gone.append(True)
            clock.tick(seconds)

        assert cli("-o", "json", "reconcile").code == 0
        for _ in range(4):
            clock.tick(60)
            cli("-o", "json", "reconcile")
        nodes = cli("-o", "json", "status").json["data"]["nodes"]
        active: dict[str, int] = {}
        for n in nodes:
            if n["state"] == "active":
                active[n["pool"]] = active.get(n["pool"], 0) + 1
        pool = max(active, key=active.get)
        monkeypatch.setattr(time, "sleep", sleep)
        r = cli("-o", "json", "exercise-reclaim", "--pool", pool, "--count", "1", "--yes")
    assert gone, "the drill waited between passes"
    state_error(r, state_db, "was deleted or replaced while spotctl had it open")
    assert '"score": 100' not in r.stdout


# -- item 3: a missing table, an unknown node state ---------------------------------------------------------

def test_a_state_db_missing_a_table_is_exit_9_naming_it(cli, with_state, state_db):
    edit(state_db, "DROP TABLE transitions")
    before = listing(state_db.parent)
    for command in (("status",), ("reconcile",), ("audit", "list")):
        r = cli("-o", "json", *command)
        state_error(r, state_db, "table 'transitions' is missing")
    assert listing(state_db.parent) == before


def test_an_unknown_node_state_is_exit_9_naming_row_and_value(cli, with_state, state_db):
    node = one(state_db, "SELECT id FROM nodes ORDER BY id LIMIT 1")
    edit(state_db, "UPDATE nodes SET state=? WHERE id=?", ("zombie" + "z" * 100_000, node))
    before = listing(state_db.parent)
    for command in (("status",), ("reconcile",), ("plan",)):
        r = cli("-o", "json", *command)
        state_error(r, state_db, f"nodes row {node!r}", "state 'zombiezz")
        assert len(r.stderr) < 2000  # the 100 KB value is not echoed whole
    assert listing(state_db.parent) == before


# -- item 3 / 8: read-only state database and state directory ---------------------------------------------

def test_a_read_only_state_db_is_said_to_be_read_only(cli, with_state, state_db):
    before = listing(state_db.parent)
    with read_only(state_db):
        r = cli("-o", "json", "reconcile")
        state_error(r, state_db, f"state database {state_db} is read-only")
        assert "corrupt" not in r.stderr
        assert cli("-o", "json", "status").code == 0  # reading it is fine
    assert snapshot(state_db) == with_state
    assert [x for x in listing(state_db.parent) if x[0] == state_db.name] == \
        [x for x in before if x[0] == state_db.name]


def test_a_read_only_state_directory_is_said_to_be_read_only_not_corrupt(cli, with_state, state_db):
    d = state_db.parent
    before = listing(d)
    with read_only(d):
        for command in (("status",), ("reconcile",)):
            r = cli("-o", "json", *command)
            state_error(r, state_db, f"state directory {d} is read-only")
            assert "corrupt" not in r.stderr and "restore a backup" not in r.stderr
    assert listing(d) == before


# -- item 3: the lock path is a directory -------------------------------------------------------------------

def test_a_directory_at_the_lock_path_is_exit_9(cli, with_state, state_db):
    lock = Path(f"{state_db}.lock")
    lock.unlink()
    lock.mkdir()
    r = cli("-o", "json", "reconcile")
    state_error(r, state_db, f"lock file {lock} of state database {state_db.name} is a directory")
    assert snapshot(state_db) == with_state


# -- item 3: plan --replay out of range, and a corrupt recorded plan ---------------------------------------

@pytest.mark.parametrize("seq", ["99999999999999999999999", "9223372036854775808", "0", "-1"])
def test_replay_of_an_impossible_sequence_number_is_a_usage_error(cli, with_state, state_db, seq):
    r = cli("-o", "json", "plan", "--replay", seq)
    assert r.code == 2, (r.code, r.stderr)
    assert r.stderr.startswith("spotctl: error: --replay must be a plan sequence number between 1 and "
                               "9223372036854775807")
    assert "Traceback" not in r.stderr and "OverflowError" not in r.stderr
    assert r.json["errors"][0]["code"] == "usage"
    assert snapshot(state_db) == with_state


@pytest.mark.parametrize("mangle", ["not-zlib", "not-json", "not-a-plan-input"])
def test_replay_of_a_corrupt_recorded_plan_is_exit_9_naming_it(cli, with_state, state_db, mangle):
    seq = one(state_db, "SELECT max(seq) FROM plans")
    assert seq is not None
    blob = {"not-zlib": b"\xde\xad\xbe\xef", "not-json": zlib.compress(b'{"pools": {'),
            "not-a-plan-input": zlib.compress(b'{"pools": 3}')}[mangle]
    edit(state_db, "UPDATE plans SET input=? WHERE seq=?", (blob, seq))
    before = snapshot(state_db)
    r = cli("-o", "json", "plan", "--replay", str(seq))
    state_error(r, state_db, f"recorded plan #{seq} is corrupt")
    assert snapshot(state_db) == before
