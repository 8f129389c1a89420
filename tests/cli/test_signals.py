"""SIGTERM is handled like Ctrl-C (issue 11, item 5): one line, exit 143, every cleanup run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def test_sigterm_during_simulate_exits_143_with_a_line_and_leaves_no_temp_dir(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
    env.update(TMPDIR=str(tmp), SPOTCTL_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path), NO_COLOR="1")
    proc = subprocess.Popen([str(BIN / "spotctl"), "simulate", "--hours", "200"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(tmp.glob("spotctl-sim-*")):
        time.sleep(0.05)  # the test waits for the simulation to be under way, not spotctl
    assert list(tmp.glob("spotctl-sim-*")), "the simulation never started"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == "spotctl: terminated", err[-2000:]
    assert "Traceback" not in err
    assert not list(tmp.glob("spotctl-sim-*")), "SIGTERM left the simulation's temp directory behind"
