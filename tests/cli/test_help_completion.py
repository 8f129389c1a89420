"""Help, shell completion and verbosity: every sub-command's help names the global options that work after it
and writes its arguments as ``NODE``; ``--pool`` and ``drain NODE`` complete pool names and node ids from the
config and the state database (called directly, and through the ``_SPOTCTL_COMPLETE`` protocol the generated
completions/ scripts use); ``-v`` and ``-vv`` add info and debug lines on stderr.

``SPOTCTL_UPDATE_GOLDEN=1 pytest tests/cli/test_help_completion.py`` rewrites ``golden/contract-check.txt``."""

from __future__ import annotations

import os

import pytest
import typer
from freezegun import freeze_time
from typer.testing import CliRunner

from spotctl.cli.main import GLOBAL_EPILOG, app
from spotctl.cli.options import complete_node, complete_pool

from .goldens import assert_golden

DEMO_POOLS = ["bm-cpu-az1", "bm-gpu-az2", "gp-az1", "gp-az2", "gp-rsv-az2", "mem-az1"]
ENV = {"COLUMNS": "120", "NO_COLOR": "1"}


@pytest.fixture(autouse=True)
def frozen():
    with freeze_time("2026-03-02 10:00:00"):
        yield


def every_command() -> list[tuple[str, ...]]:
    """Every sub-command and sub-group, as the words that name it."""
    root = typer.main.get_command(app)
    out = []

    def walk(group, path):
        ctx = typer.Context(group, info_name="spotctl")
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            out.append((*path, name))
            if hasattr(cmd, "list_commands"):
                walk(cmd, (*path, name))

    walk(root, ())
    return out


def words(text: str) -> str:
    return " ".join(text.split())


def test_every_sub_command_help_names_the_global_options_and_writes_arguments_in_capitals(cli):
    paths = every_command()
    assert ("drain",) in paths and ("contract", "check") in paths and ("exercise-reclaim", "status") in paths
    for path in paths:
        r = cli(*path, "--help")
        assert r.code == 0, (path, r.stderr)
        assert words(GLOBAL_EPILOG) in words(r.stdout), path
        usage = next(line for line in r.stdout.splitlines() if line.startswith("Usage:"))
        assert "{" not in usage and "}" not in usage, usage
    assert " drain [OPTIONS] NODE\n" in cli("drain", "--help").stdout
    assert " exercise-reclaim status [OPTIONS] DRILL_ID\n" in cli("exercise-reclaim", "status", "--help").stdout
    top = words(cli("--help").stdout)
    assert GLOBAL_EPILOG not in top  # the root lists the global options themselves
    assert "-v adds info records" in top and "-vv or --debug adds debug records" in top and "-q leaves errors only" in top


def test_a_missing_argument_is_named_as_the_usage_line_writes_it(cli):
    r = cli("drain", "--reason", "x")
    assert r.code == 2 and "NODE is required" in r.stderr


def root_ctx(*args: str) -> typer.Context:
    """The context the shell completion gives a completion function: the command line parsed so far."""
    root = typer.main.get_command(app)
    ctx = root.make_context("spotctl", list(args), resilient_parsing=True)
    return ctx


def test_pool_names_complete_from_the_config():
    assert [v for v, _ in complete_pool(root_ctx(), "")] == DEMO_POOLS
    assert [v for v, _ in complete_pool(root_ctx(), "gp-")] == ["gp-az1", "gp-az2", "gp-rsv-az2"]
    help_ = dict(complete_pool(root_ctx(), "gp-az1"))["gp-az1"]
    assert help_ == "vm, headroom, 8 vCPU/32 GiB, az az1"


