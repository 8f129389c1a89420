"""``spotctl doctor`` on the demo region and on broken state databases: every check passes on a healthy demo
(the simulated parts read through their ports), and a state database that is world-readable, of another
schema version or corrupt fails its check with the hint, exit 9, and is left exactly as it was."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat

import pytest

from spotctl.core.doctor import K8S_ACCESS, SYSTEMD_UNITS
from spotctl.state.schema import SCHEMA_VERSION


@pytest.fixture
def demo(cli, state_db):
    r = cli("-o", "json", "reconcile")
    assert r.code == 0, r.stderr
    return state_db


def checks(r) -> dict[str, dict]:
    return {c["check"]: c for c in r.json["data"]["checks"]}


def fingerprint(path) -> tuple:
    """The file's bytes, mode and the side files beside it: what "changed nothing" compares."""
    side = sorted(p.name for p in path.parent.iterdir())
    return hashlib.sha256(path.read_bytes()).hexdigest(), stat.S_IMODE(os.stat(path).st_mode), side


def test_every_check_of_the_demo_region_passes_through_its_ports(cli, demo):
    r = cli("-o", "json", "doctor")
    assert r.code == 0, r.stderr
    env = r.json
    assert (env["command"], env["status"], env["exit_code"], env["errors"]) == ("doctor", "ok", 0, [])
    c = checks(r)
    assert set(c) == {"state.db", "sim.cloud", "sim.contract", "sim.kubernetes", "sim.slurm", "systemd.units"}
    for name in ("state.db", "sim.cloud", "sim.contract", "sim.kubernetes", "sim.slurm"):
        assert c[name]["result"] == "pass", c[name]
    # each pass names what it observed
    assert f"schema version {SCHEMA_VERSION}" in c["state.db"]["detail"] and "quick_check ok" in c["state.db"]["detail"]
    assert "hosts in 6 of 6 pools" in c["sim.cloud"]["detail"]
    assert "6 pool price(s) in EUR" in c["sim.contract"]["detail"]
    assert "work unit(s) waiting" in c["sim.slurm"]["detail"]
    # no systemd in the test machine's container: said, not a failure; on a systemd host it is checked
    if not os.path.isdir("/run/systemd/system"):
        assert c["systemd.units"]["result"] == "info"
        assert "systemd does not run on this host" in c["systemd.units"]["detail"]
    data = env["data"]
    assert data["ok"] is True and data["counts"]["fail"] == 0 and data["region"] == "demo"


def test_the_table_names_each_check_and_its_result(cli, demo):
    r = cli("-o", "table", "doctor", env={"COLUMNS": "200"})
    assert r.code == 0, r.stderr
    assert "Doctor of region demo (sim)" in r.stdout
    for name in ("state.db", "sim.cloud", "sim.contract", "sim.kubernetes", "sim.slurm", "systemd.units"):
        assert name in r.stdout


def test_a_demo_region_before_its_first_pass_says_the_database_is_not_there_yet(cli, state_db):
    r = cli("-o", "json", "doctor")
    assert r.code == 0, r.stderr
    c = checks(r)["state.db"]
    assert c["result"] == "info" and "no state database" in c["detail"]
    assert not state_db.exists()  # doctor creates nothing


def test_new_state_databases_are_owner_only(demo):
    assert stat.S_IMODE(os.stat(demo).st_mode) == 0o600


@pytest.mark.parametrize("mode, said", [(0o644, "world-readable"), (0o602, "world-writable"),
                                        (0o666, "world-readable and world-writable")])
def test_a_state_database_others_may_read_or_write_fails_with_the_chmod_hint(cli, demo, mode, said):
    os.chmod(demo, mode)
    before = fingerprint(demo)
    r = cli("-o", "json", "doctor")
    assert r.code == 9, r.stderr
    c = checks(r)["state.db"]
    assert c["result"] == "fail" and c["exit_code"] == 9
    assert said in c["detail"] and f"{mode:04o}" in c["detail"]
    assert c["hint"].startswith(f"chmod 600 {demo}")
    assert r.json["status"] == "failed" and r.json["errors"][0]["code"] == "check_failed"
    assert "spotctl: error: doctor: 1 check(s) failed: state.db" in r.stderr
    assert fingerprint(demo) == before
    # the other checks still ran and passed
    assert checks(r)["sim.cloud"]["result"] == "pass"


def test_an_older_schema_version_is_reported_not_migrated(cli, demo):
    c = sqlite3.connect(demo)
    c.execute(f"PRAGMA user_version={SCHEMA_VERSION - 1}")
    c.close()
    before = fingerprint(demo)
    r = cli("-o", "json", "doctor")
    assert r.code == 9, r.stderr
    chk = checks(r)["state.db"]
    assert chk["result"] == "fail"
    assert f"schema version {SCHEMA_VERSION - 1}, this spotctl's is {SCHEMA_VERSION}" in chk["detail"]
    assert "migrates it" in chk["hint"] and ".backup" in chk["hint"]
    assert fingerprint(demo) == before
    with sqlite3.connect(demo) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION - 1


