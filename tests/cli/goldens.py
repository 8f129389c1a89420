"""Golden files for table output: ``assert_golden("status", text)`` compares ``text`` with
``tests/cli/golden/status.txt``. ``SPOTCTL_UPDATE_GOLDEN=1 pytest tests/cli`` writes the files instead;
a person reads the diff before it is committed."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    if os.environ.get("SPOTCTL_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}; write it with SPOTCTL_UPDATE_GOLDEN=1"
    want = path.read_text(encoding="utf-8")
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "output"))
        raise AssertionError(f"table output differs from {path.name} (SPOTCTL_UPDATE_GOLDEN=1 rewrites it):\n{diff}")
