"""spot-reconciler as the systemd timer runs it: one pass, shared exit codes, metrics."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "spot-reconciler"


def run(tmp_path, *args, env_extra=None):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "SPOTCTL_SYSTEM_CONFIG": str(tmp_path / "none.toml"), **(env_extra or {})}
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, env=env, timeout=120)


def test_one_pass_with_summary_and_metrics(tmp_path):
    metrics = tmp_path / "spotctl.prom"
    p = run(tmp_path, "--region", "demo", "--metrics-file", str(metrics), "--log-format", "json", "-v")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["status"] == "ok" and summary["region"] == "demo"
    assert summary["outcomes"]["ok"] > 0 and summary["tokens_used"] > 0
    for line in p.stderr.strip().splitlines():
        assert json.loads(line)["level"] in ("info", "warning", "debug")  # journald-friendly JSON logs
    text = metrics.read_text()
    assert 'spotctl_last_pass_ok{region="demo"} 1.0' in text and "spotctl_budget_tokens_left" in text
    # the second pass on the same state acts on what the first left: no duplicate launches
    p2 = run(tmp_path, "--region", "demo")
    assert p2.returncode in (0, 7), p2.stderr
    db = tmp_path / "state" / "spotctl" / "demo.db"
    import sqlite3

    c = sqlite3.connect(db)
    assert c.execute("select count(*) from passes where status != 'running'").fetchone()[0] == 2
    nodes = c.execute("select count(*) from nodes").fetchone()[0]
    assert nodes > 0
    assert c.execute("select count(distinct action_id) from nodes").fetchone()[0] == nodes  # one node per launch
    launched = [json.loads(r[0])["action_id"] for r in
                c.execute("select inputs from audit where action='node.launch' and result='ok'")]
    assert launched and len(launched) == len(set(launched))  # no instance created twice for one launch


def test_overlapping_pass_is_skipped_with_exit_0(tmp_path):
    assert run(tmp_path, "--region", "demo").returncode == 0
    lock = tmp_path / "state" / "spotctl" / "demo.db.lock"
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        p = run(tmp_path, "--region", "demo")
    finally:
        os.close(fd)
    assert p.returncode == 0
    assert json.loads(p.stdout)["status"] == "skipped"


def test_bad_config_and_unknown_region_exit_codes(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[regions.demo]\nbackend = 5\n")
    p = run(tmp_path, "--config", str(bad))
    assert p.returncode == 3 and str(bad) in p.stderr
    p = run(tmp_path, "--region", "atlantis")
    assert p.returncode == 5 and "atlantis" in p.stderr
