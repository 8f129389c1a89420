"""The contract terms from observed facts: what makes a notice late, when a degraded term is restored, and
each term's evidence -> its state (met only on evidence observed; missing or unknown otherwise)."""

from __future__ import annotations

from dataclasses import replace

from spotctl.core.contract import (
    NO_NOTICE_FEED,
    NO_RECLAIM_API,
    NO_RESERVATIONS,
    NO_STATUS_CALL,
    STATIC_RATE_CARD,
    TERMS,
    ContractFacts,
    ReclaimApiFacts,
    SeenNotice,
    advisory_term,
    breaking,
    change_kind,
    degraded_pools,
    evaluate,
    late_notice_report,
    lateness,
    notice_term,
    rate_card_term,
    reclaim_api_term,
    recorded_value,
    reservations_term,
)
from spotctl.core.models import RateCard

T = 1_767_000_000.0


def on_time(i: int, at: float) -> SeenNotice:
    return SeenNotice(id=f"ok-{i}", issued_at=at, deadline=at + 150, first_seen_at=at + 0.2, delivered_at=at + 0.1)


def test_a_notice_is_late_by_its_lead_its_delivery_or_the_time_left_when_we_saw_it():
    assert lateness(on_time(1, T)) == []
    assert lateness(SeenNotice("a", T, T + 60))[0].startswith("lead 60s")
    assert "delivered 3.0s" in lateness(SeenNotice("b", T, T + 150, delivered_at=T + 3))[0]
    # issued 90 s before it reached us, no delivery stamp: 60 s left at receipt is late, whatever the lead
    seen_late = SeenNotice("c", T, T + 150, first_seen_at=T + 91)
    assert lateness(seen_late) == ["59s left when first seen"]
    assert notice_term([seen_late], T + 100)["state"] == "degraded"


def test_one_late_notice_degrades_and_on_time_notices_restore_after_the_hold_off():
    late = SeenNotice("late", T, T + 60, first_seen_at=T + 0.1)
    seen = [late]
    assert notice_term(seen, T + 10)["state"] == "degraded"
    # two on time: not yet (three in a row are needed)
    seen += [on_time(1, T + 600), on_time(2, T + 1200)]
    assert notice_term(seen, T + 4000)["state"] == "degraded"
    seen.append(on_time(3, T + 1800))
    # three on time, but the hold-off (1 h since the late one) has not passed
    t = notice_term(seen, T + 3000)
    assert t["state"] == "degraded" and t["evidence"]["on_time_since"] == 3
    t = notice_term(seen, T + 3600)
    assert t["state"] == "met" and "3 notices on time since late" in t["evidence"]["restored"]
    # a new late notice degrades again at once, and the count starts over
    seen.append(SeenNotice("late-2", T + 3700, T + 3800, first_seen_at=T + 3700))
    t = notice_term(seen, T + 3701)
    assert t["state"] == "degraded" and t["evidence"]["last_late"]["id"] == "late-2"


def test_the_rule_is_configurable():
    late = SeenNotice("late", T, T + 60)
    seen = [late, on_time(1, T + 10)]
    assert notice_term(seen, T + 20, restore_notices=1, restore_hold_seconds=0)["state"] == "met"
    assert notice_term(seen, T + 20, restore_notices=2, restore_hold_seconds=0)["state"] == "degraded"


# -- every term from the facts observed (spotctl.core.contract.evaluate): met only on evidence ----------

ANSWERED = ReclaimApiFacts(offered=True, status_call=True, provider_status={"terms": [
    {"term": "reclaim_api", "state": "met"}]})


def card(version="rc-1", age=30.0, prices=None, valid_for=600.0) -> RateCard:
    return RateCard(version=version, currency="EUR", prices={"gp": 0.5} if prices is None else prices,
                    valid_from=T - age, valid_until=T - age + valid_for)


def all_observed(**kw) -> ContractFacts:
    """Facts where every term has its evidence."""
    base = dict(now=T, reclaim=ANSWERED, provides_notices=True, rate_card=card(), reads_reservations=True,
                reservations={"gp": 2})
    return ContractFacts(**{**base, **kw})