def test_the_region_and_config_given_on_the_line_decide(tmp_path, capsys):
    cfg = tmp_path / "lab.toml"
    cfg.write_text('[regions.lab]\nbackend = "sim"\n[regions.lab.pools.small]\nkind = "vm"\naz = "az1"\n'
                   'vcpu = 4\nram_mb = 8192\nslurm = { partition = "spot" }\n')
    assert [v for v, _ in complete_pool(root_ctx("--config", str(cfg), "-r", "lab"), "")] == ["small"]
    assert [v for v, _ in complete_pool(root_ctx("--config", str(cfg)), "")] == DEMO_POOLS  # default: demo
    assert complete_pool(root_ctx("-r", "nowhere"), "") == []  # an unknown region: nothing, and no error
    cfg.write_text("[regions.lab\n")  # not TOML
    assert complete_pool(root_ctx("--config", str(cfg), "-r", "lab"), "") == []
    assert complete_pool(root_ctx("--config", str(tmp_path / "missing.toml")), "") == []
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # a completion never prints


def test_node_ids_complete_from_the_state_database_read_only(cli, state_db, capsys):
    assert complete_node(root_ctx(), "") == [] and not state_db.exists()  # no database yet: nothing created
    r = cli("-o", "json", "reconcile")
    assert r.code in (0, 7), r.stderr
    from spotctl.core.lifecycle import drainable
    from spotctl.state.store import Store

    store = Store.open(state_db, "demo")
    try:
        want = sorted((n.id, f"{n.state} in {n.pool}") for n in store.nodes() if drainable(n.state))
    finally:
        store.close()
    assert want, "the demo region has live nodes after a pass"
    assert complete_node(root_ctx(), "") == want
    prefix = want[0][0][:12]
    assert complete_node(root_ctx(), prefix) == [w for w in want if w[0].startswith(prefix)]
    before = sorted(os.listdir(state_db.parent))
    assert complete_node(root_ctx("--state-dir", str(state_db.parent / "elsewhere")), "") == []
    assert sorted(os.listdir(state_db.parent)) == before  # nothing created, not even the other directory
    other = state_db.parent / "other"
    other.mkdir()
    (other / "demo.db").write_bytes(b"not a database at all, " * 100)
    assert complete_node(root_ctx("--state-dir", str(other)), "") == []  # a damaged file: nothing, no error
    assert (other / "demo.db").read_bytes() == b"not a database at all, " * 100 and os.listdir(other) == ["demo.db"]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # a completion never prints


