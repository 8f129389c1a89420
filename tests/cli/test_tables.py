"""The tables of `status` and `plan --explain` on the demo region: golden files at a fixed clock and a
120-column terminal, and the rules every table keeps (no Python repr in a cell, units in the headers,
why a node is advised, and one exit-code rule for a contract feed that is down).

The clock is frozen at T0, where the demo region's first pass puts some of its gp-rsv-az2 nodes on a
host that a reservation created a minute later takes 76 minutes on: the next pass advises (cordons) them.
``SPOTCTL_UPDATE_GOLDEN=1 pytest tests/cli/test_tables.py`` rewrites the golden files.
"""

from __future__ import annotations

import re
import sys

import pytest
from freezegun import freeze_time

from spotctl.core.errors import UnavailableError

from .goldens import assert_golden

T0 = "2026-03-03 18:00:00"
BOOT = 120  # the demo's VMs boot in 90 s: active by then


@pytest.fixture
def clock(monkeypatch):
    """A frozen clock, a 120-column terminal without colour and a fixed actor (not user@this-host)."""
    from rich.console import Console

    from spotctl.cli import render
    from spotctl.ops import runtime

    monkeypatch.setattr(runtime, "os_actor", lambda: "sre@control-1")
    monkeypatch.setattr(render, "console", lambda stderr=False: Console(
        file=sys.stderr if stderr else sys.stdout, width=120, no_color=True, highlight=False, soft_wrap=False,
        force_terminal=False))
    with freeze_time(T0) as frozen:
        yield frozen


def first_pass(cli, clock):
    """The demo region's first pass, then the time its VMs take to boot."""
    assert cli("-o", "json", "reconcile").code == 0
    clock.tick(BOOT)


def two_passes(cli, clock):
    first_pass(cli, clock)
    assert cli("-o", "json", "reconcile").code == 0


def table(cli, *args, code=0):
    r = cli("-o", "table", *args)
    assert r.code == code, r.stderr
    return r.stdout


def cells(text):
    """Every cell of every table row in ``text``."""
    return [c.strip() for line in text.splitlines() if line.startswith("│") for c in line.strip("│").split("│")]


def test_plan_explain_golden(cli, clock):
    first_pass(cli, clock)
    out = table(cli, "plan", "--explain")
    assert_golden("plan-explain", out)


def test_status_golden(cli, clock):
    two_passes(cli, clock)
    out = table(cli, "status")
    assert_golden("status", out)


def test_status_counts_nodes_and_lists_them_only_with_nodes(cli, clock):
    two_passes(cli, clock)
    ids = [n["id"] for n in cli("-o", "json", "status").json["data"]["nodes"]]
    assert len(ids) == 34
    summary = table(cli, "status")
    assert not any(i in summary for i in ids)
    # (the reservation on gp-rsv-az2-hv01 is 76 minutes away: its nodes take work until an hour before)
    assert "nodes: 34 live (active 22, building 12); `spotctl status --nodes` lists them" in summary
    listed = table(cli, "status", "--nodes")
    rows = [line for line in listed.splitlines() if line.startswith("│ spot-")]
    assert sorted(r.split("│")[1].strip() for r in rows) == sorted(ids)  # one row each, ids never cut
    # --all lists the nodes that are gone too
    assert table(cli, "status", "--all").count("│ spot-") >= len(ids)


def test_no_table_cell_holds_a_python_repr(cli, clock):
    outs = [table(cli, "plan", "--explain"), table(cli, "status")]
    two_passes(cli, clock)
    outs += [table(cli, "status", "--nodes"), table(cli, "plan", "--explain"), table(cli, "plan", "--history")]
    for out in outs:
        bad = [c for c in cells(out) if re.search(r"[{}\[\]]|\bNone\b", c)]
        assert not bad, bad
        assert not re.search(r"\{'|\['|\bNone\b", out)  # nor in the lines around the tables


def test_every_price_has_four_decimals_and_its_currency_in_the_header(cli, clock):
    two_passes(cli, clock)
    for out in (table(cli, "status"), table(cli, "plan", "--explain")):
        assert "(EUR per" in out or "(EUR/node-h)" in out
        decimals = [c for c in cells(out) if re.fullmatch(r"\d+\.\d+", c)]
        assert decimals and all(len(c.split(".")[1]) == 4 for c in decimals), decimals


