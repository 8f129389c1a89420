"""Same seed, region, calls and times → the same world; another seed → another world."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from spotctl.sim import SimWorld

from .conftest import START, NaiveOperator


def _run(region, seed=None, hours=8.0):
    w = SimWorld.new(region, START, seed=seed)
    NaiveOperator(w).run(hours, every=120.0)
    return w


def _snapshot(w, region):
    pending = [s.pending(region.pools) for s in w.schedulers]
    return {
        "report": json.dumps(w.report(), sort_keys=True),
        "pending": pending,
        "instances": w.cloud.instances(),
        "notices": w.contract.notices(),
        "hosts": w.cloud.hosts(region.pools),
        "usage": [s.usage() for s in w.schedulers],
        "reservations": w.cloud.reservations(region.pools, w.now, w.now + 86400),
        "rate_card": w.contract.rate_card(),
    }


def test_same_seed_same_world(region):
    a, b = _run(region), _run(region)
    sa, sb = _snapshot(a, region), _snapshot(b, region)
    assert sa == sb
    rep = a.report()
    # the run exercised the interesting paths
    assert rep["demand"]["started"] > 50
    assert rep["instances"]["launched"] > 10
    assert rep["cost"]["total"] > 0
    assert rep["notices"]["calendar"] + rep["notices"]["advisory"] > 0


def test_another_seed_another_world(region):
    a, b = _run(region, hours=2.0), _run(region, seed=12345, hours=2.0)
    assert a.seed == region.seed and b.seed == 12345
    assert _snapshot(a, region)["report"] != _snapshot(b, region)["report"]
    assert a.schedulers[0].pending(region.pools) != b.schedulers[0].pending(region.pools)
    assert a.cloud.hosts(region.pools) != b.cloud.hosts(region.pools)


def test_report_is_json_and_complete(region):
    w = _run(region, hours=3.0)
    rep = w.report()
    assert json.loads(json.dumps(rep)) == rep
    assert set(rep) >= {"start", "end", "hours", "seed", "cost", "demand", "wait_seconds", "interruptions",
                        "notices", "node_hours"}
    assert rep["hours"] == 3.0 and rep["end"] - rep["start"] == 3 * 3600
    assert set(rep["cost"]) >= {"total", "currency", "by_pool"} and rep["cost"]["currency"] == "EUR"
    assert set(rep["cost"]["by_pool"]) == set(region.pools) == set(rep["node_hours"])
    assert abs(sum(rep["cost"]["by_pool"].values()) - rep["cost"]["total"]) < 0.01
    assert set(rep["demand"]) >= {"arrived", "started", "completed", "pending", "excluded", "served_pct"}
    assert set(rep["wait_seconds"]) == {"p50", "p95", "max"}
    assert rep["wait_seconds"]["p50"] <= rep["wait_seconds"]["p95"] <= rep["wait_seconds"]["max"]
    assert set(rep["interruptions"]) == {"lost_units", "requeued_units", "nodes_lost_without_notice"}
    assert set(rep["notices"]) >= {"hard", "advisory", "handled_before_deadline", "missed"}


def test_cost_is_node_time_times_the_price_in_force(region):
    w = SimWorld.new(region, START)
    pool = region.pools["gp-az1"]
    inst = w.cloud.create_instance(pool, "n1", "a1")
    prices = []
    for _ in range(12):  # one hour, one rate-card slot at a time
        prices.append(w.contract.rate_card().prices["gp-az1"])
        w.advance(w.now + 300)
    w.cloud.delete_instance(inst.id)
    w.advance(w.now + 3600)  # no more cost after the delete
    rep = w.report()
    expected = sum(p * 300 / 3600 for p in prices)
    assert abs(rep["cost"]["by_pool"]["gp-az1"] - expected) < 1e-3
    assert rep["node_hours"]["gp-az1"] == 1.0
    assert rep["cost"]["total"] == rep["cost"]["by_pool"]["gp-az1"]


def test_advance_is_a_noop_backwards_and_caps_huge_gaps(region):
    w = SimWorld.new(region, START)
    w.advance(START - 100)
    assert w.now == START
    w.advance(START + 90 * 86400)  # three months: coarse steps, still finishes
    assert w.now == START + 90 * 86400
    rep = w.report()
    assert rep["hours"] == 90 * 24
    assert rep["demand"]["arrived"] > 30 * 24 * 90


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.sim.conftest import START, NaiveOperator
from spotctl.sim import SimWorld, demo_region
w = SimWorld.new(demo_region(), START)
NaiveOperator(w).run(3.0, every=300.0)
print(json.dumps([w.report(), [repr(s.pending(w.region.pools)) for s in w.schedulers],
                  repr(w.cloud.instances()), repr(w.contract.notices())], sort_keys=True))
"""


def test_same_world_in_other_processes():
    """No salted str hash() anywhere: two interpreters with different hash seeds agree."""
    root = str(Path(__file__).resolve().parents[2])
    outs = []
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=root)
        proc = subprocess.run([sys.executable, "-c", _CHILD, root], env=env, capture_output=True, text=True,
                              check=True, timeout=60)
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and '"launched"' in outs[0]
