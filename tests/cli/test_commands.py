"""Every command through the CLI: exit code, stdout JSON and stderr, checked separately."""

from __future__ import annotations

import json

import pytest
from freezegun import freeze_time

T0 = "2026-03-02 10:00:00"


@pytest.fixture(autouse=True)
def frozen():
    with freeze_time(T0, tick=True):
        yield


def test_version(cli):
    r = cli("-o", "json", "version")
    assert r.code == 0 and r.stderr == ""
    assert r.json["data"]["version"]


def test_plan_shows_actions_for_the_demo_region(cli, state_db):
    r = cli("-o", "json", "plan")
    assert r.code == 0, r.stderr
    data = r.json["data"]
    assert data["region"] == "demo"
    assert data["actions"], "a fresh demo region has pending work to place"
    for a in data["actions"]:
        assert a["kind"] in ("launch", "drain", "delete", "cordon", "uncordon")
        assert a["reason"] and "pool" in a
        if a["kind"] == "launch":
            assert a["count"] >= 1
            assert set(a["inputs"]) >= {"rate_card_version", "calendar_id", "budget_tokens"}
    assert len(data["pools"]) >= 6
    # plan changes nothing: no node was recorded
    import sqlite3

    assert sqlite3.connect(state_db).execute("select count(*) from nodes").fetchone()[0] == 0


def test_plan_explain_and_table(cli):
    r = cli("-o", "json", "plan", "--explain")
    assert r.code == 0
    assert isinstance(r.json["data"]["explain"], list) and r.json["data"]["explain"]
    t = cli("-o", "table", "plan", "--explain")
    assert t.code == 0 and "Plan" in t.stdout and "Pools" in t.stdout


def test_reconcile_then_status(cli):
    d = cli("-o", "json", "reconcile", "--dry-run")
    assert d.code == 0 and d.json["status"] == "dry-run"
    assert d.json["data"]["outcomes"] == []
    r = cli("-o", "json", "reconcile")
    assert r.code == 0, r.stderr
    assert r.json["status"] == "ok"
    launched = sum(o.get("launched", 0) for o in r.json["data"]["outcomes"] if o["kind"] == "launch")
    assert launched > 0
    assert "spotctl: " in r.stderr  # progress goes to stderr, never stdout
    s = cli("-o", "json", "status")
    assert s.code == 0
    data = s.json["data"]
    assert len(data["nodes"]) == launched
    assert {"id", "pool", "state"} <= set(data["nodes"][0])
    assert {"name", "kind", "headroom", "price"} <= set(data["pools"][0])
    assert data["budget"]["tokens_used_total"] == launched
    assert data["last_pass"]["status"] == "ok"


def test_launch_and_drain_as_operator(cli):
    r = cli("-o", "json", "launch", "--pool", "gp-az1", "--count", "2")
    assert r.code == 0, r.stderr
    out = r.json["data"]["outcome"]
    assert out["launched"] == 2 and len(out["nodes"]) == 2
    node = out["nodes"][0]
    d = cli("-o", "json", "drain", node, "--reason", "hypervisor maintenance")
    # the node is still building: neither scheduler knows it yet, and the pool is bound to both, so
    # the drain is pending there (exit 7) and says so — never an "ok" that nothing checked
    assert d.code == 7, d.stderr
    outcome = d.json["data"]["outcome"]
    assert outcome["status"] == "pending" and outcome["pending_in"] == ["kubernetes", "slurm"]
    assert "has not registered yet" in d.stderr
    recs = [r for r in cli("-o", "json", "audit", "list").json["data"]["records"] if r["action"] == "node.drain"]
    assert recs and recs[-1]["result"] == "pending"
    s = cli("-o", "json", "status")
    states = {n["id"]: n["state"] for n in s.json["data"]["nodes"]}
    assert states[node] == "draining"
    # draining twice is refused (exit 6), the node is not drained again
    again = cli("-o", "json", "drain", node, "--reason", "again")
    assert again.code == 6 and again.json["errors"][0]["code"] == "refused"


def test_launch_dry_run_changes_nothing(cli):
    r = cli("-o", "json", "launch", "--pool", "gp-az2", "--count", "1", "--dry-run")
    assert r.code == 0
    assert r.json["data"]["outcome"] is None and r.json["data"]["action"]["kind"] == "launch"
    assert cli("-o", "json", "status").json["data"]["nodes"] == []


def test_simulate_reports_a_replayed_day(cli):
    r = cli("-o", "json", "simulate", "--hours", "3", "--seed", "11")
    assert r.code == 0, r.stderr
    rep = r.json["data"]
    assert rep["hours"] == 3
    assert {"cost", "demand", "wait_seconds", "interruptions", "notices", "reconciler"} <= set(rep)
    assert rep["reconciler"]["audit"]["chain_ok"] is True
    again = cli("-o", "json", "simulate", "--hours", "3", "--seed", "11")
    strip = lambda d: {k: v for k, v in d.items() if k != "wall_seconds"}  # noqa: E731
    assert strip(again.json["data"]) == strip(rep), "same seed, same report"


