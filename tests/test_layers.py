"""Layers hold, and the CLI's start-up path imports no SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ["openstack", "keycloak", "kafka", "requests", "sqlite_utils", "cryptography", "yaml", "sqlite3",
         "spotctl.sim", "spotctl.state", "spotctl.ops"]


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" not in proc.stdout.lower().replace("0 broken", "")


def test_help_imports_no_sdk_and_no_state():
    code = (
        "import sys, json\n"
        "from spotctl.cli.main import app\n"
        "try:\n"
        "    app(['plan', '--help'], prog_name='spotctl')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    assert loaded == [], f"--help imported {loaded}"
    assert "--explain" in proc.stdout
