"""The pure side of ``spotctl doctor`` (``spotctl.core.doctor``): what observations make a pass, a failure and
which exit code; and ``systemctl show`` read as it prints (a stand-in ``systemctl`` on PATH, run for real)."""

from __future__ import annotations

import os
import stat

import pytest

from spotctl.core.doctor import FAIL, INFO, PASS, SKIPPED, Kind, Result, Seen, exit_code, judge
from spotctl.core.errors import ExitCode


def failed(code: int) -> Result:
    return Result("x", "t", FAIL, "d", "h", code)


@pytest.mark.parametrize("codes, want", [
    ([], 0),
    ([8], 8),
    ([8, 4], 4),  # a refused credential wins over an unreachable backend
    ([9, 8], 8),
    ([3, 9], 9),
    ([7, 3], 3),
    ([7], 7),
])
def test_the_exit_code_follows_the_documented_precedence(codes, want):
    results = [Result("ok", "t", PASS, "seen")] + [failed(c) for c in codes]
    assert exit_code(results) == want


def test_info_and_skipped_are_not_failures():
    assert exit_code([Result("a", "t", INFO, "n/a"), Result("b", "t", SKIPPED, "not checked")]) == 0


def test_a_call_that_answered_without_evidence_is_not_a_pass():
    assert judge(Seen("x.y", "t", detail="")).result == FAIL
    assert judge(Seen("x.y", "t", detail="GET / answered 200")).result == PASS


def test_a_raised_error_fails_with_its_exit_code_and_the_hint_of_its_check():
    r = judge(Seen("slurm.auth", "http://ctl:6820 as spot", error_code="auth", error_exit=int(ExitCode.AUTH),
                   detail="refused", context={"user": "spot", "source": "token_file (/etc/t)"}))
    assert (r.result, r.exit_code) == (FAIL, 4)
    assert "scontrol token username=spot" in r.hint and "token_file (/etc/t)" in r.hint
    r = judge(Seen("openstack.nova", "compute API (Nova)", error_code="unavailable", error_exit=8, detail="down"))
    assert r.exit_code == 8 and "nova-api" in r.hint
    # an error no hint covers keeps the adapter's own
    r = judge(Seen("kafka.metadata", "k:9092", error_code="not_found", error_exit=5, error_hint="its own", detail="x"))
    assert r.hint == "its own"


def state(**facts):
    base = {"path": "/s/east.db", "exists": True, "modes": {"east.db": 0o600}, "schema_version": 6,
            "code_schema_version": 6, "problems": [], "size": 4096, "check": "quick_check"}
    return judge(Seen("state.db", "/s/east.db", kind=Kind.STATE_DB, detail="read", facts={**base, **facts}))


def test_the_state_database_judge():
    assert state().result == PASS
    r = state(modes={"east.db": 0o600, "east.db-wal": 0o644})
    assert r.result == FAIL and "east.db-wal is world-readable" in r.detail and r.exit_code == 9
    r = state(schema_version=5, problems=["page 7: btree broken"])
    assert "schema version 5" in r.detail and "page 7" in r.detail
    assert "migrates it" in r.hint and "restore it from a backup" in r.hint
    assert state(exists=False).result == INFO


def test_the_token_cache_must_be_owner_only():
    def cache(mode, exists=True):
        return judge(Seen("identity.token_cache", "/c", kind=Kind.PRIVATE_DIR, detail="read",
                          facts={"path": "/c", "exists": exists, "mode": mode}))

    assert cache(0o700).result == PASS
    assert cache(0o750).result == FAIL and cache(0o750).hint.startswith("chmod 700 /c")
    assert cache(0, exists=False).result == INFO


def systemd(units, roles=None, running=True):
    return judge(Seen("systemd.units", "units", kind=Kind.SYSTEMD, detail="read",
                      facts={"systemd": running, "units": units, "roles": roles or {}}))


def unit(load="loaded", file="enabled", active="active", result="success"):
    return {"LoadState": load, "UnitFileState": file, "ActiveState": active, "Result": result}


def test_the_systemd_judge():
    roles = {"spot-reconciler@e.timer": "required", "spot-reconciler@e.service": "pass",
             "spot-bundle-server@e.service": "optional"}
    ok = {"spot-reconciler@e.timer": unit(), "spot-reconciler@e.service": unit(file="static", active="inactive"),
          "spot-bundle-server@e.service": unit(load="not-found", file="", active="inactive")}
    assert systemd(ok, roles).result == PASS
    assert systemd({}, roles, running=False).result == INFO
    none = {k: unit(load="not-found", file="", active="inactive") for k in roles}
    assert systemd(none, roles).result == INFO  # nothing installed: an operator's workstation
    r = systemd({**ok, "spot-reconciler@e.timer": unit(file="disabled", active="inactive")}, roles)
    assert r.result == FAIL and "systemctl enable --now spot-reconciler@e.timer" in r.hint
    r = systemd({**ok, "spot-reconciler@e.service": unit(file="static", active="failed", result="exit-code")}, roles)
    assert r.result == FAIL and "journalctl -u spot-reconciler@e.service" in r.hint


def test_an_access_review_denied_fails_with_exit_4_and_names_the_verb():
    r = judge(Seen("kubernetes.rbac", "patch nodes", kind=Kind.ACCESS, detail="SelfSubjectAccessReview patch nodes",
                   facts={"allowed": False, "reason": "no RBAC policy matched", "verb": "patch", "resource": "nodes"}))
    assert (r.result, r.exit_code) == (FAIL, 4)
    assert "no RBAC policy matched" in r.detail and "`patch` on nodes" in r.hint


SHOW = """LoadState=loaded
UnitFileState=enabled
ActiveState=active
SubState=waiting
Result=success

LoadState=not-found
UnitFileState=
ActiveState=inactive
SubState=dead
Result=success
"""


def test_systemctl_show_is_read_per_unit(tmp_path, monkeypatch):
    from spotctl.adapters.doctor import systemd_facts

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    (tmp_path / "show.out").write_text(SHOW)
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat {tmp_path}/show.out\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    root = tmp_path / "run-systemd"
    root.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    facts = systemd_facts(["a.timer", "b.service"], root=str(root))
    assert facts["systemd"] is True
    assert facts["units"]["a.timer"]["UnitFileState"] == "enabled"
    assert facts["units"]["b.service"]["LoadState"] == "not-found"
    assert (tmp_path / "args").read_text().split()[-2:] == ["a.timer", "b.service"]
    assert systemd_facts(["a.timer"], root=str(tmp_path / "absent"))["systemd"] is False