def test_status_and_plan_say_why_nodes_are_advised(cli, clock):
    first_pass(cli, clock)
    # the reservation (announced at once) takes the host at 19:18:44; its nodes take work until an hour
    # before (calendar_advisory_seconds), then the plan advises them
    plan = cli("-o", "json", "plan", "--explain").json["data"]
    assert not [a for a in plan["actions"] if a["kind"] == "cordon"]
    clock.tick(17 * 60)  # the reservation is 59 minutes away
    plan = cli("-o", "json", "plan", "--explain").json["data"]
    cordons = [a for a in plan["actions"] if a["kind"] == "cordon"]
    n = len(cordons)
    assert n >= 9 and all("gp-rsv-az2-hv01" in a["reason"] for a in cordons)
    (line,) = [e for e in plan["explain"] if " on host " in e]
    assert line.startswith(f"gp-rsv-az2: {n} nodes on host gp-rsv-az2-hv01 advised")
    assert "the host is taken back at 2026-03-03 19:18:44Z (in 59m)" in line
    assert cli("-o", "json", "reconcile").code == 0
    data = cli("-o", "json", "status").json["data"]
    advised = [x for x in data["nodes"] if x["state"] == "advised"]
    assert len(advised) == n and {x["host"] for x in advised} == {"gp-rsv-az2-hv01"}
    assert all(x["notice"]["kind"] == "calendar" and x["notice"]["deadline"] for x in advised)
    (group,) = data["advised_or_leaving"]
    assert (group["pool"], group["state"], group["count"], group["host"]) == ("gp-rsv-az2", "advised", n,
                                                                               "gp-rsv-az2-hv01")
    assert group["drain_from"] == group["notice"]["deadline"] - 720
    out = table(cli, "status")
    assert "host reserved from 2026-03-03 19:18:44Z (in 59m), says the" in out
    listed = table(cli, "status", "--nodes")
    rows = [x for x in listed.splitlines() if x.startswith("│ spot-") and "│ advised " in x]
    assert len(rows) == n and len(set(re.findall(r"ntc-\d+", listed))) == n  # each its own notice


def feed_down(monkeypatch, what="notices"):
    from spotctl.sim.contract import SimContract

    def down(self):
        raise UnavailableError(f"contract feed: {what}: connection refused")

    monkeypatch.setattr(SimContract, what, down)
    return monkeypatch


def test_status_and_plan_exit_7_while_the_contract_feed_is_down(cli, clock, monkeypatch):
    first_pass(cli, clock)
    with monkeypatch.context() as m:
        feed_down(m, "notices")
        assert cli("-o", "json", "reconcile").code == 7
        # status reads no notices itself: it says what the last pass could not read, and is partial
        s = cli("-o", "json", "status")
        assert (s.code, s.json["status"], s.json["exit_code"]) == (7, "partial", 7)
        assert s.json["data"]["partial"] == {"last_pass.notices": "contract feed: notices: connection refused"}
        assert s.json["errors"][0]["code"] == "partial" and "last_pass.notices" in s.json["errors"][0]["message"]
        out = table(cli, "status", code=7)
        assert "contract feed: DOWN" in out and "notices: NOT read by the last pass at" in out
        assert "no-notice policy: every pool (not met: notice, advisory)" in out
        p = cli("-o", "json", "plan")
        assert (p.code, p.json["status"]) == (7, "partial") and "notices" in p.json["data"]["degraded"]
    # the feed is back: the next pass reads it, and status is whole again
    clock.tick(60)
    assert cli("-o", "json", "reconcile").code == 0
    assert cli("-o", "json", "status").code == 0 and cli("-o", "json", "plan").code == 0


def test_status_exits_7_when_it_cannot_read_the_rate_card_now(cli, clock, monkeypatch):
    first_pass(cli, clock)
    feed_down(monkeypatch, "rate_card")
    s = cli("-o", "json", "status")
    assert s.code == 7 and "rate_card" in s.json["data"]["partial"]
    assert s.json["data"]["contract_feed"]["rate_card"]["read_now"] is False
    out = table(cli, "status", code=7)
    assert "rate card: NOT read now: contract feed: rate_card: connection refused" in out
    assert cli("-o", "json", "plan").code == 7


def test_status_keeps_every_key_scripts_read(cli, clock):
    """New keys are added beside the old ones (tests/cli/test_result_contract.py pins the envelope)."""
    two_passes(cli, clock)
    d = cli("-o", "json", "status").json["data"]
    assert {"region", "backend", "now", "rate_card_version", "pools", "nodes", "budget", "last_pass", "outbox",
            "relay", "audit_records", "degraded"} <= set(d)
    assert {"name", "kind", "class", "az", "shape", "headroom", "capacity", "hosts", "price", "currency", "nodes",
            "nodes_by_state", "max_nodes"} <= set(d["pools"][0])
    assert {"started_at", "finished_at", "status", "actor", "tokens_used"} <= set(d["last_pass"])
    assert {"rate", "burst", "tokens_left", "tokens_used_total"} <= set(d["budget"])
