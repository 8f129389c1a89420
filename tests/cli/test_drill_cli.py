"""spotctl exercise-reclaim on the demo region: a scored report, guardrails, confirmation."""

from __future__ import annotations

import time

import pytest
from freezegun import freeze_time


@pytest.fixture
def clock(monkeypatch):
    with freeze_time("2026-03-02 10:00:00") as frozen:
        # the drill waits between passes; let the wait move the (frozen) clock instead of the test's time
        monkeypatch.setattr(time, "sleep", lambda s: frozen.tick(s))
        yield frozen


def up(cli, clock):
    assert cli("-o", "json", "reconcile").code == 0
    for _ in range(4):
        clock.tick(60)
        cli("-o", "json", "reconcile")
    nodes = cli("-o", "json", "status").json["data"]["nodes"]
    pools = {}
    for n in nodes:
        if n["state"] == "active":
            pools[n["pool"]] = pools.get(n["pool"], 0) + 1
    return max(pools, key=pools.get)


def test_drill_prints_a_scored_report(cli, clock):
    pool = up(cli, clock)
    dry = cli("-o", "json", "exercise-reclaim", "--pool", pool, "--count", "1", "--dry-run")
    assert dry.code == 0 and len(dry.json["data"]["victims"]) == 1
    refused = cli("-o", "json", "exercise-reclaim", "--pool", pool, "--count", "1")
    assert refused.code == 6 and "--yes" in refused.stderr  # no TTY, no --yes: nothing reclaimed
    r = cli("-o", "json", "exercise-reclaim", "--pool", pool, "--count", "1", "--yes")
    assert r.code == 0, r.stderr
    rep = r.json["data"]
    assert rep["status"] == "done" and rep["score"] == 100.0 and rep["checks"] == 5
    assert "drill " in r.stderr  # progress on stderr
    again = cli("-o", "json", "exercise-reclaim", "report", rep["id"])
    assert again.json["data"]["score"] == rep["score"]
    st = cli("-o", "json", "exercise-reclaim", "status", rep["id"])
    assert st.json["data"]["status"] == "done"
    assert cli("-o", "json", "exercise-reclaim", "list").json["data"]["drills"][0]["id"] == rep["id"]
    assert cli("-o", "json", "exercise-reclaim", "report", "drill-nope").code == 5


def test_drill_guardrails_from_the_cli(cli, clock):
    pool = up(cli, clock)
    assert cli("-o", "json", "exercise-reclaim", "--pool", pool, "--count", "500", "--yes").code == 6
    assert cli("-o", "json", "exercise-reclaim", "--pool", pool, "--count", "1", "--notice", "30", "--yes").code == 2
    assert cli("-o", "json", "exercise-reclaim", "--pool", "nope", "--count", "1", "--yes").code == 5
    assert cli("-o", "json", "exercise-reclaim").code == 2
