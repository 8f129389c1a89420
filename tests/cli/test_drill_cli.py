"""spotctl exercise-reclaim on the demo region: a scored report, guardrails, confirmation; the README tour's
drill right after `make demo`, its live display and its report (a golden file:
``SPOTCTL_UPDATE_GOLDEN=1 pytest tests/cli/test_drill_cli.py`` rewrites ``golden/drill-report.txt``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from freezegun import freeze_time

from spotctl.core.drill import CHECKS

from .goldens import assert_golden


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
    assert cli("-o", "json", "exercise-reclaim").code == 2  # neither --count nor --percent


# -- the README tour's drill, right after `make demo` (issue 13, items 1 and 2) -----------------------------

ROOT = Path(__file__).resolve().parents[2]
DEMO = (("plan",), ("reconcile",), ("status",))  # what `make demo` runs (Makefile), in this order
# the README tour's drill: one node of the pool with the most nodes (how many the demo's first pass puts in each
# pool depends on the time of day; at this clock gp-rsv-az2 has 20 of them)
TOUR = ("exercise-reclaim", "--count", "1", "--yes")
READY = "2026-03-02 10:01:30Z"  # the demo's first VMs: launched at 10:00:00, 90 s to boot


@pytest.fixture
def width(monkeypatch):
    """A 120-column terminal without colour (tables only; the result is not a terminal)."""
    import sys

    from rich.console import Console

    from spotctl.cli import render

    monkeypatch.setattr(render, "console", lambda stderr=False: Console(
        file=sys.stderr if stderr else sys.stdout, width=120, no_color=True, highlight=False, soft_wrap=False,
        force_terminal=False))


def demo(cli):
    for args in DEMO:
        r = cli("-o", "table", *args)
        assert r.code == 0, (args, r.stderr)


def test_the_demo_and_the_tour_run_these_commands():
    make = (ROOT / "Makefile").read_text()
    demo_target = make[make.index("\ndemo:"):].split("\n\n", 1)[0]
    assert [f"spotctl -o table {' '.join(a)}" in demo_target for a in DEMO] == [True] * len(DEMO)
    assert "spotctl " + " ".join(TOUR) in (ROOT / "README.md").read_text()


def test_the_tour_drill_works_right_after_the_demo_and_its_report_reads(cli, clock, width):
    """The demo's VMs boot for 90 s: the drill waits for them (a pass when they are due), then runs and
    waits for the replacement it launched to become active, so that its time is scored."""
    demo(cli)
    r = cli("-o", "json", *TOUR)
    assert r.code == 0, r.stderr
    assert "drilling pool gp-rsv-az2, the one with the most live nodes (no --pool given)" in r.stderr
    assert f"waiting for pool gp-rsv-az2's nodes to boot: 0 of 1 active, 20 booting; expected active at {READY}" \
        in r.stderr
    assert "spotctl: observed:" not in r.stderr  # off a terminal, the passes' own lines only with -v
    rep = r.json["data"]
    assert rep["status"] == "done" and rep["score"] == 100.0 and (rep["passed"], rep["checks"]) == (5, 5)
    assert rep["started_at"] >= 1772445690  # 10:01:30, once the victims were active
    for v in rep["victims"]:
        assert [c["name"] for c in v["checks"]] == list(CHECKS)
        assert all(c["result"] == "met" and c["observed"] is not None and c["threshold"] is not None
                   for c in v["checks"])
    out = cli("-o", "table", "exercise-reclaim", "report", rep["id"]).stdout
    for v in rep["victims"]:
        assert v["node"] in out  # whole ids, never `spot-gp-rs…`
    assert "…" not in out and "None" not in out
    assert_golden("drill-report", out)
    # a drill of four named nodes next: the work on its victims gets replacement capacity, scored by its time
    r = cli("-o", "json", "exercise-reclaim", "--pool", "gp-rsv-az2", "--count", "4", "--yes")
    assert r.code == 0, r.stderr
    rep = r.json["data"]
    assert rep["status"] == "done" and rep["score"] == 100.0 and (rep["passed"], rep["checks"]) == (20, 20)
    moved = [v for v in rep["victims"] if v["replacements"]]
    assert moved, "a replacement was launched for the work on a victim"
    for v in moved:
        (first,) = v["replacements"]
        assert first["state"] == "active" and v["time_to_replacement_s"] == first["active_after_s"] > 0


def test_without_waiting_the_refusal_says_when_the_nodes_will_be_ready(cli, clock):
    demo(cli)
    r = cli("-o", "json", *TOUR, "--wait-ready", "0")
    assert r.code == 6
    (err,) = r.json["errors"]
    assert err["message"].startswith("pool gp-rsv-az2 has 0 active nodes without a notice; asked for 1; "
                                     f"20 more are booting: enough of them are expected active at {READY} (in 90 s")
    assert "--wait-ready 120" in err["hint"] and f"`spotctl reconcile` after {READY}" in err["hint"]
    # a wait too short for them refuses at once, the same way; nothing waited, nothing reclaimed
    t0 = time.time()
    r = cli("-o", "json", *TOUR, "--wait-ready", "30")
    assert r.code == 6 and f"expected active at {READY}" in r.json["errors"][0]["message"]
    assert time.time() == t0 and cli("-o", "json", "exercise-reclaim", "list").json["data"]["drills"] == []
    # booted, but no pass has seen them yet: said so, and how to fix it
    clock.tick(120)
    r = cli("-o", "json", *TOUR, "--wait-ready", "0")
    assert r.code == 6 and "no reconcile pass has seen them active since" in r.json["errors"][0]["message"]
    assert "spotctl reconcile" in r.json["errors"][0]["hint"]
    # a pool with nothing booting: nothing to wait for, said at once
    r = cli("-o", "json", "exercise-reclaim", "--pool", "gp-az2", "--count", "1", "--yes")
    assert r.code == 6 and "none is booting" in r.json["errors"][0]["message"]


def test_on_a_terminal_the_drill_is_one_live_display_and_the_pass_lines_go_inside_it(monkeypatch):
    """Issue 13, item 2: the pass's progress lines no longer overwrite the drill's status line."""
    import io
    import sys
    from types import SimpleNamespace

    from spotctl.cli.context import AppState
    from spotctl.cli.drill_live import DrillDisplay

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)

    def before(message):
        raise AssertionError("the runtime's own progress hook is not used while the display is open")

    rt = SimpleNamespace(progress=before, lock_wait=None, now=lambda: 1000.0)
    with DrillDisplay(AppState(), rt) as show:
        rt.progress("observed: 43 hosts, 46 pending units, 24 notices")
        show.started({"id": "drill-1", "waves": [["a"], ["b"]]}, 2)
        show.drill({"id": "drill-1", "pool": "gp", "issued": 1, "waves": 2, "abort_reason": None,
                    "victims": {"spot-a": "draining", "spot-b": "active"},
                    "replacements": [{"node": "spot-c", "pool": "gp2", "state": "building", "replaces": "spot-a",
                                      "active_at": None, "expected_active_at": 1090.0}]})
        rt.lock_wait.waiting(1, 30, "pid 7: reconcile pass")
    assert rt.progress is before and rt.lock_wait is None  # handed back
    out = err.getvalue()
    assert "spotctl: observed" not in out and "\r" + "observed" not in out
    for line in ("drill drill-1 started: 2 victim(s) in 2 wave(s)", "spot-a: active → draining",
                 "replacement spot-c launched in pool gp2 for spot-a"):
        assert line in out
    quiet = Tty()
    monkeypatch.setattr(sys, "stderr", quiet)
    with DrillDisplay(AppState(quiet=True), SimpleNamespace(progress=before, lock_wait=None, now=lambda: 0.0)) as q:
        q.event("nothing with -q")
    assert quiet.getvalue() == ""


def test_exercise_reclaim_help_says_the_guardrails_and_gives_examples(cli):
    r = cli("exercise-reclaim", "--help", env={"COLUMNS": "100"})
    assert r.code == 0
    text = " ".join(r.stdout.split())
    for needed in ("policy.drill_max_pool_pct", "120 s", "One drill at a time per region", "abort DRILL",
                   "ends the drill aborted", "--wait-ready", "policy.drill_min_served_pct",
                   "Example: spotctl exercise-reclaim --pool gp-rsv-az2 --count 4 --yes", "--dry-run"):
        assert needed in text, needed