def complete(env: dict[str, str]) -> list[str]:
    """Run the app as the shell's completion script does (see completions/spotctl.bash and _spotctl)."""
    r = CliRunner().invoke(app, [], env=env, prog_name="spotctl", catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return [line for line in r.stdout.splitlines() if line]


def bash(line: str) -> list[str]:
    words_ = line.split(" ")
    return complete({"_SPOTCTL_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(len(words_) - 1)})


def test_completion_through_the_shell_protocol(cli):
    assert bash("spotctl launch --pool ") == DEMO_POOLS
    assert bash("spotctl launch --count 2 --pool gp-") == ["gp-az1", "gp-az2", "gp-rsv-az2"]
    assert bash("spotctl contract check --pool mem") == ["mem-az1"]
    assert bash("spotctl -r nowhere launch --pool ") == []
    zsh = complete({"_SPOTCTL_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "spotctl launch --pool gp-rsv"})
    assert "gp-rsv-az2" in "\n".join(zsh) and "reserved-idle" in "\n".join(zsh)
    assert bash("spotctl drain ") == []  # no state database yet
    assert cli("-o", "json", "reconcile").code in (0, 7)
    nodes = bash("spotctl drain ")
    assert nodes and all(n.startswith("spot-") for n in nodes)
    assert bash("spotctl drain -r demo spot-gp") == [n for n in nodes if n.startswith("spot-gp")]


def info_lines(stderr: str, level: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"spotctl: {level}: ")]


def test_plan_v_adds_info_lines_and_vv_debug_lines(cli):
    quiet = cli("-o", "json", "plan")
    assert quiet.code == 0, quiet.stderr
    assert info_lines(quiet.stderr, "info") == [] and info_lines(quiet.stderr, "debug") == []
    v = cli("-o", "json", "plan", "-v")
    assert v.code == 0 and v.json["data"]["actions"] == quiet.json["data"]["actions"]  # stdout: the same data
    info = "\n".join(info_lines(v.stderr, "info"))
    for what in ("source cloud: 43 hosts", "source notices:", "source scheduler:kubernetes:", "source rate_card:",
                 "observe: 6 sources in", "plan input:", "no-notice pools:"):
        assert what in info, (what, v.stderr)
    assert info_lines(v.stderr, "debug") == []
    vv = cli("-o", "json", "-vv", "plan")
    debug = "\n".join(info_lines(vv.stderr, "debug"))
    assert "pool gp-az1: 8 hosts, room for" in debug
    assert cli("-o", "json", "-q", "plan").stderr == ""


def test_reconcile_v_says_each_phase_and_its_time_and_vv_each_action(cli):
    r = cli("-o", "json", "reconcile", "-vv")
    assert r.code in (0, 7), r.stderr
    info = "\n".join(info_lines(r.stderr, "info"))
    for phase in ("region lock taken after", "pass: observe in", "pass: contract and node records in",
                  "pass: plan in", "pass: act (", "pass: relay in", "ended ok in"):
        assert phase in info, (phase, r.stderr)
    assert "actions" in info and "planned in" in info
    assert len(info_lines(r.stderr, "debug")) >= len(r.json["data"]["plan"]["actions"]) > 0
    assert any(line.startswith("spotctl: debug: action ") for line in r.stderr.splitlines()), r.stderr
    assert info_lines(cli("-o", "json", "reconcile").stderr, "info") == []


def test_contract_check_says_no_evidence_yet_for_a_pool_without_hard_notices(cli):
    r = cli("-o", "json", "contract", "check")
    d = r.json["data"]
    unproven = [n for n, p in d["pools"].items() if p["terms"]["notice"]["state"] == "unknown"]
    assert unproven, "a fresh demo region has pools that have had no hard notice yet"
    for name in unproven:
        p = d["pools"][name]
        term = p["terms"]["notice"]
        assert term["evidence"]["hard_notices"] == 0
        assert term["evidence"]["error"].startswith("no evidence yet")
        assert "notice" in p["failing"] and p["state"] in ("unknown", "degraded")
    # not met, but no evidence of a broken contract either: no pool is put under the no-notice policy for it
    assert not [n for n, p in d["pools"].items() if p["state"] == "degraded"]
    assert d["met"] is False and r.code == 7 and r.json["status"] == "unknown"
    table = cli("-o", "table", "contract", "check", env=ENV)
    assert table.code == 7
    assert "notice unknown in" in table.stdout and "no evidence yet" in table.stdout
    assert "{" not in table.stdout and "None" not in table.stdout
    assert_golden("contract-check", table.stdout)


def test_contract_check_says_why_in_words_never_a_repr():
    from spotctl.cli.contract import _why

    late = {"state": "degraded", "evidence": {"late": 1, "last_late": {"id": "ntc-9", "why": ["lead 60s < 120s"]},
                                              "on_time_since": 1, "restore_rule": {"on_time_in_a_row": 3,
                                                                                   "hold_seconds": 3600}}}
    assert _why("notice", late) == ("late hard notice ntc-9 (lead 60s < 120s); 1 on time since: 3 in a row and "
                                    "60m without a late one restore it")
    assert _why("advisory", {"state": "degraded", "evidence": {"advisories": 0, "hard_without_advisory": 3}}) == \
        "3 hard notice(s) came without an advisory (more than half)"
    stale = {"state": "degraded", "evidence": {"version": "rc-1", "age_s": 660.0, "price": 0.5,
                                               "valid_until": 1_772_445_600.0}}
    assert _why("rate_card", stale) == ("rate card rc-1 is 11m old (refreshed every 5 min), valid until "
                                        "2026-03-02 10:00:00Z")
    assert _why("rate_card", {"state": "missing", "evidence": {"error": "rate_card: HTTP 503"}}) == "rate_card: HTTP 503"