def test_every_term_met_on_its_evidence():
    warned = SeenNotice("adv-1", T - 900, T - 450, kind="advisory", instance_id="i-1", pool="gp")
    hard = replace(on_time(1, T - 600), pool="gp", instance_id="i-1")
    report = evaluate("demo", ["gp"], all_observed(notices=(warned, hard)))
    gp = report["pools"]["gp"]
    assert report["met"] and gp["state"] == "met" and gp["failing"] == [] and list(gp["terms"]) == list(TERMS)
    ev = gp["terms"]["notice"]["evidence"]
    assert ev["hard_notices"] == 1 and ev["lead_p50_s"] == 150 and ev["delivery_p50_s"] == 0.1
    assert gp["terms"]["advisory"]["evidence"] == {"advisories": 1, "hard_without_advisory": 0}
    assert gp["terms"]["reservations"] == {"state": "met", "evidence": {"reservations_in_horizon": 2, "read_at": T}}
    assert gp["terms"]["reclaim_api"]["evidence"] == {"status_call": "answered", "provider_view": "met"}
    assert degraded_pools(report) == frozenset()


def test_no_notice_feed_or_a_feed_not_read_is_missing_not_met():
    for facts, why in ((all_observed(provides_notices=False), NO_NOTICE_FEED),
                       (all_observed(notices_error="notices: timed out"), "notices: timed out")):
        terms = evaluate("demo", ["gp"], facts)["pools"]["gp"]["terms"]
        assert terms["notice"] == terms["advisory"] == {"state": "missing", "evidence": {"error": why}}


def test_notices_count_for_their_own_pool_only():
    late = SeenNotice("late", T - 10, T + 50, pool="other", instance_id="i-9")
    report = evaluate("demo", ["gp", "other"], all_observed(notices=(late,), rate_card=card(prices={"gp": 1, "other": 2})))
    assert report["pools"]["gp"]["state"] == "unknown"  # no hard notice of its own: no evidence yet, not met
    # late, and with no advisory before it
    assert report["pools"]["other"]["failing"] == ["notice", "advisory"] and degraded_pools(report) == {"other"}


def test_advisory_term():
    unwarned = [SeenNotice(f"h{i}", T, T + 150, instance_id=f"i-{i}") for i in range(3)]
    nothing = advisory_term([])  # no hard notice: nothing to judge the advisories by (not "met")
    assert nothing["state"] == "unknown" and nothing["evidence"]["error"].startswith("no evidence yet")
    assert advisory_term(unwarned)["evidence"] == {"advisories": 0, "hard_without_advisory": 3}
    assert advisory_term(unwarned)["state"] == "degraded"
    warned = [SeenNotice("a0", T - 60, T + 150, kind="advisory", instance_id="i-0"),
              SeenNotice("c1", T - 60, T + 150, kind="calendar", instance_id="i-1")]
    assert advisory_term(unwarned + warned)["state"] == "met"  # one of three unwarned: not more than half
    drills = [SeenNotice(f"d{i}", T, T + 150, instance_id=f"i-{i}", reason="reclaim drill drill-1") for i in range(3)]
    assert advisory_term(drills)["state"] == "met"  # a drill's notices come without an advisory by design


def test_rate_card_term():
    assert rate_card_term("gp", card(), T) == {"state": "met", "evidence": {
        "version": "rc-1", "age_s": 30.0, "price": 0.5, "valid_until": T + 570}}
    assert rate_card_term("gp", card(age=400), T)["state"] == "degraded"  # not refreshed in 5 minutes
    assert rate_card_term("gp", card(valid_for=20), T)["state"] == "degraded"  # past its validity
    assert rate_card_term("gp", None, T, "rate_card: HTTP 503") == {"state": "missing", "evidence": {
        "error": "rate_card: HTTP 503"}}
    assert rate_card_term("gp", None, T)["evidence"]["error"] == "no rate card"
    assert rate_card_term("gp", card(version="static"), T)["evidence"]["error"] == STATIC_RATE_CARD
    assert rate_card_term("gp", card(prices={"other": 1.0}), T) == {"state": "missing", "evidence": {
        "error": "the rate card has no price for gp"}}


def test_reservations_term():
    assert reservations_term("gp", all_observed(cloud_error="cloud: timed out")) == {
        "state": "missing", "evidence": {"error": "cloud: timed out"}}
    assert reservations_term("gp", all_observed(reads_reservations=False))["evidence"]["error"] == NO_RESERVATIONS
    assert reservations_term("other", all_observed())["evidence"]["reservations_in_horizon"] == 0


