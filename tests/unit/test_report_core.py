"""The report's figures from hand-made rows (spotctl.core.report.build): spend at the price in force,
node time clipped to the window, waits, notice SLOs, advisory precision, interruption bands, contract time."""

from __future__ import annotations

import math

import pytest

from spotctl.core.report import band, build

H = 3600.0
T0 = 1_000_000.0


def _node(i, pool, created, *moves, price=1.0):
    node = {"id": f"n{i}", "pool": pool, "state": moves[-1][0] if moves else "active", "created_at": created,
            "updated_at": created, "price": price}
    trans = [{"node_id": node["id"], "from_state": None, "to_state": "building", "at": created}]
    trans += [{"node_id": node["id"], "from_state": None, "to_state": s, "at": t} for s, t in moves]
    return node, trans


def _rows(nodes=(), **more):
    rows = {"nodes": [n for n, _ in nodes], "transitions": [t for _, ts in nodes for t in ts], "prices": [],
            "waits": [], "notices": [], "reclaims": [], "contract_changes": [], "passes": []}
    rows.update(more)
    return rows


def test_spend_uses_the_price_in_force_and_clips_to_the_window():
    # a node up 2 h before the window to 1 h into it... and one up through the end
    a = _node(1, "p", T0 - 2 * H, ("active", T0 - 2 * H), ("deleting", T0 + H), ("gone", T0 + H + 60))
    b = _node(2, "p", T0 + 2 * H)
    prices = [{"pool": "p", "at": T0 - 3 * H, "price": 2.0, "currency": "EUR"},
              {"pool": "p", "at": T0 + 2.5 * H, "price": 4.0, "currency": "EUR"}]
    r = build(region="r", start=T0, end=T0 + 4 * H, rows=_rows([a, b], prices=prices),
              on_demand={"p": 10.0}, currency="EUR")
    c = r["cost"]
    # a: 1 h at 2.0; b: 0.5 h at 2.0 then 1.5 h at 4.0 (the launch price 1.0 is not the one in force)
    assert c["spend"] == pytest.approx(2.0 + 1.0 + 6.0)
    assert c["node_hours"] == pytest.approx(3.0)
    assert c["on_demand"] == pytest.approx(30.0) and c["savings"] == pytest.approx(21.0)
    assert c["savings_pct"] == pytest.approx(70.0)
    assert r["nodes"] == {"launched": 1, "deleted": 1, "lost": 0, "failed": 0, "live_at_end": 1}
    assert sum(r["series"]["spend"]) == pytest.approx(c["spend"], abs=1e-3)


def test_no_price_recorded_falls_back_to_the_launch_price_and_no_on_demand_price_is_said():
    a = _node(1, "p", T0, price=0.5)
    r = build(region="r", start=T0, end=T0 + 2 * H, rows=_rows([a]), on_demand={"p": None}, currency="EUR")
    assert r["cost"]["spend"] == pytest.approx(1.0)
    assert r["cost"]["savings"] is None and r["cost"]["pools_without_on_demand_price"] == ["p"]


def test_waits_and_still_waiting():
    waits = [{"unit": f"u{i}", "scheduler": "slurm", "submitted_at": T0, "first_seen_at": T0,
              "gone_at": T0 + 60 * (i + 1)} for i in range(10)]
    waits.append({"unit": "open", "scheduler": "kubernetes", "submitted_at": T0 + 100, "first_seen_at": T0 + 100,
                  "gone_at": None})
    # a wait that ended after the window was still open at its end
    waits.append({"unit": "later", "scheduler": "slurm", "submitted_at": T0 - H, "first_seen_at": T0 - H,
                  "gone_at": T0 + 2 * H})
    r = build(region="r", start=T0, end=T0 + H, rows=_rows(waits=waits), on_demand={}, currency="EUR")
    d = r["demand"]
    assert (d["seen"], d["left_queue"], d["still_waiting"]) == (12, 10, 2)
    assert d["wait_s"] == {"samples": 10, "p50": 300.0, "p95": 600.0, "max": 600.0}
    assert d["oldest_waiting_s"] == pytest.approx(2 * H)


