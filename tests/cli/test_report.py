"""`spotctl report` on a simulation's kept state: its figures equal simulate's own report for the same
seed where both count the same thing (spend and node-hours per pool, nodes launched/deleted/live, notices
by kind), the JSON envelope, the document written to a file, and bad input refused with one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent / "spotctl"
HOURS, SEED = 6, 11


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
    env.update(XDG_STATE_HOME=str(root / "state"), XDG_CONFIG_HOME=str(root / "config"), NO_COLOR="1",
               COLUMNS="200", HOME=str(root))
    return env


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-sim")
    p = subprocess.run([str(BIN), "-o", "json", "simulate", "--hours", str(HOURS), "--seed", str(SEED),
                        "--keep-state", str(root)], capture_output=True, text=True, env=_env(root), timeout=300)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    return root, data, Path(data["state_db"])


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, env=_env(root), timeout=120)


def _md_rows(md: str, section: str) -> list[list[str]]:
    """The body rows of the markdown table under ``## section``."""
    part = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def test_markdown_numbers_equal_simulates_report(sim):
    root, rep, db = sim
    p = run(root, "report", "--since", f"{HOURS}h", "--state-db", str(db), "--format", "markdown")
    assert p.returncode == 0, p.stderr
    md = p.stdout
    assert md.startswith("# Spot capacity report — Region demo")
    spend = re.search(r"^\| spend \(EUR\) \| ([\d,.]+) \| ([\d,.]+) node-hours", md, re.M)
    assert spend, md[:800]
    assert _num(spend.group(1)) == round(rep["cost"]["total"], 2)
    assert _num(spend.group(2)) == round(rep["cost"]["node_hours_total"], 1)
    pools = {r[0]: r for r in _md_rows(md, "Spend and savings per pool")}
    assert set(pools) == set(rep["cost"]["by_pool"])
    for pool, cost in rep["cost"]["by_pool"].items():
        assert _num(pools[pool][2]) == round(cost, 2), pool
        assert _num(pools[pool][1]) == round(rep["node_hours"][pool], 2), pool
    (launched, deleted, lost, _failed, live), = _md_rows(md, "Nodes")
    ins = rep["instances"]
    assert (int(launched), int(deleted), int(live)) == (ins["launched"], ins["deleted"], ins["live"])
    assert int(lost) == ins["vanished"]
    (hard, advisory, calendar, *_), = _md_rows(md, "Notices by kind")
    no = rep["notices"]
    assert (int(hard), int(advisory), int(calendar)) == (no["hard"], no["advisory"], no["calendar"])
    # the window is the simulated one (its last pass), said so since it lies in the past
    assert "The window ends at the last recorded pass" in md


def test_json_envelope_and_window(sim):
    root, rep, db = sim
    p = run(root, "-o", "json", "report", "--since", f"{HOURS}h", "--state-db", str(db))
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)
    assert env["command"] == "report" and env["status"] == "ok" and env["exit_code"] == 0
    d = env["data"]
    assert d["start"] == rep["start"] and d["end"] == rep["end"]
    assert d["cost"]["spend"] == pytest.approx(rep["cost"]["total"], abs=1e-3)
    assert 0 < d["cost"]["savings_pct"] < 100  # the demo pools carry on-demand prices above the rate card
    assert d["demand"]["seen"] >= d["demand"]["left_queue"] > 0 and d["demand"]["wait_s"]["samples"] > 0
    assert len(d["series"]["t"]) == len(d["series"]["spend"]) and sum(d["series"]["spend"]) == pytest.approx(
        d["cost"]["spend"], abs=0.01)
    # a window that ends before anything happened has nothing in it
    early = run(root, "-o", "json", "report", "--since", "1h", "--until", str(rep["start"]), "--state-db", str(db))
    assert early.returncode == 0, early.stderr
    e = json.loads(early.stdout)["data"]
    assert e["cost"]["spend"] == 0 and e["nodes"]["launched"] == 0 and e["passes"]["count"] == 0


def test_document_written_to_a_file(sim, tmp_path):
    root, _, db = sim
    out = tmp_path / "r.md"
    p = run(root, "-o", "json", "report", "--since", f"{HOURS}h", "--state-db", str(db), "--format", "markdown",
            "--output", str(out))
    assert p.returncode == 0, p.stderr
    written = json.loads(p.stdout)["data"]["written"]
    assert written == {"path": str(out), "bytes": out.stat().st_size, "format": "markdown"}
    assert out.read_text().startswith("# Spot capacity report")


@pytest.mark.parametrize("args, words", [
    (["--since", "soon"], "--since: cannot read"),
    (["--since", "1h", "--until", "yesterday"], "cannot read"),
    (["--since", "90d"], "longer than 35 days"),
    (["--format", "pdf"], "pdf"),
    (["--output", "/nonexistent-dir/r.md", "--format", "markdown"], "--output: cannot write"),
])
def test_bad_input_one_line_and_nothing_written(sim, args, words):
    root, _, db = sim
    before = db.stat().st_mtime_ns
    p = run(root, "-o", "json", "report", "--state-db", str(db), *args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert words in p.stderr and p.stderr.count("spotctl: error:") == 1
    if p.stdout:
        assert json.loads(p.stdout)["exit_code"] == 2
    assert db.stat().st_mtime_ns == before


def test_missing_state_database_is_not_found(tmp_path):
    p = run(tmp_path, "report", "--state-db", str(tmp_path / "none.db"))
    assert p.returncode == 5 and "no state database" in p.stderr
    assert not (tmp_path / "none.db").exists()
