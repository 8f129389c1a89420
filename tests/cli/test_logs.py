"""Logs (issue 17, item 5): plain or JSON lines on stderr for both entry points, one line per action with its
action id, and the CLI's DEBUG log file per run (0600 in a 0700 directory, the last 10 kept, named when a
command fails). Every command runs as a user runs it: the `spotctl` and `spot-reconciler` executables."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

from spotctl.logsetup import open_run_log, redacted_argv

BIN = Path(sys.executable).parent


def run(*args: str, env: dict | None = None, prog: str = "spotctl") -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / prog), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def logs_dir() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "logs"


def log_files() -> list[Path]:
    return sorted(logs_dir().glob("cmd_*.log")) if logs_dir().is_dir() else []


def finished_actions() -> set[str]:
    db = Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "demo.db"
    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT id FROM actions WHERE status NOT IN ('intended', 'running')")}


def json_lines(text: str) -> list[dict]:
    out = [json.loads(line) for line in text.splitlines() if line.strip()]
    for d in out:
        assert {"ts", "level", "logger", "msg"} <= d.keys(), d
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", d["ts"]), d["ts"]
    return out


def test_cli_json_lines_parse_and_each_action_has_its_line_with_its_id():
    p = run("--log-format", "json", "-v", "reconcile", "-o", "json")
    assert p.returncode == 0, p.stderr
    lines = json_lines(p.stderr)  # every stderr line, progress included, is a JSON object
    assert {d.get("region") for d in lines} == {"demo"} and any(d["logger"] == "spotctl.progress" for d in lines)
    acted = [d for d in lines if "action_id" in d]
    assert acted and all(d["level"] == "info" and d["kind"] and d["result"] and (d.get("pool") or d.get("node"))
                         for d in acted)
    ids = [d["action_id"] for d in acted]
    assert len(ids) == len(set(ids)), "one line per action"
    assert set(ids) == finished_actions(), "every recorded outcome has its line, and no line lacks its record"
    envelope = json.loads(p.stdout)
    assert {o["action"] for o in envelope["data"]["outcomes"]} <= set(ids)


def test_reconciler_json_lines_share_the_formatter_and_carry_action_ids():
    p = run("-v", "--region", "demo", prog="spot-reconciler", env={"SPOTCTL_LOG_FORMAT": "json"})
    assert p.returncode == 0, p.stderr
    lines = json_lines(p.stderr)
    acted = [d for d in lines if "action_id" in d]
    assert acted and {d["region"] for d in lines} == {"demo"}
    assert {d["action_id"] for d in acted} == finished_actions()
    # a first pass again (its own state): the second pass of a region may find nothing to do
    plain = run("-v", "--region", "demo", prog="spot-reconciler",
                env={"XDG_STATE_HOME": str(Path(os.environ["XDG_STATE_HOME"]) / "plain")})
    assert plain.returncode == 0 and re.search(r"^INFO spotctl\.ops\.outcome: action \S+ \w+ .*\[region=demo "
                                               r"action_id=\S+ kind=", plain.stderr, re.M), plain.stderr


def test_a_bad_log_format_is_refused_where_it_enters():
    for args, env in ((["--log-format", "xml"], {}), ([], {"SPOTCTL_LOG_FORMAT": "xml"})):
        p = run(*args, "status", "-o", "json", env=env)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith("spotctl: error: ") and "xml" in p.stderr
        assert json.loads(p.stdout)["exit_code"] == 2
        assert not (Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "demo.db").exists(), "nothing changed"
    p = run("--region", "demo", prog="spot-reconciler", env={"SPOTCTL_LOG_FORMAT": "xml"})
    assert p.returncode == 2 and "SPOTCTL_LOG_FORMAT must be plain or json" in p.stderr


def test_a_failing_command_names_its_log_file_which_holds_the_debug_lines():
    assert run("reconcile", "-o", "json").returncode == 0
    p = run("drain", "nope", "--reason", "x")
    assert p.returncode == 5
    m = re.search(r"^spotctl: error: unknown node 'nope' in region 'demo' \(log: (\S+)\)$", p.stderr, re.M)
    assert m, p.stderr
    path = Path(m.group(1))
    assert path.parent == logs_dir() and path == log_files()[-1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(logs_dir().stat().st_mode) == 0o700
    text = path.read_text()
    assert re.search(r"^\S+Z DEBUG spotctl: spotctl \S+ \(python [\d.]+, pid \d+\): spotctl drain nope --reason x$",
                     text, re.M), text
    assert re.search(r"^\S+Z ERROR spotctl: unknown node 'nope'.*\[region=demo\]$", text, re.M)
    assert "Traceback" in text and "NotFoundError" in text  # the traceback --debug would have shown
    first = log_files()[0].read_text()  # the reconcile's: its DEBUG lines and one line per action
    assert " DEBUG spotctl.ops." in first and " INFO spotctl.ops.outcome: action " in first


def test_rotation_keeps_the_last_ten(tmp_path):
    d = tmp_path / "logs"
    made = []
    for i in range(12):
        path, stream = open_run_log(d, now=1_800_000_000 + i // 3)  # three a second: _01, _02 suffixes
        stream.write(f"run {i}\n")
        stream.close()
        made.append(path)
    kept = sorted(d.glob("cmd_*.log"))
    assert kept == sorted(made[-10:]) and [p.read_text() for p in kept] == [f"run {i}\n" for i in range(2, 12)]
    assert made[1].name == "cmd_2027-01-15_08.00.00_01.log"
    # the CLI keeps 10 too: 10 older logs there, one run later the oldest is gone and the new one is there
    old = logs_dir()
    old.mkdir(parents=True)
    for i in range(10):
        (old / f"cmd_2020-01-01_00.00.{i:02d}.log").write_text("old\n")
    assert run("config", "show", "-o", "json").returncode == 0
    names = [p.name for p in log_files()]
    assert len(names) == 10 and "cmd_2020-01-01_00.00.00.log" not in names and not names[-1].startswith("cmd_2020")


def test_help_version_and_completion_write_no_log_file():
    for args in (["--help"], ["status", "--help"], ["exercise-reclaim", "--help"], ["version"], []):
        run(*args)
    run(env={"_SPOTCTL_COMPLETE": "complete_bash", "COMP_WORDS": "spotctl st", "COMP_CWORD": "1"})
    assert not logs_dir().exists()


def test_a_log_directory_that_cannot_be_written_warns_once_and_the_command_works():
    logs_dir().parent.mkdir(parents=True)
    logs_dir().write_text("a file where the directory belongs\n")
    p = run("status", "-o", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["status"] == "ok"
    assert p.stderr.count("warning") == 1 and "no log file for this run" in p.stderr, p.stderr
    p = run("drain", "nope", "--reason", "x")
    assert p.returncode == 5 and "(log:" not in p.stderr
    p = run("-q", "status", "-o", "json")
    assert p.returncode == 0 and p.stderr == ""  # -q: errors only


def test_no_secret_from_the_command_line_reaches_the_log():
    assert redacted_argv(["sim", "serve", "--token", "s3cret", "--port", "1"]) == ["sim", "serve", "--token", "***",
                                                                                   "--port", "1"]
    assert redacted_argv(["--secret-env=S3", "login", "--key", "k", "--token-file", "f"]) == [
        "--secret-env=***", "login", "--key", "***", "--token-file", "***"]
    p = run("sim", "status", "--url", "http://127.0.0.1:9", "--token", "s3cret-value")  # nobody listens there
    assert p.returncode == 8 and "(log: " in p.stderr
    (log,) = log_files()
    text = log.read_text()
    assert "spotctl sim status --url http://127.0.0.1:9 --token ***" in text and "s3cret-value" not in text


def test_an_outcome_line_is_written_only_once_its_record_is_committed(tmp_path):
    from spotctl.core.budget import Priority
    from spotctl.state.store import Store

    store = Store.open(tmp_path / "r.db", "r")
    said: list[str] = []
    try:
        for aid in ("kept", "undone"):
            store.record_intent(action_id=aid, plan_id=None, kind="drain", priority=Priority.OPERATOR, reason="t",
                                actor="tester", at=1.0, inputs={})
        with store.tx():
            store.finish_action("kept", "done", "ok", 2.0)
            store.after_commit(lambda: said.append("kept"))
            assert said == []  # not before the commit
        try:
            with store.tx():
                store.finish_action("undone", "done", "ok", 2.0)
                store.after_commit(lambda: said.append("undone"))
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        with store.tx():
            pass  # a later commit does not say what was rolled back either
        store.after_commit(lambda: said.append("outside"))  # outside a transaction: at once
        status = dict(store.conn.execute("SELECT id, status FROM actions").fetchall())
    finally:
        store.close()
    assert said == ["kept", "outside"] and status == {"kept": "done", "undone": "intended"}


def test_a_simulation_keeps_its_log_file_small():
    p = run("simulate", "--hours", "2", "-o", "json")  # 120 virtual passes
    assert p.returncode == 0, p.stderr
    (log,) = log_files()
    text = log.read_text()
    assert "this file keeps WARNING records and above" in text
    assert " spotctl.ops." not in text, "no virtual pass's info or debug line"
    assert len(text.splitlines()) < 20


def test_a_command_that_ends_failed_with_its_result_names_its_log_file_too():
    assert run("reconcile", "-o", "json").returncode == 0
    db = Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "demo.db"
    with sqlite3.connect(db) as c:  # the audit chain broken by hand
        c.execute("UPDATE audit SET result='tampered' WHERE seq=(SELECT min(seq) FROM audit)")
    p = run("audit", "verify", "--local-only", "--full", "-o", "json")
    assert p.returncode == 9 and json.loads(p.stdout)["status"] == "failed"
    m = re.search(r"^spotctl: error: audit chain broken at record \S+ \(seq 1\): .* \(log: (\S+)\)$", p.stderr, re.M)
    assert m, p.stderr
    assert re.search(r" ERROR spotctl: audit chain broken at record ", Path(m.group(1)).read_text())