def test_notice_slos_and_advisory_precision():
    n = _node(1, "p", T0, ("active", T0 + 60), ("advised", T0 + 100), ("draining", T0 + 400),
              ("deleting", T0 + 460), ("gone", T0 + 520))
    notices = [
        {"id": "a1", "node_id": "n1", "instance_id": "i1", "kind": "advisory", "pool": "p", "issued_at": T0 + 100,
         "deadline": None, "first_seen_at": T0 + 100, "delivered_at": None, "handled_at": None, "reason": ""},
        {"id": "a2", "node_id": "n2", "instance_id": "i2", "kind": "advisory", "pool": "p", "issued_at": T0 + 100,
         "deadline": None, "first_seen_at": T0 + 100, "delivered_at": None, "handled_at": None, "reason": ""},
        {"id": "h1", "node_id": "n1", "instance_id": "i1", "kind": "hard", "pool": "p", "issued_at": T0 + 390,
         "deadline": T0 + 600, "first_seen_at": T0 + 400, "delivered_at": T0 + 390.5, "handled_at": None,
         "reason": ""},
    ]
    reclaims = [{"pool": "p", "node_id": "n1", "at": T0 + 520, "kind": "notice"}]
    r = build(region="r", start=T0, end=T0 + H, rows=_rows([n], notices=notices, reclaims=reclaims),
              on_demand={"p": None}, currency="EUR")
    slo = r["notices"]["slo"]
    assert slo["lead_s"]["p50"] == 200.0 and slo["lead_s"]["met"] == 1
    assert slo["delivery_s"]["max"] == 0.5 and slo["delivery_s"]["met"] == 1
    assert slo["cordon_s"]["p50"] == 0.0 and slo["empty_s"]["p50"] == 60.0 and slo["empty_s"]["met"] == 1
    assert r["advisories"]["advisories"] == 2 and r["advisories"]["followed_by_reclaim"] == 1
    assert r["advisories"]["precision_pct"] == 50.0
    it = r["interruptions"]["p"]
    assert it["interruptions"] == 1 and it["after_notice"] == 1
    lam = 1 / (460 / H)
    assert it["monthly_pct"] == round(100 * (1 - math.exp(-lam * 730)), 2) and it["band"] == ">20%"


def test_bands():
    assert [band(x) for x in (0, 4.99, 5, 12, 19.9, 20, 80)] == ["<5%", "<5%", "5-10%", "10-15%", "15-20%", ">20%",
                                                                ">20%"]
    assert band(None) is None


def test_contract_time_degraded_and_evidence():
    changes = [
        {"seq": 1, "at": T0 + 600, "action": "contract.degraded", "target": "p", "result": "degraded:notice",
         "inputs": {"previous": "met", "failing": ["notice"], "evidence": {"notice": {"reason": "late by 30 s"}}}},
        {"seq": 2, "at": T0 + 1800, "action": "contract.restored", "target": "p", "result": "met",
         "inputs": {"previous": "degraded:notice", "failing": [], "evidence": {}}},
        {"seq": 3, "at": T0 + 3000, "action": "contract.degraded", "target": "q", "result": "degraded:rate_card",
         "inputs": {"previous": "met", "failing": ["rate_card"], "evidence": {}}},
    ]
    r = build(region="r", start=T0, end=T0 + H, rows=_rows(contract_changes=changes), on_demand={}, currency="EUR")
    c = r["contract"]
    assert c["degradations"] == 2 and c["restorations"] == 1
    assert c["degraded_s_by_pool"] == {"p": 1200.0, "q": 600.0}
    assert c["changes"][0]["evidence"] == {"notice": {"reason": "late by 30 s"}}


def test_an_empty_window_is_refused():
    with pytest.raises(ValueError):
        build(region="r", start=T0, end=T0, rows=_rows(), on_demand={}, currency="EUR")
