"""Identity end to end (issue 15) against the Keycloak-compatible peer (scripts/testenv/oidc): `spotctl login`
by the device flow (approved through the peer's test-only endpoint) and by client credentials, `whoami`,
`logout`; roles deciding the verbs, a refusal audited with nothing else changed; refresh before expiry and
the end of a session (freezegun); the reconciler's service account in records and CloudEvents; and no
token or secret in any output, `--debug` included. Every command runs as a user runs it: the `spotctl`
and `spot-reconciler` executables, in their own processes (the refresh tests run in-process under
freezegun).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from .conftest import oidc_peer

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
SECRETS = {"spot-ci": "ci-secret", "spot-reconciler": "reconciler-secret", "other-app": "other-secret"}


@pytest.fixture(scope="module")
def oidc() -> tuple[str, str]:
    return oidc_peer()


@pytest.fixture
def region(oidc, tmp_path):
    """The demo region with [identity] (required), and its events queued (a Kafka relay that is never
    reached: the events stay in the outbox, where the test reads them)."""
    url, realm = oidc
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[regions.demo.identity]\nserver_url = "{url}"\nrealm = "{realm}"\n\n'
                   '[regions.demo.kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    for client, secret in SECRETS.items():
        (tmp_path / f"{client}.secret").write_text(secret + "\n")
    return cfg


def run(region: Path, *args: str, env: dict | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "SPOTCTL_CONFIG": str(region), **(env or {})}
    return subprocess.run([str(BIN / "spotctl"), *args], env=e, capture_output=True, text=True, timeout=120,
                          input=input)


def envelope(p: subprocess.CompletedProcess) -> dict:
    return json.loads(p.stdout)


def login_client(region: Path, client: str) -> subprocess.CompletedProcess:
    return run(region, "login", "--client-credentials", "--client-id", client,
               "--secret-file", str(region.parent / f"{client}.secret"), "-o", "json")


def cache_files() -> list[Path]:
    root = Path(os.environ["XDG_CACHE_HOME"]) / "spotctl" / "identity" / "tokens" / "demo"
    return sorted(root.glob("*.json")) if root.is_dir() else []


def db_counts(tmp_path: Path) -> dict:
    db = Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "demo.db"
    if not db.exists():
        return {}
    with sqlite3.connect(db) as c:
        return {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("nodes", "actions", "transitions", "outbox", "audit", "passes")}


def realm_url(oidc) -> str:
    return f"{oidc[0].rstrip('/')}/realms/{oidc[1]}"


def test_the_device_flow_logs_in_whoami_names_the_user_and_logout_revokes(region, oidc):
    proc, code, lines = _start_login(region)
    assert any(realm_url(oidc) in ln for ln in lines), "the verification URL is printed"
    r = requests.post(f"{realm_url(oidc)}/test-support/device/approve", timeout=10,
                      json={"user_code": code, "username": "alice", "password": "alice-pw"})
    assert r.status_code == 200, r.text
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    data = json.loads(out)["data"]
    assert data["name"] == "alice" and data["client"] == "spotctl" and "spot-admin" in data["roles"]
    [token_file] = cache_files()
    assert token_file.name == "user.json" and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    who = envelope(run(region, "whoami", "-o", "json"))["data"]
    assert who["name"] == "alice" and "spot-admin" in who["realm_roles"] and 0 < who["expires_in_seconds"] <= 300
    assert run(region, "launch", "--pool", "gp-az1", "--count", "1", "-o", "json").returncode == 0
    recs = envelope(run(region, "audit", "list", "--actor", "alice", "-o", "json"))["data"]["records"]
    assert recs and all(r["actor"].startswith("alice [sub=") for r in recs)
    refresh = json.loads(token_file.read_text())["refresh_token"]
    bye = run(region, "logout", "-o", "json")
    assert bye.returncode == 0, bye.stderr
    assert envelope(bye)["data"]["sessions"] == [{"identity": "user", "revoked": True, "error": None}]
    assert cache_files() == []
    again = requests.post(f"{realm_url(oidc)}/protocol/openid-connect/token", timeout=10,
                          data={"grant_type": "refresh_token", "client_id": "spotctl", "refresh_token": refresh})
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant", "revoked at the server"
    after = run(region, "status", "-o", "json")
    assert after.returncode == 4 and "requires a login" in after.stderr


def test_a_missing_role_is_refused_audited_and_changes_nothing(region, tmp_path):
    for args in (["reconcile"], ["launch", "--pool", "gp-az1", "--count", "1"], ["drain", "n-1", "--reason", "x"],
                 ["exercise-reclaim", "--pool", "gp-az1", "--count", "1"], ["state", "prune"], ["status"]):
        p = run(region, *args, "-o", "json")
        assert p.returncode == 4 and envelope(p)["errors"][0]["code"] == "auth", (args, p.stderr)
    assert db_counts(tmp_path) == {}, "nobody logged in: refused before anything, not even a state database"
    assert login_client(region, "spot-ci").returncode == 0  # a viewer
    assert run(region, "status", "-o", "json").returncode == 0
    assert run(region, "plan", "-o", "json").returncode == 0
    before = db_counts(tmp_path)
    for args in (["launch", "--pool", "gp-az1", "--count", "1"], ["reconcile"], ["drain", "n-1", "--reason", "x"],
                 ["exercise-reclaim", "--pool", "gp-az1", "--count", "1"], ["state", "prune"]):
        p = run(region, *args, "-o", "json")
        assert p.returncode == 6, (args, p.stderr)
        err = envelope(p)["errors"][0]
        assert err["code"] == "forbidden" and "service-account-spot-ci may not run" in err["message"]
    after = db_counts(tmp_path)
    assert {k: after[k] - before[k] for k in after} == {"nodes": 0, "actions": 0, "transitions": 0, "passes": 0,
                                                        "outbox": 0, "audit": 5}, "only the refusals recorded"
    recs = envelope(run(region, "audit", "list", "--action", "auth.refused", "-o", "json"))["data"]["records"]
    assert {r["target"] for r in recs} == {"launch", "reconcile", "drain", "exercise-reclaim", "state prune"}
    assert all(r["actor"].startswith("service-account-spot-ci [sub=") and r["result"] == "refused" for r in recs)
    shown = envelope(run(region, "audit", "show", recs[0]["id"], "-o", "json"))["data"]
    assert shown["inputs"]["needs_role"] in (["spot-admin", "spot-operator"], ["spot-admin"])


def test_a_token_for_another_audience_is_refused(region):
    p = login_client(region, "other-app")
    assert p.returncode == 4 and "not meant for this region (aud)" in p.stderr
    assert cache_files() == []


def test_a_wrong_secret_is_refused_without_showing_it(region, tmp_path):
    bad = tmp_path / "bad.secret"
    bad.write_text("not-the-secret\n")
    p = run(region, "login", "--client-credentials", "--client-id", "spot-ci", "--secret-file", str(bad), "-o", "json",
            "--debug")
    assert p.returncode == 4 and "invalid_client" in p.stderr
    assert "not-the-secret" not in p.stdout + p.stderr


def test_the_reconciler_acts_under_its_service_account(region, tmp_path):
    env = {"SPOTCTL_CLIENT_SECRET": SECRETS["spot-reconciler"]}
    p = subprocess.run([str(BIN / "spot-reconciler"), "-r", "demo"], env={**os.environ, "SPOTCTL_CONFIG": str(region),
                       **env}, capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 7), p.stderr
    db = Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "demo.db"
    with sqlite3.connect(db) as c:
        actors = {a for (a,) in c.execute("SELECT DISTINCT actor FROM audit")}
        events = [json.loads(p) for (p,) in c.execute("SELECT payload FROM outbox WHERE kind = 'event'")]
        pass_actor = c.execute("SELECT actor FROM passes ORDER BY seq DESC LIMIT 1").fetchone()
    assert actors and all(a.startswith("service-account-spot-reconciler [sub=") for a in actors), actors
    assert events and all(e["actor"] == "service-account-spot-reconciler" and e["actorclient"] == "spot-reconciler"
                          and e["actorsub"] for e in events)
    assert pass_actor is None or "spot-reconciler" in pass_actor[0]
    # no secret: a clear refusal, exit 3 (config), nothing of the pass run
    p = subprocess.run([str(BIN / "spot-reconciler"), "-r", "demo"], env={**os.environ, "SPOTCTL_CONFIG": str(region),
                       "XDG_CACHE_HOME": str(tmp_path / "empty-cache")}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 3 and "no secret for the service account" in p.stderr


def test_the_systemd_credential_is_read(region, tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "spot-reconciler").write_text(SECRETS["spot-reconciler"])
    p = subprocess.run([str(BIN / "spot-reconciler"), "-r", "demo", "--dry-run"], capture_output=True, text=True,
                       env={**os.environ, "SPOTCTL_CONFIG": str(region), "CREDENTIALS_DIRECTORY": str(creds)},
                       timeout=120)
    assert p.returncode in (0, 7), p.stderr


def test_a_user_token_is_refreshed_before_expiry_and_a_revoked_session_asks_for_login(region, oidc, monkeypatch):
    """In-process under freezegun: 250 s later (within a minute of expiry) the next command refreshes; 250 s
    later again, once
    the session is revoked at the server, the refresh fails and the command exits 4 (never anonymous)."""
    import time
    from datetime import UTC, datetime

    from freezegun import freeze_time
    from typer.testing import CliRunner

    from spotctl.cli.main import app

    monkeypatch.setenv("SPOTCTL_CONFIG", str(region))
    t = _device_login(region, oidc, "bob")
    runner = CliRunner()
    with freeze_time(datetime.fromtimestamp(time.time() + 250, tz=UTC)):
        r = runner.invoke(app, ["whoami", "-o", "json"])
        assert r.exit_code == 0, r.stderr
    after = json.loads(cache_files()[0].read_text())
    assert after["access_token"] != t["access_token"] and after["obtained_at"] > t["obtained_at"], "refreshed"
    requests.post(f"{realm_url(oidc)}/protocol/openid-connect/logout", timeout=10,
                  data={"client_id": "spotctl", "refresh_token": after["refresh_token"]})
    with freeze_time(datetime.fromtimestamp(time.time() + 500, tz=UTC)):  # within a minute of the new expiry
        r = runner.invoke(app, ["status", "-o", "json"])
    assert r.exit_code == 4 and "has ended" in r.stderr
    assert cache_files() == [], "the dead session is forgotten"


def _device_login(region: Path, oidc, user: str) -> dict:
    proc = subprocess.Popen([str(BIN / "spotctl"), "login", "-o", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "SPOTCTL_CONFIG": str(region)})
    assert proc.stderr is not None
    code = None
    for line in proc.stderr:
        if m := re.search(r"enter the code (\S+)", line):
            code = m.group(1)
            break
    requests.post(f"{realm_url(oidc)}/test-support/device/approve", timeout=10,
                  json={"user_code": code, "username": user, "password": f"{user}-pw"}).raise_for_status()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(cache_files()[0].read_text())


def test_no_token_or_secret_in_any_output_debug_included(region, tmp_path):
    outputs = []
    logs = Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "logs"
    seen: set[Path] = set()

    def go(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        p = run(region, *args, "--debug", env=env)
        outputs.append(p.stdout + p.stderr)
        # and each run's DEBUG log file (read after each run: only the last 10 are kept)
        new = sorted(set(logs.glob("cmd_*.log")) - seen) if logs.is_dir() else []
        assert len(new) <= 1, (args, new)
        for f in new:
            seen.add(f)
            outputs.append(f.read_text())
        return p

    assert go("login", "--client-credentials", "--client-id", "spot-ci", "--secret-file",
              str(region.parent / "spot-ci.secret")).returncode == 0
    token = json.loads(cache_files()[0].read_text())["access_token"]
    go("login", "--client-credentials", "--client-id", "spot-reconciler", env={"SPOTCTL_CLIENT_SECRET": "reconciler-secret"})
    for args in (["whoami"], ["status"], ["plan"], ["audit", "list"], ["audit", "verify"], ["config", "show"],
                 ["reconcile"], ["launch", "--pool", "gp-az1", "--count", "1"], ["drain", "nope", "--reason", "x"],
                 ["contract", "check"], ["exercise-reclaim", "list"], ["exercise-reclaim", "--pool", "gp-az1",
                 "--count", "1", "--dry-run"], ["state", "check"], ["state", "prune", "--dry-run"],
                 ["bundle", "status"], ["simulate", "--hours", "1"], ["version"], ["logout"], ["status"]):
        go(*args)
    go("login", "--client-credentials", "--client-id", "spot-ci", "--secret-file", str(tmp_path / "missing"))
    text = "\n".join(outputs)
    assert "Traceback" not in text or token not in text
    assert len(seen) > 10 and " DEBUG " in text  # the log files were read, with their debug lines
    for secret in (token, token.split(".")[1][:24], token.split(".")[2][:24], *SECRETS.values()):
        assert secret not in text, "a token or secret leaked into the output or a log file"


def test_a_reconciler_whose_role_lacks_the_pass_is_refused_and_audited(region):
    region.write_text(region.read_text() + '\n[regions.demo.identity.roles]\nspot-operator = ["status"]\n')
    p = subprocess.run([str(BIN / "spot-reconciler"), "-r", "demo"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SPOTCTL_CONFIG": str(region), "SPOTCTL_CLIENT_SECRET": "reconciler-secret"})
    assert p.returncode == 6 and "may not run `reconcile`" in p.stderr
    db = Path(os.environ["XDG_STATE_HOME"]) / "spotctl" / "demo.db"
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT actor, action, target FROM audit").fetchall()
        passes = c.execute("SELECT count(*) FROM passes").fetchone()[0]
    assert [(a.split(" ")[0], act, t) for a, act, t in rows] == [
        ("service-account-spot-reconciler", "auth.refused", "reconcile")]
    assert passes == 0


def test_a_rotated_realm_key_is_fetched_once_and_accepted(region, oidc):
    assert login_client(region, "spot-ci").returncode == 0
    assert run(region, "status", "-o", "json").returncode == 0
    r = requests.post(f"{realm_url(oidc)}/test-support/rotate-keys", timeout=10)
    assert r.status_code == 200, r.text
    assert login_client(region, "spot-ci").returncode == 0  # a token signed with the new key
    jwks = next((Path(os.environ["XDG_CACHE_HOME"]) / "spotctl" / "identity").glob("jwks-*.json"))
    assert r.json()["kid"] in {k["kid"] for k in json.loads(jwks.read_text())["keys"]}, "refetched on the new kid"
    assert run(region, "status", "-o", "json").returncode == 0


def test_an_optional_identity_lets_nobody_act_as_the_os_user(region, tmp_path):
    region.write_text(region.read_text().replace('realm = "', 'required = false\nrealm = "'))
    p = run(region, "status", "-o", "json")
    assert p.returncode == 0, p.stderr
    ident = envelope(p)["data"]["identity"]
    assert ident["mode"] == "optional" and not ident["logged_in"] and "[sub=" not in ident["actor"]
    assert envelope(run(region, "whoami", "-o", "json"))["data"]["identity"] == "optional, not logged in"
    shown = {r["key"]: r["value"] for r in envelope(run(region, "config", "show", "-o", "json"))["data"]["values"]}
    assert shown["regions.demo.identity.required"] is False


def test_the_relay_authenticates_to_the_audit_service_with_the_identity_token(region, tmp_path):
    """`identity_token = true`: the relay sends the service account's own access token. The reference
    receiver takes one bearer token from a file; it is given the service account's, which it then accepts."""
    import threading

    from spotctl.core.secrets import SecretFile
    from spotctl.services.audit_receiver import make_server

    env = {"SPOTCTL_CLIENT_SECRET": SECRETS["spot-reconciler"]}
    assert run(region, "login", "--client-credentials", "--client-id", "spot-reconciler", env=env).returncode == 0
    token = json.loads(cache_files()[0].read_text())["access_token"]
    (tmp_path / "receiver.token").write_text(token)
    server = make_server(tmp_path / "receiver.db", SecretFile(tmp_path / "receiver.token"), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        region.write_text(region.read_text() + f'\n[regions.demo.audit]\nurl = "{server.url}"\nidentity_token = true\n')
        p = run(region, "reconcile", "-o", "json", env=env)  # the pass's relay delivers its records
        assert p.returncode in (0, 7), p.stderr  # 7: the Kafka relay of the events cannot connect
        stored = server.ledger.page("demo", 0, 1000)
        assert stored and all(r["actor"].startswith("service-account-spot-reconciler") for r in stored)
        status = envelope(run(region, "status", "-o", "json", env=env))["data"]
        assert status["outbox"]["kinds"]["audit"]["pending"] == 0, status["outbox"]
        (tmp_path / "receiver.token").write_text("another-token")  # the relay is refused without the identity's
        run(region, "launch", "--pool", "gp-az1", "--count", "1", "-o", "json", env=env)
        run(region, "reconcile", "-o", "json", env=env)
        assert envelope(run(region, "status", "-o", "json", env=env))["data"]["outbox"]["kinds"]["audit"]["pending"] > 0
    finally:
        server.shutdown()
        server.server_close()
        server.ledger.close()


def _start_login(region: Path, *args: str) -> tuple[subprocess.Popen, str, list[str]]:
    """`spotctl login` started as a user starts it; returns the process, its user code, and stderr so far."""
    proc = subprocess.Popen([str(BIN / "spotctl"), "login", "-o", "json", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "SPOTCTL_CONFIG": str(region)})
    assert proc.stderr is not None
    lines: list[str] = []
    code = None
    for line in proc.stderr:
        lines.append(line)
        if m := re.search(r"enter the code (\S+)", line):
            code = m.group(1)
        if "waiting for the approval" in line:
            break
    assert code, "".join(lines)
    return proc, code, lines


def test_a_pending_code_is_polled_at_the_interval_until_the_user_approves(region, oidc):
    """The user takes a while: each poll before the approval is answered authorization_pending (RFC 8628
    §3.5), and spotctl keeps waiting — no expired_token, no slow_down — then logs in once approved."""
    proc, code, lines = _start_login(region, "--debug")
    assert proc.stderr is not None
    polls = 0
    for line in proc.stderr:  # two polls unanswered: at least one interval of waiting
        lines.append(line)
        if '"POST /realms/' in line and "/openid-connect/token " in line:
            assert '" 400 ' in line, line
            polls += 1
            if polls == 2:
                break
    assert polls == 2 and proc.poll() is None, "".join(lines)
    requests.post(f"{realm_url(oidc)}/test-support/device/approve", timeout=10,
                  json={"user_code": code, "username": "bob", "password": "bob-pw"}).raise_for_status()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + err
    assert json.loads(out)["data"]["name"] == "bob"
    assert "slow_down" not in err and "expired" not in err
    assert [p.name for p in cache_files()] == ["user.json"]


def test_ctrl_c_while_waiting_for_the_approval_stops_at_once_and_caches_nothing(region, oidc):
    import signal

    proc, code, _ = _start_login(region)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    env = json.loads(out)
    assert env["status"] == "error" and env["errors"][0]["code"] == "interrupted"
    assert cache_files() == []
    late = requests.post(f"{realm_url(oidc)}/test-support/device/approve", timeout=10,
                         json={"user_code": code, "username": "bob", "password": "bob-pw"})
    assert late.status_code == 200, "the code was still open: approving it later logs nobody in here"
    assert cache_files() == []
