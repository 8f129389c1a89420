"""The region's Prometheus metrics (issue 17): after a simulated day the exposition parses with
prometheus_client's own text parser, has the families with values that agree with the records and with
simulate's report; counters are kept in the transaction of what they count (a rollback counts nothing,
a prune moves nothing back); the watcher serves the same families on /metrics."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spotctl.core.metrics import BY_NAME, FAMILIES, histogram_increments, parse_series_key, series_key

BIN = Path(sys.executable).parent
SEED = 7


def clean_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
    env.update({"XDG_STATE_HOME": str(tmp / "state"), "XDG_CONFIG_HOME": str(tmp / "cfg"),
                "XDG_CACHE_HOME": str(tmp / "cache"), "SPOTCTL_SYSTEM_CONFIG": str(tmp / "none.toml")})
    return env


@pytest.fixture(scope="module")
def simulated_day(tmp_path_factory):
    """`spotctl simulate --hours 24 --keep-state` on the demo region: its report, its database, and
    `spotctl metrics --state-db` of that database."""
    tmp = tmp_path_factory.mktemp("simday")
    env = clean_env(tmp)
    sim = subprocess.run([str(BIN / "spotctl"), "simulate", "--hours", "24", "--seed", str(SEED), "--keep-state",
                          str(tmp / "kept"), "-o", "json"], capture_output=True, text=True, env=env, timeout=300)
    assert sim.returncode == 0, sim.stderr
    report = json.loads(sim.stdout)["data"]
    db = Path(report["state_db"])
    out = subprocess.run([str(BIN / "spotctl"), "metrics", "--state-db", str(db)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return report, db, out.stdout


def parsed(text: str) -> dict[str, dict]:
    """family name -> {"type", "samples": [(name, labels, value)]}"""
    return {f.name: {"type": f.type, "samples": [(s.name, s.labels, s.value) for s in f.samples]}
            for f in text_string_to_metric_families(text)}


def total(fams: dict, family: str, **match: str) -> float:
    return sum(v for name, labels, v in fams[family]["samples"]
               if name.endswith("_total") and all(labels.get(k) == m for k, m in match.items()))


def test_a_simulated_day_exposes_every_family_with_values_that_agree_with_the_records(simulated_day):
    report, db, text = simulated_day
    fams = parsed(text)
    # every pass family is declared with its type; those with nothing to say in a simulation are named here
    for f in FAMILIES:
        if f.source != "pass":
            continue
        assert f.name in fams, f"{f.name} missing"
        assert fams[f.name]["type"] == f.type
    empty_here = {"spotctl_drill_score", "spotctl_drills",  # no drill ran
                  "spotctl_relay_transactional", "spotctl_relay_degraded"}  # a simulation runs no relay
    for f in FAMILIES:
        if f.source == "pass" and f.name not in empty_here and f.type == "gauge":
            assert fams[f.name]["samples"], f"{f.name} has no sample after a simulated day"
    with sqlite3.connect(db) as c:
        passes = c.execute("SELECT status, count(*) FROM passes GROUP BY status").fetchall()
        notices = dict(c.execute("SELECT kind, count(*) FROM notices WHERE node_id IS NOT NULL GROUP BY kind"))
        live = dict(c.execute("SELECT pool || '/' || state, count(*) FROM nodes WHERE state NOT IN "
                              "('gone', 'failed', 'lost') GROUP BY pool, state"))
        deletes = c.execute("SELECT count(*) FROM actions WHERE kind='delete' AND status='done'").fetchone()[0]
        reclaims = c.execute("SELECT count(*) FROM reclaims").fetchone()[0]
        used = c.execute("SELECT used_total FROM budget").fetchone()[0]
    for status, n in passes:
        assert total(fams, "spotctl_passes", result=status) == n
    assert sum(n for _, n in passes) == 1440 == report["reconciler"]["passes"]
    # the notices counted are simulate's own: each kind the provider issued about our nodes
    for kind in ("hard", "advisory", "calendar"):
        assert total(fams, "spotctl_notices", kind=kind) == notices.get(kind, 0) == report["notices"][kind]
    for _, labels, v in fams["spotctl_nodes"]["samples"]:
        assert v == live.get(f"{labels['pool']}/{labels['state']}", 0)
    assert total(fams, "spotctl_actions", kind="delete", result="done") == deletes == report["instances"]["deleted"]
    assert total(fams, "spotctl_reclaims") == reclaims
    assert [v for _, _, v in fams["spotctl_budget_tokens_used"]["samples"]] == [used]
    # advisories: precision within [0, 1]
    advised, followed = total(fams, "spotctl_advisories"), total(fams, "spotctl_advisories_followed")
    assert advised == report["notices"]["advisory"] and 0 <= followed <= advised
    # prices and headroom as the last pass saw them, every configured pool
    pools = {labels["pool"] for _, labels, _ in fams["spotctl_pool_price_per_hour"]["samples"]}
    assert pools == {labels["pool"] for _, labels, _ in fams["spotctl_pool_max_nodes"]["samples"]} and len(pools) == 6
    assert all(v > 0 for _, _, v in fams["spotctl_pool_price_per_hour"]["samples"])
    # every pool has its five contract terms, each in exactly one state
    terms = {(lb["pool"], lb["term"]) for _, lb, v in fams["spotctl_contract_term"]["samples"] if v == 1}
    assert len(terms) == 6 * 5 == len(fams["spotctl_contract_term"]["samples"])
    # spend: the recorded prices of the live nodes
    spend = [v for _, _, v in fams["spotctl_spend_per_hour"]["samples"]]
    with sqlite3.connect(db) as c:
        priced = c.execute("SELECT sum(price) FROM nodes WHERE state NOT IN ('gone', 'failed', 'lost')").fetchone()[0]
    assert spend == [pytest.approx(priced)]
    # against the demo pools' on-demand prices: what the same live nodes would cost, and the share saved
    from spotctl.core.demo import DEMO_POOLS

    od = {name: p["on_demand_price"] for name, p in DEMO_POOLS.items()}
    with sqlite3.connect(db) as c:
        live_pools = [r[0] for r in c.execute("SELECT pool FROM nodes WHERE state NOT IN ('gone', 'failed', 'lost')")]
    [on_demand] = [v for _, _, v in fams["spotctl_on_demand_per_hour"]["samples"]]
    assert on_demand == pytest.approx(sum(od[p] for p in live_pools))
    [discount] = [v for _, _, v in fams["spotctl_realized_discount_ratio"]["samples"]]
    assert discount == pytest.approx(1 - priced / on_demand) and 0 < discount < 1


def test_histograms_are_cumulative_and_their_counts_agree(simulated_day):
    _, db, text = simulated_day
    fams = parsed(text)
    for f in FAMILIES:
        if f.type != "histogram" or f.source != "pass":
            continue
        by_series: dict[tuple, list[tuple[float, float]]] = {}
        counts: dict[tuple, float] = {}
        for name, labels, v in fams[f.name]["samples"]:
            key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
            if name.endswith("_bucket"):
                by_series.setdefault(key, []).append((float(labels["le"]), v))
            elif name.endswith("_count"):
                counts[key] = v
            elif name.endswith("_sum"):
                assert v >= 0
        for key, buckets in by_series.items():
            values = [v for _, v in sorted(buckets)]
            assert values == sorted(values), f"{f.name}{key}: buckets not cumulative"
            assert values[-1] == counts[key]  # +Inf holds every observation
    lead = fams["spotctl_notice_lead_seconds"]["samples"]
    with sqlite3.connect(db) as c:
        with_deadline = c.execute("SELECT count(*) FROM notices WHERE node_id IS NOT NULL AND deadline IS NOT NULL"
                                  ).fetchone()[0]
        handled = c.execute("SELECT count(*) FROM notices WHERE node_id IS NOT NULL AND handled_at IS NOT NULL"
                            ).fetchone()[0]
    assert sum(v for n, _, v in lead if n.endswith("_count")) == with_deadline
    cordon = fams["spotctl_notice_cordon_seconds"]["samples"]
    assert sum(v for n, _, v in cordon if n.endswith("_count")) == handled
    passes = fams["spotctl_pass_duration_seconds"]["samples"]
    assert sum(v for n, _, v in passes if n.endswith("_count")) == 1440
    assert sum(v for n, _, v in passes if n.endswith("_sum")) > 0  # measured, not the simulated clock


def test_counters_move_only_with_their_commit_and_a_prune_moves_none_back(tmp_path):
    from spotctl.state.store import Store

    s = Store.open(tmp_path / "r.db", "r")
    try:
        with pytest.raises(RuntimeError):
            with s.tx():
                s.count("spotctl_passes", {"result": "ok"}, 1.0)
                s.observe("spotctl_pass_duration_seconds", {}, 0.3, 1.0)
                raise RuntimeError("rolled back")
        assert s.metric_series() == {}
        with s.tx():
            s.count("spotctl_passes", {"result": "ok"}, 1.0)
            s.count("spotctl_passes", {"result": "ok"}, 2.0)
            s.observe("spotctl_pass_duration_seconds", {}, 0.3, 2.0)
        series = s.metric_series()
        assert series['spotctl_passes_total{result="ok"}'] == 2
        # one row for the one bucket it falls in (cumulated on export), its sum and its count
        assert series['spotctl_pass_duration_seconds_bucket{le="0.5"}'] == 1
        assert not {k for k in series if k.startswith("spotctl_pass_duration_seconds_bucket") and "0.5" not in k}
        assert series['spotctl_pass_duration_seconds_count'] == 1
        seq = s.start_pass("t", 10.0)
        s.finish_pass(seq, "ok", {}, 11.0, duration=0.2)
        before = s.metric_series()
        assert before['spotctl_passes_total{result="ok"}'] == 3
        with s.tx() as c:  # what a prune does to old records: the counters stay
            c.execute("DELETE FROM passes")
        assert s.metric_series() == before
    finally:
        s.close()


def test_a_value_that_is_not_finite_or_negative_is_not_observed():
    assert histogram_increments("spotctl_notice_lead_seconds", {"pool": "p", "kind": "hard"}, float("nan")) == {}
    assert histogram_increments("spotctl_notice_lead_seconds", {"pool": "p", "kind": "hard"}, -5.0) == {}
    with pytest.raises(ValueError):
        histogram_increments("spotctl_notice_lead_seconds", {"pool": "p"}, 1.0)  # a label missing


def test_series_keys_round_trip_odd_label_values():
    labels = {"pool": 'a"b\\c', "kind": "x\ny", "result": ""}
    key = series_key("spotctl_x_total", labels)
    assert parse_series_key(key) == ("spotctl_x_total", labels)
    assert parse_series_key("spotctl_y") == ("spotctl_y", {})


def test_the_reconcilers_textfile_and_the_watchers_endpoint_serve_the_families(tmp_path):
    env = clean_env(tmp_path)
    prom = tmp_path / "spotctl.prom"
    p = subprocess.run([str(BIN / "spot-reconciler"), "--region", "demo", "--metrics-file", str(prom)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    fams = parsed(prom.read_text())
    assert total(fams, "spotctl_passes", result="ok") == 1
    assert [v for _, _, v in fams["spotctl_last_pass_ok"]["samples"]] == [1.0]
    assert not list(tmp_path.glob("*.tmp*")), "written atomically: no temporary file left"
    # the watcher reads the provider's notice log: the demo region's simulated provider, served
    feed = subprocess.Popen([str(BIN / "spotctl"), "sim", "serve", "--port", "0", "--max-wait", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    w = None
    try:
        assert feed.stderr is not None
        for line in feed.stderr:
            if m := re.search(r"(http://127\.0\.0\.1:\d+)", line):
                break
        else:
            raise AssertionError("spotctl sim serve printed no URL")
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'[regions.demo.contract]\nurl = "{m.group(1)}"\n')
        w = subprocess.Popen([str(BIN / "spot-reconciler"), "watch", "--wait", "1", "--metrics-listen",
                              "127.0.0.1:0", "-v", "--config", str(cfg)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        assert w.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        for line in w.stderr:
            if m := re.search(r"metrics on (http://\S+/metrics)", line):
                url = m.group(1)
                break
            assert time.monotonic() < deadline, "the watcher did not say where its metrics are"
        assert url is not None
        with urllib.request.urlopen(url, timeout=10) as r:
            served = parsed(r.read().decode())
        assert total(served, "spotctl_passes", result="ok") == 1
        assert {f.name for f in FAMILIES if f.source == "pass" and f.type != "gauge"} <= set(served)
        assert served["spotctl_nodes"]["samples"] == fams["spotctl_nodes"]["samples"]
        w.terminate()
        assert w.wait(timeout=30) == 0
    finally:
        for proc in (w, feed):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


def test_counter_families_are_exported_with_the_total_suffix():
    for f in FAMILIES:
        assert not f.name.endswith("_total"), f"{f.name}: the _total suffix is added on exposition"
        if f.type == "histogram":
            assert f.buckets == tuple(sorted(f.buckets)) and f.name.endswith(("_seconds", "_bytes"))
    assert BY_NAME["spotctl_bundle_sent_bytes"].type == "counter"