def test_reclaim_api_term_is_unknown_when_nothing_shows_it_answers():
    assert reclaim_api_term(ReclaimApiFacts(offered=False)) == {"state": "missing", "evidence": {
        "error": NO_RECLAIM_API}}
    assert reclaim_api_term(ReclaimApiFacts(offered=True)) == {"state": "unknown", "evidence": {
        "error": NO_STATUS_CALL}}
    failed = ReclaimApiFacts(offered=True, status_call=True, status_error="reclaim_api: HTTP 500")
    assert reclaim_api_term(failed) == {"state": "missing", "evidence": {"error": "reclaim_api: HTTP 500"}}
    # answered: met, whatever the provider says of itself (kept as evidence, not trusted as ours)
    odd = ReclaimApiFacts(offered=True, status_call=True, provider_status="not json")
    assert reclaim_api_term(odd) == {"state": "met", "evidence": {"status_call": "answered", "provider_view": None}}
    hard = replace(on_time(1, T - 600), pool="gp", instance_id="i-1")  # the notice term met, on its evidence
    warned = SeenNotice("adv-1", T - 900, T - 450, kind="advisory", instance_id="i-1", pool="gp")
    gp = evaluate("demo", ["gp"], all_observed(reclaim=ReclaimApiFacts(offered=True), notices=(warned, hard)))["pools"]["gp"]
    assert gp["state"] == "degraded" and gp["failing"] == ["reclaim_api"]  # unknown is not met


def test_recorded_value_and_when_it_flips():
    met = {"state": "met", "failing": []}
    bad = {"state": "degraded", "failing": ["notice", "rate_card"]}
    assert recorded_value(met) == "met" and recorded_value(bad) == "degraded:notice,rate_card"
    assert change_kind(None, met) is None  # first sight of a healthy pool: nothing to announce
    assert change_kind(None, bad) == "degraded" and change_kind("met", bad) == "degraded"
    assert change_kind("degraded:notice,rate_card", bad) is None
    assert change_kind("degraded:notice", bad) == "degraded"  # another term failing too
    assert change_kind("degraded:notice", met) == "restored"


def test_a_late_notice_seen_between_passes_flips_only_the_notice_term():
    late = SeenNotice("late", T, T + 60, first_seen_at=T)
    assert late_notice_report("gp", "met", on_time(1, T), T) is None  # on time: nothing to flip
    assert late_notice_report("gp", "degraded:notice", late, T) is None  # already failing
    r = late_notice_report("gp", "degraded:rate_card", late, T + 1)
    p = r["pools"]["gp"]
    assert r["now"] == T + 1 and p["state"] == "degraded" and p["failing"] == ["notice", "rate_card"]
    assert p["terms"]["notice"]["evidence"]["last_late"]["id"] == "late"
    assert p["terms"]["rate_card"] == {"state": "degraded", "evidence": {"recorded": "degraded:rate_card"}}
    assert late_notice_report("gp", None, late, T)["pools"]["gp"]["failing"] == ["notice"]


def test_no_hard_notice_is_no_evidence_yet_not_met_and_keeps_the_normal_policy():
    """A notice feed read with no hard notice in the window shows nothing either way: the term is unknown
    ("no evidence yet"), the pool is not met, and it is not put under the no-notice policy for it."""
    t = notice_term([], T)
    assert t["state"] == "unknown" and t["evidence"]["hard_notices"] == 0
    assert t["evidence"]["error"].startswith("no evidence yet: no hard notice in the last 24 h")
    report = evaluate("demo", ["gp"], all_observed())
    gp = report["pools"]["gp"]
    assert gp["state"] == "unknown" and gp["failing"] == ["notice", "advisory"] and breaking(gp) == []
    assert not report["met"] and degraded_pools(report) == frozenset()
    assert recorded_value(gp) == "unknown:notice,advisory"
    assert change_kind(None, gp) is None and change_kind("met", gp) is None  # no policy changes: nothing to say
    assert change_kind("degraded:notice", gp) == "restored"  # the late notice aged out: the normal policy again
    # with a term that is broken too, the pool is degraded by that term only
    bad = evaluate("demo", ["gp"], all_observed(rate_card=None, rate_card_error="rate_card: HTTP 503"))["pools"]["gp"]
    assert bad["state"] == "degraded" and bad["failing"] == ["notice", "advisory", "rate_card"]
    assert recorded_value(bad) == "degraded:rate_card"
    # a late notice seen between passes flips a pool that had no evidence yet
    late = SeenNotice("late", T, T + 60, first_seen_at=T)
    assert late_notice_report("gp", "unknown:notice,advisory", late, T)["pools"]["gp"]["failing"] == ["notice"]
