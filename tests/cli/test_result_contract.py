"""The JSON envelope is a contract with scripts: its shape is pinned here."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

ENVELOPE = {"spotctl_result_version", "command", "status", "exit_code", "data", "errors"}


@pytest.fixture(autouse=True)
def frozen():
    with freeze_time("2026-03-02 10:00:00", tick=True):
        yield


@pytest.mark.parametrize("args,command", [
    (["version"], "version"), (["plan"], "plan"), (["status"], "status"), (["reconcile", "--dry-run"], "reconcile"),
    (["config", "show"], "config show"),
])
def test_envelope_shape(cli, args, command):
    r = cli("-o", "json", *args)
    env = r.json
    assert set(env) == ENVELOPE
    assert env["spotctl_result_version"] == 1
    assert env["command"] == command
    assert env["exit_code"] == r.code == 0
    assert env["errors"] == []


def test_error_envelope(cli):
    r = cli("-o", "json", "drain", "nope", "--reason", "x")
    env = r.json
    assert set(env) == ENVELOPE
    assert env["status"] == "error" and env["exit_code"] == 5 == r.code and env["data"] is None
    assert set(env["errors"][0]) >= {"code", "message"}


def test_plan_and_status_fields(cli):
    plan = cli("-o", "json", "plan").json["data"]
    assert {"id", "region", "now", "actions", "unplaced", "pools", "demand", "inputs"} <= set(plan)
    for a in plan["actions"]:
        assert {"id", "kind", "pool", "reason", "priority", "inputs"} <= set(a)
        assert ("count" in a) or ("node" in a)
    cli("-o", "json", "reconcile")
    st = cli("-o", "json", "status").json["data"]
    assert {"region", "pools", "nodes", "budget", "last_pass"} <= set(st)
    assert {"name", "kind", "headroom", "price"} <= set(st["pools"][0])
    assert {"id", "pool", "state"} <= set(st["nodes"][0])


def test_yaml_output(cli):
    import yaml

    r = cli("-o", "yaml", "version")
    assert yaml.safe_load(r.stdout)["spotctl_result_version"] == 1