def test_config_show_lists_sources(cli, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('output = "yaml"\n')
    r = cli("--config", str(cfg), "-o", "json", "config", "show")
    assert r.code == 0
    rows = {v["key"]: v for v in r.json["data"]["values"]}
    assert rows["output"]["source"] == "flag"
    assert rows["default_region"]["source"] == "default"
    # without -o, the file's `output = "yaml"` decides the format
    import yaml

    r = cli("--config", str(cfg), "config", "show")
    assert r.code == 0
    rows = {v["key"]: v for v in yaml.safe_load(r.stdout)["data"]["values"]}
    assert rows["output"] == {"key": "output", "value": "yaml", "source": str(cfg), "line": 1}


def test_global_options_may_follow_the_command(cli):
    r = cli("plan", "-o", "json", "--region", "demo", "-q")
    assert r.code == 0 and r.json["command"] == "plan" and r.stderr == ""
    r = cli("drain", "nope", "--reason", "x", "--output=json")
    assert r.code == 5 and r.json["status"] == "error"


def test_plan_history_and_replay_reproduce_an_executed_plan(cli):
    assert cli("-o", "json", "reconcile").code == 0
    hist = cli("-o", "json", "plan", "--history").json["data"]["history"]
    assert len(hist) == 1 and hist[0]["seq"] == 1 and hist[0]["launches"] > 0
    r = cli("-o", "json", "plan", "--replay", "1")
    assert r.code == 0, r.stderr
    d = r.json["data"]
    assert d["reproduced"] is True and d["replayed_plan_id"] == hist[0]["plan_id"] == d["id"]
    assert sum(a.get("count", 0) for a in d["actions"] if a["kind"] == "launch") == hist[0]["launches"]
    missing = cli("-o", "json", "plan", "--replay", "42")
    assert missing.code == 5 and "--history" in missing.stderr


def test_plan_replay_compares_the_action_list_and_can_fail(cli, state_db):
    """The plan id comes from the input digest, so it matches by construction: the replay must
    compare the actions themselves, and say so when it cannot."""
    import sqlite3

    assert cli("-o", "json", "reconcile").code == 0
    db = sqlite3.connect(state_db)
    summary = json.loads(db.execute("SELECT summary FROM plans WHERE seq=1").fetchone()[0])
    assert len(summary["actions_sha256"]) == 64
    db.execute("UPDATE plans SET summary=? WHERE seq=1", (json.dumps({**summary, "actions_sha256": "0" * 64}),))
    db.commit()
    r = cli("-o", "json", "plan", "--replay", "1")
    assert r.code == 1 and r.json["status"] == "mismatch" and r.json["data"]["reproduced"] is False
    assert "differs from the recorded one" in r.stderr
    del summary["actions_sha256"]  # a plan recorded before digests were kept
    db.execute("UPDATE plans SET summary=? WHERE seq=1", (json.dumps(summary),))
    db.commit()
    db.close()
    r = cli("-o", "json", "plan", "--replay", "1")
    assert r.code == 7 and r.json["status"] == "unknown" and r.json["data"]["reproduced"] is None


def test_contract_check(cli):
    r = cli("-o", "json", "contract", "check")
    # a fresh demo region has seen no hard notice: that term has no evidence yet, so not every term is met
    # (exit 7), but nothing shows a broken contract either (no pool degraded, see test_help_completion.py)
    assert r.code == 7, r.stderr
    d = r.json["data"]
    assert d["met"] is False and len(d["pools"]) >= 6
    assert {p["state"] for p in d["pools"].values()} <= {"met", "unknown"}
    assert {t for p in d["pools"].values() for t in p["terms"]} == {
        "notice", "advisory", "rate_card", "reservations", "reclaim_api"}
    one = cli("-o", "json", "contract", "check", "--pool", "gp-az1").json["data"]
    assert list(one["pools"]) == ["gp-az1"]
    bad = cli("-o", "json", "contract", "check", "--pool", "nope")
    assert bad.code == 5


def test_log_level_from_the_environment_is_applied_and_checked(cli, monkeypatch):
    import logging

    from spotctl.cli.context import AppState

    def stderr_level() -> int:  # the level of stderr's handler (the root logger is at DEBUG: the run's log file)
        return next(h for h in logging.getLogger().handlers if getattr(h, "_spotctl", False)).level

    monkeypatch.setenv("SPOTCTL_LOG_LEVEL", "info")
    AppState().config()
    assert stderr_level() == logging.INFO  # the configured level is the one in force
    AppState(quiet=True).config()
    assert stderr_level() == logging.ERROR  # a flag wins over the configuration
    monkeypatch.setenv("SPOTCTL_LOG_LEVEL", "error")
    AppState(verbosity=2).config()
    assert stderr_level() == logging.DEBUG
    logging.getLogger().setLevel(logging.WARNING)
    bad = cli("-o", "json", "plan", env={"SPOTCTL_LOG_LEVEL": "chatty"})
    assert bad.code == 3 and bad.json["errors"][0]["details"]["key"] == "log_level"
    assert "debug, info, warning, error" in bad.stderr
