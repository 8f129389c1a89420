"""Contract conformance per pool, and the automatic switch to the no-notice policy and back."""

from __future__ import annotations

from spotctl.core.errors import UnavailableError
from spotctl.core.models import Notice, NoticeKind
from spotctl.ops import contract
from spotctl.ops.observe import observe
from spotctl.ops.reconcile import run_pass


class FeedDown:
    """The simulator's contract feed with its notice stream down (or short-lead notices)."""

    def __init__(self, inner):
        self.inner, self.down, self.extra = inner, True, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def notices(self):
        if self.down:
            raise UnavailableError("notice feed: connection refused")
        return self.inner.notices() + self.extra


def test_demo_region_meets_every_term(make_rt):
    rt, world = make_rt()
    report = contract.evaluate(rt, observe(rt))
    assert report["met"], {n: p["failing"] for n, p in report["pools"].items()}
    assert set(report["pools"]["gp-az1"]["terms"]) == set(contract.TERMS)
    assert report["pools"]["gp-az1"]["terms"]["rate_card"]["evidence"]["age_s"] <= 300


def test_feed_down_degrades_every_pool_to_no_notice_and_back_with_records(make_rt):
    rt, world = make_rt()
    feed = FeedDown(world.contract)
    rt.contract = feed
    r = run_pass(rt)
    assert r.status == "partial" and "notices" in r.degraded
    assert {c["pool"] for c in r.contract_changes} == set(rt.region.pools)
    assert r.plan.inputs["no_notice_pools"] == sorted(rt.region.pools)
    degraded = rt.store.audit_query(action="contract.degraded")
    assert len(degraded) == len(rt.region.pools) and degraded[0]["inputs"]["policy"] == "no-notice"
    assert any('"type":"io.spotctl.contract.degraded"' in e["payload"] for e in rt.store.outbox_rows("event"))
    # the same state on the next pass records nothing new
    assert run_pass(rt).contract_changes == []
    feed.down = False
    r = run_pass(rt)
    assert r.status == "ok" and {c["to"] for c in r.contract_changes} == {"met"}
    assert r.plan.inputs["no_notice_pools"] == []
    assert len(rt.store.audit_query(action="contract.restored")) == len(rt.region.pools)
    assert rt.store.verify_audit()[0]


def test_a_short_lead_notice_degrades_only_its_pool(make_rt):
    rt, world = make_rt()
    feed = FeedDown(world.contract)
    feed.down = False
    now = rt.clock.now()
    feed.extra = [Notice(id="short", instance_id="i-x", kind=NoticeKind.HARD, issued_at=now - 5, deadline=now + 40,
                         reason="surge", pool="gp-az1", delivered_at=now - 4.9)]
    rt.contract = feed
    r = run_pass(rt)
    report = contract.evaluate(rt, observe(rt))
    assert report["pools"]["gp-az1"]["state"] == "degraded"
    assert report["pools"]["gp-az1"]["terms"]["notice"]["evidence"]["lead_min_s"] == 45.0
    assert all(p["state"] == "met" for n, p in report["pools"].items() if n != "gp-az1")
    assert "gp-az1" in r.plan.inputs["no_notice_pools"]


def test_a_rate_card_older_than_ten_minutes_degrades_and_restores(make_rt):
    from dataclasses import replace as dc_replace

    rt, world = make_rt()

    class Stale:
        def __init__(self, inner):
            self.inner, self.frozen = inner, None

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def rate_card(self):
            return self.frozen or self.inner.rate_card()

    feed = Stale(world.contract)
    rt.contract = feed
    assert run_pass(rt).contract_changes == []  # all met: nothing announced
    card = world.contract.rate_card()
    feed.frozen = dc_replace(card, valid_from=rt.clock.now() - 660, valid_until=rt.clock.now() + 60)
    r = run_pass(rt)
    assert {c["to"] for c in r.contract_changes} == {"degraded:rate_card"}
    assert set(r.plan.inputs["no_notice_pools"]) == set(rt.region.pools)
    feed.frozen = None
    r = run_pass(rt)
    assert {c["to"] for c in r.contract_changes} == {"met"}
