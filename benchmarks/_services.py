"""Shared by the benchmarks against the test services: their exports, and a percentile."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def env_of(name: str) -> dict:
    """`scripts/testenv/NAME env` as a dict (fails when the service is not up)."""
    out = subprocess.run([str(ROOT / "scripts" / "testenv" / name), "env"], capture_output=True, text=True, check=True)
    return {k.removeprefix("export "): v for k, v in (ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)}


def pct(values, q):
    """The project's one percentile definition (nearest rank, :func:`spotctl.core.stats.percentile`)."""
    from spotctl.core.stats import percentile

    return percentile(values, q)
