"""Operator commands wait for the region lock (issue 11, item 6): ``--wait SECONDS`` (default 30, 0 = refuse
at once), then a refusal that names the holder and says how long it waited; the timer never waits."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from spotctl.state.store import Store


@pytest.fixture
def holder(cli, state_db):
    """Another process's hold of the demo region's pass lock (a second open of the lock file)."""
    assert cli("-o", "json", "reconcile").code == 0  # a region with nodes to drain
    s = Store.open(state_db, "demo")
    assert s.try_lock(purpose="reconcile pass, by the test")
    yield s
    s.close()


def test_launch_waits_for_the_lock_and_then_launches(cli, holder):
    threading.Timer(0.5, holder.unlock).start()
    t0 = time.monotonic()
    r = cli("-o", "json", "launch", "--pool", "gp-az1", "--wait", "10")
    assert r.code == 0, r.stderr
    assert 0.4 <= time.monotonic() - t0 < 8
    assert r.json["data"]["outcome"]["launched"] == 1
    assert "waiting up to 10 s for the region lock, held by pid" in r.stderr  # off a terminal: one line


def test_launch_refused_after_its_wait_names_the_holder_and_the_wait(cli, holder):
    t0 = time.monotonic()
    r = cli("-o", "json", "launch", "--pool", "gp-az1", "--wait", "0.5")
    assert 0.5 <= time.monotonic() - t0 < 5
    assert r.code == 6
    err = r.json["errors"][0]
    assert err["code"] == "refused"
    assert f"(pid {os.getpid()}: reconcile pass, by the test, for" in err["message"]
    assert "waited 0.5 s" in err["message"] and "--wait" in err["hint"]
    assert r.stderr.startswith("spotctl: waiting up to 0.5 s")


def test_wait_0_refuses_at_once_and_q_shows_no_wait(cli, holder):
    t0 = time.monotonic()
    r = cli("-q", "-o", "json", "drain", "no-such-node-is-checked-first", "--reason", "x", "--wait", "0")
    assert r.code == 5  # an unknown node is said before any wait
    node = json.loads(cli("-o", "json", "status").stdout)["data"]["nodes"][0]["id"]
    r = cli("-q", "-o", "json", "drain", node, "--reason", "maintenance", "--wait", "0")
    assert r.code == 6 and time.monotonic() - t0 < 5
    assert "holds the region lock" in r.json["errors"][0]["message"]
    assert "waiting" not in r.stderr


def test_reconcile_waits_then_skips(cli, holder):
    r = cli("-o", "json", "reconcile", "--wait", "0.3")
    assert r.code == 0 and r.json["status"] == "skipped"
    assert "waited 0.3 s" in r.json["data"]["message"] and "reconcile pass, by the test" in r.json["data"]["message"]


def test_read_only_commands_do_not_wait_for_the_lock(cli, holder):
    t0 = time.monotonic()
    for args in (("status",), ("plan",), ("launch", "--pool", "gp-az1", "--dry-run")):
        r = cli("-o", "json", *args)
        assert r.code == 0, (args, r.stderr)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "3601", "1e999", "soon"])
def test_a_bad_wait_is_a_usage_error(cli, value):
    for args in (("launch", "--pool", "gp-az1"), ("drain", "n1", "--reason", "x"), ("reconcile",),
                 ("exercise-reclaim", "--pool", "gp-az1", "--count", "1", "--yes")):
        r = cli("-o", "json", *args, "--wait", value)
        assert r.code == 2, (args, value, r.stdout, r.stderr)
        assert "--wait" in r.stderr


def test_on_a_terminal_the_wait_is_a_spinner_line_cleared_when_done(monkeypatch):
    import io
    import sys

    from spotctl.cli.context import AppState
    from spotctl.cli.waiting import LockSpinner

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    spin = LockSpinner(AppState())
    for i in range(3):
        spin.waiting(i * 0.2, 30, "pid 7: reconcile pass")
        time.sleep(0.11)
    spin.done()
    out = err.getvalue()
    assert out.count("waiting for the region lock, held by pid 7: reconcile pass") == 3
    assert "(0/30 s)" in out and out.endswith("\r\x1b[2K")
    quiet = LockSpinner(AppState(quiet=True))
    err.truncate(0)
    err.seek(0)
    quiet.waiting(1, 30, "x")
    quiet.done()
    assert err.getvalue() == ""
