"""Shared fixtures: an isolated environment per test (no user config, state in tmp_path).

The variables that steer the test harness itself survive the isolation: `SPOTCTL_REQUIRE_SERVICES`
(read once, here, at collection time: under `make test` a test service that is down fails its tests)
and the test-environment overrides (`SPOTCTL_TESTENV_*`, the service port overrides), which the
`scripts/testenv/*` scripts need to find the services the suite started.
"""

from __future__ import annotations

import os

import freezegun
import pytest

# freeze_time patches every loaded module, reading each attribute; `kubernetes.client` (loaded by the
# Kubernetes adapter's kubeconfig loader) imports its hundreds of models lazily on attribute access, and
# its pydantic models cannot be built while datetime is faked: leave the kubernetes client alone.
freezegun.configure(extend_ignore_list=["kubernetes"])

#: Read once when pytest loads this file, before any test strips the environment.
REQUIRE_SERVICES = os.environ.get("SPOTCTL_REQUIRE_SERVICES") == "1"

#: Harness variables, not spotctl settings: never stripped from a test's environment.
HARNESS_VARS = ("SPOTCTL_REQUIRE_SERVICES", "SPOTCTL_KAFKA_PORT", "SPOTCTL_K8S_PORT", "SPOTCTL_OIDC_PORT",
                "SPOTCTL_UPDATE_GOLDEN")  # tests/cli/goldens.py: rewrite the golden files
HARNESS_PREFIXES = ("SPOTCTL_TESTENV_",)


def is_harness_var(name: str) -> bool:
    return name in HARNESS_VARS or name.startswith(HARNESS_PREFIXES)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Never read the developer's config or write their state."""
    for var in list(os.environ):
        if (var.startswith("SPOTCTL_") and not is_harness_var(var)) or var in ("NO_COLOR",):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # the identity cache (tokens, JWKS)
    monkeypatch.setenv("SPOTCTL_SYSTEM_CONFIG", str(tmp_path / "etc-spotctl.toml"))
    yield


#: The bearer token of the reference audit receiver the ``receiver`` fixture runs.
AUDIT_TOKEN = "t0ken-for-tests"


@pytest.fixture
def receiver(tmp_path):
    """The real reference audit receiver (spotctl.services.audit_receiver) on a free loopback port."""
    import threading

    from spotctl.services.audit_receiver import make_server

    server = make_server(tmp_path / "receiver.db", AUDIT_TOKEN, port=0)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server
    server.shutdown()
    server.server_close()
    server.ledger.close()
