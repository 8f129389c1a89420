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


#: Every command, run as a script would run it, with the status and exit code it must answer on a
#: demo region after its first pass. A new command fails test_every_command_is_covered until it is added here.
EVERY_COMMAND = {
    ("plan",): (["plan"], "ok", 0),
    ("status",): (["status"], "ok", 0),
    ("reconcile",): (["reconcile"], "ok", 0),
    ("launch",): (["launch", "--pool", "gp-az1", "--count", "1", "--dry-run"], "ok", 0),
    ("drain",): (["drain", "no-such-node", "--reason", "x"], "error", 5),
    ("simulate",): (["simulate", "--hours", "1"], "ok", 0),
    ("report",): (["report", "--since", "1h"], "ok", 0),
    ("sim", "status"): (["sim", "status"], "error", 8),  # no `sim serve` running
    ("exercise-reclaim",): (["exercise-reclaim", "--pool", "gp-az1", "--count", "1", "--dry-run"], "error", 6),
    ("exercise-reclaim", "list"): (["exercise-reclaim", "list"], "ok", 0),
    ("exercise-reclaim", "status"): (["exercise-reclaim", "status", "nope"], "error", 5),
    ("exercise-reclaim", "report"): (["exercise-reclaim", "report", "nope"], "error", 5),
    ("exercise-reclaim", "abort"): (["exercise-reclaim", "abort", "nope"], "error", 5),
    ("audit", "list"): (["audit", "list"], "ok", 0),
    ("audit", "show"): (["audit", "show", "999"], "error", 5),
    ("audit", "verify"): (["audit", "verify"], "ok", 0),
    ("contract", "check"): (["contract", "check"], "unknown", 7),  # no hard notice yet: no evidence, not met
    ("config", "show"): (["config", "show"], "ok", 0),
    ("state", "prune"): (["state", "prune", "--dry-run"], "dry-run", 0),
    ("state", "check"): (["state", "check"], "ok", 0),
    ("version",): (["version"], "ok", 0),
    ("doctor",): (["doctor"], "ok", 0),  # the demo region: every check passes (or does not apply here)
    ("whoami",): (["whoami"], "ok", 0),  # the demo region has no [identity]: the OS user
    ("login",): (["login"], "error", 3),  # nothing to log in to without [identity]
    ("logout",): (["logout"], "error", 3),
    ("bundle", "keygen"): (["bundle", "keygen", "--out", "/nonexistent/k.pem"], "error", 3),
    ("bundle", "build"): (["bundle", "build", "--out", "/nonexistent/b"], "error", 2),
    ("bundle", "sign"): (["bundle", "sign", "/nonexistent/b", "--key", "/nonexistent/k"], "error", 2),
    ("bundle", "verify"): (["bundle", "verify", "/nonexistent/b", "--trust", "/nonexistent/k"], "error", 2),
    ("bundle", "publish"): (["bundle", "publish", "/nonexistent/b", "--to", "https://127.0.0.1:9", "--cert", "c",
                             "--key", "k", "--trust-bundle", "t"], "error", 3),
    ("bundle", "fetch"): (["bundle", "fetch", "--from", "https://127.0.0.1:9", "--out", "o", "--trust", "t",
                           "--cert", "c", "--key", "k", "--trust-bundle", "t"], "error", 3),
    ("bundle", "status"): (["bundle", "status"], "ok", 0),
}
#: Commands whose stdout is not one envelope, and where their contract is checked instead.
NOT_AN_ENVELOPE = {
    ("sim", "serve"): "a server: its envelope at SIGTERM is pinned in tests/integration/test_contract_api.py",
    ("audit", "serve"): "a server: the reference audit receiver, tested in tests/integration/test_record.py",
    ("audit", "export"): "a data stream (JSON lines or CSV), tested in tests/unit/test_audit.py",
    ("bundle", "serve"): "a server: run as a user runs it in tests/unit/test_bundle_serve.py",
    ("metrics",): "the Prometheus text format, parsed by prometheus_client in tests/unit/test_metrics.py",
}
#: Every status an envelope may carry; scripts may rely on this list. ("failed" was missing: `audit verify`
#: answers it on a broken chain, `launch`/`drain` when their step failed.)
STATUSES = {"ok", "error", "partial", "pending", "skipped", "dry-run", "mismatch", "unknown", "auth-failed", "met",
            "degraded", "running", "done", "aborted", "failed"}


def test_the_status_enum_is_the_pinned_list_and_a_step_status_is_one_of_them():
    from spotctl.cli.render import ResultStatus
    from spotctl.core.models import OutcomeStatus

    assert {s.value for s in ResultStatus} == STATUSES
    assert {s.value for s in OutcomeStatus} <= STATUSES
    with pytest.raises(ValueError):
        ResultStatus("finished")


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_an_enum_status_is_written_as_its_plain_value(capsys, fmt):
    """StrEnum statuses serialise exactly as the strings did (yaml.safe_dump cannot represent an enum:
    the envelope holds the plain value)."""
    import json

    import yaml

    from spotctl.cli import render
    from spotctl.core.models import OutcomeStatus

    data = {"outcome": {"status": OutcomeStatus.PARTIAL, "detail": "é"}}
    env = render.envelope("drain", data, status=OutcomeStatus.PARTIAL, exit_code=7)
    assert type(env["status"]) is str and env == render.envelope("drain", {"outcome": {"status": "partial",
                                                                                       "detail": "é"}},
                                                                 status="partial", exit_code=7)
    render.emit(fmt, "drain", data, status=OutcomeStatus.PARTIAL, exit_code=7)
    enum_out = capsys.readouterr().out
    render.emit(fmt, "drain", {"outcome": {"status": "partial", "detail": "é"}}, status="partial", exit_code=7)
    assert enum_out == capsys.readouterr().out
    got = json.loads(enum_out) if fmt == "json" else yaml.safe_load(enum_out)
    assert got["status"] == "partial" and got["data"]["outcome"]["status"] == "partial"


def test_every_command_is_covered():
    from spotctl.cli.docgen import commands

    leaves = {path for path, cmd in commands() if not hasattr(cmd, "list_commands") or path == ("exercise-reclaim",)}
    assert leaves == set(EVERY_COMMAND) | set(NOT_AN_ENVELOPE)


@pytest.mark.parametrize("path", sorted(EVERY_COMMAND), ids=lambda p: " ".join(p))
def test_every_command_answers_the_envelope_with_a_pinned_status(cli, path):
    args, status, code = EVERY_COMMAND[path]
    assert cli("-o", "json", "reconcile").code == 0  # the region's first pass: its state database exists
    r = cli("-o", "json", *args)
    env = r.json
    assert set(env) == ENVELOPE and env["spotctl_result_version"] == 1
    assert env["command"] == " ".join(path)
    assert (env["status"], env["exit_code"], r.code) == (status, code, code), r.stderr
    assert env["status"] in STATUSES
    assert (env["data"] is None) == (status == "error") and bool(env["errors"]) == (status == "error")