def test_a_newer_schema_version_asks_for_an_upgrade(cli, demo):
    c = sqlite3.connect(demo)
    c.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    c.close()
    r = cli("-o", "json", "doctor")
    assert r.code == 9
    chk = checks(r)["state.db"]
    assert f"schema version {SCHEMA_VERSION + 1}" in chk["detail"] and "upgrade spotctl" in chk["hint"]


def test_a_corrupt_state_database_fails_with_the_restore_hint(cli, demo):
    data = bytearray(demo.read_bytes())
    page = 4096
    assert len(data) > 8 * page
    for off in range(3 * page, 6 * page):  # wreck some b-tree pages in the middle, keep the header
        data[off] = 0x5A
    demo.write_bytes(bytes(data))
    before = fingerprint(demo)
    r = cli("-o", "json", "doctor")
    assert r.code == 9, r.stderr
    chk = checks(r)["state.db"]
    assert chk["result"] == "fail" and "quick_check found" in chk["detail"]
    assert "restore it from a backup" in chk["hint"]
    assert fingerprint(demo) == before


def test_a_file_that_is_not_a_database_fails(cli, demo):
    demo.write_bytes(b"this is not sqlite at all, " * 400)
    r = cli("-o", "json", "doctor")
    assert r.code == 9
    chk = checks(r)["state.db"]
    assert chk["result"] == "fail" and "not a database" in chk["detail"]


def test_doctor_runs_without_the_region_lock(cli, demo):
    from spotctl.state.store import Store

    store = Store.open(demo, "demo", create=False)
    try:
        assert store.try_lock(0, purpose="a pass that takes long")
        r = cli("-o", "json", "doctor")
        assert r.code == 0, r.stderr  # no wait, no refusal: doctor takes no lock
    finally:
        store.unlock()
        store.close()


def test_the_token_cache_is_checked_with_identity(cli, demo, tmp_path):
    """A region with [identity] whose Keycloak cannot be reached: discovery fails as unavailable (exit 8),
    the JWKS is skipped, and a token cache others may enter fails with its chmod hint."""
    cache = tmp_path / "xdg-cache" / "spotctl" / "identity"
    cache.mkdir(parents=True)
    os.chmod(cache, 0o755)
    cfg = tmp_path / "xdg-config" / "spotctl" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text('[regions.demo.identity]\nserver_url = "http://127.0.0.1:9/"\nrealm = "spot"\n'
                   'timeout_seconds = 2\n')
    r = cli("-o", "json", "doctor")
    assert r.code == 8, r.stderr
    c = checks(r)
    assert c["identity.token_cache"]["result"] == "fail" and "0755" in c["identity.token_cache"]["detail"]
    assert c["identity.token_cache"]["hint"].startswith(f"chmod 700 {cache}")
    assert c["oidc.discovery"]["result"] == "fail" and c["oidc.discovery"]["exit_code"] == 8
    assert "server_url" in c["oidc.discovery"]["hint"]
    assert c["oidc.jwks"]["result"] == "skipped" and "oidc.discovery did not pass" in c["oidc.jwks"]["detail"]
    assert "oidc.service_token" not in c  # no client secret configured: not asked
    os.chmod(cache, 0o700)
    r = cli("-o", "json", "doctor")
    assert checks(r)["identity.token_cache"]["result"] == "pass"


def test_an_unreachable_configured_backend_exits_8_and_a_bad_table_is_a_failed_check(cli, demo, tmp_path):
    cfg = tmp_path / "xdg-config" / "spotctl" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    token = tmp_path / "audit.token"
    token.write_text("t0ken\n")
    cfg.write_text(f'[regions.demo.audit]\nurl = "http://127.0.0.1:9"\ntoken_file = "{token}"\ntimeout_seconds = 2\n'
                   '\n[regions.demo.contract]\nurl = "http://127.0.0.1:9"\ntimeout_seconds = 2\n')
    r = cli("-o", "json", "doctor")
    assert r.code == 8, r.stderr
    c = checks(r)
    assert c["audit.service"]["result"] == "fail" and "queued in the outbox" in c["audit.service"]["hint"]
    assert c["contract.rate_card"]["result"] == "fail" and "no-notice" in c["contract.rate_card"]["hint"]
    assert "sim.contract" not in c  # the configured feed replaces the simulated one
    assert c["sim.cloud"]["result"] == "pass"


def test_the_unit_list_is_the_units_in_contrib_systemd():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "contrib" / "systemd"
    files = {p.name for p in root.iterdir() if p.suffix in (".service", ".timer")}
    assert {u.replace("{region}", "") for u, _ in SYSTEMD_UNITS} == files


def test_the_rbac_checks_are_the_verbs_the_rbac_manifest_grants():
    """docs/wire-your-region.md's manifest is tested against the adapter's requests; doctor asks for the same."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "wire-your-region.md").read_text()
    granted = set()
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "ClusterRole":
                for rule in doc.get("rules", []):
                    for res in rule.get("resources", []):
                        for verb in rule.get("verbs", []):
                            granted.add((verb, res))
    assert granted, "no ClusterRole found in the guide"
    asked = {(verb, f"{res}/{sub}" if sub else res) for verb, res, sub, _ in K8S_ACCESS}
    assert asked <= granted, asked - granted
