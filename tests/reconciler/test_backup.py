"""The operator guide's backup of a state database while the timer runs (docs/operator-guide.md, "Back up
the state database"): `sqlite3 STATE.db ".backup FILE"` taken while `spot-reconciler` passes write to the
database (WAL) gives a copy that passes `PRAGMA integrity_check`, opens with spotctl and holds an intact
audit chain. The copy is taken with Debian's `sqlite3` program when it is installed (as the guide says), and
always with Python's `sqlite3.Connection.backup` too: both are SQLite's online backup API."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def env(tmp_path: Path) -> dict:
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
            "SPOTCTL_SYSTEM_CONFIG": str(tmp_path / "none.toml")}


def backup(db: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True)
    cli = shutil.which("sqlite3")
    if cli and dest.parent.name.endswith("cli"):
        subprocess.run([cli, str(db), f".backup {dest}"], check=True, timeout=60, capture_output=True)
        return
    src, dst = sqlite3.connect(db), sqlite3.connect(dest)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def test_a_backup_taken_while_passes_run_is_whole_and_opens(tmp_path):
    e = env(tmp_path)
    first = subprocess.run([str(BIN / "spot-reconciler"), "--region", "demo"], env=e, capture_output=True, timeout=120)
    assert first.returncode == 0, first.stderr
    db = tmp_path / "state" / "spotctl" / "demo.db"
    codes: list[int] = []

    def passes() -> None:
        for _ in range(4):
            p = subprocess.run([str(BIN / "spot-reconciler"), "--region", "demo"], env=e, capture_output=True,
                               timeout=120)
            codes.append(p.returncode)

    t = threading.Thread(target=passes)
    t.start()
    copies = []
    during = 0  # copies begun and ended while the passes ran
    while (t.is_alive() or len(copies) < 2) and len(copies) < 16:
        n = len(copies)
        dest = tmp_path / "copies" / f"{n}-{'cli' if n % 2 == 0 else 'api'}" / "demo.db"
        running = t.is_alive()
        backup(db, dest)
        during += running and t.is_alive()
        copies.append(dest)
        t.join(timeout=0.15)  # the test paces its copies (a pass never waits for them)
    t.join()
    assert codes == [0, 0, 0, 0], "no pass failed or was held up by a backup"
    assert during >= 3, "copies were taken while passes wrote"
    for copy in copies:
        with sqlite3.connect(copy) as c:
            assert c.execute("PRAGMA integrity_check").fetchall() == [("ok",)], copy
            assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    restored = copies[-1].parent
    for args in (["state", "check"], ["audit", "verify", "--local-only"]):
        p = subprocess.run([str(BIN / "spotctl"), "--state-dir", str(restored), *args, "-o", "json"], env=e,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["data"]["ok"] is True
    with sqlite3.connect(copies[-1]) as c:
        assert c.execute("SELECT count(*) FROM passes").fetchone()[0] >= 1
