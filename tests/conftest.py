"""Shared fixtures: an isolated environment per test (no user config, state in tmp_path)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Never read the developer's config or write their state."""
    for var in list(os.environ):
        if var.startswith("SPOTCTL_") or var in ("NO_COLOR",):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("SPOTCTL_SYSTEM_CONFIG", str(tmp_path / "etc-spotctl.toml"))
    yield
