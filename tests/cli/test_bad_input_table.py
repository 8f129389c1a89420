"""Every bad input, as a table (issue 11): one clear line on stderr, a distinct exit code, the envelope in
``-o json``, and nothing changed — state, outbox and the audit chain have the same rows afterwards and
``audit verify`` still holds.

Config cases name ``FILE:LINE`` and the dotted key; flag cases read like ours (``--count must be >= 1``),
not like the validation library's."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from freezegun import freeze_time

BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def frozen():
    with freeze_time("2026-03-02 10:00:00", tick=True):
        yield


def counts(db: Path) -> dict[str, int]:
    c = sqlite3.connect(db)
    try:
        return {t: c.execute(f"select count(*) from {t}").fetchone()[0]
                for t in ("nodes", "transitions", "outbox", "audit", "actions", "passes")}
    finally:
        c.close()


@pytest.fixture
def region(cli, state_db):
    """The demo region after one pass: something to lose."""
    r = cli("-o", "json", "reconcile")
    assert r.code == 0, r.stderr
    return counts(state_db)


def unchanged(cli, state_db, before):
    assert counts(state_db) == before
    v = cli("-o", "json", "audit", "verify")
    assert v.code == 0 and v.json["data"]["local_ok"], v.stdout


# (what is wrong, the TOML, the line it is on, the dotted key, a phrase of the message)
CONFIG_CASES = [
    ("rate nan", "[regions.demo.budget]\nrate = nan\n", 2, "regions.demo.budget.rate", "finite"),
    ("rate inf", "[regions.demo.budget]\nrate = inf\n", 2, "regions.demo.budget.rate", "finite"),
    ("rate zero", "[regions.demo.budget]\nrate = 0\n", 2, "regions.demo.budget.rate", "> 0"),
    ("burst 2^63-1", "[regions.demo.budget]\nburst = 9223372036854775807\n", 2, "regions.demo.budget.burst", "<="),
    ("spend cap nan", "[regions.demo.policy]\nspend_cap_per_hour = nan\n", 2,
     "regions.demo.policy.spend_cap_per_hour", "finite"),
    ("max launches -1", "[regions.demo.policy]\nmax_launches_per_pass = -1\n", 2,
     "regions.demo.policy.max_launches_per_pass", ">= 0"),
    ("drill pct 500", "[regions.demo.policy]\ndrill_max_pool_pct = 500\n", 2,
     "regions.demo.policy.drill_max_pool_pct", "<= 100"),
    ("advisory negative", "[regions.demo.policy]\nadvisory_drain_seconds = -5\n", 2,
     "regions.demo.policy.advisory_drain_seconds", ">= 0"),
    ("calendar negative", "[regions.demo.policy]\ncalendar_advisory_seconds = -1\n", 2,
     "regions.demo.policy.calendar_advisory_seconds", ">= 0"),
    ("deadline too small", "[regions.demo.policy]\nobserve_deadline_seconds = 0\n", 2,
     "regions.demo.policy.observe_deadline_seconds", ">= 0.5"),
    ("currency", "[regions.demo.policy]\ncurrency = \"euro\"\n", 2, "regions.demo.policy.currency", "ISO 4217"),
    ("boot negative", "[regions.demo.pools.gp-az1]\nboot_seconds = -1\n", 2,
     "regions.demo.pools.gp-az1.boot_seconds", ">= 0"),
    ("cleaning negative", "[regions.demo.pools.gp-az1]\ncleaning_seconds = -1\n", 2,
     "regions.demo.pools.gp-az1.cleaning_seconds", ">= 0"),
    ("price negative", "[regions.demo.pools.gp-az1]\nprice = -1.0\n", 2, "regions.demo.pools.gp-az1.price", ">= 0"),
    ("price nan", "[regions.demo.pools.gp-az1]\nprice = nan\n", 2, "regions.demo.pools.gp-az1.price", "finite"),
    ("price inf", "[regions.demo.pools.gp-az1]\nprice = inf\n", 2, "regions.demo.pools.gp-az1.price", "finite"),
    ("max_nodes -5", "[regions.demo.pools.gp-az1]\nmax_nodes = -5\n", 2, "regions.demo.pools.gp-az1.max_nodes", ">= 0"),
    ("features of a table", "[regions.demo.pools.gp-az1.slurm]\nfeatures = [1, {a = 1}]\n", 2,
     "regions.demo.pools.gp-az1.slurm.features", "list of strings"),
    ("taints not strings", "[regions.demo.pools.gp-az1.kubernetes]\ntaints = [1]\n", 2,
     "regions.demo.pools.gp-az1.kubernetes.taints", "list of strings"),
    ("labels not strings", "[regions.demo.pools.gp-az1.kubernetes]\nlabels = { a = 1 }\n", 2,
     "regions.demo.pools.gp-az1.kubernetes.labels", "strings"),
    ("unknown pool", "[regions.demo.openstack.pools.nope]\nvia = \"nova\"\n", 1,
     "regions.demo.openstack.pools.nope", "does not define"),
    ("kafka servers", "[regions.demo.kafka]\nbootstrap_servers = \"nonsense:::\"\n", 2,
     "regions.demo.kafka.bootstrap_servers", "host:port"),
    ("audit url", "[regions.demo.audit]\nurl = \"not a url\"\n", 2, "regions.demo.audit.url", "URL"),
    ("token newline", "[regions.demo.contract]\nurl = \"http://127.0.0.1:9\"\ntoken = \"ab\\ncd\"\n", 3,
     "regions.demo.contract.token", "newline"),
    ("pool without az", "[regions.demo.pools.extra]\nkind = \"vm\"\nvcpu = 2\nram_mb = 4096\n", 1,
     "regions.demo.pools.extra", "'az'"),
    ("backend", "[regions.demo]\nbackend = \"aws\"\n", 2, "regions.demo.backend", "sim, openstack"),
]


@pytest.mark.parametrize("why,toml,line,key,phrase", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_bad_config_value_is_refused_at_load_naming_file_line_and_key(cli, tmp_path, state_db, region,
                                                                       why, toml, line, key, phrase):
    f = tmp_path / "bad.toml"
    f.write_text(toml)
    r = cli("--config", str(f), "-o", "json", "reconcile")
    assert r.code == 3, (why, r.stderr)
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"spotctl: error: {f}:{line}: '{key}'"), first
    assert phrase in first, first
    assert r.json["status"] == "error" and r.json["errors"][0]["code"] == "config"
    assert "Traceback" not in r.stderr
    unchanged(cli, state_db, region)


def test_a_directory_given_as_the_config_file_is_refused(cli, tmp_path, state_db, region):
    r = cli("--config", str(tmp_path), "-o", "json", "reconcile")
    assert r.code == 3 and "not a regular file" in r.stderr.splitlines()[0]
    unchanged(cli, state_db, region)


# (argv after spotctl, the exit code, a phrase of the first stderr line)
FLAG_CASES = [
    (["launch", "--pool", "gp-az1", "--count", "-1"], 2, "--count must be >= 1, got '-1'"),
    (["launch", "--pool", "gp-az1", "--count", "abc"], 2, "--count must be an integer"),
    (["launch", "--count", "1"], 2, "--pool is required"),
    (["plan", "--nope"], 2, "no such option: --nope"),
    (["nocommand"], 2, "no such command 'nocommand'"),
    (["plan", "--replay", "99999999999999999999999"], 2, "--replay"),
    (["simulate", "--hours", "nan"], 2, "--hours must be a finite number"),
    (["simulate", "--hours", "inf"], 2, "--hours must be a finite number"),
    (["simulate", "--hours", "-3"], 2, "--hours must be > 0"),
    (["simulate", "--interval", "-1"], 2, "--interval must be >= 1"),
    (["audit", "list", "--since", "nan"], 2, "--since: 'nan' is not a time"),
    (["audit", "list", "--since", "inf"], 2, "--since: 'inf' is not a time"),
    (["audit", "list", "--since", "1e999"], 2, "is not a time"),
    (["audit", "list", "--since=-inf"], 2, "is not a time"),
    (["audit", "list", "--limit", "-5"], 2, "--limit must be >= 1"),
    (["exercise-reclaim", "--pool", "gp-az1", "--notice", "99999999", "--yes"], 2, "--notice must be <= 86400"),
    (["exercise-reclaim", "--pool", "gp-az1", "--interval", "-1", "--yes"], 2, "--interval must be > 0"),
    (["exercise-reclaim", "--pool", "gp-az1", "--percent", "nan", "--yes"], 2, "--percent must be a finite"),
    (["sim", "status", "--url", "not a url"], 2, "--url must be an http:// or https:// URL"),
    (["sim", "serve", "--host", "999.1.1.1"], 2, "--host is not an IP address or host name"),
    (["drain", "n" * 100_000, "--reason", "x"], 2, "NODE is not an id"),
    (["drain", "spot-x", "--reason", "r" * 120_000], 2, "--reason is 120000 characters long; at most 1000"),
    (["drain", "spot-nope", "--reason", "-q"], 5, "unknown node 'spot-nope'"),  # -q is the reason, not hoisted
    (["-o", "xml", "plan"], 2, "--output"),
]


@pytest.mark.parametrize("argv,code,phrase", FLAG_CASES, ids=[" ".join(c[0])[:50] for c in FLAG_CASES])
def test_a_bad_flag_gets_one_line_of_ours_and_changes_nothing(cli, state_db, region, argv, code, phrase):
    r = cli(*argv) if argv[0] == "-o" else cli("-o", "json", *argv)
    assert r.code == code, (argv[:4], r.stderr[:500])
    first = r.stderr.splitlines()[0]
    assert first.startswith("spotctl: error: ") and phrase in first, first
    assert len(first) < 1200, "echoed input is cut"
    assert "Traceback" not in r.stderr and "Input should be" not in r.stderr
    if argv[0] != "-o":
        assert r.json["status"] == "error" and r.json["exit_code"] == code
    unchanged(cli, state_db, region)


@pytest.mark.parametrize("var,value,code", [("SPOTCTL_OUTPUT", "JSON", 0), ("SPOTCTL_OUTPUT", "xml", 3),
                                            ("SPOTCTL_LOG_LEVEL", "LOUD", 3), ("SPOTCTL_LOG_LEVEL", "DEBUG", 0)])
def test_environment_values_are_checked_like_flags(cli, state_db, region, var, value, code):
    r = cli("status", env={var: value})
    assert r.code == code, r.stderr
    if code == 0 and var == "SPOTCTL_OUTPUT":
        assert r.json["command"] == "status"  # JSON, as -o JSON gives
    elif code:
        assert r.stderr.startswith(f"spotctl: error: env {var}: ")
    unchanged(cli, state_db, region)


def test_audit_export_never_writes_an_envelope_into_the_csv_stream(cli, region):
    r = cli("-o", "json", "audit", "export", "--format", "csv", "--since", "nan")
    assert r.code == 2 and r.stdout == ""
    assert r.stderr.startswith("spotctl: error: --since")


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
    env.update(SPOTCTL_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path), NO_COLOR="1")
    return env


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path):
    env = _env(tmp_path)
    subprocess.run([str(BIN / "spotctl"), "reconcile"], env=env, capture_output=True, check=True)
    # `true` reads nothing and exits at once: the pipe is closed before spotctl writes
    p = subprocess.run(["bash", "-c", f"'{BIN / 'spotctl'}' -o yaml audit list | true; "
                                      "echo \"${PIPESTATUS[0]}\" >&2"], env=env, capture_output=True, text=True)
    assert p.stderr.strip().splitlines()[-1] == "141", p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr and "Exception ignored" not in p.stderr


def test_output_that_cannot_be_written_is_exit_10_with_a_line(tmp_path):
    env = _env(tmp_path)
    with open("/dev/full", "w") as full:
        p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "status"], env=env, stdout=full,
                           stderr=subprocess.PIPE, text=True)
    assert p.returncode == 10, p.stderr
    assert p.stderr.strip().splitlines() == ["spotctl: error: cannot write to standard output: No space left on device"]
    p = subprocess.run(f"'{BIN / 'spotctl'}' -o json status >&-", shell=True, env=env, stderr=subprocess.PIPE,
                       text=True)
    assert p.returncode == 10 and p.stderr.strip() == "spotctl: error: standard output is closed"


def test_an_unexpected_error_is_one_line_and_exit_1_with_the_traceback_only_under_debug(tmp_path):
    """A bug (here: the state directory is a file, which nothing checks for) — one line, exit 1 or a
    distinct code, never a bare traceback."""
    env = _env(tmp_path)
    (tmp_path / "state").write_text("not a directory")
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "status"], env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("spotctl: error: ")
    p = subprocess.run([str(BIN / "spotctl"), "--debug", "-o", "json", "status"], env=env, capture_output=True,
                       text=True)
    assert p.returncode != 0 and p.stderr.count("spotctl: error: ") == 1


def test_the_reconciler_checks_its_metrics_file_before_the_pass(tmp_path):
    env = _env(tmp_path)
    p = subprocess.run([str(BIN / "spot-reconciler"), "--metrics-file", str(tmp_path / "nope" / "m.prom")], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "state" / "demo.db").exists(), "no pass ran for a metrics file that cannot be written"
    p = subprocess.run([str(BIN / "spot-reconciler"), "watch", "--wait", "nan"], env=env, capture_output=True,
                       text=True)
    assert p.returncode == 2 and "--wait" in p.stderr
