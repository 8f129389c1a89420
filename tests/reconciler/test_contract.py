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


def test_demo_region_breaks_no_term(make_rt):
    """Every term met on its evidence, but the notice term of a pool that has had no hard notice yet: that
    one is unknown ("no evidence yet"), which is not met and puts no pool under the no-notice policy."""
    rt, world = make_rt()
    report = contract.evaluate(rt, observe(rt))
    assert {n: p["failing"] for n, p in report["pools"].items() if p["failing"]} == {
        n: ["notice", "advisory"] for n, p in report["pools"].items() if p["terms"]["notice"]["state"] == "unknown"}
    assert contract.degraded_pools(report) == frozenset()
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
    # back to the normal policy: met, or no evidence yet where a pool has had no hard notice
    assert r.status == "ok" and {c["to"] for c in r.contract_changes} <= {"met", "unknown:notice,advisory"}
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
    assert all(p["state"] in ("met", "unknown") for n, p in report["pools"].items() if n != "gp-az1")
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
    assert {c["to"] for c in r.contract_changes} <= {"met", "unknown:notice,advisory"}  # the normal policy again
    assert len(r.contract_changes) == len(rt.region.pools) and not r.plan.inputs["no_notice_pools"]


def test_on_time_notices_restore_a_pool_after_a_late_one(make_rt):
    """Tried with a local feed: a 60 s notice flipped the pool to no-notice, and on-time notices
    afterwards did not restore it — only the late one ageing out of the 24 h window did. The restore
    rule: contract_restore_notices on time in a row and none late for contract_restore_hold_seconds."""
    rt, world = make_rt()
    feed = FeedDown(world.contract)
    feed.down = False
    rt.contract = feed
    now = rt.clock.now()
    feed.extra = [Notice(id="late", instance_id="i-x", kind=NoticeKind.HARD, issued_at=now - 5, deadline=now + 55,
                         reason="surge", pool="gp-az1", delivered_at=now - 4.9)]
    r = run_pass(rt)
    assert "gp-az1" in r.plan.inputs["no_notice_pools"]
    for i in range(3):  # three notices on time, ten minutes apart
        rt.clock.advance(600)
        t = rt.clock.now()
        feed.extra += [  # each warned by an advisory first, as the advisory term expects
            Notice(id=f"adv-{i}", instance_id=f"i-ok{i}", kind=NoticeKind.ADVISORY, issued_at=t - 300,
                   deadline=t + 150, reason="surge", pool="gp-az1", delivered_at=t - 299.9),
            Notice(id=f"ok-{i}", instance_id=f"i-ok{i}", kind=NoticeKind.HARD, issued_at=t,
                   deadline=t + 150, reason="surge", pool="gp-az1", delivered_at=t + 0.1)]
        world.advance(t)
        r = run_pass(rt)
        assert "gp-az1" in r.plan.inputs["no_notice_pools"], i  # not before the hold-off
    rt.clock.advance(3600 - 1800 + 1)
    world.advance(rt.clock.now())
    r = run_pass(rt)
    assert "gp-az1" not in r.plan.inputs["no_notice_pools"]
    restored = [a for a in rt.store.audit_query(action="contract.restored") if a["target"] == "gp-az1"]
    assert restored and rt.store.get_value("contract:gp-az1") == "met"


def test_terms_nothing_was_read_for_are_not_met(make_rt):
    """Blazar disabled: nothing was read, so the reservations term is missing (not "met" on an empty
    list); a reclaim API with no status call to prove it answers is unknown."""
    rt, world = make_rt()

    class NoBlazar:
        reads_reservations = False

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class NoStatus:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if name == "status":
                raise AttributeError(name)
            return getattr(self.inner, name)

        def reclaim(self, *a, **kw):
            return self.inner.reclaim(*a, **kw)

    met = contract.evaluate(rt, observe(rt))["pools"]["gp-az1"]["terms"]
    assert met["reservations"]["state"] == "met" and met["reclaim_api"]["state"] == "met"
    assert met["reclaim_api"]["evidence"]["status_call"] == "answered"
    rt.cloud, rt.contract = NoBlazar(world.cloud), NoStatus(world.contract)
    report = contract.evaluate(rt, observe(rt))
    terms = report["pools"]["gp-az1"]["terms"]
    assert terms["reservations"]["state"] == "missing" and "Blazar is disabled" in terms["reservations"]["evidence"]["error"]
    assert terms["reclaim_api"]["state"] == "unknown"
    assert report["pools"]["gp-az1"]["state"] == "degraded" and not report["met"]
