"""Integration tests run against real services started by scripts/testenv/<name> (see `make test`).

`testenv("slurm")` runs `scripts/testenv/slurm env` and returns its exports as a dict.
When the service is not up: under `make test` (SPOTCTL_REQUIRE_SERVICES=1) the test
fails — a suite that silently skips its real services proves nothing; run by hand
without the services, it is skipped with the command that starts them.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_SERVICES

ROOT = Path(__file__).resolve().parents[2]


def testenv(name: str) -> dict[str, str]:
    script = ROOT / "scripts" / "testenv" / name
    proc = subprocess.run([str(script), "env"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        unavailable(name, proc.stderr.strip() or proc.stdout.strip())
    env: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export "):]
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = shlex.split(v)[0] if v else ""
    return env


def unavailable(name: str, why: str) -> None:
    msg = f"test service {name!r} is not up ({why}); start it with `scripts/testenv/{name} up`"
    if REQUIRE_SERVICES:
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def wait_until(pred, what: str = "condition", timeout: float = 20.0):
    """Poll ``pred`` every 0.2 s until it returns something truthy (returned), or fail after ``timeout``.
    For tests watching a real service converge; never used inside spotctl itself."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


#: The OIDC test peer (scripts/testenv/oidc), read when pytest loads this file: the autouse isolated_env
#: fixture strips SPOTCTL_* variables from each test's environment.
_OIDC = (os.environ.get("SPOTCTL_OIDC_URL"), os.environ.get("SPOTCTL_OIDC_REALM", "spot"))


def oidc_peer() -> tuple[str, str]:
    """The Keycloak-compatible peer's base URL and realm: SPOTCTL_OIDC_URL, else `scripts/testenv/oidc env`;
    skips (fails under SPOTCTL_REQUIRE_SERVICES=1) when it is down."""
    import requests

    url, name = _OIDC
    if not url:
        env = testenv("oidc")
        url, name = env.get("SPOTCTL_OIDC_URL"), env.get("SPOTCTL_OIDC_REALM", "spot")
    if not url:
        unavailable("oidc", "SPOTCTL_OIDC_URL is not set")
    try:
        requests.get(f"{url.rstrip('/')}/realms/{name}/.well-known/openid-configuration", timeout=5).raise_for_status()
    except requests.RequestException as e:
        unavailable("oidc", str(e))
    return url, name
